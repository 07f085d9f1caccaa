"""Probe: does a block-sparse forward's host time depend on the token count (issue 21: at T=8192
the forward's host µs per call ran 1.7x dense's, at T=16 1.3x, with the same Python and C++
work per call)? Each call kind is timed, host only, in loops of n = 5, 20 and 50 calls started
on an idle GPU: a cost that grows with n is the GPU's queue pushing back (the launches wait), a
cost flat in n is the host's own. Then the same with a sync after each call (the host's work
alone, never queued behind the GPU).

Usage::

    python bench/cuda_probe/block_sparse_host.py [--tokens 16,2048,8192] [--features 4096] [--density 0.1]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from opforge.bench.timing import host_loop, loops


def per_call(fn, n: int, sync_each: bool, reps: int = 7) -> float:
    if sync_each:  # each call alone, after the last one finished
        out = [statistics.fmean(host_loop(fn, 1, before=torch.cuda.synchronize) for _ in range(n)) for _ in range(reps)]
    else:
        out = loops(fn, n, reps, before=torch.cuda.synchronize)
    torch.cuda.synchronize()
    return statistics.median(out) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="16,2048,8192")
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--density", type=float, default=0.1)
    args = ap.parse_args()
    n = args.features
    print(f"{torch.cuda.get_device_name()}, bf16 {n}->{n}, 64-blocks, density {args.density}; host µs per call")
    for tokens in (int(t) for t in args.tokens.split(",")):
        print(f"T={tokens} (n=5/20/50 back to back, then synced each): " + case(tokens, n, args.density), flush=True)


def case(tokens: int, n: int, density: float) -> str:
    from opforge.kernels.block_sparse import triton_impl as ti
    from opforge.nn import BlockSparseLinear

    torch.manual_seed(0)
    m = BlockSparseLinear(n, n, density=density, block_shape=(64, 64), device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    wd, b = m.to_dense().detach(), m.bias.detach()
    w, idx = m.weight_blocks.detach(), m.layout.indices(x.device)
    kinds = {"torch.add": lambda: torch.add(x, 1), "F.linear": lambda: F.linear(x, wd, b),
             "module": lambda: m(x), "forward": lambda: ti.forward(x, w, b, idx.rows, idx.cols, idx.row_ptr, n)}
    with torch.no_grad():
        for fn in kinds.values():
            for _ in range(3):
                fn()
        call = ti._NATIVE_FWD.call
        if call is not None:
            kinds["native op"] = lambda: call(x, w, b, idx.cols, idx.row_ptr, n, False)
        cells = []
        for name, fn in kinds.items():
            vals = [per_call(fn, k, False) for k in (5, 20, 50)] + [per_call(fn, 20, True)]
            cells.append(f"{name} " + "/".join(f"{v:.1f}" for v in vals))
    return ", ".join(cells)


if __name__ == "__main__":
    main()
