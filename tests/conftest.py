"""Shared fixtures.

Most engine tests build tiny modules written against the plain CPython API (no torch
headers): they compile in well under a second, so a test can afford fresh builds.
Tests that need torch's headers share one session-wide cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pymod_source(name: str, value: int = 1, extra: str = "") -> str:
    """C++ source of a Python module ``name`` whose ``value()`` returns ``value``."""
    return textwrap.dedent(
        f"""
        #include <Python.h>
        {extra}
        static PyObject* value(PyObject*, PyObject*) {{ return PyLong_FromLong({value}); }}
        static PyMethodDef methods[] = {{{{"value", value, METH_NOARGS, "the value"}}, {{nullptr, nullptr, 0, nullptr}}}};
        static PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, -1, methods}};
        PyMODINIT_FUNC PyInit_{name}() {{ return PyModule_Create(&mod); }}
        """
    )


@pytest.fixture(autouse=True)
def _no_ccache(monkeypatch):
    """Tests count compiler runs; ccache (when installed) would add preprocessor runs."""
    monkeypatch.setenv("OPFORGE_CCACHE", "0")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh, empty cache root for this test (OPFORGE_CACHE_DIR points at it)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(root))
    return root


@pytest.fixture
def make_pymod(tmp_path):
    """Write a fast-compiling module source; returns its path."""

    def make(name: str, value: int = 1, extra: str = "", filename: str | None = None):
        path = tmp_path / "src" / (filename or f"{name}.cpp")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(pymod_source(name, value, extra))
        return path

    return make


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One cache for the whole session, for builds that include torch's headers."""
    return tmp_path_factory.mktemp("shared-cache")


def run_python(code: str, env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with opforge importable."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def has_cxx() -> bool:
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
