"""First contact for block-sparse decode on a GPU: a new process's first ``BlockSparseLinear`` calls with an
empty opforge cache, opforge installed plainly (``jit``: the first GPU calls compile native_launch's C++
variant, the C++ autograd node and the CUDA decode kernel) against opforge from a wheel built with
``OPFORGE_BUILD=block_sparse`` (``prebuilt``: all three in the package).

    python bench/first_decode.py [--wheel W] [--repeat 2] [--installs jit,prebuilt] [--tritons cold,warm] [--json FILE]

Without ``--wheel`` the wheel of this checkout is built first (timed). It is installed into a venv that
borrows this interpreter's torch and triton; ``jit`` runs this interpreter's opforge, which must hold no
prebuilt kernels. Each run is a new process with an empty ``OPFORGE_CACHE_DIR`` (so the decode route
tunes in both) and Triton's cache either empty (``triton cold``) or filled by a run before (``triton
warm``), so the part the prebuilt companions remove is seen apart from Triton's own compiles. The
environment passes to each run: ``OPFORGE_TRITON_COMPILE_THREADS=1`` compiles a tuning's configs in turn.

A run times, each to a synchronized GPU: importing torch and opforge; ``parts`` (a run of its own, with
Triton's cache cold only: it launches no Triton kernel) the loads of the three extensions alone; ``e2e`` a layer's first forward at T=1, its first at T=16, a training
step at T=64, then a second forward at T=1. Layer: 4096->14336, 64-blocks, density 0.25, bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, opforge
from opforge.nn import BlockSparseLinear
torch.cuda.init()
out = {"opforge": opforge.__file__, "import": time.perf_counter() - t0}
from opforge.kernel_loader import NativeLaunchLoader
from opforge.kernels.block_sparse.cuda_decode import BlockSparseDecodeCuda
from opforge.kernels.block_sparse.native_autograd import BlockSparseAutograd
def timed(key, fn):
    t = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    out[key] = time.perf_counter() - t
    return r
if sys.argv[1] == "parts":
    timed("native_launch_cpp", lambda: NativeLaunchLoader().load())
    timed("block_sparse_autograd", lambda: BlockSparseAutograd().load())
    timed("block_sparse_decode_cuda", lambda: BlockSparseDecodeCuda().load())
else:
    torch.manual_seed(0)
    layer = BlockSparseLinear(4096, 14336, density=0.25, block_shape=(64, 64), device="cuda", dtype=torch.bfloat16)
    xs = {t: torch.randn(t, 4096, device="cuda", dtype=torch.bfloat16) for t in (1, 16, 64)}
    with torch.no_grad():
        timed("first T=1", lambda: layer(xs[1]))
        timed("first T=16", lambda: layer(xs[16]))
    x = xs[64].requires_grad_()
    timed("train T=64", lambda: layer(x).float().square().sum().backward())
    with torch.no_grad():
        timed("second T=1", lambda: layer(xs[1]))
out["origins"] = {"native_launch_cpp": NativeLaunchLoader().load().origin,
                  "block_sparse_autograd": BlockSparseAutograd().load().origin,
                  "block_sparse_decode_cuda": BlockSparseDecodeCuda().load().origin}
print("RESULT " + json.dumps(out))
"""


def build_wheel(out_dir: str) -> tuple[str, float]:
    src = os.path.join(out_dir, "src")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__", "*.so",
                                                             ".whl", "build", "dist", "build_info.json", ".bench-cache"))
    env = {**os.environ, "OPFORGE_BUILD": "block_sparse", "PIP_NO_INDEX": "1"}
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                          os.path.join(out_dir, "wheels"), src], env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t
    if run.returncode:
        sys.exit(f"the wheel build failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    (wheel,) = [os.path.join(out_dir, "wheels", n) for n in os.listdir(os.path.join(out_dir, "wheels"))]
    return wheel, took


def venv_with(out_dir: str, wheel: str) -> str:
    """A venv holding the wheel; torch, triton and the rest come from this interpreter's paths (not opforge)."""
    venv = os.path.join(out_dir, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    inside = lambda p: os.path.abspath(p) == ROOT or os.path.abspath(p).startswith(ROOT + os.sep)  # noqa: E731
    deps = [p for p in sys.path if p and os.path.isdir(p) and not inside(p)]
    with open(os.path.join(site, "zz_deps.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys([*deps, sysconfig.get_paths()["purelib"]])) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel],
                   check=True)
    return py


def child(py: str, what: str, work: str, triton_cache: str) -> dict:
    cache = tempfile.mkdtemp(prefix="ofc-", dir=work)
    env = {**os.environ, "OPFORGE_CACHE_DIR": cache, "TRITON_CACHE_DIR": triton_cache}
    t = time.perf_counter()
    run = subprocess.run([py, "-c", CHILD, what], env=env, capture_output=True, text=True, cwd=work, check=False)
    wall = time.perf_counter() - t
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if run.returncode or line is None:
        sys.exit(f"a run failed ({py} {what}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    shutil.rmtree(cache, ignore_errors=True)
    return {**json.loads(line[7:]), "process": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", help="a wheel built with OPFORGE_BUILD=block_sparse (default: build one)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--installs", default="jit,prebuilt", help="which installs to run (jit, prebuilt)")
    ap.add_argument("--tritons", default="cold,warm", help="Triton's cache states to run (cold, warm)")
    ap.add_argument("--json", help="write the runs here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="first-decode-")
    wheel, build_s = (args.wheel, None) if args.wheel or args.installs == "jit" else build_wheel(work)
    wanted = args.installs.split(",")
    installs = {k: v for k, v in (("jit", sys.executable), ("prebuilt", "venv")) if k in wanted}
    if "prebuilt" in installs:
        installs["prebuilt"] = venv_with(work, wheel)
    tritons = [t for t in ("cold", "warm") if t in args.tritons.split(",")]
    runs = []
    for i in range(args.repeat):
        for triton in tritons:
            for install, py in installs.items():
                tcache = os.path.join(work, f"triton-{install}-{i}")
                if triton == "cold" or not os.path.isdir(tcache):  # warm: after a cold run, or one to fill it
                    shutil.rmtree(tcache, ignore_errors=True)
                    if triton == "warm":
                        child(py, "e2e", work, tcache)
                for what in ("parts", "e2e") if triton == "cold" else ("e2e",):  # parts: Triton's cache unused
                    r = child(py, what, work, tcache)
                    runs.append({"install": install, "triton": triton, "what": what, **r})
                    print(json.dumps(runs[-1]), flush=True)
    keys = ["import", "native_launch_cpp", "block_sparse_autograd", "block_sparse_decode_cuda", "first T=1",
            "first T=16", "train T=64", "second T=1", "process"]
    threads = os.environ.get("OPFORGE_TRITON_COMPILE_THREADS", "default")
    print(f"\nOPFORGE_TRITON_COMPILE_THREADS={threads}; " +
          (f"wheel build (OPFORGE_BUILD=block_sparse): {build_s:.1f} s" if build_s else f"wheel: {wheel}"))
    print("| install | triton cache | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for install in installs:
        for triton in tritons:
            cells = []
            for k in keys:
                vals = [r[k] for r in runs if r["install"] == install and r["triton"] == triton and k in r
                        and (k != "process" or r["what"] == "e2e")]
                cells.append(f"{statistics.median(vals):.2f}" if vals else "")
            print(f"| {install} | {triton} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"wheel_build_s": build_s, "compile_threads": threads, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
