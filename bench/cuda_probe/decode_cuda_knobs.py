"""Probe: two knobs of the CUDA decode kernel, each against the other way (issue 35, twenty-sixth session).

* ``whole``. The kernel's CTAs take equal shares of the blocks, so a row cut between CTAs has its fp32 partial
  sums written by one and read by another. On 4096->14336 (224 rows of 64-blocks, 27 blocks a share at 2 CTAs
  an SM) nearly every share cuts a row, and at T=64 each cut costs 16 KB out and 16 KB back a CTA. With
  ``whole=1`` a CTA takes the rows whose first block lies in its share instead, as the Triton uncut kernel
  does: shares unequal by up to a row, no partial sums.
* ``wgmma``. Up to 32 tokens the kernel multiplies with mma.sync, each consumer warp reading x's slice of a
  block from shared memory; with ``wgmma=1`` (64-wide blocks, compute capability 9.0) a warpgroup multiplies
  with wgmma from the slot, x's slice read once a block, as the 64-token tile does.

Each (ring slots, CTAs an SM, whole, wgmma) is checked against the layer's output, then timed on issue 35's
rows against the route: 16 rotated layers, graph-replayed, GPU µs per layer.

Usage::

    python bench/cuda_probe/decode_cuda_knobs.py [--shapes ...] [--tokens 1,16,64] [--densities ...]
        [--pairs 4x4,6x4,...] [--whole 0,1] [--wgmma 0,1] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import checked_timings, graph_us, head, issue_rows, keyed, probe_args, record, write_rows  # noqa: E402


def knob(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    from opforge.kernels.block_sparse import cuda_decode, triton_impl
    from opforge.kernels.block_sparse.buffers import split_counts

    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--pairs", default=",".join(f"{s}x{c}" for s, c in cuda_decode.PAIRS))
    ap.add_argument("--whole", default="0,1")
    ap.add_argument("--wgmma", default="0,1")
    ap.add_argument("--json")
    ap.set_defaults(tokens="1,16,64")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    ops = cuda_decode.ops()
    counts = split_counts(0, 1 << 16)
    pairs = [tuple(map(int, p.split("x"))) for p in args.pairs.split(",")]
    route = triton_impl.DECODE_ROUTE

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        y = torch.empty(x.shape[0], m.out_features, device=dev, dtype=x.dtype)
        stages, ctas, whole, wg = cfg
        ops.forward(x, m.weight_blocks, m.bias, y, idx.cols, idx.row_ptr, counts, 0, stages, ctas, 1, whole, wg)
        return y

    print(f"{torch.cuda.get_device_name()}, bf16, 64-blocks, {n} layers rotated, graph-replayed, µs per layer",
          flush=True)
    out = []
    for row in issue_rows(args, dev, dt, seed=1):
        x, dense, mods = row.pop("x"), row["dense_us"], row.pop("mods")
        row.pop("weights")
        with torch.no_grad():
            route.forget()
            triton_impl.forget_plans()
            routed = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
            ref = mods[0](x).float()
            wgs = [g for g in knob(args.wgmma) if g or x.shape[0] <= 32]  # past 32 tokens, wgmma's tile only
            offered = [(s, c, h, g) for s, c in pairs for h in knob(args.whole) for g in wgs
                       if ops.grid(x, 64, 64, s, c, g) > 0]
            timings = checked_timings(offered, run, mods, x, ref, dev, n) if offered else {}
        best = {k: min((c for c in timings if c[2:] == k), key=timings.get, default=None)
                for k in ((0, 0), (1, 0), (0, 1), (1, 1))}
        line = " | ".join(f"{'whole' if k[0] else 'cut'}{' wgmma' if k[1] else ''} {timings[c]:.1f} {c[:2]} "
                          f"({dense / timings[c]:.2f}x)" for k, c in best.items() if c is not None)
        print(f"{head(row)} | route {routed:.1f} ({dense / routed:.2f}x) | {line}", flush=True)
        out.append(record(row, route_us=routed, cuda=keyed(timings)))
    write_rows(args.json, out)


if __name__ == "__main__":
    main()
