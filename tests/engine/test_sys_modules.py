"""A Python module opforge loads is in ``sys.modules`` under its name, as torch 1.x's loader left it, so
``load(); importlib.import_module(name)`` works (StyleGAN's custom ops do that). A rebuilt module takes
the name over from opforge's earlier build; a module of that name from anywhere else is never replaced.

The modules here initialise as pybind11 >= 3 modules do (multi-phase, PEP 489): CPython does not put
those in ``sys.modules`` itself. The foreign-module test uses a single-phase one, which CPython does put
there, over whatever held the name."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

import opforge


@pytest.fixture
def names():
    """Module names a test uses: taken out of sys.modules after it."""
    used: list[str] = []
    yield used
    for name in used:
        sys.modules.pop(name, None)


def test_a_loaded_module_imports_by_its_name(cache_dir, make_pymod, names):
    names.append("sysmod_plain")
    assert "sysmod_plain" not in sys.modules
    mod = opforge.load("sysmod_plain", [str(make_pymod("sysmod_plain", 3, multi_phase=True))])
    assert importlib.import_module("sysmod_plain") is mod and mod.value() == 3


def test_a_rebuilt_module_takes_the_name_and_the_first_one_keeps_working(cache_dir, make_pymod, names):
    names.append("sysmod_edit")
    first = opforge.load("sysmod_edit", [str(make_pymod("sysmod_edit", 1, multi_phase=True))])
    second = opforge.load("sysmod_edit", [str(make_pymod("sysmod_edit", 2, multi_phase=True))])
    assert second.__name__ == "sysmod_edit_v1.sysmod_edit" and second is not first
    # What load() returned last is what the name imports: a notebook's edit, then load + import, gets it.
    assert importlib.import_module("sysmod_edit") is second and second.value() == 2
    assert first.value() == 1  # the module imported before is unchanged
    back = opforge.load("sysmod_edit", [str(make_pymod("sysmod_edit", 1, multi_phase=True))])
    assert back is first and importlib.import_module("sysmod_edit") is first  # the edit undone


def test_a_module_of_that_name_from_elsewhere_is_never_replaced(cache_dir, make_pymod, names, capfd):
    names.append("sysmod_taken")
    theirs = sys.modules["sysmod_taken"] = types.ModuleType("sysmod_taken")
    src = str(make_pymod("sysmod_taken", 4))  # single-phase: CPython's own import puts it in sys.modules
    ours = opforge.load("sysmod_taken", [src])
    again = opforge.load("sysmod_taken", [src])
    assert ours is again and ours.value() == 4 and ours is not theirs
    assert sys.modules["sysmod_taken"] is theirs
    said = [ln for ln in capfd.readouterr().err.splitlines() if "sys.modules['sysmod_taken']" in ln]
    assert len(said) == 1, said  # two loads, one notice
    assert "is not put there" in said[0] and "the module load() returns" in said[0]
