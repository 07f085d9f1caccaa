"""The floor under a build with the shared PCH: each source compiled alone, by its build's own command,
plain and with the PCH, one at a time (issue 33's "with the PCH there" target, DeepSpeed's cpu_adam).

    .venv/bin/python bench/pch_floor.py [--runs 2]

DeepSpeed's ``CPUAdamBuilder().load()`` is built once under the patch with ``OPFORGE_PCH=eager`` in a
temporary cache, which leaves its ``build.ninja`` (the compile commands) and the PCH. Then each
source's compile is run by hand: as written (``-include`` of the PCH) and without the ``-include``
(the plain compile). A build with the PCH can't beat the ratio of the two: what is left is the work
the PCH does not touch (template instantiation, ``-O3 -g`` optimisation and code generation).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BUILD = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(verbose=False)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="opforge-floor-")
    env = dict(os.environ, OPFORGE_CACHE_DIR=os.path.join(work, "cache"), OPFORGE_PCH="eager", OPFORGE_PATCH_TORCH="1",
               OPFORGE_CCACHE="0", TORCH_NO_COMPILER_WRAPPER="1", DS_BUILD_OPS="0")
    try:
        print("building DeepSpeed's cpu_adam once (OPFORGE_PCH=eager)…", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c", BUILD], env=env, check=True, capture_output=True)
        (build_dir,) = [os.path.join(work, "cache", "cpu_adam", d) for d in os.listdir(os.path.join(work, "cache", "cpu_adam"))
                        if d.startswith(".build-") and not d.endswith(".lock")]
        text = open(os.path.join(build_dir, "build.ninja"), encoding="utf-8").read()
        variables = dict(re.findall(r"^(\w+) = (.*)$", text, re.M))
        edges = re.findall(r"^build (\S+\.o): compile (\S+)\n(?:  cflags = (.*)\n)?", text, re.M)
        print(f"{'source':24s} {'plain':>8s} {'with the PCH':>13s} {'ratio':>6s}")
        for obj, src, cflags in edges:
            with_pch = shlex.split(variables["cxx"]) + shlex.split((cflags or "$cflags").replace(
                "$cflags", variables["cflags"]))
            plain = [a for i, a in enumerate(with_pch) if a != "-include" and (i == 0 or with_pch[i - 1] != "-include")]
            times = {}
            for label, argv in (("plain", plain), ("pch", with_pch)):
                runs = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    subprocess.run([*argv, "-c", src, "-o", os.path.join(work, obj)], cwd=build_dir, check=True)
                    runs.append(time.perf_counter() - t0)
                times[label] = statistics.median(runs)
            print(f"{os.path.basename(src):24s} {times['plain']:7.1f}s {times['pch']:12.1f}s "
                  f"{times['pch'] / times['plain']:5.2f}x", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
