"""Probe: where the MLP stack's time goes beyond its layers' (issue 35). The bench's stack
(``bench/block_sparse_decode.py``, 16 SwiGLU blocks) runs six kernels a block: gate, silu, up, mul,
down and the residual add, in that order (Python evaluates ``silu(gate(x))`` before ``up(x)``). Each
layer alone is timed with its 16 copies back to back, where a sparse kernel starts while the one before
it drains (a programmatic dependent). In the stack every sparse kernel follows a torch kernel, which
lets no dependent start before it ends. This probe times, graph-replayed, GPU µs a step:

* **stack**: the bench's step;
* **layers only**: the same 48 layers in the same order, gate / up / down of each block, on fixed inputs,
  with no elementwise kernel between them (so each sparse kernel follows another);
* **elementwise only**: the step's silu, mul and add on fixed tensors, no layer;
* **layers, each alone**: each layer between two elementwise kernels of its own (a ``zero_`` of one element
  before and after), the stack's neighbourhood without the stack's math;

and, with ``--profile``, each kernel's GPU time inside one replay of the stack (torch.profiler), by name.

``--tunings graph,pad`` then tunes the route and the configs from nothing once per tuning, captures the stack
after each, and replays the captured steps in turn (``--rounds`` times each, the median kept):

* **graph**: the package's tuning (each candidate's calls back to back, ``graph_timing.StandIns``);
* **pad**: the same, with a one-element ``zero_`` before each call of a candidate, so that each call follows a
  kernel that lets no dependent start early, as each layer of the stack does.

Usage::

    python bench/cuda_probe/decode_stack.py [--tokens 1] [--densities 0.25] [--layers 16] [--profile]
        [--tunings graph,pad] [--rounds 9] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us, picked, probe_args, tuned_anew  # noqa: E402

from opforge.bench.suites.block_sparse_decode import LLAMA, mlp_stack, run_stack


def parts(stack, x):
    """The step's pieces: (layers only, elementwise only, layers each alone), each a callable of one step."""
    hidden, inter = LLAMA
    g = torch.empty(x.shape[0], inter, device=x.device, dtype=x.dtype)
    u, m = torch.empty_like(g), torch.randn_like(g)
    h, y = x.clone(), torch.empty_like(x)
    pad = torch.empty(1, device=x.device)

    def layers():
        for b in stack:
            b.gate(x), b.up(x), b.down(m)

    def elementwise():
        for _ in stack:
            F.silu(g) * u, h + y

    def alone():
        for b in stack:
            for lin, inp in ((b.gate, x), (b.up, x), (b.down, m)):
                pad.zero_()
                lin(inp)
            pad.zero_()

    return layers, elementwise, alone


def profile(stack, x, dev) -> dict:
    """Kernel name -> (count, mean GPU µs) inside one replay of the stack's step (torch.profiler)."""
    from opforge.bench.suites.block_sparse_decode import Captured

    g = Captured(lambda: run_stack(stack, x), dev)
    g()
    torch.cuda.synchronize(dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g()
        torch.cuda.synchronize(dev)
    by = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name[:60]].append(e.device_time)
    return {k: (len(v), sum(v) / len(v)) for k, v in sorted(by.items(), key=lambda kv: -sum(kv[1]))}


def retuned(tuning: str) -> None:
    """Tune from nothing again (``decode_floor.tuned_anew``), timing candidates from now on per ``tuning``
    (``graph``: the package's way; ``pad``: each call after a one-element ``zero_``)."""
    from opforge.kernels import graph_timing

    own = getattr(graph_timing.StandIns, "_own_per_call_ms", graph_timing.StandIns.per_call_ms)
    graph_timing.StandIns._own_per_call_ms = own
    if tuning == "graph":
        graph_timing.StandIns.per_call_ms = own
    else:
        def padded(self, launch, args, device):
            pad = torch.empty(1, device=torch.device("cuda", device))

            def after_pad(a):
                pad.zero_()
                launch(a)
            return own(self, after_pad, args, device)
        graph_timing.StandIns.per_call_ms = padded
    tuned_anew()


def paired(graphs: dict, dev, rounds: int) -> dict:
    """GPU µs a replay of each captured graph, replayed in turn ``rounds`` times (the median)."""
    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            start.record()
            g()
            end.record()
            end.synchronize()
            times[k].append(start.elapsed_time(end) * 1e3)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def main() -> None:
    ap = probe_args(argparse.ArgumentParser(), tokens="1", shapes=False, tunings="")  # the stack's layers: Llama's
    ap.set_defaults(densities="0.25")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    hidden, inter = LLAMA
    rows = []
    with torch.no_grad():
        for density in [None, *map(float, args.densities.split(","))]:
            stack = mlp_stack(args.layers, hidden, inter, density, 64, dev, dt)
            for t in map(int, args.tokens.split(",")):
                x = torch.randn(t, hidden, device=dev, dtype=dt)
                layers, elementwise, alone = parts(stack, x)
                row = {"tokens": t, "density": density or 1.0,
                       "stack_us": graph_us(lambda: run_stack(stack, x), dev, 1),  # noqa: B023
                       "layers_us": graph_us(layers, dev, 1), "elementwise_us": graph_us(elementwise, dev, 1),
                       "alone_us": graph_us(alone, dev, 1)}
                row["pad_us"] = graph_us(lambda: [torch.empty(1, device=dev).zero_()  # noqa: B023
                                                  for _ in range(4 * args.layers)], dev, 1)
                if args.profile:
                    try:
                        row["kernels"] = profile(stack, x, dev)
                    except Exception as e:  # noqa: BLE001 - the profiler is a nicety
                        row["kernels"] = {"error": (0, repr(e)[:200])}
                if args.tunings and density is not None:
                    from opforge.bench.suites.block_sparse_decode import Captured

                    graphs = {}
                    for tuning in args.tunings.split(","):
                        retuned(tuning)
                        graphs[tuning] = Captured(lambda: run_stack(stack, x), dev)  # noqa: B023
                        row[f"picks_{tuning}"] = picked()
                    row["tuned_us"] = paired(graphs, dev, args.rounds)
                    print("    tuned: " + "; ".join(f"{k} {v:.0f} us a step, picks {row['picks_' + k]}"
                                                   for k, v in row["tuned_us"].items()), flush=True)
                    retuned("graph")
                rows.append(row)
                print(f"T={t} d={row['density']}: stack {row['stack_us']:.0f} layers only {row['layers_us']:.0f} "
                      f"elementwise only {row['elementwise_us']:.0f} layers each alone {row['alone_us']:.0f} "
                      f"(its {4 * args.layers} pads alone {row['pad_us']:.0f}) us a step", flush=True)
                for k, (n, us) in row.get("kernels", {}).items():
                    print(f"    {n:4d} x {us:8.2f}  {k}" if isinstance(us, float) else f"    {us}")
            stack = None
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
