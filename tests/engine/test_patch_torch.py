"""opforge.patch_torch(): torch's own load / load_inline, routed through opforge for every caller."""

from __future__ import annotations

import functools
import json
import os
import re
import warnings

import pytest
from conftest import pymod_source, run_python
from torch.utils import cpp_extension

import opforge
from opforge import patch


@pytest.fixture(autouse=True)
def _unpatched():
    assert not patch.is_patched()
    yield
    opforge.unpatch_torch()


@pytest.fixture
def spy(monkeypatch):
    """torch's load replaced (before the patch) by a stand-in with its signature that records its calls."""
    calls = []
    real = cpp_extension.load

    @functools.wraps(real)
    def load(*args, **kwargs):
        calls.append((args, kwargs))
        return "torch's own"

    monkeypatch.setattr(cpp_extension, "load", load)
    return calls


def test_patch_unpatch_nesting_and_the_signature(spy):
    theirs = cpp_extension.load
    with opforge.patch_torch():
        routed = cpp_extension.load
        assert routed is not theirs and routed.__opforge_routes__ is theirs
        assert patch.original("load") is theirs
        with opforge.patch_torch():  # nested: the outer block still holds the patch after the inner ends
            assert cpp_extension.load is routed
        assert cpp_extension.load is routed and patch.is_patched()
    assert cpp_extension.load is theirs and not patch.is_patched()
    opforge.patch_torch()
    opforge.patch_torch()
    opforge.unpatch_torch()  # however many
    assert cpp_extension.load is theirs
    import inspect

    assert inspect.signature(routed) == inspect.signature(theirs)


def fallback_notices(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, opforge.KernelFallbackWarning)]


def test_calls_opforge_cannot_take_go_to_torch_with_one_notice(spy, cache_dir, make_pymod):
    src = str(make_pymod("fallthrough_mod", 3))
    with opforge.patch_torch(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # each call twice: torch gets both, the notice is said once
            assert cpp_extension.load("sycl_mod", [src], extra_sycl_cflags=["-O2"]) == "torch's own"
            assert cpp_extension.load("twice_mod", [src, src]) == "torch's own"
            # A call torch's signature refuses gets torch's own TypeError (here: the stand-in's), unannounced.
            assert cpp_extension.load("x", [src], no_such_argument=1) == "torch's own"
    said = fallback_notices(caught)
    assert len(said) == 2, said
    assert re.search(r"load\('sycl_mod'\) goes to torch's own load: SYCL", said[0])
    assert re.search(r"load\('twice_mod'\) goes to torch's own load: ValueError: .* listed twice", said[1])
    assert [c[0][0] if c[0] else c[1].get("name") for c in spy] == ["sycl_mod", "twice_mod", "x"] * 2
    assert not cache_dir.exists() or not (cache_dir / "sycl_mod").exists()


def test_an_argument_of_a_newer_torch_goes_to_torch(monkeypatch, make_pymod):
    calls = []

    def newer_load(name, sources, extra_cflags=None, verbose=False, new_flag=None):
        calls.append(new_flag)
        return "torch's own"

    monkeypatch.setattr(cpp_extension, "load", newer_load)
    src = str(make_pymod("newer"))
    with opforge.patch_torch(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpp_extension.load("newer", [src], new_flag=True) == "torch's own"
        assert cpp_extension.load("newer", [src], new_flag=False) == "torch's own"
    (said,) = fallback_notices(caught)
    assert "load('newer') goes to torch's own load: this opforge does not know torch's argument new_flag" in said
    assert calls == [True, False]


def test_a_compile_error_is_opforges_build_error_after_one_compile(cache_dir, counting_cxx, tmp_path, monkeypatch):
    # Handed to torch, the same source compiled again (28.6 s instead of 8 s, the error printed twice).
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    src = tmp_path / "broken_mod.cpp"
    src.write_text(pymod_source("broken_mod", 1, extra="this is not C++;"))
    with opforge.patch_torch(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(opforge.BuildError, match="broken_mod") as raised:
            cpp_extension.load("broken_mod", [str(src)])
    assert "this is not C++" in raised.value.excerpt
    assert len(counting_cxx.compiles()) == 1
    assert not fallback_notices(caught) and not (tmp_path / "torch_extensions").exists()


def test_a_missing_compiler_is_opforges_error_and_an_unusable_cache_goes_to_torch(spy, cache_dir, make_pymod,
                                                                                  monkeypatch):
    src = str(make_pymod("tools_mod"))
    with opforge.patch_torch(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setenv("CXX", "/nonexistent/c++")  # torch fails on it too
        with pytest.raises(opforge.ToolchainError, match="CXX"):
            cpp_extension.load("tools_mod", [src])
        assert not spy and not fallback_notices(caught)
        monkeypatch.delenv("CXX")
        shared = cache_dir / "tools_mod"  # a kernel dir others can write: opforge refuses it, torch's own dir may do
        shared.mkdir(parents=True)
        shared.chmod(0o777)
        assert cpp_extension.load("tools_mod", [src]) == "torch's own"
    (said,) = fallback_notices(caught)
    assert "load('tools_mod') goes to torch's own load: UnsafeCacheError" in said
    assert len(spy) == 1


_TORCH_LOAD = """
import json, os, sys
from torch.utils import cpp_extension
import opforge
m = cpp_extension.load("patched_mod", [{src!r}], extra_cflags=["-O1"])
print(json.dumps({{"value": m.value(), "file": m.__file__, "ninja": "ninja" in sys.modules,
                   "patched": opforge.patch.is_patched()}}))
"""


def test_torchs_load_builds_once_through_opforge_and_loads_warm_elsewhere(cache_dir, make_pymod, counting_cxx,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    src = str(make_pymod("patched_mod", 7))
    with opforge.patch_torch():
        mod = cpp_extension.load("patched_mod", [src], extra_cflags=["-O1"])
    assert mod.value() == 7 and mod.__file__.startswith(str(cache_dir))
    assert len(counting_cxx.compiles()) == 1

    # Another process, patched by the setting: a warm load, no compile and no ninja imported.
    code = _TORCH_LOAD.format(src=src)
    out = run_python(code, env={"OPFORGE_PATCH_TORCH": "1"})
    assert out.returncode == 0, out.stderr
    warm = json.loads(out.stdout.splitlines()[-1])
    assert warm == {"value": 7, "file": mod.__file__, "ninja": False, "patched": True}
    assert len(counting_cxx.compiles()) == 1

    # The patch off: torch builds it again in its own directory (the test can tell the difference).
    out = run_python(code, env={"OPFORGE_PATCH_TORCH": "0"})
    assert out.returncode == 0, out.stderr
    unpatched = json.loads(out.stdout.splitlines()[-1])
    assert unpatched["value"] == 7 and not unpatched["patched"]
    assert unpatched["file"].startswith(str(tmp_path / "torch_extensions"))
    assert len(counting_cxx.compiles()) == 2


def test_torchs_load_inline_goes_through_opforge(cache_dir):
    with opforge.patch_torch():
        mod = cpp_extension.load_inline("patched_inline", pymod_source("patched_inline", 5), no_implicit_headers=True)
    assert mod.value() == 5 and mod.__file__.startswith(str(cache_dir))
    # The same call, patched again: the module this process already has.
    with opforge.patch_torch():
        again = cpp_extension.load_inline("patched_inline", pymod_source("patched_inline", 5), no_implicit_headers=True)
    assert again is mod
    assert os.path.isfile(mod.__file__)
