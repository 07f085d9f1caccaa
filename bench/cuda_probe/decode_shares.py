"""Probe: unequal shares for the decode kernel's programs, planned on the host from the layout (issue 35).

``_decode_kernel`` gives every program the same run of kept blocks (``CHUNK``). Where block-rows are long
against a run (14336->4096: 22-112 blocks a row, 4-27 a run), a row is cut across three or more programs:
the first hands on its head early (it walks it first), but the *middle* ones, whose whole run lies inside
the row, hand on their partial only when their stream ends, at the same time as everyone's. The row's owner
then waits for them, and its fix-up (the count, the partials' loads, the row's store: the nineteenth
session's trace measured 2.8-4.1 us at T=64) runs after the slowest stream, with nothing left to hide it.

Here the runs are planned on the host, once per layout (``plan_bounds``): a program whose run would lie
inside one row without reaching its end (a *middle* contributor) gets ``1 - MIDDLE`` of the others' run, a
program that finishes a row begun by another (an *owner*) ``1 - OWNER`` of it, and the rest what makes the
runs cover the list with the same number of programs. So the middle partials are in before the owners'
streams end, and the owners' fix-ups start sooner. The kernel is the package's ``_decode_kernel`` with two
changes only, made on its source here (``shares_kernel``): the run's ends come from ``bounds[p]`` and
``bounds[p + 1]`` rather than ``p * CHUNK``, and an owned row's first program from ``firsts[row]`` rather than
``row_ptr[row] // CHUNK``.

Timed in one process against the package's kernel as it is (the same layouts, 16 rotated layers, one CUDA
graph, programmatic dependents with the early L2 lines), each at its best of the configs swept; the shares
with ``MIDDLE = OWNER = 0`` give the cost of the bounds' loads alone.

Usage::

    python bench/cuda_probe/decode_shares.py [--shapes 14336x4096] [--tokens 1,16,64] [--densities 0.5,0.25,0.1]
        [--waves 1,2,3] [--pipes 4x8,2x8,4x6] [--shares 0:0,0.1:0,0.2:0,0.2:0.1] [--json FILE]
    TRITON_INTERPRET=1 python bench/cuda_probe/decode_shares.py --check   # against fp64 dense, on the CPU
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import edited_source  # noqa: E402
from decode_sweep import keep_best, report, rotated_row, time_config  # noqa: E402

from opforge.kernels.block_sparse import triton_sizing  # noqa: E402
from opforge.kernels.block_sparse.layout import BlockSparseLayout  # noqa: E402
from opforge.kernels.block_sparse.triton_decode import _decode_kernel  # noqa: E402

_EDITS = (
    ("def _decode_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, rows_ptr, T,",
     "def _decode_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, rows_ptr, "
     "bounds_ptr, firsts_ptr, T,"),
    ("    lo = p * CHUNK\n    hi = tl.minimum(lo + CHUNK, NNZ)\n",
     "    lo = tl.load(bounds_ptr + p)\n    hi = tl.load(bounds_ptr + p + 1)\n"),
    ("q0 = tl.load(row_ptr_ptr + r_lo, mask=owned, other=0).to(tl.int32) // CHUNK",
     "q0 = tl.load(firsts_ptr + r_lo, mask=owned, other=0)"),
)


def shares_kernel():
    """The package's ``_decode_kernel`` with its runs read from ``bounds`` (``_EDITS``, each made exactly once
    on the package's source, so the probe times the package's kernel and nothing else changed)."""
    return edited_source.load(edited_source.replaced(edited_source.source(), _EDITS), "_decode_shares_gen")._decode_kernel


def plan_bounds(row_ptr: list[int], programs: int, middle: float, owner: float) -> list[int]:
    """The runs' ends (``programs + 1`` of them, no run empty) for ``programs`` programs over the kept blocks
    of a layout (``row_ptr``: its block-rows' starts, and the end), middle contributors at ``1 - middle`` of
    a run and owners at ``1 - owner``. The common run is found by bisection so that the runs cover the list;
    the last program takes what rounding leaves."""
    nnz = row_ptr[-1]
    programs = max(1, min(programs, nnz))
    if nnz == 0:
        return [0, 0]

    def walk(run: float) -> list[int]:
        ends, s = [0], 0
        for _ in range(programs):
            if s >= nnz:
                break
            r = bisect.bisect_right(row_ptr, s) - 1  # the block-row of block s (the first of that start)
            while row_ptr[r + 1] == row_ptr[r]:  # empty rows hold no block
                r += 1
            row_end = row_ptr[r + 1]
            share = run  # a run that starts with a row: it finishes no one else's
            if s > row_ptr[r]:  # the run starts inside a row begun by another program
                if row_end <= s + run * (1 - owner):
                    share = run * (1 - owner)  # it finishes the row: an owner
                else:
                    share = run * (1 - middle)  # the row goes on past it: a middle contributor
            e = min(nnz, max(s + 1, round(s + share)))
            ends.append(e)
            s = e
        return ends

    lo, hi = nnz / programs * 0.5, float(nnz)
    for _ in range(60):
        mid = (lo + hi) / 2
        if walk(mid)[-1] >= nnz:
            hi = mid
        else:
            lo = mid
    ends = walk(hi)
    ends[-1] = nnz
    return ends


def firsts_of(row_ptr: list[int], ends: list[int]) -> list[int]:
    """For each block-row, the program whose run holds its first block (0 for an empty row: never read)."""
    return [max(0, bisect.bisect_right(ends, row_ptr[r]) - 1) if row_ptr[r + 1] > row_ptr[r] else 0
            for r in range(len(row_ptr) - 1)]


def launch(kernel, ends_t, firsts_t, programs, x, w, b, y, part, counts, idx, tokens, k_in, n_out, nnz, chunk, bh, bw,
           prec, early, overlap, block_m, warps, stages, flat, has_bias=False):
    common = dict(BH=bh, BW=bw, HAS_BIAS=has_bias, PRECISION=prec, BLOCK_K=min(bw, 64), EARLY=early, OVERLAP=overlap,
                  BLOCK_M=block_m, WAVES=0, FLAT=flat, num_warps=warps, num_stages=stages)
    if overlap:
        common["launch_pdl"] = True
    slots = tokens <= triton_sizing.DECODE_SLOT_TOKENS
    p = part if slots else part.view(torch.float32)
    if kernel is None:  # the package's kernel as it is: equal runs
        _decode_kernel[(programs,)](x, w, b, y, p, counts, idx.cols, idx.row_ptr, idx.rows, tokens, k_in, n_out, nnz,
                                    chunk, **common)
    else:
        kernel[(programs,)](x, w, b, y, p, counts, idx.cols, idx.row_ptr, idx.rows, ends_t, firsts_t, tokens, k_in,
                            n_out, nnz, chunk, **common)


def check(seed: int = 0, layouts: int = 12) -> None:
    """``--check`` (``TRITON_INTERPRET=1``): the shares kernel against fp64 dense on tiny random layouts (empty
    rows, full rows, long rows over many programs), every program count, several shares; slots empty and
    counts zero after."""
    kernel = shares_kernel()
    g = torch.Generator().manual_seed(seed)
    bad = runs = 0
    for i in range(layouts):
        grid = (int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(2, 9, (1,), generator=g)))
        dens = 1.0 if i == 0 else torch.rand(1, generator=g).item()
        mask = torch.rand(grid, generator=g) < dens
        if not mask.any():
            mask[0, 0] = True
        lay = BlockSparseLayout(mask, (16, 16))
        idx, (n_out, k_in) = lay.indices(), lay.shape
        rp = idx.row_ptr.tolist()
        for tokens in (1, 3, 17):
            x = torch.randn(tokens, k_in, generator=g)
            w = torch.randn(lay.nnz, 16, 16, generator=g)
            b = torch.randn(n_out, generator=g)
            block_m = max(16, triton_sizing.pow2(tokens))
            for has_bias in (False, True):
                ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0.0)
                for programs in range(1, lay.nnz + 1):
                    for middle, owner in ((0.0, 0.0), (0.3, 0.0), (0.3, 0.2)):
                        ends = plan_bounds(rp, programs, middle, owner)
                        progs = len(ends) - 1
                        assert ends[0] == 0 and ends[-1] == lay.nnz and all(a < c for a, c in zip(ends, ends[1:]))
                        y = torch.full((tokens, n_out), float("nan"))
                        part = torch.full((progs + 1, tokens, 16), triton_sizing.SLOT_EMPTY, dtype=torch.int32)
                        counts = torch.zeros(grid[0], dtype=torch.int32)
                        launch(kernel, torch.tensor(ends, dtype=torch.int32),
                               torch.tensor(firsts_of(rp, ends), dtype=torch.int32), progs, x, w, b, y, part, counts,
                               idx, tokens, k_in, n_out, lay.nnz, 0, 16, 16, "ieee", 0, False, block_m, 4, 2,
                               tokens <= 16 and programs % 2 == 0, has_bias)
                        runs += 1
                        err = (y.double() - ref).abs().max().item()
                        slots_ok = tokens > 16 or bool((part == triton_sizing.SLOT_EMPTY).all())
                        if not (err < 1e-3) or counts.any() or not slots_ok:
                            bad += 1
                            print(f"layout {i} T={tokens} programs {programs} shares {middle}:{owner}: err {err}")
    print(f"{'ok' if not bad else f'{bad} bad'}: {runs} runs over {layouts} layouts")
    if bad:
        raise SystemExit(1)


def time_row(kernel, k_in, n_out, tokens, density, args, dev) -> dict:
    rot = rotated_row(k_in, n_out, tokens, density, args.layers, dev)
    rps = [lay.indices().row_ptr.tolist() for lay in rot.lays]
    block_m = max(16, triton_sizing.pow2(tokens))
    flats = (True, False) if tokens <= triton_sizing.DECODE_SLOT_TOKENS else (False,)
    variants = [("package", None)] + [(f"shares {s}", tuple(map(float, s.split(":")))) for s in args.shares.split(",")]
    for name, shares in variants:
        for waves in map(int, args.waves.split(",")):
            chunks = [triton_sizing.decode_chunk(lay.nnz, waves, rot.sms) for lay in rot.lays]
            if shares is None:
                plans = [(None, None, c[1]) for c in chunks]
            else:
                plans = []
                for i in range(rot.layers):
                    ends = plan_bounds(rps[i], chunks[i][1], *shares)
                    plans.append((torch.tensor(ends, dtype=torch.int32, device=dev),
                                  torch.tensor(firsts_of(rps[i], ends), dtype=torch.int32, device=dev), len(ends) - 1))
            for pipe in args.pipes.split(","):
                warps, stages = map(int, pipe.split("x"))
                for flat in flats:
                    def layers(plans=plans, chunks=chunks, warps=warps, stages=stages, flat=flat, shares=shares):
                        for i in range(rot.layers):
                            ends_t, firsts_t, progs = plans[i]
                            launch(None if shares is None else kernel, ends_t, firsts_t, progs, rot.x, rot.ws[i],
                                   rot.ws[i], rot.ys[i], rot.part, rot.counts[i], rot.idx[i], tokens, k_in, n_out,
                                   rot.lays[i].nnz, chunks[i][0], 64, 64, "tf32", rot.early, rot.overlap, block_m,
                                   warps, stages, flat)
                    time_config(rot, name, {"waves": waves, "pipe": pipe, "flat": flat}, layers,
                                slots_emptied=tokens <= triton_sizing.DECODE_SLOT_TOKENS)
    return keep_best(rot, [v[0] for v in variants])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="14336x4096")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--waves", default="1,2,3")
    ap.add_argument("--pipes", default="4x8,2x8,4x6")
    ap.add_argument("--shares", default="0:0,0.1:0,0.2:0,0.3:0,0.2:0.1",
                    help="MIDDLE:OWNER, comma-separated: the fractions of a run middle contributors and owners give up")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true", help="against dense on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.check:
        return check()
    kernel = shares_kernel()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": vars(args), "rows": []}
    print(res["device"], "GPU us per layer (graph, 16 rotated layers); each variant at its best config", flush=True)
    names = ["package"] + [f"shares {s}" for s in args.shares.split(",")]
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            for d in map(float, args.densities.split(",")):
                report(res, time_row(kernel, k_in, n_out, t, d, args, dev), names, args.json)

if __name__ == "__main__":
    main()
