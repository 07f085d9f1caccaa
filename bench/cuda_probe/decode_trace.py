"""Probe: where a decode layer's time goes, program by program (issue 35). Since the fifteenth
session the decode kernels' floor is measured (``decode_read_floor.py``): a bare read of the same
bytes, launched as they are, takes 5.9 µs a layer at density 0.1 where ``_decode_kernel`` takes
8.9-10; over the densities the kernel streams as fast as the read and loses a fixed ~3.4 µs a
layer. Its layout search was not it (the search is gone, the time stayed). This probe times the
steps of each program of each layer with the GPU's global timer:

* ``_traced_kernel`` is ``triton_decode._decode_kernel``'s body (its helpers imported, not copied)
  with a stamp (``%globaltimer``, ns; each stamp waits for the value it names, so it marks when
  that value is in) at: 0 entry; 1 after ``_decode_start`` (the wait for the layer before);
  2 the rows found (``rows`` read); 3 the first cut row's sum in (owned or head); 4 the whole rows
  done (``launch_dependents``); 6 the earlier programs' count seen (owners); 5 the end (the owned row's
  fix-up stored); ``--head-first``, ``--early-parts`` and ``--last-sums`` change how cut rows are
  finished (the package's kernel is head first since this probe);
* 16 rotated layers (64-blocks, random layouts, no bias), launched as the package launches them
  (programmatic dependents, early L2 lines) with the config given, captured in one CUDA graph and
  replayed; the stamps of the last replay are read.

Per layer (the median over layers 2-15): the period (one layer's first entry to the next's), the
span (first entry to last end), when the wait lets the programs go, and each step's median and
slowest program; then the gap between a layer's last end and the next layer's first release.

Usage::

    python bench/cuda_probe/decode_trace.py [--shapes 4096x14336,14336x4096] [--densities 0.5,0.1]
        [--tokens 1] [--waves 2] [--warps 4] [--stages 8] [--head-first] [--early-parts] [--last-sums]
        [--json FILE]
    TRITON_INTERPRET=1 python bench/cuda_probe/decode_trace.py --check   # the kernel against dense, CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from block_sparse_decode import graph_us  # noqa: E402

from opforge.kernels.block_sparse import triton_sizing  # noqa: E402
from opforge.kernels.block_sparse.layout import BlockSparseLayout  # noqa: E402
from opforge.kernels.block_sparse.triton_decode import _decode_run, _decode_start, _decode_store  # noqa: E402

STEPS = ("entry", "released", "rows found", "first cut row", "whole rows", "end")


STAMP = os.environ.get("TRITON_INTERPRET") != "1"  # --check runs in triton's interpreter: no timer there


@triton.jit
def _now(dep, ON: tl.constexpr = STAMP):
    """The global timer (ns) once ``dep`` (an int32 scalar) is in (0 in the interpreter)."""
    if ON:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [dep], dtype=tl.int64,
                                         is_pure=False, pack=1)
    else:
        return dep.to(tl.int64) * 0


@triton.jit
def _traced_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, rows_ptr, trace_ptr, T,
                   K_IN, N_OUT, NNZ, CHUNK, BH: tl.constexpr, BW: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_K: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_M: tl.constexpr,
                   HEAD_FIRST: tl.constexpr = False, EARLY_PARTS: tl.constexpr = False,
                   LAST_SUMS: tl.constexpr = False, REVERSE: tl.constexpr = False,
                   PARTS_AT_ONCE: tl.constexpr = False, LATE_TRIGGER: tl.constexpr = False):
    p = tl.program_id(0)
    if REVERSE:  # --check with --last-sums: the interpreter runs programs in order; this makes the last to count in another
        p = tl.num_programs(0) - 1 - p
    stamps = trace_ptr + p.to(tl.int64) * 9
    tl.store(stamps, _now(p))
    lo = p * CHUNK
    hi = tl.minimum(lo + CHUNK, NNZ)
    n_rows = N_OUT // BH
    _decode_start(w_ptr, lo, hi, BH * BW, EARLY, OVERLAP)
    tl.store(stamps + 1, _now(p))
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
    tl.store(stamps + 2, _now(first + end))
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    m_ok = offs_m < T
    tile = offs_m.to(tl.int64)[:, None] * BH + offs_h[None, :]
    mine = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    cut = tl.zeros((), dtype=tl.float32)
    if owned and not HEAD_FIRST:
        mine = _decode_run(x_ptr, w_ptr, cols_ptr, mine, lo, tl.load(row_ptr_ptr + r_lo + 1), T, K_IN, BH, BW,
                           PRECISION, BLOCK_K, BLOCK_M)
        cut += tl.sum(tl.sum(mine, axis=1), axis=0)
    if head:
        acc = _decode_run(x_ptr, w_ptr, cols_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32),
                          tl.maximum(tl.load(row_ptr_ptr + r_hi), lo), hi, T, K_IN, BH, BW, PRECISION, BLOCK_K,
                          BLOCK_M)
        cut += tl.sum(tl.sum(acc, axis=1), axis=0)
        if LAST_SUMS:
            _hand_in(part_ptr, count_ptr, y_ptr, acc, 2 * p, r_hi, tl.load(row_ptr_ptr + r_hi) // CHUNK,
                     (tl.load(row_ptr_ptr + r_hi + 1) - 1) // CHUNK, p, T, N_OUT, tile, m_ok, BH, BLOCK_M)
        else:
            tl.store(part_ptr + p.to(tl.int64) * T * BH + tile, acc, mask=m_ok[:, None])
            tl.debug_barrier()
            tl.atomic_add(count_ptr + r_hi, 1, sem="release")
    parts = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    ready = tl.zeros((), dtype=tl.int32)
    if EARLY_PARTS:  # the earlier programs' partials of the row this one finishes, if in, before its run
        if owned:
            seen0 = tl.atomic_add(count_ptr + first, 0, sem="acquire")
            if seen0 >= p - tl.load(row_ptr_ptr + r_lo) // CHUNK:
                ready += 1
                for q in range(tl.load(row_ptr_ptr + r_lo) // CHUNK, p):
                    parts += tl.load(part_ptr + q * T * BH + tile, mask=m_ok[:, None], other=0.0,
                                     cache_modifier=".cg")
    if owned and HEAD_FIRST:  # the partial for the next program first, then the row this one finishes
        mine = _decode_run(x_ptr, w_ptr, cols_ptr, mine, lo, tl.load(row_ptr_ptr + r_lo + 1), T, K_IN, BH, BW,
                           PRECISION, BLOCK_K, BLOCK_M)
        cut += tl.sum(tl.sum(mine, axis=1), axis=0)
    tl.store(stamps + 3, _now(cut.to(tl.int32, bitcast=True)))
    done = tl.zeros((), dtype=tl.float32)
    for r in range(first + owned.to(tl.int32), end - head.to(tl.int32)):
        acc = _decode_run(x_ptr, w_ptr, cols_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32),
                          tl.load(row_ptr_ptr + r), tl.load(row_ptr_ptr + r + 1), T, K_IN, BH, BW, PRECISION,
                          BLOCK_K, BLOCK_M)
        _decode_store(y_ptr, b_ptr, acc, r, T, N_OUT, BH, False, BLOCK_M)
        done += tl.sum(tl.sum(acc, axis=1), axis=0)
    tl.store(stamps + 4, _now(done.to(tl.int32, bitcast=True)))
    if OVERLAP and not (LATE_TRIGGER and owned):
        gdc_launch_dependents()
    if owned and LAST_SUMS:
        old = _hand_in(part_ptr, count_ptr, y_ptr, mine, 2 * p + 1, r_lo, tl.load(row_ptr_ptr + r_lo) // CHUNK, p, p,
                       T, N_OUT, tile, m_ok, BH, BLOCK_M)
        tl.store(stamps + 6, _now(old))
        tl.store(stamps + 5, _now(old))
    elif owned:
        if ready == 0:
            q0 = tl.load(row_ptr_ptr + r_lo) // CHUNK
            seen = tl.atomic_add(count_ptr + first, 0, sem="acquire")
            while seen < p - q0:
                seen = tl.atomic_add(count_ptr + first, 0, sem="acquire")
            tl.store(stamps + 6, _now(seen))
            if PARTS_AT_ONCE:  # up to four partials' loads issued together, added in program order
                for q in range(q0, p, 4):
                    at = part_ptr + q * T * BH + tile
                    g0 = tl.load(at, mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
                    g1 = tl.load(at + T * BH, mask=m_ok[:, None] & (q + 1 < p), other=0.0, cache_modifier=".cg")
                    g2 = tl.load(at + 2 * T * BH, mask=m_ok[:, None] & (q + 2 < p), other=0.0, cache_modifier=".cg")
                    g3 = tl.load(at + 3 * T * BH, mask=m_ok[:, None] & (q + 3 < p), other=0.0, cache_modifier=".cg")
                    parts += g0
                    parts += g1
                    parts += g2
                    parts += g3
            else:
                for q in range(q0, p):
                    parts += tl.load(part_ptr + q * T * BH + tile, mask=m_ok[:, None], other=0.0,
                                     cache_modifier=".cg")
            tl.store(stamps + 8, _now(tl.sum(tl.sum(parts, axis=1), axis=0).to(tl.int32, bitcast=True)))
        else:
            tl.store(stamps + 6, _now(p))
        _decode_store(y_ptr, b_ptr, parts + mine, first, T, N_OUT, BH, False, BLOCK_M)
        tl.atomic_xchg(count_ptr + first, 0)
        tl.store(stamps + 5, _now(ready))
        tl.store(stamps + 7, (tl.load(row_ptr_ptr + r_lo) // CHUNK).to(tl.int64))  # the row's first program
    else:
        tl.store(stamps + 5, _now(p))
        tl.store(stamps + 6, _now(p))
    if OVERLAP and LATE_TRIGGER and owned:  # an owner lets the next launch start once its row is stored
        gdc_launch_dependents()


@triton.jit
def _hand_in(part_ptr, count_ptr, y_ptr, own, slot, r, q0, q1, p, T, N_OUT, tile, m_ok, BH: tl.constexpr,
             BLOCK_M: tl.constexpr):
    """``--last-sums``: program ``p``'s partial ``own`` of cut row ``r`` (programs ``q0``..``q1`` hold its
    blocks) goes to slot ``slot`` and ``p`` counts itself in; the program that counts in last sums the
    row in program order (program q's partial in slot 2 q, the last one's, which finishes the row, in
    slot 2 q1 + 1) and stores it, so no program waits for another. The count ``p`` saw."""
    tl.store(part_ptr + slot.to(tl.int64) * T * BH + tile, own, mask=m_ok[:, None])
    tl.debug_barrier()  # every thread's partial is stored before the count says so
    old = tl.atomic_add(count_ptr + r, 1, sem="acq_rel")
    if old == q1 - q0:
        acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
        for q in range(q0, q1 + 1):
            at = tl.where(q < q1, 2 * q, 2 * q1 + 1).to(tl.int64)
            v = tl.load(part_ptr + at * T * BH + tile, mask=m_ok[:, None] & (q != p), other=0.0, cache_modifier=".cg")
            acc += tl.where(q == p, own, v)
        _decode_store(y_ptr, y_ptr, acc, r, T, N_OUT, BH, False, BLOCK_M)
        tl.atomic_xchg(count_ptr + r, 0)
    return old


def _critical(st, t0) -> dict:
    """The owners' tails: for the owner that ends last, when (from the layer's first entry) its
    contributors' last partial was in (their stamp 3), its own whole rows were done (4), it saw the
    count (6) and stored the row (5), and its end's lag behind the layer's slowest stream (the
    latest stamp 4 of any program); over all owners, the medians of count seen less their last
    contributor's partial (the signal's trip) and of stored less count seen (the partials' loads)."""
    owners = [int(p) for p in (st[:, 7] >= 0).nonzero().flatten().tolist()]
    if not owners:
        return {"last_owner": [0.0] * 5, "owners_signal": 0.0, "owners_fixup": 0.0, "owners_loads": 0.0,
                "owners_parts": 0, "last_owner_parts": 0}
    ready = {p: st[int(st[p, 7]):p, 3].max().item() if int(st[p, 7]) < p else st[p, 3].item() for p in owners}
    last = max(owners, key=lambda p: st[p, 5].item())
    slowest = st[:, 4].max().item()
    return {"last_owner": [ready[last] - t0, st[last, 4].item() - t0, st[last, 6].item() - t0, st[last, 5].item() - t0,
                           st[last, 5].item() - slowest],
            "owners_signal": sorted(st[p, 6].item() - max(ready[p], st[p, 4].item()) for p in owners)[len(owners) // 2],
            "owners_fixup": sorted(st[p, 5].item() - st[p, 6].item() for p in owners)[len(owners) // 2],
            "owners_loads": sorted(st[p, 8].item() - st[p, 6].item() for p in owners)[len(owners) // 2],
            "owners_parts": sorted(p - int(st[p, 7]) for p in owners)[len(owners) // 2],
            "last_owner_parts": last - int(st[last, 7])}


def trace(k_in: int, n_out: int, tokens: int, density: float, args, dev) -> dict:
    dt, n = torch.bfloat16, args.layers
    g = torch.Generator().manual_seed(0)
    lays = [BlockSparseLayout.random(n_out, k_in, density, (64, 64), generator=g) for _ in range(n)]
    idx = [lay.indices(dev) for lay in lays]
    ws = [torch.randn(lay.nnz, 64, 64, device=dev, dtype=dt) for lay in lays]
    x = torch.randn(tokens, k_in, device=dev, dtype=dt)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    chunks = [triton_sizing.decode_chunk(lay.nnz, args.waves, sms) for lay in lays]
    programs = max(p for _, p in chunks)
    ys = [torch.empty(tokens, n_out, device=dev, dtype=dt) for _ in range(n)]
    part = torch.empty(2 * programs, tokens, 64, device=dev)  # --last-sums: two slots a program
    counts = [torch.zeros(n_out // 64, dtype=torch.int32, device=dev) for _ in range(n)]
    stamps = torch.zeros(n, programs, 9, dtype=torch.int64, device=dev)
    stamps[:, :, 7] = -1  # the owners write their row's first program there
    early, overlap = triton_sizing.decode_start(dev)
    early = args.early if args.early is not None and early else early

    def layers():
        for i in range(n):
            chunk, progs = chunks[i]
            _traced_kernel[(progs,)](x, ws[i], ws[i], ys[i], part, counts[i], idx[i].cols, idx[i].row_ptr,
                                     idx[i].rows, stamps[i], tokens, k_in, n_out, lays[i].nnz, chunk, BH=64, BW=64,
                                     PRECISION="tf32", BLOCK_K=64, EARLY=early, OVERLAP=overlap,
                                     BLOCK_M=max(16, triton_sizing.pow2(tokens)), num_warps=args.warps,
                                     num_stages=args.stages, launch_pdl=overlap, HEAD_FIRST=args.head_first,
                                     EARLY_PARTS=args.early_parts, LAST_SUMS=args.last_sums,
                                     PARTS_AT_ONCE=args.parts_at_once, LATE_TRIGGER=args.late_trigger)
    us = graph_us(layers, dev, n)
    for i in (0, n - 1):  # the traced kernel computes what the package does
        ref = x.float() @ lays[i].scatter(ws[i].float()).t()
        torch.testing.assert_close(ys[i].float(), ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)
    s = stamps.cpu()
    rows = []
    for i in range(2, n - 1):
        progs = chunks[i][1]
        t = s[i, :progs, :6].double()
        t0 = t[:, 0].min()
        nxt = s[i + 1, :chunks[i + 1][1], :6].double()
        rows.append({
            "period": (nxt[:, 0].min() - t0).item(),
            "span": (t[:, 5].max() - t0).item(),
            "steps_median": [(t[:, k] - t[:, k - 1]).median().item() for k in range(1, 6)],
            "steps_max": [(t[:, k] - t[:, k - 1]).max().item() for k in range(1, 6)],
            "at_median": [(t[:, k] - t0).median().item() for k in range(6)],
            "at_max": [(t[:, k] - t0).max().item() for k in range(6)],
            "next_entry": (nxt[:, 0].min() - t0).item(),
            "next_released": (nxt[:, 1].min() - t[:, 5].max()).item(),
            "owner_wait": (s[i, :progs, 6].double() - t[:, 4]).median().item(),
            "owner_loads": (t[:, 5] - s[i, :progs, 6].double()).median().item(),
            **_critical(s[i, :progs].double(), t0.item()),
        })

    def med(key, j=None):
        vals = sorted(r[key] if j is None else r[key][j] for r in rows)
        return vals[len(vals) // 2] / 1000.0

    out = {"in": k_in, "out": n_out, "tokens": tokens, "density": density, "graph_us": us, "programs": programs,
           "chunk": chunks[0][0], "period_us": med("period"), "span_us": med("span"),
           "next_released_after_end_us": med("next_released"), "owner_wait_us": med("owner_wait"),
           "owner_loads_us": med("owner_loads"),
           "at_median_us": [med("at_median", k) for k in range(6)], "at_max_us": [med("at_max", k) for k in range(6)],
           "step_median_us": [med("steps_median", k) for k in range(5)],
           "step_max_us": [med("steps_max", k) for k in range(5)],
           "last_owner_us": [med("last_owner", k) for k in range(5)],
           "owners_signal_us": med("owners_signal"), "owners_fixup_us": med("owners_fixup"),
           "owners_loads_us": med("owners_loads"), "owners_parts": med("owners_parts") * 1000,
           "last_owner_parts": med("last_owner_parts") * 1000,
           "timer_grain_ns": _grain((s[2:, :, :6] - s[2, 0, 0]).flatten()[:4096].tolist())}
    return out


def _grain(values: list) -> int:
    """The timer's step (ns): the gcd of the stamps' differences (1000 on GPUs whose timer ticks by
    the microsecond, where the steps below say little)."""
    g = 0
    for v in values:
        g = math.gcd(g, abs(int(v)))
    return g


def check(seed: int = 0, layouts: int = 12) -> None:
    """``--check`` (``TRITON_INTERPRET=1``, on the CPU): the traced kernel in each way of finishing cut
    rows against fp64 dense, on tiny random layouts (empty rows, full rows, an empty layout) with
    every run length."""
    g = torch.Generator().manual_seed(seed)
    bad = 0
    for i in range(layouts):
        grid = (int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g)))
        mask = torch.rand(grid, generator=g) < (0.0 if i == 0 else torch.rand(1, generator=g).item())
        lay = BlockSparseLayout(mask, (16, 16))
        idx, (n_out, k_in) = lay.indices(), lay.shape
        tokens = int(torch.randint(1, 4, (1,), generator=g))
        x = torch.randn(tokens, k_in, generator=g)
        w = torch.randn(lay.nnz, 16, 16, generator=g)
        ref = x.double() @ lay.scatter(w.double()).t()
        for chunk in range(1, lay.nnz + 2):
            programs = max(1, -(-lay.nnz // chunk))
            for head_first, last_sums, reverse, at_once in ((False, False, False, False), (True, False, False, False),
                                                            (True, False, False, True), (True, True, False, False),
                                                            (True, True, True, False)):
                y = torch.full((tokens, n_out), float("nan"))
                part = torch.full((2 * programs, tokens, 16), float("nan"))
                counts = torch.zeros(grid[0], dtype=torch.int32)
                stamps = torch.zeros(programs, 9, dtype=torch.int64)
                _traced_kernel[(programs,)](x, w, w, y, part, counts, idx.cols, idx.row_ptr, idx.rows, stamps, tokens,
                                            k_in, n_out, lay.nnz, chunk, BH=16, BW=16, PRECISION="ieee", BLOCK_K=16,
                                            EARLY=0, OVERLAP=False, BLOCK_M=16, HEAD_FIRST=head_first,
                                            LAST_SUMS=last_sums, REVERSE=reverse, PARTS_AT_ONCE=at_once)
                err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
                if not err <= 1e-4 * max(1.0, ref.abs().max().item()) or counts.any():
                    bad += 1
                    print(f"layout {i} {mask.int().tolist()} chunk {chunk} head_first {head_first} last_sums "
                          f"{last_sums} reverse {reverse} at once {at_once}: err {err}, counts {counts.tolist()}")
    print(f"{'ok' if not bad else f'{bad} bad'}: {layouts} layouts, every run length, five ways (head first also with "
          "the partials loaded four at once; the last sums also with the programs run last to first)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--densities", default="0.5,0.1")
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--head-first", action="store_true",
                    help="each program sums the row it hands on (head) before the row it finishes (owned)")
    ap.add_argument("--early-parts", action="store_true",
                    help="an owner takes the earlier programs' partials before its own run of the row if they are "
                         "in by then (one look at the count), else at its end as now")
    ap.add_argument("--last-sums", action="store_true",
                    help="with --head-first: each program hands in its partials of its cut rows and counts itself in; "
                         "the last to count in sums the row (no program waits for another)")
    ap.add_argument("--early", type=int, help="the lines asked into L2 before the wait (a power of 2; the "
                    "package's DECODE_EARLY_LINES if not given)")
    ap.add_argument("--parts-at-once", action="store_true",
                    help="an owner issues the loads of up to four earlier programs' partials together (added in "
                         "program order), where the package loads them one at a time past 16 tokens")
    ap.add_argument("--late-trigger", action="store_true",
                    help="an owner lets the next launch start after its fix-up, not once its blocks are read, so the "
                         "next layer's early lines don't meet the owners' partials' loads")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true",
                    help="the kernel against dense on the CPU (run with TRITON_INTERPRET=1), no timing")
    args = ap.parse_args()
    if args.check:
        return check()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "config": vars(args), "rows": []}
    print(f"{res['device']}; µs from the layer's first entry: median program / slowest, at {', '.join(STEPS)}")
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            for d in map(float, args.densities.split(",")):
                r = trace(k_in, n_out, t, d, args, dev)
                res["rows"].append(r)
                print(f"{k_in}->{n_out} T={t} d={d}: graph {r['graph_us']:.1f} us/layer, period {r['period_us']:.2f}, "
                      f"span {r['span_us']:.2f}, {r['programs']} programs of {r['chunk']} blocks; at "
                      + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(r["at_median_us"], r["at_max_us"]))
                      + f"; fix-up: count seen {r['owner_wait_us']:.2f} after the whole rows, the row stored "
                      f"{r['owner_loads_us']:.2f} after that (median program)"
                      + "; last owner: parts in, own rows done, count seen, stored, lag behind the slowest stream "
                      + "/".join(f"{v:.2f}" for v in r["last_owner_us"])
                      + f" ({r['last_owner_parts']:.0f} partials)"
                      + f"; owners (median): signal {r['owners_signal_us']:.2f}, loads {r['owners_loads_us']:.2f}, "
                      f"loads+store {r['owners_fixup_us']:.2f} ({r['owners_parts']:.0f} partials)"
                      + f"; next layer released {r['next_released_after_end_us']:.2f} after the last end; "
                      f"timer grain {r['timer_grain_ns']} ns", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
