"""Probe: where the decode forward's time goes, and whether deeper steps help. ``_decode_kernel``
on the layer-alone rows of ``bench/block_sparse_decode.py`` (16 layers, their own weights and
random 64-block layouts, so every call reads HBM; one CUDA graph, replayed; GPU µs per layer),
beside dense ``F.linear`` and cuBLAS on a dense weight of the same bytes (``decode_floor.py``):

* ``step1``: the kernel as it runs (a block a loop step);
* ``step2`` / ``step4``: two or four of a row's consecutive blocks a step (one deeper tile of
  ``w``, its x tiles side by side; masked past the row's end);
* ``no-fixup`` (diagnostic, wrong results): rows cut by a run stored as they are, no partial
  sums, no arrival counts: what the cut rows cost;
* ``fixed-x`` (diagnostic, wrong results): every block multiplies the same x tile (it stays in
  L1): what gathering x costs.

Each variant's best of a few configs (programs per SM, pipeline); the right variants' outputs are
checked against the masked dense product after the replay. The 16 layers share one partial-sum
buffer and one arrival-count array, as a model's layers of one shape do.

Usage::

    python bench/cuda_probe/decode_parts.py [--shapes 4096x14336,14336x4096] [--tokens 1,16,64]
        [--densities 0.5,0.25,0.1] [--variants step1,step2,step4,no-fixup,fixed-x] [--json PATH]
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

CONFIGS = [(waves, w, s) for waves in (1, 2, 3, 4, 6) for w, s in ((4, 6), (4, 8))]
VARIANTS = {"mid-run": 0, "owner-last": 1, "owner-first": 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--variants", default="mid-run,owner-last,owner-first")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import triton_kernels, triton_sizing
    from opforge.kernels.block_sparse.layout import BlockSparseLayout

    dev, dt, n, blk = torch.device("cuda"), torch.bfloat16, args.layers, 64
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    variants = args.variants.split(",")
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
                row = {"shape": shape, "T": t, "density": d, "dense_us": dense, "floor_us": floor, "variants": {}}
                line = f"{k_in}->{n_out} T={t} d={d}: dense {dense:.1f} floor {floor:.1f} |"
                for name in variants:
                    owner = VARIANTS[name]
                    best = None
                    for waves, warps, stages in CONFIGS:
                        chunks = [triton_sizing.decode_chunk(lay.nnz, waves, sms) for lay in lays]
                        part = torch.empty(2 * max(p for _, p in chunks), t, blk, device=dev)

                        def run(chunks=chunks, part=part, warps=warps, stages=stages, owner=owner):
                            for i in range(n):
                                chunk, programs = chunks[i]
                                triton_kernels._decode_kernel[(programs,)](
                                    x, wb[i], wb[i], ys[i], part, counts, idx[i].cols, idx[i].row_ptr, t, k_in,
                                    n_out, lays[i].nnz, chunk, BH=blk, BW=blk, HAS_BIAS=False,
                                    PRECISION=triton_sizing.precision(dt), BLOCK_K=triton_sizing.decode_block_k(blk),
                                    SEARCH=triton_sizing.decode_search(n_out // blk), OWNER=owner,
                                    BLOCK_M=max(16, triton_sizing.pow2(t)), WAVES=waves, num_warps=warps,
                                    num_stages=stages)
                        try:
                            us = graph_us(run, dev, n)
                        except Exception as exc:  # noqa: BLE001 - a config past shared memory: skipped
                            print(f"  {name} WAVES={waves} w{warps}s{stages}: {type(exc).__name__}", flush=True)
                            torch.cuda.synchronize()
                            continue
                        for y in ys:
                            y.fill_(float("nan"))
                        graph_us(run, dev, n, replays=1)
                        torch.cuda.synchronize()
                        err = max(((y.float() - r).norm() / r.norm()).item() for y, r in zip(ys, refs))
                        assert err < 1e-2 and counts.eq(0).all(), (name, waves, warps, stages, err)
                        if best is None or us < best[0]:
                            best = (us, f"WAVES={waves} w{warps}s{stages}", err)
                    if best is None:
                        continue
                    row["variants"][name] = {"us": best[0], "config": best[1], "rel_err": best[2]}
                    line += f" {name}: {best[0]:.1f} ({dense / best[0]:.2f}x, {100 * floor / best[0]:.0f}% floor) [{best[1]}]"
                print(line, flush=True)
                rows.append(row)
                wb = refs = ys = idx = None
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
