"""Probe: the block-sparse forward at decode sizes under each (split, config), graph-replayed, beside
dense ``F.linear`` (issue 21: T=16 at density 0.5 ran at 0.93-0.97x dense), and what
``triton_sizing.decode_split`` prefers: how it was sized.

Usage::

    python bench/cuda_probe/block_sparse_decode.py [--tokens 1,16,32] [--shapes 4096x4096,4096x14336]
        [--blocks 32,64,128] [--densities 0.5,0.1] [--configs 64/4/4,...] [--splits 1,2,4,...]

Each (split, BLOCK_K, warps, stages) runs alone (one config, tuning off); the time is one call
captured 20 times in a CUDA graph, replayed, per call, the median of 7 replays.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from block_sparse_calls import graph_time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="16")
    ap.add_argument("--shapes", default="4096x4096")
    ap.add_argument("--blocks", default="64")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--configs", default="64/4/4,64/2/4,64/8/4,32/4/4,32/2/6,64/4/2,16/4/5,64/1/3",
                    help="BLOCK_K/warps/stages, comma-separated")
    ap.add_argument("--splits", default="1,2,4,8,12,16,24,32")
    args = ap.parse_args()
    os.environ["OPFORGE_TRITON_TUNING"] = "off"
    from opforge.kernels.block_sparse import triton_sizing

    dev, dtype = torch.device("cuda"), torch.bfloat16
    real_split = triton_sizing.decode_split
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    configs = [tuple(map(int, c.split("/"))) for c in args.configs.split(",")]
    print(f"{torch.cuda.get_device_name()} bf16, {sms} SMs")
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for block in map(int, args.blocks.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                for density in map(float, args.densities.split(",")):
                    probe(m_args=(k_in, n_out, block, tokens, density), configs=configs, splits=args.splits,
                          sms=sms, l2=l2, real_split=real_split, dev=dev, dtype=dtype)


def probe(m_args, configs, splits, sms, l2, real_split, dev, dtype) -> None:
    import triton

    from opforge.kernels.block_sparse import triton_impl, triton_kernels
    from opforge.kernels.triton_launch import TunedKernel
    from opforge.nn import BlockSparseLinear

    k_in, n_out, block, tokens, density = m_args
    torch.manual_seed(0)
    m = BlockSparseLinear(k_in, n_out, density=density, block_shape=(block, block), device=dev, dtype=dtype)
    w = m.to_dense().detach()
    x = torch.randn(tokens, k_in, device=dev, dtype=dtype)
    grid_r = n_out // block
    with torch.no_grad():
        dense = graph_time(lambda: F.linear(x, w, m.bias))
        chosen = real_split(tokens, n_out, grid_r, m.layout.nnz, block, sms, l2)[0]
        results = {}
        kept = triton_impl.KERNELS["fwd"]
        triton_impl.DECODE_ROUTE.names = ("pointer", "decode")  # this probe sizes the pointer kernel's split
        for split in sorted({*map(int, splits.split(",")), chosen}):
            for bk, warps, stages in configs:
                if bk > block:
                    continue
                cfg = triton.Config({"BLOCK_M": 16, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT": split}, num_warps=warps,
                                    num_stages=stages)
                triton_impl.KERNELS["fwd"] = TunedKernel(triton_impl.FAMILY, triton_kernels._fwd_kernel, [cfg])
                triton_impl.forget_plans()
                try:
                    torch.testing.assert_close(m(x).float(), F.linear(x, w, m.bias).float(), rtol=3e-2, atol=3e-2)
                    results[(split, bk, warps, stages)] = graph_time(lambda: m(x))
                except Exception as exc:  # noqa: BLE001 - a config that fails is reported
                    print(f"  split {split} k{bk} w{warps} s{stages}: {type(exc).__name__}")
        triton_impl.KERNELS["fwd"] = kept
        triton_impl.forget_plans()
    best = min(results, key=results.get)
    per_split = {s: min(t for k, t in results.items() if k[0] == s) for s in sorted({k[0] for k in results})}
    print(f"{k_in}->{n_out} block {block} T={tokens} density {density}: grid_r {grid_r}, blocks/row "
          f"{m.layout.nnz / grid_r:.1f}, dense {dense * 1e6:.1f} us; chosen split {chosen}: "
          f"{per_split.get(chosen, float('nan')) * 1e6:.1f} us; best {results[best] * 1e6:.1f} us "
          f"({dense / results[best]:.2f}x dense) at split {best[0]} k{best[1]} w{best[2]} s{best[3]}")
    print("  by split (best config): " + ", ".join(f"{s}: {t * 1e6:.1f}" for s, t in per_split.items()))


if __name__ == "__main__":
    main()
