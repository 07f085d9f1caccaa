"""Probe: does each eager call of the CUDA decode kernel replay from C++ (a native hit), at T=32 and T=64, and at
what host cost? 16 layers of 14336->4096 at d=0.25, 20 passes over them, no sync; the plans' kinds (issue 35,
twenty-fifth session). On compute capability 9.0 both go through wgmma since the twenty-sixth session (T=32 was
mma.sync's tile before), their recipes with x's map in the 128-byte swizzle and W's.

Usage::

    python bench/cuda_probe/decode_native_hits.py
"""

from __future__ import annotations

import time

import torch


def main() -> None:
    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.kernels.native_launch.table import native_ops
    from opforge.nn import BlockSparseLinear

    ops, why = native_ops()
    assert ops is not None, why
    g = torch.Generator().manual_seed(1)
    for tokens in (32, 64):
        mods = [BlockSparseLinear(14336, 4096, bias=False, device="cuda", dtype=torch.bfloat16,
                                  layout=BlockSparseLayout.random(4096, 14336, 0.25, (64, 64), generator=g))
                .requires_grad_(False) for _ in range(16)]
        x = torch.randn(tokens, 14336, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            for m in mods:  # planned, tuned, recipes defined
                m(x)
            torch.cuda.synchronize()
            before = ops.stats()
            t0 = time.perf_counter()
            for _ in range(20):
                for m in mods:
                    m(x)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            after = ops.stats()
        kinds = {getattr(p, "facts", ("",))[0] for p in triton_impl._FWD.values()}
        print(f"T={tokens}: host {(t1 - t0) / 320 * 1e6:.1f} us a call; native stats {before} -> {after} "
              f"(320 calls); plans {kinds}", flush=True)


if __name__ == "__main__":
    main()
