"""Block-sparse matmul's Triton kernels on a GPU (skipped without one), against the masked dense
fp64 reference of test_block_sparse.py, through the op and its autograd.

Tolerances: fp16 and bf16 inputs are exact in fp32, the kernels accumulate in fp32 and round the
output once: an error of half an ulp of the output (2^-11 fp16, 2^-8 bf16, relative) plus the
fp32 accumulation's K * 2^-24 (K: the length of each sum). fp32 runs in IEEE fp32 (torch's
default: no TF32), so test_block_sparse's fp32 tolerance holds. The reference sees the inputs
as rounded to the dtype.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from interpreted import plan_keys, plan_kinds
from test_block_sparse import dense_reference, layout_of

import opforge.ops  # noqa: F401
from opforge.kernel_loader import BlockSparseLoader
from opforge.kernels.block_sparse import triton_impl
from opforge.kernels.block_sparse.layout import BLOCK_SIZES, BlockSparseLayout
from opforge.ops import block_sparse_linear

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

EPS = {torch.float16: 2**-11, torch.bfloat16: 2**-8, torch.float32: 2**-24}


def check(x, layout, dtype, bias=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    bh, bw = layout.block_shape
    w = torch.randn(layout.nnz, bh, bw, generator=g, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(layout.shape[0], generator=g, device="cuda").to(dtype).requires_grad_() if bias else None
    x = x.to(device="cuda", dtype=dtype).requires_grad_()
    planned = plan_keys(triton_impl)
    y = block_sparse_linear(x, w, b, layout)
    dy = torch.randn(y.shape, generator=g, device="cuda").to(dtype)
    y.backward(dy)
    ry, rdx, rdw, rdb = dense_reference(x, w, b, layout, dy)
    tokens = x.numel() // max(1, layout.shape[1])
    # a failure names the output and the plans this call made (none: planned by an earlier call of its shapes)
    made = plan_kinds(triton_impl, planned) or ["planned earlier"]
    for name, got, ref, k in (("y", y, ry, layout.shape[1]), ("dx", x.grad, rdx, layout.shape[0]),
                              ("dw", w.grad, rdw, tokens), ("db", None if b is None else b.grad, rdb, tokens)):
        if got is None:
            continue
        assert got.dtype == dtype
        scale = ref.abs().max().item() if ref.numel() else 0.0
        atol = (EPS[dtype] + max(1, k) * 2**-22) * max(1.0, scale)
        torch.testing.assert_close(got.double(), ref, rtol=2 * EPS[dtype] + 1e-5, atol=atol,
                                   msg=lambda m, name=name: f"{name} ({', '.join(made)}): {m}")


@pytest.fixture(autouse=True)
def triton_variant():
    kernel = BlockSparseLoader().load(device="cuda")
    assert kernel.name == "block_sparse_triton", kernel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("bs", [(16, 16), (32, 32), (64, 64), (128, 128), (32, 64), (64, 16), (128, 32)], ids=str)
@pytest.mark.parametrize("kind", ["1.0", "0.5", "0.1", "one_block", "empty_rows_cols"])
def test_kernels_match_masked_dense(dtype, bs, kind):
    out_f, in_f = 4 * bs[0], 3 * bs[1]
    layout = layout_of(kind, out_f, in_f, bs)
    check(torch.randn(2, 37, in_f), layout, dtype)


@pytest.mark.parametrize("tokens", [1, 5, 16, 64, 300, 1031])
def test_token_counts_from_decode_to_odd(tokens):
    layout = layout_of("0.25", 512, 256, (64, 64), seed=2)
    check(torch.randn(tokens, 256), layout, torch.bfloat16)


@pytest.mark.parametrize("how", ["transposed", "sliced", "empty"])
def test_non_contiguous_and_empty(how):
    layout = layout_of("0.5", 128, 96, (32, 32), seed=3)
    base = torch.randn(6, 5, 96)
    x = {"transposed": base.transpose(0, 1), "sliced": torch.randn(6, 5, 192)[..., ::2],
         "empty": torch.randn(0, 96)}[how]
    check(x, layout, torch.float16)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("kind", ["one_block", "empty_rows_cols", "0.5"])
def test_many_tokens_split_the_weight_gradient(kind, bias):
    """Few blocks and many tokens: the weight-gradient kernel splits the tokens, and the last
    program of each group adds the fp32 partials (dw, and db with a bias: the kernel sums it,
    also for block-rows with no blocks)."""
    layout = layout_of(kind, 256, 128, (64, 64))
    check(torch.randn(6000, 128), layout, torch.bfloat16, bias=bias)


@pytest.mark.parametrize("tokens", [1, 16, 32])
def test_every_decode_split_matches_masked_dense(tokens, monkeypatch):
    """The pointer forward's split is tuned (``triton_sizing.SPLITS``): each split gives the
    reference's result, including splits past a row's block count (programs with no blocks)
    and rows with none. (The decode route takes the pointer kernel first here.)"""
    from opforge.kernels.block_sparse import triton_impl, triton_kernels

    monkeypatch.setattr(triton_impl.DECODE_ROUTE, "names", ("pointer", "decode"))
    from opforge.kernels.block_sparse.triton_sizing import SPLITS, fwd_configs
    from opforge.kernels.triton_launch import TunedKernel

    layout = layout_of("empty_rows_cols", 256, 384, (64, 64), seed=5)  # 5 blocks in most rows, none in one
    kept = triton_impl.KERNELS["fwd"]
    try:
        for split in SPLITS:
            cfg = next(c for c in fwd_configs() if c.kwargs["BLOCK_M"] == 16 and c.kwargs["SPLIT"] == split)
            triton_impl.KERNELS["fwd"] = TunedKernel(triton_impl.FAMILY, triton_kernels._fwd_kernel, [cfg])
            triton_impl.forget_plans()
            check(torch.randn(tokens, 384), layout, torch.float16, seed=split)
    finally:
        triton_impl.KERNELS["fwd"] = kept
        triton_impl.forget_plans()


@pytest.mark.parametrize("tokens", [7, 3000])
def test_weight_and_bias_gradient_in_one_launch(tokens):
    """``grad_weight_bias`` equals ``grad_weight`` and ``dy.sum(0)`` (without a split and with
    one), bit for bit run to run."""
    from opforge.kernels.block_sparse import triton_impl

    layout = layout_of("empty_rows_cols", 256, 192, (64, 32), seed=4)
    idx = layout.indices(torch.device("cuda"))
    dy = torch.randn(tokens, 256, device="cuda", dtype=torch.float16)
    x = torch.randn(tokens, 192, device="cuda", dtype=torch.float16)
    dw, db = triton_impl.grad_weight_bias(dy, x, idx.rows, idx.cols, idx.row_ptr, 64, 32)
    assert torch.equal(dw, triton_impl.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr, 64, 32))
    torch.testing.assert_close(db.float(), dy.double().sum(0).float(), rtol=2e-3, atol=2e-3 * tokens ** 0.5)
    again = triton_impl.grad_weight_bias(dy, x, idx.rows, idx.cols, idx.row_ptr, 64, 32)
    assert torch.equal(dw, again[0]) and torch.equal(db, again[1])


def test_unsupported_blocks_fall_back_to_torch_on_the_gpu():
    layout = layout_of("0.5", 24, 36, (8, 12))
    check(torch.randn(3, 36), layout, torch.float32)


def test_fp64_runs_the_torch_path_and_gradchecks():
    layout = layout_of("0.5", 32, 32, (16, 16))
    x = torch.randn(3, 32, dtype=torch.float64, device="cuda", requires_grad=True)
    w = torch.randn(layout.nnz, 16, 16, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: block_sparse_linear(x, w, None, layout), (x, w))


def test_the_module_on_cuda_and_deterministic_grads():
    from opforge.nn import BlockSparseLinear

    lin = torch.nn.Linear(256, 128).cuda()
    m = BlockSparseLinear.from_dense(lin, density=1.0, block_shape=(32, 32))
    x = torch.randn(4, 9, 256, device="cuda")
    torch.testing.assert_close(m(x), lin(x), rtol=1e-4, atol=1e-4)
    grads = []
    for _ in range(2):
        m.zero_grad()
        m(torch.randn(2000, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))).square().sum() \
            .backward()
        grads.append(m.weight_blocks.grad.clone())
    assert torch.equal(grads[0], grads[1])


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels launched (``triton_impl.KERNELS``' keys), every call planned anew."""
    from opforge.kernels import triton_launch
    from opforge.kernels.block_sparse import triton_impl

    seen = []
    real = triton_launch.Plan.__call__

    def spy(plan, prefix, device):
        seen.extend(name for name, k in triton_impl.KERNELS.items() if k is plan.kernel)
        return real(plan, prefix, device)

    triton_impl.forget_plans()
    monkeypatch.setattr(triton_launch.Plan, "__call__", spy)
    yield seen
    triton_impl.forget_plans()


def test_hopper_takes_the_copy_engine_for_aligned_operands(launches):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs a Hopper or newer GPU")
    layout = layout_of("0.5", 256, 192, (64, 64), seed=4)
    check(torch.randn(200, 192), layout, torch.bfloat16)  # > 64 tokens: no decode split
    assert {"fwd_tma", "dx_tma", "dw"} <= set(launches), launches


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("bs", [(16, 16), (32, 64), (128, 128), (64, 16)], ids=str)
def test_pointer_loads_where_the_copy_engine_cannot(dtype, bs, launches, monkeypatch):
    """The pointer kernels (pre-Hopper GPUs, misaligned operands) against the same reference."""
    from opforge.kernels.block_sparse import triton_impl

    monkeypatch.setattr(triton_impl, "tma_ready", lambda *t: False)
    layout = layout_of("empty_rows_cols", 4 * bs[0], 3 * bs[1], bs)
    check(torch.randn(2, 37, 3 * bs[1]), layout, dtype)
    assert "fwd" in launches and "dx" in launches and not any(k.endswith("_tma") for k in launches)


def test_a_misaligned_input_takes_the_pointer_loads(launches):
    """A contiguous view that starts 2 bytes into its storage: no TMA descriptor can take it."""
    layout = layout_of("0.5", 128, 96, (32, 32), seed=5)
    x = torch.randn(100 * 96 + 1, dtype=torch.float16, device="cuda")[1:].view(100, 96)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    check(x, layout, torch.float16)
    assert "fwd" in launches, launches


@given(st.data())
def test_fuzz_block_shapes_grids_tokens_layouts_and_dtypes(data):
    """Any tuned block shape (and now and then an untuned one, which takes the torch path), grid,
    density, token count from decode to a few hundred, batch dims, x permuted, stepped or at an
    odd offset, bias or not, in fp16, bf16 and fp32, against the masked dense reference."""
    side = st.sampled_from(BLOCK_SIZES)
    bs = data.draw(st.one_of(st.tuples(side, side), st.tuples(st.integers(1, 24), st.integers(1, 24))),
                   label="block shape")
    rows, cols = data.draw(st.integers(1, 4), label="block-rows"), data.draw(st.integers(1, 4), label="block-cols")
    density = data.draw(st.floats(0.01, 1.0), label="density")
    tokens = data.draw(st.one_of(st.integers(0, 20), st.integers(21, 400)), label="tokens")
    how = data.draw(st.sampled_from(["contiguous", "batched", "transposed", "stepped", "offset"]), label="x layout")
    dtype = data.draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32]), label="dtype")
    bias = data.draw(st.booleans(), label="bias")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    layout = BlockSparseLayout.random(rows * bs[0], cols * bs[1], density, bs, generator=gen)
    in_f = cols * bs[1]

    def draw(*size):  # on the GPU in the dtype already: check()'s .to() keeps the layout made below
        return torch.randn(*size, generator=gen).to("cuda", dtype)

    if how == "batched":
        x = draw(2, tokens, in_f)
    elif how == "transposed":
        x = draw(in_f, tokens).t()
    elif how == "stepped":
        x = draw(tokens, 2 * in_f)[:, ::2]
    elif how == "offset":  # one element in: rows not 16-byte aligned
        x = draw(tokens * in_f + 1)[1:].view(tokens, in_f)
    else:
        x = draw(tokens, in_f)
    check(x, layout, dtype, bias=bias, seed=seed)
