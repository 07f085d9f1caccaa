"""load()/load_inline(): the kinds of extension, the warm path, incremental builds."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap

import pytest
import torch
from conftest import pymod_source, run_python

import opforge

LEAN_OP = textwrap.dedent(
    """
    #include <ATen/core/Tensor.h>
    #include <ATen/ops/mul.h>
    #include <torch/library.h>

    static at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

    TORCH_LIBRARY(opforge_test_lean, m) { m.def("twice(Tensor x) -> Tensor"); }
    TORCH_LIBRARY_IMPL(opforge_test_lean, CPU, m) { m.impl("twice", &twice); }
    """
)


def entries(root, name):
    d = root / name
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


def test_python_module_builds_caches_and_reloads(cache_dir, make_pymod):
    src = make_pymod("basic_mod", 5)
    mod = opforge.load("basic_mod", [str(src)])
    assert mod.value() == 5
    assert opforge.load("basic_mod", [str(src)]) is mod  # second load in a process: same module
    (entry,) = entries(cache_dir, "basic_mod")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["kind"] == "python_module"
    assert manifest["deps"][0]["path"] == "basic_mod.cpp" and manifest["root"] == str(src.parent)  # relocatable
    assert (entry / "build.log").exists()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache_dir / "basic_mod").stat().st_mode) == 0o700


def test_warm_load_starts_no_process_and_no_build_machinery(cache_dir, make_pymod):
    src = make_pymod("warm_mod", 11)
    opforge.load("warm_mod", [str(src)])
    code = textwrap.dedent(
        f"""
        import os, subprocess, sys
        def forbidden(*a, **k):
            raise AssertionError("warm path started a process")
        subprocess.Popen = subprocess.run = os.fork = os.posix_spawn = os.execv = forbidden
        import opforge
        assert opforge.load("warm_mod", [{str(src)!r}]).value() == 11
        heavy = [m for m in ("torch.utils.cpp_extension", "filelock", "ninja", "rich") if m in sys.modules]
        assert not heavy, heavy
        print("ok")
        """
    )
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_incremental_rebuild_recompiles_only_the_changed_source(cache_dir, tmp_path, counting_cxx):
    srcdir = tmp_path / "inc"
    srcdir.mkdir()
    (srcdir / "a.cpp").write_text("int part_a() { return 1; }\n")
    (srcdir / "b.cpp").write_text("int part_b() { return 10; }\n")
    main = pymod_source("inc_mod", 0, extra="int part_a(); int part_b();").replace(
        "PyLong_FromLong(0)", "PyLong_FromLong(part_a() + part_b())"
    )
    (srcdir / "main.cpp").write_text(main)
    sources = [str(srcdir / n) for n in ("main.cpp", "a.cpp", "b.cpp")]
    code = f"import opforge; print(opforge.load('inc_mod', {sources!r}).value())"
    first = run_python(code)
    assert first.stdout.strip() == "11", first.stderr
    assert len(counting_cxx.compiles()) == 3

    counting_cxx.clear()
    (srcdir / "b.cpp").write_text("int part_b() { return 20; }\n")
    second = run_python(code)
    assert second.stdout.strip() == "21", second.stderr
    compiles = counting_cxx.compiles()
    assert len(compiles) == 1 and "b.cpp" in compiles[0]
    assert len(counting_cxx.links()) == 1


def test_edit_that_keeps_size_and_mtime_still_rebuilds(cache_dir, tmp_path):
    """ninja trusts mtimes; opforge also compares the sources' bytes."""
    src = tmp_path / "same.cpp"
    src.write_text(pymod_source("same_mod", 3))
    before = os.stat(src)
    code = f"import opforge; print(opforge.load('same_mod', [{str(src)!r}]).value())"
    assert run_python(code).stdout.strip() == "3"
    src.write_text(pymod_source("same_mod", 4))
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(src).st_size == before.st_size
    out = run_python(code)
    assert out.stdout.strip() == "4", out.stderr


def test_torch_library_op_with_lean_headers(cache_dir, tmp_path):
    src = tmp_path / "lean.cpp"
    src.write_text(LEAN_OP)
    path = opforge.load("lean_op", [str(src)], is_python_module=False)
    assert isinstance(path, str) and path.endswith("lean_op.so")
    x = torch.randn(7)
    torch.testing.assert_close(torch.ops.opforge_test_lean.twice(x), x * 2)


def test_standalone_executable(cache_dir, tmp_path):
    src = tmp_path / "tool.cpp"
    src.write_text('#include <cstdio>\nint main() { std::puts("standalone ok"); return 0; }\n')
    exe = opforge.load("tool_exe", [str(src)], is_python_module=False, is_standalone=True)
    assert os.access(exe, os.X_OK)
    assert subprocess.run([exe], capture_output=True, text=True).stdout.strip() == "standalone ok"


def test_load_inline_without_implicit_headers(cache_dir):
    mod = opforge.load_inline("inline_plain", pymod_source("inline_plain", 42), no_implicit_headers=True)
    assert mod.value() == 42
    # The same text again is a cache hit on the same content-addressed source file.
    assert opforge.load_inline("inline_plain", pymod_source("inline_plain", 42), no_implicit_headers=True) is mod


@pytest.fixture(scope="module")
def inline_pybind(shared_cache):
    """The classic torch/extension.h + generated pybind11 bindings, built once per session for the two
    tests that use it: load_inline(use_pch=True) with OPFORGE_PCH=0, as torch's use_pch, so the build
    makes the shared PCH first and uses it (test_shared_precompiled_torch_header). A source that includes
    torch/extension.h costs ~40 s plain and ~16 s with the PCH (GCC instantiates the header's templates
    in every such source); -O0, opforge's default level, is the cheapest."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
    mp.setenv("OPFORGE_PCH", "0")
    try:
        cpp = "torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double a) { return x + a * y; }"
        return opforge.load_inline("inline_pybind", cpp, functions=["scale_add"], use_pch=True, extra_cflags=["-O0"])
    finally:
        mp.undo()


def test_load_inline_pybind_functions_like_torch(inline_pybind):
    """load_inline's generated bindings call the function, and torch's errors come through
    wrap_pybind_function (the build: the ``inline_pybind`` fixture)."""
    x, y = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(inline_pybind.scale_add(x, y, 0.5), x + 0.5 * y)
    with pytest.raises(RuntimeError):
        inline_pybind.scale_add(torch.randn(2), torch.randn(3), 1.0)


def test_build_directory_is_the_ninja_workspace(cache_dir, make_pymod, tmp_path):
    work = tmp_path / "work"
    mod = opforge.load("bdir_mod", [str(make_pymod("bdir_mod", 8))], build_directory=str(work))
    assert mod.value() == 8
    assert (work / "build.ninja").exists() and (work / "bdir_mod.so").exists()
    assert entries(cache_dir, "bdir_mod")  # and it is published to the cache too


def test_sources_sharing_a_basename(cache_dir, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.cpp").write_text("int from_a() { return 100; }\n")
    (tmp_path / "b" / "x.cpp").write_text("int from_b() { return 20; }\n")
    main = pymod_source("twin_mod", 0, extra="int from_a(); int from_b();").replace(
        "PyLong_FromLong(0)", "PyLong_FromLong(from_a() + from_b())"
    )
    (tmp_path / "main.cpp").write_text(main)
    srcs = [str(tmp_path / "main.cpp"), str(tmp_path / "a" / "x.cpp"), str(tmp_path / "b" / "x.cpp")]
    assert opforge.load("twin_mod", srcs).value() == 120


def test_cached_build_loads_where_no_compiler_is_installed(cache_dir, make_pymod):
    src = make_pymod("nocc_mod", 9)
    opforge.load("nocc_mod", [str(src)])
    code = f"import opforge; print(opforge.load('nocc_mod', [{str(src)!r}]).value())"
    out = run_python(code, env={"CXX": "/nonexistent/c++", "OPFORGE_CACHE_DIR": str(cache_dir)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "9"


def test_verbose_reports_the_build(cache_dir, make_pymod):
    src = make_pymod("verbose_mod", 1)
    code = f"import opforge; opforge.load('verbose_mod', [{str(src)!r}], verbose=True)"
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert out.returncode == 0, out.stderr
    assert "building verbose_mod (1 source)" in out.stderr
    assert "built verbose_mod in" in out.stderr
    quiet = run_python(code.replace(", verbose=True", ""), env={"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert quiet.stderr == ""  # warm, not a terminal, not verbose: silent


def test_max_jobs_is_handed_to_ninja(cache_dir, make_pymod, monkeypatch):
    import subprocess as sp

    seen = []
    real = sp.Popen

    def spy(cmd, *a, **k):
        seen.append(list(cmd))
        return real(cmd, *a, **k)

    monkeypatch.setattr(sp, "Popen", spy)
    monkeypatch.setenv("MAX_JOBS", "1")
    assert opforge.load("jobs_mod", [str(make_pymod("jobs_mod", 2))]).value() == 2
    ninja_runs = [c for c in seen if os.path.basename(c[0]) == "ninja" and "-t" not in c]
    assert ninja_runs and ninja_runs[0][-2:] == ["-j", "1"]


def test_shared_precompiled_torch_header(inline_pybind, shared_cache, monkeypatch, tmp_path):
    """The PCH with GCC (the suite turns it off, this test on): load_inline(use_pch=True), as torch's
    use_pch, makes it before its build (OPFORGE_PCH=0 notwithstanding: the ``inline_pybind`` fixture);
    builds with the same flags use it from then on, under the default (auto), in each source that
    includes torch/extension.h, and not in the others. The PCH extension's one torch source reaches
    torch/extension.h after a comment, through a local header that defines a Windows-only macro first,
    as DeepSpeed's cpu_adam.cpp does (cpu_adam.h: NOMINMAX): the same meaning, so it qualifies (the other
    preambles, one by one: test_pch.py). When the PCH is made in the background, and the cap:
    test_pch_lifecycle.py."""
    (gch,) = (shared_cache / ".pch").glob("*.h.gch")
    assert gch.stat().st_size > 0
    header = str(gch)[: -len(".gch")]
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
    monkeypatch.setenv("OPFORGE_PCH", "auto")
    (tmp_path / "local.h").write_text("#pragma once\n#define NOMINMAX\n#include <stdio.h>\n#include <torch/extension.h>\n")
    (tmp_path / "pch_ext.cpp").write_text(
        '// a comment first, as real files have\n#include "local.h"\nint offset();\n'
        "torch::Tensor f(torch::Tensor x) { return x * 3 + offset(); }\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }\n')
    (tmp_path / "no_torch.cpp").write_text("int offset() { return 1; }\n")  # no torch/extension.h: no PCH
    mod = opforge.load("pch_ext", [str(tmp_path / "pch_ext.cpp"), str(tmp_path / "no_torch.cpp")], extra_cflags=["-O0"])
    x = torch.randn(6)
    torch.testing.assert_close(mod.f(x), x * 3 + 1)
    assert list((shared_cache / ".pch").glob("*.h.gch")) == [gch]  # the same one
    for name, sources in (("inline_pybind", {"main.cpp": True}), ("pch_ext", {"pch_ext.cpp": True, "no_torch.cpp": False})):
        (build,) = [p for p in (shared_cache / name).glob(".build-*") if p.is_dir()]
        compiles = [ln for ln in (build / "build.log").read_text().splitlines() if " -c " in ln]
        assert len(compiles) == len(sources), compiles
        for src, uses in sources.items():
            (line,) = [ln for ln in compiles if f"/{src} " in ln]
            assert (f"-include {header} " in line) is uses, line
        manifest = next(p for p in (shared_cache / name).iterdir() if not p.name.startswith("."))
        assert ".pch" not in (manifest / "manifest.json").read_text()  # an accelerator, not a dependency


@pytest.mark.parametrize("fn", ["load", "load_inline"])
def test_signature_is_torchs_in_torchs_order(fn):
    """A drop-in: torch's parameters, at torch's positions (a positional call binds alike), with
    the same defaults; opforge may only add parameters after them."""
    import inspect

    from torch.utils import cpp_extension

    theirs = inspect.signature(getattr(cpp_extension, fn)).parameters
    ours = inspect.signature(getattr(opforge, fn)).parameters
    assert list(ours)[:len(theirs)] == list(theirs), f"torch {torch.__version__}: {list(theirs)}"
    for name, p in theirs.items():
        assert ours[name].default == p.default, name


def test_sycl_arguments_say_they_are_not_built(cache_dir):
    with pytest.raises(ValueError, match="not SYCL"):
        opforge.load("s", ["a.cpp"], extra_sycl_cflags=["-O2"])
    with pytest.raises(ValueError, match="not SYCL"):
        opforge.load_inline("s", "int x;", sycl_sources="kernel")


# -- the ninja binary: the PyPI package's, or one on PATH with no `ninja` module importable ---------

NO_NINJA_MODULE = "import sys; sys.modules['ninja'] = None  # `import ninja` fails, as with an OS ninja only\n"


def _path_ninja_env(tmp_path, cache_dir):
    """PATH led by a dir holding only a `ninja` binary (the PyPI package's, linked there), as an
    OS package or conda would put one."""
    import ninja as ninja_pkg

    bindir = tmp_path / "osbin"
    bindir.mkdir()
    (bindir / "ninja").symlink_to(os.path.join(ninja_pkg.BIN_DIR, "ninja"))
    return {"OPFORGE_CACHE_DIR": str(cache_dir), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("layout", ["pypi_package", "path_only"])
def test_builds_with_either_ninja_layout(cache_dir, make_pymod, tmp_path, layout):
    src = make_pymod("ninja_layout_mod", 21)
    env = _path_ninja_env(tmp_path, cache_dir) if layout == "path_only" else {"OPFORGE_CACHE_DIR": str(cache_dir)}
    code = (NO_NINJA_MODULE if layout == "path_only" else "") + textwrap.dedent(f"""
        from opforge.engine import toolchain
        import opforge
        print(toolchain.ninja())
        print(opforge.load("ninja_layout_mod", [{str(src)!r}]).value())
    """)
    out = run_python(code, env=env)
    assert out.returncode == 0, out.stderr
    ninja_path, value = out.stdout.split()
    assert value == "21"
    assert (ninja_path == str(tmp_path / "osbin" / "ninja")) == (layout == "path_only")


def test_doctor_passes_with_a_path_ninja_and_no_ninja_module(cache_dir, tmp_path):
    code = NO_NINJA_MODULE + "from opforge.cli.main import main\nraise SystemExit(main(['doctor', '--json']))\n"
    out = run_python(code, env=_path_ninja_env(tmp_path, cache_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["ninja"]["status"] == "ok" and checks["trial build"]["status"] == "ok", checks


def test_no_ninja_anywhere_is_a_toolchain_error_naming_the_fix(cache_dir, make_pymod, tmp_path):
    src = make_pymod("no_ninja_mod", 1)
    import shutil

    bindir = tmp_path / "bin"  # a compiler, and no ninja
    bindir.mkdir()
    gxx = os.path.realpath(shutil.which("g++"))
    (bindir / "g++").symlink_to(gxx)
    code = NO_NINJA_MODULE + textwrap.dedent(f"""
        import opforge
        try:
            opforge.load("no_ninja_mod", [{str(src)!r}])
        except opforge.ToolchainError as exc:
            print("ToolchainError:", exc)
    """)
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(cache_dir), "PATH": str(bindir), "CXX": gxx})
    assert out.returncode == 0, out.stderr
    assert "ToolchainError: ninja is required" in out.stdout and "pip install ninja" in out.stdout


# -- a second load() in one process after an edit: the new build, as torch's load() gives -----------

PYBIND_MOD = '#include <pybind11/pybind11.h>\nint v() {{ return {v}; }}\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("v", &v); }}\n'
STABLE_LIB = """#include <torch/csrc/stable/library.h>
#include <cstdint>
int64_t version_() {{ return {v}; }}
{define}
STABLE_TORCH_LIBRARY_IMPL({ns}, CompositeExplicitAutograd, m) {{ m.impl("version", TORCH_BOX(&version_)); }}
"""


def test_edited_pybind11_module_reloads_as_the_new_build(cache_dir, tmp_path):
    # pybind11 >= 3 hands back the module it made for a spec name: importing the new binary
    # under the old name returned the old module (m2.v() == 1, m1 is m2).
    src = tmp_path / "edit_ext.cpp"
    src.write_text(PYBIND_MOD.format(v=1))
    m1 = opforge.load("edit_ext", [str(src)])
    src.write_text(PYBIND_MOD.format(v=2))
    m2 = opforge.load("edit_ext", [str(src)])
    assert (m1.v(), m2.v()) == (1, 2) and m1 is not m2
    assert m1.__name__ == "edit_ext" and m2.__name__ == "edit_ext_v1.edit_ext"
    src.write_text(PYBIND_MOD.format(v=1))
    assert opforge.load("edit_ext", [str(src)]) is m1  # the first build again: the module made from it


def test_load_inline_with_other_source_text_gives_the_new_module(cache_dir):
    make = lambda v: opforge.load_inline("inline_edit", PYBIND_MOD.format(v=v), no_implicit_headers=True)  # noqa: E731
    first, second = make(1), make(2)
    assert (first.v(), second.v()) == (1, 2)
    assert make(2) is second


def test_rebuilt_library_that_defines_ops_is_refused_not_loaded(cache_dir, tmp_path):
    # Loading it would abort the process: the dispatcher throws from a static initialiser
    # ("Only a single TORCH_LIBRARY can be used to register the namespace").
    src = tmp_path / "edit_lib.cpp"
    define = 'STABLE_TORCH_LIBRARY(opforge_test_edit_lib, m) { m.def("version() -> int"); }'
    src.write_text(STABLE_LIB.format(v=1, define=define, ns="opforge_test_edit_lib"))
    first = opforge.load("edit_lib", [str(src)], is_python_module=False)
    assert torch.ops.opforge_test_edit_lib.version() == 1
    src.write_text(STABLE_LIB.format(v=2, define=define, ns="opforge_test_edit_lib"))
    with pytest.raises(opforge.OpforgeError, match=r"defines operators \(TORCH_LIBRARY\).*Restart Python"):
        opforge.load("edit_lib", [str(src)], is_python_module=False)
    assert torch.ops.opforge_test_edit_lib.version() == 1
    assert len(entries(cache_dir, "edit_lib")) == 2 and first.startswith(str(cache_dir))  # both built and cached
    code = f"import opforge, torch\nopforge.load('edit_lib', [{str(src)!r}], is_python_module=False)\n" \
           "print(torch.ops.opforge_test_edit_lib.version())\n"
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert out.stdout.strip() == "2", out.stderr  # a new process loads the new build


def test_rebuilt_library_of_kernels_only_replaces_them(cache_dir, tmp_path):
    lib = torch.library.Library("opforge_test_impl_only", "DEF")  # noqa: F841 (keeps the definition alive)
    lib.define("version() -> int")
    src = tmp_path / "impl_lib.cpp"
    for v in (1, 2):
        src.write_text(STABLE_LIB.format(v=v, define="", ns="opforge_test_impl_only"))
        opforge.load("impl_lib", [str(src)], is_python_module=False)
        assert torch.ops.opforge_test_impl_only.version() == v
