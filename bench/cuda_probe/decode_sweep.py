"""What the probes that time edited copies of the package's decode kernels share (``decode_gemv.py``,
``decode_shares.py``, ``decode_one_token.py``, ``decode_uncut_fma.py``): a row of issue 35 as rotated
layers, set up once (``rotated_row``); each config of a variant timed under graph replay and its output
checked (``time_config``); the best config of each variant (``keep_best``); the line printed and the JSON
written for a row (``report``); and, for their ``--check`` runs on the CPU, a tiny random layout with its
inputs (``tiny_case``).
"""

from __future__ import annotations

import json
import types

import torch
from decode_floor import graph_us  # bench/block_sparse_decode.py's

from opforge.kernels.block_sparse import triton_sizing
from opforge.kernels.block_sparse.layout import BlockSparseLayout


def rotated_row(k_in: int, n_out: int, tokens: int, density: float, layers: int, dev,
                dt=torch.bfloat16) -> types.SimpleNamespace:
    """``layers`` random 64-block layouts of ``k_in -> n_out`` at ``density`` (seed 0) with their weights,
    one x of ``tokens`` rows, an output, a count buffer a layer and one slot buffer (empty slots) for all,
    the decode start (``early``, ``overlap``), fp32 references of the first and last layer, and dense
    ``F.linear``'s graph µs a layer over as many rotated weights (``dense_us``). ``row`` is the result
    row the probe fills."""
    g = torch.Generator().manual_seed(0)
    lays = [BlockSparseLayout.random(n_out, k_in, density, (64, 64), generator=g) for _ in range(layers)]
    ws = [torch.randn(lay.nnz, 64, 64, device=dev, dtype=dt) for lay in lays]
    x = torch.randn(tokens, k_in, device=dev, dtype=dt)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    early, overlap = triton_sizing.decode_start(dev)
    dense_w = [torch.randn(n_out, k_in, device=dev, dtype=dt) for _ in range(layers)]
    dense_us = graph_us(lambda: [torch.nn.functional.linear(x, dw) for dw in dense_w], dev, layers)
    dense_w.clear()
    return types.SimpleNamespace(
        k_in=k_in, n_out=n_out, tokens=tokens, layers=layers, dev=dev, lays=lays, ws=ws, x=x, sms=sms,
        early=early, overlap=overlap, dense_us=dense_us,
        idx=[lay.indices(dev) for lay in lays],
        ys=[torch.empty(tokens, n_out, device=dev, dtype=dt) for _ in range(layers)],
        counts=[torch.zeros(n_out // 64, dtype=torch.int32, device=dev) for _ in range(layers)],
        part=torch.full((8 * sms + 8, tokens, 64), triton_sizing.SLOT_EMPTY, dtype=torch.int32, device=dev),
        refs=[x.float() @ lays[i].scatter(ws[i].float()).t() for i in (0, layers - 1)],
        row={"in": k_in, "out": n_out, "tokens": tokens, "density": density, "dense_us": dense_us, "all": []})


def time_config(rot, name: str, config: dict, layers, slots_emptied: bool = True) -> None:
    """Graph µs a layer of ``layers()`` (a launch on each of ``rot``'s layers) as ``name`` at ``config``
    (waves, pipe, flat), into ``rot.row["all"]``. The first and last layer's outputs must match their
    references, the counts be back at zero and, with ``slots_emptied``, the slots empty again. A config
    that doesn't compile is reported and skipped."""
    try:
        us = graph_us(layers, rot.dev, rot.layers)
    except Exception as exc:  # noqa: BLE001 - a config that doesn't compile: reported
        print(f"  {name} waves {config['waves']} {config['pipe']} flat {config['flat']}: {type(exc).__name__}: "
              f"{str(exc)[:120]}")
        return
    for j, i in enumerate((0, rot.layers - 1)):
        ref = rot.refs[j]
        torch.testing.assert_close(rot.ys[i].float(), ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)
    assert not any(c.any() for c in rot.counts), name
    assert not slots_emptied or bool((rot.part == triton_sizing.SLOT_EMPTY).all()), "slots not emptied"
    rot.row["all"].append({"variant": name, **config, "us": us})


def keep_best(rot, names) -> dict:
    """``rot.row`` with, for each of ``names`` timed at least once, its fastest config and × dense."""
    for name in names:
        timed = [e for e in rot.row["all"] if e["variant"] == name]
        if timed:
            best = min(timed, key=lambda e: e["us"])
            rot.row[name] = {k: best[k] for k in ("us", "waves", "pipe", "flat")} | {
                "x_dense": rot.dense_us / best["us"]}
    return rot.row


def report(res: dict, row: dict, names, path: str | None) -> None:
    """Print ``row`` (its variants of ``names`` at their best configs) and write ``res`` to ``path``."""
    res["rows"].append(row)
    print(f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: dense {row['dense_us']:.1f}; "
          + "; ".join(f"{k} {row[k]['us']:.2f} ({row[k]['x_dense']:.2f}x, w{row[k]['waves']} {row[k]['pipe']}"
                      f"{' flat' if row[k]['flat'] else ''})" for k in names if k in row), flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def tiny_case(i: int, g: torch.Generator, max_rows: int, max_cols: int):
    """Layout ``i`` of a ``--check`` run, for one token: blocks of 16x16, 32x16, 16x64 and 16x128 in turn,
    up to ``max_rows`` x ``max_cols`` of them; all kept (``i`` 0), none (1), else a random density. Returns
    (layout, its indices, out and in features, x, w, b), drawn from ``g``."""
    bh, bw = ((16, 16), (32, 16), (16, 64), (16, 128))[i % 4]
    grid = (int(torch.randint(1, max_rows + 1, (1,), generator=g)), int(torch.randint(1, max_cols + 1, (1,), generator=g)))
    mask = torch.rand(grid, generator=g) < (1.0 if i == 0 else 0.0 if i == 1 else torch.rand(1, generator=g).item())
    lay = BlockSparseLayout(mask, (bh, bw))
    idx, (n_out, k_in) = lay.indices(), lay.shape
    x = torch.randn(1, k_in, generator=g)
    w = torch.randn(lay.nnz, bh, bw, generator=g)
    b = torch.randn(n_out, generator=g)
    return lay, idx, n_out, k_in, x, w, b
