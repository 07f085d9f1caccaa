"""First contact: cold builds in a fresh cache, opforge's beside torch's in the same run (issue 33).

    .venv/bin/python bench/first_build.py [--case pybind,deepspeed] [--repeat 3] [--json FILE]

Every build goes through torch's own API, ``torch.utils.cpp_extension.load``, as a library calls it:
with torch's function (``torch``) or under ``opforge.patch_torch()`` (the rest). Each build is a new
process that imports torch, opforge and the client first, then times the ``load`` call alone. ccache is
off for both (``OPFORGE_CCACHE=0``, ``TORCH_NO_COMPILER_WRAPPER=1``).

Cases:

* ``pybind``: examples/demo_ext (a small pybind11 extension, ``-O2``), as a new user writes one;
* ``deepspeed``: DeepSpeed's ``CPUAdamBuilder().load()`` (two sources, ``-O3 -g``);
* ``fused_adam``: DeepSpeed's ``FusedAdamBuilder().load()`` (CUDA; ``TORCH_CUDA_ARCH_LIST=9.0``, since
  DeepSpeed 0.19.8's arch parser fails on torch 2.11's default list). GPU hosts only.

Modes, per case:

* ``torch``: torch's load, an empty ``TORCH_EXTENSIONS_DIR``;
* ``first``: opforge's first build ever, an empty ``OPFORGE_CACHE_DIR`` (the default ``OPFORGE_PCH=auto``);
* ``pch off``: the same with ``OPFORGE_PCH=0``;
* ``pch there``: the way a user gets there: built once, the entry removed, built again (the second build
  of these flags starts the PCH in the background, which is waited for), the entry removed, and built
  again: this last build is timed;
* ``warm``: a new process loading what is cached, opforge's and torch's (median of 5, milliseconds).

``torch``, ``first`` and ``pch off`` alternate ``--repeat`` times; the medians are reported, each with
its ratio to torch's. The PCH's own time and size come from its record.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

CHILD = r"""
import json, sys, time
case, mode = sys.argv[1], sys.argv[2]
import torch
from torch.utils import cpp_extension
import opforge
if mode == "opforge":
    opforge.patch_torch()
inner = cpp_extension.load   # the routed function under the patch, else torch's own
took = []
def timed(*args, **kwargs):
    t0 = time.perf_counter()
    out = inner(*args, **kwargs)
    took.append(time.perf_counter() - t0)
    return out
cpp_extension.load = timed   # what the builders look up when they call
if case == "pybind":
    m = cpp_extension.load("demo_ext", [sys.argv[3]], extra_cflags=["-O2"])
    x, y = torch.randn(100, 33), torch.randn(100, 33)
    assert torch.allclose(m.scaled_residual_relu(x, y, 0.5), torch.relu(x + 0.5 * y))
elif case == "deepspeed":
    from deepspeed.ops.op_builder import CPUAdamBuilder
    m = CPUAdamBuilder().load(verbose=False)
elif case == "fused_adam":
    from deepspeed.ops.op_builder import FusedAdamBuilder
    m = FusedAdamBuilder().load(verbose=False)
print(json.dumps({"load_s": took[0]}))
"""

NAMES = {"pybind": "demo_ext", "deepspeed": "cpu_adam", "fused_adam": "fused_adam"}


def run(case: str, mode: str, env: dict) -> float:
    from opforge.bench.timing import fresh_process

    return fresh_process(CHILD, case, mode, os.path.join(ROOT, "examples", "demo_ext", "demo_ext.cpp"),
                         env=env)["load_s"]


def bench_case(case: str, repeat: int, work: str) -> dict:
    from opforge.engine import pch_store

    base = dict(os.environ, OPFORGE_CCACHE="0", TORCH_NO_COMPILER_WRAPPER="1", OPFORGE_PATCH_TORCH="0",
                DS_BUILD_OPS="0", OPFORGE_PCH="auto")
    if case == "fused_adam":
        base["TORCH_CUDA_ARCH_LIST"] = "9.0"
    base.pop("OPFORGE_CACHE_DIR", None)
    n = [0]

    def fresh(**extra) -> dict:
        n[0] += 1
        d = os.path.join(work, f"{case}-{n[0]}")
        return dict(base, OPFORGE_CACHE_DIR=d, TORCH_EXTENSIONS_DIR=d + "-torch", **extra)

    def say(what: str) -> None:
        print(f"  {case}: {what}…", file=sys.stderr, flush=True)

    times: dict[str, list[float]] = {"torch": [], "first": [], "pch off": []}
    for i in range(repeat):
        for label, mode, extra in (("torch", "torch", {}), ("first", "opforge", {}),
                                   ("pch off", "opforge", {"OPFORGE_PCH": "0"})):
            say(f"{label} ({i + 1}/{repeat})")
            env = fresh(**extra)
            times[label].append(run(case, mode, env))
            if pch_store.stored(os.path.join(env["OPFORGE_CACHE_DIR"], ".pch")):
                sys.exit(f"{case}: a first build left a PCH behind")
    env = fresh()
    entry = os.path.join(env["OPFORGE_CACHE_DIR"], NAMES[case])
    say("pch there: the first build")
    run(case, "opforge", env)
    shutil.rmtree(entry)
    say("pch there: the second build (starts the PCH)")
    second = run(case, "opforge", env)
    say("pch there: waiting for the PCH")
    pch_store.wait(env["OPFORGE_CACHE_DIR"], timeout=1800)
    records = [json.load(open(p)) for p in glob.glob(os.path.join(env["OPFORGE_CACHE_DIR"], ".pch", "*.json"))]
    made = [r for r in records if r.get("size")]
    shutil.rmtree(entry)
    say("pch there")
    there = run(case, "opforge", env)
    say("warm loads")
    run(case, "torch", env)  # torch's build, into this env's empty TORCH_EXTENSIONS_DIR
    warm = {mode: statistics.median(run(case, mode, env) for _ in range(5)) for mode in ("opforge", "torch")}
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"case": case, "runs": times, "median": med, "second_build_s": second, "pch_there_s": there,
            "pch": [{"made_s": r.get("made_s"), "size": r.get("size")} for r in made], "warm_s": warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="pybind,deepspeed")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="opforge-first-")
    try:
        results = [bench_case(c.strip(), args.repeat, work) for c in args.case.split(",") if c.strip()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in results:
        t = r["median"]["torch"]
        print(f"{r['case']}: cold build, the load call (median of {args.repeat}; ratio to torch's)")
        for label in ("torch", "first", "pch off"):
            runs = ", ".join(f"{x:.1f}" for x in r["runs"][label])
            print(f"  {label:10s} {r['median'][label]:7.1f} s  {r['median'][label] / t:5.2f}x   ({runs})")
        print(f"  {'pch there':10s} {r['pch_there_s']:7.1f} s  {r['pch_there_s'] / t:5.2f}x   "
              f"(the second build, which started it: {r['second_build_s']:.1f} s)")
        for p in r["pch"]:
            print(f"  the PCH: made in {p['made_s']} s in the background, {p['size'] / 2**20:.0f} MiB")
        w = r["warm_s"]
        print(f"  warm, new process: opforge {w['opforge'] * 1e3:.2f} ms, torch {w['torch'] * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
