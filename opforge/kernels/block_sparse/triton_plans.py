"""The block-sparse Triton kernels' plans (``triton_impl.py`` launches them): each kernel with its
candidate configs (``KERNELS``), the routes between two forwards (``DECODE_ROUTE``, ``FWD_ROUTE``),
a forward's launch arguments (``_fwd_prefix``, with the paired forward's lists), and the steps
every plan takes: choose a config (tuned once, kept in the cache), remember the plan
outside CUDA graph captures, and define its launch in a native table for the C++ path.

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

import torch

from .. import triton_launch
from ..native_launch import NativeTable
from ..route import Route
from ..triton_compat import triton
from ..triton_launch import Plan, TunedKernel
from ..triton_tma import Described
from . import cuda_decode, pairs
from .buffers import outside_pools, split_counts, split_slots
from .triton_decode import _decode_kernel, _decode_uncut_kernel
from .triton_kernels import (
    _dw_kernel,
    _dx_kernel,
    _dx_tma_kernel,
    _fwd_kernel,
    _fwd_pair_kernel,
    _fwd_tma_kernel,
)
from .triton_sizing import (
    DECODE_SLOT_TOKENS,
    bucket,
    cdiv,
    decode_configs,
    decode_uncut_configs,
    dw_configs,
    fwd_configs,
    m_configs,
    pair_fits,
    precision,
)

FAMILY = "block_sparse_triton"
"""The tuned configs' family in opforge's cache (``kernels/tuning.py``): the extension's name."""

KERNELS = {} if triton is None else {
    "fwd": TunedKernel(FAMILY, _fwd_kernel, fwd_configs()),
    "dx": TunedKernel(FAMILY, _dx_kernel, m_configs()),
    "fwd_tma": TunedKernel(FAMILY, _fwd_tma_kernel, m_configs()),
    "fwd_pair": TunedKernel(FAMILY, _fwd_pair_kernel, m_configs()),
    "decode": TunedKernel(FAMILY, _decode_kernel, decode_configs(), dependent="OVERLAP"),
    "decode_uncut": TunedKernel(FAMILY, _decode_uncut_kernel, decode_uncut_configs(), dependent="OVERLAP"),
    "dx_tma": TunedKernel(FAMILY, _dx_tma_kernel, m_configs()),
    "dw": TunedKernel(FAMILY, _dw_kernel, dw_configs()),
    "decode_cuda": cuda_decode.KERNEL,
}
"""Each kernel with its candidate configs and the ones chosen (``kernels/triton_launch.py``; the CUDA
decode kernel's: ``kernels/tuned_op.py``)."""

DECODE_ROUTE = None if triton is None else Route(
    FAMILY, "decode_route", ("decode", "uncut", "pointer", "cuda"),
    (KERNELS["decode"], KERNELS["decode_uncut"], KERNELS["fwd"], KERNELS["decode_cuda"]),
    timing="graph replay, rotated stand-ins")
"""Up to ``DECODE_MAX_TOKENS`` tokens, which forward runs a size class: ``_decode_kernel`` (equal runs
of blocks per program), ``_decode_uncut_kernel`` (no row cut across programs), the pointer kernel
(a block-row per program, split at T <= 32) or, where it is offered (``cuda_decode.offered``: sm_90+,
T <= 32), the CUDA kernel (a copy-engine ring a CTA), timed once per key under graph replay on stand-ins
for the weight (``graph_timing``; their configs too) and kept (on an H200 the
decode kernel took 1.4x the pointer kernel's time at d=0.1, T=64 on 4096->14336, and half of it on
14336->4096 at T=64: ``docs/benchmarks.md``, issue 35)."""

FWD_ROUTE = None if triton is None else Route(FAMILY, "fwd_route", ("rows", "pairs"),
                                               (KERNELS["fwd_tma"], KERNELS["fwd_pair"]))
"""Past ``DECODE_MAX_TOKENS`` tokens with the copy engine, where 32- or 64-high blocks allow it, which
forward runs a size class: a block-row a program (``_fwd_tma_kernel``) or two (``_fwd_pair_kernel``,
reading a shared column's x tile once for both). Timed once per key and kept; the one-row kernel
where nothing is timed (tuning off, a capture)."""


# -- plans: each call shape is sized, tuned and compiled once (kernels/triton_launch.py) --

# _FWD, _DX, _DW: (shapes, dtypes, device, the inputs' 16-byte alignment and contiguity, TF32) ->
# a ``Plan``, or ``_REFERENCE`` (the torch path takes the call). The key holds everything a plan's
# sizing, config and compiled kernel depend on; a call's own tensors (and outputs) go in at
# launch, so a plan never holds a pointer or a descriptor of an earlier call.
_REFERENCE = "reference"
_TMA, _SPLIT, _PLAIN, _DECODE, _UNCUT, _PAIR, _CUDA = "tma", "split", "plain", "decode", "uncut", "pair", "cuda"
"""What a forward plan launches (its ``facts[0]``), for ``_fwd_prefix``."""
_MAX_PLANS = 4096


def _keep(plans: dict, key: tuple, plan):
    """Remember a plan, unless it was made during a CUDA graph capture (its config was then
    chosen untimed: the shape is planned, and tuned, again at its next call outside one)."""
    if plan is _REFERENCE or not torch.cuda.is_current_stream_capturing():
        if len(plans) > _MAX_PLANS:
            plans.clear()
        plans[key] = plan
    return plan


def _plan(which: str, key: tuple, device: int, build, keep, facts=None, prefer=None, stand_ins=None) -> Plan:
    """Choose ``which``'s config for the tuning ``key`` (remembered, cached, or tuned, launching
    ``build(choice) -> (grid, prefix, consts)``; with ``stand_ins``, timed under graph replay) and
    make the plan."""
    kernel = KERNELS[which]
    choice = kernel.choose(key, device, lambda c: _joined(build(c)), keep, prefer, stand_ins)
    grid, _, consts = build(choice)
    return Plan(kernel, choice, grid, consts, facts if facts is not None else which)


def _fwd_prefix(facts, x, w, b, y, cols, row_ptr, rows=None) -> tuple:
    """A forward launch's leading arguments: this call's tensors (and fresh split buffers); ``rows``
    (each block's block-row) for the decode kernel."""
    kind = facts[0]
    if kind is _TMA:
        return Described(x, facts[1]), Described(w, facts[2], w.shape[0] * w.shape[1]), b, y, cols, row_ptr
    if kind is _PAIR:  # (_PAIR, x box, w box, block-rows, block-columns, the one-row plan)
        return (Described(x, facts[1]), Described(w, facts[2], w.shape[0] * w.shape[1]), b, y,
                *_pair_lists(cols, row_ptr, facts[3], facts[4]))
    if kind is _DECODE:  # (_DECODE, partial slots, block-rows): a slot holds (tokens, bh); up to 16 tokens the
        # slots are kept empty between launches, past that they are fresh fp32 and counted (_decode_kernel)
        if x.shape[0] <= DECODE_SLOT_TOKENS:
            part = split_slots(x.device.index, facts[1] * x.shape[0] * w.shape[1])
        else:
            part = torch.empty(facts[1], x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
        return x, w, b, y, part, split_counts(x.device.index, facts[2]), cols, row_ptr, rows
    if kind is _UNCUT:
        return x, w, b, y, cols, row_ptr
    if kind is _CUDA:  # (_CUDA, has a bias, counts): the op's leading arguments, chunk 0 (an equal share)
        return x, w, b if facts[1] else None, y, cols, row_ptr, split_counts(x.device.index, facts[2]), 0
    if kind is _SPLIT:
        part = torch.empty(facts[1], x.shape[0], y.shape[1], dtype=torch.float32, device=x.device)
        return x, w, b, y, part, split_counts(x.device.index, facts[2]), cols, row_ptr
    return x, w, b, y, y, row_ptr, cols, row_ptr  # part and counts: not read


def _pair_lists(cols, row_ptr, grid_r: int, grid_c: int):
    """The pair lists of this call's layout (``pairs.lists_for``): made outside CUDA graph pools, and
    not under a capture (None)."""
    make = None if torch.cuda.is_current_stream_capturing() else (lambda f: outside_pools(f, cols.device))
    return pairs.lists_for(cols, row_ptr, grid_r, grid_c, make)


def _routed(route: Route, name: str, plans: dict, x, w, b, y, cols, row_ptr, out_features, has_bias, key,
            rows=None, stand_ins=None) -> Plan:
    """The plan of ``plans`` (name -> a plan, its config tuned) that ``route`` found faster for this
    size class (``name`` and the size class make its key); each launched once on these arguments
    when the route is timed, then timed so (do_bench), or with ``stand_ins`` (for ``w``) under graph
    replay as a model's layers run (``graph_timing``)."""
    dev = x.device.index
    prefixes = {n: _fwd_prefix(p.facts, x, w, b, y, cols, row_ptr, rows) for n, p in plans.items()}
    runs = {n: (lambda p=p, n=n: p(prefixes[n], dev)) for n, p in plans.items()}
    nnz, bh, bw = w.shape
    timer = None if stand_ins is None else (
        lambda n: stand_ins.per_call_ms(lambda a, p=plans[n]: p(a, dev), prefixes[n], dev))
    return plans[route.choose((name, x.dtype, *key, bh, bw, out_features, bucket(nnz), has_bias), dev, runs, timer)]


def pair_route(rows_plan, x, w, b, y, cols, row_ptr, out_features, has_bias, key, grid_c):
    """``rows_plan`` (a block-row a program) or the paired plan (two: ``_fwd_pair_kernel``), whichever
    ``FWD_ROUTE`` found faster for this size class. The paired plan keeps the one-row plan for calls
    whose pair lists can't be made (a layout first seen under a capture)."""
    _, bh, bw = w.shape
    tokens = x.shape[0]
    dev, prec, size = x.device.index, precision(x.dtype), x.element_size()
    grid_r = out_features // bh
    if _pair_lists(cols, row_ptr, grid_r, grid_c) is None:  # under a capture
        return rows_plan

    def facts_of(c):
        return (_PAIR, (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]), (bh, c.kwargs["BLOCK_K"]), grid_r, grid_c, rows_plan)

    def build(c):
        return (((grid_r + 1) // 2 * cdiv(tokens, c.kwargs["BLOCK_M"]),), _fwd_prefix(facts_of(c), x, w, b, y, cols, row_ptr),
                (tokens, out_features, *key, bh, bw, has_bias, prec))
    paired = _plan("fwd_pair", ("fwd_pair", x.dtype, prec, *key, bh, bw, out_features, has_bias), dev, build,
                   lambda c: pair_fits(c, tokens, bw, bh, size))
    paired.facts = facts_of(paired.choice)
    paired.native = "its pair lists belong to one layout, which a native recipe's key does not name"
    return _routed(FWD_ROUTE, "fwd_route", {"rows": rows_plan, "pairs": paired}, x, w, b, y, cols, row_ptr,
                   out_features, has_bias, key)


def _joined(built):
    grid, prefix, consts = built
    return grid, prefix + consts


def _define(table: NativeTable, missed: bool, plan, prefix: tuple, inputs: tuple, scalars: tuple,
            outputs: list) -> None:
    """Define ``plan``'s launch, just made with ``prefix``, in the native table when the table missed
    this call (``missed``) or has no recipe yet: the next call with these inputs' key launches from
    C++. Not for a launch the recipe can't make (``plan.native`` holds why), under a CUDA graph
    capture (the plan isn't kept: its config was chosen untimed), or with the tensors' device not
    the current one. Each plan makes its own recipe (``Plan.recipe`` from the compiled Triton kernel,
    ``OpPlan.recipe`` from the CUDA decode kernel's extension); None: not compiled yet."""
    if not (missed or (table.call is None and not table.defined)) or not table.wanted or plan.native:
        return
    if torch.cuda.is_current_stream_capturing():
        return
    if inputs[0].device.index != torch.cuda.current_device() or not triton_launch.direct():
        return
    recipe = plan.recipe(prefix, inputs, outputs)
    if recipe is None:
        return
    if not table.define(recipe, inputs, scalars):
        plan.native = table.reason or "refused"


__all__ = ["DECODE_ROUTE", "FAMILY", "FWD_ROUTE", "KERNELS"]
