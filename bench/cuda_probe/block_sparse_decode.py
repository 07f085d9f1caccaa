"""Probe: the block-sparse forward at decode sizes under each (split, config), graph-replayed, beside
dense ``F.linear`` (issue 21: T=16 at density 0.5 ran at 0.93-0.97x dense). What ``decode_split``
and ``M_TILES``' decode configs should be.

Usage::

    python bench/cuda_probe/block_sparse_decode.py [--tokens 16] [--shape 4096x4096] [--block 64]

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
from block_sparse_calls import graph_time  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    args = ap.parse_args()
    os.environ["OPFORGE_TRITON_TUNING"] = "off"
    import triton

    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.triton_launch import TunedKernel
    from opforge.nn import BlockSparseLinear

    k_in, n_out = map(int, args.shape.split("x"))
    dev, dtype = torch.device("cuda"), torch.bfloat16
    real_split = triton_impl.decode_split
    print(f"{torch.cuda.get_device_name()} bf16 T={args.tokens} {k_in}->{n_out} blocks {args.block}")
    for density in map(float, args.densities.split(",")):
        torch.manual_seed(0)
        m = BlockSparseLinear(k_in, n_out, density=density, block_shape=(args.block, args.block), device=dev,
                              dtype=dtype)
        w = m.to_dense().detach()
        x = torch.randn(args.tokens, k_in, device=dev, dtype=dtype)
        with torch.no_grad():
            dense = graph_time(lambda: F.linear(x, w, m.bias))
            chosen = real_split(args.tokens, n_out, n_out // args.block, m.layout.nnz, 132, 50 * 2**20)
            print(f"density {density}: dense {dense * 1e6:.1f} us; decode_split chooses {chosen}")
            best = None
            for split in sorted({1, 2, 4, 8, 12, 16, 24, 32, chosen}):
                for bk, warps, stages in ((64, 4, 4), (64, 2, 4), (64, 8, 4), (32, 4, 4), (32, 2, 6), (64, 4, 2),
                                          (16, 4, 5), (64, 1, 3)):
                    cfg = triton.Config({"BLOCK_M": 16, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps,
                                        num_stages=stages)
                    triton_impl.KERNELS["fwd"] = TunedKernel(triton_impl.FAMILY, triton_impl._fwd_kernel, [cfg])
                    triton_impl.decode_split = lambda *a, s=split: s
                    triton_impl.forget_plans()
                    try:
                        got = m(x)
                        torch.testing.assert_close(got.float(), F.linear(x, w, m.bias).float(), rtol=3e-2,
                                                   atol=3e-2)
                        t = graph_time(lambda: m(x))
                    except Exception as exc:  # noqa: BLE001
                        print(f"  split {split:2d} k{bk} w{warps} s{stages}: {type(exc).__name__}")
                        continue
                    if best is None or t < best[0]:
                        best = (t, split, bk, warps, stages)
                    print(f"  split {split:2d} k{bk} w{warps} s{stages}: {t * 1e6:6.1f} us ({dense / t:.2f}x dense)")
            print(f"  best: {best[0] * 1e6:.1f} us ({dense / best[0]:.2f}x dense) at split {best[1]}, "
                  f"BLOCK_K {best[2]}, {best[3]} warps, {best[4]} stages")
    triton_impl.decode_split = real_split


if __name__ == "__main__":
    main()
