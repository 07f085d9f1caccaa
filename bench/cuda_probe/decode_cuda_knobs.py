"""Probe: the CUDA decode kernel through wgmma or mma.sync, at every token count (issue 35, twenty-sixth session).

Up to 32 tokens the kernel multiplied with mma.sync, each consumer warp reading x's slice of a block from
shared memory; with ``wgmma=1`` (64-wide blocks, compute capability 9.0) a warpgroup multiplies with wgmma
straight from the slot, x's slice read once a block, as the 64-token tile does (m64nNk16, N = 8, 16, 32 or 64
tokens). Each (ring slots, CTAs an SM, wgmma) is checked against the layer's output, then timed on issue 35's
rows against the route: 16 rotated layers, graph-replayed, GPU µs per layer.

Commit 89a369e's version of this probe also timed CTAs that take whole rows (those starting in their share, no
partial sums): 1.1-3.1x the time of equal shares on every row (docs/benchmarks.md, issue 35, twenty-sixth session), and taken out.

Usage::

    python bench/cuda_probe/decode_cuda_knobs.py [--shapes ...] [--tokens 1,8,16,32] [--densities ...]
        [--pairs 4x4,6x4,...] [--wgmma 0,1] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_floor as floor  # noqa: E402


def knob(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    from opforge.kernels.block_sparse import cuda_decode
    from opforge.kernels.block_sparse.buffers import split_counts

    ap = floor.probe_args(argparse.ArgumentParser(), tokens="1,8,16,32", wgmma="0,1",
                          pairs=",".join(f"{s}x{c}" for s, c in cuda_decode.PAIRS))
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    ops = cuda_decode.ops()
    counts = split_counts(0, 1 << 16)
    pairs = [tuple(map(int, p.split("x"))) for p in args.pairs.split(",")]

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        y = torch.empty(x.shape[0], m.out_features, device=dev, dtype=x.dtype)
        stages, ctas, wg = cfg
        ops.forward(x, m.weight_blocks, m.bias, y, idx.cols, idx.row_ptr, counts, 0, stages, ctas, 1, wg)
        return y

    print(f"{torch.cuda.get_device_name()}, bf16, 64-blocks, {n} layers rotated, graph-replayed, µs per layer",
          flush=True)
    out = []
    for row in floor.issue_rows(args, dev, dt, seed=1):
        x, dense, mods = row.pop("x"), row["dense_us"], row.pop("mods")
        row.pop("weights")
        routed, ref = floor.routed_and_reference(mods, x, dev, n)
        with torch.no_grad():
            wgs = [g for g in knob(args.wgmma) if g or x.shape[0] <= 32]  # past 32 tokens, wgmma's tile only
            offered = [(s, c, g) for s, c in pairs for g in wgs if ops.grid(x, 64, 64, s, c, g) > 0]
            timings = floor.checked_timings(offered, run, mods, x, ref, dev, n) if offered else {}
        best = {g: min((c for c in timings if c[2] == g), key=timings.get, default=None) for g in (0, 1)}
        line = " | ".join(f"{'wgmma' if g else 'mma.sync'} {timings[c]:.1f} {c[:2]} ({dense / timings[c]:.2f}x)"
                          for g, c in best.items() if c is not None)
        print(f"{floor.head(row)} | route {routed:.1f} ({dense / routed:.2f}x) | {line}", flush=True)
        out.append(floor.record(row, route_us=routed, cuda=floor.keyed(timings)))
    floor.write_rows(args.json, out)


if __name__ == "__main__":
    main()
