"""Pairs of neighbouring block-rows for the paired forward (``triton_kernels._fwd_pair_kernel``).

A forward program that owns one block-row reads an x tile for each of its kept blocks, and each x
tile feeds ``bh`` outputs only: at T=2048, 64-blocks, that design is held near the ceiling of
one-block-wide output tiles (``docs/benchmarks.md``, issue 35). Block-rows ``2p`` and ``2p + 1`` of
an unstructured layout share about ``density`` of their columns; a program owning both reads the x
tile of a shared column once for its two blocks. Its list of columns comes in three runs, each a
loop with no branch: the columns both rows keep, then those only the first keeps, then those only
the second keeps.

``pair_lists(cols, row_ptr, grid_r, grid_c)`` gives, for ``P = ceil(grid_r / 2)`` pairs:

* ``seg`` (``4 P``, int32): pair ``p``'s runs are entries ``seg[4p]:seg[4p+1]`` (both),
  ``seg[4p+1]:seg[4p+2]`` (first only), ``seg[4p+2]:seg[4p+3]`` (second only);
* ``pcol``, ``pia``, ``pib`` (``P * grid_c``, int32): each entry's block-column and the indices of
  its blocks in the first and second row (0 where that row lacks it: never read).

They are made by torch ops on the indices' device, with no host sync, and kept per index tensors
(``lists_for``): a layout's indices are made once and never written.

>>> import torch
>>> cols, row_ptr = torch.tensor([0, 2, 1, 2]), torch.tensor([0, 2, 4])  # rows {0, 2} and {1, 2}
>>> seg, pcol, pia, pib = pair_lists(cols, row_ptr, 2, 3)
>>> seg.tolist(), pcol[:3].tolist(), pia[:3].tolist(), pib[:3].tolist()
([0, 1, 2, 3], [2, 0, 1], [1, 0, 0], [3, 0, 2])
"""

from __future__ import annotations

import threading
import time
import weakref

import torch

_MEMO: dict = {}
_REPLACED: list = []
_LOCK = threading.Lock()
_SHORT_LIVED: dict = {}
"""Per (block-rows, block-columns, blocks): how many index tensors died within ``_SHORT`` s of their
lists being made, having served one call. Index tensors made afresh for each call (a layout whose indices a compiled graph
copies in every time) would cost each call a making; past ``_CHURN`` such deaths that shape stops
getting lists and takes the one-row forward."""
_SHORT, _CHURN = 1.0, 16
_ONE_CALL = 2
"""Lookups of one forward call: its check for the lists (which makes them), and its launch arguments."""


def pair_lists(cols: torch.Tensor, row_ptr: torch.Tensor, grid_r: int, grid_c: int) -> tuple:
    """(seg, pcol, pia, pib) of the layout with CSR ``row_ptr`` / ``cols`` (see the module's doc)."""
    dev = cols.device
    pairs = -(-grid_r // 2)
    nnz = cols.numel()
    counts = row_ptr[1:] - row_ptr[:-1]
    rows = torch.repeat_interleave(torch.arange(grid_r, device=dev), counts, output_size=nnz)
    slot = torch.full((2 * pairs, grid_c), -1, dtype=torch.int64, device=dev)
    slot[rows, cols] = torch.arange(nnz, device=dev)
    a, b = slot[0::2], slot[1::2]
    has_a, has_b = a >= 0, b >= 0
    run = torch.where(has_a & has_b, 0, torch.where(has_a, 1, torch.where(has_b, 2, 3)))  # 3: neither
    order = torch.argsort(run * grid_c + torch.arange(grid_c, device=dev), dim=1)
    per_run = torch.stack([(run == k).sum(1) for k in range(3)], 1)
    ends = per_run.cumsum(1)
    base = torch.arange(pairs, device=dev)[:, None] * grid_c
    seg = torch.cat([base, base + ends], 1)
    pia = torch.gather(a, 1, order).clamp_min(0)
    pib = torch.gather(b, 1, order).clamp_min(0)
    return tuple(t.reshape(-1).to(torch.int32) for t in (seg, order, pia, pib))


def lists_for(cols: torch.Tensor, row_ptr: torch.Tensor, grid_r: int, grid_c: int, make=None) -> tuple | None:
    """``pair_lists`` of these index tensors, made once per tensors (the same objects, unwritten since)
    and kept while ``cols`` lives, so a CUDA graph that captured a launch reading them can replay it.
    ``make(fn)``: how to run the making (``buffers.outside_pools``); None: not made here (under
    a CUDA graph capture, which can't make them: the caller takes the one-row forward)."""
    key = (id(cols), id(row_ptr), grid_r, grid_c)
    found = _MEMO.get(key)
    if found is not None:
        ref_c, ref_r, versions, lists, uses = found
        if ref_c() is cols and ref_r() is row_ptr and versions == (cols._version, row_ptr._version):
            uses[0] += 1
            return lists
    shape = (grid_r, grid_c, cols.numel())
    if make is None or _SHORT_LIVED.get(shape, 0) >= _CHURN:
        return None
    lists = make(lambda: pair_lists(cols, row_ptr, grid_r, grid_c))
    with _LOCK:
        old = _MEMO.get(key)
        if old is not None:
            _REPLACED.append(old[3])  # indices written in place: a captured graph may still read the old lists
            uses = old[4]
        else:
            uses = [1]
            weakref.finalize(cols, _dropped, key, shape, time.monotonic(), uses)
        _MEMO[key] = (weakref.ref(cols), weakref.ref(row_ptr), (cols._version, row_ptr._version), lists, uses)
    return lists


def _dropped(key: tuple, shape: tuple, made: float, uses: list) -> None:
    _MEMO.pop(key, None)
    if uses[0] <= _ONE_CALL and time.monotonic() - made < _SHORT:
        _SHORT_LIVED[shape] = _SHORT_LIVED.get(shape, 0) + 1


def forget() -> None:
    """Let every shape have lists again (``triton_impl.forget_plans``)."""
    _SHORT_LIVED.clear()
