"""Build time is a feature: how long opforge's own C++ takes to build, cold.

1. Each C++ extension of every kernel kind whose CPU variant runs here, built alone into a
   fresh cache (ccache off): wall time of ``build_jit()`` (compile + link + publish) and the
   compile step alone (from ninja's log). Target: <= 3 s a source.
2. ``opforge build --all`` into a fresh cache, as a user runs it. Target: <= 60 s.
3. One tiny op written three ways, to show why: the LibTorch stable ABI, lean headers
   (``ATen/core/Tensor.h`` + ``torch/library.h``), and ``torch/extension.h`` + pybind11.

    python bench/compile_times.py [--json FILE] [--skip-headers] [--kind KIND ...] [--repeat N]
                                  [--extensions-only]

On a shared, noisy machine use --repeat: each cell is then the median (min-max) of N cold
builds, the extensions taken in turn within each round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def fresh_cache() -> str:
    d = tempfile.mkdtemp(prefix="opforge-compile-bench-")
    os.environ["OPFORGE_CACHE_DIR"] = d
    return d


def ninja_compile_seconds(entry_dir: str, name: str, cache: str) -> float | None:
    """Compile steps only, from the build dir's .ninja_log (end - start of the .o steps)."""
    for root, _dirs, files in os.walk(os.path.join(cache, name)):
        if ".ninja_log" in files:
            total = 0.0
            with open(os.path.join(root, ".ninja_log")) as f:
                for line in f:
                    parts = line.split("\t")
                    if len(parts) >= 4 and parts[3].endswith(".o"):
                        total += (int(parts[1]) - int(parts[0])) / 1000
            return total
    return None


def _spread(values: list[float]) -> str:
    values = sorted(values)
    mid = values[len(values) // 2]
    return f"{mid:5.2f} s" if len(values) == 1 else f"{mid:5.2f} s ({values[0]:.2f}-{values[-1]:.2f})"


def per_extension(kinds: list[str] | None = None, repeat: int = 1) -> list[dict]:
    from opforge.platform import current
    from opforge.registry import loaders

    os.environ["OPFORGE_CCACHE"] = "0"
    exts = [(kind, c.extension) for kind, cls in loaders().items() if not kinds or kind in kinds
            for c in cls().candidates(current()) if c.extension.needs_compiler and c.available]
    times: dict[str, tuple[list[float], list[float]]] = {ext.name: ([], []) for _, ext in exts}
    for _ in range(repeat):
        for _kind, ext in exts:
            cache = fresh_cache()
            started = time.perf_counter()
            entry = ext.build_jit().path
            times[ext.name][0].append(time.perf_counter() - started)
            times[ext.name][1].append(ninja_compile_seconds(entry, ext.name, cache) or 0.0)
            shutil.rmtree(cache, ignore_errors=True)
    rows = []
    for kind, ext in exts:
        build, compile_ = times[ext.name]
        rows.append({"kind": kind, "name": ext.name, "sources": len(ext.sources), "build_s": sorted(build),
                     "compile_s": sorted(compile_)})
        print(f"{ext.name:24s} build {_spread(build)}   compile steps {_spread(compile_)}", flush=True)
    return rows


def build_all() -> dict:
    cache = fresh_cache()
    env = dict(os.environ, OPFORGE_CCACHE="0", OPFORGE_CACHE_DIR=cache)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "opforge.cli", "build", "--all"], env=env, capture_output=True,
                         text=True, check=False)
    took = time.perf_counter() - started
    shutil.rmtree(cache, ignore_errors=True)
    print(out.stdout[-2000:])
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
    print(f"opforge build --all: {took:.1f} s (exit {out.returncode})")
    return {"seconds": round(took, 2), "exit": out.returncode}


def header_cost() -> list[dict]:
    import opforge

    os.environ["OPFORGE_CCACHE"] = "0"
    rows = []
    for label, src, kw in (
        ("LibTorch stable ABI", "stable.cpp", {"is_python_module": False}),
        ("ATen/core/Tensor.h + torch/library.h", "lean.cpp", {"is_python_module": False}),
        ("torch/extension.h + pybind11", "extension.cpp", {}),
    ):
        cache = fresh_cache()
        name = "header_cost_" + src.split(".")[0]
        started = time.perf_counter()
        if src == "stable.cpp":
            from opforge import settings
            from opforge.engine import jit
            from opforge.engine.key import make_spec
            from opforge.engine.progress import Reporter

            s = settings.current()
            spec = make_spec(s, name, [os.path.join(HERE, "header_cost", src)], ["-O3"], None, None, None, False, False,
                             False, "2.10")
            jit.load_spec(spec, s, None, Reporter(False))
        else:
            opforge.load(name, [os.path.join(HERE, "header_cost", src)], extra_cflags=["-O3"], **kw)
        took = time.perf_counter() - started
        rows.append({"headers": label, "build_s": round(took, 2),
                     "compile_s": ninja_compile_seconds("", name, cache)})
        shutil.rmtree(cache, ignore_errors=True)
        print(f"{label:40s} build {took:5.2f} s   compile {rows[-1]['compile_s']} s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--skip-headers", action="store_true")
    ap.add_argument("--kind", action="append", help="only this kind's extensions (repeatable)")
    ap.add_argument("--repeat", type=int, default=1, help="cold builds of each extension (default 1)")
    ap.add_argument("--extensions-only", action="store_true", help="skip `build --all` and the header costs")
    args = ap.parse_args()
    import torch

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.processor() or platform.machine()}",
        "torch": torch.__version__,
        "extensions": per_extension(args.kind, args.repeat),
        "build_all": None if args.extensions_only else build_all(),
        "header_cost": [] if args.skip_headers or args.extensions_only else header_cost(),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
