"""Warm starts as users live them: a new process, timed from before the first import of the user's library
to its op ready, opforge's beside torch's in the same run (issue 60).

    .venv/bin/python bench/warm_start.py [--case load_cpu,ds_cpu_adam,...] [--runs 5] [--json FILE]

Nothing is set that a user wouldn't set: no ``TORCH_CUDA_ARCH_LIST`` (unless a case's client needs it), no
``PYTHONDONTWRITEBYTECODE`` (pip writes ``.pyc`` files at install; one untimed process per case writes
opforge's), and under the patch the variable alone, ``OPFORGE_PATCH_TORCH=1``, through the startup hook the
install puts in site-packages: no ``import opforge``. Each case's first process per loader builds (its time
is reported as ``first_s``, not a figure to quote: ``bench/first_build.py`` times cold builds); the runs
after it alternate torch's and opforge's processes.

The window (``window_s``) starts at the script's first line, or, for a library whose users import torch
first (a training script does), right after ``import torch`` (then ``torch_s`` is that import). ``load_s``
is the ``load`` call itself where the case can time it. Cases (``cpu``: here and on a GPU host; ``cuda``:
GPU hosts only, picked by ``--case`` or when NVML lists a GPU):

* ``load_cpu`` (cpu): ``opforge.load`` of a small pybind11 extension (``examples/demo_ext``) in a script that
  never imports torch, against ``from torch.utils.cpp_extension import load; load(...)``; the op's result is
  the end of the window;
* ``load_cpu_after_torch`` and ``load_cpu_cxx`` (cpu): the same with torch imported first, where the load call
  is opforge's alone; the second with ``CXX`` a wrapper script (as ccache users and compiler-counting CI
  jobs set it);
* ``load_cuda`` and ``load_cuda_after_torch`` (cuda): the same for ``examples/cuda_ext`` (a ``.cu`` kernel), the
  window closed with the module loaded (the op's first call would add CUDA's start for both); also whether the
  load initialised CUDA;
* ``patched_load`` (cpu): ``from torch.utils.cpp_extension import load; load(...)`` of the same extension,
  under the patch against torch alone;
* ``stylegan`` (cpu): StyleGAN's plugin pattern, ``load(...)`` then ``importlib.import_module(name)`` (torch
  2.x's loader leaves nothing in ``sys.modules``: torch's row is its error);
* ``seed_op`` (cpu, cuda): ``from op import fused_leaky_relu, upfirdn2d`` (the window), a package that loads two
  extensions at its import (``bench/warm_start_op``, in the style of rosinality/stylegan2-pytorch; CPU kernels on
  ``cpu``, CUDA ones on ``cuda``);
* ``ds_cpu_adam`` and ``ds_cpu_adam_cxx`` (cpu): DeepSpeed's ``CPUAdamBuilder().load()``, without and with
  ``CXX`` a wrapper script (as ccache users and compiler-counting CI jobs set it); ``load_s`` is the
  ``torch.utils.cpp_extension.load`` call inside it, and DeepSpeed's own probing is timed apart (``probes``);
* ``ds_fused_adam`` (cuda): DeepSpeed's ``FusedAdamBuilder().load()``;
* ``colossalai`` (cuda): ColossalAI's ``CpuAdamX86Extension().build_jit()``, from its sdist's ``extensions/``
  (``--colossalai SDIST``; by default the one ``make test`` downloads), its JIT folder in the work dir (its
  own folder function imports the whole ``colossalai`` package, which the sdist's extensions don't need).

The floor row, ``import torch``, is a new process importing torch and nothing else.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

START = "import time as _time\nT0 = _time.perf_counter()\n"
"""A script's first lines: the window opens before any import."""
AFTER_TORCH = "import time as _time\nimport torch\nT_TORCH = _time.perf_counter()\nT0 = T_TORCH\n"
"""For a library whose users import torch first: torch's import, then the window."""
END = ("import json as _json, sys as _sys\n"
       "_out = dict(window_s=T1 - T0, result=[float(v) for v in RESULT], **globals().get('EXTRA', {}))\n"
       "if 'T_TORCH' in globals():\n    _out['torch_s'] = T_TORCH - T_START\n"
       "print('WARM-START ' + _json.dumps(_out))\n")

DEMO = os.path.join(ROOT, "examples", "demo_ext", "demo_ext.cpp")
CUDA_EXT = [os.path.join(ROOT, "examples", "cuda_ext", f) for f in ("axpb.cpp", "axpb_kernel.cu")]

CHECK_DEMO = ("x = torch.arange(-6, 6, dtype=torch.float32)\n"
              "RESULT = M.scaled_residual_relu(x, x, 0.5).tolist()\n")

CASES = {}


def case(name, device, doc):
    def register(fn):
        CASES[name] = (device, doc, fn)
        return fn
    return register


def timed_loads(prelude: str, name: str, sources: str) -> dict[str, str]:
    """Each loader's script that times one load of ``name`` (``sources``: a Python expression) after ``prelude``:
    torch's ``load`` (imported from its module) and ``opforge.load`` (after ``import opforge``)."""
    scripts = {}
    for loader, imports, call in (("torch", "from torch.utils.cpp_extension import load\n", "load"),
                                  ("opforge", "import opforge\n", "opforge.load")):
        scripts[loader] = (prelude + imports + f"T_L = _time.perf_counter()\nM = {call}({name!r}, {sources})\n"
                           "T_L1 = _time.perf_counter()\n")
    return scripts


@case("load_cpu", "cpu", "opforge.load, the script never imports torch")
def load_cpu(work):
    scripts = timed_loads(START, "demo_ext", repr([DEMO]))
    tail = "import torch\n" + CHECK_DEMO + "T1 = _time.perf_counter()\nEXTRA = {'load_s': T_L1 - T_L}\n"
    return {"torch": scripts["torch"] + tail, "opforge": scripts["opforge"] + tail, "patch": False}


@case("load_cpu_after_torch", "cpu", "opforge.load, torch imported first (the load call is the measure)")
def load_cpu_after_torch(work):
    scripts = timed_loads(AFTER_TORCH, "demo_ext", repr([DEMO]))
    tail = CHECK_DEMO + "T1 = _time.perf_counter()\nEXTRA = {'load_s': T_L1 - T_L}\n"
    return {"torch": scripts["torch"] + tail, "opforge": scripts["opforge"] + tail, "patch": False}


@case("load_cpu_cxx", "cpu", "opforge.load, torch imported first, CXX a wrapper script")
def load_cpu_cxx(work):
    spec = load_cpu_after_torch(work)
    spec["env"] = {"CXX": cxx_wrapper(work)}
    return spec


def cxx_wrapper(work: str) -> str:
    """A compiler wrapper script, as ccache users and compiler-counting CI jobs set ``CXX``."""
    wrapper = os.path.join(work, "bin", "c++-wrapper")
    os.makedirs(os.path.dirname(wrapper), exist_ok=True)
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec {shutil.which("c++") or "c++"} "$@"\n')
    os.chmod(wrapper, 0o755)
    return wrapper


CUDA_TAIL = ("T1 = _time.perf_counter()\nimport torch\nINIT = torch.cuda.is_initialized()\n"
             "x = torch.arange(-6, 6, dtype=torch.float32, device='cuda')\nRESULT = M.axpb(x, 0.5).tolist()\n"
             "EXTRA = {'load_s': T_L1 - T_L, 'cuda_initialised_by_load': INIT}\n")
"""A CUDA case's end: the window closes with the module loaded (the op's first call would add CUDA's start,
the same for both loaders); whether the load initialised CUDA, and the op's result for the check, after it."""


@case("load_cuda", "cuda", "opforge.load of a .cu extension, TORCH_CUDA_ARCH_LIST unset, no torch before it")
def load_cuda(work):
    scripts = timed_loads(START, "axpb_ext", repr(CUDA_EXT))
    return {"torch": scripts["torch"] + CUDA_TAIL, "opforge": scripts["opforge"] + CUDA_TAIL, "patch": False}


@case("load_cuda_after_torch", "cuda", "opforge.load of a .cu extension, TORCH_CUDA_ARCH_LIST unset, torch first")
def load_cuda_after_torch(work):
    scripts = timed_loads(AFTER_TORCH, "axpb_ext", repr(CUDA_EXT))
    return {"torch": scripts["torch"] + CUDA_TAIL, "opforge": scripts["opforge"] + CUDA_TAIL, "patch": False}


@case("patched_load", "cpu", "from torch.utils.cpp_extension import load; load(...), under the patch")
def patched_load(work):
    code = timed_loads(AFTER_TORCH, "demo_ext", repr([DEMO]))["torch"]  # torch's script, under the patch or not
    code += CHECK_DEMO + "T1 = _time.perf_counter()\nEXTRA = {'load_s': T_L1 - T_L}\n"
    return {"torch": code, "opforge": code, "patch": True}


@case("stylegan", "cpu", "StyleGAN's plugins: load(...), then importlib.import_module(name)")
def stylegan(work):
    code = (AFTER_TORCH + "import importlib\nimport torch.utils.cpp_extension\n"
            f"torch.utils.cpp_extension.load(name='demo_ext', sources=[{DEMO!r}])\n"
            "M = importlib.import_module('demo_ext')\n" + CHECK_DEMO + "T1 = _time.perf_counter()\n")
    return {"torch": code, "opforge": code, "patch": True}


@case("seed_op", "both", "from op import fused_leaky_relu, upfirdn2d: two loads at the package's import")
def seed_op(work, cuda=False):
    dst = os.path.join(work, "seed_op_cuda" if cuda else "seed_op")
    if not os.path.isdir(dst):
        shutil.copytree(os.path.join(HERE, "warm_start_op"), dst)
        with open(os.path.join(dst, "op", "flavour.py"), "w") as f:
            f.write(f"CUDA = {cuda!r}\n")
    device = "'cuda'" if cuda else "'cpu'"
    code = (AFTER_TORCH + f"import sys\nsys.path.insert(0, {dst!r})\n"
            "from op import fused_leaky_relu, upfirdn2d\nT1 = _time.perf_counter()\n"
            f"x = torch.arange(-8, 8, dtype=torch.float32, device={device}).reshape(1, 2, 2, 4)\n"
            f"b = torch.tensor([0.5, -0.25], device={device})\n"
            "RESULT = fused_leaky_relu(x, b).flatten().tolist() + upfirdn2d(x).flatten().tolist()\n")
    return {"torch": code, "opforge": code, "patch": True}


DS_TIMED = (
    "import torch.utils.cpp_extension as _ce\n"
    "_inner, _took = _ce.load, []\n"
    "def _timed(*a, **k):\n"
    "    t = _time.perf_counter()\n"
    "    try:\n        return _inner(*a, **k)\n"
    "    finally:\n        _took.append(_time.perf_counter() - t)\n"
    "_ce.load = _timed\n"
)
"""DeepSpeed's jit_load imports ``load`` from torch's module when it calls: this times that call."""


def _ds(builder, check):
    return (AFTER_TORCH + DS_TIMED
            + f"from deepspeed.ops.op_builder import {builder}\nM = {builder}().load(verbose=False)\n"
            + check + "T1 = _time.perf_counter()\nEXTRA = {'load_s': _took[0] if _took else None}\n")


DS_CPU_CHECK = ("o = M.create_adam(7, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, False)\n"
                "p, g = torch.ones(5), torch.full((5,), 0.5)\nm, v = torch.zeros(5), torch.zeros(5)\n"
                "M.adam_update(7, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v)\nRESULT = p.tolist()\n")

DS_PROBES = r"""
import json, time
t = time.perf_counter()
import torch
t_torch = time.perf_counter()
from deepspeed.ops.op_builder import CPUAdamBuilder
b = CPUAdamBuilder()
t_import = time.perf_counter()
out = {"import torch": t_torch - t, "import deepspeed's builder": t_import - t_torch}
for label, call in (("is_compatible() (py-cpuinfo among others)", b.is_compatible), ("cpu_arch() (py-cpuinfo)", b.cpu_arch),
                    ("simd_width() (py-cpuinfo)", b.simd_width), ("cxx_args() (-march, SIMD, OpenMP)", b.cxx_args),
                    ("sources() and include_paths()", lambda: (b.sources(), b.include_paths()))):
    t = time.perf_counter()
    call()
    out[label] = time.perf_counter() - t
print("WARM-START " + json.dumps(out))
"""


@case("ds_cpu_adam", "cpu", "DeepSpeed's CPUAdamBuilder().load()")
def ds_cpu_adam(work):
    code = _ds("CPUAdamBuilder", DS_CPU_CHECK)
    return {"torch": code, "opforge": code, "patch": True}


@case("ds_cpu_adam_cxx", "cpu", "DeepSpeed's CPUAdamBuilder().load(), CXX a wrapper script")
def ds_cpu_adam_cxx(work):
    code = _ds("CPUAdamBuilder", DS_CPU_CHECK)
    return {"torch": code, "opforge": code, "patch": True, "env": {"CXX": cxx_wrapper(work)}}


@case("ds_fused_adam", "cuda", "DeepSpeed's FusedAdamBuilder().load()")
def ds_fused_adam(work):
    check = ("p = [torch.ones(5, device='cuda')]\nRESULT = [float(len(dir(M)) > 0)]\n")
    code = _ds("FusedAdamBuilder", check)
    # DeepSpeed 0.19.8 parses TORCH_CUDA_ARCH_LIST itself and fails on torch 2.11's default list: its users set it.
    return {"torch": code, "opforge": code, "patch": True, "env": {"TORCH_CUDA_ARCH_LIST": "9.0"}}


@case("colossalai", "cuda", "ColossalAI's CpuAdamX86Extension().build_jit()")
def colossalai(work, sdist=None):
    found = sdist or (sorted(glob.glob(os.path.join(ROOT, ".venv", "clients", "colossalai-*.tar.gz"))) or [None])[-1]
    if not found or not os.path.isfile(found):
        raise SystemExit("colossalai: no sdist (--colossalai SDIST, or `make .venv/.opforge-clients`)")
    dst = os.path.join(work, "colossalai")
    if not os.path.isdir(dst):
        with tarfile.open(found) as tar:
            top = tar.getnames()[0].split("/")[0]
            members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/extensions/")]
            tar.extractall(dst, members=members, filter="data")
        os.rename(os.path.join(dst, top, "extensions"), os.path.join(dst, "extensions"))
    def code(loader: str) -> str:  # a JIT folder each: torch's ninja runs in it (build_directory), opforge's may
        folder = os.path.join(work, f"colossalai-jit-{loader}")
        return (AFTER_TORCH + f"import sys\nsys.path.insert(0, {dst!r})\n"
                "from extensions.base_extension import _Extension\n"
                f"_Extension.get_jit_extension_folder_path = staticmethod(lambda: {folder!r})\n"
                "from extensions.pybind.cpu_adam.cpu_adam_x86 import CpuAdamX86Extension\n"
                "M = CpuAdamX86Extension().build_jit()\nRESULT = [float(hasattr(M, 'CPUAdamOptimizer'))]\n"
                "T1 = _time.perf_counter()\n")

    return {"torch": code("torch"), "opforge": code("opforge"), "patch": True}


def child_env(work: str, loader: str, spec: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPFORGE_PATCH_TORCH", "TORCH_CUDA_ARCH_LIST", "PYTHONDONTWRITEBYTECODE", "CXX")}
    env.update(OPFORGE_CACHE_DIR=os.path.join(work, "opforge"), TORCH_EXTENSIONS_DIR=os.path.join(work, "torch"),
               PYTHONUNBUFFERED="1")
    env.update(spec.get("env", {}))
    if loader == "opforge" and spec["patch"]:
        env["OPFORGE_PATCH_TORCH"] = "1"
    return env


def run_child(code: str, env: dict, timeout: float = 1800, whole: bool = False) -> dict:
    """Run a case's script (``whole``: a script that prints its own ``WARM-START`` line) in a new process."""
    script = code if whole else "import time as _t0\nT_START = _t0.perf_counter()\n" + code + END
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout,
                         check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("WARM-START ")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail[:300]}
    return json.loads(lines[-1][len("WARM-START "):])


def floor(env: dict, runs: int) -> dict:
    code = START + "import torch\nT1 = _time.perf_counter()\nRESULT = []\n"
    got = [run_child(code, env) for _ in range(runs + 1)][1:]
    return summary([g["window_s"] for g in got if "window_s" in g])


def summary(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {}
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "runs": values}


def run_case(name: str, work: str, runs: int, args) -> dict:
    device, doc, make = CASES[name]
    kwargs = {}
    if name == "seed_op":
        kwargs["cuda"] = args.cuda
    if name == "colossalai":
        kwargs["sdist"] = args.colossalai
    spec = make(work, **kwargs)
    result = {"case": name, "what": doc}
    envs = {loader: child_env(work, loader, spec) for loader in ("torch", "opforge")}
    got = {"torch": [], "opforge": []}
    for loader in ("torch", "opforge"):  # the first process builds (and writes opforge's .pyc)
        first = run_child(spec[loader], envs[loader])
        result[f"{loader}_first_s"] = first.get("window_s")
        if "error" in first:
            result[f"{loader}_error"] = first["error"]
    for _ in range(runs):
        for loader in ("torch", "opforge"):
            if f"{loader}_error" not in result:
                got[loader].append(run_child(spec[loader], envs[loader]))
    for loader in ("torch", "opforge"):
        rows = [g for g in got[loader] if "error" not in g]
        errors = [g["error"] for g in got[loader] if "error" in g]
        if errors:
            result[f"{loader}_error"] = errors[0]
        result[loader] = {key: summary([r.get(key) for r in rows])
                          for key in ("window_s", "load_s", "torch_s") if any(r.get(key) is not None for r in rows)}
        extra = {k: v for r in rows for k, v in r.items() if k not in ("window_s", "load_s", "torch_s", "result")}
        if extra:
            result[loader]["extra"] = extra
        if rows:
            result[loader]["result"] = rows[0]["result"]
    t, o = result["torch"].get("window_s"), result["opforge"].get("window_s")
    if t and o:
        result["ratio"] = o["median_s"] / t["median_s"]
    tr, orr = result["torch"].get("result"), result["opforge"].get("result")
    if tr is not None and orr is not None:
        result["same_result"] = len(tr) == len(orr) and all(abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(tr, orr))
    if name.startswith("ds_cpu_adam"):
        probes = [run_child(DS_PROBES, envs["torch"], whole=True) for _ in range(max(1, min(runs, 3)))]
        keys = [k for k in probes[0] if k not in ("window_s", "result")] if "error" not in probes[0] else []
        result["probes"] = {k: statistics.median(p[k] for p in probes if k in p) for k in keys}
    return result


def ms(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['median_s'] * 1e3:.1f} ({s['min_s'] * 1e3:.1f}-{s['max_s'] * 1e3:.1f})"


def table(results: list[dict], floor_s: dict) -> str:
    lines = ["| case | torch: window ms | opforge: window ms | opforge / torch | load call ms, torch / opforge | "
             "torch's import ms (before the window) |", "|---|---:|---:|---:|---|---:|"]
    for r in results:
        t, o = r.get("torch", {}), r.get("opforge", {})
        tw = r.get("torch_error") and f"fails: {r['torch_error'][:60]}" or ms(t.get("window_s"))
        ow = r.get("opforge_error") and f"fails: {r['opforge_error'][:60]}" or ms(o.get("window_s"))
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        loads = f"{ms(t.get('load_s'))} / {ms(o.get('load_s'))}" if t.get("load_s") or o.get("load_s") else "-"
        lines.append(f"| {r['case']}: {r['what']} | {tw} | {ow} | {ratio} | {loads} | "
                     f"{ms(o.get('torch_s') or t.get('torch_s'))} |")
    lines.append(f"| floor: `import torch` alone, a new process | {ms(floor_s)} | | | | |")
    return "\n".join(lines)


def gpu_listed() -> bool:
    sys.path.insert(0, ROOT)
    from opforge import nvml

    return bool(nvml.listed())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="", help=f"comma-separated, of {', '.join(CASES)} (default: the ones that "
                    "run here: the cuda ones where NVML lists a GPU)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--work", metavar="DIR", help="keep the caches here (default: a temp dir, removed)")
    ap.add_argument("--colossalai", metavar="SDIST")
    args = ap.parse_args()
    gpu = gpu_listed()
    names = [c for c in args.case.split(",") if c] or [n for n, (d, _, _) in CASES.items()
                                                        if d in ("cpu", "both") or gpu]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}: the cases are {', '.join(CASES)}")
    args.cuda = gpu
    work = args.work or tempfile.mkdtemp(prefix="opforge-warm-")
    os.makedirs(work, exist_ok=True)
    try:
        results = []
        for name in names:
            print(f"{name}...", file=sys.stderr, flush=True)
            results.append(run_case(name, work, args.runs, args))
        base_env = child_env(work, "torch", {"patch": False})
        floor_s = floor(base_env, args.runs)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    import torch

    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or ''}".strip(", "),
           "python": platform.python_version(), "torch": torch.__version__, "gpu": gpu, "runs": args.runs,
           "floor_import_torch": floor_s, "cases": results}
    print(table(results, floor_s))
    for r in results:
        if "probes" in r:
            print(f"{r['case']}: DeepSpeed's own probing, a new process each, torch alone: " +
                  ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in r["probes"].items()))
        if r.get("same_result") is False:
            print(f"{r['case']}: torch's and opforge's ops gave different results", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
