"""Extensions written as other loaders want them (ColossalAI's extensions, the seed API, checks that
return a bool): each works, or is refused at registration with a message that shows the fix.
Never a crash at load time."""

from __future__ import annotations

import itertools
import warnings

import pytest

from opforge.decision import Accepted
from opforge.extension import TorchExtension
from opforge.loader import KernelLoader

_ids = itertools.count()
# A rejected better variant gives a fallback notice (tests/loader/test_loader_notices.py tests that); not the point here.
pytestmark = pytest.mark.filterwarnings("ignore::opforge.KernelFallbackWarning")


def kind_with(*bodies):
    """A fresh kernel kind: a torch extension per body (a dict of class attributes), best first, then
    a plain torch fallback. Returns the loader and the extension classes."""
    n = next(_ids)

    class Loader(KernelLoader):
        pass

    Loader.kind = f"ported{n}"  # set after class creation: stays out of the global kind registry
    made = []
    for i, body in enumerate([*bodies, {}]):
        attrs = {"name": f"ported{n}_{i}", "kind": Loader.kind, "priority": 100 - i, "module": "toy_reference"}
        made.append(Loader.register_extension(type(f"Ext{i}", (TorchExtension,), {**attrs, **body})))
    return Loader, made


def decisions(loader):
    return {c.name: c.decision for c in loader().candidates()}


@pytest.mark.parametrize("method", ["is_available", "check_compatible"])
def test_a_check_returning_a_bool_decides(method):
    Loader, (no, yes, last) = kind_with({method: lambda self, platform: False},
                                        {method: lambda self, platform: True})
    d = decisions(Loader)
    assert not d[no.name] and d[no.name].reason == f"Ext0.{method}() returned False"
    assert d[yes.name]
    assert Loader().load().name == yes.name  # the bool False fell back; no AttributeError


def test_a_check_that_raises_or_returns_junk_is_a_rejection_not_a_crash():
    def broken(self, platform):
        raise KeyError("cuda_arch")

    Loader, (raises, junk, last) = kind_with({"is_available": broken},
                                             {"check_compatible": lambda self, platform: "yes"})
    d = decisions(Loader)
    assert d[raises.name].reason == "Ext0.is_available() raised KeyError: 'cuda_arch'"
    assert d[junk.name].reason == "Ext1.check_compatible() returned 'yes', not a Decision or a bool"
    assert Loader().load().name == last.name


def test_seed_api_names_are_honoured_not_ignored():
    def assert_hw(self):
        raise AssertionError("needs an Ampere GPU")

    Loader, (hw, compat, plain, last) = kind_with(
        {"is_hardware_available": lambda self: False},
        {"assert_hardware_compatible": assert_hw},
        {"assert_compatible": lambda self: None, "is_hardware_available": lambda self: True},
    )
    d = decisions(Loader)
    assert d[hw.name].reason == "Ext0.is_hardware_available() returned False"
    assert d[compat.name].reason == "Ext1.assert_hardware_compatible(): needs an Ampere GPU"
    assert d[plain.name]
    assert Loader().load().name == plain.name


def test_checks_without_a_platform_parameter_are_called_without_one():
    Loader, (ext, _) = kind_with({"is_available": lambda self: Accepted("ported check"),
                                  "check_compatible": lambda self, *args: Accepted(f"{len(args)} arg")})
    assert decisions(Loader)[ext.name].reason == "ported check; 1 arg"


def test_attributes_set_in_init_are_refused_with_the_class_attribute_fix():
    class Loader(KernelLoader):
        pass

    Loader.kind = "ported_init"

    class ColossalStyle(TorchExtension):  # ColossalAI's _Extension sets its declaration in __init__
        kind, module = "ported_init", "toy_reference"

        def __init__(self):
            self._name = "cpu_adam_x86"
            self.priority = 1

    with pytest.raises(TypeError, match=r"has no `name`: opforge reads .* from class attributes.*__init__ .*"
                                        r"class ColossalStyle\(CppExtension\): name = 'my_ext'"):
        Loader.register_extension(ColossalStyle)

    class NeedsArgs(TorchExtension):
        name, kind, module = "ported_init_args", "ported_init", "toy_reference"

        def __init__(self, name, priority=1):
            self.priority = priority

    with pytest.raises(TypeError, match=r"creates extensions with no arguments.*\(name, priority=1\)"):
        Loader.register_extension(NeedsArgs)


def test_no_warning_for_plain_extensions():
    Loader, _ = kind_with({})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader().load()


# -- a pybind11 source in a CppExtension; names that clash with opforge's own ----------------------


def test_a_pybind11_source_in_a_cpp_extension_is_refused_before_building(cache_dir, tmp_path, counting_cxx):
    from opforge import OpforgeError
    from opforge.extension import CppExtension

    src = tmp_path / "scale_add.cpp"
    src.write_text('#include <torch/extension.h>\ntorch::Tensor scale_add(torch::Tensor x) { return x; }\n'
                   'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale_add", &scale_add); }\n')
    Loader, (last,) = kind_with()
    cpp = Loader.register_extension(type("Pyb", (CppExtension,), {"name": f"{last.name}_pyb", "kind": Loader.kind,
                                                                  "priority": 200, "sources": (str(src),)}))
    with pytest.raises(OpforgeError, match=r"scale_add.cpp defines a Python module \(PYBIND11_MODULE\).*"
                                           rf"TORCH_LIBRARY\({cpp.name}, m\).*opforge.load"):
        Loader().load(strict=True)
    assert counting_cxx.compiles() == []  # refused before a 30 s build, not after it
    with pytest.warns(Warning, match="defines a Python module"):
        assert Loader().load().name == last.name  # the loader falls back, saying why


def test_a_missing_op_names_the_library_and_its_namespace(cache_dir):
    from opforge.kernel_loader import SelftestLoader

    kernel = SelftestLoader().load(ext_name="selftest_scalar")
    with pytest.raises(AttributeError, match=r"selftest_scalar \(.*\) registers no op 'scale_add' in "
                                             r"torch.ops.selftest_scalar: check that its TORCH_LIBRARY"):
        _ = kernel.scale_add


def test_a_users_name_or_kind_that_clashes_with_opforges_is_refused_at_registration():
    # A fresh process: the user's module registers before anything imports opforge's kernels.
    from conftest import run_python

    code = """
import opforge
from opforge import KernelLoader, TorchExtension
try:
    class MyLoader(KernelLoader):
        kind = "cpu_adam"
except TypeError as exc:
    print("kind:", exc)
class Mine(KernelLoader):
    kind = "mine"
class Clash(TorchExtension):
    name, priority, module = "cpu_adam_avx2", 1, "toy_reference"
try:
    Mine.register_extension(Clash)
except ValueError as exc:
    print("name:", exc)
from opforge.optim import CPUAdam  # opforge's own still import
print("ok")
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("kind: kernel kind 'cpu_adam' already has a loader: "
                               "opforge.kernels.cpu_adam.loader.CPUAdamLoader; pick another kind")
    assert lines[1].startswith("name: an extension named 'cpu_adam_avx2' is already registered "
                               "(opforge.kernels.cpu_adam.extensions.")
    assert lines[2] == "ok"
