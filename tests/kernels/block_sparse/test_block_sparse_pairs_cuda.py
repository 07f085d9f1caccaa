"""The paired forward (issue 35, T=2048): two neighbouring block-rows a program, a shared column's x
tile read once for both (``pairs.py``, ``_fwd_pair_kernel``). Forced here (the route takes the
one-row kernel first when nothing is timed) and checked against the masked dense fp64 result: 32-
and 64-high blocks, an odd number of block-rows, empty rows, a full row, rows sharing every or no
column, bf16/fp16/fp32, with and without a bias; two layouts of one shape in turn; CUDA graph replay,
and a layout first seen under a capture."""

from __future__ import annotations

import pytest
import torch
from block_sparse_cases import case, close

import opforge.ops  # noqa: F401
from opforge.kernels.block_sparse import pairs, triton_impl
from opforge.kernels.block_sparse.layout import BlockSparseLayout
from opforge.ops import block_sparse_linear

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("the paired forward reads through the copy engine (Hopper and newer)", allow_module_level=True)

@pytest.fixture(autouse=True)
def paired_first(monkeypatch):
    monkeypatch.setattr(triton_impl.FWD_ROUTE, "names", ("pairs", "rows"))
    triton_impl.forget_plans()
    yield
    triton_impl.forget_plans()


def masks(grid_r: int, grid_c: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    yield "random", torch.rand(grid_r, grid_c, generator=g) < 0.5
    m = torch.zeros(grid_r, grid_c, dtype=torch.bool)
    for r in range(grid_r):  # rows of every length, an empty one and a full one
        m[r, torch.randperm(grid_c, generator=g)[: (r * grid_c) // max(1, grid_r - 1)]] = True
    yield "ragged", m[torch.randperm(grid_r, generator=g)]
    same = torch.zeros(grid_r, grid_c, dtype=torch.bool)
    same[:, ::2] = True  # each pair shares all its columns
    yield "shared", same
    apart = torch.zeros(grid_r, grid_c, dtype=torch.bool)
    apart[0::2, : grid_c // 2] = apart[1::2, grid_c // 2:] = True  # each pair shares none
    yield "disjoint", apart


def paired_runs() -> int:
    return sum(1 for p in triton_impl._FWD.values() if p is not triton_impl._REFERENCE and p.facts[0] == "pair")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block", [(64, 64), (32, 32), (64, 16), (32, 128)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("tokens", [65, 300])
def test_the_paired_forward_equals_masked_dense(tokens, block, dtype):
    for grid_r in (6, 7):  # an odd count leaves the last pair one row
        for _name, mask in masks(grid_r, 8, seed=grid_r):
            for bias in (True, False):
                lay, w, x, b, ref = case(mask, block, tokens, dtype, bias)
                close(block_sparse_linear(x, w, b, lay), ref, dtype)
    assert paired_runs() > 0


def test_fp32_and_two_layouts_of_one_shape_in_turn():
    """One plan serves a shape; each call reads its own layout's pair lists."""
    made = []
    for seed in (1, 2):
        lay = BlockSparseLayout.random(512, 512, 0.5, (64, 64), generator=torch.Generator().manual_seed(seed))
        made.append(case(lay.mask, (64, 64), 200, torch.float32, True, seed))
    assert made[0][0].nnz == made[1][0].nnz and not torch.equal(made[0][0].mask, made[1][0].mask)
    for lay, w, x, bias, ref in (*made, *made):
        close(block_sparse_linear(x, w, bias, lay), ref, torch.float32)
    assert paired_runs() == 1


def test_graph_replay_equals_eager_and_a_layout_first_seen_under_a_capture_is_right():
    mask = torch.rand(8, 16, generator=torch.Generator().manual_seed(4)) < 0.5
    lay, w, x, b, ref = case(mask, (64, 64), 256, torch.bfloat16, True)
    eager = block_sparse_linear(x, w, b, lay)
    assert paired_runs() == 1
    other = BlockSparseLayout(torch.rand(8, 16, generator=torch.Generator().manual_seed(5)) < 0.5, (64, 64))
    w2 = torch.randn(other.nnz, 64, 64, device="cuda", dtype=torch.bfloat16)
    other.indices("cuda")  # made before the capture (a module's .to() does so); its pair lists are not
    ref2 = x.double() @ other.scatter(w2.double()).t()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        block_sparse_linear(x, w, b, lay)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = block_sparse_linear(x, w, b, lay)
        y2 = block_sparse_linear(x, w2, None, other)  # no pair lists under a capture: the one-row kernel
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)
    close(y, ref, torch.bfloat16)
    close(y2, ref2, torch.bfloat16)
    idx = other.indices("cuda")
    assert pairs.lists_for(idx.cols, idx.row_ptr, 8, 16) is None  # not made under the capture
