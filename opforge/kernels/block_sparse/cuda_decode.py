"""block_sparse's CUDA decode forward (``csrc/decode_cuda*``): a candidate of the decode route.

At decode sizes (a few tokens) the forward is a stream of the weight's kept blocks from HBM. The
Triton kernels (``triton_decode.py``) bring each block in with their own loads; this kernel keeps
one ring of blocks a CTA filled by the copy engine (``cp.async.bulk``), so the bytes in flight are
bounded by shared memory rather than registers, and walks its share of the blocks backwards so
rows cut between CTAs are summed with one trip to memory (``csrc/decode_cuda_kernel.cuh``).

* **Where:** sm_90 and newer, float16 and bfloat16, 1 to 32 tokens, blocks of 32, 64 or 128 on
  each side; 33 to 64 tokens (a 64-token tile through wgmma: sm_90a, so compute capability 9.0 only) for
  blocks 64 wide and 64 or 128 high; x and w contiguous and 16-byte aligned, b contiguous (``offered``).
  Anything else, or ``OPFORGE_BLOCK_SPARSE_CUDA=0``, is not offered and the Triton kernels take the call.
  Where wgmma's tiles run (those blocks on compute capability 9.0) they take every token count, mma.sync's
  the rest: wgmma's reads x's slice once a block where each mma.sync warp read it, and was as fast or faster
  on every row of issue 35, 0.8-1.8 µs a layer at T=32 (docs/benchmarks.md, twenty-sixth session).
* **Built** on first use (a stable-ABI extension of its own, like ``native_autograd.py``'s, so one
  binary serves every torch from 2.10): the first decode call on an sm_90 GPU with an empty cache
  waits for nvcc, about 11 s for each dtype's TU, the two built in parallel; ``OPFORGE_BUILD=block_sparse``
  at ``pip install`` prebuilds it (a companion of the kind). A failed build warns once, and the route goes
  on without it.
* **Chosen** by ``DECODE_ROUTE`` against the Triton kernels, its config (ring depth, CTAs an SM)
  tuned first, both kept in opforge's cache (``tuned_op.TunedOp``).
* **Replayed from C++** as the Triton kernels are: after a call shape's first launch through the op,
  its recipe (``recipe``: the op's ``describe`` gives the function, grid and shared memory) goes into
  the forward's native table, and later calls of that shape launch with no Python and no op dispatch
  between the C++ autograd node and the driver (``kernels/native_launch``). Launched through the op,
  a call cost the host 41-51 µs at T=32 on the H200, more than dense ``F.linear``'s 27 µs
  (docs/benchmarks.md, issue 35, twenty-second session).
"""

from __future__ import annotations

import glob
import os
import threading

import torch

from ... import settings
from ...notices import warn_once
from ...process import forgets
from ..native_launch.recipe import Int, Map, Recipe, Struct, recipe_of_function
from ..tuned_op import OpPlan, TunedOp
from .buffers import split_counts, split_partials
from .extensions import BlockSparseDecodeCuda
from .triton_sizing import bucket, depth

MAX_TOKENS = 64
"""The most tokens the compiled variants take: 8-token tiles 1, 2, 4 through mma.sync, and 1, 2, 4, 8 through
wgmma. With mma.sync a 64-token tile ran at 1.07-1.35x the Triton kernels' time on the H200 (each of the
four consumer warps read all of x's 8 KB slice a block from shared memory: twenty-second session); with
wgmma, which reads it once a block, it runs 8-18% under the Triton route on 14336->4096 at T=64
(docs/benchmarks.md, issue 35, twenty-fifth session)."""
SWIZZLE_128B = 3
"""``CU_TENSOR_MAP_SWIZZLE_128B``."""
SIDES = (32, 64, 128)
"""The block sides compiled (either side)."""
PAIRS = ((4, 4), (6, 4), (2, 3), (2, 4), (2, 8), (3, 8), (4, 2))
"""(ring slots, CTAs an SM), the first the default: each the best in a row of issue 35 on the H100 once x came
through the ring, or within 0.7 µs of it in all eight (T = 1 and 16, d = 0.1 and 0.25, both shapes;
docs/benchmarks.md, issue 35, twenty-first session). With x in the slots a consumer waits on nothing but
its slot, so 3-8 CTAs an SM pay where the kernel that loaded x itself was bound to 2. An SM takes fewer
when they don't fit (``grid``): 6 slots of 64-blocks, 4."""
CONFIGS = tuple({"stages": s, "ctas": c, "overlap": o} for o in (1, 0) for s, c in PAIRS)
"""Blocks in flight a CTA, CTAs an SM, and whether it launches as a programmatic dependent of the
kernel before it (1: its prologue and first weight requests overlap that kernel's end).
``OPFORGE_BLOCK_SPARSE_OVERLAP=0`` keeps the ones without the overlap (and keys their choice apart)."""


_OPS: list = []  # [ops packet] once loaded, [None] once it failed or is off
_LOCK = threading.Lock()


def ops():
    """``torch.ops.block_sparse_decode_cuda``, built and loaded on first use; None if that failed
    (a warning, once) or ``OPFORGE_BLOCK_SPARSE_CUDA=0``."""
    if not _OPS:
        with _LOCK:
            if not _OPS:
                if not settings.current().block_sparse_cuda:
                    _OPS.append(None)
                else:
                    try:
                        _OPS.append(BlockSparseDecodeCuda().load().ops)
                    except Exception as exc:  # noqa: BLE001 - any failure: the Triton kernels take every call
                        warn_once(f"block_sparse: the CUDA decode kernel could not be built ({exc}); the Triton "
                                  f"kernels take every decode call (the same results, maybe slower)")
                        _OPS.append(None)
    return _OPS[0]


def _forget() -> None:
    with _LOCK:
        if _OPS and _OPS[0] is None:
            _OPS.clear()  # settings may have changed; a loaded extension stays loaded
    _CAPABLE.clear()


forgets(_forget)


def _op_forward():
    return ops().forward.default


def _sources() -> list[str]:
    here = os.path.join(BlockSparseDecodeCuda.source_dir(), "csrc")
    return sorted(glob.glob(os.path.join(here, "decode_cuda*"))) + [os.path.join(here, "..", "..", "common", "csrc",
                                                                                  "opforge_stable.h")]


def recipe(choice, prefix: tuple, inputs: tuple, outputs: list) -> Recipe | str:
    """The native_launch recipe of the op's launch with ``prefix`` (``_fwd_prefix``'s: x, w, b or None,
    y, cols, row_ptr, counts, chunk) and ``choice``: the kernel's parameters are ``Args``'s fields (the
    partial-sum slots and the counts held: ``buffers.split_partials``, where the op allocates its slots each
    call), the ring's slots, x's tensor map and W's (``csrc/decode_cuda.h``): for a tile through wgmma (as
    ``describe`` says) both in the 128-byte swizzle, W read as ``(nnz * bh, bw)``; for mma.sync's x's plain (none
    at one token) and W's 128 zero bytes (unread)."""
    x, w, b, y, cols, row_ptr, counts, chunk = prefix
    stages, ctas, overlap = choice.values
    function, grid, threads, shared, share, slots, wide = ops().describe.default(x, w, chunk, stages, ctas)
    blocks = wide and w.shape[0] > 0  # W's map (none for a layout of no blocks, which copies none)
    part = split_partials(x.device.index, slots)
    tokens, k_in = x.shape
    nnz, bh, bw = w.shape
    n_out = y.shape[1]
    args = Struct((x, w, b, y, cols, row_ptr, part, counts, Int(tokens), Int(k_in), Int(n_out), Int(bh), Int(n_out // bh),
                   Int(nnz), Int(share)))
    return recipe_of_function(function, (grid,), threads, shared, overlap,
                              (args, Int(stages), Map(x if tokens > 1 or wide else None, (tokens, bw), swizzle=SWIZZLE_128B * wide),
                               Map(w if blocks else None, (bh, bw), rows=nnz * bh * blocks, swizzle=SWIZZLE_128B * blocks)),
                              inputs, outputs)


KERNEL = TunedOp("block_sparse_triton", "decode_cuda", _op_forward, CONFIGS, _sources, recipe)
"""The op and its configs, chosen per size class (the Triton kernels' family in the cache)."""

_CAPABLE: dict[int, bool] = {}


def capable(device: int) -> bool:
    """sm_90 or newer (the copy engine's bulk copies)."""
    found = _CAPABLE.get(device)
    if found is None:
        found = _CAPABLE[device] = torch.cuda.get_device_capability(device) >= (9, 0)
    return found


def offered(x: torch.Tensor, w: torch.Tensor, bias) -> bool:
    """The kernel can take this call (``OPFORGE_BLOCK_SPARSE_CUDA`` on; the checks are the op's own,
    and the op's ``grid`` says whether a variant is compiled for it, so an offered call never raises)."""
    _, bh, bw = w.shape
    if not (x.dtype in (torch.float16, torch.bfloat16) and w.dtype == x.dtype and 1 <= x.shape[0] <= MAX_TOKENS
            and bh in SIDES and bw in SIDES and x.is_cuda and x.is_contiguous() and w.is_contiguous()
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0
            and (bias is None or (bias.is_contiguous() and bias.dtype == x.dtype))
            and settings.current().block_sparse_cuda and capable(x.device.index)):
        return False
    found = ops()
    return found is not None and found.grid.default(x, bh, bw, CONFIGS[0]["stages"], CONFIGS[0]["ctas"]) > 0


def plan(x, w, bias, y, cols, row_ptr, out_features: int, kind: str, stand_ins=None) -> OpPlan:
    """The kernel's plan for this call shape, its config chosen per size class (``KERNEL``; the
    Triton decode kernels' classes: tokens, block shape, nnz, blocks a row, bias). ``facts`` =
    (``kind``, has a bias, the arrival counts it needs), for ``triton_plans._fwd_prefix``. ``stand_ins``
    (``graph_timing``) for ``w``: the configs timed under graph replay."""
    nnz, bh, bw = w.shape
    units = out_features // bh * (bh // 16)
    overlap = settings.current().block_sparse_overlap  # off: the configs launched as plain kernels only
    key = ("decode_cuda", x.dtype, bucket(x.shape[0]), bh, bw, bucket(nnz), depth(nnz, out_features // bh),
           bias is not None, overlap)
    grid = ops().grid.default

    def trial(choice):  # the op's leading arguments, as _fwd_prefix makes them: chunk 0 (an equal share)
        return None, (x, w, bias, y, cols, row_ptr, split_counts(x.device.index, units), 0)

    choice = KERNEL.choose(key, x.device.index, trial, lambda c: grid(x, bh, bw, c.kwargs["stages"], c.kwargs["ctas"]) > 0
                           and (overlap or not c.kwargs["overlap"]), stand_ins=stand_ins)
    return OpPlan(KERNEL, choice, (kind, bias is not None, units))


__all__ = ["CONFIGS", "KERNEL", "MAX_TOKENS", "SIDES", "BlockSparseDecodeCuda", "capable", "offered", "ops", "plan",
           "recipe"]
