"""StyleGAN-style plugins: ``torch.utils.cpp_extension.load(...)`` then ``importlib.import_module(name)``.

StyleGAN2-ADA, StyleGAN3, EG3D and their forks build their ops that way (``torch_utils/custom_ops.py``,
``get_plugin``). torch 1.x's loader left the module in ``sys.modules``; torch 2.x's doesn't, so with a
pybind11 >= 3 module the import raises ``ModuleNotFoundError`` and StyleGAN falls back to its slow
reference ops. :func:`get_plugin` below is this project's own rendering of that pattern (the same
steps, written here): with ``TORCH_EXTENSIONS_DIR`` set and the sources in one folder, it copies the
folder's files into ``<torch's build dir for the name>/<md5 of the files>/`` and builds from the copies
with ``build_directory=<torch's build dir>``; otherwise it calls ``load(name=..., sources=...)`` as is.
The plugins' modules initialise in two phases, as pybind11 >= 3 modules do."""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys

import pytest
from conftest import pymod_source
from torch.utils import cpp_extension

import opforge
from opforge import patch


def get_plugin(cache: dict, name: str, sources: list[str]):
    """Build (or reuse) plugin ``name`` the StyleGAN way, through whatever ``cpp_extension.load`` is now."""
    if name in cache:
        return cache[name]
    folders = {os.path.dirname(s) for s in sources}
    if len(folders) == 1 and "TORCH_EXTENSIONS_DIR" in os.environ:
        folder = folders.pop()
        files = sorted(e.path for e in os.scandir(folder) if e.is_file())
        md5 = hashlib.md5()
        for path in files:
            with open(path, "rb") as f:
                md5.update(f.read())
        torch_dir = cpp_extension._get_build_directory(name, verbose=False)
        digest_dir = os.path.join(torch_dir, md5.hexdigest())
        if not os.path.isdir(digest_dir):
            os.makedirs(digest_dir)
            for path in files:
                shutil.copyfile(path, os.path.join(digest_dir, os.path.basename(path)))
        copies = [os.path.join(digest_dir, os.path.basename(s)) for s in sources]
        cpp_extension.load(name=name, build_directory=torch_dir, sources=copies, verbose=False)
    else:
        cpp_extension.load(name=name, sources=sources, verbose=False)
    cache[name] = importlib.import_module(name)
    return cache[name]


def write_plugin(root, name: str, value: int) -> list[str]:
    """A plugin folder as StyleGAN keeps one: the source, its header, and a Python file beside them."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / f"{name}.h").write_text(f"#define PLUGIN_VALUE {value}\n")
    (folder / f"{name}.cpp").write_text(pymod_source(name, "PLUGIN_VALUE", f'#include "{name}.h"', multi_phase=True))
    (folder / f"{name}.py").write_text("# the op's Python side\n")
    return [str(folder / f"{name}.cpp")]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch, cache_dir):
    """torch's build dirs under tmp; the patch and the plugins' sys.modules entries gone after each test."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    before = set(sys.modules)
    yield
    opforge.unpatch_torch()
    for name in set(sys.modules) - before:
        if name.startswith("plugin_"):
            del sys.modules[name]


def test_torch_alone_leaves_the_plugin_unimportable(tmp_path):
    assert not patch.is_patched()
    sources = write_plugin(tmp_path / "ops", "plugin_torch_alone", 1)
    with pytest.raises(ModuleNotFoundError, match="plugin_torch_alone"):
        get_plugin({}, "plugin_torch_alone", sources)  # torch built it; only the import fails
    assert (tmp_path / "torch_extensions" / "plugin_torch_alone" / "plugin_torch_alone.so").is_file()


def test_the_digest_folder_with_build_directory_loads_through_the_patch(tmp_path, cache_dir):
    sources = write_plugin(tmp_path / "ops", "plugin_digest", 2)
    with opforge.patch_torch():
        mod = get_plugin({}, "plugin_digest", sources)
        assert mod.value() == 2 and mod.__file__.startswith(str(cache_dir))
        assert get_plugin({}, "plugin_digest", sources) is mod  # another plugin cache, same process: warm
    (digest_dir,) = [p for p in (tmp_path / "torch_extensions" / "plugin_digest").iterdir() if p.is_dir()]
    assert sorted(p.name for p in digest_dir.iterdir()) == ["plugin_digest.cpp", "plugin_digest.h", "plugin_digest.py"]


def test_the_plain_call_loads_through_the_patch(tmp_path, monkeypatch, cache_dir):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    sources = write_plugin(tmp_path / "ops", "plugin_plain", 3)
    with opforge.patch_torch():
        mod = get_plugin({}, "plugin_plain", sources)
    assert mod.value() == 3 and mod.__file__.startswith(str(cache_dir))


def test_two_plugins_in_one_process(tmp_path, monkeypatch):
    plugins: dict = {}
    with opforge.patch_torch():
        first = get_plugin(plugins, "plugin_first", write_plugin(tmp_path / "ops", "plugin_first", 4))
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR")  # the second by the plain call
        second = get_plugin(plugins, "plugin_second", write_plugin(tmp_path / "ops", "plugin_second", 5))
    assert (first.value(), second.value()) == (4, 5)
    assert (sys.modules["plugin_first"], sys.modules["plugin_second"]) == (first, second)


def test_opforge_load_then_import_module(tmp_path):
    (source,) = write_plugin(tmp_path / "ops", "plugin_direct", 6)
    mod = opforge.load("plugin_direct", [source])
    assert importlib.import_module("plugin_direct") is mod and mod.value() == 6
