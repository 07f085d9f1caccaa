"""Probe: the floor under a decode-sized block-sparse forward. For each layer shape and density,
the time of reading the same weight bytes without any sparsity, graph-replayed over 16 layers
(their own weights, so each call reads HBM), beside dense over the whole weight:

* **cuBLAS, same bytes**: ``F.linear`` at T tokens on a dense weight of the same bytes (``in ->
  out * density`` rows): what the best dense kernel takes to stream that many bytes;
* **torch sum, same bytes**: ``w.sum()`` over a tensor of the same bytes (one read, no math);
* **launch**: 16 graph-replayed kernels that read nothing (``torch.Tensor.zero_`` of 1 element):
  the per-kernel floor of a graph replay on this GPU;
* **opforge**: ``BlockSparseLinear`` at that density.

The best a sparse kernel could do against dense is dense's time over the cuBLAS same-bytes time.

Usage::

    python bench/cuda_probe/decode_floor.py [--shapes 4096x14336,14336x4096] [--tokens 1,64]
        [--densities 0.5,0.25,0.1] [--layers 16]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from block_sparse_decode import graph_us


def probe_args(ap: argparse.ArgumentParser, tokens: str = "1,64", shapes: bool = True, **lists: str) -> argparse.ArgumentParser:
    """The arguments the decode probes share: which rows of issue 35 (``tokens``: the default token counts; no
    ``--shapes`` for a probe whose layers are fixed, ``shapes=False``), how many rotated layers; and a probe's own
    comma-separated lists, each ``--name`` with its default (``config_grid`` reads those of integers)."""
    if shapes:
        ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--tokens", default=tokens)
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--layers", type=int, default=16)
    for name, default in lists.items():
        ap.add_argument(f"--{name}", default=default)
    return ap


def config_grid(args, *names: str) -> list[tuple[int, ...]]:
    """Every combination of the integer lists ``--name`` of ``names`` (``probe_args``), in their order."""
    return list(itertools.product(*([int(v) for v in getattr(args, name).split(",")] for name in names)))


def issue_rows(args, dev, dt, seed: int = 0):
    """For each (shape, T, density) of ``args``: a dict with ``x``, dense's graph µs over ``args.layers``
    rotated weights (``dense_us``), cuBLAS's on a dense weight of the same bytes (``same_bytes_us``,
    ``same_rows``: its out rows; ``weights``: those weights, freed once read) and ``mods``, the
    layers as ``BlockSparseLinear`` (64-blocks, random layouts drawn from ``seed``, no bias)."""
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.nn import BlockSparseLinear

    n = args.layers
    for shape in args.shapes.split(","):
        k_in, n_out = map(int, shape.split("x"))
        for t in map(int, args.tokens.split(",")):
            x = torch.randn(t, k_in, device=dev, dtype=dt)
            ws = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(n)]
            dense = graph_us(lambda: [F.linear(x, w) for w in ws], dev, n)  # noqa: B023
            ws = None
            for d in map(float, args.densities.split(",")):
                rows = max(64, round(n_out * d / 64) * 64)
                ws = [torch.randn(rows, k_in, device=dev, dtype=dt) for _ in range(n)]
                same = graph_us(lambda: [F.linear(x, w) for w in ws], dev, n)  # noqa: B023
                g = torch.Generator().manual_seed(seed)
                mods = [BlockSparseLinear(k_in, n_out, bias=False, device=dev, dtype=dt, layout=BlockSparseLayout.random(
                    n_out, k_in, d, (64, 64), generator=g)).requires_grad_(False) for _ in range(n)]
                yield {"in": k_in, "out": n_out, "tokens": t, "density": d, "x": x, "dense_us": dense,
                       "same_bytes_us": same, "same_rows": rows, "weights": ws, "mods": mods}
                ws = mods = None
                torch.cuda.empty_cache()


def head(row) -> str:
    """A row's line starts so: its layer, tokens and density, dense's and cuBLAS's on the same bytes."""
    return (f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: dense {row['dense_us']:.1f} floor "
            f"{row['same_bytes_us']:.1f}")


def record(row, **measured) -> dict:
    """A row's JSON record: its layer, tokens, density, dense's and the floor's µs, and what was measured."""
    return {k: row[k] for k in ("in", "out", "tokens", "density", "dense_us", "same_bytes_us")} | measured


def keyed(timings: dict) -> dict:
    """Configs' timings for JSON: each config tuple as ``"a,b,c"``."""
    return {",".join(map(str, c)): t for c, t in timings.items()}


def write_rows(path: str | None, rows: list) -> None:
    """The rows as JSON at ``path`` (none: nothing), with the device's name."""
    if path:
        import json

        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


def routed_and_reference(mods, x, dev, layers: int):
    """The layers through the package's route, tuned anew (its choices and plans forgotten first): GPU µs a layer,
    graph-replayed, and the first layer's output as float32, the reference a probe's configs are checked against."""
    from opforge.kernels.block_sparse import triton_impl

    with torch.no_grad():
        triton_impl.DECODE_ROUTE.forget()
        triton_impl.forget_plans()
        routed = graph_us(lambda: [m(x) for m in mods], dev, layers)
        return routed, mods[0](x).float()


def tuned_anew() -> None:
    """Forget every decode route's choice, plan and config, in the process and in opforge's cache: the next calls
    tune from nothing."""
    import shutil

    from opforge import settings
    from opforge.engine.inventory import TUNING_DIR
    from opforge.kernels.block_sparse import triton_impl

    triton_impl.forget_plans()  # the plans and the routes' choices
    for k in triton_impl.KERNELS.values():
        k.forget()
    shutil.rmtree(os.path.join(settings.current().cache_dir, TUNING_DIR), ignore_errors=True)


def picked() -> list[str]:
    """The decode kernels the planned forward calls took (the plans' kinds)."""
    from opforge.kernels.block_sparse import triton_impl

    return sorted({str(p.facts[0] if isinstance(p.facts, tuple) else p.facts)
                   for p in triton_impl._FWD.values() if not isinstance(p, str)})


def checked_timings(configs, run, mods, x, ref, dev, layers: int) -> dict:
    """GPU µs a layer of ``run(module, x, config)`` over ``mods`` for each config, graph-replayed, each config's
    output first checked against ``ref`` (within 2e-2 of its largest element)."""
    timings = {}
    for cfg in configs:
        got = run(mods[0], x, cfg).float()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, (cfg, err)
        timings[cfg] = graph_us(lambda: [run(m, x, cfg) for m in mods], dev, layers)  # noqa: B023
    return timings


def main() -> None:
    args = probe_args(argparse.ArgumentParser()).parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    print(f"{torch.cuda.get_device_name()}, bf16, {n} layers rotated, graph-replayed, µs per layer")
    tiny = [torch.zeros(1, device=dev) for _ in range(n)]
    print(f"launch floor (1-element zero_): {graph_us(lambda: [t.zero_() for t in tiny], dev, n):.2f}")
    for row in issue_rows(args, dev, dt):
        x, dense, same, mods = row["x"], row["dense_us"], row["same_bytes_us"], row["mods"]
        total = [w.view(-1) for w in row.pop("weights")]
        summed = graph_us(lambda: [w.sum() for w in total], dev, n)  # noqa: B023
        total = None
        with torch.no_grad():
            ours = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
        print(f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: cuBLAS same bytes "
              f"({row['in']}->{row['same_rows']}) {same:.1f} (best possible {dense / same:.2f}x dense); torch sum "
              f"same bytes {summed:.1f}; opforge {ours:.1f} ({dense / ours:.2f}x dense, {100 * same / ours:.0f}% of "
              f"the floor)", flush=True)


if __name__ == "__main__":
    main()
