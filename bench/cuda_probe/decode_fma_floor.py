"""Probe: the floor of a decode layer at T=1 without the tensor cores (issue 35).

``decode_mma_floor.py``'s kernel is a perfectly balanced block-by-block decode kernel: equal shares of
the kept blocks, each block multiplied with its x slice through ``tl.dot`` on a tile of 16 token rows
(at T=1, 15 of them masked), so every block goes through shared memory in the MMA's layout. At d=0.1 it
runs at 7.1 us a layer on an H100, against 6.1 for the bare read of the same bytes, which keeps them
in registers (twentieth session). ``decode_gemv.py`` swapped the package's ``tl.dot`` for a broadcast
product and a sum over k each block: slower in every row (layout conversions each block).

``_fma_floor_kernel`` is the same balanced kernel with multiply-adds that need no conversion: each block
is loaded as ``(BH, BK)`` (k contiguous, as it is stored), its x slice is loaded in the same shape (every
row the same 128 bytes: one line, broadcast), and the products are added elementwise into a ``(BH, BK)``
fp32 accumulator. The sum over k is taken once, at the end. If this runs near the bare read, a T=1
path without the tensor cores is worth building; if it runs at the MMA kernel's time, it isn't.

Timed in one process against the bare read and the MMA kernel (x each block) on the same layers (16
rotated, graph-replayed, programmatic dependents with the share's first lines asked into L2), and the
product checked against fp32 torch.

Usage::

    python bench/cuda_probe/decode_fma_floor.py [--shapes 4096x14336,14336x4096] [--densities 0.5,0.25,0.1]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us, issue_rows  # noqa: E402
from decode_mma_floor import mma_floor  # noqa: E402
from decode_read_floor import read_floor  # noqa: E402


@triton.jit
def _fma_floor_kernel(x_ptr, w_ptr, cols_ptr, out_ptr, NNZ, CHUNK, BH: tl.constexpr, BW: tl.constexpr,
                      EARLY: tl.constexpr):
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.minimum(lo + CHUNK, NNZ)
    if hi > lo:  # the share's first EARLY lines into L2, then the wait (as _decode_start)
        lines = tl.minimum(tl.arange(0, EARLY), (hi - lo) * (BH * BW // 64) - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                  [w_ptr + lo.to(tl.int64) * (BH * BW) + lines * 64], dtype=tl.int32,
                                  is_pure=False, pack=1)
    gdc_wait()
    offs_h = tl.arange(0, BH)
    offs_k = tl.arange(0, BW)
    tile = offs_h[:, None] * BW + offs_k[None, :]
    acc = tl.zeros((BH, BW), dtype=tl.float32)
    for kb in range(lo, hi):
        wt = tl.load(w_ptr + kb.to(tl.int64) * (BH * BW) + tile)
        c = tl.load(cols_ptr + kb)
        xt = tl.load(x_ptr + c * BW + offs_k[None, :] + 0 * offs_h[:, None])  # one line, every row
        acc += wt.to(tl.float32) * xt.to(tl.float32)
    gdc_launch_dependents()
    tl.store(out_ptr + p * BH + offs_h, tl.sum(acc, axis=1))


SWEEP = tuple((waves, warps, stages) for waves in (1, 2, 3, 4, 6) for warps in (4, 8) for stages in (2, 3, 4))


def fma_floor(x, blocks: list, cols: list, dev, n: int, bh: int = 64, bw: int = 64) -> tuple[float, str]:
    """The fastest graph-replayed µs per layer of ``_fma_floor_kernel`` over ``SWEEP``, and its config."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    nnz = blocks[0].shape[0]
    best = (float("inf"), "")
    for waves, warps, stages in SWEEP:
        programs = waves * sms
        chunk = -(-nnz // programs)
        outs = [torch.empty(programs, bh, device=dev) for _ in blocks]

        def layer(w, c, o):
            _fma_floor_kernel[(programs,)](x, w, c, o, nnz, chunk, BH=bh, BW=bw, EARLY=128,  # noqa: B023
                                           num_warps=warps, num_stages=stages, launch_pdl=True)  # noqa: B023
        us = graph_us(lambda: [layer(*a) for a in zip(blocks, cols, outs)], dev, n)  # noqa: B023
        w, c = blocks[-1].float(), cols[-1].long()
        xs = x.float()[0].view(-1, bw)[c]  # (nnz, bw): each block's slice
        ref = torch.einsum("nk,nhk->h", xs, w)
        got = outs[-1].sum(0)
        err = (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        if err > 1e-3:
            raise AssertionError(f"the FMA floor kernel's sum is off by {err:.2e} (relative)")
        if us < best[0]:
            best = (us, f"{waves}/SM w{warps} s{stages}")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.tokens = "1"
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": []}
    print(f"{out['device']}, bf16, 64-blocks, T=1, {n} layers rotated, graph-replayed, µs per layer", flush=True)
    for row in issue_rows(args, dev, dt):
        x, mods = row.pop("x"), row.pop("mods")
        row.pop("weights")
        nnz = round(row["density"] * (row["out"] // 64) * (row["in"] // 64))
        blocks = [torch.randn(nnz, 64, 64, device=dev, dtype=dt) for _ in range(n)]
        cols = [torch.randint(0, row["in"] // 64, (nnz,), device=dev, dtype=torch.int32) for _ in range(n)]
        row["read_us"], row["read_config"] = read_floor([b.view(-1) for b in blocks], dev, n, overlap=True)
        row["mma_us"], row["mma_config"] = mma_floor(x, blocks, cols, dev, n, 0)
        row["fma_us"], row["fma_config"] = fma_floor(x, blocks, cols, dev, n)
        row["opforge_us"] = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
        out["rows"].append(row)
        d = row["dense_us"]
        print(f"{row['in']}->{row['out']} d={row['density']}: dense {d:.1f}; read {row['read_us']:.2f} "
              f"({d / row['read_us']:.2f}x); mma {row['mma_us']:.2f} ({d / row['mma_us']:.2f}x, {row['mma_config']}); "
              f"fma {row['fma_us']:.2f} ({d / row['fma_us']:.2f}x, {row['fma_config']}); opforge {row['opforge_us']:.2f} "
              f"({d / row['opforge_us']:.2f}x)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
