"""Probe: one token through the uncut kernel with thin units and multiply-adds (issue 35).

At T=1 the balanced block-by-block kernel with multiply-adds runs 0.7-1.3 us a layer under its MMA twin
(``decode_fma_floor.py``), but in ``_decode_kernel`` the gain is lost to the cut rows' fix-ups
(``decode_one_token.py``). ``_decode_uncut_kernel`` cuts no row: it deals out units of ``SUB`` outputs of
a block-row, each summed whole. Through ``tl.dot`` a unit needs 16 outputs or more, and at T=64 thin
units multiply x's traffic; at T=1 x's slice is 128 bytes a block, so units can be as thin as the
balance wants. Here the package's uncut kernel is edited on a copy of its source (``_EDITS``, each made
exactly once): a unit's products are added term by term into a ``(BK, SUB)`` fp32 tile (each block's
``SUB`` rows as stored, x's slice broadcast over them), summed over k once, at the unit's end.

Timed in one process against the package's decode kernel (16-row tile) and uncut kernel (whole-row
units), each variant at its best of the configs swept (16 rotated layers, one CUDA graph, programmatic
dependents), the output checked against fp32 torch.

Usage::

    python bench/cuda_probe/decode_uncut_fma.py [--shapes 4096x14336,14336x4096] [--densities 0.5,0.25,0.1]
        [--subs 16,8,4,2] [--waves 1,2,3,4,6,8] [--pipes 4x2,8x2] [--json FILE]
    TRITON_INTERPRET=1 python bench/cuda_probe/decode_uncut_fma.py --check   # against fp64 dense, on the CPU
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import edited_source  # noqa: E402
from decode_flat import launch  # noqa: E402
from decode_sweep import keep_best, report, rotated_row, time_config, tiny_case  # noqa: E402

from opforge.kernels.block_sparse import triton_sizing  # noqa: E402

_EDITS = (
    ("        acc = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)\n",
     "        acc = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)\n"
     "        terms = tl.zeros((BLOCK_K, SUB), dtype=tl.float32)\n"),
    ("            xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)\n"
     "            acc = tl.dot(xt, wt, acc, input_precision=PRECISION)\n",
     "            xt = tl.load(x_ptr + c * BW + kk + offs_k[:, None] + 0 * offs_h[None, :])\n"
     "            terms += wt.to(tl.float32) * xt.to(tl.float32)\n"),
    ("        h = r * BH + j * SUB + offs_h\n",
     "        acc += tl.sum(terms, axis=0)[None, :]\n"
     "        h = r * BH + j * SUB + offs_h\n"),
)


def fma_uncut():
    """The package's ``_decode_uncut_kernel`` with ``_EDITS`` (for one token, ``BLOCK_M`` 1)."""
    src = edited_source.replaced(edited_source.source(), _EDITS)
    return edited_source.load(src, "_decode_uncut_fma_gen")._decode_uncut_kernel


def run(kernel, programs, x, w, b, y, idx, k_in, n_out, total, chunk, bh, bw, sub, overlap, warps, stages,
        has_bias=False, prec="tf32"):
    kernel[(programs,)](x, w, b, y, idx.cols, idx.row_ptr, 1, k_in, n_out, total, chunk, BH=bh, BW=bw, SUB=sub,
                        HAS_BIAS=has_bias, PRECISION=prec, BLOCK_K=min(bw, 64),
                        SEARCH=triton_sizing.decode_search(n_out // bh), OVERLAP=overlap, BLOCK_M=1, WAVES=0,
                        num_warps=warps, num_stages=stages, **({"launch_pdl": True} if overlap else {}))


def check(kernel, seed: int = 0, layouts: int = 12) -> None:
    """``--check``: the edited kernel at one token, units of 1 to BH outputs, every share, with and without a
    bias, against fp64 dense on tiny random layouts (empty rows, full rows, 128-wide blocks), y filled with
    NaN first (an output no program stores shows)."""
    g = torch.Generator().manual_seed(seed)
    bad = runs = 0
    for i in range(layouts):
        lay, idx, n_out, k_in, x, w, b = tiny_case(i, g, 4, 4)
        bh, bw = lay.block_shape
        for sub in (1, 4, bh):
            total = bh // sub * lay.nnz
            for has_bias in (False, True):
                ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0.0)
                for chunk in sorted({1, 2, 3, 5, max(1, total // 2), max(1, total), total + 1}):
                    programs = max(1, -(-total // chunk))
                    y = torch.full((1, n_out), float("nan"))
                    run(kernel, programs, x, w, b, y, idx, k_in, n_out, total, chunk, bh, bw, sub, False, 4, 2,
                        has_bias, "ieee")
                    runs += 1
                    err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
                    if not err < 1e-3:
                        bad += 1
                        print(f"layout {i} sub {sub} chunk {chunk}: err {err}")
    print(f"{'ok' if not bad else f'{bad} bad'}: {runs} runs over {layouts} layouts")
    if bad:
        raise SystemExit(1)


def time_row(kernel, k_in, n_out, density, args, dev) -> dict:
    rot = rotated_row(k_in, n_out, 1, density, args.layers, dev)
    variants = [("decode", None, "4x4,4x6,8x6,4x8,2x8"), ("uncut", None, "2x8,4x8,4x12")]
    variants += [(f"uncut fma {s}", int(s), args.pipes) for s in args.subs.split(",")]
    for name, sub, pipes in variants:
        for waves in map(int, args.waves.split(",")):
            for pipe in pipes.split(","):
                warps, stages = map(int, pipe.split("x"))
                for flat in ((True, False) if name == "decode" else (False,)):
                    def layers(waves=waves, warps=warps, stages=stages, flat=flat, name=name, sub=sub):
                        for i in range(rot.layers):
                            nnz = rot.lays[i].nnz
                            if sub is None:
                                chunk, progs = triton_sizing.decode_chunk(nnz, waves, rot.sms)
                                launch("package-flat" if flat else ("package-loops" if name == "decode" else "uncut"),
                                       (progs,), rot.x, rot.ws[i], rot.ws[i], rot.ys[i], rot.part, rot.counts[i],
                                       rot.idx[i], 1, k_in, n_out, nnz, chunk, 64, 64, "tf32", rot.early, rot.overlap,
                                       16, warps, stages)
                            else:
                                total = 64 // sub * nnz
                                chunk, progs = triton_sizing.decode_chunk(total, waves, rot.sms)
                                run(kernel, progs, rot.x, rot.ws[i], rot.ws[i], rot.ys[i], rot.idx[i], k_in, n_out,
                                    total, chunk, 64, 64, sub, rot.overlap, warps, stages)
                    time_config(rot, name, {"waves": waves, "pipe": pipe, "flat": flat}, layers)
    return keep_best(rot, [v[0] for v in variants])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--subs", default="16,8,4,2")
    ap.add_argument("--waves", default="1,2,3,4,6,8")
    ap.add_argument("--pipes", default="4x2,8x2")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true", help="against dense on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    kernel = fma_uncut()
    if args.check:
        return check(kernel)
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": vars(args), "rows": []}
    names = ["decode", "uncut"] + [f"uncut fma {s}" for s in args.subs.split(",")]
    print(res["device"], "T=1, GPU us per layer (graph, 16 rotated layers); each variant at its best config", flush=True)
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for d in map(float, args.densities.split(",")):
            report(res, time_row(kernel, k_in, n_out, d, args, dev), names, args.json)

if __name__ == "__main__":
    main()
