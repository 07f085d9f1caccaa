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

if os.environ.get("OPFORGE_TEST_REQUIRE_CLIENTS") == "1":
    import deepspeed  # noqa: F401  (CI: a missing DeepSpeed is a failure, not a skip)
else:
    pytest.importorskip("deepspeed")

_LOAD = """
import hashlib, json, sys, time
import torch
import opforge
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.ops.op_builder import CPUAdamBuilder
t0 = time.perf_counter()
m = CPUAdamBuilder().load(verbose=False)
took = time.perf_counter() - t0
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
                  "patched": opforge.patch.is_patched(), "err": float((ours - ref).abs().max()),
                  "bits": hashlib.sha256(ours.detach().numpy().tobytes()).hexdigest()}))
"""


def _load(env: dict) -> dict:
    out = run_python(_LOAD, env={"DS_BUILD_OPS": "0", **env}, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """DeepSpeed's cpu_adam built once under the patch, into a cache of its own, with a counting CXX."""
    tmp = tmp_path_factory.mktemp("deepspeed")
    cxx = CompilerLog(tmp)
    env = {"OPFORGE_PATCH_TORCH": "1", "OPFORGE_CACHE_DIR": str(tmp / "cache"), "OPFORGE_CCACHE": "0",
           "TORCH_NO_COMPILER_WRAPPER": "1",  # torch >= 2.10 puts ccache in front when installed: count real compiles
           "TORCH_EXTENSIONS_DIR": str(tmp / "torch_extensions"), "CXX": str(cxx.path), "CXX_LOG": str(cxx.log)}
    # The first build is killed with -9 mid-compile (its lock dies with it); the next load builds at once.
    _killed_mid_build(env, tmp / "compiling")
    started = time.monotonic()
    cold = _load(env)
    return SimpleNamespace(tmp=tmp, env=env, cxx=cxx, cold=cold, built=len(cxx.compiles()),
                           after_kill_s=time.monotonic() - started)


def test_cpu_adam_builder_builds_once_through_opforge_then_loads_warm(patched):
    cold, env, cxx = patched.cold, patched.env, patched.cxx
    assert cold["file"].startswith(env["OPFORGE_CACHE_DIR"]) and cold["patched"]
    assert cold["err"] < 1e-5  # DeepSpeed's own kernel, built by opforge, steps as torch's AdamW does
    assert patched.built >= 1

    warm = _load(env)  # a new process: the cache's entry, no compile, no ninja imported
    assert warm["file"] == cold["file"] and not warm["ninja"] and warm["bits"] == cold["bits"]
    assert len(cxx.compiles()) == patched.built

    # The patch off: torch's own load builds it again, in its own directory, and it computes the same bits.
    off = _load({**env, "OPFORGE_PATCH_TORCH": "0"})
    assert off["file"].startswith(env["TORCH_EXTENSIONS_DIR"]) and not off["patched"]
    assert len(cxx.compiles()) > patched.built
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


def _killed_mid_build(env: dict, marker) -> None:
    """Start DeepSpeed's load in a new session, wait until its compiler runs (the CXX wrapper touches
    ``marker``, then sleeps), and kill -9 the whole session: a build killed with its holder."""
    full = dict(os.environ, PYTHONPATH=ROOT, DS_BUILD_OPS="0", SLOW_MARKER=str(marker), **env)
    victim = subprocess.Popen([sys.executable, "-c", _LOAD], env=full, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            if victim.poll() is not None:
                pytest.fail(f"DeepSpeed's load exited before compiling:\n{victim.stderr.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "the compiler never started"
            time.sleep(0.05)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        kill_session(victim.pid)
        victim.stderr.close()
    marker.unlink()


def test_a_build_killed_mid_compile_never_hangs_the_next_load(patched, counting_cxx, tmp_path):
    # Under the patch (the module's build, above): the load after the killed one built at once, and loads.
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
