"""What a KernelLoader costs a process once the kernel is built: each run is a new process
that imports torch first (untimed), then times

* ``import opforge.kernel_loader`` (opforge and every kernel family's declarations);
* ``platform.current()`` (archspec, NVML, tools; tool versions come from the on-disk memo);
* ``SelftestLoader().load()`` (prebuilt check, cache lookup, selection, dlopen);
* a second ``load()`` in the same process (the per-process cache).

    python bench/loader_times.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
import torch
t0 = time.perf_counter()
from opforge.kernel_loader import SelftestLoader
from opforge import platform
t1 = time.perf_counter()
platform.current()
t2 = time.perf_counter()
k = SelftestLoader().load()
t3 = time.perf_counter()
SelftestLoader().load()
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "platform": t2 - t1, "load": t3 - t2, "again": t4 - t3, "origin": k.origin,
                  "name": k.name}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="opforge-loader-bench-")
    env = dict(os.environ, OPFORGE_CACHE_DIR=cache)
    runs = []
    for i in range(args.runs + 1):  # the first run builds (and memoises tool versions): not counted
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
        if i:
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{runs[0]['name']} ({runs[0]['origin']}), median of {len(runs)} new processes:")
    for key in ("import", "platform", "load", "again"):
        vals = [r[key] * 1000 for r in runs]
        print(f"  {key:9s} {statistics.median(vals):7.2f} ms  ({min(vals):.2f}-{max(vals):.2f})")
    total = [sum(r[k] for k in ("import", "platform", "load")) * 1000 for r in runs]
    print(f"  total     {statistics.median(total):7.2f} ms")


if __name__ == "__main__":
    main()
