"""The cheap call path of block-sparse matmul on a GPU (issue 21): tuned configs read from the
cache by a new process (counted, not timed), the compiled kernels launched without triton's JIT,
fresh results after every change to the layout or the weight, CUDA graph capture and
torch.compile's reduce-overhead mode equal to eager, and bad input still refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from test_block_sparse import dense_reference, layout_of

import opforge.ops  # noqa: F401
from opforge.nn import BlockSparseLinear
from opforge.ops import block_sparse_linear

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def reference(m: BlockSparseLinear, x: torch.Tensor) -> torch.Tensor:
    """The masked dense fp64 result of the module's current layout and weights."""
    w = m.layout.scatter(m.weight_blocks.detach().double())
    y = x.double() @ w.t()
    return y + m.bias.detach().double() if m.bias is not None else y


def close(got, ref, dtype):
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * max(1.0, ref.abs().max().item()))


SCRIPT = textwrap.dedent("""
    import json, torch
    from opforge.kernels.block_sparse import triton_impl
    from opforge.nn import BlockSparseLinear
    torch.manual_seed(0)
    m = BlockSparseLinear(512, 256, density=0.5, block_shape=(64, 64)).cuda().half()
    outs = []
    for tokens in (1, 64, 300):  # the decode kernel (two size classes) and the copy engine's path
        x = torch.randn(tokens, 512, device="cuda", dtype=torch.half, requires_grad=True)
        y = m(x)
        y.float().square().sum().backward()
        outs.append([y.float().sum().item(), x.grad.float().sum().item()])
    tuned = {**triton_impl.KERNELS, "route": triton_impl.DECODE_ROUTE}
    runs = {k: v.tuning_runs for k, v in tuned.items()}
    hits = {k: v.store_hits for k, v in tuned.items()}
    print(json.dumps({"runs": runs, "hits": hits, "outs": outs}))
""")


def test_a_second_process_reads_the_tuned_configs_and_tunes_nothing(tmp_path):
    env = dict(os.environ, OPFORGE_CACHE_DIR=str(tmp_path / "cache"), OPFORGE_TRITON_TUNING="auto")
    first, second = (json.loads(subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                                               text=True, check=True).stdout.splitlines()[-1]) for _ in range(2))
    assert first["runs"]["route"] == 2, first  # T=1, 64
    assert first["runs"]["decode"] == first["runs"]["decode_uncut"] == first["runs"]["fwd"] == 2, first
    # the CUDA decode kernel: offered at T=1 on sm_90 and newer, and at T=64 (the wgmma tile) on 9.0 only
    cap = torch.cuda.get_device_capability()
    assert first["runs"]["decode_cuda"] == int(cap >= (9, 0)) + int(cap == (9, 0)), first
    assert sum(second["runs"].values()) == 0, second
    assert sum(second["hits"].values()) == sum(first["runs"].values())
    assert second["outs"] == first["outs"]  # the same configs: bit for bit the same results


def test_later_calls_launch_the_compiled_kernel_without_the_jit(monkeypatch):
    from opforge.kernels import triton_launch
    from opforge.kernels.block_sparse import triton_impl

    jit = []
    real = triton_launch.TunedKernel._jit_launch

    def spy(self, *a):
        jit.append(self.fn)
        return real(self, *a)

    monkeypatch.setattr(triton_launch.TunedKernel, "_jit_launch", spy)
    m = BlockSparseLinear(256, 256, density=0.5, block_shape=(32, 32)).cuda()
    for tokens in (4, 200):
        x = torch.randn(tokens, 256, device="cuda", requires_grad=True)
        m(x).sum().backward()  # tunes and compiles what these shapes need
        jit.clear()
        for _ in range(3):
            y = m(x)
            y.sum().backward()
        assert jit == [], jit
        close(y.detach(), reference(m, x.detach()), torch.float32)
    # at 200 tokens the copy engine's kernels run; on the triton whose launcher layout
    # triton_tma.py knows, through the C launcher with memoized descriptors
    import triton

    tma = [p for plans in (triton_impl._FWD, triton_impl._DX) for p in plans.values()
           if p is not triton_impl._REFERENCE and p.has_desc]
    assert tma
    if triton.__version__.startswith(("3.5.", "3.6.")):
        assert all(p.raw is not None for p in tma), triton.__version__
    # the same arguments through triton's own path (its own descriptors): the same results
    monkeypatch.setattr(triton_launch, "direct", lambda: False)
    with torch.no_grad():
        assert torch.equal(m(x), y.detach())
    assert jit and set(triton_impl.KERNELS) >= {"fwd", "dw"}


def test_a_kernel_specialized_for_one_shape_never_runs_another():
    """Token counts of one tuning bucket but another specialization (a multiple of 16 or not,
    one): each gets its own compiled kernel."""
    torch.manual_seed(1)
    m = BlockSparseLinear(128, 128, density=0.5, block_shape=(16, 16)).cuda().to(torch.bfloat16)
    with torch.no_grad():
        for tokens in (32, 17, 31, 1, 2, 16, 48, 33):
            x = torch.randn(tokens, 128, device="cuda", dtype=torch.bfloat16)
            close(m(x), reference(m, x), torch.bfloat16)


@pytest.mark.parametrize("tokens", [8, 300])
def test_no_stale_metadata_after_a_layout_change_an_update_in_place_a_state_dict_or_a_move(tokens):
    torch.manual_seed(2)
    m = BlockSparseLinear(256, 192, density=0.5, block_shape=(64, 64)).cuda()
    x = torch.randn(tokens, 256, device="cuda")
    close(m(x), reference(m, x), torch.float32)
    # an optimizer step: the weights change in place
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(x).square().sum().backward()
    opt.step()
    close(m(x), reference(m, x), torch.float32)
    # another layout, through a state_dict
    other = BlockSparseLinear(256, 192, density=0.25, block_shape=(64, 64)).cuda()
    m.load_state_dict(other.state_dict())
    assert m.layout == other.layout
    close(m(x), reference(other, x), torch.float32)
    # the weight's storage replaced (a new tensor of the same shape)
    with torch.no_grad():
        m.weight_blocks.data = torch.randn_like(m.weight_blocks)
    close(m(x), reference(m, x), torch.float32)
    # moved to another dtype
    m.half()
    close(m(x.half()), reference(m, x.half()), torch.float16)


def _graph_case(tokens: int, grad: bool):
    torch.manual_seed(3)
    m = BlockSparseLinear(256, 128, density=0.5, block_shape=(32, 32)).cuda()
    static_x = torch.randn(tokens, 256, device="cuda", requires_grad=grad)

    def step():
        y = m(static_x)
        if grad:
            y.square().sum().backward()
        return y

    side = torch.cuda.Stream()  # warm up (tune, compile) on a side stream, as torch's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            m.zero_grad(set_to_none=False)
            static_x.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    if grad:
        m.zero_grad(set_to_none=False)
        static_x.grad = torch.zeros_like(static_x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    return m, static_x, static_y, graph


@pytest.mark.parametrize("tokens", [4, 200])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
def test_cuda_graph_replay_equals_eager(tokens, grad):
    m, static_x, static_y, graph = _graph_case(tokens, grad)
    grads = (m.weight_blocks.grad, static_x.grad) if grad else ()  # the graph accumulates into these
    for seed in (10, 11):
        new = torch.randn(static_x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            static_x.copy_(new)
            for t in grads:
                t.zero_()
        graph.replay()
        x = new.clone().requires_grad_(grad)
        if grad:
            y = m(x)
            gw, gx = torch.autograd.grad(y.square().sum(), (m.weight_blocks, x))
            torch.testing.assert_close(grads[0], gw)
            torch.testing.assert_close(grads[1], gx)
        else:
            with torch.no_grad():
                y = m(x)
        torch.testing.assert_close(static_y, y.detach())


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
def test_torch_compile_reduce_overhead_equals_eager(grad):
    torch.manual_seed(4)
    torch._dynamo.reset()
    m = BlockSparseLinear(256, 128, density=0.5, block_shape=(32, 32)).cuda()
    compiled = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # cudagraph trees record after warm-up runs
        x = torch.randn(64, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(seed),
                        requires_grad=grad)
        if grad:
            m.zero_grad()
            y = compiled(x)
            y.square().sum().backward()
            got = y.detach().clone(), x.grad.clone(), m.weight_blocks.grad.clone()
            m.zero_grad()
            x2 = x.detach().clone().requires_grad_()
            y2 = m(x2)
            y2.square().sum().backward()
            for a, b in zip(got, (y2.detach(), x2.grad, m.weight_blocks.grad)):
                torch.testing.assert_close(a, b)
        else:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x).clone(), m(x))


def test_bad_input_is_still_refused_on_the_fast_path():
    m = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16)).cuda()
    with torch.no_grad():
        m(torch.randn(3, 64, device="cuda"))
        with pytest.raises(TypeError, match="use one dtype"):
            m(torch.randn(3, 64, device="cuda", dtype=torch.half))
        with pytest.raises(ValueError, match="on cpu but x is on cuda|is on cuda.* but x is on cpu"):
            m(torch.randn(3, 64))
        with pytest.raises(ValueError, match="in_features = 64"):
            m(torch.randn(3, 65, device="cuda"))


@pytest.mark.parametrize("node", ["CppFunction", "_LinearBackward"])
def test_gradients_through_the_lean_function_match_the_reference_and_second_order_works(node, monkeypatch):
    """Through the C++ autograd node (the default on CUDA) and the Python ``_Linear``."""
    from opforge.kernels.block_sparse import native_autograd

    if node == "_LinearBackward":
        monkeypatch.setattr(native_autograd, "DEVICES", ())
    layout = layout_of("0.5", 128, 96, (32, 32), seed=6)
    g = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(37, 96, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(layout.nnz, 32, 32, device="cuda", generator=g, requires_grad=True)
    b = torch.randn(128, device="cuda", generator=g, requires_grad=True)
    y = block_sparse_linear(x, w, b, layout)
    assert type(y.grad_fn).__name__ == node
    dy = torch.randn(y.shape, device="cuda", generator=g)
    y.backward(dy)
    ry, rdx, rdw, rdb = dense_reference(x, w, b, layout, dy)
    for got, ref in ((y, ry), (x.grad, rdx), (w.grad, rdw), (b.grad, rdb)):
        close(got.detach(), ref, torch.float32)
    # a gradient of a gradient (create_graph): the backward runs the differentiable custom ops
    x.grad = None
    y = block_sparse_linear(x, w, None, layout)
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    gx.sum().backward()
    wd = layout.scatter(w.detach().double())
    ref = 2 * torch.ones(37, 96, dtype=torch.float64, device="cuda") @ wd.t() @ wd  # d/dx of sum(2 x Wᵀ W)
    close(x.grad, ref, torch.float32)
