"""DeepSpeed as a real client: its own ``CPUAdamBuilder().load()`` (``OpBuilder.jit_load``, which calls
``torch.utils.cpp_extension.load``), unchanged, under ``opforge.patch_torch()``.

DeepSpeed is installed by ``make test`` (``DS_BUILD_OPS=0``: no op prebuilt); without it these tests
skip, unless ``OPFORGE_TEST_REQUIRE_DEEPSPEED=1`` (``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_python

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
