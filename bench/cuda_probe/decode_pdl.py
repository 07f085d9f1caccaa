"""Probe: the decode forward (``_decode_kernel``) launched with programmatic dependent launch
(PDL, Hopper and newer) on the layer-alone rows of ``bench/block_sparse_decode.py``: 16 layers
(their own weights and random 64-block layouts, so every call reads HBM), one kernel each,
captured in one CUDA graph and replayed (GPU µs per layer), beside dense ``F.linear`` and cuBLAS
on a dense weight of the same bytes (the floor of ``decode_floor.py``).

Modes: ``PDL=0`` (a plain launch, as today), ``PDL=1`` (each kernel lets the next one's programs
start once all of its own have, and waits for its predecessor before touching memory), ``PDL=2``
(that, and each program asks for its run of the weight into L2 before the wait). Each mode's
best of a few configs (programs per SM, pipeline). The 16 layers share one partial-sum buffer and
one arrival-count array, as a model's layers of one shape do, and every layer's output is checked
against the masked dense product after the replay (the waits are what keep that right).

Usage::

    python bench/cuda_probe/decode_pdl.py [--shapes 4096x14336,14336x4096] [--tokens 1,16,64]
        [--densities 0.5,0.25,0.1] [--modes 0,1,2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from block_sparse_decode import graph_us

CONFIGS = [(waves, w, s) for waves in (1, 2, 3, 4) for w, s in ((4, 6), (4, 8))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--modes", default="0,1,2")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import triton_kernels, triton_sizing
    from opforge.kernels.block_sparse.layout import BlockSparseLayout

    dev, dt, n, blk = torch.device("cuda"), torch.bfloat16, args.layers, 64
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    modes = [int(m) for m in args.modes.split(",")]
    print(f"{torch.cuda.get_device_name()}, bf16, {n} layers rotated, graph-replayed, µs per layer", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            x = torch.randn(t, k_in, device=dev, dtype=dt)
            ws = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(n)]
            dense = graph_us(lambda: [F.linear(x, w) for w in ws], dev, n)  # noqa: B023
            ws = None
            for d in map(float, args.densities.split(",")):
                kept = max(64, round(n_out * d / 64) * 64)
                ws = [torch.randn(kept, k_in, device=dev, dtype=dt) for _ in range(n)]
                floor = graph_us(lambda: [F.linear(x, w) for w in ws], dev, n)  # noqa: B023
                ws = None
                g = torch.Generator().manual_seed(0)
                lays = [BlockSparseLayout.random(n_out, k_in, d, (blk, blk), generator=g) for _ in range(n)]
                idx = [lay.indices(dev) for lay in lays]
                wb = [torch.randn(lay.nnz, blk, blk, device=dev, dtype=dt) / 32 for lay in lays]
                refs = [F.linear(x.float(), lay.scatter(w.float())) for lay, w in zip(lays, wb)]
                ys = [torch.empty(t, n_out, device=dev, dtype=dt) for _ in range(n)]
                counts = torch.zeros(n_out // blk, dtype=torch.int32, device=dev)
                row = {"shape": shape, "T": t, "density": d, "dense_us": dense, "floor_us": floor, "modes": {}}
                line = f"{k_in}->{n_out} T={t} d={d}: dense {dense:.1f} floor {floor:.1f} |"
                for mode in modes:
                    best = None
                    for waves, warps, stages in CONFIGS:
                        chunks = [triton_sizing.decode_chunk(lay.nnz, waves, sms) for lay in lays]
                        part = torch.empty(2 * max(p for _, p in chunks), t, blk, device=dev)

                        def step(chunks=chunks, part=part, warps=warps, stages=stages, mode=mode):
                            for i in range(n):
                                chunk, programs = chunks[i]
                                triton_kernels._decode_kernel[(programs,)](
                                    x, wb[i], wb[i], ys[i], part, counts, idx[i].cols, idx[i].row_ptr, t, k_in,
                                    n_out, lays[i].nnz, chunk, BH=blk, BW=blk, HAS_BIAS=False,
                                    PRECISION=triton_sizing.precision(dt), BLOCK_K=triton_sizing.decode_block_k(blk),
                                    SEARCH=triton_sizing.decode_search(n_out // blk), PDL=mode,
                                    BLOCK_M=max(16, triton_sizing.pow2(t)), WAVES=waves, num_warps=warps,
                                    num_stages=stages, launch_pdl=mode != 0)
                        us = graph_us(step, dev, n)
                        for y in ys:
                            y.fill_(float("nan"))
                        graph_us(step, dev, n, replays=1)
                        torch.cuda.synchronize()
                        err = max(((y.float() - r).norm() / r.norm()).item() for y, r in zip(ys, refs))
                        assert err < 1e-2 and counts.eq(0).all(), (mode, waves, warps, stages, err)
                        if best is None or us < best[0]:
                            best = (us, f"WAVES={waves} w{warps}s{stages}", err)
                    row["modes"][str(mode)] = {"us": best[0], "config": best[1], "rel_err": best[2]}
                    line += f" PDL={mode}: {best[0]:.1f} ({dense / best[0]:.2f}x, {100 * floor / best[0]:.0f}% floor) [{best[1]}]"
                print(line, flush=True)
                rows.append(row)
                wb = refs = ys = idx = None
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
