"""Load-time benchmark: torch.utils.cpp_extension.load vs opforge.load, each run a new process.

Usage::

    .venv/bin/python bench/load_times.py [--repeats 5] [--quick] [--ccache] [--json out.json]

Two extensions, built by both loaders from the same source with ``extra_cflags=['-O2']``:

* ``demo_ext``: ``examples/demo_ext`` (``torch/extension.h`` + pybind11, a Python module);
* ``lean``: ``bench/lean_ext`` (``ATen/core/Tensor.h`` + ``torch/library.h``, a
  ``TORCH_LIBRARY`` op, loaded with ``is_python_module=False``).

Cases (``--quick``: 1 repeat, the lean extension only):

* cold build: N runs per loader, each with empty cache dirs; interleaved torch/opforge;
* warm load: N runs per loader against the cache the last cold run left;
* concurrency: P (default 16) processes started at once (Popen all, then wait) on one
  unbuilt extension with empty cache dirs, group wall time vs the wall time of one
  process doing the same cold build (both are whole-process times, ``import torch``
  included). ``CXX`` is a wrapper script that logs each call, then ``exec g++``, so the
  compiles per source are counted. Torch's loader is run the same way, under a timeout;
* ``--ccache`` (when ``ccache`` is on PATH): opforge cold builds with ``OPFORGE_CCACHE=auto``
  after a first build filled a private ``CCACHE_DIR``, vs ``OPFORGE_CCACHE=0``.

Cold and warm cells time the ``load()`` call alone (``time.perf_counter`` in the child,
after ``import torch`` and the loader's import, which are reported separately in the
JSON). Each cell is the median (min-max) over N runs. Ratios are torch/opforge, so >1
means opforge is faster. ccache is off everywhere else, for both loaders
(``OPFORGE_CCACHE=0``; ``TORCH_NO_COMPILER_WRAPPER=1``, since recent torch prepends
ccache/sccache on its own when one is on PATH). All cache dirs live under one ``tempfile.mkdtemp``, removed at the end.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTS = {  # key: (extension name, sources, is_python_module)
    "demo_ext": ("demo_ext", [os.path.join(ROOT, "examples", "demo_ext", "demo_ext.cpp")], True),
    "lean": ("lean_ops", [os.path.join(ROOT, "bench", "lean_ext", "lean_ops.cpp")], False),
    "cuda": ("axpb_ext", [os.path.join(ROOT, "examples", "cuda_ext", f) for f in ("axpb.cpp", "axpb_kernel.cu")], True),
}
MARK = "BENCH-RESULT "


def child(tool: str, ext: str) -> None:
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    if tool == "torch":
        from torch.utils.cpp_extension import load
    else:
        from opforge import load
    name, sources, is_module = EXTS[ext]
    t2 = time.perf_counter()
    mod = load(name, sources, extra_cflags=["-O2"], is_python_module=is_module)
    t3 = time.perf_counter()
    if ext == "cuda":
        x = torch.randn(1 << 20, device="cuda")
        if not torch.allclose(mod.axpb(x, 0.5), 2 * x + 0.5):
            sys.exit(f"{tool}/{ext}: result differs from 2 * x + 0.5")
    else:
        op = mod.scaled_residual_relu if is_module else torch.ops.lean_ops.scaled_residual_relu
        x, y = torch.randn(300, 301), torch.randn(300, 301)
        if not torch.allclose(op(x, y, 0.25), torch.relu(x + 0.25 * y), rtol=1e-6, atol=1e-6):
            sys.exit(f"{tool}/{ext}: result differs from torch.relu(x + 0.25 * y)")
    print(MARK + json.dumps({"import_torch_s": t1 - t0, "import_loader_s": t2 - t1, "load_s": t3 - t2}), flush=True)


class Bench:
    def __init__(self, tmp: str):
        self.tmp = tmp
        # No ccache for either loader (torch >= 2.10 prepends ccache/sccache when on PATH).
        self.base = dict(os.environ, OPFORGE_CCACHE="0", TORCH_NO_COMPILER_WRAPPER="1")
        for var in ("OPFORGE_VERBOSE", "CXX"):
            self.base.pop(var, None)

    def fresh_env(self, **extra: str) -> dict[str, str]:
        """Empty cache dirs for both loaders (so nothing touches the user's own caches)."""
        d = tempfile.mkdtemp(dir=self.tmp)
        return dict(self.base, TORCH_EXTENSIONS_DIR=os.path.join(d, "torch"),
                    OPFORGE_CACHE_DIR=os.path.join(d, "opforge"), **extra)

    def start(self, tool: str, ext: str, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", tool, ext], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def run(self, tool: str, ext: str, env: dict[str, str]) -> dict:
        p = self.start(tool, ext, env)
        try:
            out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raise SystemExit(f"{tool} load of {ext} took over 900 s; killed it") from None
        result = parse(out)
        if p.returncode != 0 or result is None:
            sys.stderr.write(out + err)
            raise SystemExit(f"{tool} load of {ext} failed (exit {p.returncode}); its output is above")
        return result

    def cold_warm(self, ext: str, repeats: int, out: dict) -> None:
        last_env = {}
        for phase in ("cold", "warm"):
            times: dict[str, list[float]] = {"torch": [], "opforge": []}
            for i in range(repeats):
                for tool in ("torch", "opforge"):  # interleaved, so drift hits both alike
                    env = self.fresh_env() if phase == "cold" else last_env[tool]
                    last_env[tool] = env
                    times[tool].append(self.run(tool, ext, env)["load_s"])
                    say(f"{phase} {ext} {tool} #{i + 1}: {fmt(times[tool][-1])}")
            out[f"{phase}:{ext}"] = {tool: stats(v) for tool, v in times.items()}

    def concurrency(self, tool: str, ext: str, procs: int, timeout: float | None, repeats: int) -> dict:
        """Wall time of 1 process, then of `procs` processes at once (each `repeats` times, fresh
        caches every time); compiles counted via CXX. Cells are medians."""
        wrapper = os.path.join(tempfile.mkdtemp(dir=self.tmp), "cxx-wrapper.sh")
        log = wrapper + ".log"
        gxx = shutil.which("g++") or "g++"
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{gxx}" "$@"\n')
        os.chmod(wrapper, 0o755)
        runs: dict[str, list[dict]] = {"single": [], "group": []}
        for i in range(repeats):
            for label, n in (("single", 1), ("group", procs)):
                open(log, "w").close()
                env = self.fresh_env(CXX=wrapper)
                started = time.perf_counter()
                ps = [self.start(tool, ext, env) for _ in range(n)]
                outcomes = wait_all(ps, None if n == 1 else timeout)
                wall = time.perf_counter() - started
                with open(log) as f:
                    compiles = sum(1 for line in f if "-c" in line.split())
                runs[label].append({"wall_s": wall, "ok": outcomes.count("ok"), "compiles": compiles,
                                    "outcome": summarize(outcomes)})
                say(f"concurrency {tool} {label} #{i + 1}: {fmt(wall)}, {runs[label][-1]['outcome']}, "
                    f"{compiles} compile(s)")
                if n == 1 and outcomes[0] != "ok":
                    raise SystemExit(f"a single {tool} cold build failed: {outcomes[0]}")
                timeout = timeout or max(120.0, 6 * wall)
        result = {"timeout_s": timeout}
        for label, n in (("single", 1), ("group", procs)):
            walls = [r["wall_s"] for r in runs[label]]
            result[label] = {"wall_s": statistics.median(walls), "walls": walls, "procs": n,
                             "ok": min(r["ok"] for r in runs[label]),
                             "compiles": max(r["compiles"] for r in runs[label]),
                             "outcome": "; ".join(sorted({r["outcome"] for r in runs[label]}))}
        return result

    def ccache(self, ext: str, repeats: int) -> dict:
        if not shutil.which("ccache"):
            return {"skipped": "ccache is not on PATH"}
        cdir = tempfile.mkdtemp(dir=self.tmp)

        def env(choice: str) -> dict[str, str]:
            e = self.fresh_env(OPFORGE_CCACHE=choice, CCACHE_DIR=cdir)
            e.pop("TORCH_NO_COMPILER_WRAPPER")  # opforge honours it, as torch does: it would turn ccache off
            return e

        fill = self.run("opforge", ext, env("auto"))["load_s"]
        say(f"ccache fill {ext}: {fmt(fill)}")
        runs = {"hit": [], "off": []}
        for i in range(repeats):
            for kind, choice in (("hit", "auto"), ("off", "0")):
                runs[kind].append(self.run("opforge", ext, env(choice))["load_s"])
                say(f"ccache {kind} {ext} #{i + 1}: {fmt(runs[kind][-1])}")
        return {"ext": ext, "fill_s": fill, **{k: stats(v) for k, v in runs.items()}}


def wait_all(ps: list[subprocess.Popen], timeout: float | None) -> list[str]:
    """Wait for every process (until a shared deadline); kill the stragglers' process groups."""
    deadline = None if timeout is None else time.monotonic() + timeout
    outcomes = []
    for p in ps:
        try:
            left = None if deadline is None else max(0.1, deadline - time.monotonic())
            out, err = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the child and its ninja/compiler, all started by us
            p.communicate()
            outcomes.append("timed out")
            continue
        if p.returncode == 0 and parse(out) is not None:
            outcomes.append("ok")
        else:
            last = (err.strip().splitlines() or ["no output"])[-1][:160]
            outcomes.append(f"exit {p.returncode}: {last}")
    return outcomes


def summarize(outcomes: list[str]) -> str:
    return "; ".join(f"{n}/{len(outcomes)} {o}" for o, n in collections.Counter(outcomes).items())


def parse(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    return json.loads(lines[-1][len(MARK):]) if lines else None


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "runs": values}


def ratio(r: float) -> str:
    return f"{r:.2f}x" if r < 10 else f"{r:.0f}x"


def fmt(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def cell(st: dict) -> str:
    return fmt(st["median"]) if st["n"] == 1 else f"{fmt(st['median'])} ({fmt(st['min'])}–{fmt(st['max'])})"


def say(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def machine_info() -> dict:
    import torch

    with open("/proc/cpuinfo") as f:  # Linux only, as is the rest of this benchmark
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown")
    cxx = (subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines() or ["?"])[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "compiler": cxx,
            "python": sys.version.split()[0], "date": datetime.date.today().isoformat()}


def rows(res: dict) -> list[tuple[str, str, str, str]]:
    out = []
    for key, cells in res["cases"].items():
        phase, ext = key.split(":")
        label = f"{'cold build' if phase == 'cold' else 'warm load'}, {ext}"
        t, o = cells["torch"], cells["opforge"]
        out.append((label, cell(t), cell(o), ratio(t["median"] / o["median"])))
    conc = res.get("concurrency")
    if conc:
        t, o, n, ext = conc["torch"], conc["opforge"], conc["opforge"]["group"]["procs"], conc["ext"]
        out.append((f"cold, 1 process, {ext} (process wall, median)", fmt(t["single"]["wall_s"]),
                    fmt(o["single"]["wall_s"]), ratio(t["single"]["wall_s"] / o["single"]["wall_s"])))
        out.append((f"cold, {n} processes at once (group wall, median)", fmt(t["group"]["wall_s"]),
                    fmt(o["group"]["wall_s"]), ratio(t["group"]["wall_s"] / o["group"]["wall_s"])))
        out.append(("group wall / single wall", *(f'{x["group"]["wall_s"] / x["single"]["wall_s"]:.2f}' for x in (t, o)),
                    ""))
        out.append((f"compiles per source ({n} processes)", str(t["group"]["compiles"]),
                    str(o["group"]["compiles"]), ""))
        out.append((f"outcome ({n} processes)", t["group"]["outcome"], o["group"]["outcome"], ""))
    return out


def report(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = res["machine"]
    head = (f"{m['cpu']}, {m['cores']} cores · torch {m['torch']} · {m['compiler']} · Python {m['python']} · "
            f"{m['date']} · median (min–max) of {res['repeats']} new processes per cell")
    table = Table(title="load() time: torch.utils.cpp_extension vs opforge", caption=head)
    for col, just in (("case", "left"), ("torch", "right"), ("opforge", "right"), ("torch/opforge", "right")):
        table.add_column(col, justify=just)
    for r in rows(res):
        table.add_row(*r)
    console = Console()
    console.print(table)
    md = [f"Machine: {head}", "", "| case | torch | opforge | torch/opforge |", "|---|---:|---:|---:|"]
    md += [f"| {' | '.join(r)} |" for r in rows(res)]
    cc = res.get("ccache")
    if cc:
        line = (f"ccache ({cc['ext']}): skipped, {cc['skipped']}" if "skipped" in cc else
                f"ccache ({cc['ext']}): opforge cold build with a ccache hit {cell(cc['hit'])} vs "
                f"OPFORGE_CCACHE=0 {cell(cc['off'])} ({ratio(cc['off']['median'] / cc['hit']['median'])}); "
                f"the first build, filling ccache, took {fmt(cc['fill_s'])}")
        md += ["", line]
        console.print(line)
    console.print("\n[bold]Markdown:[/bold]")
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="new processes per cell (default 5)")
    ap.add_argument("--quick", action="store_true", help="1 repeat, lean extension only")
    ap.add_argument("--ccache", action="store_true", help="also measure a ccache hit (needs ccache on PATH)")
    ap.add_argument("--procs", type=int, default=16, help="processes in the concurrency case (default 16)")
    ap.add_argument("--group-timeout", type=float, default=None,
                    help="seconds for a group of processes (default: max(120, 6x the single-process time))")
    ap.add_argument("--json", metavar="PATH", help="write all results, raw runs included, as JSON")
    ap.add_argument("--exts", nargs="+", choices=sorted(EXTS), help="extensions for cold/warm (default demo_ext lean;"
                    " 'cuda' needs a GPU and nvcc)")
    ap.add_argument("--conc-ext", choices=sorted(EXTS), help="extension for the concurrency case (default demo_ext)")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    exts = args.exts or (["lean"] if args.quick else ["demo_ext", "lean"])
    conc_ext = args.conc_ext or ("lean" if args.quick else "demo_ext")
    tmp = tempfile.mkdtemp(prefix="opforge-bench-")
    try:
        bench = Bench(tmp)
        prime_page_cache()
        res: dict = {"machine": machine_info(), "repeats": repeats, "cases": {}}
        for ext in exts:
            bench.cold_warm(ext, repeats, res["cases"])
        res["concurrency"] = {"ext": conc_ext, **{tool: bench.concurrency(tool, conc_ext, args.procs,
                                                                          args.group_timeout, repeats)
                                                  for tool in ("opforge", "torch")}}
        if args.ccache:
            res["ccache"] = bench.ccache(conc_ext, repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


def prime_page_cache() -> None:
    """Read torch's headers once, so the first cold build does not also pay for the disk."""
    import torch

    for d, _, files in os.walk(os.path.join(os.path.dirname(torch.__file__), "include")):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                f.read()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
