"""CUDA extensions on a GPU machine (skipped without one)."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest
import torch
from conftest import ROOT, run_python

import opforge

DATA = os.path.join(ROOT, "examples", "cuda_ext")
pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda_src(tmp_path):
    dst = tmp_path / "cuda_ext"
    shutil.copytree(DATA, dst)
    return dst


def _load(src, cache):
    return textwrap.dedent(
        f"""
        import time, torch, opforge
        t = time.perf_counter()
        m = opforge.load("axpb_ext", [{str(src / 'axpb.cpp')!r}, {str(src / 'axpb_kernel.cu')!r}], extra_cuda_cflags=["-O2"])
        took = time.perf_counter() - t
        x = torch.randn(1000003, device="cuda")
        y = m.axpb(x, 0.5)
        print(float((y - (SCALE * x + 0.5)).abs().max()), took)
        """
    )


def test_cuda_extension_builds_loads_and_tracks_its_header(cuda_src, cache_dir):
    env = {"OPFORGE_CACHE_DIR": str(cache_dir)}
    cold = run_python(_load(cuda_src, cache_dir).replace("SCALE", "2.0"), env=env, timeout=900)
    assert cold.returncode == 0, cold.stderr
    err, _ = map(float, cold.stdout.split())
    assert err < 1e-5
    warm = run_python(_load(cuda_src, cache_dir).replace("SCALE", "2.0"), env=env)
    assert warm.returncode == 0, warm.stderr
    _, took = map(float, warm.stdout.split())
    assert took < 0.5  # a warm load is an import, not a build
    (cuda_src / "kernel.cuh").write_text("#pragma once\n#define AXPB_SCALE 3.0f\n")
    edited = run_python(_load(cuda_src, cache_dir).replace("SCALE", "3.0"), env=env, timeout=900)
    assert edited.returncode == 0, edited.stderr
    assert float(edited.stdout.split()[0]) < 1e-5  # the header change was seen (a stale binary is off by ~|x|)


def test_load_inline_with_cuda_sources(cache_dir):
    cuda = textwrap.dedent(
        """
        __global__ void neg_kernel(const float* x, float* y, int64_t n) {
          int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
          if (i < n) y[i] = -x[i];
        }
        torch::Tensor neg(torch::Tensor x) {
          auto y = torch::empty_like(x);
          int64_t n = x.numel();
          if (n) neg_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
          return y;
        }
        """
    )
    mod = opforge.load_inline("inline_cuda_neg", "torch::Tensor neg(torch::Tensor x);", cuda_sources=cuda,
                              functions=["neg"])
    x = torch.randn(4097, device="cuda")
    torch.testing.assert_close(mod.neg(x), -x)


WARM_WITHOUT_CUDA = textwrap.dedent("""
    import json, sys, time
    t = time.perf_counter()
    import opforge
    m = opforge.load("axpb_ext", [SOURCES], extra_cuda_cflags=["-O2"])
    took = time.perf_counter() - t
    import torch
    with open("/proc/self/maps") as f:
        driver = "libcuda.so" in f.read()
    state = {"took": took, "initialized": torch.cuda.is_initialized(), "driver_loaded": driver}
    x = torch.randn(4099, device="cuda")
    state["err"] = float((m.axpb(x, 0.5) - (2.0 * x + 0.5)).abs().max())
    print(json.dumps(state))
""")


def test_a_warm_cuda_load_with_no_arch_list_leaves_cuda_alone(cuda_src, cache_dir, monkeypatch):
    """Issue 60, item 2: TORCH_CUDA_ARCH_LIST unset (the default), the key's GPUs come from NVML or the cache's
    record of it: a warm load neither initialises CUDA nor maps the driver's libcuda beyond what torch's import
    does, in a script that never imported torch, and takes milliseconds (it took 200 ms on the H200 host through torch.cuda.is_available)."""
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    sources = f"{str(cuda_src / 'axpb.cpp')!r}, {str(cuda_src / 'axpb_kernel.cu')!r}"
    code = WARM_WITHOUT_CUDA.replace("SOURCES", sources)
    env = {"OPFORGE_CACHE_DIR": str(cache_dir)}
    cold = run_python(code, env=env, timeout=900)
    assert cold.returncode == 0, cold.stderr
    torch_alone = run_python('import torch\nwith open("/proc/self/maps") as f:\n    print("libcuda.so" in f.read())')
    driver_with_torch = torch_alone.stdout.strip() == "True"  # torch 2.11's import maps the driver's library
    for _ in range(2):  # the first warm process may record NVML's answer; the second reads it
        warm = run_python(code, env=env)
        assert warm.returncode == 0, warm.stderr
        state = json.loads(warm.stdout.strip().splitlines()[-1])
        assert state["err"] < 1e-5
        assert not state["initialized"] and state["driver_loaded"] == driver_with_torch, state
    assert state["took"] < 3.0  # opforge's import, torch's (which the module needs) and the load
    patched = run_python(textwrap.dedent(f"""
        import torch
        def forbidden(*a, **k):
            raise AssertionError("the warm load asked the CUDA runtime")
        torch.cuda.is_available = torch.cuda.device_count = torch.cuda.get_device_capability = forbidden
        torch.cuda._lazy_init = forbidden
        import time, opforge
        t = time.perf_counter()
        opforge.load("axpb_ext", [{sources}], extra_cuda_cflags=["-O2"])
        print((time.perf_counter() - t) * 1e3)
    """), env=env)
    assert patched.returncode == 0, patched.stderr
    assert float(patched.stdout.split()[-1]) < 20  # ms, torch imported first: the target is 5
