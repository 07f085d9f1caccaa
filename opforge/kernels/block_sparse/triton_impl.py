"""Block-sparse matmul in Triton: the three functions of the contract (``reference.py``).

* ``forward``: a program per (block-row ``r``, tile of ``BLOCK_M`` tokens) accumulates, over the
  block-row's kept blocks (CSR: ``row_ptr``, ``cols``), ``x[tile, cols[k]] @ w[k]ᵀ`` in fp32 on
  the tensor cores, adds the bias and stores its ``(BLOCK_M, bh)`` tile of ``y`` once. At
  decode sizes (``decode_split``) several programs share a block-row's blocks; the last of them
  to finish adds their fp32 partial sums, in the same launch. Up to 64 tokens a route picks this,
  ``_decode_kernel`` or ``_decode_uncut_kernel`` (``triton_decode.py``); past them, with the copy engine, this or the paired forward (two
  block-rows a program, ``pairs.py``).
* ``grad_input``: the same over block-columns (CSC: ``col_ptr``, ``col_order``),
  ``dy[tile, rows[k]] @ w[k]`` into a ``(BLOCK_M, bw)`` tile of ``dx``.
* ``grad_weight``: a program per (up to ``G = 128 / bw`` consecutive kept blocks of one
  block-row, slice of the tokens) computes ``dy[slice, r]ᵀ @ x[slice, cols of those blocks]``
  as one ``(bh, G bw)`` product, reading the row's ``dy`` slice once for all of them; with
  several slices (when there are too few blocks to fill the GPU) the last program of a group to
  finish adds the fp32 partial sums in a fixed order, in the same launch, so the result is
  deterministic. ``grad_weight_bias`` adds a program per block-row that sums the bias gradient.

Programs are ordered in groups (``_tile``): 8 consecutive tiles of tokens walk every block-row
(column) together, so their tokens stay in L2 and each block of ``w`` is read once per group.
Empty block-rows (columns) store zeros (plus the bias). fp16 and bf16 take the tensor cores
with fp32 accumulation; fp32 follows ``torch.backends.cuda.matmul.allow_tf32`` as torch's
own matmul does (IEEE fp32 by default). Each kernel is tuned once per (block shape, dtype,
size class), the winner kept in opforge's cache, and launched without triton's per-call
tuning and JIT work (``kernels/triton_launch.py``). Other dtypes, block sides and devices run
the torch path (``supported``).

On Hopper and newer, the forward and the input gradient bring their operands in with the copy
engine (TMA, triton's host descriptors) when the operands are contiguous and start on 16 bytes
(``tma_ready``) and there are more than ``TMA_MIN_TOKENS`` tokens, else through pointer loads
(same results). The kernels live in ``triton_kernels.py``, their sizing (configs, what fits,
the decode split) in ``triton_sizing.py``, the kernels' configs and the steps of a plan in
``triton_plans.py``, the forward's plans at decode sizes in ``triton_decode_plans.py``; this
module plans the other call shapes and launches them all.

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

import torch

from ...compat import tf32_reader
from ...process import forgets
from .. import triton_launch
from ..native_launch import NativeTable
from ..triton_tma import Described
from . import pairs, reference
from .buffers import split_counts
from .triton_decode_plans import decode_route, pointer_plan
from .triton_plans import (
    _DECODE,
    _PAIR,
    _PLAIN,
    _REFERENCE,
    _SPLIT,
    _TMA,
    DECODE_ROUTE,
    FAMILY,
    FWD_ROUTE,
    KERNELS,
    _define,
    _fwd_prefix,
    _keep,
    _pair_lists,
    _plan,
    pair_route,
)
from .triton_sizing import (
    DECODE_MAX_TOKENS,
    bucket,
    cdiv,
    depth,
    device_facts,
    dw_fits,
    m_fits,
    pairs_fit,
    precision,
    supported,
    tma_ready,
)


def forward(x, w, bias, rows, cols, row_ptr, out_features: int):
    tf32 = x.dtype is _F32 and _TF32()
    native = _NATIVE_FWD.call
    if native is not None and triton_launch.direct():
        got = native(x, w, bias, cols, row_ptr, rows, out_features, tf32)
        if got:
            return got[0]
    key = (x.shape, w.shape, out_features, x.dtype, w.dtype, None if bias is None else bias.dtype, x.device,
           x.data_ptr() % 16, w.data_ptr() % 16, None if bias is None else bias.data_ptr() % 16,
           cols.data_ptr() % 16, row_ptr.data_ptr() % 16, rows.data_ptr() % 16, x.is_contiguous(), w.is_contiguous(),
           tf32)  # each pointer's 16-byte alignment: triton specializes a kernel on it (rows: the decode kernel's)
    plan = _FWD.get(key)
    if plan is None:
        plan = _keep(_FWD, key, _forward_plan(x, w, bias, cols, row_ptr, rows, out_features))
    if plan is _REFERENCE:
        return reference.forward(x, w, bias, rows, cols, row_ptr, out_features)
    if plan.facts[0] is _PAIR and _pair_lists(cols, row_ptr, *plan.facts[3:5]) is None:
        plan = plan.facts[5]  # a layout first seen under a CUDA graph capture: its pair lists can't be made there
    y = torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
    prefix = _fwd_prefix(plan.facts, x, w, bias if bias is not None else w, y, cols, row_ptr, rows)
    plan(prefix, x.device.index)
    if not plan.native:
        # decode's partials: fresh fp32 past DECODE_SLOT_TOKENS, else its kept int32 slots (held, not outputs)
        fresh = plan.facts[0] is _SPLIT or (plan.facts[0] is _DECODE and prefix[4].dtype == torch.float32)
        outputs = [(y, True)] + ([(prefix[4], False)] if fresh else [])
        _define(_NATIVE_FWD, native is not None, plan, prefix, (x, w, bias, cols, row_ptr, rows),
                (out_features, tf32), outputs)
    return y


def _forward_plan(x, w, bias, cols, row_ptr, rows, out_features):
    nnz, bh, bw = w.shape
    tokens, in_features = x.shape
    if not supported(x, bh, bw) or tokens == 0:
        return _REFERENCE  # tokens == 0: an empty y, which the torch path makes too
    sms, l2, has_tma = device_facts(x.device)
    grid_r = out_features // bh
    w2 = w.view(-1, bw)
    key = (bucket(tokens), max(1, l2 // 2 // max(1, in_features * x.element_size())), depth(nnz, grid_r))
    dev, prec, has_bias, size = x.device.index, precision(x.dtype), bias is not None, x.element_size()
    b = bias if has_bias else w
    y = torch.empty(tokens, out_features, dtype=x.dtype, device=x.device)  # for tuning runs
    if tokens <= DECODE_MAX_TOKENS:
        return decode_route(x, w, b, y, cols, row_ptr, rows, out_features, has_bias, sms, key)
    if has_tma and tma_ready(tokens, x, w2):  # more tokens than a decode split takes (TMA_MIN_TOKENS)
        def build(c):
            m, k = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]
            facts = (_TMA, (m, k), (bh, k))
            return ((grid_r * cdiv(tokens, m),), _fwd_prefix(facts, x, w, b, y, cols, row_ptr),
                    (tokens, out_features, *key, bh, bw, has_bias, prec))
        plan = _plan("fwd_tma", ("fwd_tma", x.dtype, prec, *key, bh, bw, out_features, has_bias), dev, build,
                     lambda c: m_fits(c, tokens, bw, bh, size))
        plan.facts = (_TMA, (plan.choice.kwargs["BLOCK_M"], plan.choice.kwargs["BLOCK_K"]),
                      (bh, plan.choice.kwargs["BLOCK_K"]))
        grid_c = in_features // bw
        if not pairs_fit(bh, grid_r, grid_c):
            return plan
        return pair_route(plan, x, w, b, y, cols, row_ptr, out_features, has_bias, key, grid_c)
    return pointer_plan(x, w, b, y, cols, row_ptr, out_features, has_bias, key)


def grad_input(dy, w, rows, cols, col_ptr, col_order, in_features: int):
    tf32 = dy.dtype is _F32 and _TF32()
    native = _NATIVE_DX.call
    if native is not None and triton_launch.direct():
        got = native(dy, w, rows, col_ptr, col_order, None, in_features, tf32)
        if got:
            return got[0]
    key = (dy.shape, w.shape, in_features, dy.dtype, w.dtype, dy.device, dy.data_ptr() % 16, w.data_ptr() % 16,
           rows.data_ptr() % 16, col_ptr.data_ptr() % 16, col_order.data_ptr() % 16, dy.is_contiguous(),
           w.is_contiguous(), tf32)
    plan = _DX.get(key)
    if plan is None:
        plan = _keep(_DX, key, _grad_input_plan(dy, w, rows, col_ptr, col_order, in_features))
    if plan is _REFERENCE:
        return reference.grad_input(dy, w, rows, cols, col_ptr, col_order, in_features)
    dx = torch.empty(dy.shape[0], in_features, dtype=dy.dtype, device=dy.device)
    prefix = _dx_prefix(plan.facts, dy, w, dx, rows, col_ptr, col_order)
    plan(prefix, dy.device.index)
    if not plan.native:
        _define(_NATIVE_DX, native is not None, plan, prefix, (dy, w, rows, col_ptr, col_order, None),
                (in_features, tf32), [(dx, True)])
    return dx


def _dx_prefix(facts, dy, w, dx, rows, col_ptr, col_order) -> tuple:
    if facts[0] is _TMA:
        return Described(dy, facts[1]), Described(w, facts[2], w.shape[0] * w.shape[1]), dx, rows, col_ptr, col_order
    return dy, w, dx, rows, col_ptr, col_order


def _grad_input_plan(dy, w, rows, col_ptr, col_order, in_features):
    nnz, bh, bw = w.shape
    tokens, out_features = dy.shape
    if not supported(dy, bh, bw) or tokens == 0:
        return _REFERENCE
    _, l2, has_tma = device_facts(dy.device)
    lines = in_features // bw
    key = (bucket(tokens), max(1, l2 // 2 // max(1, out_features * dy.element_size())), depth(nnz, lines))
    dev, prec, size = dy.device.index, precision(dy.dtype), dy.element_size()
    dx = torch.empty(tokens, in_features, dtype=dy.dtype, device=dy.device)  # for tuning runs

    def keep(c):
        return m_fits(c, tokens, bh, bw, size)

    if has_tma and tma_ready(tokens, dy, w.view(-1, bw)):
        def build(c):
            m, k = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]
            return ((lines * cdiv(tokens, m),), _dx_prefix((_TMA, (m, k), (k, bw)), dy, w, dx, rows, col_ptr,
                                                              col_order),
                    (tokens, in_features, *key, bh, bw, prec))
        plan = _plan("dx_tma", ("dx_tma", dy.dtype, prec, *key, bh, bw, in_features), dev, build, keep)
        k = plan.choice.kwargs["BLOCK_K"]
        plan.facts = (_TMA, (plan.choice.kwargs["BLOCK_M"], k), (k, bw))
        return plan

    def build(c):
        return ((lines * cdiv(tokens, c.kwargs["BLOCK_M"]),),
                _dx_prefix((_PLAIN,), dy, w, dx, rows, col_ptr, col_order),
                (tokens, out_features, in_features, *key, bh, bw, prec))
    return _plan("dx", ("dx", dy.dtype, prec, *key, bh, bw, in_features), dev, build, keep, (_PLAIN,))


def grad_weight(dy, x, rows, cols, row_ptr, bh: int, bw: int):
    return _grad_weight(dy, x, rows, cols, row_ptr, bh, bw, False)[0]


def grad_weight_bias(dy, x, rows, cols, row_ptr, bh: int, bw: int):
    """``(grad_weight(...), dy.sum(0))`` in one launch: the bias gradient is summed by the
    weight-gradient kernel as it reads ``dy``."""
    return _grad_weight(dy, x, rows, cols, row_ptr, bh, bw, True)


def _grad_weight(dy, x, rows, cols, row_ptr, bh, bw, with_db: bool):
    tf32 = x.dtype is _F32 and _TF32()
    native = _NATIVE_DW.call
    if native is not None and triton_launch.direct():
        got = native(dy, x, cols, row_ptr, rows, None, bh << 16 | bw, 2 * with_db + tf32)
        if got:
            return got[0], (got[1] if with_db else None)
    key = (dy.shape, x.shape, rows.shape, bh, bw, dy.dtype, x.dtype, x.device, dy.data_ptr() % 16,
           x.data_ptr() % 16, cols.data_ptr() % 16, row_ptr.data_ptr() % 16, tf32, with_db)
    plan = _DW.get(key)
    if plan is None:
        plan = _keep(_DW, key, _grad_weight_plan(dy, x, rows, cols, row_ptr, bh, bw, with_db))
    if plan is _REFERENCE:
        if with_db:
            return reference.grad_weight_bias(dy, x, rows, cols, row_ptr, bh, bw)
        return reference.grad_weight(dy, x, rows, cols, row_ptr, bh, bw), None
    out = torch.empty(rows.shape[0], bh, bw, dtype=x.dtype, device=x.device)
    db = torch.empty(dy.shape[1], dtype=dy.dtype, device=dy.device) if with_db else None
    prefix = _dw_prefix(plan.facts, dy, x, out, db, cols, row_ptr)
    plan(prefix, x.device.index)
    if not plan.native:
        outputs = [(out, True)] + ([(db, True)] if with_db else [])
        if plan.facts[0] > 1:  # the split's fp32 partials (db's share dw's buffer without db)
            outputs += [(prefix[3], False)] + ([(prefix[5], False)] if with_db else [])
        _define(_NATIVE_DW, native is not None, plan, prefix, (dy, x, cols, row_ptr, rows, None),
                (bh << 16 | bw, 2 * with_db + tf32), outputs)
    return out, db


def _dw_prefix(facts, dy, x, out, db, cols, row_ptr) -> tuple:
    """A weight-gradient launch's leading arguments; facts: (split, its count of groups). With a
    split, fresh fp32 partials for dw (and db) and the stream's arrival counts."""
    split, groups = facts
    dbt = out if db is None else db  # not read without HAS_DB
    if split == 1:
        return dy, x, out, out, dbt, dbt, row_ptr, cols, row_ptr  # part, db_part, count: not read
    part = torch.empty(split, *out.shape, dtype=torch.float32, device=x.device)
    db_part = part if db is None else torch.empty(split, db.shape[0], dtype=torch.float32, device=x.device)
    return dy, x, out, part, dbt, db_part, split_counts(x.device.index, groups), cols, row_ptr


def _grad_weight_plan(dy, x, rows, cols, row_ptr, bh, bw, with_db):
    if not supported(x, bh, bw) or rows.numel() == 0 or x.shape[0] == 0:
        return _REFERENCE  # nothing to compute: zeros, which the torch path makes too
    tokens, in_features = x.shape
    out_features = dy.shape[1]
    nnz = rows.numel()
    sms = device_facts(x.device)[0]
    g = max(1, 128 // bw)  # blocks of a row per program: a 128-wide MMA
    groups_per_row = cdiv(in_features // bw, g)  # an upper bound: programs past a row's end exit
    # Enough working programs to fill the GPU twice over, each with at least 512 tokens.
    split = max(1, min(cdiv(2 * sms, cdiv(nnz, g)), tokens // 512))
    per = cdiv(cdiv(tokens, split), 128) * 128
    split = cdiv(tokens, per)
    n_rows = out_features // bh
    grid = (n_rows * groups_per_row + (n_rows if with_db else 0), split)  # with db: a program per row first
    facts = (split, grid[0])
    out = torch.empty(nnz, bh, bw, dtype=x.dtype, device=x.device)  # for tuning runs
    db = torch.empty(out_features, dtype=dy.dtype, device=dy.device) if with_db else None
    prec, t_bucket, size = precision(x.dtype), bucket(tokens), x.element_size()
    consts = (tokens, out_features, in_features, nnz, per, t_bucket, split, groups_per_row, bh, bw, g, with_db,
              split > 1, prec)
    # The blocks a row holds are part of the key, as in the forward's: at 8192 tokens (4096 to 4096,
    # 64-blocks) the config tuned at density 0.5 took 1.4x the best one's time at 0.25
    # (bench/cuda_probe/block_sparse_kernels.py, H100, 2026-11-25).
    key = ("dw", x.dtype, prec, t_bucket, bh, bw, g, split, with_db, depth(nnz, n_rows))
    return _plan("dw", key, x.device.index,
                 lambda c: (grid, _dw_prefix(facts, dy, x, out, db, cols, row_ptr), consts),
                 lambda c: dw_fits(c, bh, bw, g, size), facts)


_FWD: dict = {}
_DX: dict = {}
_DW: dict = {}
_NATIVE_FWD, _NATIVE_DX, _NATIVE_DW = (NativeTable(f"block_sparse.{n}") for n in ("fwd", "dx", "dw"))
NATIVE_FORWARD, NATIVE_INPUT_GRAD, NATIVE_WEIGHT_GRAD = _NATIVE_FWD, _NATIVE_DX, _NATIVE_DW
"""Each launch's recipe, once planned, for the C++ launch path (``kernels/native_launch``): a call
whose inputs match a defined recipe's key is one op call; anything else plans here. The keys
(inputs' shapes, strides, dtypes, alignment, the tf32 flag, the device and stream) cover what
the plan keys above do."""
_F32, _TF32 = torch.float32, tf32_reader()
"""The plan keys' TF32 flag, ``x.dtype is _F32 and _TF32()`` (``torch.backends.cuda.matmul.allow_tf32``,
read by torch's own getter: ``compat.tf32_reader``), inlined: fp32 follows ``allow_tf32`` as
``triton_sizing.precision`` does."""


def forget_plans() -> None:
    """Plan every call shape again (tests that change how calls are planned)."""
    for plans in (_FWD, _DX, _DW):
        plans.clear()
    for route in (DECODE_ROUTE, FWD_ROUTE):
        if route is not None:
            route.forget()
    pairs.forget()
    for table in (_NATIVE_FWD, _NATIVE_DX, _NATIVE_DW):
        table.forget()


forgets(forget_plans)  # opforge.reset()


__all__ = ["DECODE_ROUTE", "FAMILY", "FWD_ROUTE", "KERNELS", "NATIVE_FORWARD", "NATIVE_INPUT_GRAD", "NATIVE_WEIGHT_GRAD", "forward", "grad_input", "grad_weight",
           "grad_weight_bias"]
