"""What C++ sources register, read from their text: a Python module (pybind11, nanobind or the
CPython API) or torch operators (``TORCH_LIBRARY`` and its stable-ABI twin). Read on cold
paths only (before a build, or when a second binary of one name is about to be loaded), never
on the warm path.

>>> scan_text(b'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }')
Bindings(python_module=True, defines_ops=False, registers_ops=False)
>>> scan_text(b'#define LIB(ns, m) STABLE_TORCH_LIBRARY(ns, m)')
Bindings(python_module=False, defines_ops=True, registers_ops=True)
>>> scan_text(b'TORCH_LIBRARY_IMPL(myops, CPU, m) { m.impl("f", &f); }')
Bindings(python_module=False, defines_ops=False, registers_ops=True)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..decision import Accepted, Decision, Rejected

_PYTHON_MODULE = re.compile(rb"\b(?:PYBIND11_MODULE|NB_MODULE)\s*\(|\bPyInit_\w+\s*\(")
_DEFINES_OPS = re.compile(rb"\b(?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT)?\s*\(")
_REGISTERS_OPS = re.compile(rb"\b(?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?\s*\(")
HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".hxx", ".cuh", ".inc", ".inl")


@dataclass(frozen=True)
class Bindings:
    python_module: bool
    """A Python module's init function: ``PYBIND11_MODULE``, ``NB_MODULE`` or ``PyInit_<name>``."""
    defines_ops: bool
    """``TORCH_LIBRARY``/``_FRAGMENT`` (or the ``STABLE_`` ones): operator schemas, which torch's
    dispatcher takes once per process."""
    registers_ops: bool
    """Any of those, ``_IMPL`` included."""

    def __or__(self, other: Bindings) -> Bindings:
        return Bindings(self.python_module or other.python_module, self.defines_ops or other.defines_ops,
                        self.registers_ops or other.registers_ops)


NOTHING = Bindings(False, False, False)


def scan_text(text: bytes) -> Bindings:
    return Bindings(bool(_PYTHON_MODULE.search(text)), bool(_DEFINES_OPS.search(text)),
                    bool(_REGISTERS_OPS.search(text)))


def scan(paths: Iterable[str]) -> Bindings:
    """What the files register, together; files that can't be read count as registering nothing."""
    found = NOTHING
    for path in paths:
        try:
            with open(path, "rb") as f:
                found |= scan_text(f.read())
        except OSError:
            continue
    return found


def headers_in(dirs: Iterable[str]) -> list[str]:
    """The header files directly in ``dirs`` (not below): where a source's own macros live."""
    out = []
    for d in dict.fromkeys(dirs):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        out += [os.path.join(d, n) for n in names if n.endswith(HEADER_SUFFIXES)]
    return out


def library_decision(name: str, namespace: str, sources: list[str], header_dirs: list[str]) -> Decision:
    """Can these sources be an extension whose ops the loader finds in ``torch.ops.<namespace>``?
    Rejected when a source defines a Python module and nothing (sources, or the headers beside
    them and in ``header_dirs``) registers ops: the build would take its full time, and then
    nothing would be found. Read before a build, never on the warm path."""
    modules = [s for s in sources if scan([s]).python_module]
    if not modules or scan(sources).registers_ops:
        return Accepted()
    dirs = [os.path.dirname(os.path.abspath(s)) for s in sources] + list(header_dirs)
    if scan(headers_in(dirs)).registers_ops:
        return Accepted()
    return Rejected(
        f"{name}: {os.path.basename(modules[0])} defines a Python module (PYBIND11_MODULE) and nothing registers "
        f"ops with torch, but a compiled Extension's ops are found as torch.ops.{namespace}.<op>, so none would be "
        f"after its build. Register them instead: TORCH_LIBRARY({namespace}, m) {{ m.def(\"f(Tensor x) -> Tensor\"); }} "
        f"and TORCH_LIBRARY_IMPL({namespace}, CPU, m) {{ m.impl(\"f\", &f); }} (docs/migrating.md shows it), or load "
        f"the module as it is: set `python_module = True` on the extension (its functions are then the loaded "
        f"kernel's), or call opforge.load({name!r}, sources)"
    )


def module_decision(name: str, sources: list[str]) -> Decision:
    """Can these sources be an extension declared ``python_module = True``: does one of them define
    the module (``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``)? Read before a build."""
    if scan(sources).python_module:
        return Accepted()
    return Rejected(
        f"{name} is declared a Python module (python_module = True), but none of its sources defines one: add "
        f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def(\"f\", &f); }} to a source, or drop python_module if the "
        "sources register torch ops (TORCH_LIBRARY)"
    )
