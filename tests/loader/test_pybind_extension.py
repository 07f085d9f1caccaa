"""A compiled extension that is a Python module (``python_module = True``: ``PYBIND11_MODULE``), as
DeepSpeed's and ColossalAI's ops are: the same prebuilt → cache → build → fallback path as a
``TORCH_LIBRARY`` one, and the loaded kernel's attributes are the module's functions.

The module here includes pybind11 alone (~10 s to build, at -O0); DeepSpeed's cpu_adam, with
torch's headers, is built the same way in tests/clients/test_ds_example.py, AOT and JIT."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import run_python

from opforge import OpforgeError
from opforge.extension import CppExtension, TorchExtension
from opforge.loader import KernelLoader

pytestmark = pytest.mark.filterwarnings("ignore::opforge.KernelFallbackWarning")

PYBIND = ('#include <pybind11/pybind11.h>\n#include <string>\n#define STR2(x) #x\n#define STR(x) STR2(x)\n'
          'int triple(int x) { return 3 * x; }\n'
          'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("triple", &triple); '
          'm.def("module_name", [] { return std::string(STR(TORCH_EXTENSION_NAME)); }); }\n')

KERNELS = '''
from opforge import CppExtension, KernelLoader, TorchExtension

class TripleLoader(KernelLoader):
    kind = "pyb_triple{n}"

@TripleLoader.register_extension
class TripleCpp(CppExtension):
    name, priority, python_module = "pyb_triple{n}_cpp", 10, True
    sources = ("triple.cpp",)
    optimize = ("-O0",)  # pybind11's headers: ~10 s a build at -O0, ~13 s at -O3

@TripleLoader.register_extension
class TripleTorch(TorchExtension):
    name, priority, module = "pyb_triple{n}_torch", 0, "triple_ref"
'''

USE = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from kernels import TripleLoader
    k = TripleLoader().load()
    print(json.dumps({"name": k.name, "origin": k.origin, "path": k.path, "value": k.triple(14),
                      "module": k.module_name()}))
''')


@pytest.fixture
def package(tmp_path):
    """A directory with a loader module (``kernels.py``), the pybind11 source and a Python fallback."""
    d = tmp_path / "pkg"
    d.mkdir()
    (d / "triple.cpp").write_text(PYBIND)
    (d / "kernels.py").write_text(KERNELS.format(n=""))
    (d / "triple_ref.py").write_text("def triple(x):\n    return 3 * x\n\ndef module_name():\n    return 'torch'\n")
    return d


def _use(package, env) -> dict:
    out = run_python(USE.replace("sys.argv[1]", repr(str(package))), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_pybind11_module_builds_once_and_loads_warm_with_no_compiler(package, cache_dir, counting_cxx):
    cold = _use(package, {})
    assert (cold["name"], cold["origin"], cold["value"]) == ("pyb_triple_cpp", "built", 42)
    assert cold["module"] == "pyb_triple_cpp"  # TORCH_EXTENSION_NAME is the extension's name
    assert cold["path"].startswith(str(cache_dir))
    assert len(counting_cxx.compiles()) == 1

    warm = _use(package, {"CXX": "/nonexistent/c++"})  # no compiler: the cached module
    assert (warm["origin"], warm["path"], warm["value"]) == ("cached", cold["path"], 42)
    assert len(counting_cxx.compiles()) == 1

    (package / "triple.cpp").write_text(PYBIND.replace("3 * x", "3 * x + 0"))  # an edit: one rebuild
    assert _use(package, {})["origin"] == "built"
    assert len(counting_cxx.compiles()) == 2


def test_with_no_compiler_and_nothing_cached_the_fallback_runs(package, cache_dir):
    got = _use(package, {"CXX": "/nonexistent/c++"})
    assert (got["name"], got["origin"], got["value"], got["module"]) == ("pyb_triple_torch", "python", 42, "torch")


def _kind(ext_attrs: dict, tmp_path, source: str):
    src = tmp_path / "m.cpp"
    src.write_text(source)

    class Loader(KernelLoader):
        pass

    Loader.kind = f"pyb_{tmp_path.name}"[:40].replace("-", "_")  # set after creation: out of the global registry
    attrs = {"name": f"{Loader.kind}_cpp", "kind": Loader.kind, "priority": 10, "sources": (str(src),),
             "python_module": True, "optimize": ("-O0",), **ext_attrs}
    cpp = Loader.register_extension(type("Cpp", (CppExtension,), attrs))
    Loader.register_extension(type("Ref", (TorchExtension,), {"name": f"{Loader.kind}_torch", "kind": Loader.kind,
                                                              "module": "toy_reference"}))
    return Loader, cpp


def test_the_loaded_kernel_is_the_module_and_a_missing_function_names_what_it_has(cache_dir, tmp_path):
    Loader, cpp = _kind({}, tmp_path, PYBIND)
    k = Loader().load(strict=True)
    assert k.name == cpp.name and k.triple(5) == 15 and k.ops.__name__ == cpp.name
    with pytest.raises(AttributeError, match=r"is a Python module with no function 'quadruple'; its PYBIND11_MODULE "
                                             r"block defines: module_name, triple"):
        _ = k.quadruple


def test_declared_a_module_but_the_sources_register_ops_is_refused_before_building(cache_dir, tmp_path, counting_cxx):
    ops = '#include <torch/library.h>\nTORCH_LIBRARY(x, m) { m.def("f(Tensor a) -> Tensor"); }\n'
    Loader, cpp = _kind({}, tmp_path, ops)
    with pytest.raises(OpforgeError, match=rf"{cpp.name} is declared a Python module \(python_module = True\), but "
                                           r"none of its sources defines one: add PYBIND11_MODULE"):
        Loader().load(strict=True)
    assert counting_cxx.compiles() == []
    with pytest.warns(Warning, match="declared a Python module"):
        assert Loader().load().backend == "torch"  # the loader falls back, saying why


def test_a_module_cannot_be_a_stable_abi_build(tmp_path):
    with pytest.raises(TypeError, match=r"can't be a stable-ABI build: drop `stable_abi`"):
        _kind({"stable_abi": "2.10"}, tmp_path, PYBIND)
