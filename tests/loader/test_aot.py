"""AOT at pip install: `OPFORGE_BUILD=all pip wheel .` carries every x86 variant of the selftest
kernel; the wheel, installed into a fresh venv, loads its prebuilt kernel with the compiler
hidden and an empty cache. A plain wheel carries no binary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from conftest import ROOT

from opforge import aot

_IGNORE = shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__", "*.so", ".pytest_cache", ".hypothesis",
                                 ".cache", ".whl", ".bench-cache", "build_info.json")


def IGNORE(directory, names):
    return set(_IGNORE(directory, names)) | ({"build", "dist"} & set(names))


def pip_wheel(tmp, env_extra):
    src = tmp / "src"
    if not src.exists():
        shutil.copytree(ROOT, src, ignore=IGNORE)
    out = tmp / "wheels" / (env_extra.get("OPFORGE_BUILD") or "plain")
    env = {**os.environ, **env_extra, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", str(out),
                          str(src)], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel, run.stdout + run.stderr


@pytest.fixture(scope="module")
def aot_wheel(tmp_path_factory):
    return pip_wheel(tmp_path_factory.mktemp("aot"), {"OPFORGE_BUILD": "all"})


def test_plain_wheel_is_pure_python(tmp_path):
    wheel, _ = pip_wheel(tmp_path, {"OPFORGE_BUILD": ""})
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert not [n for n in names if n.endswith(".so")]
    assert "opforge/engine/jit.py" in names and "opforge/_C/__init__.py" in names
    assert "opforge/kernels/selftest/csrc/axpy.cpp" in names  # the JIT path needs the sources


def test_aot_wheel_has_every_x86_variant_and_a_build_record(aot_wheel):
    wheel, log = aot_wheel
    with zipfile.ZipFile(wheel) as z:
        info = json.loads(z.read("opforge/_C/build_info.json"))
        names = z.namelist()
    exts = info["extensions"]
    if os.uname().machine == "x86_64":
        assert {"selftest_avx512", "selftest_avx2", "selftest_scalar"} <= set(exts)
        assert "selftest_neon" not in exts and "can't be built on x86_64" in log
        assert "-mavx512f" in exts["selftest_avx512"]["cflags"]
    for e in exts.values():
        assert f"opforge/_C/{e['file']}" in names
        assert e["stable_abi"] == "2.10" and len(e["sha256"]) == 64
        assert not any(f.endswith("=native") for f in e["cflags"])  # never tied to the build host (-march=native)
    import torch

    assert info["torch"] == torch.__version__ and info["machine"] == os.uname().machine
    if torch.version.cuda is None:  # the companions are asked for too, and said to be of no use with this torch
        assert "block_sparse_decode_cuda (this torch has no CUDA)" in log
        for node in ("bias_act_autograd", "block_sparse_autograd"):
            assert f"{node} (it drives GPU kernels, and this torch has no CUDA or ROCm)" in log


def test_aot_wheel_loads_prebuilt_in_a_fresh_venv_with_no_compiler(aot_wheel, tmp_path):
    wheel, _ = aot_wheel
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                          "-q", str(wheel)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    # torch and opforge's dependencies come from this interpreter's path (appended after the
    # fresh venv's site-packages); opforge itself only from the wheel.
    deps = [p for p in sys.path if p and os.path.isdir(p) and not os.path.samefile(p, ROOT)]
    with open(os.path.join(site, "zz_deps.pth"), "w") as f:
        f.write("\n".join(deps + [sysconfig.get_paths()["purelib"]]) + "\n")
    cache = tmp_path / "cache"
    code = """
import os, sys, torch, opforge
from opforge.kernel_loader import SelftestLoader
from opforge.platform import current
assert opforge.__file__.startswith(sys.prefix), opforge.__file__
cpu = current().cpu
k = SelftestLoader().load()
x, y = torch.randn(1001), torch.randn(1001)
torch.testing.assert_close(k.axpy(x, y, 3.0), 3.0 * x + y)
print("best", k.name, k.origin, k.simd_width())
for name in ("selftest_avx512", "selftest_avx2", "selftest_scalar"):
    try:
        v = SelftestLoader().load(ext_name=name)
    except opforge.OpforgeError as exc:
        print("skip", name, exc)
        continue
    torch.testing.assert_close(v.axpy(x, y, -1.0), y - x)
    print("variant", name, v.origin, v.simd_width())
from opforge.kernel_loader import CPUAdamLoader
adam = CPUAdamLoader().load()
p, g, m, v = torch.randn(100), torch.randn(100), torch.zeros(100), torch.zeros(100)
assert adam.adam_step_(p, g, m, v, None, None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, True, True, False, 1.0, False, 2)
print("adam", adam.name, adam.origin)
print("cache", sorted(n for n in os.listdir(os.environ["OPFORGE_CACHE_DIR"]) if not n.startswith("."))
      if os.path.isdir(os.environ["OPFORGE_CACHE_DIR"]) else [])
"""
    env = {"PATH": str(venv / "bin"), "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc",
           "OPFORGE_CACHE_DIR": str(cache), "HOME": str(tmp_path)}
    out = subprocess.run([str(py), "-c", code], env=env, capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    best = lines[0].split()
    assert best[2] == "prebuilt", lines
    widths = {"selftest_avx512": "16", "selftest_avx2": "8", "selftest_scalar": "1"}
    assert best[3] == widths[best[1]]  # the binary really was built for the ISA it claims
    for line in lines:
        if line.startswith("variant"):
            _, name, origin, width = line.split()
            assert origin == "prebuilt" and width == widths[name]
    adam = [ln.split() for ln in lines if ln.startswith("adam")][0]
    assert adam[1].startswith("cpu_adam_") and adam[2] == "prebuilt"
    assert lines[-1] == "cache []"  # no compile, nothing cached


def test_unknown_request_names_the_valid_ones():
    from opforge.registry import loaders

    exts = {e.name: e for cls in loaders().values() for e in cls.extensions()}
    with pytest.raises(ValueError, match="Known kinds: .*selftest"):
        aot.parse_request("selftest,nope", exts)
    assert [e.name for e in aot.parse_request("selftest_avx2", exts)] == ["selftest_avx2"]
    assert aot.parse_request("0", exts) == []


def test_build_without_torch_explains_build_isolation(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(Exception, match="--no-build-isolation"):
        aot.torch_or_explain("all")
