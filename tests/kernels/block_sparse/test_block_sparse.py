"""Block-sparse matmul (``opforge.ops.block_sparse_linear``) and ``opforge.nn.BlockSparseLinear``.

The reference is a masked dense computation in fp64: ``x @ (W * mask)ᵀ + bias``, with the
gradient of ``W`` taken on the dense weight and read back on the kept blocks. Every
implementation that runs here is checked against it (on this machine: the torch path; the GPU
kernels in test_block_sparse_cuda.py against the same reference).

Tolerances: the implementations compute in fp32 (fp64 for fp64 inputs). Each output is a sum
of K products of N(0, 1) terms (K: in_features for y, out_features for dx, tokens for dW), its
partial sums of size ~sqrt(K), each addition rounding by 2^-24 of that: an error of about
K * 2^-24 in the worst direction; atol = K * 2^-22 (a 4x margin), rtol 1e-5. fp64: 1e-12.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import opforge.ops  # noqa: F401  (registers torch.ops.opforge.*)
from opforge.kernel_loader import BlockSparseLoader
from opforge.kernels.block_sparse.layout import BlockSparseLayout
from opforge.nn import BlockSparseLinear, sparsify
from opforge.ops import block_sparse_linear

TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12)}


def layout_of(kind: str, out_f: int, in_f: int, bs: tuple[int, int], seed: int = 0) -> BlockSparseLayout:
    grid = (out_f // bs[0], in_f // bs[1])
    g = torch.Generator().manual_seed(seed)
    if kind == "one_block":
        mask = torch.zeros(grid, dtype=torch.bool)
        mask[grid[0] // 2, grid[1] - 1] = True
        return BlockSparseLayout(mask, bs)
    if kind == "empty_rows_cols":  # block-row 0 and block-column 1 empty, the rest dense
        mask = torch.ones(grid, dtype=torch.bool)
        mask[0, :] = False
        mask[:, 1] = False
        return BlockSparseLayout(mask, bs)
    return BlockSparseLayout.random(out_f, in_f, float(kind), bs, generator=g)


def dense_reference(x, w_blocks, bias, layout, dy):
    """y, dx, dW (on the kept blocks) and db, by masked dense fp64 autograd."""
    x64 = x.detach().double().requires_grad_()
    wd = layout.scatter(w_blocks.detach().double()).requires_grad_()
    b64 = None if bias is None else bias.detach().double().requires_grad_()
    y = x64 @ (wd * layout.dense_mask().to(wd.device).double()).T
    if b64 is not None:
        y = y + b64
    y.backward(dy.double())
    return y, x64.grad, layout.gather(wd.grad), None if b64 is None else b64.grad


def check_against_dense(x, layout, dtype=torch.float32, bias=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    bh, bw = layout.block_shape
    w = torch.randn(layout.nnz, bh, bw, generator=g, dtype=dtype).requires_grad_()
    b = torch.randn(layout.shape[0], generator=g, dtype=dtype).requires_grad_() if bias else None
    x = x.to(dtype).requires_grad_()
    y = block_sparse_linear(x, w, b, layout)
    dy = torch.randn(y.shape, generator=g, dtype=dtype)
    y.backward(dy)
    ry, rdx, rdw, rdb = dense_reference(x, w, b, layout, dy)
    rtol, atol = TOL[dtype]
    if dtype == torch.float32:
        atol = max(atol, max(layout.shape + (x.numel() // max(1, layout.shape[1]),)) * 2**-22)
    torch.testing.assert_close(y.double(), ry, rtol=rtol, atol=atol)
    torch.testing.assert_close(x.grad.double(), rdx, rtol=rtol, atol=atol)
    torch.testing.assert_close(w.grad.double(), rdw, rtol=rtol, atol=atol)
    if bias:
        torch.testing.assert_close(b.grad.double(), rdb, rtol=rtol, atol=atol)


# -- against the masked dense reference --

@pytest.mark.parametrize("bs", [(16, 16), (32, 32), (64, 64), (128, 128), (32, 64), (64, 16)], ids=str)
@pytest.mark.parametrize("kind", ["1.0", "0.5", "0.1", "one_block", "empty_rows_cols"])
def test_forward_and_gradients_match_masked_dense(bs, kind):
    out_f, in_f = 4 * bs[0], 3 * bs[1]
    if bs[0] >= 64:
        out_f = 2 * bs[0]
    layout = layout_of(kind, out_f, in_f, bs)
    check_against_dense(torch.randn(2, 7, in_f), layout)


@pytest.mark.parametrize("how", ["batched_3d", "transposed", "sliced", "1d", "empty"])
def test_batched_non_contiguous_and_empty_inputs(how):
    layout = layout_of("0.5", 64, 96, (16, 32), seed=3)
    base = torch.randn(5, 4, 96)
    x = {"batched_3d": base, "transposed": base.transpose(0, 1), "sliced": torch.randn(5, 4, 192)[..., ::2],
         "1d": base[0, 0], "empty": torch.randn(0, 96)}[how]
    check_against_dense(x, layout)


def test_no_bias_and_fp64():
    layout = layout_of("0.5", 64, 64, (16, 16))
    check_against_dense(torch.randn(3, 64), layout, bias=False)
    check_against_dense(torch.randn(3, 64), layout, dtype=torch.float64)


@given(st.data())
def test_fuzz_grids_block_shapes_layouts_and_dtypes(data):
    """Any block shape (the torch path takes any), grid, density, token count and batch dims,
    x permuted or stepped, bias or not, in fp32 or fp64, against the masked dense reference."""
    bs = data.draw(st.tuples(st.integers(1, 24), st.integers(1, 24)), label="block shape")
    rows, cols = data.draw(st.integers(1, 4), label="block-rows"), data.draw(st.integers(1, 4), label="block-cols")
    density = data.draw(st.floats(0.01, 1.0), label="density")
    batch = data.draw(st.lists(st.integers(0, 4), max_size=2), label="batch dims")
    how = data.draw(st.sampled_from(["contiguous", "transposed", "stepped"]), label="x layout")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    bias = data.draw(st.booleans(), label="bias")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    layout = BlockSparseLayout.random(rows * bs[0], cols * bs[1], density, bs, generator=gen)
    in_f = cols * bs[1]
    if how == "stepped":  # every other feature
        x = torch.randn(*batch, 2 * in_f, generator=gen)[..., ::2]
    elif how == "transposed" and batch:  # the first batch dim and the features swapped in memory
        x = torch.randn(in_f, *batch[1:], batch[0], generator=gen).movedim(0, -1).movedim(-2, 0)
    else:
        x = torch.randn(*batch, in_f, generator=gen)
    assert x.shape == (*batch, in_f)
    check_against_dense(x, layout, dtype=dtype, bias=bias, seed=seed)


def test_chunked_paths_agree(monkeypatch):
    """The torch path cuts tokens (and blocks, for dW) into chunks: tiny chunks, same results."""
    from opforge.kernels.block_sparse import reference

    layout = layout_of("0.5", 64, 64, (16, 16))
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 16 * 16 * 3)
    check_against_dense(torch.randn(11, 64), layout)


def test_bf16_and_fp16_on_the_cpu():
    """Computed in fp32 and rounded once: within the dtype's half ulp of the fp32 result."""
    layout = layout_of("0.5", 64, 64, (16, 16))
    x, w = torch.randn(5, 64), torch.randn(layout.nnz, 16, 16)
    ref = block_sparse_linear(x, w, None, layout)
    for dtype, eps in ((torch.bfloat16, 2**-8), (torch.float16, 2**-11)):
        out = block_sparse_linear(x.to(dtype), w.to(dtype), None, layout)
        assert out.dtype == dtype
        # inputs rounded to the dtype (relative error eps each), then sums of up to 64 products
        torch.testing.assert_close(out.float(), ref, rtol=4 * eps, atol=4 * eps * ref.abs().max().item())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_torch_path_rounds_once_where_the_blocks_cancel(device):
    """The torch path (``reference.py``: block shapes the kernels don't take, 1x3 here) sums the
    blocks' products in fp32 and rounds the result once, on a GPU as on the CPU. Exact in fp32:
    3 * 1.0078125 - 3 * 1.0 = 0.0234375, a bf16 value; a product rounded to bf16 first (3.03125)
    would give 0.03125, a third off (the GPU fuzz drew such a case, 2026-11-27)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from opforge.kernels.block_sparse import reference

    layout = BlockSparseLayout(torch.ones(2, 1, dtype=torch.bool), (1, 3))  # 2 block-rows of 1x3, one column
    idx = layout.indices(device)
    w = torch.tensor([[[1.0078125] * 3], [[1.0] * 3]], dtype=torch.bfloat16, device=device)
    dy = torch.tensor([[3.0, -3.0]], dtype=torch.bfloat16, device=device)
    dx = reference.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, 3)
    assert dx.dtype == torch.bfloat16 and dx.tolist() == [[0.0234375] * 3]
    wide = BlockSparseLayout(torch.ones(1, 2, dtype=torch.bool), (1, 3))  # one block-row of two 1x3 blocks
    ix = wide.indices(device)
    x = torch.tensor([[1.0078125, 0.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.bfloat16, device=device)
    wt = torch.tensor([[[3.0, 0.0, 0.0]], [[-3.0, 0.0, 0.0]]], dtype=torch.bfloat16, device=device)
    y = reference.forward(x, wt, None, ix.rows, ix.cols, ix.row_ptr, 1)
    assert y.dtype == torch.bfloat16 and y.tolist() == [[0.0234375]]


# -- gradcheck and opcheck --

@pytest.mark.parametrize("kind", ["0.5", "empty_rows_cols"])
def test_gradcheck_and_gradgradcheck_fp64(kind):
    layout = layout_of(kind, 8, 12, (2, 3), seed=5)
    x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    w = torch.randn(layout.nnz, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    f = lambda x, w, b: block_sparse_linear(x, w, b, layout)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


def test_opcheck_on_the_three_ops():
    layout = layout_of("0.5", 32, 48, (16, 16))
    idx = layout.indices()
    x, dy = torch.randn(5, 48, requires_grad=True), torch.randn(5, 32, requires_grad=True)
    w = torch.randn(layout.nnz, 16, 16, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    torch.library.opcheck(torch.ops.opforge.block_sparse_mm.default, (x, w, b, *idx, 32))
    torch.library.opcheck(torch.ops.opforge.block_sparse_mm.default, (x, w, None, *idx, 32))
    torch.library.opcheck(torch.ops.opforge.block_sparse_mm_t.default, (dy, w, *idx, 48))
    torch.library.opcheck(torch.ops.opforge.block_sparse_sddmm.default, (dy, x, *idx, 16, 16))


def test_torch_compile_fullgraph():
    m = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16), generator=torch.Generator().manual_seed(0))
    x = torch.randn(4, 64)
    compiled = torch.compile(lambda t: m(t).relu().sum(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), m(x).relu().sum())


@pytest.mark.parametrize("grad", [False, True])
def test_torch_compile_of_a_layer_first_called_there(grad):
    """A model compiled before its layers ever ran, in a process where other layers ran eagerly (a notebook):
    dynamo must not guard on the process-wide record of checked calls, which the traced call itself would fill
    (the guard then fails on the frame that made it)."""
    other = BlockSparseLinear(32, 16, density=0.5, block_shape=(16, 16), generator=torch.Generator().manual_seed(1))
    other(torch.randn(2, 32))
    layout = layout_of("0.5", 48, 48, (16, 16), seed=2)  # two layers alike: the second call is checked like the first
    m1, m2 = (BlockSparseLinear(48, 48, layout=layout) for _ in range(2))

    def f(t):
        return m2(m1(t).tanh()).sum()

    x = torch.randn(3, 48, requires_grad=grad)
    torch.compiler.reset()
    try:
        with torch.set_grad_enabled(grad):
            got = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    finally:
        torch.compiler.reset()
    torch.testing.assert_close(got, f(x))
    if grad:
        got.backward()
        torch.testing.assert_close(x.grad, torch.autograd.grad(f(x), x)[0])


# -- the layout --

def test_layout_indices_agree_with_the_mask():
    layout = layout_of("0.3", 5 * 16, 7 * 16, (16, 16), seed=9)
    idx = layout.indices()
    mask = layout.mask
    assert torch.equal(torch.stack([idx.rows, idx.cols], 1), mask.nonzero())
    for r in range(mask.shape[0]):
        assert idx.cols[idx.row_ptr[r]:idx.row_ptr[r + 1]].tolist() == mask[r].nonzero().flatten().tolist()
    for c in range(mask.shape[1]):
        blocks = idx.col_order[idx.col_ptr[c]:idx.col_ptr[c + 1]]
        assert (idx.cols[blocks] == c).all()
        assert idx.rows[blocks].tolist() == mask[:, c].nonzero().flatten().tolist()
    assert layout.indices() is idx  # built once per device
    w = torch.randn(layout.shape)
    assert torch.equal(layout.scatter(layout.gather(w)), w * layout.dense_mask())


def test_magnitude_keeps_the_largest_blocks():
    w = torch.zeros(4, 4)
    w[0:2, 2:4] = 3.0
    w[2:4, 0:2] = -2.0
    w[0:2, 0:2] = 0.5
    layout = BlockSparseLayout.by_magnitude(w, 0.5, (2, 2))
    assert layout.mask.tolist() == [[False, True], [True, False]]


# -- the module --

def test_from_dense_at_density_one_is_the_dense_layer():
    lin = torch.nn.Linear(96, 64)
    m = BlockSparseLinear.from_dense(lin, density=1.0, block_shape=(32, 32))
    x = torch.randn(3, 5, 96)
    torch.testing.assert_close(m(x), lin(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.to_dense(), lin.weight)
    half = BlockSparseLinear.from_dense(lin, density=0.5, block_shape=(32, 32))
    assert half.layout.nnz == 3
    torch.testing.assert_close(half.to_dense(), lin.weight * half.layout.dense_mask())


def test_a_small_model_trains():
    torch.manual_seed(0)
    data = torch.randn(256, 32)
    target = torch.sin(data @ torch.randn(32, 4))
    model = torch.nn.Sequential(BlockSparseLinear(32, 64, density=0.5, block_shape=(16, 16)), torch.nn.Tanh(),
                                BlockSparseLinear(64, 16, density=0.5, block_shape=(16, 16)), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], (losses[0], losses[-1])


def test_state_dict_round_trip_carries_the_layout(tmp_path):
    a = BlockSparseLinear(64, 64, density=0.25, block_shape=(16, 16), generator=torch.Generator().manual_seed(1))
    b = BlockSparseLinear(64, 64, density=0.75, block_shape=(16, 16), generator=torch.Generator().manual_seed(2))
    assert a.layout != b.layout
    torch.save(a.state_dict(), tmp_path / "a.pt")
    b.load_state_dict(torch.load(tmp_path / "a.pt"))
    assert b.layout == a.layout and b.weight_blocks.shape == a.weight_blocks.shape
    x = torch.randn(2, 64)
    torch.testing.assert_close(b(x), a(x))
    b(x).sum().backward()  # the new parameter trains
    assert b.weight_blocks.grad is not None
    wrong = BlockSparseLinear(64, 32, block_shape=(16, 16))
    with pytest.raises(RuntimeError, match="layout_mask has shape \\[4, 4\\], this layer's block grid is \\[2, 4\\]"):
        wrong.load_state_dict(a.state_dict())


def test_sparsify_replaces_matching_layers_and_reports():
    model = torch.nn.ModuleDict({"attn": torch.nn.Linear(64, 64), "mlp": torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)), "head": torch.nn.Linear(64, 10)})
    x = torch.randn(2, 64)
    before = model["mlp"](x)
    report = sparsify(model, {r"^mlp\.": 1.0, "head": 0.5}, block_shape=(32, 32))
    assert isinstance(model["mlp"][0], BlockSparseLinear) and isinstance(model["mlp"][2], BlockSparseLinear)
    assert isinstance(model["attn"], torch.nn.Linear) and isinstance(model["head"], torch.nn.Linear)
    torch.testing.assert_close(model["mlp"](x), before, rtol=1e-5, atol=1e-5)
    assert [(c.name, c.replaced) for c in report] == [("mlp.0", True), ("mlp.2", True), ("head", False)]
    assert "out_features must be a multiple of 32" in report[2].reason
    assert "2 of 3 matching layers replaced" in str(report)


# -- bad input --

def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"does not split into blocks of \(32, 32\): out_features must be a "
                                         r"multiple of 32 .*e\.g\. \(16, 16\)"):
        BlockSparseLinear(48, 80, block_shape=(32, 32))
    for d in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"density must be in \(0, 1\]"):
            BlockSparseLinear(64, 64, density=d, block_shape=(16, 16))
    other = BlockSparseLayout.random(32, 64, 0.5, (16, 16))
    with pytest.raises(ValueError, match=r"the layout is for a \(32, 64\) weight, this layer's is \(64, 64\)"):
        BlockSparseLinear(64, 64, layout=other)
    m = BlockSparseLinear(64, 32, block_shape=(16, 16))
    with pytest.raises(ValueError, match=r"x must end in in_features = 64, got shape \[2, 63\]"):
        m(torch.randn(2, 63))
    with pytest.raises(ValueError, match=r"w is on meta but x is on cpu: move them to one device"):
        block_sparse_linear(torch.randn(2, 64), m.weight_blocks.detach().to("meta"), None, m.layout)
    with pytest.raises(TypeError, match=r"x must be float16, bfloat16, float32 or float64, got torch.int64"):
        m(torch.ones(2, 64, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"w is torch.float32 but x is torch.float64: use one dtype"):
        m(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"w must hold the layout's"):
        block_sparse_linear(torch.randn(2, 64), torch.randn(1, 16, 16), None, m.layout)
    with pytest.raises(ValueError, match=r"bias must be None or of shape \[32\]"):
        block_sparse_linear(torch.randn(2, 64), m.weight_blocks, torch.zeros(31), m.layout)
    with pytest.raises(ValueError, match=r"block_shape must be two positive ints"):
        BlockSparseLinear(64, 64, block_shape=(0, 16))
    with pytest.raises(ValueError, match="not a regular expression"):
        sparsify(torch.nn.Linear(4, 4), {"(": 0.5})


def test_the_family_is_in_the_loader():
    names = [c.name for c in BlockSparseLoader().candidates(device="cpu")]
    assert "block_sparse_torch" in names
    assert BlockSparseLoader().load(device="cpu").name == "block_sparse_torch"


def test_a_checked_call_is_not_checked_again_but_a_new_one_is(monkeypatch):
    from opforge.ops import block_sparse as ops

    calls = []
    real = ops.check
    monkeypatch.setattr(ops, "check", lambda *a: calls.append(1) or real(*a))
    layout = layout_of("0.5", 32, 48, (16, 16), seed=10)
    w = torch.randn(layout.nnz, 16, 16)
    for tokens in (3, 4, 5):
        block_sparse_linear(torch.randn(tokens, 48), w, None, layout)
    assert len(calls) <= 1
    with pytest.raises(TypeError, match="use one dtype"):
        block_sparse_linear(torch.randn(3, 48, dtype=torch.float64), w, None, layout)
    with pytest.raises(ValueError, match="in_features = 48"):
        block_sparse_linear(torch.randn(3, 47), w, None, layout)
    with pytest.raises(TypeError, match="must be a tensor"):
        block_sparse_linear([1.0] * 48, w, None, layout)
    with pytest.raises(TypeError, match="BlockSparseLayout"):
        block_sparse_linear(torch.randn(3, 48), w, None, "layout")


def test_the_module_deep_copies_and_pickles():
    """copy.deepcopy (an EMA model) and torch.save of the whole module: the layout's lock stays
    behind, and the copy computes what the original does."""
    import copy
    import io

    torch.manual_seed(11)
    m = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16))
    x = torch.randn(3, 64)
    twin = copy.deepcopy(m)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (twin, loaded):
        assert other.layout == m.layout and other.layout is not m.layout
        torch.testing.assert_close(other(x), m(x))
    with torch.no_grad():
        twin.weight_blocks.add_(1.0)
    assert not torch.allclose(twin(x), m(x))
