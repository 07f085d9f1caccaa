"""The decode forwards (issue 35), up to ``DECODE_MAX_TOKENS`` tokens: ``_decode_kernel`` (equal runs
of the kept blocks per program whatever rows they fall in), ``_decode_uncut_kernel`` (units of
whole rows, or slices of rows along the outputs, dealt out in order) and the CUDA kernel
(``cuda_decode.py``: a copy-engine ring a CTA, sm_90+, T <= 32), each through the op (the route made
to take it first, as it does untimed) and called directly. Checked against the masked
dense fp64 result for every block size, bf16 and fp16, layouts with empty rows, a full row and
rows of every length, every way the runs can cut the rows (the kernels called with each run
length or share), and under CUDA graph replay."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from block_sparse_cases import case, close

import opforge.ops  # noqa: F401
from opforge.kernels.block_sparse import cuda_decode, triton_decode, triton_impl, triton_sizing
from opforge.kernels.block_sparse.layout import BlockSparseLayout
from opforge.kernels.native_launch.table import native_ops
from opforge.ops import block_sparse_linear

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HOPPER = torch.cuda.get_device_capability() >= (9, 0)


@pytest.fixture(params=["decode", "decode-loops", "uncut", "cuda"])
def route(request, monkeypatch):
    """The decode route with ``request.param`` first: the kernel the op runs untimed (the tests run
    the first fitting config, untimed: conftest.py). ``decode-loops``: the decode kernel with its
    configs of a loop per row (``FLAT`` off) first."""
    name = request.param.split("-")[0]
    names = triton_impl.DECODE_ROUTE.names
    monkeypatch.setattr(triton_impl.DECODE_ROUTE, "names", (name, *(n for n in names if n != name)))
    if request.param == "decode-loops":
        kernel = triton_impl.KERNELS["decode"]
        monkeypatch.setattr(kernel, "choices", sorted(kernel.choices, key=lambda c: c.kwargs["FLAT"]))
    triton_impl.forget_plans()
    yield request.param
    triton_impl.forget_plans()


def ragged(grid_c: int) -> torch.Tensor:
    """Rows of 0, 1, ..., grid_c blocks (an empty row first, a full row last), shuffled columns."""
    g = torch.Generator().manual_seed(grid_c)
    mask = torch.zeros(grid_c + 1, grid_c, dtype=torch.bool)
    for r in range(grid_c + 1):
        mask[r, torch.randperm(grid_c, generator=g)[:r]] = True
    return mask[torch.randperm(grid_c + 1, generator=g)]


def layouts(block: int):
    g = torch.Generator().manual_seed(block)
    yield "ragged", ragged(6)
    yield "random", torch.rand(5, 7, generator=g) < 0.4
    sparse_rows = torch.zeros(6, 4, dtype=torch.bool)
    sparse_rows[2, 1] = sparse_rows[5] = True  # empty rows around a one-block row and a full last row
    yield "mostly-empty", sparse_rows
    yield "empty", torch.zeros(3, 2, dtype=torch.bool)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block", [(16, 16), (32, 32), (64, 64), (128, 128), (32, 64), (64, 16)],
                         ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("tokens", [1, 2, 17, 64])
def test_the_op_equals_masked_dense(tokens, block, dtype, route):
    for name, mask in layouts(block[0]):
        for bias in (True, False):
            lay, w, x, b, ref = case(mask, block, tokens, dtype, bias)
            got = block_sparse_linear(x, w, b, lay)
            assert got.shape == ref.shape and got.dtype == dtype, name
            close(got, ref, dtype)
            close(block_sparse_linear(x, w, b, lay), ref, dtype)  # the slots (counts) were left empty (zero)


def started(uncut: bool = False) -> dict:
    """The decode kernels' start as the plans launch them on this GPU: the decode kernel's first blocks
    asked into L2 early, and on sm_90 and newer both launched as programmatic dependents of the launch
    before."""
    early, overlap = triton_sizing.decode_start(torch.device("cuda", torch.cuda.current_device()))
    return {**({} if uncut else {"EARLY": early}), "OVERLAP": overlap, **({"launch_pdl": True} if overlap else {})}


def run_kernel(lay, w, x, b, chunk: int, block_m: int, idx=None, flat: bool = True):
    """``_decode_kernel`` with an explicit run length (the host sizes it from the programs per SM),
    walking each run in one loop or a loop per row (``flat``, up to 16 tokens); its partial slots empty
    again after (up to 16 tokens), its counts at zero."""
    idx = idx or lay.indices("cuda")
    nnz, bh, bw = w.shape
    tokens, k_in = x.shape
    n_out = lay.shape[0]
    programs = max(1, -(-nnz // chunk))
    y = torch.full((tokens, n_out), float("nan"), device="cuda", dtype=x.dtype)
    slots = tokens <= triton_sizing.DECODE_SLOT_TOKENS  # kept slots, else fresh partials (NaN) and counts
    part = (torch.full((programs, tokens, bh), triton_sizing.SLOT_EMPTY, dtype=torch.int32, device="cuda") if slots
            else torch.full((programs, tokens, bh), float("nan"), device="cuda"))
    counts = torch.zeros(n_out // bh, dtype=torch.int32, device="cuda")
    triton_decode._decode_kernel[(programs,)](
        x, w, b if b is not None else w, y, part, counts, idx.cols, idx.row_ptr, idx.rows, tokens, k_in, n_out, nnz,
        chunk, BH=bh, BW=bw, HAS_BIAS=b is not None, PRECISION="tf32", BLOCK_K=triton_sizing.decode_block_k(bw),
        **started(), BLOCK_M=block_m, WAVES=1, FLAT=flat)
    assert counts.eq(0).all() and (not slots or part.eq(triton_sizing.SLOT_EMPTY).all())
    return y


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "loops"])
@pytest.mark.parametrize("block", [(16, 16), (64, 64), (128, 64)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("tokens", [1, 17, 64])
def test_every_way_the_runs_cut_the_rows(tokens, block, flat):
    """Runs of 1, 2, 3, 5 and 7 blocks, one run of all, one longer than all: rows wholly inside a
    run, rows cut at one or both ends, rows over many runs, empty rows at a run's start and after
    the last block; a row finished by the program holding its end, after the others' partials."""
    block_m = max(16, triton_sizing.pow2(tokens))
    for _, mask in layouts(block[0]):
        lay, w, x, b, ref = case(mask, block, tokens, torch.float16)
        for chunk in sorted({1, 2, 3, 5, 7, max(1, lay.nnz), lay.nnz + 4}):
            close(run_kernel(lay, w, x, b, chunk, block_m, flat=flat), ref, torch.float16)


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "loops"])
@pytest.mark.parametrize("block", [(16, 16), (64, 64)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_many_small_layouts_every_run_length_twice(block, flat):
    """The fuzz's tiny grids (1-4 x 1-4 blocks, any density) with every run length, each launch
    made twice in a row, bit for bit the same: a row finished by its owner after up to 15 other
    programs' partials (in program order), and the slots empty again for the next launch."""
    g = torch.Generator().manual_seed(block[0])
    for trial in range(40):
        grid = (int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g)))
        mask = torch.rand(grid, generator=g) < float(torch.rand(1, generator=g))
        tokens = (1, 5, 33)[trial % 3]
        lay, w, x, b, ref = case(mask, block, tokens, torch.float16, bias=trial % 2 == 0, seed=trial)
        for chunk in range(1, lay.nnz + 2):
            first = run_kernel(lay, w, x, b, chunk, max(16, triton_sizing.pow2(tokens)), flat=flat)
            close(first, ref, torch.float16)
            assert torch.equal(run_kernel(lay, w, x, b, chunk, max(16, triton_sizing.pow2(tokens)), flat=flat), first)


def run_uncut(lay, w, x, b, chunk: int, sub: int, idx=None):
    """``_decode_uncut_kernel`` with an explicit share a program (in slices: a unit is a row's blocks'
    ``sub`` rows) and unit height."""
    idx = idx or lay.indices("cuda")
    nnz, bh, bw = w.shape
    tokens, k_in = x.shape
    n_out = lay.shape[0]
    total = bh // sub * nnz
    programs = max(1, -(-total // chunk))
    y = torch.full((tokens, n_out), float("nan"), device="cuda", dtype=x.dtype)
    triton_decode._decode_uncut_kernel[(programs,)](
        x, w, b if b is not None else w, y, idx.cols, idx.row_ptr, tokens, k_in, n_out, total, chunk,
        BH=bh, BW=bw, SUB=sub, HAS_BIAS=b is not None, PRECISION="tf32", BLOCK_K=triton_sizing.decode_block_k(bw),
        SEARCH=triton_sizing.decode_search(n_out // bh), **started(uncut=True),
        BLOCK_M=max(16, triton_sizing.pow2(tokens)), WAVES=1, num_stages=8)
    return y


@pytest.mark.parametrize("block", [(16, 16), (64, 64), (128, 64)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("tokens", [1, 17, 64])
def test_every_share_of_the_uncut_kernel(tokens, block):
    """Shares of 1, 2, 3, 5 and 7 slices, of all, of more than all; units of a whole row, a half and
    (16-high) a smaller slice: every output stored once (y starts as NaN), empty rows' bias too."""
    for _, mask in layouts(block[0]):
        lay, w, x, b, ref = case(mask, block, tokens, torch.float16)
        for sub in sorted({16, max(16, block[0] // 2), block[0]}):
            total = block[0] // sub * lay.nnz
            for chunk in sorted({1, 2, 3, 5, 7, max(1, total), total + 4}):
                close(run_uncut(lay, w, x, b, chunk, sub), ref, torch.float16)


def test_fp32_through_the_op(route):
    """fp32 at decode sizes, ieee and tf32 (the kernel's precision follows torch's flag)."""
    lay, w, x, b, ref = case(ragged(6), (32, 32), 17, torch.float32)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        close(block_sparse_linear(x, w, b, lay), ref, torch.float32)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.testing.assert_close(block_sparse_linear(x, w, b, lay).double(), ref, rtol=5e-3,
                                   atol=5e-3 * ref.abs().max().item())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_a_real_model_size_with_uneven_rows(route):
    """4096 -> 14336 in 64-blocks with rows from empty to full (``by_magnitude`` of a weight whose
    rows' scales differ), at T = 1 and 64, through the tuned path."""
    g = torch.Generator().manual_seed(3)
    scale = torch.linspace(0, 3, 14336).pow(4)[:, None]
    weight = torch.randn(14336, 4096, generator=g) * scale
    lay = BlockSparseLayout.by_magnitude(weight, 0.25, (64, 64))
    counts = lay.mask.sum(1)
    assert counts.min() == 0 and counts.max() == lay.grid[1]
    w = lay.gather(weight.to(torch.bfloat16)).cuda()
    for tokens in (1, 64):
        x = torch.randn(tokens, 4096, generator=g).to("cuda", torch.bfloat16)
        ref = x.double() @ lay.scatter(w.double()).t()
        close(block_sparse_linear(x, w, None, lay), ref, torch.bfloat16)


@pytest.mark.parametrize("tokens", [1, 17, 64])
def test_graph_replay_equals_eager(tokens, route):
    lay, w, x, b, _ = case(ragged(8), (64, 64), tokens, torch.bfloat16)
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            block_sparse_linear(static_x, w, b, lay)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = block_sparse_linear(static_x, w, b, lay)
    for seed in (1, 2, 3):
        new = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to("cuda", x.dtype)
        static_x.copy_(new)
        graph.replay()
        torch.testing.assert_close(static_y, block_sparse_linear(new, w, b, lay), rtol=0, atol=0)  # one plan


# -- the CUDA kernel (cuda_decode.py), called directly --

needs_hopper = pytest.mark.skipif(not HOPPER, reason="the CUDA decode kernel needs sm_90 or newer")


def compiled(tokens: int, block, wgmma: bool = False) -> bool:
    """Whether the CUDA kernel has a variant for this many tokens and blocks (through wgmma: blocks 64 wide, 64
    or 128 high, on compute capability 9.0 only; past 32 tokens, wgmma's only)."""
    wg = block[1] == 64 and block[0] in (64, 128) and torch.cuda.get_device_capability() == (9, 0)
    return wg if wgmma else tokens <= 32 or wg


def run_cuda(lay, w, x, b, chunk: int, stages: int = 3, ctas: int = 2, overlap: int = 0, wgmma: int = -1):
    """The CUDA kernel with an explicit share a CTA (0: the grid's equal share), through wgmma (1), mma.sync (0)
    or the op's own choice (-1); y starts as NaN, so an output stored by nobody shows."""
    idx = lay.indices("cuda")
    nnz, bh, bw = w.shape
    y = torch.full((x.shape[0], lay.shape[0]), float("nan"), device="cuda", dtype=x.dtype)
    counts = torch.zeros(lay.shape[0] // bh * (bh // 16), dtype=torch.int32, device="cuda")
    cuda_decode.ops().forward(x, w, b, y, idx.cols, idx.row_ptr, counts, chunk, stages, ctas, overlap, wgmma)
    assert counts.eq(0).all()  # left at zero for the next launch
    return y


@needs_hopper
def test_the_cuda_kernel_is_offered_where_it_should_be():
    lay, w, x, b, _ = case(ragged(6), (64, 64), 17, torch.bfloat16)
    assert cuda_decode.offered(x, w, b) and cuda_decode.offered(x, w, None)
    assert cuda_decode.offered(torch.zeros(32, x.shape[1], device="cuda", dtype=x.dtype), w, b)
    sm90a = torch.cuda.get_device_capability() == (9, 0)  # the 64-token wgmma tile's GPUs
    assert cuda_decode.offered(torch.zeros(64, x.shape[1], device="cuda", dtype=x.dtype), w, b) == sm90a
    assert not cuda_decode.offered(torch.zeros(65, x.shape[1], device="cuda", dtype=x.dtype), w, b)  # T > 64
    _, w32, x32, _, _ = case(ragged(6), (32, 32), 40, torch.bfloat16)
    assert not cuda_decode.offered(x32, w32, None)  # past 32 tokens: 64-wide blocks only
    assert not cuda_decode.offered(x.float(), w.float(), None)  # fp32: the Triton kernels
    assert not cuda_decode.offered(x, w.transpose(1, 2), b)  # not contiguous
    _, w16, x16, _, _ = case(ragged(6), (16, 16), 1, torch.bfloat16)
    assert not cuda_decode.offered(x16, w16, None)  # 16-blocks: not compiled


OLD_PTX = """
    import json, torch
    import opforge.ops
    from opforge.kernels.block_sparse import cuda_decode, triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.ops import block_sparse_linear
    names = triton_impl.DECODE_ROUTE.names  # the CUDA kernel first, as it is taken untimed
    triton_impl.DECODE_ROUTE.names = ("cuda", *(n for n in names if n != "cuda"))
    g = torch.Generator().manual_seed(0)
    lay = BlockSparseLayout(torch.rand(6, 5, generator=g) < 0.5, (64, 64))
    x = torch.randn(2, lay.shape[1], generator=g).cuda().half()
    w = torch.randn(lay.nnz, 64, 64, generator=g).cuda().half()
    y = block_sparse_linear(x, w, None, lay)
    ref = x.double() @ lay.scatter(w.double().cpu()).cuda().t()
    print(json.dumps({"built": cuda_decode.ops() is not None, "grid": cuda_decode.ops().grid.default(x, 64, 64, 2, 2),
                      "offered": cuda_decode.offered(x, w, None),
                      "err": (y.double() - ref).abs().max().item() / ref.abs().max().item()}))
"""


@needs_hopper
def test_a_binary_built_without_sm_90_is_not_offered(tmp_path):
    """Built for ``TORCH_CUDA_ARCH_LIST=8.0+PTX`` (as a wheel for older GPUs may be), the kernel would
    run here from sm_80 PTX with an empty body (it is sm_90+ only) and write nothing: its ``grid`` is 0,
    it is not offered, and the Triton kernels take the call."""
    env = dict(os.environ, OPFORGE_CACHE_DIR=str(tmp_path / "cache"), TORCH_CUDA_ARCH_LIST="8.0+PTX",
               OPFORGE_BLOCK_SPARSE_CUDA="1")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(OLD_PTX)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["built"] and got["grid"] == 0 and not got["offered"], got
    assert got["err"] < 1e-2, got


@needs_hopper
def test_the_route_runs_the_cuda_kernel_when_it_comes_first(monkeypatch):
    launched = []
    real = cuda_decode.KERNEL.launch
    monkeypatch.setattr(cuda_decode.KERNEL, "launch", lambda *a: (launched.append(a[0]), real(*a)))
    names = triton_impl.DECODE_ROUTE.names
    monkeypatch.setattr(triton_impl.DECODE_ROUTE, "names", ("cuda", *(n for n in names if n != "cuda")))
    triton_impl.forget_plans()
    try:
        lay, w, x, b, ref = case(ragged(6), (64, 64), 2, torch.float16)
        close(block_sparse_linear(x, w, b, lay), ref, torch.float16)
        assert launched, "the CUDA kernel was not launched"
    finally:
        triton_impl.forget_plans()


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block", [(32, 32), (64, 64), (128, 64), (32, 128)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("tokens", [1, 2, 17, 32, 33, 64])
def test_the_cuda_kernel_replays_from_cpp_bit_for_bit(tokens, block, dtype, monkeypatch):
    """After a call shape's first launch through the op, its recipe is defined (``cuda_decode.recipe``:
    Args as a struct, x's tensor map, W's past 32 tokens, the partial slots and the counts held), and later
    calls launch from C++ (a native hit each) with the op's results bit for bit, on this call's
    tensors: another x (a new tensor map), a bias or none, empty rows and a full one."""
    if not compiled(tokens, block):
        pytest.skip("no variant for these tokens and blocks")
    ops, why = native_ops()
    assert ops is not None, why
    names = triton_impl.DECODE_ROUTE.names
    monkeypatch.setattr(triton_impl.DECODE_ROUTE, "names", ("cuda", *(n for n in names if n != "cuda")))
    triton_impl.forget_plans()
    table = triton_impl._NATIVE_FWD
    try:
        for bias in (True, False):
            lay, w, x, b, ref = case(ragged(6), block, tokens, dtype, bias)
            idx = lay.indices("cuda")

            def fwd(xx, w=w, b=b, idx=idx, n_out=lay.shape[0]):
                return triton_impl.forward(xx, w, b, idx.rows, idx.cols, idx.row_ptr, n_out)
            defined = table.defined
            first = fwd(x)  # planned, launched through the op, its recipe defined
            plans = [p for p in triton_impl._FWD.values() if getattr(p, "facts", ("",))[0] == "cuda"]
            assert plans and not plans[-1].native and table.defined == defined + 1, plans[-1].native
            before = ops.stats()[1]
            second = fwd(x)
            assert ops.stats()[1] == before + 1, "replayed from C++"
            assert torch.equal(second, first)
            close(second, ref, dtype)
            x2 = torch.randn_like(x)
            saved, table.call = table.call, None
            try:
                want = fwd(x2)  # through the op
            finally:
                table.call = saved
            assert torch.equal(fwd(x2), want)
    finally:
        triton_impl.forget_plans()


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block", [(32, 32), (64, 64), (128, 64), (32, 128), (128, 128)],
                         ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("tokens", [1, 2, 9, 17, 32, 33, 64])
def test_every_way_the_cuda_kernels_shares_cut_the_rows(tokens, block, dtype):
    """Shares of 1, 2, 3, 5 and 7 blocks, of all, of more than all (and the grid's own): rows whole
    in a CTA, cut at one end or both, over many CTAs; empty rows anywhere; with and without a bias. Through
    each tile that takes them: mma.sync's and wgmma's."""
    if not compiled(tokens, block):
        pytest.skip("no variant for these tokens and blocks")
    wgmmas = [wg for wg in (0, 1) if compiled(tokens, block, wgmma=bool(wg)) and (wg or tokens <= 32)]
    for _, mask in layouts(block[0]):
        for bias in (True, False):
            lay, w, x, b, ref = case(mask, block, tokens, dtype, bias)
            for chunk, wgmma in itertools.product(sorted({0, 1, 2, 3, 5, 7, max(1, lay.nnz), lay.nnz + 4}), wgmmas):
                close(run_cuda(lay, w, x, b, chunk, wgmma=wgmma), ref, dtype)


@needs_hopper
@pytest.mark.parametrize("stages, ctas, overlap", [(1, 1, 0), (2, 3, 1), (8, 1, 0), (4, 64, 1), (6, 1, 1)])
def test_every_ring_depth_ctas_an_sm_and_overlap(stages, ctas, overlap):
    for tokens in (9, 32, 64) if compiled(64, (64, 64)) else (9, 32):  # x's box 9, 32 or 64 rows high
        lay, w, x, b, ref = case(ragged(9), (64, 64), tokens, torch.bfloat16)
        wgmmas = [wg for wg in (0, 1) if compiled(tokens, (64, 64), wgmma=bool(wg)) and (wg or tokens <= 32)]
        for chunk, wgmma in itertools.product((0, 2, 5), wgmmas):
            close(run_cuda(lay, w, x, b, chunk, stages, ctas, overlap, wgmma), ref, torch.bfloat16)


@needs_hopper
def test_an_overlapped_launch_reads_what_the_kernels_before_it_wrote():
    """Launched as a programmatic dependent, the kernel starts while the one before it on the stream
    ends: it must read x, the weights and the layout only once that one is done. Here the kernels
    right before it write all three in place (as an optimizer step or a layout update would), after
    an overlapped launch on the old values: every result must be the new one."""
    mask = ragged(9)
    lay, w, x, _, ref = case(mask, (64, 64), 17, torch.bfloat16, bias=False)
    idx = lay.indices("cuda")
    for trial in range(10):
        g = torch.Generator().manual_seed(100 + trial)
        moved = torch.stack([row[torch.randperm(9, generator=g)] for row in mask])  # the rows' blocks elsewhere
        lay2, w2, x2, _, ref2 = case(moved, (64, 64), 17, torch.bfloat16, bias=False, seed=trial + 1)
        new = lay2.indices("cuda")
        assert torch.equal(new.row_ptr, idx.row_ptr)
        wb, xb, cols = w.clone(), x.clone(), idx.cols.clone()
        close(run_cuda(lay, wb, xb, None, 0, 3, 2, 1), ref, torch.bfloat16)
        y = torch.full((17, lay.shape[0]), float("nan"), device="cuda", dtype=x.dtype)
        counts = torch.zeros(lay.shape[0] // 16, dtype=torch.int32, device="cuda")
        wb.copy_(w2)  # the kernels right before the overlapped launch write all its inputs
        xb.copy_(x2)
        cols.copy_(new.cols)
        cuda_decode.ops().forward(xb, wb, None, y, cols, idx.row_ptr, counts, 0, 3, 2, 1)
        close(y, ref2, torch.bfloat16)


@needs_hopper
@pytest.mark.parametrize("kernel", ["decode", "decode-loops", "uncut"])
def test_an_overlapped_triton_launch_reads_what_the_kernels_before_it_wrote(kernel):
    """The same for the Triton decode kernels, which the plans launch as programmatic dependents on
    sm_90 and newer (``triton_sizing.decode_start``), their first blocks asked into L2 before they wait:
    the weights, x and the columns written in place right before each launch, ten times over, with
    runs that cut rows (the decode kernel's partial slots, in either walk) and units of half a row."""
    assert triton_sizing.decode_start(torch.device("cuda"))[1], "sm_90 launches them as dependents"
    mask = ragged(9)
    lay, w, x, _, ref = case(mask, (64, 64), 17, torch.bfloat16, bias=False)
    idx = lay.indices("cuda")

    def run(wb, xb, ix):
        if kernel.startswith("decode"):
            return run_kernel(lay, wb, xb, None, 3, 32, ix, flat=kernel == "decode")
        return run_uncut(lay, wb, xb, None, 5, 32, ix)
    for trial in range(10):
        g = torch.Generator().manual_seed(100 + trial)
        moved = torch.stack([row[torch.randperm(9, generator=g)] for row in mask])
        lay2, w2, x2, _, ref2 = case(moved, (64, 64), 17, torch.bfloat16, bias=False, seed=trial + 1)
        new = lay2.indices("cuda")
        assert torch.equal(new.row_ptr, idx.row_ptr)
        wb, xb, ix = w.clone(), x.clone(), idx._replace(cols=idx.cols.clone())
        first = run(wb, xb, ix)
        wb.copy_(w2)
        xb.copy_(x2)
        ix.cols.copy_(new.cols)
        second = run(wb, xb, ix)
        close(first, ref, torch.bfloat16)
        close(second, ref2, torch.bfloat16)


@needs_hopper
def test_many_small_layouts_every_share_twice_and_bitwise_repeatable():
    """The fuzz's tiny grids with every share, each launch made twice: the cut rows are summed in CTA
    order, so two launches agree bit for bit; the counts are back at zero in between."""
    g = torch.Generator().manual_seed(7)
    for trial in range(40):
        grid = (int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g)))
        mask = torch.rand(grid, generator=g) < float(torch.rand(1, generator=g))
        tokens = (1, 5, 32)[trial % 3]
        lay, w, x, b, ref = case(mask, (32, 32), tokens, torch.float16, bias=trial % 2 == 0, seed=trial)
        for chunk in range(0, lay.nnz + 2):
            first = run_cuda(lay, w, x, b, chunk, overlap=trial % 2)
            close(first, ref, torch.float16)
            assert torch.equal(first, run_cuda(lay, w, x, b, chunk))



@needs_hopper
def test_a_real_model_size_through_the_cuda_kernel_is_deterministic():
    """4096 -> 14336, 64-blocks, density 0.25, rows from empty to full, with the grid's own shares."""
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(14336, 4096, generator=g) * torch.linspace(0, 3, 14336).pow(4)[:, None]
    lay = BlockSparseLayout.by_magnitude(weight, 0.25, (64, 64))
    w = lay.gather(weight.to(torch.bfloat16)).cuda()
    b = torch.randn(14336, generator=g).to("cuda", torch.bfloat16)
    for tokens in (1, 32):
        x = torch.randn(tokens, 4096, generator=g).to("cuda", torch.bfloat16)
        ref = x.double() @ lay.scatter(w.double()).t() + b.double()
        y = run_cuda(lay, w, x, b, 0)
        close(y, ref, torch.bfloat16)
        assert torch.equal(y, run_cuda(lay, w, x, b, 0, overlap=1))  # the overlap changes no sum


@needs_hopper
def test_bad_input_to_the_cuda_kernel_is_a_clear_error():
    lay, w, x, b, _ = case(ragged(6), (64, 64), 4, torch.bfloat16)
    idx = lay.indices("cuda")
    y = torch.empty(4, lay.shape[0], device="cuda", dtype=x.dtype)
    counts = torch.zeros(lay.shape[0] // 4, dtype=torch.int32, device="cuda")
    fwd = cuda_decode.ops().forward

    def refused(match, *args):
        with pytest.raises(RuntimeError, match=match):
            fwd(*args)
    big = torch.zeros(65, x.shape[1], device="cuda", dtype=x.dtype)
    refused("1 to 64 tokens", big, w, b, torch.empty(65, lay.shape[0], device="cuda", dtype=x.dtype), idx.cols,
            idx.row_ptr, counts, 0, 3, 2, 0)
    refused("bfloat16 or float16", x.float(), w.float(), None, y.float(), idx.cols, idx.row_ptr, counts, 0, 3, 2, 0)
    refused("contiguous", x, w.transpose(1, 2), b, y, idx.cols, idx.row_ptr, counts, 0, 3, 2, 0)
    refused("int32 zeros of at least", x, w, b, y, idx.cols, idx.row_ptr, counts[:3], 0, 3, 2, 0)
    refused("int64", x, w, b, y, idx.cols.int(), idx.row_ptr, counts, 0, 3, 2, 0)
    refused("CUDA tensor", x.cpu(), w, b, y, idx.cols, idx.row_ptr, counts, 0, 3, 2, 0)
    refused("overlap must be 0 or 1", x, w, b, y, idx.cols, idx.row_ptr, counts, 0, 3, 2, 2)
    refused("wgmma must be -1, 0 or 1", x, w, b, y, idx.cols, idx.row_ptr, counts, 0, 3, 2, 0, 2)
    lay32, w32, x32, _, _ = case(ragged(6), (32, 32), 4, torch.bfloat16)
    idx32 = lay32.indices("cuda")
    refused("no variant .* through wgmma", x32, w32, None, torch.empty(4, lay32.shape[0], device="cuda", dtype=x.dtype),
            idx32.cols, idx32.row_ptr, counts, 0, 3, 2, 0, 1)  # 32-wide blocks: no wgmma tile
    refused("chunk must be", x, w, b, y, idx.cols, idx.row_ptr, counts, -1, 3, 2, 0)
    refused("no variant", x, w, b, y, idx.cols, idx.row_ptr, counts, 0, 60, 2, 0)  # the ring can't fit
    assert cuda_decode.ops().grid(big, 64, 64, 3, 2) == 0 and cuda_decode.ops().grid(x, 64, 64, 3, 2) > 0
