"""Probe: where a decode forward's host time goes, by tokens, for the CUDA decode kernel replayed from
C++ and for the Triton route: µs per call of the module (``BlockSparseLinear``, no grad), of the
forward's native op alone (``triton_impl._NATIVE_FWD.call``, a recipe hit) and of the same with a new
x each call (its tensor map encoded each time), the GPU's µs per call back to back on one layer, and a
profile's CPU self times (kineto) of the native op's calls.

Usage::

    python bench/cuda_probe/decode_native_host.py [--shape 4096x14336] [--tokens 1,16,32] [--density 0.1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_cuda_host import b2b_us  # noqa: E402


def per_call_us(fn, calls: int = 50, repeats: int = 7) -> float:
    got = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        got.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(got)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--tokens", default="1,16,32")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    k_in, n_out = map(int, args.shape.split("x"))
    dev, dt, route = torch.device("cuda"), torch.bfloat16, triton_impl.DECODE_ROUTE
    names = route.names
    m = BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
        n_out, k_in, args.density, (64, 64), generator=torch.Generator().manual_seed(1))).requires_grad_(False)
    idx = m.layout.indices(dev)
    w = m.weight_blocks
    print(f"{torch.cuda.get_device_name()}, {k_in}->{n_out} d={args.density}, bf16 64-blocks; µs per call")
    with torch.no_grad():
        for t in map(int, args.tokens.split(",")):
            x = torch.randn(t, k_in, device=dev, dtype=dt)
            xs = [torch.randn(t, k_in, device=dev, dtype=dt) for _ in range(8)]
            for label, use in (("cuda", ("cuda",)), ("triton", tuple(n for n in names if n != "cuda"))):
                route.names = use
                route.forget()
                triton_impl.forget_plans()
                m(x)
                m(x)
                native = triton_impl._NATIVE_FWD.call
                assert native is not None

                def op(xx=x):
                    return native(xx, w, None, idx.cols, idx.row_ptr, idx.rows, n_out, False)
                for xx in xs:
                    op(xx)
                assert op(), "a recipe hit"
                k = [0]

                def fresh():
                    k[0] += 1
                    return op(xs[k[0] % 8])
                row = {"module": per_call_us(lambda: m(x)), "native op": per_call_us(op),  # noqa: B023
                       "native op, new x": per_call_us(fresh), "gpu b2b": b2b_us([op])}
                print(f"T={t} {label:6s} " + ", ".join(f"{n} {v:.1f}" for n, v in row.items()), flush=True)
                if args.profile:
                    from torch.profiler import ProfilerActivity, profile
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        for _ in range(50):
                            op()
                        torch.cuda.synchronize()
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8), flush=True)
    route.names = names


if __name__ == "__main__":
    main()
