"""Probe, to run under Nsight Compute: one issue-35 row's decode forwards and cuBLAS on the same
bytes, each launched a few times after a warm-up, so that ``ncu`` can say where each spends its
time (DRAM throughput against peak, warp stalls, occupancy). The layer: 4096->14336 at density
0.25, T=1, 64-blocks (the row whose floor allows 3x and where opforge reaches 85% of it).

Usage::

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --section LaunchStats python bench/cuda_probe/decode_ncu.py

Only the launches between ``torch.cuda.profiler.start()`` and ``stop()`` are profiled: the tuning
and the warm-up run before.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    dev, dt = torch.device("cuda"), torch.bfloat16
    k_in, n_out = map(int, args.shape.split("x"))
    x = torch.randn(args.tokens, k_in, device=dev, dtype=dt)
    m = BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
        n_out, k_in, args.density, (64, 64), generator=torch.Generator().manual_seed(1))).requires_grad_(False)
    same = torch.randn(max(64, round(n_out * args.density / 64) * 64), k_in, device=dev, dtype=dt)
    route = triton_impl.DECODE_ROUTE
    names = route.names
    with torch.no_grad():
        for name in ("decode", "uncut"):  # tuned outside the profiled launches (warm-up: skipped by ncu)
            route.names = (name,)
            route.forget()
            triton_impl.forget_plans()
            m(x)
        F.linear(x, same)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for name in ("decode", "uncut"):
            route.names = (name,)
            route.forget()
            triton_impl.forget_plans()
            for _ in range(args.calls):
                m(x)
            torch.cuda.synchronize()
            print(f"{name}: launched {args.calls}", flush=True)
        for _ in range(args.calls):
            F.linear(x, same)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"cuBLAS same bytes ({k_in}->{same.shape[0]}): launched {args.calls}", flush=True)
    route.names = names


if __name__ == "__main__":
    main()
