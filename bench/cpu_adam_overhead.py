"""Where a ``CPUAdam.step`` spends its time beyond the kernel: each layer timed alone, beside torch's
fused AdamW and DeepSpeedCPUAdam (when installed) on the same param.

Usage::

    .venv/bin/python bench/cpu_adam_overhead.py [--sizes 1 1M] [--rounds 15] [--json out.json]

One fp32 param of N elements with its grad (AdamW, lr 1e-3, weight decay 0.01), on
torch.get_num_threads() threads. Each row: ``calls`` calls back to back (N=1: 2000; else enough for
~20 ms), per-call time = wall / calls; the median of ``--rounds`` such loops, the rows in a rotating
order so a noisy neighbour hits them alike. Layers, innermost first:

* ``kernel``: the variant's ``adam_step_multi_`` overload, called with prepared lists (the
  ``torch.ops`` dispatch, the stable ABI's boxing, the OpenMP region, the update);
* ``step, torch's wrapper``: ``CPUAdam.step`` through torch's own ``profile_hook_step`` (the profiler
  range and the hook loops it opens on every call, as before this change);
* ``step``: ``CPUAdam.step`` as users call it (``optim/step_hooks.py``'s fast path: no hooks, no profiler);
* ``DeepSpeedCPUAdam.step`` and ``torch AdamW(fused=True).step``: the peers.

N=1 is the fixed cost of a call (the kernel's work is nil); N=1M is issue 21's target size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics

import torch

from opforge.bench.timing import host_loop

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
WRAPPED = "step, torch's wrapper"


def parse_size(text: str) -> int:
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def param(n: int) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-2
    return p


def rows(n: int) -> dict:
    from opforge.optim import CPUAdam, step_hooks

    out = {}
    p = param(n)
    opt = CPUAdam([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    opt.step()
    st, threads = opt.state[p], torch.get_num_threads()
    lists = [[p.detach()], [p.grad], [st["exp_avg"]], [st["exp_avg_sq"]], [], [], [st["step"]]]
    op = opt.kernel.ops.adam_step_multi_
    op = getattr(op, "default", op)
    out["kernel"] = lambda: op(*lists, LR, *BETAS, EPS, WD, True, True, False, 1.0, False, threads)
    hooked = torch.optim.Optimizer.profile_hook_step(type(opt).step.__wrapped__)
    out[WRAPPED] = lambda: hooked(opt)
    out["step"] = opt.step
    assert step_hooks.FACTS is not None, "this torch lacks the fast path's names: 'step' is torch's wrapper"
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        q = param(n)
        ds = DeepSpeedCPUAdam([q], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
        ds.step()
        out["DeepSpeedCPUAdam.step"] = ds.step
    except ImportError as exc:
        print(f"DeepSpeedCPUAdam: not timed ({exc})")
    r = param(n)
    fused = torch.optim.AdamW([r], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    fused.step()
    out["torch AdamW(fused=True).step"] = fused.step
    return out


def measure(fns: dict, rounds: int) -> dict:
    calls = {}
    for name, fn in fns.items():
        for _ in range(5):
            fn()
        one = host_loop(fn, 3)
        calls[name] = max(3, min(2000, int(0.02 / max(one, 1e-7))))
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(host_loop(fns[name], calls[name]))
    return {name: {"median_us": statistics.median(s) * 1e6, "min_us": min(s) * 1e6, "max_us": max(s) * 1e6,
                   "calls": calls[name]} for name, s in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--sizes", nargs="+", default=["1", "1M"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    machine = (f"{platform.node()}: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
               f"torch {torch.__version__}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(machine)
    results = {}
    for size in args.sizes:
        n = parse_size(size)
        res = measure(rows(n), args.rounds)
        results[size] = res
        ds = res.get("DeepSpeedCPUAdam.step", {}).get("median_us")
        print(f"\nN = {size}: median (min-max) us per call over {args.rounds} rounds")
        for name, r in res.items():
            vs = f"   {ds / r['median_us']:.2f}x DeepSpeed's step" if ds and name.startswith("step") else ""
            print(f"  {name:<30} {r['median_us']:9.1f} ({r['min_us']:.1f}-{r['max_us']:.1f}){vs}")
        k = res["kernel"]["median_us"]
        print(f"  step - kernel: {res['step']['median_us'] - k:.1f} us; "
              f"with torch's wrapper: {res[WRAPPED]['median_us'] - k:.1f} us")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": machine, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
