"""Probe: each of a training step's three block-sparse launches alone, against the dense matmul
that does the same job, graph-replayed (GPU time only): where a fwd+bwd step's GPU time goes
(issue 21: T=8192, 4096->4096 at density 0.1 ran at 2.71x dense of a 3x target, GPU-bound).

Usage::

    python bench/cuda_probe/block_sparse_kernels.py [--tokens 2048,8192] [--shape 4096x4096]
        [--blocks 64] [--densities 0.5,0.25,0.1] [--sweep fwd_tma,dx_tma,dw] [--profile]

Rows: ``fwd`` (``x @ Wᵀ + b`` against ``F.linear``), ``dx`` (``dy @ W`` against a dense matmul),
``dw+db`` (the kept blocks of ``dyᵀ @ x`` and ``dy.sum(0)`` against a dense ``dyᵀ @ x`` plus a
sum). Each row: µs per call (20 calls captured in a CUDA graph, median of 7 replays), the
speedup over dense, and the share of dense's FLOP rate reached on the useful FLOPs
(``density × dense FLOPs``). ``--sweep`` times each named kernel (``triton_impl.KERNELS``) under
each of its candidate configs alone, in a graph as above and as the tuner times it (``do_bench``:
L2 flushed before each call), and marks the tuner's choice: to size the candidates and check the
tuner's clock against a replay's.
``--profile`` prints torch.profiler's kernel table for one fwd+bwd step of the module.
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
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--blocks", default="64")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--sweep", default="", help="kernels of triton_impl.KERNELS, comma-separated")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    k_in, n_out = map(int, args.shape.split("x"))
    print(f"{torch.cuda.get_device_name()} bf16, {k_in}->{n_out}")
    print("| T | block | density | launch | opforge µs | dense µs | speedup | per useful FLOP |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for tokens in map(int, args.tokens.split(",")):
        for block in map(int, args.blocks.split(",")):
            for density in map(float, args.densities.split(",")):
                probe(tokens, k_in, n_out, block, density, args.sweep)
    if args.profile:
        profile(max(map(int, args.tokens.split(","))), k_in, n_out, int(args.blocks.split(",")[0]),
                min(map(float, args.densities.split(","))))


def _setup(tokens, k_in, n_out, block, density):
    from opforge.nn import BlockSparseLinear

    torch.manual_seed(0)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    m = BlockSparseLinear(k_in, n_out, density=density, block_shape=(block, block), device=dev, dtype=dtype)
    x = torch.randn(tokens, k_in, device=dev, dtype=dtype)
    dy = torch.randn(tokens, n_out, device=dev, dtype=dtype)
    return m, x, dy


def probe(tokens, k_in, n_out, block, density, sweep) -> None:
    from opforge.kernels.block_sparse import triton_impl as ti

    m, x, dy = _setup(tokens, k_in, n_out, block, density)
    w, b, idx = m.weight_blocks.detach(), m.bias.detach(), m.layout.indices(x.device)
    wd = m.to_dense().detach()
    bh, bw = m.block_shape
    launches = {
        "fwd": (lambda: ti.forward(x, w, b, idx.rows, idx.cols, idx.row_ptr, n_out), lambda: F.linear(x, wd, b)),
        "dx": (lambda: ti.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, k_in),
               lambda: dy @ wd),
        "dw+db": (lambda: ti.grad_weight_bias(dy, x, idx.rows, idx.cols, idx.row_ptr, bh, bw),
                  lambda: (dy.t() @ x, dy.sum(0))),
    }
    dense = {}
    with torch.no_grad():
        for name, (ours, peer) in launches.items():
            dense[name] = graph_time(peer)
            _row(tokens, block, density, name, graph_time(ours), dense[name], m.layout.density)
        for kernel in filter(None, sweep.split(",")):
            _sweep(ti, kernel, launches, dense, (tokens, block, density, m.layout.density))


_LAUNCH_OF = {"fwd": "fwd", "fwd_tma": "fwd", "dx": "dx", "dx_tma": "dx", "dw": "dw+db"}


def _sweep(ti, kernel, launches, dense, where) -> None:
    import triton
    from triton.testing import do_bench

    tokens, block, density, real = where
    tuned = ti.KERNELS[kernel]
    chosen = {c.index for c in tuned._chosen.values()}
    launch = launches[_LAUNCH_OF[kernel]][0]
    os.environ["OPFORGE_TRITON_TUNING"] = "off"
    try:
        for c in tuned.choices:
            cfg = triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
            ti.KERNELS[kernel] = ti.TunedKernel(ti.FAMILY, tuned.fn, [cfg])
            ti.forget_plans()
            label = f"{kernel} {'/'.join(map(str, c.values))} w{c.num_warps} s{c.num_stages}"
            label += " (tuned)" if c.index in chosen else ""
            try:
                ours = graph_time(launch)
                bench_ms = do_bench(launch, warmup=5, rep=25)
            except Exception as exc:  # noqa: BLE001 - a config that doesn't fit: said in its row
                print(f"| {tokens} | {block} | {density} | {label} | {type(exc).__name__} | | | |")
                continue
            _row(tokens, block, density, label, ours, dense[_LAUNCH_OF[kernel]], real, bench_ms * 1e3)
    finally:
        os.environ.pop("OPFORGE_TRITON_TUNING", None)
        ti.KERNELS[kernel] = tuned
        ti.forget_plans()


def _row(tokens, block, density, name, ours, dense, real_density, tuner_us=None) -> None:
    extra = "" if tuner_us is None else f" do_bench {tuner_us:.1f} µs |"
    print(f"| {tokens} | {block} | {density} | {name} | {ours * 1e6:.1f} | {dense * 1e6:.1f} | "
          f"{dense / ours:.2f}× | {dense * real_density / ours * 100:.0f}% |{extra}", flush=True)


def profile(tokens, k_in, n_out, block, density) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    m, x, dy = _setup(tokens, k_in, n_out, block, density)
    lin = torch.nn.Linear(k_in, n_out, device=x.device, dtype=x.dtype)
    xg = x.clone().requires_grad_()
    for name, mod in (("opforge", m), ("dense", lin)):
        for _ in range(3):
            mod(xg).backward(dy)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                mod(xg).backward(dy)
            torch.cuda.synchronize()
        print(f"\n{name}, T={tokens}, density {density}, 10 fwd+bwd steps:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
