"""opforge.patch_torch(): torch's own load / load_inline, routed through opforge for every caller."""

from __future__ import annotations

import functools
import json
import os

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


def test_calls_opforge_cannot_take_go_to_torch_with_one_notice(spy, cache_dir, make_pymod):
    src = str(make_pymod("fallthrough_mod", 3))
    with opforge.patch_torch():
        with pytest.warns(opforge.KernelFallbackWarning, match=r"load\('sycl_mod'\) goes to torch's own load: SYCL"):
            assert cpp_extension.load("sycl_mod", [src], extra_sycl_cflags=["-O2"]) == "torch's own"
        with pytest.warns(opforge.KernelFallbackWarning, match="ValueError: .* listed twice"):
            assert cpp_extension.load("twice_mod", [src, src]) == "torch's own"
        # A call torch's signature refuses gets torch's own TypeError (here: the stand-in's).
        assert cpp_extension.load("x", [src], no_such_argument=1) == "torch's own"
    assert [c[0][0] if c[0] else c[1].get("name") for c in spy] == ["sycl_mod", "twice_mod", "x"]
    assert not cache_dir.exists() or not (cache_dir / "sycl_mod").exists()


def test_an_argument_of_a_newer_torch_goes_to_torch(monkeypatch, make_pymod):
    calls = []

    def newer_load(name, sources, extra_cflags=None, verbose=False, new_flag=None):
        calls.append(new_flag)
        return "torch's own"

    monkeypatch.setattr(cpp_extension, "load", newer_load)
    with opforge.patch_torch(), pytest.warns(opforge.KernelFallbackWarning, match="argument new_flag"):
        assert cpp_extension.load("newer", [str(make_pymod("newer"))], new_flag=True) == "torch's own"
    assert calls == [True]


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
