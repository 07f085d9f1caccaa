"""DeepSpeed's own ``CPUAdamBuilder().load()``, warm, in new processes: the ``load`` call inside it
(``torch.utils.cpp_extension.load``, which ``OpBuilder.jit_load`` calls) timed alone, under
``opforge.patch_torch()`` and with torch's own function, in the same run; and DeepSpeed's whole
``load()`` beside it (its compiler-flag probing, py-cpuinfo, is DeepSpeed's, not the load's).

    .venv/bin/python bench/deepspeed_load.py [--runs 7]

Each cell is the median over ``--runs`` fresh interpreters, after one untimed process per
mode built the op (into opforge's cache, or torch's ``TORCH_EXTENSIONS_DIR``).

Cold builds (first ever, the PCH off, the PCH there, torch's beside them): ``bench/first_build.py
--case deepspeed``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

CHILD = r"""
import json, sys, time
from torch.utils import cpp_extension
import opforge
from opforge.bench.timing import host_loop
if sys.argv[1] == "opforge":
    opforge.patch_torch()
inner = cpp_extension.load   # the routed function under the patch, else torch's own
took = []
def timed(*args, **kwargs):
    out = []
    took.append(host_loop(lambda: out.append(inner(*args, **kwargs)), 1))
    return out[0]
cpp_extension.load = timed   # what DeepSpeed's jit_load imports when it calls
from deepspeed.ops.op_builder import CPUAdamBuilder
t0 = time.perf_counter()
m = CPUAdamBuilder().load(verbose=False)
whole = time.perf_counter() - t0
print(json.dumps({"load_s": took[0], "whole_s": whole, "file": m.__file__, "ninja": "ninja" in sys.modules}))
"""


def run(mode: str, env: dict) -> dict:
    from opforge.bench.timing import fresh_process

    return fresh_process(CHILD, mode, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="opforge-ds-")
    env = dict(os.environ, DS_BUILD_OPS="0", OPFORGE_CACHE_DIR=os.path.join(work, "opforge"),
               TORCH_EXTENSIONS_DIR=os.path.join(work, "torch"), OPFORGE_PATCH_TORCH="0")
    res = {}
    for mode in ("opforge", "torch"):
        print(f"  {mode}: building once", file=sys.stderr, flush=True)
        cold = run(mode, env)
        warm = [run(mode, env) for _ in range(args.runs)]
        res[mode] = {"cold_load_s": cold["load_s"], "load_s": [w["load_s"] for w in warm],
                     "whole_s": [w["whole_s"] for w in warm], "ninja_imported": any(w["ninja"] for w in warm),
                     "file": warm[0]["file"]}
    print(f"DeepSpeed CPUAdamBuilder().load(), warm, new process (median of {args.runs}):")
    for mode, r in res.items():
        print(f"  {mode:8s} inner load {statistics.median(r['load_s']) * 1e3:8.2f} ms   whole load() "
              f"{statistics.median(r['whole_s']) * 1e3:8.1f} ms   cold build {r['cold_load_s']:.1f} s   "
              f"ninja imported: {r['ninja_imported']}")
    ratio = statistics.median(res["torch"]["load_s"]) / statistics.median(res["opforge"]["load_s"])
    print(f"  torch's warm load / opforge's: {ratio:.1f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
