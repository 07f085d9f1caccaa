"""opforge doctor: each check with inputs built by hand, then one real run end to end."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from opforge import prebuilt, settings
from opforge.cli import doctor_cmd
from opforge.cli.doctor_cmd import FAIL, OK, WARN
from opforge.cli.main import main
from opforge.compat import TorchFacts
from opforge.extension import NEEDS_BUILD, CppExtension, Status
from opforge.platform import Gpu, Platform, ToolInfo

GCC = ToolInfo("/usr/bin/g++", "g++ (Debian 12.2.0-14) 12.2.0")
NINJA = ToolInfo("/usr/bin/ninja", "1.11.1")
H100 = Gpu(0, "NVIDIA H100", "nvidia", (9, 0), "sm_90", 80 << 30)


def env(**values) -> settings.Settings:
    return settings.current({"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home", **values})


# -- compiler and ninja ---------------------------------------------------------------------


def test_no_compiler_fails_with_the_fix():
    c = doctor_cmd.check_cxx(Platform(cxx=None), env())
    assert c.status == FAIL and "g++" in c.fix and "CXX" in c.fix
    c = doctor_cmd.check_cxx(Platform(cxx=None), env(CXX="/nonexistent/c++"))
    assert c.status == FAIL and "/nonexistent/c++" in c.detail and "CXX" in c.fix


def test_compiler_found_shows_its_version():
    c = doctor_cmd.check_cxx(Platform(cxx=GCC), env())
    assert c.status == OK and "12.2.0" in c.detail and c.fix == ""
    assert doctor_cmd.check_cxx(Platform(cxx=ToolInfo("/bin/cc", "")), env()).status == WARN


def test_ninja_missing_fails():
    c = doctor_cmd.check_ninja(Platform(ninja=None))
    assert c.status == FAIL and c.fix == "`pip install ninja`"
    assert doctor_cmd.check_ninja(Platform(ninja=NINJA)).status == OK


# -- CUDA -----------------------------------------------------------------------------------


def test_cuda_checks_do_not_apply_to_a_cpu_torch():
    (c,) = doctor_cmd.check_cuda(Platform(torch=TorchFacts(cuda=None), nvcc=None), env())
    assert c.status == OK and "without CUDA" in c.detail


def test_nvcc_and_torch_cuda_major_mismatch_fails():
    p = Platform(torch=TorchFacts(cuda="12.4"), nvcc=ToolInfo("/x/nvcc", "Build cuda_13.0.r13.0/compiler.1_0"))
    (c,) = doctor_cmd.check_cuda(p, env())
    assert c.status == FAIL
    assert "CUDA 13.0" in c.detail and "12.4" in c.detail and "/x/nvcc" in c.detail
    assert "CUDA_HOME" in c.fix and "12.x" in c.fix


def test_nvcc_matching_torch_is_ok():
    p = Platform(torch=TorchFacts(cuda="12.4"), nvcc=ToolInfo("/x/nvcc", "Build cuda_12.6.r12.6/compiler.1_0"))
    (c,) = doctor_cmd.check_cuda(p, env())
    assert c.status == OK and "12.6" in c.detail


def test_missing_nvcc_fails_only_when_a_gpu_is_visible():
    (c,) = doctor_cmd.check_cuda(Platform(torch=TorchFacts(cuda="12.4"), nvcc=None, gpus=(H100,)), env(CUDA_HOME="/opt/cuda"))
    assert c.status == FAIL and "CUDA_HOME=/opt/cuda" in c.detail and "CUDA_HOME" in c.fix
    (c,) = doctor_cmd.check_cuda(Platform(torch=TorchFacts(cuda="12.4"), nvcc=None), env())
    assert c.status == WARN and "no NVIDIA GPU" in c.detail


# -- the cache dir --------------------------------------------------------------------------


def test_cache_dir_is_created_private(tmp_path):
    root = tmp_path / "a" / "cache"
    c = doctor_cmd.check_cache(env(OPFORGE_CACHE_DIR=str(root)))
    assert c.status == OK, c
    assert root.is_dir() and (root.stat().st_mode & 0o777) == 0o700
    assert not [p for p in root.iterdir()]  # the write probe is gone


def test_insecure_cache_dir_fails(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o777)
    c = doctor_cmd.check_cache(env(OPFORGE_CACHE_DIR=str(root)))
    assert c.status == FAIL and "writable by group or others" in c.detail
    assert f"chmod 700 {root}" in c.fix and "OPFORGE_CACHE_DIR" in c.fix


def test_insecure_kernel_dir_inside_the_cache_fails(tmp_path):
    root = tmp_path / "cache"
    (root / "selftest_avx2").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / "selftest_avx2").chmod(0o777)
    c = doctor_cmd.check_cache(env(OPFORGE_CACHE_DIR=str(root)))
    assert c.status == FAIL and "selftest_avx2" in c.detail and "chmod 700" in c.fix


def test_unwritable_cache_dir_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")  # even root can't create a directory under a file
    c = doctor_cmd.check_cache(env(OPFORGE_CACHE_DIR=str(blocker / "cache")))
    assert c.status == FAIL and "cannot create cache directory" in c.detail
    assert "OPFORGE_CACHE_DIR" in c.fix


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write in a 0500 directory")
def test_read_only_cache_dir_fails(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o500)
    try:
        c = doctor_cmd.check_cache(env(OPFORGE_CACHE_DIR=str(root)))
    finally:
        root.chmod(0o700)
    assert c.status == FAIL and "OPFORGE_CACHE_DIR" in c.fix


def test_symlinked_cache_root_is_checked_through_the_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    c = doctor_cmd.check_cache(env(OPFORGE_CACHE_DIR=str(link)))
    assert c.status == OK and f"-> {real}" in c.detail


# -- prebuilt kernels -----------------------------------------------------------------------


def fake_prebuilt(directory, torch="2.12.0+cpu", stable_abi=None, corrupt=False, missing=False):
    binary = directory / "selftest_avx2.so"
    if not missing:
        binary.write_bytes(b"\x7fELF not really")
    digest = hashlib.sha256(b"\x7fELF not really").hexdigest()
    entry = {"file": binary.name, "sha256": "0" * 64 if corrupt else digest, "kind": "selftest", "backend": "cpp",
             "isa": "avx2"}
    if stable_abi:
        entry["stable_abi"] = stable_abi
    info = {"format": 1, "torch": torch, "torch_git": "", "cuda": None, "hip": None, "cxx11_abi": True,
            "machine": "x86_64", "extensions": {"selftest_avx2": entry}}
    (directory / "build_info.json").write_text(json.dumps(info))
    return prebuilt.read(str(directory))


def test_stale_prebuilt_warns_to_reinstall(tmp_path):
    pb = fake_prebuilt(tmp_path, torch="2.12.0+cpu")
    (c,) = doctor_cmd.check_prebuilt(pb, Platform(torch=TorchFacts("2.13.0+cpu")))
    assert c.status == WARN and c.name == "prebuilt selftest_avx2"
    assert "torch upgraded since the prebuilt kernels were built" in c.detail and "2.12.0+cpu" in c.detail
    assert "OPFORGE_BUILD=selftest" in c.fix


def test_stable_abi_prebuilt_survives_a_torch_upgrade(tmp_path):
    pb = fake_prebuilt(tmp_path, torch="2.12.0+cpu", stable_abi="2.10")
    (c,) = doctor_cmd.check_prebuilt(pb, Platform(torch=TorchFacts("2.13.0+cpu")))
    assert c.status == OK and "stable ABI" in c.detail


def test_corrupt_or_missing_prebuilt_fails(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (c,) = doctor_cmd.check_prebuilt(fake_prebuilt(tmp_path / "a", corrupt=True), Platform(torch=TorchFacts("2.12.0+cpu")))
    assert c.status == FAIL and "sha256" in c.detail and "OPFORGE_BUILD=selftest" in c.fix
    (c,) = doctor_cmd.check_prebuilt(fake_prebuilt(tmp_path / "b", missing=True), Platform(torch=TorchFacts("2.12.0+cpu")))
    assert c.status == FAIL and "missing" in c.detail


def test_no_prebuilt_kernels_is_fine(tmp_path):
    (c,) = doctor_cmd.check_prebuilt(prebuilt.read(str(tmp_path)), Platform())
    assert c.status == OK and "built just in time" in c.detail


# -- the trial build and the whole run ------------------------------------------------------


def test_trial_build_is_skipped_without_a_compiler(tmp_path):
    c = doctor_cmd.check_trial_build(Platform(cxx=None, ninja=NINJA), env(OPFORGE_CACHE_DIR=str(tmp_path)))
    assert c.status == WARN and "skipped" in c.detail and "no C++ compiler" in c.detail


def test_trial_build_failure_shows_the_compiler_error(cache_dir, tmp_path, monkeypatch):
    src = tmp_path / "broken.cpp"
    src.write_text("int broken() { return this_symbol_does_not_exist; }\n")

    class Broken(CppExtension):
        name, kind, sources = "doctor_broken_trial", "doctor_test", (str(src),)

    class Cand:
        extension = Broken()
        status = Status(NEEDS_BUILD)

    monkeypatch.setattr(doctor_cmd, "trial_candidate", lambda platform, prebuilt=None: (Cand(), ""))
    c = doctor_cmd.check_trial_build(Platform(cxx=GCC, ninja=NINJA), settings.current())
    assert c.status == FAIL and "does not build" in c.detail
    assert "this_symbol_does_not_exist" in c.detail and "log" in c.fix


def test_run_checks_fails_when_something_blocks_a_build(tmp_path):
    s = env(OPFORGE_CACHE_DIR=str(tmp_path / "cache"))
    checks = doctor_cmd.run_checks(Platform(cxx=None, ninja=None), s, prebuilt.read(str(tmp_path)), build=True)
    by_name = {c.name: c for c in checks}
    assert by_name["c++ compiler"].status == FAIL and by_name["ninja"].status == FAIL
    assert by_name["trial build"].status == WARN
    data = doctor_cmd.report(checks)
    assert data["schema"] == "opforge.doctor/1" and data["ok"] is False
    ok = doctor_cmd.run_checks(Platform(cxx=GCC, ninja=NINJA), s, prebuilt.read(str(tmp_path)), build=False)
    assert doctor_cmd.report(ok)["ok"] is True and "trial build" not in {c.name for c in ok}


def test_doctor_end_to_end(cache_dir, capsys):
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "opforge.doctor/1" and data["ok"] is True
    for c in data["checks"]:
        assert set(c) == {"name", "status", "detail", "fix"}
        assert c["status"] in (OK, WARN)
        assert c["status"] != OK or c["fix"] == ""
    checks = {c["name"]: c for c in data["checks"]}
    assert {"c++ compiler", "ninja", "cache dir", "trial build"} <= set(checks)
    trial = checks["trial build"]
    assert trial["status"] == OK and "axpy matches torch" in trial["detail"], trial
    # The trial build warmed the cache: a second run finds it there.
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "found in the JIT cache" in out and "\x1b[" not in out


def test_doctor_without_a_compiler_exits_1(cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^FAIL\s+c\+\+ compiler\s+CXX='/nonexistent/c\+\+'", out, re.MULTILINE), out
    assert "fix: point CXX at a C++ compiler" in out and "1 failed" in out
    assert "\x1b[" not in out
