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
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import edited_source  # noqa: E402
from decode_flat import launch  # noqa: E402
from decode_floor import graph_us  # noqa: E402

from opforge.kernels.block_sparse import triton_sizing  # noqa: E402
from opforge.kernels.block_sparse.layout import BlockSparseLayout  # noqa: E402

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
        bh, bw = ((16, 16), (32, 16), (16, 64), (16, 128))[i % 4]
        grid = (int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g)))
        mask = torch.rand(grid, generator=g) < (1.0 if i == 0 else 0.0 if i == 1 else torch.rand(1, generator=g).item())
        lay = BlockSparseLayout(mask, (bh, bw))
        idx, (n_out, k_in) = lay.indices(), lay.shape
        x = torch.randn(1, k_in, generator=g)
        w = torch.randn(lay.nnz, bh, bw, generator=g)
        b = torch.randn(n_out, generator=g)
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
    dt, n = torch.bfloat16, args.layers
    g = torch.Generator().manual_seed(0)
    lays = [BlockSparseLayout.random(n_out, k_in, density, (64, 64), generator=g) for _ in range(n)]
    idx = [lay.indices(dev) for lay in lays]
    ws = [torch.randn(lay.nnz, 64, 64, device=dev, dtype=dt) for lay in lays]
    x = torch.randn(1, k_in, device=dev, dtype=dt)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ys = [torch.empty(1, n_out, device=dev, dtype=dt) for _ in range(n)]
    counts = [torch.zeros(n_out // 64, dtype=torch.int32, device=dev) for _ in range(n)]
    part = torch.full((8 * sms + 8, 1, 64), triton_sizing.SLOT_EMPTY, dtype=torch.int32, device=dev)
    early, overlap = triton_sizing.decode_start(dev)
    refs = [x.float() @ lays[i].scatter(ws[i].float()).t() for i in (0, n - 1)]
    dense_w = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(n)]
    dense_us = graph_us(lambda: [torch.nn.functional.linear(x, dw) for dw in dense_w], dev, n)
    dense_w.clear()
    row = {"in": k_in, "out": n_out, "tokens": 1, "density": density, "dense_us": dense_us, "all": []}
    variants = [("decode", None, "4x4,4x6,8x6,4x8,2x8"), ("uncut", None, "2x8,4x8,4x12")]
    variants += [(f"uncut fma {s}", int(s), args.pipes) for s in args.subs.split(",")]
    for name, sub, pipes in variants:
        best = None
        for waves in map(int, args.waves.split(",")):
            for pipe in pipes.split(","):
                warps, stages = map(int, pipe.split("x"))
                for flat in ((True, False) if name == "decode" else (False,)):
                    def layers(waves=waves, warps=warps, stages=stages, flat=flat, name=name, sub=sub):
                        for i in range(n):
                            nnz = lays[i].nnz
                            if sub is None:
                                chunk, progs = triton_sizing.decode_chunk(nnz, waves, sms)
                                launch("package-flat" if flat else ("package-loops" if name == "decode" else "uncut"),
                                       (progs,), x, ws[i], ws[i], ys[i], part, counts[i], idx[i], 1, k_in, n_out, nnz,
                                       chunk, 64, 64, "tf32", early, overlap, 16, warps, stages)
                            else:
                                total = 64 // sub * nnz
                                chunk, progs = triton_sizing.decode_chunk(total, waves, sms)
                                run(kernel, progs, x, ws[i], ws[i], ys[i], idx[i], k_in, n_out, total, chunk, 64, 64,
                                    sub, overlap, warps, stages)
                    try:
                        us = graph_us(layers, dev, n)
                    except Exception as exc:  # noqa: BLE001 - a config that doesn't compile: reported
                        print(f"  {name} waves {waves} {pipe}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    for j, i in enumerate((0, n - 1)):
                        torch.testing.assert_close(ys[i].float(), refs[j], atol=0.05 * refs[j].abs().max().item(),
                                                   rtol=0.02)
                    row["all"].append({"variant": name, "waves": waves, "pipe": pipe, "flat": flat, "us": us})
                    if best is None or us < best[0]:
                        best = (us, waves, pipe, flat)
        row[name] = {"us": best[0], "waves": best[1], "pipe": best[2], "flat": best[3], "x_dense": dense_us / best[0]}
    return row


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
            r = time_row(kernel, k_in, n_out, d, args, dev)
            res["rows"].append(r)
            print(f"{k_in}->{n_out} d={d}: dense {r['dense_us']:.1f}; "
                  + "; ".join(f"{k} {r[k]['us']:.2f} ({r[k]['x_dense']:.2f}x, w{r[k]['waves']} {r[k]['pipe']})"
                              for k in names), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
