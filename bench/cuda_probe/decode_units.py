"""Probe: a decode forward that cuts no block-row across programs (issue 35). The kept blocks'
rows are cut the other way, along the output: a block-row of ``BH`` outputs is ``BH // SUB``
*units* of ``SUB`` outputs, each of which reads its ``SUB`` rows (contiguous, ``SUB * BW``
elements) of every block in the row. Units are dealt out in order to the programs, a unit to the
program whose equal share of the slices its first slice falls in, so each output is summed whole
by one program: no partial sums, no arrival counts, no waiting (``_decode_kernel`` cuts rows along
K and has a program finish each cut row, which costs it a wait and two round trips at its end).

The price: a program's share is equal only to within one unit, and a unit reads a thinner tile
(``SUB`` rows of w), so fewer bytes are in flight a program. What this probe measures: whether the
no-wait kernel, best of its configs, beats the production path (``BlockSparseLinear`` as in use,
tuned) on the issue's rows, graph-replayed over 16 rotated layers, beside dense and cuBLAS on
the same bytes (the floor).

The data in ``docs/data/block_sparse_decode_units_h100.json`` came from this probe's own copy of the
kernel (int32 indices, no bias), which became ``triton_decode._decode_uncut_kernel``; the probe now
launches that.

Usage::

    python bench/cuda_probe/decode_units.py [--shapes 4096x14336,14336x4096] [--tokens 1,16,64]
        [--densities 0.5,0.25,0.1] [--layers 16] [--json FILE]
    python bench/cuda_probe/decode_units.py --check     # the kernel against masked dense, small sizes
                                                        # (TRITON_INTERPRET=1 runs it on a CPU)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton

from opforge.kernels.block_sparse.triton_decode import _decode_uncut_kernel


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def units_forward(x, w, cols, row_ptr, out_features, sub, waves, sms, num_warps=4, num_stages=4, y=None):
    """y = x @ W^T for the kept blocks ``w`` (nnz, bh, bw) at cols / row_ptr (int32)."""
    nnz, bh, bw = w.shape
    tokens, k_in = x.shape
    total = (bh // sub) * nnz
    chunk = max(1, triton.cdiv(total, waves * sms))
    programs = max(1, triton.cdiv(total, chunk))
    y = torch.empty(tokens, out_features, dtype=x.dtype, device=x.device) if y is None else y
    prec = "ieee" if x.dtype == torch.float32 else "tf32"
    _decode_uncut_kernel[(programs,)](x, w, w, y, cols, row_ptr, tokens, k_in, out_features, total, chunk,
                                      BH=bh, BW=bw, SUB=sub, HAS_BIAS=False, PRECISION=prec, BLOCK_K=min(bw, 64),
                                      SEARCH=min(1024, max(16, _pow2(out_features // bh))), OVERLAP=False,
                                      BLOCK_M=max(16, _pow2(tokens)), WAVES=waves, num_warps=num_warps, num_stages=num_stages)
    return y


def _indices(layout, device):
    idx = layout.indices("cpu")
    return idx.cols.to(torch.int32).to(device), idx.row_ptr.to(torch.int32).to(device)


def check(device: str) -> None:
    """Every SUB and programs count against masked dense, on layouts with empty, full and uneven rows."""
    from opforge.kernels.block_sparse.layout import BlockSparseLayout

    g = torch.Generator().manual_seed(0)
    bad = 0
    cases = 0
    for (bh, bw), (rows, cols_n), tokens, dtype in itertools.product(
            ((16, 16), (32, 64), (64, 64), (64, 32)), ((3, 4), (5, 2)), (1, 3, 17),
            (torch.float32, torch.float16)):
        mask = torch.rand(rows, cols_n, generator=g) < 0.5
        mask[0] = False
        mask[-1] = True
        layout = BlockSparseLayout(mask, (bh, bw))
        n_out, k_in = rows * bh, cols_n * bw
        w = torch.randn(layout.nnz, bh, bw, generator=g).to(dtype).to(device)
        x = torch.randn(tokens, k_in, generator=g).to(dtype).to(device)
        c, rp = _indices(layout, device)
        ref = x.double() @ layout.scatter(w.double().cpu()).to(device).t()
        for sub in (16, 32, 64):
            if sub > bh:
                continue
            for waves, sms in ((1, 1), (1, 3), (2, 7), (8, 132)):
                y = units_forward(x, w, c, rp, n_out, sub, waves, sms,
                                  y=torch.full((tokens, n_out), float("nan"), dtype=dtype, device=device))
                cases += 1
                tol = 1e-4 if dtype == torch.float32 else 2e-3
                if not torch.allclose(y.double(), ref, atol=tol * k_in ** 0.5, rtol=tol):
                    bad += 1
                    print(f"BAD bh={bh} bw={bw} grid={rows}x{cols_n} T={tokens} {dtype} sub={sub} "
                          f"waves={waves} sms={sms}: max err {(y.double() - ref).abs().max():.3g}")
    print(json.dumps({"cases": cases, "bad": bad}))
    if bad:
        sys.exit(1)


def bench(args) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from decode_floor import graph_us, issue_rows  # bench/block_sparse_decode.py's graph_us

    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    configs = [(sub, waves, warps, stages) for sub in args.subs for waves in args.waves for warps, stages in args.pipes]
    for row in issue_rows(args, dev, dt, seed=1):
        x, mods, t, n_out, dense, same = row.pop("x"), row.pop("mods"), row["tokens"], row["out"], row["dense_us"], \
            row["same_bytes_us"]
        row.pop("weights")
        with torch.no_grad():
            ours = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
            ref = F.linear(x, mods[0].to_dense())
        idx = [_indices(m.layout, dev) for m in mods]
        wb = [m.weight_blocks.detach() for m in mods]
        ys = [torch.empty(t, n_out, device=dev, dtype=dt) for _ in range(n)]
        err = float((units_forward(x, wb[0], *idx[0], n_out, min(args.subs), 2, sms).double() - ref.double()).norm()
                    / ref.double().norm())
        timings = {}
        for cfg in configs:
            sub, waves, warps, stages = cfg
            try:
                timings[cfg] = graph_us(lambda: [units_forward(x, wb[i], *idx[i], n_out, sub, waves, sms, warps,  # noqa: B023
                                                               stages, ys[i]) for i in range(n)], dev, n)
            except Exception as exc:  # noqa: BLE001 - a config that does not fit: skipped
                timings[cfg] = None
                print(f"    {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
        best = min((v, k) for k, v in timings.items() if v is not None)
        by_sub = {s: min(v for k, v in timings.items() if v is not None and k[0] == s) for s in args.subs}
        row.update({"opforge_us": ours, "units_best_us": best[0], "units_best_config": best[1], "units_err": err,
                    "units_by_sub": by_sub, "units_all": {str(k): v for k, v in timings.items()}})
        out["rows"].append(row)
        print(f"{row['in']}->{n_out} T={t} d={row['density']}: dense {dense:.1f}, floor {same:.1f} ({dense / same:.2f}x); "
              f"opforge {ours:.1f} ({dense / ours:.2f}x, {100 * same / ours:.0f}% of floor); units "
              f"{best[0]:.1f} ({dense / best[0]:.2f}x, {100 * same / best[0]:.0f}%) {best[1]} err {err:.1e}; "
              f"by SUB " + " ".join(f"{s}:{v:.1f}" for s, v in by_sub.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from decode_floor import probe_args

    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--subs", default="16,32,64", type=lambda v: tuple(map(int, v.split(","))))
    ap.add_argument("--waves", default="1,2,3,4,8", type=lambda v: tuple(map(int, v.split(","))))
    ap.add_argument("--pipes", default="4x4,4x8,2x8,4x12", help="warps x stages, comma-separated",
                    type=lambda v: tuple(tuple(map(int, p.split("x"))) for p in v.split(",")))
    ap.set_defaults(tokens="1,16,64")
    args = ap.parse_args()
    if args.check:
        check("cuda" if torch.cuda.is_available() else "cpu")
    else:
        bench(args)


if __name__ == "__main__":
    main()
