"""What a kernel loader tells its user: a fallback for a fixable reason is said once per kind, with
the fix, at the user's line; a failed build is remembered per input key, so a new process skips it
(and says so) until its inputs change, and `opforge cache clean` forgets it."""

from __future__ import annotations

import itertools
import os
import textwrap
import warnings

import pytest

import opforge
from opforge import loader as loader_mod
from opforge.cli.main import main as cli
from opforge.decision import Rejected
from opforge.extension import FAILED, CppExtension, TorchExtension
from opforge.loader import KernelLoader

_ids = itertools.count()
HERE = os.path.abspath(__file__)
SOURCE = """
#include "fix.h"
#include <torch/csrc/stable/library.h>
#include <cstdint>
int64_t answer_() { return ANSWER; }
#define LIB_(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define LIB(ns, m) LIB_(ns, m)
#define IMPL_(ns, m) STABLE_TORCH_LIBRARY_IMPL(ns, CompositeExplicitAutograd, m)
#define IMPL(ns, m) IMPL_(ns, m)
LIB(OPFORGE_NS, m) { m.def("answer() -> int"); }
IMPL(OPFORGE_NS, m) { m.impl("answer", TORCH_BOX(&answer_)); }
"""
BROKEN_HEADER = "int broken = this_symbol_does_not_exist;\n"
FIXED_HEADER = "#define ANSWER 42\n"


def kind(*bodies, base=TorchExtension):
    n = next(_ids)

    class Loader(KernelLoader):
        pass

    Loader.kind = f"notice{n}"
    made = []
    for i, body in enumerate([*bodies, {}]):
        cls = base if i < len(bodies) else TorchExtension
        attrs = {"name": f"notice{n}_{i}", "kind": Loader.kind, "priority": 100 - i}
        if cls is TorchExtension:
            attrs["module"] = "toy_reference"
        made.append(Loader.register_extension(type(f"Ext{i}", (cls,), {**attrs, **body})))
    return Loader, made


def loaded_with_warnings(loader):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = loader().load()
    return kernel, [w for w in caught if issubclass(w.category, opforge.KernelFallbackWarning)]


def test_a_fallback_for_a_fixable_reason_is_said_once_at_the_users_line(monkeypatch):
    Loader, (old, last) = kind({"check_compatible": lambda self, p: Rejected("needs triton: `pip install triton`")})
    kernel, caught = loaded_with_warnings(Loader)
    assert kernel.name == last.name
    (w,) = caught
    assert f"{Loader.kind}: using {last.name} (torch backend)" in str(w.message)
    assert f"{old.name}: needs triton: `pip install triton`" in str(w.message)
    assert "OPFORGE_FALLBACK_NOTICE=0" in str(w.message)
    assert w.filename == HERE  # the user's line (loaded_with_warnings), not opforge/loader.py
    Loader._cache.clear()  # (toy loaders stay out of the registry that clear_cache() walks)
    assert loaded_with_warnings(Loader)[1] == []  # once per process


def test_the_notice_can_be_silenced(monkeypatch):
    monkeypatch.setenv("OPFORGE_FALLBACK_NOTICE", "0")
    Loader, _ = kind({"check_compatible": lambda self, p: Rejected("needs triton: `pip install triton`")})
    assert loaded_with_warnings(Loader)[1] == []


def test_missing_hardware_is_no_reason_for_a_notice():
    Loader, (_, last) = kind({"is_available": lambda self, p: Rejected("needs an NVIDIA GPU; none found")})
    kernel, caught = loaded_with_warnings(Loader)
    assert kernel.name == last.name and caught == []


def test_a_failed_build_warning_points_at_the_users_line(cache_dir, tmp_path):
    (tmp_path / "fix.h").write_text(BROKEN_HEADER)
    (tmp_path / "op.cpp").write_text(SOURCE)
    Loader, (cpp, _) = kind({"sources": (str(tmp_path / "op.cpp"),), "stable_abi": "2.10"}, base=CppExtension)
    _, caught = loaded_with_warnings(Loader)
    (w,) = caught
    assert "could not be loaded" in str(w.message) and w.filename == HERE


def test_a_failed_build_is_skipped_until_its_inputs_change(cache_dir, tmp_path, counting_cxx, capsys):
    header = tmp_path / "fix.h"
    header.write_text(BROKEN_HEADER)
    (tmp_path / "op.cpp").write_text(SOURCE)
    Loader, (cpp, torch_ext) = kind({"sources": (str(tmp_path / "op.cpp"),), "stable_abi": "2.10"},
                                    base=CppExtension)
    kernel, caught = loaded_with_warnings(Loader)  # builds, fails, falls back
    assert kernel.name == torch_ext.name and len(counting_cxx.compiles()) == 1
    assert len(caught) == 1 and "this_symbol_does_not_exist" in str(caught[0].message)

    # As in a new process: the record on disk, not this process's memory, makes it skip.
    Loader._cache.clear()  # (toy loaders stay out of the registry that clear_cache() walks)
    counting_cxx.clear()
    kernel, caught = loaded_with_warnings(Loader)
    assert kernel.name == torch_ext.name and counting_cxx.compiles() == []
    (notice,) = [str(w.message) for w in caught]
    assert f"{cpp.name}: its build failed" in notice and "this_symbol_does_not_exist" in notice
    assert f"opforge cache clean {cpp.name}" in notice
    (c,) = [c for c in Loader().candidates() if c.name == cpp.name]
    assert c.status.state == FAILED and not c.decision

    # opforge report shows it (the kind's loader is this test's: look it up through the report's collect).
    from opforge.cli import report_cmd

    loader_mod._LOADERS[Loader.kind] = Loader
    try:
        (k,) = report_cmd.collect((Loader.kind,))["kinds"]
    finally:
        del loader_mod._LOADERS[Loader.kind]
    (row,) = [r for r in k["candidates"] if r["name"] == cpp.name]
    assert row["state"] == "failed" and "its build failed" in row["reason"]

    header.write_text(FIXED_HEADER)  # a header edit: not in the input key, but the build read it
    Loader._cache.clear()  # (toy loaders stay out of the registry that clear_cache() walks)
    kernel, caught = loaded_with_warnings(Loader)
    assert kernel.name == cpp.name and kernel.answer() == 42 and caught == []
    assert not list(cache_dir.glob(f"{cpp.name}/.failed-*"))  # a success forgets the failure


def test_cache_clean_forgets_a_failed_build(cache_dir, tmp_path, counting_cxx, capsys):
    (tmp_path / "fix.h").write_text(BROKEN_HEADER)
    (tmp_path / "op.cpp").write_text(SOURCE)
    Loader, (cpp, _) = kind({"sources": (str(tmp_path / "op.cpp"),), "stable_abi": "2.10"}, base=CppExtension)
    loaded_with_warnings(Loader)
    assert list(cache_dir.glob(f"{cpp.name}/.failed-*"))
    assert cli(["cache", "clean", cpp.name]) == 0
    assert not list(cache_dir.glob(f"{cpp.name}/.failed-*"))
    Loader._cache.clear()  # (toy loaders stay out of the registry that clear_cache() walks)
    counting_cxx.clear()
    loaded_with_warnings(Loader)
    assert len(counting_cxx.compiles()) == 1  # tried again


def test_a_new_header_in_an_include_dir_makes_the_failure_history(cache_dir, tmp_path):
    from opforge.engine import failures

    (tmp_path / "op.cpp").write_text('#include "missing.h"\n')
    record = failures.Failure(0.0, 1, "h", "e", None, failures.inputs_of(
        (str(tmp_path / "op.cpp"),), (), str(tmp_path), "ninja", []))
    assert record.still_holds()
    (tmp_path / "missing.h").write_text("")
    assert not record.still_holds()


@pytest.mark.parametrize("text, expected", [
    ("a.o: a.cpp b.h\n", ["a.cpp", "b.h"]),
    (textwrap.dedent("""\
        a.o: /x/a.cpp \\
          /x/with\\ space.h /x/d$$.h
        """), ["/x/a.cpp", "/x/with space.h", "/x/d$.h"]),
])
def test_depfiles_parse(text, expected):
    from opforge.engine.failures import parse_depfile

    assert parse_depfile(text) == expected
