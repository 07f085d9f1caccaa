"""Probe: the floor of a decode layer at T > 1, with the traffic and the math the op can't avoid
(issue 35). ``decode_read_floor.py``'s bare read streams the kept blocks' bytes and nothing else;
that is the floor at T=1, where x is a few KB. At T tokens, every kept block (BH x BW) has to meet
its slice of x, T x BW, on the SM: with 64-blocks at T=64 that slice is as many bytes as the block
itself. The slices come from L2 (x is 0.5-1.8 MB), but they go through the same load path and the
same shared-memory pipeline as the weight. So this probe measures the same stream with the x
slices in it, and the tensor-core products:

* ``_mma_floor_kernel``: program ``p`` takes an equal share of the kept blocks (``CHUNK`` of them,
  whatever rows they fall in), and for each block loads it, reads its column from ``cols`` and the
  x slice there, and adds ``x_slice @ block^T`` into one fp32 tile. It stores that tile. There is no
  row to find, nothing cut, no partials, no count: the products of a perfectly balanced decode
  kernel, and nothing else;
* **x each block** (``XMODE=0``): as above, the op's real traffic;
* **x once** (``XMODE=1``): the x slice of the first column, loaded once and used for every block:
  the same stream and math without x's traffic. The gap between the two is what moving x costs.

Both are launched as the decode kernels are (programmatic dependents, the share's first lines asked
into L2 before the wait), graph-replayed over ``--layers`` rotated layers (their own blocks and
cols), at the best of a sweep of programs per SM, warps and pipeline stages. Beside them, in the same
process: dense ``F.linear``, the bare read of the same bytes (``decode_read_floor.read_floor``) and
opforge's ``BlockSparseLinear``, as routed. The sum of the programs' tiles of the last layer is
checked against fp32 torch (the same products, gathered).

Usage::

    python bench/cuda_probe/decode_mma_floor.py [--shapes 4096x14336,14336x4096] [--tokens 16,64]
        [--densities 0.5,0.25,0.1] [--layers 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us, issue_rows, probe_args
from decode_read_floor import read_floor


@triton.jit
def _mma_floor_kernel(x_ptr, w_ptr, cols_ptr, out_ptr, NNZ, CHUNK, K_IN, T, BH: tl.constexpr, BW: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, XMODE: tl.constexpr, EARLY: tl.constexpr,
                      ctr_ptr=None, BASE=0, GRAIN=1, GRAINS=0, DYNAMIC: tl.constexpr = False):
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.minimum(lo + CHUNK, NNZ)
    if hi > lo:  # the share's first EARLY lines into L2, then the wait (as _decode_start)
        lines = tl.minimum(tl.arange(0, EARLY), (hi - lo) * (BH * BW // 64) - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                  [w_ptr + lo.to(tl.int64) * (BH * BW) + lines * 64], dtype=tl.int32,
                                  is_pure=False, pack=1)
    gdc_wait()
    acc = _mma_run(x_ptr, w_ptr, cols_ptr, lo, hi, K_IN, T, tl.zeros((BLOCK_M, BH), dtype=tl.float32), BH, BW,
                   BLOCK_K, BLOCK_M, XMODE)
    if DYNAMIC:  # then grains of GRAIN blocks from BASE on, from a counter, until none are left
        g = tl.atomic_add(ctr_ptr, 1, sem="relaxed")
        while g < GRAINS:
            nxt = tl.atomic_add(ctr_ptr, 1, sem="relaxed")
            a = BASE + g * GRAIN
            acc = _mma_run(x_ptr, w_ptr, cols_ptr, a, tl.minimum(a + GRAIN, NNZ), K_IN, T, acc, BH, BW, BLOCK_K,
                           BLOCK_M, XMODE)
            g = nxt
        if tl.atomic_add(ctr_ptr + 1, 1, sem="relaxed") == tl.num_programs(0) - 1:  # the last out zeroes it
            tl.atomic_xchg(ctr_ptr, 0, sem="relaxed")
            tl.atomic_xchg(ctr_ptr + 1, 0, sem="relaxed")
    gdc_launch_dependents()
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    tl.store(out_ptr + p * (BLOCK_M * BH) + offs_m[:, None] * BH + offs_h[None, :], acc)


@triton.jit
def _mma_run(x_ptr, w_ptr, cols_ptr, lo, hi, K_IN, T, acc, BH: tl.constexpr, BW: tl.constexpr, BLOCK_K: tl.constexpr,
             BLOCK_M: tl.constexpr, XMODE: tl.constexpr):
    """``acc`` plus the products of blocks ``lo`` to ``hi`` with their x slices."""
    KSTEPS: tl.constexpr = BW // BLOCK_K
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    if XMODE == 1:
        x_once = tl.load(x_rows + offs_k[None, :], mask=(offs_m < T)[:, None], other=0.0)
    for it in range(0, (hi - lo) * KSTEPS):
        kb = lo + it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        wt = tl.load(w_ptr + kb.to(tl.int64) * (BH * BW) + (kk + offs_k)[:, None] + offs_h[None, :] * BW)
        if XMODE == 0:
            c = tl.load(cols_ptr + kb)
            xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=(offs_m < T)[:, None], other=0.0)
        else:
            xt = x_once
        acc = tl.dot(xt, wt, acc)
    return acc


SWEEP = tuple((waves, warps, stages) for waves in (1, 2, 4) for warps in (4, 8) for stages in (3, 4, 6))


def mma_floor(x, blocks: list, cols: list, dev, n: int, xmode: int, bh: int = 64, bw: int = 64, sweep=SWEEP,
              dynamic: tuple[float, int] | None = None) -> tuple[float, str]:
    """The fastest graph-replayed µs per layer of ``_mma_floor_kernel`` over ``blocks`` (each (nnz,
    bh, bw)) and ``cols`` in turn, over ``sweep``, and the config; the last layer's sum is checked.
    ``dynamic`` (static fraction, grain in blocks): each program's static share is that fraction of
    an equal share, and the rest is taken a grain at a time from a counter (``--dynamic``)."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    t, k_in = x.shape
    nnz = blocks[0].shape[0]
    block_m = max(16, triton.next_power_of_2(t))
    best = (float("inf"), "")
    for waves, warps, stages in sweep:
        programs = waves * sms
        chunk = -(-nnz // programs)
        extra = {}
        if dynamic:
            chunk = int(nnz * dynamic[0]) // programs
            base = chunk * programs
            extra = dict(BASE=base, GRAIN=dynamic[1], GRAINS=-(-(nnz - base) // dynamic[1]), DYNAMIC=True)
        outs = [torch.empty(programs, block_m, bh, device=dev) for _ in blocks]
        ctrs = [torch.zeros(2, dtype=torch.int32, device=dev) for _ in blocks]

        def layer(w, c, o, k):
            _mma_floor_kernel[(programs,)](x, w, c, o, nnz, chunk, k_in, t, BH=bh, BW=bw, BLOCK_K=64,  # noqa: B023
                                           BLOCK_M=block_m, XMODE=xmode, EARLY=128, num_warps=warps,  # noqa: B023
                                           num_stages=stages, launch_pdl=True, ctr_ptr=k, **extra)  # noqa: B023
        us = graph_us(lambda: [layer(*a) for a in zip(blocks, cols, outs, ctrs)], dev, n)  # noqa: B023
        if any(int(k.abs().sum()) for k in ctrs):
            raise AssertionError("a counter was not zeroed by the last program out")
        w, c = blocks[-1].float(), cols[-1].long()
        if xmode == 0:
            xs = x.float().view(t, k_in // bw, bw)[:, c]  # (t, nnz, bw): each block's slice
            ref = torch.einsum("tnk,nhk->th", xs, w)
        else:
            ref = x.float()[:, :bw] @ w.sum(0).t()
        got = outs[-1].sum(0)[:t]
        err = (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())
        if err > 1e-2:
            raise AssertionError(f"the floor kernel's sum is off by {err:.2e} (relative)")
        if us < best[0]:
            best = (us, f"{waves}/SM w{warps} s{stages}")
    return best


def main() -> None:
    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--json")
    ap.add_argument("--dynamic", default="",
                    help="also x each block with the tail handed out on demand: static fraction:grain (blocks), "
                         "comma-separated, each at the static kernel's best config and its neighbours in waves")
    ap.add_argument("--no-once", action="store_true", help="skip x once (and the bare read)")
    ap.set_defaults(tokens="16,64")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": []}
    print(f"{out['device']}, bf16, 64-blocks, {n} layers rotated, graph-replayed, µs per layer")
    for row in issue_rows(args, dev, dt):
        x, mods = row.pop("x"), row.pop("mods")
        row.pop("weights")
        nnz = round(row["density"] * (row["out"] // 64) * (row["in"] // 64))
        blocks = [torch.randn(nnz, 64, 64, device=dev, dtype=dt) for _ in range(n)]
        cols = [torch.randint(0, row["in"] // 64, (nnz,), device=dev, dtype=torch.int32) for _ in range(n)]
        if not args.no_once:
            row["read_us"], row["read_config"] = read_floor([b.view(-1) for b in blocks], dev, n, overlap=True)
            row["x_once_us"], row["x_once_config"] = mma_floor(x, blocks, cols, dev, n, 1)
        row["x_each_us"], row["x_each_config"] = mma_floor(x, blocks, cols, dev, n, 0)
        if args.dynamic:
            waves, warps, stages = row["x_each_config"].split()
            waves, warps, stages = int(waves.split("/")[0]), int(warps[1:]), int(stages[1:])
            near = [(v, warps, stages) for v in (waves, 2 * waves) if v <= 4] + [(waves, w, s) for w in (4, 8)
                                                                                 for s in (3, 4) if w != warps]
            row["dynamic"] = {}
            for spec in args.dynamic.split(","):
                frac, grain = spec.split(":")
                us, cfg = mma_floor(x, blocks, cols, dev, n, 0, sweep=tuple(near), dynamic=(float(frac), int(grain)))
                row["dynamic"][spec] = (us, cfg)
            print("  dynamic: " + "; ".join(f"{k} {v[0]:.1f} ({v[1]})" for k, v in row["dynamic"].items())
                  + f" against static {row['x_each_us']:.1f} ({row['x_each_config']})", flush=True)
        blocks = cols = None
        with torch.no_grad():
            row["opforge_us"] = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
        mods = None
        torch.cuda.empty_cache()
        out["rows"].append(row)
        d = row["dense_us"]
        once = "" if args.no_once else (
            f"; read {row['read_us']:.1f} ({d / row['read_us']:.2f}x); mma, x once {row['x_once_us']:.1f} "
            f"({d / row['x_once_us']:.2f}x, {row['x_once_config']})")
        print(f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: dense {d:.1f}{once}; mma, x each block "
              f"{row['x_each_us']:.1f} ({d / row['x_each_us']:.2f}x, {row['x_each_config']}); opforge {row['opforge_us']:.1f} ({d / row['opforge_us']:.2f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
