"""DeepSpeed as a real client: its own ``CPUAdamBuilder().load()`` (``OpBuilder.jit_load``, which calls
``torch.utils.cpp_extension.load``), unchanged, under ``opforge.patch_torch()``.

DeepSpeed is installed by ``make test`` (``DS_BUILD_OPS=0``: no op prebuilt); without it these tests
skip, unless ``OPFORGE_TEST_REQUIRE_DEEPSPEED=1`` (``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, kill_session, run_python

if os.environ.get("OPFORGE_TEST_REQUIRE_DEEPSPEED") == "1":
    import deepspeed  # noqa: F401  (CI: a missing DeepSpeed is a failure, not a skip)
else:
    pytest.importorskip("deepspeed")

_LOAD = """
import json, sys, time
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
                  "patched": opforge.patch.is_patched(), "err": float((ours - ref).abs().max())}))
"""


def _load(env: dict) -> dict:
    out = run_python(_LOAD, env={"DS_BUILD_OPS": "0", **env}, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cpu_adam_builder_builds_once_through_opforge_then_loads_warm(cache_dir, counting_cxx, tmp_path):
    torch_dir = tmp_path / "torch_extensions"
    env = {"OPFORGE_PATCH_TORCH": "1", "TORCH_EXTENSIONS_DIR": str(torch_dir)}
    cold = _load(env)
    assert cold["file"].startswith(str(cache_dir)) and cold["patched"]
    assert cold["err"] < 1e-5  # DeepSpeed's own kernel, built by opforge, steps as torch's AdamW does
    built = len(counting_cxx.compiles())
    assert built >= 1

    warm = _load(env)  # a new process: the cache's entry, no compile, no ninja imported
    assert warm["file"] == cold["file"] and not warm["ninja"] and warm["err"] < 1e-5
    assert len(counting_cxx.compiles()) == built

    # The patch off: torch's own load builds it again, in its own directory.
    off = _load({"OPFORGE_PATCH_TORCH": "0", "TORCH_EXTENSIONS_DIR": str(torch_dir)})
    assert off["file"].startswith(str(torch_dir)) and not off["patched"] and off["err"] < 1e-5
    assert len(counting_cxx.compiles()) > built


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


def test_a_build_killed_mid_compile_never_hangs_the_next_load(cache_dir, counting_cxx, tmp_path):
    torch_dir = tmp_path / "torch_extensions"
    env = {"OPFORGE_PATCH_TORCH": "1", "TORCH_EXTENSIONS_DIR": str(torch_dir)}
    _killed_mid_build(env, tmp_path / "compiling")
    started = time.monotonic()
    after = _load(env)  # the dead build's lock died with it: this one builds at once, and loads
    assert after["file"].startswith(str(cache_dir)) and after["err"] < 1e-5
    assert time.monotonic() - started < 300

    # The patch off: torch's own baton outlives its holder, and the next load waits for it forever.
    off = {"OPFORGE_PATCH_TORCH": "0", "TORCH_EXTENSIONS_DIR": str(torch_dir)}
    _killed_mid_build(off, tmp_path / "compiling")
    assert (torch_dir / "cpu_adam" / "lock").exists()  # torch's baton, left by the dead build
    compiles = len(counting_cxx.compiles())
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(_LOAD, env={"DS_BUILD_OPS": "0", **off}, timeout=20, start_new_session=True)
    assert len(counting_cxx.compiles()) == compiles  # it waited, compiling nothing: not merely a slow build
