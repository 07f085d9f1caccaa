"""Probe: the decode forward (``_decode_kernel``) with each L2 prefetch of ``DECODE_PREFETCH`` held
fixed, and with the prefetch tuned like the rest of its config, on the layer-alone rows of
``bench/block_sparse_decode.py`` (16 rotated layers, graph-replayed, GPU µs per layer), beside
dense ``F.linear`` and cuBLAS on a dense weight of the same bytes (the floor,
``decode_floor.py``). The decode route is held to the decode kernel so its own time is what
moves; each variant tunes in a cache directory of its own.

Usage::

    python bench/cuda_probe/decode_prefetch.py [--shapes 4096x14336,14336x4096] [--tokens 1,16,64]
        [--densities 0.5,0.25,0.1] [--variants 0,-1,4,16,tuned] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from block_sparse_decode import graph_us


def held_to(value, triton_impl):
    """Keep only decode configs whose PREFETCH is ``value`` (None: any) from now on, in a fresh cache."""
    import opforge

    os.environ["OPFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"opforge-prefetch-{value}-")
    opforge.reset()
    triton_impl.forget_plans()
    fits = triton_impl._UNHELD_FITS

    def held(c, *args):
        return fits(c, *args) and (value is None or c.kwargs["PREFETCH"] == value)
    triton_impl.decode_fits = held


def decode_choice(triton_impl) -> str:
    for plan in triton_impl._FWD.values():
        if plan is not triton_impl._REFERENCE and plan.facts[0] == "decode":
            c = plan.choice
            return f"PREFETCH={c.kwargs['PREFETCH']} WAVES={c.kwargs['WAVES']} w{c.num_warps}s{c.num_stages}"
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--variants", default="0,-1,4,16,tuned")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    triton_impl._UNHELD_FITS = triton_impl.decode_fits
    triton_impl.DECODE_ROUTE.names = ("decode",)
    variants = [None if v == "tuned" else int(v) for v in args.variants.split(",")]
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    print(f"{torch.cuda.get_device_name()}, bf16, {n} layers rotated, graph-replayed, µs per layer", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            x = torch.randn(t, k_in, device=dev, dtype=dt)
            ws = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(n)]
            dense = graph_us(lambda: [F.linear(x, w) for w in ws], dev, n)  # noqa: B023
            ws = None
            for d in map(float, args.densities.split(",")):
                kept = max(64, round(n_out * d / 64) * 64)
                ws = [torch.randn(kept, k_in, device=dev, dtype=dt) for _ in range(n)]
                floor = graph_us(lambda: [F.linear(x, w) for w in ws], dev, n)  # noqa: B023
                ws = None
                g = torch.Generator().manual_seed(0)
                mods = [BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
                    n_out, k_in, d, (64, 64), generator=g)).requires_grad_(False) for _ in range(n)]
                ref = F.linear(x.double(), mods[0].to_dense().double())
                row = {"shape": shape, "T": t, "density": d, "dense_us": dense, "floor_us": floor, "variants": {}}
                line = f"{k_in}->{n_out} T={t} d={d}: dense {dense:.1f} floor {floor:.1f} |"
                for v in variants:
                    held_to(v, triton_impl)
                    with torch.no_grad():
                        us = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
                        err = ((mods[0](x).double() - ref).norm() / ref.norm()).item()
                    name = "tuned" if v is None else str(v)
                    row["variants"][name] = {"us": us, "choice": decode_choice(triton_impl), "rel_err": err}
                    line += (f" {name}: {us:.1f} ({dense / us:.2f}x, {100 * floor / us:.0f}% floor, err {err:.1e})"
                             f" [{decode_choice(triton_impl)}]")
                print(line, flush=True)
                rows.append(row)
                mods = None
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
