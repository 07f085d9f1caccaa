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
def _read_kernel(w_ptr, out_ptr, scan_ptr, own_ptr, N, CHUNK, ROWS, OVERLAP: tl.constexpr, BLOCK: tl.constexpr,
                 CHAIN: tl.constexpr = 0, SEARCH: tl.constexpr = 256):
    p = tl.program_id(0)
    lo = p.to(tl.int64) * CHUNK
    if OVERLAP:
        lines = tl.arange(0, 128)  # the share's first 128 lines (16 KB) into L2, as _decode_start
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                  [w_ptr + lo + tl.minimum(lines * 64, tl.maximum(tl.minimum(CHUNK, N - lo) - 1, 0))],
                                  dtype=tl.int32, is_pure=False, pack=1)
        gdc_wait()
    # the dependent reads a decode program makes before its first block (``--chains``): each gives a
    # zero that the compiler can't see is zero, and the stream's start waits for it
    z = tl.zeros((), dtype=tl.int64)
    if CHAIN % 2 == 1:  # the layout search: every program scans the same ROWS + 1 int64 (row_ptr's)
        for r0 in range(0, ROWS + 1, SEARCH):
            rr = r0 + tl.arange(0, SEARCH)
            z += tl.sum(tl.load(scan_ptr + rr, mask=rr <= ROWS, other=0), axis=0)
            z += tl.sum(tl.load(scan_ptr + rr + 1, mask=rr < ROWS, other=0), axis=0)
    if CHAIN // 2 == 1:  # one read of the program's own entry (a line of its own)
        z += tl.load(own_ptr + p * 16)
    lo += z * 4096  # as aligned as the bare read's start: the same 16-byte loads
    hi = tl.minimum(lo + CHUNK, N)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    for s in range(lo, hi, BLOCK):
        acc += tl.load(w_ptr + s + offs, mask=s + offs < hi, other=0.0).to(tl.float32)
    if OVERLAP:
        gdc_launch_dependents()
    tl.store(out_ptr + p, tl.sum(acc, axis=0))


def read_floor(weights: list, dev, n: int, overlap: bool, chain: int = 0, rows: int = 0,
               sweep=((2, 4, 2048), (2, 8, 4096), (2, 4, 4096), (4, 4, 2048), (4, 8, 4096), (4, 4, 4096),
                      (8, 4, 2048), (8, 8, 4096), (8, 4, 4096))) -> tuple[float, str]:
    """The fastest graph-replayed µs per layer of reading each of ``weights`` (flat bf16) in turn,
    over ``sweep`` (programs per SM, warps, tile); and the config that gave it. ``chain``: the
    dependent reads before the stream (``_read_kernel``'s CHAIN), over ``rows`` block-rows."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    numel = weights[0].numel()
    best = (float("inf"), "")
    scans = [torch.zeros(rows + 1, dtype=torch.int64, device=dev) for _ in weights]  # a layer's own, as row_ptr
    search = min(1024, max(16, triton.next_power_of_2(rows + 1)))
    for waves, warps, block in sweep:
        programs = waves * sms
        chunk = -(-numel // (programs * 4096)) * 4096  # a multiple of every tile: aligned 16-byte loads
        outs = [torch.empty(programs, device=dev) for _ in weights]
        owns = [torch.zeros(programs * 16, dtype=torch.int64, device=dev) for _ in weights]

        def layer(w, o, sc, ow):
            _read_kernel[(programs,)](w, o, sc, ow, numel, chunk, rows, OVERLAP=overlap, BLOCK=block,  # noqa: B023
                                      CHAIN=chain, SEARCH=search, num_warps=warps, launch_pdl=overlap)  # noqa: B023
        us = graph_us(lambda: [layer(*a) for a in zip(weights, outs, scans, owns)], dev, n)  # noqa: B023
        ref = weights[-1].float().sum().item()
        got = outs[-1].sum().item()
        if abs(got - ref) > 1e-2 * max(1.0, abs(ref)) + 1e-3 * numel ** 0.5:
            raise AssertionError(f"the read kernel's sum {got} is not the weight's {ref}")
        if us < best[0]:
            best = (us, f"{waves}/SM w{warps} B{block}")
    return best


def chains(weights: list, dev, n: int, rows: int, config: str) -> dict:
    """The overlapped read at ``config`` (the bare read's best) with each chain of dependent reads
    before the stream: {CHAIN: µs}."""
    waves, warps, block = config.split()
    sweep = ((int(waves.split("/")[0]), int(warps[1:]), int(block[1:])),)
    return {chain: read_floor(weights, dev, n, True, chain, rows, sweep)[0] for chain in (0, 1, 2, 3)}


def main() -> None:
    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--json")
    ap.add_argument("--chains", action="store_true",
                    help="also the overlapped read at its best config after each chain of dependent reads a decode "
                         "program makes before its first block: none (0), the layout search (1: all programs scan "
                         "the layer's row_ptr-sized int64 array), one read of its own entry (2), both (3)")
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
        if args.chains:
            row["chains_us"] = chains(flat, dev, n, row["out"] // 64, row["overlapped_config"])
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
              f"overlapped floor)" + ("; chains " + " ".join(f"{k}:{v:.1f}" for k, v in row["chains_us"].items())
                                      if args.chains else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
