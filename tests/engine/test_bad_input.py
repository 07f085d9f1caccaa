"""Bad requests and broken environments: each gets an error that says what is wrong and how to fix it.

Covers: invalid arguments (ValueError), a missing compiler / CUDA (ToolchainError), an
unwritable cache root (CacheError), a compiler error (BuildError) and a binary that builds but
can't be loaded (ImportError, OSError).
"""

from __future__ import annotations

import os

import pytest
from conftest import pymod_source

import opforge
from opforge import compat
from opforge import settings as settings_mod
from opforge.engine import toolchain


def _entries(name_dir) -> list[str]:
    """Published entries under an extension's dir (dot-dirs are build/staging dirs)."""
    try:
        return sorted(n for n in os.listdir(name_dir) if not n.startswith("."))
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------- arguments


def test_missing_source_file(cache_dir, tmp_path):
    missing = tmp_path / "src" / "nowhere_to_be_found.cpp"
    with pytest.raises(ValueError) as exc:
        opforge.load("missing_src", [str(missing)])
    msg = str(exc.value)
    assert "nowhere_to_be_found.cpp" in msg
    assert "does not exist" in msg


def test_missing_second_source_is_named(cache_dir, make_pymod, tmp_path):
    good = make_pymod("two_src")
    missing = tmp_path / "src" / "helper_gone.cpp"
    with pytest.raises(ValueError, match="helper_gone.cpp"):
        opforge.load("two_src", [str(good), str(missing)])


@pytest.mark.parametrize("sources", [[], ()], ids=["list", "tuple"])
def test_empty_source_list(cache_dir, sources):
    with pytest.raises(ValueError) as exc:
        opforge.load("empty_src", sources)
    msg = str(exc.value)
    assert "empty" in msg
    assert "empty_src" in msg


def test_load_inline_empty_sources(cache_dir):
    with pytest.raises(ValueError, match="empty"):
        opforge.load_inline("inline_empty", cpp_sources=[])


@pytest.mark.parametrize("bad", ["my-ext", "1abc", "", "has space", "dotted.name"])
def test_bad_name(cache_dir, make_pymod, bad):
    src = make_pymod("good_name")  # the sources are fine: only the name is wrong
    with pytest.raises(ValueError) as exc:
        opforge.load(bad, [str(src)])
    msg = str(exc.value)
    assert repr(bad) in msg
    assert "not a valid identifier" in msg


@pytest.mark.parametrize("bad", ["my-ext", "1abc", ""])
def test_bad_name_load_inline(cache_dir, bad):
    with pytest.raises(ValueError, match="not a valid identifier"):
        opforge.load_inline(bad, cpp_sources="int f() { return 1; }", no_implicit_headers=True)


def test_python_module_and_standalone_together(cache_dir, make_pymod):
    src = make_pymod("both_kinds")
    with pytest.raises(ValueError) as exc:
        opforge.load("both_kinds", [str(src)], is_python_module=True, is_standalone=True)
    msg = str(exc.value)
    assert "is_python_module" in msg and "is_standalone" in msg


# --------------------------------------------------------------------------- toolchain


def test_cxx_points_at_nonexistent_compiler(cache_dir, make_pymod, monkeypatch, tmp_path):
    bogus = str(tmp_path / "no" / "such" / "g++")
    monkeypatch.setenv("CXX", bogus)
    src = make_pymod("no_cxx_env")
    with pytest.raises(opforge.ToolchainError) as exc:
        opforge.load("no_cxx_env", [str(src)])
    msg = str(exc.value)
    assert bogus in msg  # names the compiler it looked for
    assert "CXX" in msg  # and the variable to fix


def test_no_cxx_on_path(cache_dir, make_pymod, monkeypatch, tmp_path):
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(empty_bin))
    assert toolchain.find_cxx(settings_mod.current()) is None
    src = make_pymod("no_cxx_path")
    with pytest.raises(opforge.ToolchainError) as exc:
        opforge.load("no_cxx_path", [str(src)])
    msg = str(exc.value)
    assert "'c++'" in msg  # the compiler it looked for
    assert "CXX=" in msg  # how to point it at one
    assert _entries(cache_dir / "no_cxx_path") == []


def test_cuda_sources_with_cpu_torch(cache_dir, tmp_path):
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("this torch has CUDA/HIP")
    kernel = tmp_path / "kern.cu"
    kernel.write_text("__global__ void k() {}\n")
    with pytest.raises(opforge.ToolchainError) as exc:
        opforge.load("cpu_torch_cu", [str(kernel)])
    assert "CUDA" in str(exc.value)
    assert "cpu_torch_cu" in str(exc.value)


def test_with_cuda_true_with_cpu_torch(cache_dir, make_pymod):
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("this torch has CUDA/HIP")
    src = make_pymod("cpu_torch_flag")
    with pytest.raises(opforge.ToolchainError, match="CUDA"):
        opforge.load("cpu_torch_flag", [str(src)], with_cuda=True)


def test_nvcc_with_nonexistent_cuda_home(tmp_path):
    home = str(tmp_path / "no-cuda-here")
    s = settings_mod.current({"CUDA_HOME": home, "PATH": str(tmp_path)})
    assert s.cuda_home == home
    with pytest.raises(opforge.ToolchainError) as exc:
        toolchain.nvcc(s)
    msg = str(exc.value)
    assert "CUDA_HOME" in msg
    assert home in msg
    assert toolchain.find_nvcc(s) is None


def _fake_nvcc(tmp_path, release: str) -> str:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir(exist_ok=True)
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.89'\n"
                    f"echo 'Build cuda_{release}.r{release}/compiler.1_0'\n")
    nvcc.chmod(0o755)
    return str(nvcc)


@pytest.mark.parametrize("release, fails", [("11.8", True), ("12.4", False)])
def test_nvcc_of_another_cuda_major_than_torch_is_refused(cache_dir, tmp_path, monkeypatch, capfd, release, fails):
    """As torch's JIT: another CUDA major than torch's is an error (before any compile), another
    minor a notice. torch here is a CPU build: its facts are made to say CUDA 12.8."""
    import dataclasses

    facts = dataclasses.replace(compat.torch_facts(), cuda="12.8", hip=None)
    monkeypatch.setattr(compat, "torch_facts", lambda: facts)
    monkeypatch.setenv("PYTORCH_NVCC", _fake_nvcc(tmp_path, release))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    kernel = tmp_path / "kern.cu"
    kernel.write_text("__global__ void k() {}\n")
    if fails:
        with pytest.raises(opforge.ToolchainError, match=r"is CUDA 11\.8, but torch was built with CUDA 12\.8.*"
                                                         r"CUDA_HOME=/usr/local/cuda-12\.8"):
            opforge.load("cuda_major_mismatch", [str(kernel)], is_python_module=False)
    else:  # past the check, with a notice; then this CPU torch has no CUDA_HOME for the flags
        with pytest.raises(opforge.OpforgeError) as exc:
            opforge.load("cuda_minor_mismatch", [str(kernel)], is_python_module=False)
        assert "but torch was built with" not in str(exc.value)
        assert isinstance(exc.value, opforge.ToolchainError) and "CUDA_HOME" in str(exc.value)
        assert "nvcc is CUDA 12.4, torch was built with CUDA 12.8: a minor-version difference" in capfd.readouterr().err
    assert _entries(cache_dir / "cuda_major_mismatch") == [] and _entries(cache_dir / "cuda_minor_mismatch") == []


# --------------------------------------------------------------------------- cache root


def test_cache_root_under_a_regular_file(monkeypatch, make_pymod, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(blocker / "cache"))
    src = make_pymod("root_blocked")
    with pytest.raises(opforge.CacheError) as exc:
        opforge.load("root_blocked", [str(src)])
    assert "OPFORGE_CACHE_DIR" in str(exc.value)
    assert blocker.read_text() == "not a directory\n"


def test_cache_root_is_a_regular_file(monkeypatch, make_pymod, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(blocker))
    src = make_pymod("root_is_file")
    with pytest.raises(opforge.CacheError, match="OPFORGE_CACHE_DIR"):
        opforge.load("root_is_file", [str(src)])


def test_cache_root_under_a_regular_file_load_inline(monkeypatch, tmp_path):
    # load_inline creates the cache dirs before anything else, so it reports the CacheError.
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(opforge.CacheError) as exc:
        opforge.load_inline("inline_blocked", cpp_sources="int f() { return 1; }", no_implicit_headers=True)
    assert "OPFORGE_CACHE_DIR" in str(exc.value)
    assert str(blocker / "cache") in str(exc.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write a 0500 directory")
def test_cache_root_read_only_dir(monkeypatch, make_pymod, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        for root in (ro, ro / "cache"):  # the root itself, and a root to be created inside
            monkeypatch.setenv("OPFORGE_CACHE_DIR", str(root))
            src = make_pymod("root_ro")
            with pytest.raises(opforge.CacheError, match="OPFORGE_CACHE_DIR"):
                opforge.load("root_ro", [str(src)])
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------- compiler error


def test_compiler_error(cache_dir, tmp_path):
    name = "broken_ext"
    src = tmp_path / "src" / f"{name}.cpp"
    src.parent.mkdir()
    src.write_text(pymod_source(name, "opforge_undeclared_identifier + 1"))
    with pytest.raises(opforge.BuildError) as exc:
        opforge.load(name, [str(src)])
    err = exc.value
    msg = str(err)
    # The first compiler error, with the offending identifier and the file.
    assert "error" in msg
    assert "opforge_undeclared_identifier" in msg
    assert f"{name}.cpp" in msg
    # The full log exists, and the message says where.
    assert err.log_path and os.path.isfile(err.log_path)
    assert err.log_path in msg
    with open(err.log_path, encoding="utf-8") as f:
        log = f.read()
    assert "opforge_undeclared_identifier" in log
    # Nothing published: only dot-dirs (build dir, lock) under the extension's dir.
    assert _entries(cache_dir / name) == []

    # Fix the source: the next load builds and works.
    src.write_text(pymod_source(name, 7))
    mod = opforge.load(name, [str(src)])
    assert mod.value() == 7
    assert len(_entries(cache_dir / name)) == 1


# --------------------------------------------------------------------------- a binary that builds but can't be loaded


def test_module_name_differs_from_load_name(cache_dir, make_pymod):
    """The source defines PyInit_other_name, so a module loaded as another name has no init function."""
    src = make_pymod("other_name", filename="misnamed_ext.cpp")
    for _ in range(2):  # cold (built, then imported) and warm (imported from the cache) alike
        with pytest.raises(ImportError, match=r"PyInit_misnamed_ext"):
            opforge.load("misnamed_ext", [str(src)])
    # It built: the binary is cached (a fixed source is a new key), and imported on every load.
    assert len(_entries(cache_dir / "misnamed_ext")) == 1


def test_undefined_symbol_in_a_plain_library(cache_dir, tmp_path):
    src = tmp_path / "src" / "undefined_sym_lib.cpp"
    src.parent.mkdir()
    src.write_text("int opforge_helper_defined_nowhere();\n"
                   'extern "C" int uses_helper() { return opforge_helper_defined_nowhere() + 1; }\n')
    with pytest.raises(OSError, match="Could not load this library") as exc:
        opforge.load("undefined_sym_lib", [str(src)], is_python_module=False)
    assert "undefined symbol" in str(exc.value.__cause__)
    assert "opforge_helper_defined_nowhere" in str(exc.value.__cause__)  # mangled: _Z30opforge_helper_...
