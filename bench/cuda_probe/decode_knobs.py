"""Probe (an experiment, removed in the next commit): the uncut decode kernel (whole rows) with
Triton's loop knobs on Hopper: x and w through TMA descriptors, ``tl.range(..., warp_specialize=True)``
(automatic warp specialization) on the block loop, ``tl.range(..., flatten=True)`` on the unit loop
(one pipelined loop across units), each against the library's ``_decode_uncut_kernel`` over 2 x 3
configs, graph-replayed over 16 rotated layers.

Usage::

    python bench/cuda_probe/decode_knobs.py 4096x14336:1:0.25,4096x14336:64:0.25 [OUT.json]
"""
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us
from decode_units import _indices, _pow2, units_forward

from opforge.kernels.triton_compat import TensorDescriptor


@triton.jit
def _owned(row_ptr_ptr, lo, hi, n_rows, S: tl.constexpr, SEARCH: tl.constexpr):
    u_lo = 0
    u_hi = 0
    for r0 in range(0, n_rows, SEARCH):
        rr = r0 + tl.arange(0, SEARCH)
        ok = rr < n_rows
        s = tl.load(row_ptr_ptr + rr, mask=ok, other=0).to(tl.int32)
        n = tl.load(row_ptr_ptr + rr + 1, mask=ok, other=0).to(tl.int32) - s
        base = s * S
        step = tl.maximum(n, 1)
        u_lo += tl.sum(tl.where(ok, tl.where(n == 0, tl.where(base < lo, S, 0),
                                             tl.where(lo > base, tl.minimum((lo - base + step - 1) // step, S), 0)), 0), axis=0)
        u_hi += tl.sum(tl.where(ok, tl.where(n == 0, tl.where(base < hi, S, 0),
                                             tl.where(hi > base, tl.minimum((hi - base + step - 1) // step, S), 0)), 0), axis=0)
    return u_lo, u_hi


@triton.jit
def _tma_kernel(x_desc, w_desc, y_ptr, cols_ptr, row_ptr_ptr, T, N_OUT, TOTAL, CHUNK, BH: tl.constexpr,
                BW: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, SEARCH: tl.constexpr,
                BLOCK_M: tl.constexpr, WS: tl.constexpr, FLAT: tl.constexpr, STAGES: tl.constexpr):
    S: tl.constexpr = BH // SUB
    KSTEPS: tl.constexpr = BW // BLOCK_K
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.where(p == tl.num_programs(0) - 1, TOTAL + 1, lo + CHUNK)
    u_lo, u_hi = _owned(row_ptr_ptr, lo, hi, N_OUT // BH, S, SEARCH)
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, SUB)
    for u in tl.range(u_lo, u_hi, flatten=FLAT):
        r = u // S
        j = u % S
        s = tl.load(row_ptr_ptr + r).to(tl.int32)
        e = tl.load(row_ptr_ptr + r + 1).to(tl.int32)
        acc = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
        for it in tl.range(0, (e - s) * KSTEPS, num_stages=STAGES, warp_specialize=WS):
            kb = s + it // KSTEPS
            kk = (it % KSTEPS) * BLOCK_K
            wt = w_desc.load([kb * BH + j * SUB, kk])
            c = tl.load(cols_ptr + kb).to(tl.int32)
            xt = x_desc.load([0, c * BW + kk])
            acc = tl.dot(xt, wt.T, acc)
        out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + (r * BH + j * SUB + offs_h)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < T)[:, None])


@triton.jit
def _ptr_kernel(x_ptr, w_ptr, y_ptr, cols_ptr, row_ptr_ptr, T, K_IN, N_OUT, TOTAL, CHUNK, BH: tl.constexpr,
                BW: tl.constexpr, SUB: tl.constexpr, BLOCK_K: tl.constexpr, SEARCH: tl.constexpr,
                BLOCK_M: tl.constexpr, WS: tl.constexpr, FLAT: tl.constexpr, STAGES: tl.constexpr):
    S: tl.constexpr = BH // SUB
    KSTEPS: tl.constexpr = BW // BLOCK_K
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.where(p == tl.num_programs(0) - 1, TOTAL + 1, lo + CHUNK)
    u_lo, u_hi = _owned(row_ptr_ptr, lo, hi, N_OUT // BH, S, SEARCH)
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, SUB)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < T
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    for u in tl.range(u_lo, u_hi, flatten=FLAT):
        r = u // S
        j = u % S
        s = tl.load(row_ptr_ptr + r)
        e = tl.load(row_ptr_ptr + r + 1)
        acc = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
        w_unit = w_ptr + (j * SUB + offs_h)[None, :] * BW + offs_k[:, None]
        for it in tl.range(0, (e - s) * KSTEPS, num_stages=STAGES, warp_specialize=WS):
            kb = s + it // KSTEPS
            kk = (it % KSTEPS) * BLOCK_K
            wt = tl.load(w_unit + kb.to(tl.int64) * (BH * BW) + kk)
            c = tl.load(cols_ptr + kb)
            xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
            acc = tl.dot(xt, wt, acc)
        out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + (r * BH + j * SUB + offs_h)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])


def launch(kind, x, w, cols, row_ptr, n_out, waves, sms, warps, stages, ws, flat, y):
    nnz, bh, bw = w.shape
    tokens, k_in = x.shape
    sub = min(bh, 64)
    total = bh // sub * nnz
    chunk = max(1, triton.cdiv(total, waves * sms))
    programs = max(1, triton.cdiv(total, chunk))
    bm, bk = max(16, _pow2(tokens)), min(bw, 64)
    meta = dict(BH=bh, BW=bw, SUB=sub, BLOCK_K=bk, SEARCH=min(1024, max(16, _pow2(n_out // bh))), BLOCK_M=bm,
                WS=ws, FLAT=flat, STAGES=stages, num_warps=warps, num_stages=stages)
    if kind == "tma":
        xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
        wd = TensorDescriptor(w, [nnz * bh, bw], [bw, 1], [sub, bk])
        _tma_kernel[(programs,)](xd, wd, y, cols, row_ptr, tokens, n_out, total, chunk, **meta)
    else:
        _ptr_kernel[(programs,)](x, w, y, cols, row_ptr, tokens, k_in, n_out, total, chunk, **meta)
    return y


def main():
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear
    dev, dt, n = torch.device("cuda"), torch.bfloat16, 16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = []
    for spec in sys.argv[1].split(","):
        shape, t, d = spec.split(":")
        k_in, n_out = map(int, shape.split("x"))
        t, d = int(t), float(d)
        g = torch.Generator().manual_seed(1)
        mods = [BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
            n_out, k_in, d, (64, 64), generator=g)).requires_grad_(False) for _ in range(n)]
        x = torch.randn(t, k_in, device=dev, dtype=dt)
        idx = [_indices(m.layout, dev) for m in mods]
        wb = [m.weight_blocks.detach() for m in mods]
        ys = [torch.empty(t, n_out, device=dev, dtype=dt) for _ in range(n)]
        with torch.no_grad():
            ref = torch.nn.functional.linear(x, mods[0].to_dense()).float()
        res = {}
        for waves, (warps, stages) in itertools.product((3, 4), ((4, 8), (4, 4), (8, 8))):
            res[("lib", waves, warps, stages, False, False)] = graph_us(lambda: [units_forward(
                x, wb[i], *idx[i], n_out, 64, waves, sms, warps, stages, ys[i]) for i in range(n)], dev, n)
            for kind, ws, flat in (("ptr", False, True), ("tma", False, False), ("tma", True, False), ("tma", False, True),
                                   ("ptr", True, False)):
                key = (kind, waves, warps, stages, ws, flat)
                try:
                    y = launch(kind, x, wb[0], *idx[0], n_out, waves, sms, warps, stages, ws, flat, ys[0])
                    err = float((y.float() - ref).abs().max() / ref.abs().max())
                    if err > 2e-2:
                        res[key] = f"wrong {err:.2e}"
                        continue
                    res[key] = graph_us(lambda: [launch(kind, x, wb[i], *idx[i], n_out, waves, sms, warps, stages, ws,
                                                        flat, ys[i]) for i in range(n)], dev, n)
                except Exception as exc:  # noqa: BLE001
                    res[key] = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:120] if str(exc) else ''}"
        best = sorted((v, k) for k, v in res.items() if isinstance(v, float))
        print(f"== {spec}: best {best[:5]}", flush=True)
        for k, v in res.items():
            print(f"   {k}: {v if isinstance(v, str) else round(v, 2)}")
        out.append({"row": spec, "res": {str(k): v for k, v in res.items()}})
        mods = idx = wb = ys = None
        torch.cuda.empty_cache()
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
