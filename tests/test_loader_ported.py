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
# A rejected better variant gives a fallback notice (tests/test_loader_notices.py tests that); not the point here.
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
        assert False, "needs an Ampere GPU"

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
