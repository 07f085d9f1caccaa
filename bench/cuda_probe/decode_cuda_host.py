"""Probe: the host's µs per call and the GPU's µs per call back to back of a decode layer, through
``BlockSparseLinear`` with the decode route as in use, with the route held to the CUDA decode kernel
(replayed from C++ by its recipe, and launched through its op with the recipe taken away: the
twenty-second session's path), and ``F.linear`` on the dense weight (the peer), all in one run. Host: loops of 20 calls started on an
idle GPU, no sync inside (``opforge.bench.timing.loops``), the median of 7. Back to back: 200 calls
between two CUDA events over 16 rotated layers, so each call reads its weight from HBM.

Usage::

    python bench/cuda_probe/decode_cuda_host.py [--shapes 4096x14336,14336x4096] [--tokens 1,16]
        [--densities 0.1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from opforge.bench.timing import loops


def host_us(fn) -> float:
    torch.cuda.synchronize()
    return statistics.median(loops(fn, 20, 7, before=torch.cuda.synchronize)) * 1e6


def b2b_us(fns, calls: int = 200) -> float:
    for f in fns:
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        fns[i % len(fns)]()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--densities", default="0.1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import cuda_decode, triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    dev, dt, route = torch.device("cuda"), torch.bfloat16, triton_impl.DECODE_ROUTE
    names, out = route.names, []
    print(f"{torch.cuda.get_device_name()}, bf16, 64-blocks, {args.layers} rotated layers; µs per call")
    with torch.no_grad():
        for shape in args.shapes.split(","):
            k_in, n_out = map(int, shape.split("x"))
            for t in map(int, args.tokens.split(",")):
                x = torch.randn(t, k_in, device=dev, dtype=dt)
                ws = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(args.layers)]
                row = {"in": k_in, "out": n_out, "tokens": t,
                       "dense": {"host_us": host_us(lambda: F.linear(x, ws[0])),  # noqa: B023
                                 "b2b_us": b2b_us([lambda w=w: F.linear(x, w) for w in ws])}}  # noqa: B023
                ws = None
                for d in map(float, args.densities.split(",")):
                    g = torch.Generator().manual_seed(1)
                    mods = [BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
                        n_out, k_in, d, (64, 64), generator=g)).requires_grad_(False) for _ in range(args.layers)]
                    got = {}
                    recipe = cuda_decode.KERNEL.recipe
                    for label, use in (("routed", names), ("cuda", ("cuda",)), ("cuda_op", ("cuda",))):
                        cuda_decode.KERNEL.recipe = None if label == "cuda_op" else recipe  # its plans: no recipe
                        route.names = use
                        route.forget()
                        triton_impl.forget_plans()
                        mods[0](x)  # planned and tuned before the clock
                        got[label] = {"host_us": host_us(lambda: mods[0](x)),  # noqa: B023
                                      "b2b_us": b2b_us([lambda m=m: m(x) for m in mods])}  # noqa: B023
                    route.names, cuda_decode.KERNEL.recipe = names, recipe
                    route.forget()
                    triton_impl.forget_plans()
                    out.append(row | {"density": d} | got)
                    print(f"{k_in}->{n_out} T={t} d={d}: host / b2b µs: dense {row['dense']['host_us']:.1f} / "
                          f"{row['dense']['b2b_us']:.1f}, routed {got['routed']['host_us']:.1f} / "
                          f"{got['routed']['b2b_us']:.1f}, CUDA kernel {got['cuda']['host_us']:.1f} / "
                          f"{got['cuda']['b2b_us']:.1f}, through its op {got['cuda_op']['host_us']:.1f} / "
                          f"{got['cuda_op']['b2b_us']:.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
