"""Probe: the CUDA decode kernel's 64-token tile through wgmma (issue 35, twenty-fifth session).

The package's CUDA decode kernel (``opforge/kernels/block_sparse/csrc``) stops at 32 tokens: at 64, each of
its four consumer warps read all of x's 8 KB slice a block from shared memory for its ``mma.sync``, and
the kernel ran at 1.07-1.35x the Triton route's time (docs/benchmarks.md, issue 35, twenty-second session).
Built for sm_90a, the same sources also compile a 64-token tile whose warpgroup multiplies with wgmma
straight from the ring's slot (W and x both brought in by the copy engine in the 128-byte swizzle), so x's
slice is read once a block. This probe checks that tile against fp64 on the layouts the package's tests
use, and times it on issue 35's rows against the route, dense and cuBLAS on the same bytes: 16 rotated
layers, graph-replayed, GPU µs per layer.

Usage::

    python bench/cuda_probe/decode_wgmma.py [--shapes ...] [--tokens 64] [--densities ...]
        [--stages 4,5,6] [--ctas 1,2,3] [--check] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import (  # noqa: E402
    checked_timings,
    config_grid,
    head,
    issue_rows,
    keyed,
    probe_args,
    record,
    routed_and_reference,
    write_rows,
)


def probe_ops():
    """The package's CUDA decode ops, whose build has the 64-token wgmma tile on sm_90a since 1c64a59. (Commit
    c7a2818's probe built it apart, with -DOPFORGE_DECODE_WGMMA, when the package's build did not; it also built
    the tile with 1 or 4 partial slots loaded at a time and with its products waited for late: slower,
    docs/benchmarks.md, issue 35, twenty-fifth session.)"""
    from opforge.kernels.block_sparse import cuda_decode

    return cuda_decode.ops()


def reference(x, w, b, cols, row_ptr, n_out):
    """fp64 y = x Wᵀ + b from the blocks."""
    nnz, bh, bw = w.shape
    dense = torch.zeros(n_out, x.shape[1], dtype=torch.float64, device=x.device)
    rows = torch.repeat_interleave(torch.arange(n_out // bh, device=x.device), row_ptr.diff())
    for k in range(nnz):
        r, c = int(rows[k]), int(cols[k])
        dense[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw] = w[k].double()
    y = x.double() @ dense.T
    return y + b.double() if b is not None else y


def check(op, counts, tokens_checked=(33, 48, 64)) -> int:
    """The probe's variant against fp64: T of ``tokens_checked``; 64 x 64 and 128 x 64 blocks; bf16 and fp16; a bias
    or not; layouts with empty rows, a full row and rows of 0 to all blocks; every ring depth and CTAs an
    SM given, and chunks that cut rows every way. Returns the launches checked."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(7)
    n = 0
    for dt, (bh, bw), tokens, bias in itertools.product((torch.bfloat16, torch.float16), ((64, 64), (128, 64)),
                                                        tokens_checked, (False, True)):
        k_in, n_out = 1024, 1024
        rows, cols_n = n_out // bh, k_in // bw
        counts_per_row = [0, cols_n, 3, 0, 1] + [int(torch.randint(0, cols_n + 1, (1,), generator=g))
                                                 for _ in range(rows - 5)]
        cols = torch.cat([torch.randperm(cols_n, generator=g)[:c].sort().values for c in counts_per_row])
        row_ptr = torch.tensor([0] + list(itertools.accumulate(counts_per_row)))
        nnz = int(row_ptr[-1])
        w = (torch.randn(nnz, bh, bw, generator=g) / 8).to(dev, dt)
        x = torch.randn(tokens, k_in, generator=g).to(dev, dt)
        b = torch.randn(n_out, generator=g).to(dev, dt) if bias else None
        cols, row_ptr = cols.to(dev), row_ptr.to(dev)
        want = reference(x, w, b, cols, row_ptr, n_out)
        for stages, ctas, chunk in ((2, 1, 0), (4, 2, 0), (3, 3, 0), (2, 2, 1), (2, 2, 5), (3, 1, 17)):
            y = torch.full((tokens, n_out), float("nan"), device=dev, dtype=dt)
            op(x, w, b, y, cols, row_ptr, counts, chunk, stages, ctas, 1)
            err = ((y.double() - want).abs().max() / want.abs().max()).item()
            assert err < 1e-2, (dt, bh, bw, tokens, bias, stages, ctas, chunk, err)
            assert int(counts.abs().sum()) == 0, "counts not left at zero"
            n += 1
    return n


def main() -> None:
    ap = probe_args(argparse.ArgumentParser(), tokens="64", stages="4,5,6", ctas="1,2,3")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse.buffers import split_counts

    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    ops = probe_ops()
    counts = split_counts(0, 1 << 16)
    if args.check:
        print(f"check: {check(ops.forward, counts)} launches against fp64, all within 1e-2", flush=True)
    grid = config_grid(args, "stages", "ctas")

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        y = torch.empty(x.shape[0], m.out_features, device=dev, dtype=x.dtype)
        ops.forward(x, m.weight_blocks, m.bias, y, idx.cols, idx.row_ptr, counts, 0, *cfg, 1)
        return y

    out = []
    for row in issue_rows(args, dev, dt, seed=1):
        x, dense, same, mods = row.pop("x"), row["dense_us"], row["same_bytes_us"], row.pop("mods")
        row.pop("weights")
        routed, ref = routed_and_reference(mods, x, dev, n)
        with torch.no_grad():
            offered = [cfg for cfg in grid if ops.grid(x, 64, 64, *cfg) > 0]
            timings = checked_timings(offered, run, mods, x, ref, dev, n)
        best = min(timings, key=timings.get)
        print(f"{head(row)} | route {routed:.1f} ({dense / routed:.2f}x) | wgmma best {timings[best]:.1f} {best} "
              f"({dense / timings[best]:.2f}x, {100 * same / timings[best]:.0f}% of cuBLAS same bytes) | all "
              f"{ {','.join(map(str, c)): round(v, 1) for c, v in timings.items()} }", flush=True)
        out.append(record(row, route_us=routed, wgmma=keyed(timings)))
    write_rows(args.json, out)


if __name__ == "__main__":
    main()
