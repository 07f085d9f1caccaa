"""Probe (issue 35, T=2048): can a forward program that owns two neighbouring block-rows beat the
one-block-wide ceiling of ``narrow_tiles.py``?

A forward program owns a (tokens x BH) tile of y and reads an x tile for every kept block of its
row, so each x tile feeds BH outputs only: with 64-blocks at density 0.5 that design reaches 0.98x
dense at T=2048 on the H100, under a measured ceiling of 1.10x. Two neighbouring block-rows of an
unstructured layout share about d of their columns (a quarter at d=0.5): a program owning both reads
the x tile of a shared column once for two blocks. Variants, each against dense ``F.linear`` and
opforge's forward in the same run:

* ``pair3``: opforge's ``_fwd_pair_kernel`` (this probe's own copy until it was adopted): three loops, no branch: the columns both rows keep (x tile once, two MMAs), then those
  only the first keeps, then those only the second keeps. x tiles read: the union of the two rows'
  columns (0.75 of today's at d=0.5); MMAs: the kept blocks only.
* ``pair1``: one loop over the union, both MMAs every step, the absent block read as zeros: the
  (BLOCK_M x 2 BH) tile of a 128-wide matmul, at 1.5x the MMAs at d=0.5.

Usage::

    python bench/cuda_probe/paired_rows.py [--shape 2048x4096x4096] [--density 0.5] [--blocks 64]
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from opforge.kernels.block_sparse.pairs import pair_lists
from opforge.kernels.block_sparse.triton_kernels import _fwd_pair_kernel


@triton.jit
def _pair_tile(n_pairs, T, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    n_m = tl.cdiv(T, BLOCK_M)
    per_group = GROUP_M * n_pairs
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    return (pid % per_group) // size_m, first_m + (pid % per_group) % size_m


@triton.jit
def _pair1(x_desc, w_desc, y_ptr, seg_ptr, pcol_ptr, pia_ptr, pib_ptr, T, N_OUT, n_pairs,
           BH: tl.constexpr, BW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One loop over the union (pia / pib: -1 where the row lacks the column)."""
    p, pid_m = _pair_tile(n_pairs, T, BLOCK_M, GROUP_M)
    KS: tl.constexpr = BW // BLOCK_K
    m0 = pid_m * BLOCK_M
    s0 = tl.load(seg_ptr + 4 * p)
    s3 = tl.load(seg_ptr + 4 * p + 3)
    acc_a = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    for it in range(s0 * KS, s3 * KS):
        e = it // KS
        kk = (it % KS) * BLOCK_K
        c = tl.load(pcol_ptr + e)
        ia = tl.load(pia_ptr + e)
        ib = tl.load(pib_ptr + e)
        xt = x_desc.load([m0, c * BW + kk])
        wa = w_desc.load([tl.maximum(ia, 0) * BH, kk])
        wb = w_desc.load([tl.maximum(ib, 0) * BH, kk])
        wa = tl.where(ia >= 0, wa, tl.zeros_like(wa))
        wb = tl.where(ib >= 0, wb, tl.zeros_like(wb))
        acc_a = tl.dot(xt, wa.T, acc_a)
        acc_b = tl.dot(xt, wb.T, acc_b)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    rows = offs_m.to(tl.int64)[:, None] * N_OUT
    ok = (offs_m < T)[:, None]
    tl.store(y_ptr + rows + (2 * p * BH + offs_h)[None, :], acc_a.to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + rows + ((2 * p + 1) * BH + offs_h)[None, :], acc_b.to(y_ptr.dtype.element_ty), mask=ok)


def union_lists(cols: torch.Tensor, row_ptr: torch.Tensor):
    """(seg, pcol, pia, pib) for ``_pair1``: one union list per pair of rows (2p, 2p+1), -1 where a
    row lacks the column (seg[4p] and seg[4p+3] bound it)."""
    device = cols.device
    cols, row_ptr = cols.tolist(), row_ptr.tolist()
    seg, pcol, pia, pib = [], [], [], []
    for p in range((len(row_ptr) - 1) // 2):
        a = {cols[i]: i for i in range(row_ptr[2 * p], row_ptr[2 * p + 1])}
        b = {cols[i]: i for i in range(row_ptr[2 * p + 1], row_ptr[2 * p + 2])}
        union = sorted(a.keys() | b.keys())
        start = len(pcol)
        pcol += union
        pia += [a.get(c, -1) for c in union]
        pib += [b.get(c, -1) for c in union]
        seg += [start, start, start, len(pcol)]
    return tuple(torch.tensor(v, dtype=torch.int32, device=device) for v in (seg, pcol, pia, pib))


def run_pair(kernel, x, w, lists, n_out, bm, bk, warps, stages):
    """``kernel`` (``_pair1``, or opforge's ``_fwd_pair_kernel`` for the three runs) on ``lists``."""
    nnz, bh, bw = w.shape
    T = x.shape[0]
    y = torch.empty(T, n_out, dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    w2 = w.view(-1, bw)
    w_desc = TensorDescriptor(w2, list(w2.shape), list(w2.stride()), [bh, bk])
    n_pairs = n_out // bh // 2
    grid = (n_pairs * triton.cdiv(T, bm),)
    meta = dict(BH=bh, BW=bw, BLOCK_M=bm, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
    if kernel is _fwd_pair_kernel:  # no bias; T_BUCKET, L2_ROWS (no cap on the group), DEPTH
        kernel[grid](x_desc, w_desc, y, y, *lists, T, n_out, 0, 1 << 20, 0, HAS_BIAS=False, PRECISION="tf32", **meta)
    else:
        kernel[grid](x_desc, w_desc, y, *lists, T, n_out, n_pairs, **meta)
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2048x4096x4096", help="T x in x out")
    ap.add_argument("--density", type=float, default=0.5)
    ap.add_argument("--blocks", type=int, default=64)
    args = ap.parse_args()
    T, k_in, n_out = map(int, args.shape.split("x"))
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    torch.manual_seed(0)
    dt, b = torch.bfloat16, args.blocks
    layout = BlockSparseLayout.random(n_out, k_in, args.density, (b, b), generator=torch.Generator().manual_seed(1))
    lin = BlockSparseLinear(k_in, n_out, bias=False, device="cuda", dtype=dt, layout=layout).requires_grad_(False)
    x = torch.randn(T, k_in, device="cuda", dtype=dt)
    w = lin.weight_blocks.detach()
    idx = layout.indices("cuda")
    cols, row_ptr = idx.cols, idx.row_ptr
    ref = F.linear(x.float(), lin.to_dense().float())
    wd = torch.randn(n_out, k_in, device="cuda", dtype=dt)
    bench = lambda f: triton.testing.do_bench_cudagraph(f, rep=200)  # noqa: E731
    t_dense = bench(lambda: F.linear(x, wd))
    t_ours = bench(lambda: lin(x))
    print(f"T={T} {k_in}->{n_out} {b}-blocks d={args.density}: dense {t_dense * 1e3:.1f} us, "
          f"opforge {t_ours * 1e3:.1f} us ({t_dense / t_ours:.2f}x)")
    grid_r, grid_c = n_out // b, k_in // b
    for name, kernel, lists in (("pair3", _fwd_pair_kernel, pair_lists(cols, row_ptr, grid_r, grid_c)),
                                ("pair1", _pair1, union_lists(cols, row_ptr))):
        best = None
        for bm, bk, warps, stages in itertools.product((128, 256), (64,), (4, 8), (3, 4, 5)):
            if bm == 256 and warps == 4:
                continue
            try:
                y = run_pair(kernel, x, w, lists, n_out, bm, bk, warps, stages)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - out of shared memory for this config
                print(f"  {name} {bm}x{bk} w{warps} s{stages}: {type(exc).__name__}")
                continue
            err = (y.float() - ref).abs().max().item()
            assert err < 0.05 * ref.abs().max().item() + 1e-2, (name, err)
            t = bench(lambda: run_pair(kernel, x, w, lists, n_out, bm, bk, warps, stages))
            if best is None or t < best[0]:
                best = (t, bm, bk, warps, stages)
        t, *cfg = best
        print(f"  {name}: {t * 1e3:.1f} us ({t_dense / t:.2f}x dense, {t_ours / t:.2f}x opforge) config {cfg}")


if __name__ == "__main__":
    main()
