"""Probe: what a decode size class's first call costs (its configs and route tuned, nothing kept), with
the package's timing (graph replay on stand-ins for the weight past L2: ``kernels/graph_timing.py``)
and with do_bench's (an L2 flush before each lone launch: the package's before the eighteenth
session). Triton's compiled kernels are made first, in a pass whose tunings are thrown away, so
both columns time tuning alone.

Usage::

    python bench/cuda_probe/tuning_cost.py [--shape 4096x14336] [--tokens 1,64] [--density 0.25] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--density", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from opforge import settings
    from opforge.engine.inventory import TUNING_DIR
    from opforge.kernels import graph_timing
    from opforge.kernels.block_sparse import triton_impl
    from opforge.nn import BlockSparseLinear

    k_in, n_out = map(int, args.shape.split("x"))
    m = BlockSparseLinear(k_in, n_out, density=args.density, block_shape=(64, 64), bias=False).cuda().to(torch.bfloat16)
    own = graph_timing.StandIns.per_call_ms
    timers = {"graph": own, "dobench": lambda *a: None}

    def first_call(x) -> float:
        triton_impl.forget_plans()
        for k in triton_impl.KERNELS.values():
            k.forget()
        shutil.rmtree(os.path.join(settings.current().cache_dir, TUNING_DIR), ignore_errors=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            m(x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for tokens in map(int, args.tokens.split(",")):
        x = torch.randn(tokens, k_in, device="cuda", dtype=torch.bfloat16)
        for timer in timers.values():  # compiles every candidate of both ways
            graph_timing.StandIns.per_call_ms = timer
            first_call(x)
        got = {}
        for name, timer in timers.items():
            graph_timing.StandIns.per_call_ms = timer
            got[name] = statistics.median(first_call(x) for _ in range(args.rounds))
        print(f"{k_in}->{n_out} T={tokens} d={args.density}: first call, tuning all: "
              + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in got.items()), flush=True)
    graph_timing.StandIns.per_call_ms = own


if __name__ == "__main__":
    main()
