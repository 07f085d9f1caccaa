"""A warm load works whatever the script imported first (issue 60, item 1).

The README's first example, ``import opforge; opforge.load(...)`` in a script that never imports torch,
failed on a warm cache with ``ImportError: libc10.so: cannot open shared object file``: a module linked
against torch's libraries finds them only once torch's import has loaded them, and only the cold path
imported torch. Each test here loads warm in a new process that imports opforge and nothing of torch.

The modules are the suite's quick CPython-API ones, linked with ``-Wl,--no-as-needed`` so that they name
torch's libraries as an extension built on torch's headers does (``libc10.so``, ``libtorch_cpu.so``,
``libtorch_python.so``), at a fraction of its compile time.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import pymod_source, recorded_cache, run_python

import opforge
from opforge.engine import elf

LINKED = ["-Wl,--no-as-needed"]
"""Keep every library of the link in the binary's DT_NEEDED, as a module that uses torch's API has them."""

REPORT = 'print(json.dumps({"value": VALUE, "torch": "torch" in sys.modules}))'


def _fresh(code: str, env: dict) -> dict:
    code = "import json, sys\n" + textwrap.dedent(code) + "\n" + REPORT
    out = run_python(code, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_module_that_links_torch_loads_warm_where_torch_was_never_imported(cache_dir, make_pymod):
    src = make_pymod("tf_linked", 21)
    built = opforge.load("tf_linked", [str(src)], extra_ldflags=LINKED)
    assert any(n.startswith("libc10") for n in elf.needed(built.__file__))
    got = _fresh(f"""
        import opforge
        VALUE = opforge.load("tf_linked", [{str(src)!r}], extra_ldflags={LINKED!r}).value()
    """, {"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert got == {"value": 21, "torch": True}  # torch imported by the load, as torch's load() has it


def test_a_module_that_needs_none_of_torch_is_imported_without_it(cache_dir, make_pymod):
    src = make_pymod("tf_plain", 4)
    built = opforge.load("tf_plain", [str(src)])
    assert not elf.needs_torch(built.__file__)  # the linker dropped torch's libraries (--as-needed)
    got = _fresh(f"""
        import opforge
        VALUE = opforge.load("tf_plain", [{str(src)!r}]).value()
    """, {"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert got == {"value": 4, "torch": False}


def test_load_inline_warm_without_torch(cache_dir):
    source = pymod_source("tf_inline", 8)
    assert opforge.load_inline("tf_inline", source, extra_ldflags=LINKED, no_implicit_headers=True).value() == 8
    got = _fresh(f"""
        import opforge
        VALUE = opforge.load_inline("tf_inline", {source!r}, extra_ldflags={LINKED!r}, no_implicit_headers=True).value()
    """, {"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert got == {"value": 8, "torch": True}


KERNELS = '''
from opforge import CppExtension, KernelLoader

class TfLoader(KernelLoader):
    kind = "tf_kind"

@TfLoader.register_extension
class TfCpp(CppExtension):
    name, priority, python_module = "tf_kind_cpp", 10, True
    sources = ("tf_kind_cpp.cpp",)
    ldflags = ("-Wl,--no-as-needed",)
    optimize = ("-O0",)
'''


def test_a_loaders_python_module_warm_without_torch(cache_dir, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "tf_kind_cpp.cpp").write_text(pymod_source("tf_kind_cpp", 13))
    (pkg / "tf_kernels.py").write_text(KERNELS)
    use = f"""
        sys.path.insert(0, {str(pkg)!r})
        from tf_kernels import TfLoader
        k = TfLoader().load(strict=True)
        VALUE = [k.origin, k.value()]
    """
    env = {"OPFORGE_CACHE_DIR": str(cache_dir)}
    assert _fresh(use, env)["value"] == ["built", 13]
    assert _fresh(use, env) == {"value": ["cached", 13], "torch": True}


LIBRARY = textwrap.dedent("""\
    #include <torch/csrc/stable/library.h>
    #include <torch/csrc/stable/tensor.h>
    int64_t tf_seven() { return 7; }
    STABLE_TORCH_LIBRARY(tf_lib, m) { m.def("seven() -> int"); }
    STABLE_TORCH_LIBRARY_IMPL(tf_lib, CompositeExplicitAutograd, m) { m.impl("seven", TORCH_BOX(&tf_seven)); }
""")


def test_a_torch_library_extension_warm_without_torch(cache_dir, tmp_path):
    src = tmp_path / "tf_lib.cpp"
    src.write_text(LIBRARY)
    load = f"""
        import opforge
        opforge.load("tf_lib", [{str(src)!r}], is_python_module=False, extra_cflags=["-DTORCH_TARGET_VERSION=0x020a000000000000"])
        import torch
        VALUE = torch.ops.tf_lib.seven()
    """
    env = {"OPFORGE_CACHE_DIR": str(cache_dir)}
    assert _fresh(load, env)["value"] == 7  # cold
    assert _fresh(load, env)["value"] == 7  # warm


@pytest.fixture
def store(tmp_path):
    return tmp_path / "store"


def test_a_pulled_remote_entry_loads_without_torch(monkeypatch, tmp_path, store, make_pymod):
    pytest.importorskip("cryptography")  # opforge[remote]
    from opforge.engine import remote_fs, signing

    secret, public = signing.keygen("tf-node", str(tmp_path / "keys"))
    src = make_pymod("tf_remote", 31)
    remote_fs._DEAD.clear()
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "node-a"))
    monkeypatch.setenv("OPFORGE_REMOTE_CACHE", str(store))
    monkeypatch.setenv("OPFORGE_REMOTE_PUSH", "1")
    monkeypatch.setenv("OPFORGE_SIGNING_KEY", secret)
    assert opforge.load("tf_remote", [str(src)], extra_ldflags=LINKED).value() == 31
    recorded_cache(tmp_path / "node-b")
    env = {"OPFORGE_CACHE_DIR": str(tmp_path / "node-b"), "OPFORGE_REMOTE_CACHE": str(store),
           "OPFORGE_REMOTE_PUSH": "0", "OPFORGE_TRUSTED_KEYS": public, "OPFORGE_SIGNING_KEY": "",
           "CXX": "/nonexistent/c++", "PATH": "/nonexistent"}
    got = _fresh(f"""
        import opforge
        m = opforge.load("tf_remote", [{str(src)!r}], extra_ldflags={LINKED!r})
        assert m.__file__.startswith({str(tmp_path / "node-b")!r}), m.__file__
        VALUE = m.value()
    """, env)
    assert got == {"value": 31, "torch": True}
