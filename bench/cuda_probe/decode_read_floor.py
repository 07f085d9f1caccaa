"""Probe: the floor of a decode layer that overlaps the layer before it (issue 35). Since the
fourteenth session the decode kernels launch as programmatic dependents, and at density 0.1 they
beat cuBLAS on the same bytes, the floor ``decode_floor.py`` measures. This one measures a bare
read of the same bytes, launched the way the decode kernels are:

* ``_read_kernel``: program ``p`` reads its equal share of a flat weight (16-byte vector loads, a
  tile of ``BLOCK`` elements a step) and stores one fp32 sum, so no load can be dropped; no index,
  no x, no math but the sum;
* **plain**: launched as a plain kernel; **overlapped**: as a programmatic dependent, its first
  128 lines asked into L2 before ``griddepcontrol.wait``, letting the next start once its share is
  read (``_decode_kernel``'s start, ``triton_decode._decode_start``).

Each is graph-replayed over ``--layers`` rotated copies (their own bytes, as the layers' weights),
with a small sweep of programs per SM, warps and tile (the floor is the fastest of them). Beside
them: dense ``F.linear`` over the whole weight, cuBLAS on the same bytes, and opforge's
``BlockSparseLinear`` at that density, all in the same process. The best a sparse layer could do
against dense is dense's time over the overlapped read's.

Usage::

    python bench/cuda_probe/decode_read_floor.py [--shapes 4096x14336,14336x4096] [--tokens 1]
        [--densities 0.5,0.25,0.1] [--layers 16] [--json FILE]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us, issue_rows, probe_args  # bench/block_sparse_decode.py's graph_us


@triton.jit
def _read_kernel(w_ptr, out_ptr, N, CHUNK, OVERLAP: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    lo = p.to(tl.int64) * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    if OVERLAP:
        lines = tl.arange(0, 128)  # the share's first 128 lines (16 KB) into L2, as _decode_start
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                  [w_ptr + lo + tl.minimum(lines * 64, tl.maximum(hi - lo - 1, 0))],
                                  dtype=tl.int32, is_pure=False, pack=1)
        gdc_wait()
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    for s in range(lo, hi, BLOCK):
        acc += tl.load(w_ptr + s + offs, mask=s + offs < hi, other=0.0).to(tl.float32)
    if OVERLAP:
        gdc_launch_dependents()
    tl.store(out_ptr + p, tl.sum(acc, axis=0))


def read_floor(weights: list, dev, n: int, overlap: bool) -> tuple[float, str]:
    """The fastest graph-replayed µs per layer of reading each of ``weights`` (flat bf16) in turn,
    over a small sweep of programs per SM, warps and tile; and the config that gave it."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    numel = weights[0].numel()
    best = (float("inf"), "")
    for waves in (2, 4, 8):
        programs = waves * sms
        chunk = -(-numel // (programs * 4096)) * 4096  # a multiple of every tile: aligned 16-byte loads
        outs = [torch.empty(programs, device=dev) for _ in weights]
        for warps, block in ((4, 2048), (8, 4096), (4, 4096)):
            def layer(w, o):
                _read_kernel[(programs,)](w, o, numel, chunk, OVERLAP=overlap, BLOCK=block, num_warps=warps,
                                          launch_pdl=overlap)
            us = graph_us(lambda: [layer(w, o) for w, o in zip(weights, outs)], dev, n)  # noqa: B023
            ref = weights[-1].float().sum().item()
            got = outs[-1].sum().item()
            if abs(got - ref) > 1e-2 * max(1.0, abs(ref)) + 1e-3 * numel ** 0.5:
                raise AssertionError(f"the read kernel's sum {got} is not the weight's {ref}")
            if us < best[0]:
                best = (us, f"{waves}/SM w{warps} B{block}")
    return best


def main() -> None:
    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--json")
    ap.set_defaults(tokens="1")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    print(f"{out['device']}, bf16, {n} layers rotated, graph-replayed, µs per layer")
    for row in issue_rows(args, dev, dt):
        x, mods = row.pop("x"), row.pop("mods")
        flat = [w.view(-1) for w in row.pop("weights")]
        row["plain_us"], row["plain_config"] = read_floor(flat, dev, n, overlap=False)
        row["overlapped_us"], row["overlapped_config"] = read_floor(flat, dev, n, overlap=True)
        flat = None
        with torch.no_grad():
            row["opforge_us"] = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
        dense = row["dense_us"]
        out["rows"].append(row)
        print(f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: dense {dense:.1f}; cuBLAS same bytes "
              f"{row['same_bytes_us']:.1f} ({dense / row['same_bytes_us']:.2f}x); read {row['plain_us']:.1f} "
              f"({dense / row['plain_us']:.2f}x, {row['plain_config']}); overlapped read {row['overlapped_us']:.1f} "
              f"({dense / row['overlapped_us']:.2f}x, {row['overlapped_config']}); opforge {row['opforge_us']:.1f} "
              f"({dense / row['opforge_us']:.2f}x, {100 * row['overlapped_us'] / row['opforge_us']:.0f}% of the "
              f"overlapped floor)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
