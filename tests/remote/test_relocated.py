"""Relocatable keys (issue 34, item 1): node A (CI) builds at one path and pushes, signed; node B has the
same bytes at **another path**, its own cache and no compiler (``CXX`` and ``PATH`` naming nothing), and
loads what A built from a real WebDAV server on localhost. Compiles are counted by the CXX wrapper node A
runs; a node B that *has* that wrapper shows it compiles nothing either, so "0 compiles" can fail.

Three kinds of build: ``opforge.load`` of a source tree (sources plus a local header in a sibling include
dir), ``load_inline`` (its generated sources live in each node's own cache), and one of opforge's own
kernels with the package itself at another path. The bit-identity of two builds of the same bytes at two
paths is checked too (prefix maps)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, run_python

pytest.importorskip("fsspec")
pytest.importorskip("cryptography")

from remote_store import node_env, objects  # noqa: E402
from wheels import checkout_copy  # noqa: E402

import opforge  # noqa: E402
from opforge.engine import remote_fs  # noqa: E402

TREE_SOURCE = """
#include <Python.h>
#include "tree.h"
static PyObject* value(PyObject*, PyObject*) { return PyLong_FromLong(TREE_VALUE); }
static PyMethodDef methods[] = {{"value", value, METH_NOARGS, "the value"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef mod = {PyModuleDef_HEAD_INIT, "tree_mod", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_tree_mod() { return PyModule_Create(&mod); }
"""

LOAD_TREE = """
import json, time, torch, opforge
t = time.perf_counter()
m = opforge.load("tree_mod", [SRC], extra_include_paths=[INC])
ms = (time.perf_counter() - t) * 1000
print(json.dumps({"value": m.value(), "file": m.__file__, "ms": ms}))
"""


def tree(base) -> tuple[str, str]:
    """A project at ``base``: csrc/tree_mod.cpp and include/tree.h. Returns (source, include dir)."""
    (base / "csrc").mkdir(parents=True)
    (base / "include").mkdir()
    (base / "csrc" / "tree_mod.cpp").write_text(TREE_SOURCE)
    (base / "include" / "tree.h").write_text("#define TREE_VALUE 41\n")
    return str(base / "csrc" / "tree_mod.cpp"), str(base / "include")


def relocate(src_base, dst_base):
    """Node B's copy: the same bytes at another path, written anew (other mtimes, as on another machine)."""
    shutil.copytree(src_base, dst_base, copy_function=shutil.copyfile)


def node_a_env(monkeypatch, tmp_path, url, secret):
    remote_fs._DEAD.clear()
    for k, v in {"OPFORGE_CACHE_DIR": str(tmp_path / "node-a"), "OPFORGE_REMOTE_CACHE": url,
                 "OPFORGE_REMOTE_PUSH": "1", "OPFORGE_SIGNING_KEY": secret, "OPFORGE_PCH": "0"}.items():
        monkeypatch.setenv(k, v)


def on_node_b(code: str, tmp_path, url, keys, node="node-b", compiler=False, **env) -> tuple[dict, str]:
    out = run_python(code, env=node_env(tmp_path, url, compiler, node=node, OPFORGE_TRUSTED_KEYS=keys["public"],
                                        OPFORGE_PCH="0", **env), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_source_tree_at_another_path_loads_on_a_node_with_no_compiler(monkeypatch, tmp_path, keys, webdav,
                                                                        counting_cxx, silent_server):
    root, url, server = webdav
    src_a, inc_a = tree(tmp_path / "builds" / "group" / "proj")  # CI's checkout
    node_a_env(monkeypatch, tmp_path, url, keys["secret"])
    assert opforge.load("tree_mod", [src_a], extra_include_paths=[inc_a]).value() == 41
    assert len(counting_cxx.compiles()) == 1
    (obj,) = objects(root)

    b_base = tmp_path / "home" / "u" / "venvs" / "x" / "site-packages" / "proj"
    relocate(tmp_path / "builds" / "group" / "proj", b_base)
    code = LOAD_TREE.replace("SRC", repr(str(b_base / "csrc" / "tree_mod.cpp"))).replace(
        "INC", repr(str(b_base / "include")))
    got, err = on_node_b(code, tmp_path, url, keys)
    assert got["value"] == 41 and got["file"].startswith(str(tmp_path / "node-b")), err
    assert server.downloads == 1 and len(counting_cxx.compiles()) == 1  # its time: bench/remote_cache.py

    # The same, on a node that has node A's compiler: still nothing compiled (the input key matches too).
    with_cc, err = on_node_b(code, tmp_path, url, keys, node="node-c", compiler=True,
                             CXX=str(counting_cxx.path), CXX_LOG=str(counting_cxx.log))
    assert with_cc["value"] == 41 and server.downloads == 2
    assert len(counting_cxx.compiles()) == 1, counting_cxx.compiles()

    # Warm on node B: a local hit, the store never asked (a store that never answers would cost its timeout).
    started = time.monotonic()
    warm, err = on_node_b(code, tmp_path, silent_server, keys, OPFORGE_REMOTE_TIMEOUT="20")
    assert warm["file"] == got["file"] and "not usable" not in err
    assert time.monotonic() - started < 20

    # An edit of the header on node B is seen where B has it: stale, and with no compiler, an error that says so.
    (b_base / "include" / "tree.h").write_text("#define TREE_VALUE 42\n")
    out = run_python(code, env=node_env(tmp_path, url, node="node-b", OPFORGE_TRUSTED_KEYS=keys["public"]))
    assert out.returncode != 0 and "not found" in out.stderr, out.stderr[-2000:]


INLINE = """
import json, opforge
m = opforge.load_inline("inline_mod", [SOURCE], no_implicit_headers=True)
print(json.dumps({"value": m.value(), "file": m.__file__}))
"""


def test_load_inline_matches_across_two_cache_dirs(monkeypatch, tmp_path, keys, webdav, counting_cxx):
    from conftest import pymod_source

    root, url, server = webdav
    text = pymod_source("inline_mod", 5)
    node_a_env(monkeypatch, tmp_path, url, keys["secret"])
    assert opforge.load_inline("inline_mod", [text], no_implicit_headers=True).value() == 5
    assert len(counting_cxx.compiles()) == 1
    got, err = on_node_b(INLINE.replace("SOURCE", repr(text)), tmp_path, url, keys)
    assert got["value"] == 5 and got["file"].startswith(str(tmp_path / "node-b")), err
    assert server.downloads == 1 and len(counting_cxx.compiles()) == 1


OWN_KERNEL = """
import json, opforge, torch
from opforge.kernels.selftest import SelftestLoader
k = SelftestLoader().load(strict=True)
x = torch.arange(37, dtype=torch.float32)
assert torch.equal(k.axpy(x, x, 2.0), 3 * x)
print(json.dumps({"opforge": opforge.__file__, "name": k.name, "origin": k.origin, "path": k.path,
                  "simd": int(k.simd_width())}))
"""


def _run(code: str, pythonpath: str, env: dict) -> dict:
    full = dict(os.environ, PYTHONPATH=pythonpath, **env)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300,
                         cwd=pythonpath)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_opforges_own_kernel_with_the_package_at_another_path(tmp_path, keys, webdav, counting_cxx):
    root, url, server = webdav
    node_a = _run(OWN_KERNEL, ROOT, {"OPFORGE_CACHE_DIR": str(tmp_path / "node-a"), "OPFORGE_REMOTE_CACHE": url,
                                     "OPFORGE_REMOTE_PUSH": "1", "OPFORGE_SIGNING_KEY": keys["secret"],
                                     "CXX": str(counting_cxx.path), "CXX_LOG": str(counting_cxx.log)})
    assert node_a["origin"] == "built" and len(counting_cxx.compiles()) == 1
    copy = str(checkout_copy(tmp_path / "opt" / "site" / "opforge-elsewhere"))
    node_b = _run(OWN_KERNEL, copy, node_env(tmp_path, url, OPFORGE_TRUSTED_KEYS=keys["public"]))
    assert node_b["opforge"].startswith(copy)
    assert (node_b["name"], node_b["simd"]) == (node_a["name"], node_a["simd"]) and node_b["simd"] > 0
    assert node_b["path"].startswith(str(tmp_path / "node-b")) and server.downloads >= 1
    assert len(counting_cxx.compiles()) == 1


PLAIN = """
#include "local.h"
#include <c10/macros/Macros.h>
extern "C" const char* where_built() { return __FILE__; }
extern "C" int local_value() { return LOCAL_VALUE; }
"""


def test_the_same_bytes_built_at_two_paths_are_bit_identical(tmp_path, monkeypatch):
    """With debug info and __FILE__, the binary names no directory of the machine it was built on: not
    the sources', the build dir's or torch's (``-ffile-prefix-map``), so two nodes' builds are one file."""
    shas, binaries = [], []
    for node, where in (("a", "ci/builds/p"), ("b", "deeper/home/user/venvs/p")):
        base = tmp_path / node / where
        (base / "inc").mkdir(parents=True)
        (base / "lib.cpp").write_text(PLAIN)
        (base / "inc" / "local.h").write_text("#define LOCAL_VALUE 3\n")
        monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / node / "cache"))
        path = opforge.load("plain_lib", [str(base / "lib.cpp")], extra_cflags=["-g", "-O1"],
                            extra_include_paths=[str(base / "inc")], is_python_module=False)
        data = open(path, "rb").read()
        assert str(tmp_path).encode() not in data and str(base).encode() not in data
        import torch

        assert os.path.dirname(torch.__file__).encode() not in data
        shas.append(hashlib.sha256(data).hexdigest())
        binaries.append(path)
    assert os.path.basename(os.path.dirname(binaries[0])) == os.path.basename(os.path.dirname(binaries[1]))
    assert shas[0] == shas[1]


def test_cache_export_and_import_carry_a_build_to_sources_at_another_path(monkeypatch, tmp_path, counting_cxx):
    """``cache export`` on the CI machine, ``cache import`` on a node whose copy is elsewhere: the node loads
    the imported entry with no compiler (its headers are checked where the node has them, at load)."""
    src_a, inc_a = tree(tmp_path / "builds" / "proj")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-a"))
    assert opforge.load("tree_mod", [src_a], extra_include_paths=[inc_a]).value() == 41
    env = {"OPFORGE_CACHE_DIR": str(tmp_path / "node-a")}
    out = run_python(f"from opforge.cli.main import main; raise SystemExit(main(['cache', 'export', "
                     f"{str(tmp_path / 'a.tar')!r}]))", env=env)
    assert out.returncode == 0, out.stderr
    b_base = tmp_path / "opt" / "proj"
    relocate(tmp_path / "builds" / "proj", b_base)
    node_b = {"OPFORGE_CACHE_DIR": str(tmp_path / "node-b"), "CXX": "/nonexistent/c++", "PATH": "/nonexistent"}
    out = run_python(f"from opforge.cli.main import main; raise SystemExit(main(['cache', 'import', "
                     f"{str(tmp_path / 'a.tar')!r}]))", env=node_b)
    assert out.returncode == 0 and "imported" in out.stdout, out.stdout + out.stderr
    code = LOAD_TREE.replace("SRC", repr(str(b_base / "csrc" / "tree_mod.cpp"))).replace(
        "INC", repr(str(b_base / "include")))
    out = run_python(code, env=node_b)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["value"] == 41 and got["file"].startswith(str(tmp_path / "node-b"))
    assert len(counting_cxx.compiles()) == 1
