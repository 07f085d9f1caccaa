"""Probe: one pipelined loop per decode program (issue 35). ``_decode_kernel`` runs a loop per row
its run touches: the row it hands on (head), the row it finishes (owned), and each whole row between.
Each loop fills triton's pipeline anew and drains it at the row's end, so a program whose run
crosses two rows waits for HBM twice before its stream flows, three rows three times. At density
0.1 a program's run is ~5 blocks (44 KB), a couple of round trips' worth, and the trace
(``decode_trace.py``) shows its slowest program ending its whole rows 2 µs after the median one.

``_flat_kernel`` walks its run's blocks in one loop, last block first (so the head row, which
another program waits for, comes first, as in the package's head-first order), and flushes the
accumulator where the block-row changes: a whole row is stored with its bias, the head row's sum
goes to the program's partial slot, the owned row's (the last one walked) is kept for the fix-up.
Empty rows, rare, are stored after the loop (only if the loop saw fewer rows than the program owns).

How the head row's partial is handed on (``SIGNAL``):

* ``"count"``: as the package does now: stored, then counted in with a release atomic (here after
  the loop: an atomic under a branch inside it stops triton's pipelining of the loop, no cp.async
  left in its sm_90 PTX); the owner reads the count (acquire), then the partials: two trips.
* ``"sentinel"``: the slots hold the bit pattern 0xFFFFFFFF (a NaN no GPU arithmetic makes: theirs
  is 0x7FFFFFFF) between launches; the head's partial is a plain masked store in the loop, no
  atomic, no barrier; the owner loads the partials (volatile, from L2) and takes them once none
  holds the pattern, one trip, then writes the pattern back. Each 4-byte element is its own
  signal, so no ordering between a writer's threads is needed.

Timed in the same process (same layouts, 16 rotated layers, one CUDA graph, launched as programmatic
dependents with the early L2 lines), each kernel at its best of the configs swept, with the package's
kernels: ``uncut``, ``package-flat`` and ``package-loops`` (``_decode_kernel`` with ``FLAT`` on and off,
which since this probe hands partials on in self-signalling slots up to 16 tokens) and ``before`` (the
kernel as of cc0cde5, see ``launch``). Results: docs/benchmarks.md, issue 35, sixteenth session.

Usage::

    python bench/cuda_probe/decode_flat.py [--shapes 4096x14336,14336x4096] [--densities 0.5,0.25,0.1]
        [--tokens 1,64] [--json FILE]
    TRITON_INTERPRET=1 python bench/cuda_probe/decode_flat.py --check   # against fp64 dense, CPU
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from block_sparse_decode import graph_us  # noqa: E402

from opforge.kernels.block_sparse import triton_sizing  # noqa: E402
from opforge.kernels.block_sparse.layout import BlockSparseLayout  # noqa: E402
from opforge.kernels.block_sparse.triton_decode import _decode_kernel, _decode_store, _decode_uncut_kernel  # noqa: E402

SENT_BITS = -1  # 0xFFFFFFFF as int32
SENT = tl.constexpr(SENT_BITS)


@triton.jit
def _flat_start(w_ptr, lo, hi, BLOCK: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr):
    """As ``_decode_start``, but the lines asked into L2 early are the run's last (walked first)."""
    if EARLY > 0:
        if hi > lo:
            per_line: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth
            lines = tl.minimum(tl.arange(0, EARLY), (hi - lo) * (BLOCK // per_line) - 1)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                      [w_ptr + hi.to(tl.int64) * BLOCK - (lines + 1) * per_line], dtype=tl.int32,
                                      is_pure=False, pack=1)
    if OVERLAP:
        gdc_wait()


@triton.jit
def _flat_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, rows_ptr, T, K_IN, N_OUT,
                 NNZ, CHUNK, BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_K: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_M: tl.constexpr,
                 SIGNAL: tl.constexpr, BRANCH: tl.constexpr = False):
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.minimum(lo + CHUNK, NNZ)
    n_rows = N_OUT // BH
    _flat_start(w_ptr, lo, hi, BH * BW, EARLY, OVERLAP)
    has = hi > lo
    before = tl.load(rows_ptr + lo - 1, mask=has & (lo > 0), other=-1).to(tl.int32)
    r_lo = tl.load(rows_ptr + lo, mask=has, other=-1).to(tl.int32)
    r_hi = tl.load(rows_ptr + hi - 1, mask=has, other=-1).to(tl.int32)
    after = tl.load(rows_ptr + hi, mask=has & (hi < NNZ), other=-1).to(tl.int32)
    began = has & (before == r_lo)
    head = has & (after == r_hi)
    first = tl.where(began, r_lo, before + 1)
    end = tl.where(hi >= NNZ, n_rows, r_hi + 1)
    owned = began & ~(head & (r_hi == r_lo))
    q0 = tl.load(row_ptr_ptr + r_lo, mask=owned, other=0).to(tl.int32) // CHUNK  # the row's first program
    KSTEPS: tl.constexpr = BW // BLOCK_K
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < T
    tile = offs_m.to(tl.int64)[:, None] * BH + offs_h[None, :]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    slot = part_ptr + p.to(tl.int64) * T * BH + tile
    acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    seen = 0
    for it in range(0, (hi - lo) * KSTEPS):
        kb = hi - 1 - it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        wt = tl.load(w_ptr + kb.to(tl.int64) * (BH * BW) + (kk + offs_k)[:, None] + offs_h[None, :] * BW)
        c = tl.load(cols_ptr + kb)
        xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
        r = tl.load(rows_ptr + kb).to(tl.int32)
        nxt = tl.load(rows_ptr + kb - 1, mask=kb > lo, other=-1).to(tl.int32)  # the block walked next
        ends = ((it % KSTEPS) == KSTEPS - 1) & (nxt != r)
        is_head = head & (r == r_hi)
        is_owned = owned & (r == r_lo)
        if BRANCH:
            if ends:
                if is_head:
                    tl.store(slot, acc.to(tl.int32, bitcast=True), mask=m_ok[:, None])
                elif not is_owned:
                    _decode_store(y_ptr, b_ptr, acc, r, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
                seen += 1
                if not is_owned:
                    acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
        else:
            whole = ends & ~is_head & ~is_owned
            out = acc
            if HAS_BIAS:
                out += tl.load(b_ptr + r * BH + offs_h, mask=whole & (offs_h < BH), other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + (r * BH + offs_h)[None, :],
                     out.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & whole)
            tl.store(slot, acc.to(tl.int32, bitcast=True), mask=m_ok[:, None] & (ends & is_head))
            seen += ends.to(tl.int32)
            acc = tl.where(ends & ~is_owned, 0.0, acc)
    if SIGNAL == "count":  # after the loop: an atomic under a branch in it stops triton's pipelining
        if head:
            tl.debug_barrier()  # every thread's partial is stored before the count says so
            tl.atomic_add(count_ptr + r_hi, 1, sem="release")
    if OVERLAP:
        gdc_launch_dependents()
    if seen < end - first:  # empty rows among the program's own: the bias alone
        for r in range(first, end):
            if tl.load(row_ptr_ptr + r) == tl.load(row_ptr_ptr + r + 1):
                _decode_store(y_ptr, b_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32), r, T, N_OUT, BH, HAS_BIAS,
                              BLOCK_M)
    if owned:
        parts = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
        if SIGNAL == "sentinel":
            for q in range(q0, p):  # slot by slot, in program order; a slot still (partly) empty is read again
                v = tl.load(part_ptr + q * T * BH + tile, mask=m_ok[:, None], other=0, volatile=True)
                while tl.sum(tl.sum((v == SENT).to(tl.int32), axis=1), axis=0) > 0:
                    v = tl.load(part_ptr + q * T * BH + tile, mask=m_ok[:, None], other=0, volatile=True)
                parts += v.to(tl.float32, bitcast=True)
            _decode_store(y_ptr, b_ptr, parts + acc, first, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
            for q in range(q0, p):
                tl.store(part_ptr + q * T * BH + tile, tl.full((BLOCK_M, BH), SENT, tl.int32), mask=m_ok[:, None])
        else:
            n_in = tl.atomic_add(count_ptr + first, 0, sem="acquire")
            while n_in < p - q0:
                n_in = tl.atomic_add(count_ptr + first, 0, sem="acquire")
            for q in range(q0, p):
                parts += tl.load(part_ptr + q * T * BH + tile, mask=m_ok[:, None], other=0,
                                 cache_modifier=".cg").to(tl.float32, bitcast=True)
            _decode_store(y_ptr, b_ptr, parts + acc, first, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
            tl.atomic_xchg(count_ptr + first, 0)


def launch(kind, grid, x, w, b, y, part, counts, idx, tokens, k_in, n_out, nnz, chunk, bh, bw, prec, early, overlap,
           block_m, warps, stages, has_bias=False):
    common = dict(BH=bh, BW=bw, HAS_BIAS=has_bias, PRECISION=prec, BLOCK_K=min(bw, 64), EARLY=early, OVERLAP=overlap,
                  BLOCK_M=block_m, num_warps=warps, num_stages=stages)
    if overlap:
        common["launch_pdl"] = True
    if kind == "uncut":  # the package's kernel that cuts no row (64-blocks: a unit is a whole row); chunk: units
        common.pop("EARLY")
        _decode_uncut_kernel[grid](x, w, b, y, idx.cols, idx.row_ptr, tokens, k_in, n_out, nnz, chunk, SUB=bh,
                                   SEARCH=triton_sizing.decode_search(n_out // bh), WAVES=0, **common)
    elif kind == "before":  # the package's kernel as of an earlier commit (cc0cde5: count and partials, loops per
        # row; since 25b69d4 with slots up to 16 tokens): not kept in the tree; make it with `git show
        # REV:opforge/kernels/block_sparse/triton_decode.py | sed 's/from \.\.triton_compat/from
        # opforge.kernels.triton_compat/' > bench/cuda_probe/_decode_before.py`
        from _decode_before import _decode_kernel as before
        slotted = "FLAT" in before.arg_names and tokens <= triton_sizing.DECODE_SLOT_TOKENS  # a kernel with slots
        before[grid](x, w, b, y, part if slotted else part.view(torch.float32), counts, idx.cols, idx.row_ptr, idx.rows, tokens, k_in,
                     n_out, nnz, chunk, WAVES=0, **({"FLAT": False} if "FLAT" in before.arg_names else {}), **common)
    elif kind.startswith("package"):  # the package's kernel: slots, one loop (flat) or a loop per row (loops)
        slots = tokens <= triton_sizing.DECODE_SLOT_TOKENS  # else fresh fp32 partials and counts
        _decode_kernel[grid](x, w, b, y, part if slots else part.view(torch.float32), counts, idx.cols, idx.row_ptr,
                             idx.rows, tokens, k_in, n_out, nnz, chunk, WAVES=0, FLAT=kind == "package-flat", **common)
    else:
        _flat_kernel[grid](x, w, b, y, part, counts, idx.cols, idx.row_ptr, idx.rows, tokens, k_in, n_out, nnz, chunk,
                           SIGNAL=kind.split("-")[1], BRANCH=not kind.endswith("-masked"), **common)


KINDS = ("uncut", "before", "package-flat", "package-loops", "flat-count", "flat-sentinel", "flat-sentinel-masked")
"""``-masked``: the flush at a row's end as masked stores and a select every block, no branch (slower at
T=64 on the H100: the tile's layout is converted for a store every block); else under a branch."""


def check(seed: int = 0, layouts: int = 14) -> None:
    """``--check`` (``TRITON_INTERPRET=1``): both flat kernels against fp64 dense, with and without a
    bias, on tiny random layouts (an empty one, empty rows, full rows), every run length, and 16x32
    blocks walked in two k-steps; the slots must hold the pattern again and the counts zero after."""
    g = torch.Generator().manual_seed(seed)
    bad = runs = 0
    for i in range(layouts):
        grid = (int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g)))
        dens = 0.0 if i == 0 else 1.0 if i == 1 else torch.rand(1, generator=g).item()
        mask = torch.rand(grid, generator=g) < dens
        bw = 32 if i % 3 == 2 else 16
        lay = BlockSparseLayout(mask, (16, bw))
        idx, (n_out, k_in) = lay.indices(), lay.shape
        tokens = int(torch.randint(1, 4, (1,), generator=g))
        x = torch.randn(tokens, k_in, generator=g)
        w = torch.randn(lay.nnz, 16, bw, generator=g)
        b = torch.randn(n_out, generator=g)
        for has_bias in (False, True):
            ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0.0)
            for chunk in range(1, lay.nnz + 2):
                programs = max(1, -(-lay.nnz // chunk))
                for kind in [k for k in KINDS if k.startswith("flat")]:
                    y = torch.full((tokens, n_out), float("nan"))
                    part = torch.full((programs, tokens, 16), SENT_BITS, dtype=torch.int32)
                    counts = torch.zeros(grid[0], dtype=torch.int32)
                    launch(kind, (programs,), x, w, b, y, part, counts, idx, tokens, k_in, n_out, lay.nnz, chunk, 16,
                           bw, "ieee", 0, False, 16, 4, 2, has_bias)
                    runs += 1
                    err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
                    if not err <= 1e-4 * max(1.0, ref.abs().max().item()) or counts.any() or (
                            "sentinel" in kind and (part != SENT_BITS).any()):
                        bad += 1
                        print(f"layout {i} {mask.int().tolist()} bw {bw} chunk {chunk} {kind} bias {has_bias}: "
                              f"err {err}, counts {counts.tolist()}, slots reset {(part == SENT_BITS).all().item()}")
    print(f"{'ok' if not bad else f'{bad} bad'}: {runs} runs over {layouts} layouts")


def time_row(k_in, n_out, tokens, density, args, dev) -> dict:
    dt, n = torch.bfloat16, args.layers
    g = torch.Generator().manual_seed(0)
    lays = [BlockSparseLayout.random(n_out, k_in, density, (64, 64), generator=g) for _ in range(n)]
    idx = [lay.indices(dev) for lay in lays]
    ws = [torch.randn(lay.nnz, 64, 64, device=dev, dtype=dt) for lay in lays]
    x = torch.randn(tokens, k_in, device=dev, dtype=dt)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ys = [torch.empty(tokens, n_out, device=dev, dtype=dt) for _ in range(n)]
    counts = [torch.zeros(n_out // 64, dtype=torch.int32, device=dev) for _ in range(n)]
    parts = {k: torch.full((8 * sms + 8, tokens, 64), SENT_BITS, dtype=torch.int32, device=dev) for k in KINDS}
    early, overlap = triton_sizing.decode_start(dev)
    block_m = max(16, triton_sizing.pow2(tokens))
    refs = [x.float() @ lays[i].scatter(ws[i].float()).t() for i in (0, n - 1)]
    dense_w = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(n)]
    dense_us = graph_us(lambda: [torch.nn.functional.linear(x, dw) for dw in dense_w], dev, n)
    row = {"in": k_in, "out": n_out, "tokens": tokens, "density": density, "dense_us": dense_us}
    dense_w.clear()
    for kind in args.kinds.split(","):
        best = None
        for waves in map(int, args.waves.split(",")):
            for pipe in args.pipes.split(","):
                warps, stages = map(int, pipe.split("x"))
                chunks = [triton_sizing.decode_chunk(lay.nnz, waves, sms) for lay in lays]

                def layers(kind=kind, chunks=chunks, warps=warps, stages=stages):
                    for i in range(n):
                        chunk, progs = chunks[i]
                        launch(kind, (progs,), x, ws[i], ws[i], ys[i], parts[kind], counts[i], idx[i], tokens, k_in, n_out,
                               lays[i].nnz, chunk, 64, 64, "tf32", early, overlap, block_m, warps, stages)
                try:
                    us = graph_us(layers, dev, n)
                except Exception as exc:  # noqa: BLE001 - a config that doesn't compile: reported
                    print(f"  {kind} waves {waves} {pipe}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                for j, i in enumerate((0, n - 1)):
                    torch.testing.assert_close(ys[i].float(), refs[j], atol=0.05 * refs[j].abs().max().item(),
                                               rtol=0.02)
                assert not any(c.any() for c in counts), kind
                assert not ("sentinel" in kind or (kind.startswith("package") and tokens <= 16)) or bool((parts[kind] == SENT_BITS).all()), "slots not reset"
                row.setdefault("all", []).append({"kind": kind, "waves": waves, "pipe": pipe, "us": us})
                if best is None or us < best[0]:
                    best = (us, waves, pipe)
        row[kind] = {"us": best[0], "waves": best[1], "pipe": best[2], "x_dense": row["dense_us"] / best[0]}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--waves", default="1,2,3,4")
    ap.add_argument("--pipes", default="4x4,4x8")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true", help="against dense on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check:
        return check()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "config": vars(args), "rows": []}
    print(res["device"], "GPU us per layer (graph, 16 rotated layers); each kind at its best config", flush=True)
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            for d in map(float, args.densities.split(",")):
                r = time_row(k_in, n_out, t, d, args, dev)
                res["rows"].append(r)
                print(f"{k_in}->{n_out} T={t} d={d}: dense {r['dense_us']:.1f}; "
                      + "; ".join(f"{k} {r[k]['us']:.1f} ({r[k]['x_dense']:.2f}x, w{r[k]['waves']} {r[k]['pipe']})"
                                  for k in args.kinds.split(",") if k in r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
