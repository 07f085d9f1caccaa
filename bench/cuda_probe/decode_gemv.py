"""Probe: the decode kernels at a handful of tokens without the tensor cores (issue 35).

At T=1 the decode kernels still multiply through ``tl.dot`` on a tile of 16 token rows, 15 of them
masked: every block of w goes through shared memory in the MMA's layout, and x's slice is a 16 x 64
tile. The twentieth session measured the floors at d=0.1: the bare read of the kept bytes at 6.1 us
a layer, the block-by-block MMA kernel at 6.8 (x once) and 7.1 (x each block), the package at 7.4.
The bare read keeps its bytes in registers. Here the products are multiply-adds instead:
``acc[t, h] += sum_k x[t, k] * w[k, h]`` as a broadcast product and a sum over k (``_mac``), on a
token tile of ``pow2(T)`` rows (1 at T=1).

The kernels are the package's ``_decode_kernel`` and ``_decode_uncut_kernel``, with one edit made on
their source here (``gemv_kernels``): each ``tl.dot`` becomes ``_mac``, which keeps ``tl.dot`` for tiles
of 16 rows or more. So at BLOCK_M >= 16 they are the package's kernels, instruction for instruction.

Timed in one process against the package's kernels as they are (16 rotated layers, one CUDA graph,
programmatic dependents with the early L2 lines), each at its best of the configs swept.

Usage::

    python bench/cuda_probe/decode_gemv.py [--shapes 4096x14336,14336x4096] [--tokens 1,2,4]
        [--densities 0.5,0.25,0.1] [--waves 1,2,3,4,6] [--pipes 4x4,4x8,2x8,8x4] [--json FILE]
    TRITON_INTERPRET=1 python bench/cuda_probe/decode_gemv.py --check   # against fp64 dense, on the CPU
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import edited_source  # noqa: E402
from decode_sweep import keep_best, report, rotated_row, time_config  # noqa: E402

from opforge.kernels.block_sparse import triton_sizing  # noqa: E402
from opforge.kernels.block_sparse.layout import BlockSparseLayout  # noqa: E402
from opforge.kernels.block_sparse.triton_decode import _decode_kernel, _decode_uncut_kernel  # noqa: E402

_DOT = "acc = tl.dot(xt, wt, acc, input_precision=PRECISION)"
_MAC = '''

@jit
def _mac(xt, wt, acc, PRECISION: tl.constexpr):
    """acc + xt @ wt: multiply-adds for a tile of under 16 token rows, else the tensor cores."""
    if xt.shape[0] < 16:
        return acc + tl.sum(xt.to(tl.float32)[:, :, None] * wt.to(tl.float32)[None, :, :], axis=1)
    else:
        return tl.dot(xt, wt, acc, input_precision=PRECISION)
'''


def gemv_kernels():
    """(``_decode_kernel``, ``_decode_uncut_kernel``) with each ``tl.dot`` through ``_mac`` (three of them)."""
    src = edited_source.source()
    if src.count(_DOT) != 3:
        raise RuntimeError(f"the package's decode kernels changed: {_DOT!r} is there {src.count(_DOT)} times")
    mod = edited_source.load(src.replace(_DOT, "acc = _mac(xt, wt, acc, PRECISION)") + _MAC, "_decode_gemv_gen")
    return mod._decode_kernel, mod._decode_uncut_kernel


def launch(kernels, kind, programs, x, w, b, y, part, counts, idx, tokens, k_in, n_out, nnz, chunk, bh, bw, prec,
           early, overlap, block_m, warps, stages, flat, has_bias=False):
    decode, uncut = kernels
    common = dict(BH=bh, BW=bw, HAS_BIAS=has_bias, PRECISION=prec, BLOCK_K=min(bw, 64), OVERLAP=overlap,
                  BLOCK_M=block_m, WAVES=0, num_warps=warps, num_stages=stages)
    if overlap:
        common["launch_pdl"] = True
    if kind == "uncut":  # 64-blocks: a unit is a whole block-row; chunk and nnz count units
        uncut[(programs,)](x, w, b, y, idx.cols, idx.row_ptr, tokens, k_in, n_out, nnz, chunk,
                           SUB=min(bh, 64), SEARCH=triton_sizing.decode_search(n_out // bh), **common)
    else:
        slots = tokens <= triton_sizing.DECODE_SLOT_TOKENS
        decode[(programs,)](x, w, b, y, part if slots else part.view(torch.float32), counts, idx.cols, idx.row_ptr,
                            idx.rows, tokens, k_in, n_out, nnz, chunk, EARLY=early, FLAT=flat, **common)


def check(seed: int = 0, layouts: int = 10) -> None:
    """``--check`` (``TRITON_INTERPRET=1``): both edited kernels at tiles of 1, 2 and 4 rows against fp64
    dense, on tiny random layouts (empty rows, full rows), every run length, with and without a bias."""
    kernels = gemv_kernels()
    g = torch.Generator().manual_seed(seed)
    bad = runs = 0
    for i in range(layouts):
        grid = (int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g)))
        dens = 1.0 if i == 0 else torch.rand(1, generator=g).item()
        mask = torch.rand(grid, generator=g) < dens
        if i == 1:
            mask[:] = False
        lay = BlockSparseLayout(mask, (16, 32 if i % 3 == 2 else 16))
        bh, bw = lay.block_shape
        idx, (n_out, k_in) = lay.indices(), lay.shape
        for tokens in (1, 2, 3):
            block_m = triton_sizing.pow2(tokens)
            x = torch.randn(tokens, k_in, generator=g)
            w = torch.randn(lay.nnz, bh, bw, generator=g)
            b = torch.randn(n_out, generator=g)
            for has_bias in (False, True):
                ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0.0)
                for chunk in range(1, lay.nnz + 2):
                    for kind, flat in (("decode", True), ("decode", False), ("uncut", False)):
                        total = lay.nnz if kind == "decode" else lay.nnz  # SUB = bh: a unit a block-row
                        programs = max(1, -(-total // chunk))
                        y = torch.full((tokens, n_out), float("nan"))
                        part = torch.full((programs + 1, tokens, bh), triton_sizing.SLOT_EMPTY, dtype=torch.int32)
                        counts = torch.zeros(grid[0], dtype=torch.int32)
                        launch(kernels, kind, programs, x, w, b, y, part, counts, idx, tokens, k_in, n_out, total,
                               chunk, bh, bw, "ieee", 0, False, block_m, 4, 2, flat, has_bias)
                        runs += 1
                        err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
                        if not (err < 1e-3) or counts.any() or not bool((part == triton_sizing.SLOT_EMPTY).all()):
                            bad += 1
                            print(f"layout {i} T={tokens} {kind} flat={flat} chunk {chunk}: err {err}")
    print(f"{'ok' if not bad else f'{bad} bad'}: {runs} runs over {layouts} layouts")
    if bad:
        raise SystemExit(1)


def time_row(kernels, k_in, n_out, tokens, density, args, dev) -> dict:
    rot = rotated_row(k_in, n_out, tokens, density, args.layers, dev)
    variants = [("decode", 16, (True, False)), ("decode mac", triton_sizing.pow2(tokens), (True, False)),
                ("uncut", 16, (False,)), ("uncut mac", triton_sizing.pow2(tokens), (False,))]
    for name, block_m, flats in variants:
        kind = name.split()[0]
        use = kernels if name.endswith("mac") else (_decode_kernel, _decode_uncut_kernel)
        for waves in map(int, args.waves.split(",")):
            chunks = [triton_sizing.decode_chunk(lay.nnz, waves, rot.sms) for lay in rot.lays]
            for pipe in args.pipes.split(","):
                warps, stages = map(int, pipe.split("x"))
                for flat in flats:
                    def layers(chunks=chunks, warps=warps, stages=stages, flat=flat, use=use, kind=kind,
                               block_m=block_m):
                        for i in range(rot.layers):
                            chunk, progs = chunks[i]
                            launch(use, kind, progs, rot.x, rot.ws[i], rot.ws[i], rot.ys[i], rot.part, rot.counts[i],
                                   rot.idx[i], tokens, k_in, n_out, rot.lays[i].nnz, chunk, 64, 64, "tf32", rot.early,
                                   rot.overlap, block_m, warps, stages, flat)
                    time_config(rot, name, {"waves": waves, "pipe": pipe, "flat": flat}, layers)
    return keep_best(rot, [v[0] for v in variants])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--waves", default="1,2,3,4,6")
    ap.add_argument("--pipes", default="4x4,4x8,2x8,8x4")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true", help="against dense on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check:
        return check()
    kernels = gemv_kernels()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": vars(args), "rows": []}
    print(res["device"], "GPU us per layer (graph, 16 rotated layers); each variant at its best config", flush=True)
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            for d in map(float, args.densities.split(",")):
                report(res, time_row(kernels, k_in, n_out, t, d, args, dev),
                       ("decode", "decode mac", "uncut", "uncut mac"), args.json)

if __name__ == "__main__":
    main()
