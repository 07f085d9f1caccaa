"""The block-sparse forward's plans at decode sizes (up to ``DECODE_MAX_TOKENS`` tokens; ``triton_impl``
plans the rest and launches them all): the decode kernel's, the uncut kernel's, the pointer
kernel's (which also runs past them without the copy engine) and the route between them, each
config and the route timed under graph replay on stand-ins for the weight (``graph_timing``).

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

from .. import compile_ahead, graph_timing
from . import cuda_decode
from .triton_plans import _CUDA, _DECODE, _PLAIN, _SPLIT, _UNCUT, DECODE_ROUTE, _fwd_prefix, _plan, _routed
from .triton_sizing import (
    bucket,
    cdiv,
    decode_block_k,
    decode_chunk,
    decode_fits,
    decode_search,
    decode_split,
    decode_start,
    decode_uncut_fits,
    decode_uncut_sub,
    depth,
    device_facts,
    m_fits,
    precision,
)


def pointer_plan(x, w, b, y, cols, row_ptr, out_features, has_bias, key, stand_ins=None):
    """``_fwd_kernel``: a block-row per program (split over several at T <= SPLIT_MAX_TOKENS); its
    config timed under graph replay on ``stand_ins`` where the decode route gives them."""
    nnz, bh, bw = w.shape
    tokens, in_features = x.shape
    sms, l2, _ = device_facts(x.device)
    grid_r = out_features // bh
    dev, prec, size = x.device.index, precision(x.dtype), x.element_size()
    preferred, most = decode_split(tokens, out_features, grid_r, nnz, bw, sms, l2)

    def facts_of(split):
        return (_SPLIT, split, grid_r * cdiv(tokens, 16)) if split > 1 else (_PLAIN,)

    def build(c):
        split = c.kwargs["SPLIT"]
        return ((grid_r * cdiv(tokens, c.kwargs["BLOCK_M"]), split),
                _fwd_prefix(facts_of(split), x, w, b, y, cols, row_ptr),
                (tokens, in_features, out_features, *key, bh, bw, has_bias, split > 1, prec))
    plan = _plan("fwd", ("fwd", x.dtype, prec, *key, bh, bw, out_features, most > 1, has_bias), dev, build,
                 lambda c: c.kwargs["SPLIT"] <= most and m_fits(c, tokens, bw, bh, size),
                 prefer=lambda c: abs(c.kwargs["SPLIT"] - preferred), stand_ins=stand_ins)
    plan.facts = facts_of(plan.choice.kwargs["SPLIT"])
    return plan


def decode_route(x, w, b, y, cols, row_ptr, rows, out_features, has_bias, sms, key):
    """The decode plan, the uncut plan, the pointer plan or (where offered) the CUDA kernel's plan,
    whichever ``DECODE_ROUTE`` found fastest for this size class. Each config and then each plan is
    timed under graph replay on stand-ins for ``w`` past L2, as a model's layers run
    (``graph_timing``): do_bench's flush and lone launch hid the overlap between layers. A first call
    plans twice: once inside ``compile_ahead.compiling_ahead``, which starts every untuned candidate's
    compile at once and tunes nothing, then for real, with nothing left to compile."""
    stand_ins = graph_timing.StandIns(w, device_facts(x.device)[1])
    bias = b if has_bias else None

    def planned() -> dict:
        plans = {"decode": _decode_plan(x, w, b, y, cols, row_ptr, rows, out_features, has_bias, sms, stand_ins),
                 "uncut": _uncut_plan(x, w, b, y, cols, row_ptr, out_features, has_bias, sms, stand_ins),
                 "pointer": pointer_plan(x, w, b, y, cols, row_ptr, out_features, has_bias, key, stand_ins)}
        if cuda_decode.offered(x, w, bias):
            plans["cuda"] = cuda_decode.plan(x, w, bias, y, cols, row_ptr, out_features, _CUDA, stand_ins)
        return plans

    if compile_ahead.can_compile_ahead():  # the three kernels' untuned candidates compile at once, then are tuned
        with compile_ahead.compiling_ahead(x.device.index):
            planned()
    plans = planned()
    return _routed(DECODE_ROUTE, "route", plans, x, w, b, y, cols, row_ptr, out_features, has_bias,
                   (*key, decode_start(x.device)[1]), rows, stand_ins)


def _decode_plan(x, w, b, y, cols, row_ptr, rows, out_features, has_bias, sms, stand_ins=None):
    """The forward at decode sizes (``_decode_kernel``): its config (token tile, pipeline,
    programs per SM) tuned per size class, the blocks per program sized from the programs."""
    nnz, bh, bw = w.shape
    tokens, in_features = x.shape
    grid_r = out_features // bh
    prec, size = precision(x.dtype), x.element_size()
    block_k = decode_block_k(bw)

    def facts_of(c):
        chunk, programs = decode_chunk(nnz, c.kwargs["WAVES"], sms)
        return (_DECODE, programs, grid_r), chunk, programs

    early, overlap = decode_start(x.device)

    def build(c):
        facts, chunk, programs = facts_of(c)
        return ((programs,), _fwd_prefix(facts, x, w, b, y, cols, row_ptr, rows),
                (tokens, in_features, out_features, nnz, chunk, bh, bw, has_bias, prec, block_k, early, overlap))
    key = ("decode", x.dtype, prec, bucket(tokens), bh, bw, bucket(nnz), depth(nnz, grid_r), has_bias, overlap)
    plan = _plan("decode", key, x.device.index, build, lambda c: decode_fits(c, tokens, bh, bw, size),
                 stand_ins=stand_ins)
    plan.facts = facts_of(plan.choice)[0]
    return plan


def _uncut_plan(x, w, b, y, cols, row_ptr, out_features, has_bias, sms, stand_ins=None):
    """The forward at decode sizes with no row cut across programs (``_decode_uncut_kernel``): its
    config tuned per size class as the decode plan's, the units per program sized from the programs."""
    nnz, bh, bw = w.shape
    tokens, in_features = x.shape
    grid_r = out_features // bh
    prec, size, sub = precision(x.dtype), x.element_size(), decode_uncut_sub(bh)
    total = bh // sub * nnz
    block_k, search = decode_block_k(bw), decode_search(grid_r)

    overlap = decode_start(x.device)[1]

    def build(c):
        chunk, programs = decode_chunk(total, c.kwargs["WAVES"], sms)
        return ((programs,), _fwd_prefix((_UNCUT,), x, w, b, y, cols, row_ptr),
                (tokens, in_features, out_features, total, chunk, bh, bw, sub, has_bias, prec, block_k, search,
                 overlap))
    key = ("decode_uncut", x.dtype, prec, bucket(tokens), bh, bw, bucket(nnz), depth(nnz, grid_r), has_bias,
           overlap)
    return _plan("decode_uncut", key, x.device.index, build, lambda c: decode_uncut_fits(c, tokens, bh, bw, size),
                 facts=(_UNCUT,), stand_ins=stand_ins)


__all__ = ["decode_route", "pointer_plan"]
