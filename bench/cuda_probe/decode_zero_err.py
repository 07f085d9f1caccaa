"""Probe: why ``bench/block_sparse_decode.py`` reports a relative error of exactly 0 against dense
``F.linear`` in some rows (4096->14336 at T=64 in every H100 run, T=32 d=0.1 on the H200). Builds a row
as the bench does (same seeds), then compares the module's first call, its second (replayed from C++),
and a call whose output memory was filled with NaNs just before, each against cuBLAS on the masked dense
weight (bitwise and relative) and against fp64; and names the plan the forward took.

Usage::

    python bench/cuda_probe/decode_zero_err.py [--rows 4096x14336:64:0.1,4096x14336:32:0.1,14336x4096:1:0.1]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="4096x14336:64:0.1,4096x14336:32:0.1,14336x4096:1:0.1,4096x14336:16:0.25")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    dev, dt = torch.device("cuda"), torch.bfloat16
    for spec in args.rows.split(","):
        shape, t, d = spec.split(":")
        k_in, n_out = map(int, shape.split("x"))
        t, d = int(t), float(d)
        torch.manual_seed(0)
        x = torch.randn(t, k_in, device=dev, dtype=dt)
        g = torch.Generator().manual_seed(1)
        m = BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
            n_out, k_in, d, (64, 64), generator=g)).requires_grad_(False)
        with torch.no_grad():
            dense = m.to_dense()
            ref = F.linear(x, dense)
            ref64 = x.double() @ dense.double().t()
            before = set(map(id, triton_impl._FWD.values()))
            first = m(x)
            plans = [p for p in triton_impl._FWD.values() if id(p) not in before]
            second = m(x)
            poison = torch.full((t, n_out), float("nan"), device=dev, dtype=dt)
            del poison  # its block is the next allocation of this size
            third = m(x)
            torch.cuda.synchronize()
        kinds = [getattr(p, "facts", (p,))[0] if not isinstance(p, str) else p for p in plans]
        names = [getattr(getattr(p, "kernel", None), "name", "?") for p in plans]
        print(f"{k_in}->{n_out} T={t} d={d}: plans {list(zip(kinds, names))}; cuBLAS vs fp64 {rel(ref, ref64):.2e}")
        for label, y in (("first", first), ("second", second), ("after NaNs", third)):
            print(f"  {label:10s} vs cuBLAS {rel(y, ref):.2e} (equal: {torch.equal(y, ref)}), vs fp64 "
                  f"{rel(y, ref64):.2e}, NaNs {int(y.isnan().sum())}", flush=True)


if __name__ == "__main__":
    main()
