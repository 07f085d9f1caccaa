"""Probe: why equal shares of a decode layer's bytes don't end together, and whether handing out the
last of them on demand closes the gap (issue 35).

The fifteenth session's trace found the slowest decode program ending its stream ~2 µs after the
median one, on equal shares (docs/benchmarks.md, issue 35). This probe asks the same of the bare read
(``decode_read_floor.py``'s kernel: each program sums its share of a flat bf16 weight, launched as a
programmatic dependent, its first lines asked into L2 before the wait), with a stamp per program:
the SM it ran on (``%smid``), the global timer when the wait let it go and when its stream ended, and
its SM's cycles in between. Then:

* **static**: program ``p`` reads share ``p`` (as the floor and the decode kernels do);
* **dynamic**: program ``p`` reads a static share of ``--static`` of the bytes (a fraction), then takes
  grains of ``--grain`` elements from a counter (``atomic_add``, relaxed) until none are left; the next
  grain's ticket is asked before the current grain is read, so the counter's trip is under the stream.
  The last program out zeroes the counter for the next launch.

Each is graph-replayed over ``--layers`` rotated weights (their own bytes). Reported per variant: µs
per layer, and from the stamps: the stream's length per program (median, p90, max), the ends' spread,
and whether the slow programs are the same SMs from one layer to the next (the rank correlation of
the SMs' mean stream time between the even and the odd layers): a systematic spread (SMs that get
less bandwidth, e.g. in the fuller GPCs) is what handing out work on demand can fix.

Usage::

    python bench/cuda_probe/decode_spread.py [--densities 0.5,0.25,0.1] [--shape 4096x14336] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from block_sparse_decode import graph_us  # noqa: E402


@triton.jit
def _clock(asm: tl.constexpr):
    return tl.inline_asm_elementwise(asm, "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _read(w_ptr, a, b, acc, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for s in range(a, b, BLOCK):
        acc += tl.load(w_ptr + s + offs, mask=s + offs < b, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _spread_kernel(w_ptr, out_ptr, stamp_ptr, ctr_ptr, N, SHARE, BASE, GRAIN, GRAINS, BLOCK: tl.constexpr,
                   DYNAMIC: tl.constexpr):
    p = tl.program_id(0)
    P = tl.num_programs(0)
    lo = p.to(tl.int64) * SHARE
    lines = tl.arange(0, 128)  # the share's first 128 lines (16 KB) into L2, as _decode_start
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                              [w_ptr + lo + tl.minimum(lines * 64, tl.maximum(tl.minimum(SHARE, N - lo) - 1, 0))],
                              dtype=tl.int32, is_pure=False, pack=1)
    gdc_wait()
    t0 = _clock("mov.u64 $0, %globaltimer;")
    c0 = _clock("mov.u64 $0, %clock64;")
    acc = _read(w_ptr, lo, tl.minimum(lo + SHARE, N), tl.zeros((BLOCK,), dtype=tl.float32), BLOCK)
    taken = tl.full((), 0, tl.int32)
    if DYNAMIC:
        g = tl.atomic_add(ctr_ptr, 1, sem="relaxed")
        while g < GRAINS:
            nxt = tl.atomic_add(ctr_ptr, 1, sem="relaxed")  # asked now, used after this grain
            a = BASE + g.to(tl.int64) * GRAIN
            acc = _read(w_ptr, a, tl.minimum(a + GRAIN, N), acc, BLOCK)
            taken += 1
            g = nxt
        if tl.atomic_add(ctr_ptr + 1, 1, sem="relaxed") == P - 1:  # the last out: every ticket is taken
            tl.atomic_xchg(ctr_ptr, 0, sem="relaxed")
            tl.atomic_xchg(ctr_ptr + 1, 0, sem="relaxed")
    c1 = _clock("mov.u64 $0, %clock64;")
    t1 = _clock("mov.u64 $0, %globaltimer;")
    gdc_launch_dependents()
    tl.store(out_ptr + p, tl.sum(acc, axis=0))
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    at = stamp_ptr + p * 5
    tl.store(at, sm.to(tl.int64))
    tl.store(at + 1, t0)
    tl.store(at + 2, t1)
    tl.store(at + 3, c1 - c0)
    tl.store(at + 4, taken.to(tl.int64))


def _rank(xs):
    order = sorted(range(len(xs)), key=xs.__getitem__)
    r = [0.0] * len(xs)
    for i, j in enumerate(order):
        r[j] = float(i)
    return r


def _corr(a, b):
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    den = (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5
    return num / den if den else 0.0


def variant(weights, dev, waves, warps, block, static, grain):
    """Graph µs per layer and the stamps' summary for one variant (``static`` None: all static)."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    n = weights[0].numel()
    programs = waves * sms
    dynamic = static is not None
    if dynamic:
        share = (int(n * static) // programs) // block * block
        base = share * programs
        grains = -(-(n - base) // grain)
    else:
        share = -(-n // (programs * 4096)) * 4096
        base, grains = n, 0
    outs = [torch.empty(programs, device=dev) for _ in weights]
    stamps = [torch.zeros(programs, 5, dtype=torch.int64, device=dev) for _ in weights]
    ctrs = [torch.zeros(2, dtype=torch.int32, device=dev) for _ in weights]

    def layers():
        for w, o, s, c in zip(weights, outs, stamps, ctrs):
            _spread_kernel[(programs,)](w, o, s, c, n, share, base, grain, grains, BLOCK=block, DYNAMIC=dynamic,
                                        num_warps=warps, launch_pdl=True)
    us = graph_us(layers, dev, len(weights))
    ref = weights[-1].float().sum().item()
    got = outs[-1].sum().item()
    if abs(got - ref) > 1e-2 * max(1.0, abs(ref)) + 1e-3 * n ** 0.5:
        raise AssertionError(f"the read's sum {got} is not the weight's {ref}")
    if any(int(c.abs().sum()) for c in ctrs):
        raise AssertionError("a counter was not zeroed by the last program out")
    rate = torch.cuda.get_device_properties(dev).clock_rate * 1e3  # Hz (the SM's nominal clock)
    st = [s.cpu().tolist() for s in stamps]
    lens, spreads, taken = [], [], []
    per_sm = [{} for _ in st]
    for i, layer in enumerate(st):
        start = min(r[1] for r in layer)
        ends = sorted(r[2] - start for r in layer)
        spreads.append((ends[-1] - ends[len(ends) // 2]) / 1e3)
        for sm, t0, t1, _cycles, k in layer:
            lens.append((t1 - t0) / 1e3)
            taken.append(k)
            per_sm[i].setdefault(sm, []).append((t1 - t0) / 1e3)
    lens.sort()
    common = sorted(set.intersection(*(set(d) for d in per_sm)))
    even = [statistics.fmean([statistics.fmean(per_sm[i][sm]) for i in range(0, len(st), 2)]) for sm in common]
    odd = [statistics.fmean([statistics.fmean(per_sm[i][sm]) for i in range(1, len(st), 2)]) for sm in common]
    return {"waves": waves, "warps": warps, "block": block, "static": static, "grain": grain, "us": us,
            "stream_median_us": lens[len(lens) // 2], "stream_p90_us": lens[int(len(lens) * 0.9)],
            "stream_max_us": lens[-1], "end_spread_us": statistics.median(spreads),
            "sm_rank_corr": _corr(_rank(even), _rank(odd)), "grains_max": max(taken), "grains_median":
            statistics.median(taken), "clock_hz": rate,
            "sm_mean_us": {int(sm): statistics.fmean(sum((per_sm[i].get(sm, []) for i in range(len(st))), []))
                           for sm in common}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--densities", default="0.5,0.25,0.1")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--configs", default="4x8x4096,2x4x2048,2x8x4096", help="programs per SM x warps x tile")
    ap.add_argument("--statics", default="0.7,0.85", help="the static fractions of the dynamic variants")
    ap.add_argument("--grains", default="8192,32768", help="the dynamic variants' grains, in elements")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    k_in, n_out = map(int, args.shape.split("x"))
    out = {"device": torch.cuda.get_device_name(), "shape": args.shape, "rows": []}
    print(f"{out['device']}, bf16, {args.layers} layers rotated, graph-replayed, µs per layer", flush=True)
    for d in map(float, args.densities.split(",")):
        n = round(k_in * n_out * d / 4096) * 4096
        weights = [torch.randn(n, device=dev, dtype=dt) for _ in range(args.layers)]
        for config in args.configs.split(","):
            waves, warps, block = map(int, config.split("x"))
            plans = [(None, 0)] + [(float(s), int(g)) for s in args.statics.split(",") for g in args.grains.split(",")]
            for static, grain in plans:
                r = variant(weights, dev, waves, warps, block, static, grain)
                r["density"], r["bytes"] = d, n * 2
                out["rows"].append(r)
                name = "static" if static is None else f"dynamic {static:.2f}+{grain // 1024}K"
                print(f"d={d} {waves}/SM w{warps} B{block} {name:>18}: {r['us']:.2f} us/layer; stream median "
                      f"{r['stream_median_us']:.2f} p90 {r['stream_p90_us']:.2f} max {r['stream_max_us']:.2f}; ends' "
                      f"spread {r['end_spread_us']:.2f}; SM rank corr {r['sm_rank_corr']:.2f}; grains "
                      f"{r['grains_median']:.0f}/{r['grains_max']}", flush=True)
        weights = None
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
