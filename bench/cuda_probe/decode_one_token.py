"""Probe: the decode kernel at one token on a tile of one row, multiplying and adding without the tensor
cores, against the package's tile of 16 through ``tl.dot`` (issue 35).

``decode_fma_floor.py`` measured the balanced block-by-block kernel both ways at T=1: multiply-adds
(each block read as stored, x's slice in the same shape, the products added term by term into a
``(BH, BK)`` fp32 tile, the sum over k taken once) ran 0.7-1.3 us a layer faster than ``tl.dot`` on a
16-row tile, within 0.5 us of a bare read. This probe asks whether that carries into the package's
kernel, with its rows, head partials, slots and owners: ``decode_one_token.patch`` (a unified diff
against ``opforge/kernels/block_sparse/triton_decode.py`` as of the twentieth session) adds the
one-row tile (``BLOCK_M`` 1: ``_decode_fma``, in both walks; ``FMA_STEPS`` block steps loaded before
their products in the loops per row) and is applied here to a copy of the package's source
(``patched``). At ``BLOCK_M`` >= 16 the patched kernel is the package's.

Each variant at its best of the configs swept, in one process (16 rotated layers, one CUDA graph,
programmatic dependents with the early L2 lines); every config's time is kept in the JSON.
``--steps``: the one-row tile again with ``FMA_STEPS`` set to each of these.

Usage::

    python bench/cuda_probe/decode_one_token.py [--shapes 4096x14336,14336x4096] [--densities 0.5,0.25,0.1]
        [--waves 1,2,3,4,6,8] [--pipes1 4x2,8x2,4x4,8x4,2x4] [--pipes16 4x4,4x6,8x6,4x8,2x8]
        [--steps 1,2] [--json FILE]
    TRITON_INTERPRET=1 python bench/cuda_probe/decode_one_token.py --check   # against fp64 dense, on the CPU
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

PATCH = os.path.join(HERE, "decode_one_token.patch")
_STEPS = "FMA_STEPS = tl.constexpr("


def patched(src: str, diff: str) -> str:
    """``src`` with the unified ``diff``'s hunks applied, each of whose old lines must be found exactly once."""
    hunks = [h for h in diff.split("\n@@")[1:]]
    for h in hunks:
        body = h.split("\n")[1:]
        old = [ln[1:] for ln in body if ln[:1] in (" ", "-")]
        new = [ln[1:] for ln in body if ln[:1] in (" ", "+")]
        old_s, new_s = "\n".join(old) + "\n", "\n".join(new) + "\n"
        if src.count(old_s) != 1:
            raise RuntimeError(f"{PATCH} no longer applies: a hunk's old text is there {src.count(old_s)} times")
        src = src.replace(old_s, new_s)
    return src


def with_steps(steps: int):
    """The patched ``_decode_kernel`` with ``FMA_STEPS`` set to ``steps`` (a module of its own)."""
    with open(PATCH) as f:
        src = patched(edited_source.source(), f.read())
    at = src.index(_STEPS)
    src = src[:at] + f"{_STEPS}{steps}" + src[src.index(")", at):]
    return edited_source.load(src, f"_decode_steps{steps}")._decode_kernel


def launch_with(kernel, programs, x, w, y, part, counts, idx, k_in, n_out, nnz, chunk, early, overlap, warps, stages,
                flat):
    kernel[(programs,)](x, w, w, y, part, counts, idx.cols, idx.row_ptr, idx.rows, 1, k_in, n_out, nnz, chunk, BH=64,
                        BW=64, HAS_BIAS=False, PRECISION="tf32", BLOCK_K=64, EARLY=early, OVERLAP=overlap, BLOCK_M=1,
                        WAVES=0, FLAT=flat, num_warps=warps, num_stages=stages,
                        **({"launch_pdl": True} if overlap else {}))


def check(kernels: dict, seed: int = 0, layouts: int = 12) -> None:
    """``--check``: each patched kernel at one token on a one-row tile, both walks, every run length, with and
    without a bias, against fp64 dense on tiny random layouts (empty rows, full rows; 16x16, 32x16, 16x64 and
    16x128 blocks, the last two k-steps a block); the slots must be empty again after."""
    g = torch.Generator().manual_seed(seed)
    bad = runs = 0
    for i in range(layouts):
        lay, idx, n_out, k_in, x, w, b = tiny_case(i, g, 5, 4)
        bh, bw = lay.block_shape
        for has_bias in (False, True):
            ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0.0)
            for chunk in range(1, lay.nnz + 2):
                programs = max(1, -(-lay.nnz // chunk))
                for (steps, kernel), flat in [(kv, f) for kv in kernels.items() for f in (True, False)]:
                    y = torch.full((1, n_out), float("nan"))
                    part = torch.full((programs, 1, bh), triton_sizing.SLOT_EMPTY, dtype=torch.int32)
                    counts = torch.zeros(n_out // bh, dtype=torch.int32)
                    kernel[(programs,)](x, w, b, y, part, counts, idx.cols, idx.row_ptr, idx.rows, 1, k_in, n_out,
                                        lay.nnz, chunk, BH=bh, BW=bw, HAS_BIAS=has_bias, PRECISION="ieee",
                                        BLOCK_K=min(bw, 64), EARLY=0, OVERLAP=False, BLOCK_M=1, WAVES=0, FLAT=flat)
                    runs += 1
                    err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
                    if not err < 1e-3 or bool((part != triton_sizing.SLOT_EMPTY).any()):
                        bad += 1
                        print(f"layout {i} steps {steps} flat {flat} chunk {chunk}: err {err}")
    print(f"{'ok' if not bad else f'{bad} bad'}: {runs} runs over {layouts} layouts")
    if bad:
        raise SystemExit(1)


def time_row(k_in, n_out, density, args, dev) -> dict:
    tokens = 1
    rot = rotated_row(k_in, n_out, tokens, density, args.layers, dev)
    variants = [(16, args.pipes16, None, "tile 16")]  # the package's kernel as it is
    variants += [(1, args.pipes1, k, f"tile 1 steps {s}") for s, k in args.kernels.items()]
    for block_m, pipes, kernel, name in variants:
        for waves in map(int, args.waves.split(",")):
            chunks = [triton_sizing.decode_chunk(lay.nnz, waves, rot.sms) for lay in rot.lays]
            for pipe in pipes.split(","):
                warps, stages = map(int, pipe.split("x"))
                for flat in (True, False):
                    def layers(chunks=chunks, warps=warps, stages=stages, flat=flat, block_m=block_m, kernel=kernel):
                        for i in range(rot.layers):
                            chunk, progs = chunks[i]
                            if kernel is not None:
                                launch_with(kernel, progs, rot.x, rot.ws[i], rot.ys[i], rot.part, rot.counts[i],
                                            rot.idx[i], k_in, n_out, rot.lays[i].nnz, chunk, rot.early, rot.overlap,
                                            warps, stages, flat)
                                continue
                            launch("package-flat" if flat else "package-loops", (progs,), rot.x, rot.ws[i], rot.ws[i],
                                   rot.ys[i], rot.part, rot.counts[i], rot.idx[i], tokens, k_in, n_out,
                                   rot.lays[i].nnz, chunk, 64, 64, "tf32", rot.early, rot.overlap, block_m, warps,
                                   stages)
                    time_config(rot, name, {"waves": waves, "pipe": pipe, "flat": flat}, layers)
    return keep_best(rot, [v[3] for v in variants])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--waves", default="1,2,3,4,6,8")
    ap.add_argument("--pipes1", default="4x2,8x2,4x4,8x4,2x4")
    ap.add_argument("--pipes16", default="4x4,4x6,8x6,4x8,2x8")
    ap.add_argument("--steps", default="4,2,1", help="FMA_STEPS values to time the one-row tile with, comma-separated")
    ap.add_argument("--check", action="store_true", help="the patched kernel against dense on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.kernels = {int(s): with_steps(int(s)) for s in args.steps.split(",") if s}
    if args.check:
        return check(args.kernels)
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "config": {k: v for k, v in vars(args).items() if k != "kernels"}, "rows": []}
    names = ["tile 16"] + [f"tile 1 steps {s}" for s in args.kernels]
    print(res["device"], "T=1, GPU us per layer (graph, 16 rotated layers); each tile at its best config", flush=True)
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for d in map(float, args.densities.split(",")):
            report(res, time_row(k_in, n_out, d, args, dev), names, args.json)

if __name__ == "__main__":
    main()
