"""Block-sparse launches replayed from C++ (``kernels/native_launch``) on a GPU: the same results
as the Python launch path, bit for bit, for every kernel and path (decode split, plain, copy
engine; with and without bias; the weight gradient split or not), and the cases that must stay
in Python: another stream until its own recipe, a CUDA graph capture, a launch hook."""

from __future__ import annotations

import contextlib

import pytest
import torch

from opforge.kernels.block_sparse import triton_impl as ti
from opforge.kernels.native_launch.table import native_ops
from opforge.nn import BlockSparseLinear

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

TABLES = (ti._NATIVE_FWD, ti._NATIVE_DX, ti._NATIVE_DW)


@contextlib.contextmanager
def python_launches():
    """Calls launch from Python (the recipes stay defined)."""
    saved = [t.call for t in TABLES]
    for t in TABLES:
        t.call = None
    try:
        yield
    finally:
        for t, c in zip(TABLES, saved):
            t.call = c if c is not None else t.call  # a recipe defined meanwhile keeps its entry point


def hits() -> int:
    ops, why = native_ops()
    assert ops is not None, why
    return ops.stats()[1]


def calls(m, x, dy, with_bias: bool):
    w, idx = m.weight_blocks.detach(), m.layout.indices(x.device)
    b = m.bias.detach() if with_bias else None
    bh, bw = m.block_shape
    n_out, n_in = m.layout.shape
    y = ti.forward(x, w, b, idx.rows, idx.cols, idx.row_ptr, n_out)
    dx = ti.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, n_in)
    dw = ti.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr, bh, bw)
    dwb = ti.grad_weight_bias(dy, x, idx.rows, idx.cols, idx.row_ptr, bh, bw)
    return [y, dx, dw, *dwb]


@pytest.mark.parametrize("tokens", [1, 8, 40, 300, 4096])
@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_replayed_launch_gives_the_python_paths_results_bit_for_bit(tokens, block, dtype):
    torch.manual_seed(tokens + block)
    m = BlockSparseLinear(512, 384, density=0.4, block_shape=(block, block), device="cuda", dtype=dtype)
    x = torch.randn(tokens, 512, device="cuda", dtype=dtype)
    dy = torch.randn(tokens, 384, device="cuda", dtype=dtype)
    for with_bias in (True, False):
        calls(m, x, dy, with_bias)  # misses: planned and launched in Python, the recipes defined
        with python_launches():
            want = calls(m, x, dy, with_bias)
        before = hits()
        got = calls(m, x, dy, with_bias)
        assert hits() - before == 4, "each of the four launches replayed from C++"
        for g, w_ in zip(got, want):
            assert g.shape == w_.shape and g.dtype == w_.dtype
            assert torch.equal(g, w_)
        # and again with other tensors of the same shapes: the recipe holds no call's tensors
        x2, dy2 = torch.randn_like(x), torch.randn_like(dy)
        with python_launches():
            want2 = calls(m, x2, dy2, with_bias)
        for g, w_ in zip(calls(m, x2, dy2, with_bias), want2):
            assert torch.equal(g, w_)


def test_the_module_and_its_gradients_replay_and_match_the_reference():
    torch.manual_seed(0)
    m = BlockSparseLinear(256, 256, density=0.5, block_shape=(64, 64), device="cuda", dtype=torch.float16)
    for tokens in (8, 300):
        x = torch.randn(tokens, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        m.zero_grad(set_to_none=True)
        m(x).float().square().sum().backward()  # defines
        grads = [x.grad.clone(), m.weight_blocks.grad.clone(), m.bias.grad.clone()]
        x.grad = m.weight_blocks.grad = m.bias.grad = None
        before = hits()
        y = m(x)
        y.float().square().sum().backward()
        assert hits() - before >= 3  # forward, dx, dw with the bias gradient
        for g, want in zip((x.grad, m.weight_blocks.grad, m.bias.grad), grads):
            assert torch.equal(g, want)
        w = m.layout.scatter(m.weight_blocks.detach().double())
        ref = x.detach().double() @ w.t() + m.bias.detach().double()
        torch.testing.assert_close(y.double(), ref, rtol=4e-3, atol=4e-3 * ref.abs().max().item())


def test_another_stream_gets_its_own_recipe():
    """The decode split's arrival counts belong to a stream: a recipe is keyed by the stream."""
    torch.manual_seed(1)
    m = BlockSparseLinear(512, 512, density=0.5, block_shape=(64, 64), device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        m(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            before = native_ops()[0].stats()
            first = m(x)  # misses (the module's replay, then the kernel's): planned in Python, defined here
            second = m(x)
            after = native_ops()[0].stats()
        torch.cuda.current_stream().wait_stream(s)
        assert after[2] - before[2] >= 1 and after[1] - before[1] == 1
        assert torch.equal(first, want) and torch.equal(second, want)


def test_a_graph_capture_stays_in_python_and_replays_equal_to_eager():
    torch.manual_seed(2)
    m = BlockSparseLinear(512, 512, density=0.25, block_shape=(64, 64), device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = m(x)
        m(x)
        g = torch.cuda.CUDAGraph()
        defined = sum(t.defined for t in TABLES)
        with torch.cuda.graph(g):
            y = m(x)
        assert sum(t.defined for t in TABLES) == defined  # nothing defined while capturing
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, m(x))
        assert not torch.equal(y, eager)


def test_a_launch_hook_sees_every_launch():
    triton = pytest.importorskip("triton")
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        pytest.skip("triton without knobs (3.3): the hooks live elsewhere")
    torch.manual_seed(3)
    m = BlockSparseLinear(256, 256, density=0.5, block_shape=(32, 32), device="cuda")
    x = torch.randn(8, 256, device="cuda")
    with torch.no_grad():
        want = m(x)
        m(x)
        seen = []
        old = knobs.runtime.launch_enter_hook
        knobs.runtime.launch_enter_hook = lambda meta: seen.append(meta)
        try:
            before = hits()
            got = m(x)
            assert hits() == before and seen
        finally:
            knobs.runtime.launch_enter_hook = old
    assert torch.equal(got, want)


def test_a_no_grad_module_call_is_one_native_op_and_bad_input_is_still_refused():
    """``block_sparse_linear``'s replay skips the checks only where a recipe's key proves them."""
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.ops import block_sparse as ops_bs

    torch.manual_seed(4)
    m = BlockSparseLinear(128, 64, density=0.5, block_shape=(32, 32), device="cuda")
    x = torch.randn(2, 5, 128, device="cuda")
    with torch.no_grad():
        want = m(x)
        m(x)
        assert ops_bs._NATIVE[0] is ti.NATIVE_FORWARD
        before = hits()
        got = m(x)
        assert hits() == before + 1 and torch.equal(got, want) and got.shape == (2, 5, 64)
        # bad input next to a defined recipe: refused with the same messages as before
        with pytest.raises(ValueError, match="in_features = 128"):
            m(torch.randn(2, 5, 129, device="cuda"))
        with pytest.raises(TypeError, match="use one dtype"):
            m(x.half())
        other = BlockSparseLayout.random(64, 128, 0.5, (32, 32))
        wrong = torch.randn(other.nnz + 1, 32, 32, device="cuda")  # w not of the layout's nnz
        with pytest.raises(ValueError, match="must hold the layout's"):
            ops_bs.block_sparse_linear(x, wrong, None, other)
        # a recipe defined by a direct, unchecked call of the contract doesn't let a bad call through
        idx = m.layout.indices(x.device)
        ti.forward(x.view(10, 128), m.weight_blocks, None, idx.rows, idx.cols, idx.row_ptr, 64)
        ti.forward(x.view(10, 128), m.weight_blocks, None, idx.rows, idx.cols, idx.row_ptr, 64)
        with pytest.raises(ValueError, match="bias must be None or of shape"):
            ops_bs.block_sparse_linear(x, m.weight_blocks, torch.zeros(3, device="cuda"), m.layout)
    # with gradients wanted, the call records them (not the no-grad replay)
    xg = x.clone().requires_grad_()
    m(xg).sum().backward()
    assert xg.grad is not None and m.weight_blocks.grad is not None


def test_training_goes_through_the_cpp_node_and_matches_the_python_function(monkeypatch):
    from opforge.kernels.block_sparse import native_autograd

    torch.manual_seed(5)
    m = BlockSparseLinear(256, 192, density=0.5, block_shape=(64, 64), device="cuda", dtype=torch.bfloat16)
    for tokens in (8, 300):
        x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, 192, device="cuda", dtype=torch.bfloat16)
        got = []
        for devices in (("cuda",), ()):
            monkeypatch.setattr(native_autograd, "DEVICES", devices)
            m.zero_grad(set_to_none=True)
            x.grad = None
            y = m(x)
            assert (type(y.grad_fn).__name__ == "CppFunction") == bool(devices)
            y.backward(dy)
            got.append([y.detach(), x.grad, m.weight_blocks.grad, m.bias.grad])
        for a, b in zip(*got):
            assert torch.equal(a, b)
        monkeypatch.setattr(native_autograd, "DEVICES", ("cuda",))
        before = hits()
        m(x).backward(dy)
        assert hits() - before == 3  # forward, input gradient, weight and bias gradient: each replayed
