"""Probe: what a matmul whose output tiles are one block wide can reach (issue 21's per-FLOP rows:
64-blocks at 47-49% of cuBLAS per useful FLOP, 32-blocks at 25-28%, against targets of 60% and
35%). The block-sparse forward gives each program a (BLOCK_M tokens) x (BH outputs) tile, BH the
block's height, and sums x-tile @ w-blockᵀ over the row's kept blocks: at density 1.0 it is a
dense matmul with BLOCK_N = BH. So a dense Triton matmul restricted to BLOCK_N = BH, tuned over
its other parameters, bounds what that kernel design can reach, and it is measured here for
BH = 32, 64, 128 beside cuBLAS, in two orientations:

* ``normal``: the MMA is (BLOCK_M tokens) x (BH outputs), as the block-sparse kernels do now;
* ``swapped``: the MMA computes the transposed tile, (BH outputs) x (BLOCK_T tokens), the weight
  block as the MMA's A operand and the tokens as its N (Hopper's wgmma takes M = 64 and N up to
  256): "swap AB", as CUTLASS does for narrow N.

Usage::

    python bench/cuda_probe/narrow_tiles.py [--shape 16384x4096x14336] [--widths 32,64,128]

Each variant's best config (of the sweep below) is timed with ``triton.testing.do_bench``; TFLOP/s
and the ratio to cuBLAS (``torch.mm``) in the same run.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _tile(T, N, BN: tl.constexpr, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (token tile, output tile), GROUP_M token tiles walking the outputs together."""
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(T, BLOCK_M), N // BN
    first_m = pid // (GROUP_M * n_n) * GROUP_M
    size_m = min(n_m - first_m, GROUP_M)
    return first_m + (pid % (GROUP_M * n_n)) % size_m, (pid % (GROUP_M * n_n)) // size_m


@triton.jit
def _normal(x_desc, w_desc, y_ptr, T, N, K, BN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile(T, N, BN, BLOCK_M, GROUP_M)
    acc = tl.zeros((BLOCK_M, BN), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        xt = x_desc.load([pid_m * BLOCK_M, k])
        wt = w_desc.load([pid_n * BN, k])
        acc = tl.dot(xt, wt.T, acc)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BN + tl.arange(0, BN)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m < T)[:, None])


@triton.jit
def _swapped(x_desc, w_desc, y_ptr, T, N, K, BN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
             GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile(T, N, BN, BLOCK_M, GROUP_M)
    acc = tl.zeros((BN, BLOCK_M), dtype=tl.float32)  # yᵀ's tile: outputs x tokens
    for k in range(0, K, BLOCK_K):
        wt = w_desc.load([pid_n * BN, k])  # (BN, BLOCK_K): the MMA's A
        xt = x_desc.load([pid_m * BLOCK_M, k])  # (BLOCK_M, BLOCK_K): its B, transposed
        acc = tl.dot(wt, xt.T, acc)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BN + tl.arange(0, BN)
    tl.store(y_ptr + offs_m.to(tl.int64)[None, :] * N + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m < T)[None, :])


SWEEP = {
    "normal": {"BLOCK_M": (64, 128, 256), "BLOCK_K": (64, 128), "warps": (4, 8), "stages": (3, 4)},
    "swapped": {"BLOCK_M": (64, 128, 256), "BLOCK_K": (64, 128), "warps": (4, 8), "stages": (3, 4)},
}


def run(kind, x, w, y, bn, cfg):
    bm, bk, warps, stages = cfg
    fn = _normal if kind == "normal" else _swapped
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    T, K = x.shape
    N = w.shape[0]
    grid = (triton.cdiv(T, bm) * (N // bn),)
    return lambda: fn[grid](xd, wd, y, T, N, K, BN=bn, BLOCK_M=bm, BLOCK_K=bk, GROUP_M=8, num_warps=warps,
                            num_stages=stages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16384x4096x14336", help="T x K x N")
    ap.add_argument("--widths", default="32,64,128")
    args = ap.parse_args()
    T, K, N = (int(v) for v in args.shape.split("x"))
    torch.manual_seed(0)
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
    ref = x @ w.t()
    flop = 2 * T * K * N
    cublas = triton.testing.do_bench(lambda: torch.mm(x, w.t(), out=y))
    print(f"{torch.cuda.get_device_name()}, bf16 {T}x{K}x{N}: cuBLAS {cublas:.3f} ms, {flop / cublas / 1e9:.0f} TFLOP/s")
    for bn in (int(v) for v in args.widths.split(",")):
        for kind, sweep in SWEEP.items():
            best = None
            for cfg in itertools.product(*sweep.values()):
                if kind == "swapped" and bn < 64 and cfg[0] < 64:
                    continue
                try:
                    fn = run(kind, x, w, y, bn, cfg)
                    fn()
                    torch.cuda.synchronize()
                    ms = triton.testing.do_bench(fn, warmup=5, rep=30)
                except Exception as exc:  # noqa: BLE001 - a config that doesn't fit (shared memory) is skipped
                    print(f"  {kind} BN={bn} {cfg}: {type(exc).__name__}", flush=True)
                    continue
                if best is None or ms < best[0]:
                    best = (ms, cfg)
            if best is None:
                print(f"BN={bn} {kind}: no config ran", flush=True)
                continue
            fn = run(kind, x, w, y, bn, best[1])
            y.zero_()
            fn()
            err = (y.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
            print(f"BN={bn} {kind}: best {best[0]:.3f} ms {flop / best[0] / 1e9:.0f} TFLOP/s = "
                  f"{cublas / best[0]:.0%} of cuBLAS, config (BLOCK_M, BLOCK_K, warps, stages) {best[1]}, "
                  f"rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
