"""Probe: each of the decode route's forwards on issue 35's rows, and what the route picks. For each
layer shape, T and density: 16 rotated ``BlockSparseLinear`` layers (64-blocks, random layouts),
graph-replayed, GPU µs per layer, with the route made to take each of ``DECODE_ROUTE.names`` alone
(its config tuned as in use), then the route as in use (each timed once, the fastest kept) and the
plan it made. Beside them: dense ``F.linear`` and cuBLAS on the same bytes (the floor).

Usage::

    python bench/cuda_probe/decode_routes.py [--shapes 4096x14336,14336x4096] [--tokens 1,16,64]
        [--densities 0.5,0.25,0.1] [--layers 16] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us, issue_rows, picked, probe_args, tuned_anew


def main() -> None:
    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--json")
    ap.add_argument("--warmup-ms", type=float, help="time the candidates with this much do_bench warm-up (opforge: 5)")
    ap.add_argument("--timer", choices=("dobench", "read"), default="dobench",
                    help="how configs and candidates are timed: triton's do_bench (an L2 flush that writes 256 MB "
                         "before each run: opforge's), or read (a flush that reads 256 MB, the median of the runs)")
    ap.add_argument("--picks", type=int, default=1, help="the route as in use this many times, tuned anew each")
    ap.add_argument("--route-timing", default="graph",
                    help="how the route as in use times its configs and candidates, comma-separated for each in turn: "
                         "graph (the package's: graph replay on stand-ins past L2) or dobench (triton's do_bench, "
                         "an L2 flush before each lone launch: the package's before the eighteenth session)")
    ap.add_argument("--names", help="only these of the route's candidates alone (default: all)")
    ap.add_argument("--starts", default="",
                    help="each candidate alone under each of these decode starts too, EARLY:OVERLAP pairs (e.g. "
                         "0:0,128:0,0:1,128:1: the early L2 lines, launched as a programmatic dependent or not); "
                         "a column NAME@EARLY:OVERLAP each. The route as in use runs with the package's own")
    ap.set_defaults(tokens="1,16,64")
    args = ap.parse_args()
    from opforge.kernels import triton_launch
    from opforge.kernels.block_sparse import triton_impl

    if args.warmup_ms is not None:
        from triton.testing import do_bench

        triton_launch.TunedKernel._time = lambda self, fn: do_bench(fn, warmup=args.warmup_ms, rep=25)

    if args.timer == "read":
        from opforge.kernels import tuned_op

        def read_timer(self, fn, reps: int = 100):
            flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
            for _ in range(5):
                fn()
            times = []
            for _ in range(reps):
                flush.sum(dtype=torch.int32)  # L2 full of clean lines, as after a layer that read its weights
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            return sorted(times)[len(times) // 2]
        triton_launch.TunedKernel._time = read_timer
        tuned_op.TunedOp._time = read_timer

    from opforge.kernels.block_sparse import triton_sizing

    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    route = triton_impl.DECODE_ROUTE
    names = route.names
    alone = tuple(args.names.split(",")) if args.names else names
    own = (triton_sizing.DECODE_EARLY_LINES, triton_sizing.overlap)
    starts = [None] + [tuple(map(int, m.split(":"))) for m in args.starts.split(",") if m]

    def start(mode):  # the package's own start (None), or (early lines, overlap) for the Triton kernels
        triton_sizing.DECODE_EARLY_LINES, triton_sizing.overlap = own if mode is None else (
            mode[0], lambda i, o=bool(mode[1]): o and own[1](i))
    from opforge.kernels import graph_timing

    own_timer = graph_timing.StandIns.per_call_ms

    out = {"device": torch.cuda.get_device_name(), "rows": []}
    for row in issue_rows(args, dev, dt, seed=1):
        x, mods, dense = row.pop("x"), row.pop("mods"), row["dense_us"]
        row.pop("weights")
        with torch.no_grad():
            timings = args.route_timing.split(",")
            runs = [(nm, m) for m in starts for nm in alone] + [(None, t) for t in timings for _ in range(args.picks)]
            for name, mode in runs:  # each alone (under each start), then the route as in use (picks times)
                if name is None:  # mode: the route's timing
                    graph_timing.StandIns.per_call_ms = own_timer if mode == "graph" else (lambda *a: None)
                    mode = None
                start(mode)
                route.names = names if name is None else (name,)
                tuned_anew()  # the route and each config: from nothing kept in the process or the cache
                try:
                    got = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
                except ValueError:  # a candidate offered for none of these calls alone (cuda: no variant)
                    got = float("inf")
                if name is None:
                    tag = "" if graph_timing.StandIns.per_call_ms is own_timer else "_dobench"
                    row.setdefault(f"routed{tag}_all", []).append(got)
                    row[f"routed{tag}"] = sorted(row[f"routed{tag}_all"])[len(row[f"routed{tag}_all"]) // 2]
                    row.setdefault(f"picked{tag}_all", []).append(picked())
                else:
                    row[name if mode is None else f"{name}@{mode[0]}:{mode[1]}"] = got
            row["picked"] = picked()
            row["configs"] = {name: [f"{c.kwargs} w{c.num_warps} s{c.num_stages}" for c in k._chosen.values()]
                              for name, k in (("decode", triton_impl.KERNELS["decode"]),
                                              ("uncut", triton_impl.KERNELS["decode_uncut"]),
                                              ("cuda", triton_impl.KERNELS["decode_cuda"]))}
        out["rows"].append(row)
        cols = [k for k in row if k.split("@")[0] in alone]
        best = min(cols, key=row.get)
        print(f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: dense {dense:.1f} floor "
              f"{row['same_bytes_us']:.1f}; " + " ".join(f"{k} {row[k]:.1f}" for k in cols)
              + "".join(f"; routed{t} {row['routed' + t]:.1f} {[round(v, 1) for v in row['routed' + t + '_all']]} "
                        f"({dense / row['routed' + t]:.2f}x, picks {row['picked' + t + '_all']})"
                        for t in ("", "_dobench") if "routed" + t in row)
              + " ("
              f"picked {row['picked']}, "
              f"best {best} {dense / row[best]:.2f}x); tuned {row['configs']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
