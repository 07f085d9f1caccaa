"""DeepSpeed as a real client: its own ``CPUAdamBuilder().load()`` (``OpBuilder.jit_load``, which calls
``torch.utils.cpp_extension.load``), unchanged, under ``opforge.patch_torch()``.

DeepSpeed is installed by ``make test`` (``DS_BUILD_OPS=0``: no op prebuilt); without it these tests
skip, unless ``OPFORGE_TEST_REQUIRE_CLIENTS=1`` (``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import ROOT, CompilerLog, kill_session, run_python
from reused_objects import ADDED_BY_OPFORGE

from opforge.engine.lock import read_holder

if os.environ.get("OPFORGE_TEST_REQUIRE_CLIENTS") == "1":
    import deepspeed  # noqa: F401  (CI: a missing DeepSpeed is a failure, not a skip)
else:
    pytest.importorskip("deepspeed")

_LOAD = """
import hashlib, json, sys, time
import torch
t0 = time.perf_counter()
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.ops.op_builder import CPUAdamBuilder
m = CPUAdamBuilder().load(verbose=False)
took = time.perf_counter() - t0
import torch.utils.cpp_extension as cpp_extension
patched = hasattr(cpp_extension.load, "__opforge_routes__")  # the variable alone: no import opforge
torch.manual_seed(0)
p0 = torch.randn(1001)
g = torch.randn(1001)
ours, ref = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())
ours.grad, ref.grad = g.clone(), g.clone()
ds = DeepSpeedCPUAdam([ours], lr=1e-2, weight_decay=0.01, adamw_mode=True)
adamw = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01)
for _ in range(3):
    ds.step()
    adamw.step()
print(json.dumps({"file": m.__file__, "took": took, "ninja": "ninja" in sys.modules,
                  "patched": patched, "stand_in": type(cpp_extension).__name__ == "StandIn",
                  "setuptools": "setuptools" in sys.modules, "err": float((ours - ref).abs().max()),
                  "bits": hashlib.sha256(ours.detach().numpy().tobytes()).hexdigest()}))
"""


def _load(env: dict, with_stderr: bool = False):
    out = run_python(_LOAD, env={"DS_BUILD_OPS": "0", **env}, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return (got, out.stderr) if with_stderr else got


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """DeepSpeed's cpu_adam built once under the patch, into a cache of its own, with a counting CXX.
    First a build is killed with -9 mid-compile (its lock dies with it); the next load builds at once."""
    tmp = tmp_path_factory.mktemp("deepspeed")
    cxx = CompilerLog(tmp)
    env = {"OPFORGE_PATCH_TORCH": "1", "OPFORGE_CACHE_DIR": str(tmp / "cache"), "OPFORGE_CCACHE": "0",
           "TORCH_NO_COMPILER_WRAPPER": "1",  # torch >= 2.10 puts ccache in front when installed: count real compiles
           "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"), "CXX": str(cxx.path), "CXX_LOG": str(cxx.log),
           "CXX_SAVE_OBJECTS": str(tmp / "objects")}  # each compile's object kept, for torch's build (below)
    killed = _killed_mid_build(env, tmp / "compiling")
    holders = [read_holder(str(p)[: -len(".holder")]) for p in (tmp / "cache" / "cpu_adam").glob("*.lock.holder")]
    before = len(cxx.compiles())
    started = time.monotonic()
    cold, cold_err = _load(env, with_stderr=True)
    total = len(cxx.compiles())
    return SimpleNamespace(tmp=tmp, env=env, cxx=cxx, cold=cold, cold_err=cold_err, built=total - before, total=total,
                           after_kill_s=time.monotonic() - started, killed=killed, holders=holders)


def test_cpu_adam_builder_builds_once_through_opforge_then_loads_warm(patched):
    cold, env, cxx = patched.cold, patched.env, patched.cxx
    assert cold["file"].startswith(env["OPFORGE_CACHE_DIR"]) and cold["patched"]
    assert cold["err"] < 1e-5  # DeepSpeed's own kernel, built by opforge, steps as torch's AdamW does
    assert patched.built == 2  # one compile per source: cpu_adam.cpp and cpu_adam_impl.cpp
    assert sorted(os.path.basename(c.split(" -c ")[1].split()[0]) for c in patched.cxx.compiles()[-2:]) == [
        "cpu_adam.cpp", "cpu_adam_impl.cpp"]

    warm = _load(env)  # a new process: the cache's entry, no compile, no ninja imported
    assert warm["file"] == cold["file"] and not warm["ninja"] and warm["bits"] == cold["bits"]
    assert warm["stand_in"] and not warm["setuptools"]  # torch's cpp_extension never ran: nothing asked for it
    assert len(cxx.compiles()) == patched.total

    # The patch off: torch's own load builds it again (its own build.ninja, ninja and link, in its own
    # directory), and it computes the same bits. Its compile commands are opforge's, less what opforge adds
    # on purpose: the prefix maps (paths in debug info and __FILE__) and the C++11 ABI define, at the value
    # gcc's headers give it anyway. So the compiler wrapper serves torch's compiles from opforge's objects
    # (tests/reused_objects.py, keyed by the command less those two) rather than compiling them again.
    objects = env["CXX_SAVE_OBJECTS"]
    off_env = {**env, "OPFORGE_PATCH_TORCH": "0", "CXX_SAVE_OBJECTS": "", "CXX_REUSE_OBJECTS": objects}
    off = _load(off_env)
    assert off["file"].startswith(env["TORCH_EXTENSIONS_DIR"]) and not off["patched"]
    ours, theirs = patched.cxx.compiles()[patched.total - 2: patched.total], cxx.compiles()[patched.total:]
    assert len(theirs) == 2 and all("/csrc/adam/cpu_adam" in c for c in ours + theirs)
    added = [[a for a in c.split() if a.startswith(ADDED_BY_OPFORGE)] for c in ours]
    assert all(a[0] == "-D_GLIBCXX_USE_CXX11_ABI=1" and len(a) > 1 for a in added), added
    assert sorted(" ".join(a for a in c.split() if not a.startswith(ADDED_BY_OPFORGE)) for c in ours) == sorted(theirs)
    assert not [a for c in theirs for a in c.split() if a.startswith(ADDED_BY_OPFORGE)]
    gcc_default = subprocess.run([cxx.path, "-std=c++20", "-dM", "-E", "-x", "c++", "-include", "bits/c++config.h",
                                  os.devnull], capture_output=True, text=True, check=True).stdout
    assert "#define _GLIBCXX_USE_CXX11_ABI 1\n" in gcc_default  # the define opforge adds changes nothing here
    with open(os.path.join(objects, "served.log")) as f:
        assert sorted(f.read().splitlines()) == sorted(theirs)  # both of torch's compiles, from opforge's objects
    assert off["bits"] == cold["bits"]  # one pybind extension built by both: identical results


_CASES = """
import json, torch
import opforge
from deepspeed.ops.adam import DeepSpeedCPUAdam
out = []
for dtype in (torch.float32, torch.bfloat16):
    for size in (64, 22, 128, 1024, 1048576):
        torch.manual_seed(size)
        p0 = torch.randn(size)
        ours = torch.nn.Parameter(p0.clone().to(dtype))
        ref = torch.nn.Parameter(p0.clone())  # torch's AdamW in fp32: the reference for both dtypes
        ds = DeepSpeedCPUAdam([ours], lr=1e-3, weight_decay=0.01, adamw_mode=True)
        adamw = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01)
        for _ in range(10):
            g = torch.randn(size)
            ours.grad, ref.grad = g.to(dtype), g.clone()
            ds.step()
            adamw.step()
        diff = (ours.detach().float() - ref.detach()).norm() / ref.detach().norm()
        out.append([str(dtype), size, float(diff)])
print(json.dumps({"patched": opforge.patch.is_patched(), "cases": out}))
"""


def test_deepspeeds_cpu_adam_cases_that_run_on_a_cpu_pass_against_the_opforge_build(patched):
    """What DeepSpeed's tests/unit/ops/adam/test_cpu_adam.py checks on a CPU (TestCPUAdam's
    test_torch_adamw_equal: fp32 and bf16 parameters, sizes 64, 22, 128, 1024 and 1048576, ten steps of
    random gradients, DeepSpeedCPUAdam against torch.optim.AdamW), against the opforge-built kernel.
    DeepSpeed's PyPI sdists carry no tests/ (MANIFEST.in leaves them out, 0.5.0 to 0.19.8), so the
    file can't be taken from there; the cases are written here, after it. fp16 is left out on a CPU,
    as that file does."""
    compiles = len(patched.cxx.compiles())
    out = run_python(_CASES, env={"DS_BUILD_OPS": "0", **patched.env}, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["patched"] and len(patched.cxx.compiles()) == compiles  # the cached build, not a new one
    for dtype, size, diff in got["cases"]:
        assert diff < (1e-6 if dtype == "torch.float32" else 1e-2), (dtype, size, diff)


def test_the_bench_times_deepspeeds_cpu_adam_beside_opforges(patched, tmp_path):
    """``opforge bench cpu_adam`` with DeepSpeed installed: DeepSpeedCPUAdam is a timed peer row, built before
    any timing; here the module's build, loaded warm through the patch (no new compile of DeepSpeed's
    sources). tests/cli/test_bench.py runs the whole quick bench with DeepSpeed hidden."""
    ds_compiles = lambda: [c for c in patched.cxx.compiles() if "/csrc/adam/" in c]  # noqa: E731
    before = ds_compiles()
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "opforge.cli", "bench", "cpu_adam", "--quick", "--device", "cpu",
                        "--json", str(out)], env=dict(os.environ, PYTHONPATH=ROOT, DS_BUILD_OPS="0", **patched.env),
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ds_compiles() == before  # DeepSpeed's op came from the module's build
    (fam,) = json.loads(out.read_text())["families"]
    assert (fam["kind"], fam["status"], fam["missing"]) == ("cpu_adam", "ok", [])
    for case in fam["cases"]:
        rows = {row["impl"]: row for row in case["results"]}
        ds = rows["DeepSpeedCPUAdam"]
        assert ds["role"] == "peer" and ds["error"] is None and ds["time"]["median_s"] > 0, ds
        assert rows["opforge CPUAdam"]["check"]["ok"], rows["opforge CPUAdam"]
    assert "DeepSpeedCPUAdam" in r.stdout


def _killed_mid_build(env: dict, marker) -> SimpleNamespace:
    """Start DeepSpeed's load in a new session, wait until the compiler runs a real compile (the CXX
    wrapper writes a ``-c`` command line to ``marker``, then sleeps; probes pass), and kill -9 the whole
    session: a build killed with its holder. Returns the victim's pid and the compile it was in."""
    full = dict(os.environ, PYTHONPATH=ROOT, DS_BUILD_OPS="0", SLOW_MARKER=str(marker), **env)
    victim = subprocess.Popen([sys.executable, "-c", _LOAD], env=full, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (marker.exists() and marker.read_text().strip()):
            if victim.poll() is not None:
                pytest.fail(f"DeepSpeed's load exited before compiling:\n{victim.stderr.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "the compiler never started"
            time.sleep(0.05)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        kill_session(victim.pid)
        victim.stderr.close()
    compiling = marker.read_text().strip()
    marker.unlink()
    return SimpleNamespace(pid=victim.pid, compiling=compiling)


def test_a_build_killed_mid_compile_never_hangs_the_next_load(patched, counting_cxx, tmp_path):
    # Under the patch (the module's build, above): the kill landed in a real compile of DeepSpeed's source,
    # the lock's holder record names the killed process (dead now: the OS released its flock), and the load
    # after it said the build was interrupted, built at once from a clean build dir, and loads.
    assert " -c " in f" {patched.killed.compiling} " and "/csrc/adam/cpu_adam" in patched.killed.compiling
    assert [h.pid for h in patched.holders] == [patched.killed.pid]
    assert not os.path.exists(f"/proc/{patched.killed.pid}")
    assert f"the previous build of cpu_adam (pid {patched.killed.pid} on " in patched.cold_err
    assert "was interrupted; building from a clean build directory" in patched.cold_err
    assert patched.cold["file"].startswith(patched.env["OPFORGE_CACHE_DIR"]) and patched.cold["err"] < 1e-5
    assert patched.after_kill_s < 300

    # The patch off: torch's own baton outlives its holder, and the next load waits for it forever.
    torch_dir = tmp_path / "torch_extensions"
    off = {"OPFORGE_PATCH_TORCH": "0", "TORCH_EXTENSIONS_DIR": str(torch_dir)}
    _killed_mid_build(off, tmp_path / "compiling")
    assert (torch_dir / "cpu_adam" / "lock").exists()  # torch's baton, left by the dead build
    compiles = len(counting_cxx.compiles())
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(_LOAD, env={"DS_BUILD_OPS": "0", **off}, timeout=10, start_new_session=True)
    assert len(counting_cxx.compiles()) == compiles  # it waited, compiling nothing: not merely a slow build
