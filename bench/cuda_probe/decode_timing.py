"""Probe: does the way a decode kernel's candidates are timed pick what runs fastest in use? For a
few of issue 35's rows, every config of ``_decode_uncut_kernel`` (whole rows) is timed three ways:

* **do_bench**: ``triton.testing.do_bench`` on layer 0's arguments (L2 flushed by a memset before
  each call): how ``TunedKernel`` and ``Route`` time candidates today;
* **rotated**: back to back over the 16 layers' own weights (CUDA events around batches of calls,
  no flush), so every call reads its weight from HBM, as a model's layers do;
* **graph**: the 16 calls captured in one CUDA graph and replayed (``bench/block_sparse_decode.py``'s
  measure, the truth here).

For each way: the config it would pick and what that config costs under graph replay, against
the best under graph replay.

Usage::

    python bench/cuda_probe/decode_timing.py [--rows 4096x14336:1:0.25,4096x14336:64:0.5,14336x4096:1:0.25]
        [--layers 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us  # bench/block_sparse_decode.py's
from decode_units import _indices, units_forward


def rotated_us(fns, reps: int = 20) -> float:
    """µs per call of ``fns`` called in turn, back to back, median over ``reps`` batches."""
    for f in fns:
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for f in fns:
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    return statistics.median(times)


def main() -> None:
    from triton.testing import do_bench

    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="4096x14336:1:0.25,4096x14336:64:0.5,14336x4096:1:0.25")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    configs = [(64, waves, warps, stages) for waves in (4, 3, 1, 8) for warps, stages in ((2, 8), (4, 8), (4, 12))]
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    for spec in args.rows.split(","):
        shape, t, d = spec.split(":")
        k_in, n_out = map(int, shape.split("x"))
        t, d = int(t), float(d)
        g = torch.Generator().manual_seed(1)
        mods = [BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
            n_out, k_in, d, (64, 64), generator=g)).requires_grad_(False) for _ in range(n)]
        x = torch.randn(t, k_in, device=dev, dtype=dt)
        idx = [_indices(m.layout, dev) for m in mods]
        wb = [m.weight_blocks.detach() for m in mods]
        ys = [torch.empty(t, n_out, device=dev, dtype=dt) for _ in range(n)]
        row = {"in": k_in, "out": n_out, "tokens": t, "density": d, "configs": {}}
        for cfg in configs:
            sub, waves, warps, stages = cfg
            fns = [lambda i=i: units_forward(x, wb[i], *idx[i], n_out, sub, waves, sms, warps, stages, ys[i])  # noqa: B023
                   for i in range(n)]
            row["configs"][str(cfg)] = {
                "do_bench": do_bench(fns[0], warmup=5, rep=25) * 1e3,
                "rotated": rotated_us(fns),
                "graph": graph_us(lambda: [f() for f in fns], dev, n),  # noqa: B023
            }
        cs = row["configs"]
        truth = min(v["graph"] for v in cs.values())
        row["picks"] = {}
        for way in ("do_bench", "rotated", "graph"):
            pick = min(cs, key=lambda c: cs[c][way])  # noqa: B023
            row["picks"][way] = {"config": pick, "graph_us": cs[pick]["graph"], "vs_best": cs[pick]["graph"] / truth}
        out["rows"].append(row)
        print(f"{spec}: best under graph {truth:.1f} us; " + "; ".join(
            f"{way} picks {p['config']} -> {p['graph_us']:.1f} us ({p['vs_best']:.2f}x)" for way, p in row["picks"].items()),
            flush=True)
        for c, v in cs.items():
            print(f"    {c}: do_bench {v['do_bench']:.1f} rotated {v['rotated']:.1f} graph {v['graph']:.1f}")
        mods = idx = wb = ys = None
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
