"""Probe: the package's CUDA decode kernel (``opforge/kernels/block_sparse/cuda_decode.py``) in every
config of a grid (ring slots a CTA, CTAs an SM, launched as a programmatic dependent or not) on the rows
of issue 35, against the decode route with and without it, dense ``F.linear`` and cuBLAS on the same
bytes (the floor); 16 rotated layers, graph-replayed, GPU µs per layer. Each config is checked
against the module's output first.

Usage::

    python bench/cuda_probe/decode_cuda_configs.py [--shapes ...] [--tokens 1,16] [--densities ...]
        [--stages 2,3,4] [--ctas 1,2] [--overlap 0,1] [--json OUT]

(Commit c8e9819 had a third knob instead of the overlap, blocks prefetched into L2 past the ring:
slower in every row, ``docs/data/block_sparse_decode_cuda_prefetch_h100.json``.)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import checked_timings, config_grid, graph_us, head, issue_rows, keyed, probe_args, record, write_rows  # noqa: E402


def main() -> None:
    ap = probe_args(argparse.ArgumentParser(), tokens="1,16", stages="2,3,4", ctas="1,2", overlap="0,1")
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import cuda_decode, triton_impl
    from opforge.kernels.block_sparse.buffers import split_counts

    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    op = cuda_decode.ops().forward
    counts = split_counts(0, 1 << 16)
    grid = config_grid(args, "stages", "ctas", "overlap")
    route, names = triton_impl.DECODE_ROUTE, triton_impl.DECODE_ROUTE.names

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        y = torch.empty(x.shape[0], m.out_features, device=dev, dtype=x.dtype)
        op(x, m.weight_blocks, m.bias, y, idx.cols, idx.row_ptr, counts, 0, *cfg)
        return y

    out = []
    for row in issue_rows(args, dev, dt, seed=1):
        x, dense, same, mods = row.pop("x"), row["dense_us"], row["same_bytes_us"], row.pop("mods")
        row.pop("weights")
        with torch.no_grad():
            routed = {}
            for label, use in (("triton", tuple(k for k in names if k != "cuda")), ("with_cuda", names)):
                route.names = use
                route.forget()
                triton_impl.forget_plans()
                routed[label] = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
            route.names = names
            ref = mods[0](x).float()
            timings = checked_timings(grid, run, mods, x, ref, dev, n)
        best = min(timings, key=timings.get)
        by_overlap = {o: min(v for c, v in timings.items() if c[2] == o) for o in sorted({c[2] for c in grid})}
        print(f"{head(row)} | route triton {routed['triton']:.1f} with cuda {routed['with_cuda']:.1f} | cuda best {timings[best]:.1f} "
              f"{best} ({dense / timings[best]:.2f}x, {100 * same / timings[best]:.0f}% of floor); best by overlap "
              f"{ {o: round(v, 1) for o, v in by_overlap.items()} }", flush=True)
        out.append(record(row, route_us=routed, cuda=keyed(timings)))
    write_rows(args.json, out)


if __name__ == "__main__":
    main()
