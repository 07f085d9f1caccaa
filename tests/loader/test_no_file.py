"""Extensions declared where there is no file: ``python -c``, a REPL, a notebook cell (issue 33).

Such a class's module (``__main__``) has no ``__file__``, so ``inspect.getfile`` raised
``OSError: source code not available`` at registration. Now absolute sources need no file at all,
and relative ones resolve against the current directory, with one ``opforge.DeclarationWarning``
that says so. The builds here are cheap: a stable-ABI op (about a second), and a CPython-API module
for the class adopted the ColossalAI way."""

from __future__ import annotations

import itertools
import json
import sys
import types
import warnings

import pytest
from conftest import pymod_source, run_python

import opforge
from opforge import loader as loader_mod
from opforge.extension import CppExtension
from opforge.notices import DeclarationWarning

_ids = itertools.count()
STABLE_SOURCE = """
#include <torch/csrc/stable/library.h>
#include <cstdint>
int64_t answer_() { return 42; }
#define LIB_(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define LIB(ns, m) LIB_(ns, m)
#define IMPL_(ns, m) STABLE_TORCH_LIBRARY_IMPL(ns, CompositeExplicitAutograd, m)
#define IMPL(ns, m) IMPL_(ns, m)
LIB(OPFORGE_NS, m) { m.def("answer() -> int"); }
IMPL(OPFORGE_NS, m) { m.impl("answer", TORCH_BOX(&answer_)); }
"""

CELL = """
import opforge

class NoFileLoader(opforge.KernelLoader):
    kind = "{kind}"

@NoFileLoader.register_extension
class Answer(opforge.CppExtension):
    name, priority, stable_abi = "{kind}_cpp", 10, "2.10"
    sources = ({source!r},)
"""


def test_python_c_with_absolute_sources_registers_and_loads_with_no_notice(cache_dir, tmp_path):
    src = tmp_path / "answer.cpp"
    src.write_text(STABLE_SOURCE)
    cell = CELL.format(kind=f"nofile_c{next(_ids)}", source=str(src))
    code = ("import json, warnings\n"
            "seen = []\n"
            "warnings.simplefilter('always')\n"
            "warnings.showwarning = lambda message, category, *rest, **kw: seen.append((category, str(message)))\n"
            f"{cell}\n"  # the class, at the top level of `python -c`: its module, __main__, has no file
            "k = NoFileLoader().load(strict=True)\n"
            "print(json.dumps({'name': k.name, 'origin': k.origin, 'answer': k.answer(),"
            " 'notices': [m for c, m in seen if c.__module__ == 'opforge.notices']}))")
    out = run_python(code, env={"OPFORGE_CACHE_DIR": str(cache_dir)}, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["origin"] == "built" and got["answer"] == 42 and got["name"].endswith("_cpp")
    assert got["notices"] == []  # absolute sources: nothing was guessed, nothing to say


def test_a_notebook_cell_with_relative_sources_resolves_them_against_the_cwd_and_says_so_once(
        cache_dir, tmp_path, monkeypatch, request):
    (tmp_path / "answer.cpp").write_text(STABLE_SOURCE)
    monkeypatch.chdir(tmp_path)
    script_main = types.ModuleType("__main__")  # a script's __main__, with a file (pytest's has none under xdist)
    script_main.__file__ = str(tmp_path / "elsewhere" / "train.py")
    user_module = types.ModuleType("__main__")  # what IPython puts in sys.modules: a module with no __file__
    monkeypatch.setitem(sys.modules, "__main__", user_module)
    kind = f"nofile_nb{next(_ids)}"
    request.addfinalizer(lambda: (loader_mod._LOADERS.pop(kind, None), loader_mod._NAMES.pop(f"{kind}_cpp", None)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(compile(CELL.format(kind=kind, source="answer.cpp"), "<ipython-input-3-abc>", "exec"), user_module.__dict__)
        monkeypatch.chdir("/")  # a later cell changes directory: the sources stay where they were found
        k = user_module.NoFileLoader().load(strict=True)
        user_module.NoFileLoader().candidates()
    assert (k.name, k.origin, k.answer()) == (f"{kind}_cpp", "built", 42)
    monkeypatch.setitem(sys.modules, "__main__", script_main)  # now a __main__ with a file, in another directory
    assert user_module.Answer.source_paths() == [str(tmp_path / "answer.cpp")]  # where they were found, still
    notices = [w for w in seen if issubclass(w.category, DeclarationWarning)]
    assert len(notices) == 1, [str(w.message) for w in seen]
    text = str(notices[0].message)
    assert "__main__.Answer is declared where there is no file (a notebook cell, a REPL, python -c)" in text
    assert f"opforge resolves its relative sources (answer.cpp) against the current directory, {tmp_path};" in text
    assert not [w for w in seen if issubclass(w.category, opforge.KernelFallbackWarning)]


def test_a_relative_source_missing_from_the_cwd_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    missing = type("Missing", (CppExtension,), {"name": f"nofile_missing{next(_ids)}", "kind": "nofile_missing",
                                                  "sources": ("nowhere.cpp",), "__module__": "__main__"})
    with pytest.warns(DeclarationWarning), pytest.raises(TypeError) as err:
        missing.validate()
    assert str(err.value) == (f"__main__.Missing: source {tmp_path / 'nowhere.cpp'} does not exist (it is declared "
                              "where there is no file, so its relative sources are looked for in the current "
                              "directory: give absolute paths, or run from the directory that holds them)")


ADOPTED = """
import json, os
import opforge

class NoFileAdopted:  # ColossalAI's shape: the declaration in __init__ and in methods
    def __init__(self):
        self.name, self.priority = {name!r}, 1
    def is_available(self):
        return True
    def sources_files(self):
        return [{source!r}]
    def cxx_flags(self):
        return ["-O2"]

class NoFileAdoptedLoader(opforge.KernelLoader):
    kind = {kind!r}

NoFileAdoptedLoader.register_extension(NoFileAdopted)
k = NoFileAdoptedLoader().load(strict=True)
print(json.dumps({{"name": k.name, "origin": k.origin, "value": k.value()}}))
"""


def test_an_adopted_class_in_python_c_with_absolute_sources_registers_and_loads(cache_dir, tmp_path):
    kind = f"nofile_adopted{next(_ids)}"
    src = tmp_path / "adopted.cpp"
    src.write_text(pymod_source(kind, 7))  # a CPython-API module (PyInit_<its name>): builds in about a second
    out = run_python(ADOPTED.format(name=kind, kind=kind, source=str(src)), env={"OPFORGE_CACHE_DIR": str(cache_dir)},
                     cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"name": kind, "origin": "built", "value": 7}


def test_the_cpu_variants_of_a_base_with_no_file_share_its_one_notice(tmp_path, monkeypatch):
    (tmp_path / "v.cpp").write_text(STABLE_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    n = next(_ids)
    base = type("Base", (CppExtension,), {"sources": ("v.cpp",), "stable_abi": "2.10", "__module__": "__main__"})

    class Loader(loader_mod.KernelLoader):
        pass

    Loader.kind = f"nofile_variants{n}"  # set after creation: out of the global kind registry
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        made = Loader.register_cpu_variants(base, f"nofile_variants{n}")
    assert len(made) == 4 and {m.source_paths()[0] for m in made} == {str(tmp_path / "v.cpp")}
    said = [str(w.message) for w in seen if issubclass(w.category, DeclarationWarning)]
    assert len(said) == 1 and said[0].startswith("__main__.Base is declared where there is no file"), said
