"""What opforge's startup hook costs every Python start: ``python -c pass`` with and without it.

Usage::

    .venv/bin/python bench/startup_hook.py [--runs 20] [--json out.json]

The hook is one line in ``site-packages/opforge-patch-torch.pth`` (``_opforge_startup.PTH_LINE``), which
``site`` runs at every start-up; with ``OPFORGE_PATCH_TORCH`` unset it is a dict lookup and imports
nothing. This script makes a bare venv (no pip), then times ``<venv>/bin/python -c pass`` as whole
processes, the runs with and without the hook's files interleaved (ABAB, so drift on a shared machine
falls on both), and reports the median of each and the difference (target: at most +1 ms). With
``OPFORGE_PATCH_TORCH=1`` it also times the start-up with the hook on (it imports ``_opforge_startup`` and
puts its import hook on ``sys.meta_path``; torch and opforge are not imported), and in-process, the
line itself (``exec`` of the compiled line, variable unset).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from _table import show  # noqa: E402

import _opforge_startup  # noqa: E402


def start_ms(py: str, env: dict) -> float:
    t = time.perf_counter()
    subprocess.run([py, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="opforge-startup-")
    try:
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        pth = os.path.join(site, _opforge_startup.PTH_NAME)
        module = os.path.join(site, "_opforge_startup.py")
        unset = {k: v for k, v in os.environ.items() if k not in ("OPFORGE_PATCH_TORCH", "PYTHONPATH")}
        on = {**unset, "OPFORGE_PATCH_TORCH": "1"}

        def install(yes: bool) -> None:
            if yes:
                with open(pth, "w", encoding="utf-8") as f:
                    f.write(_opforge_startup.PTH_LINE)
                shutil.copyfile(os.path.join(ROOT, "_opforge_startup.py"), module)
            else:
                for p in (pth, module):
                    if os.path.exists(p):
                        os.unlink(p)

        for _ in range(3):  # warm the page cache and the venv's bytecode
            install(True)
            start_ms(py, on)
            install(False)
            start_ms(py, unset)
        times: dict[str, list[float]] = {"no hook": [], "hook, variable unset": [], "hook, OPFORGE_PATCH_TORCH=1": []}
        for _ in range(args.runs):
            install(False)
            times["no hook"].append(start_ms(py, unset))
            install(True)
            times["hook, variable unset"].append(start_ms(py, unset))
            times["hook, OPFORGE_PATCH_TORCH=1"].append(start_ms(py, on))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    line = compile(_opforge_startup.PTH_LINE, "<pth>", "exec")
    saved = os.environ.pop("OPFORGE_PATCH_TORCH", None)
    try:
        n = 100_000
        line_us = min(timeit.repeat(lambda: exec(line, {}), number=n, repeat=5)) / n * 1e6
    finally:
        if saved is not None:
            os.environ["OPFORGE_PATCH_TORCH"] = saved

    base = statistics.median(times["no hook"])
    rows = []
    for case, ts in times.items():
        med = statistics.median(ts)
        rows.append([case, f"{med:.2f}", f"{min(ts):.2f}–{max(ts):.2f}", "" if case == "no hook" else f"{med - base:+.2f}"])
    machine = f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}"
    show(f"python -c pass, median of {args.runs} runs each, interleaved ({machine})",
         ["case", "median ms", "min–max ms", "vs no hook"], rows)
    print(f"the .pth line alone, in-process (variable unset): {line_us:.2f} µs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "runs": args.runs, "line_us": line_us,
                       "ms": {k: {"median": statistics.median(v), "all": v} for k, v in times.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
