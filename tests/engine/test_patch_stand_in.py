"""Under the patch, ``torch.utils.cpp_extension`` is a stand-in (issue 60, item 3): its import costs
opforge's, not setuptools', and torch's own module runs, once, in the same module object, when a name
only it has is touched. Each process here starts as a user's does with the variable alone: the startup
hook's line, then the script's imports (no ``import opforge``).

The stand-in's answers are compared with torch's own module: in new processes with torch alone, and here
(the CUDA variants, on this CPU torch, through the answers' own class beside torch's functions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from conftest import ROOT, pymod_source
from torch.utils import cpp_extension

import _opforge_startup
from opforge import settings
from opforge.patch import answers

SITE = [p for p in sys.path if p.endswith("site-packages")]


def user(code: str, patched: bool, env: dict | None = None) -> dict:
    """``code`` in a new process as a user runs it: with OPFORGE_PATCH_TORCH=1 and the startup hook's line
    (``patched``), or with torch alone; its last line of output, as JSON."""
    full = {k: v for k, v in os.environ.items() if k != "OPFORGE_PATCH_TORCH"}
    full["PYTHONPATH"] = os.pathsep.join([ROOT, *SITE])
    if patched:
        full["OPFORGE_PATCH_TORCH"] = "1"
    full.update(env or {})
    script = "import json, sys\n" + _opforge_startup.PTH_LINE + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-S", "-c", script], env=full, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


ANSWERS = """
from torch.utils import cpp_extension as c
got = {"CUDA_HOME": c.CUDA_HOME, "ROCM_HOME": c.ROCM_HOME, "include": c.include_paths(),
       "include_cpu_bare": c.include_paths("cpu", False), "lib": c.library_paths(), "ninja": c.is_ninja_available(),
       "build_dir": c._get_build_directory("stand_in_probe", False)}
try:
    c.verify_ninja_availability()
    got["verify"] = "ok"
except RuntimeError as exc:
    got["verify"] = str(exc)
got["stand_in"] = type(c).__name__
got["setuptools"] = "setuptools" in sys.modules
print(json.dumps(got))
"""


@pytest.mark.parametrize("case", ["default", "extensions_dir", "no_ninja"])
def test_the_answers_are_torchs(case, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    if case == "extensions_dir":
        env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "exts")
    if case == "no_ninja":
        env["PATH"] = "/nonexistent"
    theirs = user(ANSWERS, patched=False, env=env)
    ours = user(ANSWERS, patched=True, env=env)
    assert theirs.pop("stand_in") == "module" and theirs.pop("setuptools")
    assert ours.pop("stand_in") == "StandIn" and not ours.pop("setuptools")
    assert ours == theirs
    assert os.path.isdir(ours["build_dir"]) and ours["build_dir"].startswith(str(tmp_path))


@pytest.fixture
def cuda_like(monkeypatch, tmp_path):
    """torch's module functions (taken here, on this CPU torch) and opforge's answers, both as under a CUDA
    torch: torch's module constants set as its import would set them there."""
    fake = types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0", hip=None),
                                 cuda=types.SimpleNamespace(_is_compiled=lambda: True))
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)

    def ours(**env):
        for k in ("CUDA_HOME", "CUDA_PATH", "CUDNN_HOME", "CUDNN_PATH", "CUDA_INC_PATH"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return answers.Answers(fake, cpp_extension.__file__, settings.current(), lambda: True)

    return fake, home, ours


def test_cuda_home_is_found_as_torch_finds_it(cuda_like, monkeypatch, tmp_path):
    _, home, ours = cuda_like
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch's warning aside
    nvcc_dir = tmp_path / "linked" / "bin"
    nvcc_dir.mkdir(parents=True)
    (home / "bin").mkdir()
    (home / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (home / "bin" / "nvcc").chmod(0o755)
    (nvcc_dir / "nvcc").symlink_to(home / "bin" / "nvcc")  # torch takes nvcc's dir as found, not its target
    cases = [{"CUDA_HOME": str(home)}, {"CUDA_PATH": str(home)}, {"CUDA_HOME": "", "CUDA_PATH": str(home)},
             {"PATH": str(nvcc_dir)}, {"PATH": "/nonexistent"}]
    for env in cases:
        answer = ours(**env)
        assert answer.cuda_home() == cpp_extension._find_cuda_home(), env


@pytest.mark.parametrize("layout", ["lib64", "lib"])
def test_cuda_paths_are_torchs(layout, cuda_like, monkeypatch, tmp_path):
    _, home, ours = cuda_like
    (home / layout).mkdir()
    cudnn = str(tmp_path / "cudnn")
    for env in ({}, {"CUDA_INC_PATH": str(tmp_path / "inc")}, {"CUDNN_HOME": cudnn}, {"CUDNN_PATH": cudnn}):
        answer = ours(**env)
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home))  # as torch's import sets them under CUDA
        monkeypatch.setattr(cpp_extension, "CUDNN_HOME", env.get("CUDNN_HOME") or env.get("CUDNN_PATH"))
        for args in (("cuda",), ("cuda", False), ("cpu",)):
            assert answer.include_paths(str(home), *args) == cpp_extension.include_paths(*args), (env, args)
            assert answer.library_paths(str(home), *args) == cpp_extension.library_paths(*args), (env, args)
    with pytest.raises(OSError, match="CUDA_HOME environment variable is not set"):
        ours().include_paths(None, "cuda")


def test_a_module_from_a_library_is_imported_as_torch_does(cuda_like, tmp_path):
    from opforge.engine.jit import load

    src = tmp_path / "stand_lib.cpp"
    src.write_text(pymod_source("stand_lib", 17))
    built = load("stand_lib", [str(src)])
    _, _, ours = cuda_like
    where = os.path.dirname(built.__file__)
    mine, theirs = (f("stand_lib", where, True) for f in (ours().import_module_from_library,
                                                           cpp_extension._import_module_from_library))
    assert mine.value() == theirs.value() == 17


@pytest.mark.parametrize("xdg", [None, "/tmp/xdg-elsewhere"])
def test_the_cache_dir_without_torchs_appdirs_is_the_one_it_gives(xdg, monkeypatch):
    from torch import _appdirs

    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert answers.linux_cache_dir("torch_extensions", xdg) == _appdirs.user_cache_dir(appname="torch_extensions")


def test_a_torch_it_was_not_checked_against_gets_the_real_module():
    assert answers.offered(torch) == ""  # this CI's torch is one
    for version, hip in (("2.10.0", None), ("2.15.0", None), ("2.13.0", "6.2")):
        fake = types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(hip=hip))
        assert answers.offered(fake)


EVERY_NAME = """
import pickle
import torch.utils.cpp_extension as c
loaded = type(c).__name__
from torch.utils.cpp_extension import BuildExtension
first, versioner = id(BuildExtension), id(c.JIT_EXTENSION_VERSIONER)
names = {}
for name in NAMES:
    names[name] = type(getattr(c, name)).__name__
from torch.utils.cpp_extension import *  # noqa: F403
again = id(c.BuildExtension) == first and id(c.JIT_EXTENSION_VERSIONER) == versioner
import inspect
source = "class BuildExtension" in inspect.getsource(c.BuildExtension) and "def load(" in inspect.getsource(c)
same = pickle.loads(pickle.dumps(c.BuildExtension)) is c.BuildExtension
print(json.dumps({"loaded": loaded, "after": type(c).__name__, "names": names, "once": again, "source": source,
                  "pickled": same, "routed": hasattr(c.load, "__opforge_routes__"), "dir": "BuildExtension" in dir(c)}))
"""


def test_every_public_name_works_and_torchs_module_runs_once():
    real = sorted(n for n in cpp_extension.__all__ if n != "SyclExtension" or hasattr(cpp_extension, n))
    code = EVERY_NAME.replace("NAMES", repr(real + ["CUDA_HOME", "COMMON_NVCC_FLAGS", "_get_cuda_arch_flags"]))
    theirs = user(code, patched=False)
    ours = user(code, patched=True)
    assert ours["loaded"] == "StandIn" and ours["after"] == "module" == theirs["loaded"]
    assert ours["names"] == theirs["names"]
    assert ours["once"] and ours["source"] and ours["pickled"] and ours["dir"]
    assert ours["routed"] and not theirs["routed"]  # torch's code ran, and the patch routed its load again


def test_a_pickled_build_extension_loads_where_the_module_is_a_stand_in(tmp_path):
    import pickle

    blob = tmp_path / "be.pickle"
    blob.write_bytes(pickle.dumps(cpp_extension.BuildExtension))  # by reference: its module is looked up
    got = user(f"""
        import pickle
        import torch.utils.cpp_extension as c
        before = type(c).__name__
        cls = pickle.loads(open({str(blob)!r}, "rb").read())
        print(json.dumps([before, cls is c.BuildExtension, cls.__name__, type(c).__name__]))
    """, patched=True)
    assert got == ["StandIn", True, "BuildExtension", "module"]


def test_reload_runs_torchs_module_again():
    got = user("""
        import importlib
        import torch.utils.cpp_extension as c
        before = type(c).__name__
        again = importlib.reload(c)
        print(json.dumps([before, again is c, type(c).__name__, c.BuildExtension.__name__, c.load.__module__]))
    """, patched=True)
    assert got == ["StandIn", True, "module", "BuildExtension", "torch.utils.cpp_extension"]


def test_without_the_patch_nothing_changes():
    got = user("""
        import torch.utils.cpp_extension as c
        print(json.dumps([type(c).__name__, "setuptools" in sys.modules, "opforge" in sys.modules]))
    """, patched=False)
    assert got == ["module", True, False]


def test_patch_torch_in_code_makes_the_stand_in_and_unpatch_leaves_torchs_load():
    got = user("""
        import opforge
        opforge.patch_torch()
        import torch.utils.cpp_extension as c
        state = [type(c).__name__, hasattr(c.load, "__opforge_routes__"), "setuptools" in sys.modules]
        routes = c.load.__opforge_routes__
        opforge.unpatch_torch()
        state += [c.load is routes, type(c).__name__, "setuptools" in sys.modules]
        print(json.dumps(state))
    """, patched=False)
    assert got == ["StandIn", True, False, True, "StandIn", False]


def test_a_dunder_probe_does_not_run_torchs_module():
    got = user("""
        import torch.utils.cpp_extension as c
        probes = [hasattr(c, n) for n in ("__path__", "__wrapped__", "__warningregistry__")]
        print(json.dumps([probes, type(c).__name__, "setuptools" in sys.modules]))
    """, patched=True)
    assert got == [[False, False, False], "StandIn", False]
