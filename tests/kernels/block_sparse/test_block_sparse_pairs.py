"""The paired forward's lists (``pairs.py``), without a GPU: against a plain reading of the mask, for
any layout (odd block-row counts, empty and full rows), and kept per index tensors."""

from __future__ import annotations

import gc

import torch
from hypothesis import given
from hypothesis import strategies as st

from opforge.kernels.block_sparse import pairs
from opforge.kernels.block_sparse.layout import BlockSparseLayout


def expected(mask: torch.Tensor):
    """Per pair: the (column, first block, second block) runs, read off the mask row by row."""
    index = torch.full(mask.shape, -1, dtype=torch.int64)
    index[mask] = torch.arange(int(mask.sum()))  # row-major: the layout's block order
    grid_r, grid_c = mask.shape
    out = []
    for p in range(-(-grid_r // 2)):
        a = index[2 * p].tolist()
        b = index[2 * p + 1].tolist() if 2 * p + 1 < grid_r else [-1] * grid_c
        both = [(c, a[c], b[c]) for c in range(grid_c) if a[c] >= 0 and b[c] >= 0]
        first = [(c, a[c]) for c in range(grid_c) if a[c] >= 0 and b[c] < 0]
        second = [(c, b[c]) for c in range(grid_c) if a[c] < 0 and b[c] >= 0]
        out.append((both, first, second))
    return out


@given(st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_the_lists_name_each_pairs_blocks_once_in_three_runs(grid_r, grid_c, seed, density):
    mask = torch.rand(grid_r, grid_c, generator=torch.Generator().manual_seed(seed)) < density
    idx = BlockSparseLayout(mask, (16, 16)).indices()
    seg, pcol, pia, pib = (t.tolist() for t in pairs.pair_lists(idx.cols, idx.row_ptr, grid_r, grid_c))
    assert len(seg) == 4 * (-(-grid_r // 2)) and len(pcol) == len(pia) == len(pib) == len(seg) // 4 * grid_c
    for p, (both, first, second) in enumerate(expected(mask)):
        s0, s1, s2, s3 = seg[4 * p: 4 * p + 4]
        assert s0 == p * grid_c and s3 <= (p + 1) * grid_c
        assert [(pcol[e], pia[e], pib[e]) for e in range(s0, s1)] == both
        assert [(pcol[e], pia[e]) for e in range(s1, s2)] == first
        assert [(pcol[e], pib[e]) for e in range(s2, s3)] == second


def test_an_empty_layout_has_empty_runs():
    idx = BlockSparseLayout(torch.zeros(3, 4, dtype=torch.bool), (16, 16)).indices()
    seg, *_ = pairs.pair_lists(idx.cols, idx.row_ptr, 3, 4)
    assert seg.tolist() == [0, 0, 0, 0, 4, 4, 4, 4]


def test_lists_are_made_once_per_index_tensors_and_dropped_with_them():
    made = []

    def make(fn):
        made.append(1)
        return fn()

    idx = BlockSparseLayout(torch.eye(4, dtype=torch.bool), (16, 16)).indices()
    assert pairs.lists_for(idx.cols, idx.row_ptr, 4, 4) is None  # not made where making isn't allowed
    first = pairs.lists_for(idx.cols, idx.row_ptr, 4, 4, make)
    assert pairs.lists_for(idx.cols, idx.row_ptr, 4, 4, make) is first and len(made) == 1
    assert pairs.lists_for(idx.cols, idx.row_ptr, 4, 4) is first
    copy = idx.cols.clone()  # other tensors, same contents: their own lists
    assert pairs.lists_for(copy, idx.row_ptr, 4, 4, make) is not first and len(made) == 2
    idx.cols.add_(0)  # written in place: made again
    assert pairs.lists_for(idx.cols, idx.row_ptr, 4, 4, make) is not first and len(made) == 3
    before = len(pairs._MEMO)
    del copy
    gc.collect()
    assert len(pairs._MEMO) == before - 1


def test_index_tensors_made_afresh_for_each_call_stop_getting_lists():
    """A layout whose indices are copied in anew for every call (as a compiled graph does for a layout
    never moved to the device) would pay a making per call: after a few such short lives the shape
    takes the one-row forward (None)."""
    cpu = BlockSparseLayout(torch.ones(6, 5, dtype=torch.bool), (16, 16)).indices()
    got = []
    for _ in range(pairs._CHURN + 2):
        cols, row_ptr = cpu.cols.clone(), cpu.row_ptr.clone()
        got.append(pairs.lists_for(cols, row_ptr, 6, 5, lambda fn: fn()))
        del cols, row_ptr
        gc.collect()
    assert all(g is not None for g in got[:pairs._CHURN]) and got[-1] is None
    lasting = BlockSparseLayout(torch.ones(6, 4, dtype=torch.bool), (16, 16)).indices()  # another shape: unaffected
    assert pairs.lists_for(lasting.cols, lasting.row_ptr, 6, 4, lambda fn: fn()) is not None
    for _ in range(pairs._CHURN + 2):  # indices that serve several calls, however briefly they live, don't count
        cols, row_ptr = lasting.cols.clone(), lasting.row_ptr.clone()
        for _ in range(2 * pairs._ONE_CALL):
            assert pairs.lists_for(cols, row_ptr, 6, 4, lambda fn: fn()) is not None
        del cols, row_ptr
        gc.collect()
    assert pairs._SHORT_LIVED.get((6, 4, 24), 0) == 0
    pairs.forget()
    assert pairs._SHORT_LIVED == {}
