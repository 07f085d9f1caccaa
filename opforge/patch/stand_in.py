"""``torch.utils.cpp_extension`` as a stand-in under the patch: torch's module is imported only when a name
it alone has is touched.

Under the patch, a library's warm start used to pay for torch's module before opforge's few milliseconds:
0.14 s here, 0.40-0.49 s on the H200 host as the issue measured (setuptools, Cython, ``_distutils_hack``). What the library asks
of it at a warm start is a few names (``answers.NAMES``: ``load``, ``CUDA_HOME``,
``verify_ninja_availability``, ``_get_build_directory``...). So the import gives a module object of
:class:`StandIn`, whose ``__dict__`` holds those answers, spec, ``__file__`` and all, as torch's would:

* any other name (``BuildExtension``, ``CppExtension``, ``CUDAExtension``, ``COMMON_NVCC_FLAGS``, ``__all__``,
  ``dir()``) runs torch's own module code into that same module object, once, under a lock (``realize``).
  Torch's values then replace the answers, the class becomes a plain module again, and ``on_real`` (the
  patch) puts the routed ``load`` / ``load_inline`` back over torch's;
* the module object is the one in ``sys.modules`` and on ``torch.utils``, so ``from torch.utils.cpp_extension
  import X`` works for every public name, a class's ``__module__`` finds it (pickling a ``BuildExtension``),
  ``inspect.getsource`` reads torch's file, and ``importlib.reload`` runs torch's code in it, now a plain
  module, as with torch alone (the patch is not applied to what the reload makes);
* a dunder that a module may lack (``__path__``, ``__wrapped__``...) is an ``AttributeError`` without running
  torch's code, as probes of every module in ``sys.modules`` expect.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable

TARGET = "torch.utils.cpp_extension"

_REAL_DUNDERS = frozenset({"__all__", "__getattr__"})
"""Dunders torch's module defines: reading one runs it; any other missing dunder is just missing."""


class StandIn(types.ModuleType):
    """The module object while torch's code hasn't run in it: a missing name runs it (``realize``)."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__") and name not in _REAL_DUNDERS:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        lazy = self.__dict__.get("__opforge_lazy__", {})
        if name in lazy:  # an answer computed on first use (CUDA_HOME), kept as torch keeps its constants
            value = lazy[name]()
            self.__dict__.setdefault(name, value)
            return self.__dict__[name]
        realize(self)
        return getattr(self, name)

    def __dir__(self):
        realize(self)
        return sorted(self.__dict__)

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name == "__spec__" and not isinstance(getattr(value, "loader", None), StandInLoader):
            _plain(self)  # importlib.reload with torch's own loader: its code runs in a plain module


class StandInLoader:
    """The module's loader: ``exec_module`` makes the stand-in (``fill`` puts the answers in); ``realize`` runs
    torch's code with ``real``, torch's own loader, then ``on_real``."""

    def __init__(self, real, fill: Callable[[types.ModuleType], None], on_real: Callable[[types.ModuleType], None]):
        self.real = real
        self.fill = fill
        self.on_real = on_real
        self.lock = threading.RLock()

    def create_module(self, spec):
        return StandIn(spec.name)

    def exec_module(self, module) -> None:
        with self.lock:
            self.fill(module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, get_code, ...: torch's loader's
        return getattr(self.real, name)


def is_stand_in(module) -> bool:
    """Is ``module`` a stand-in whose torch code hasn't run yet?"""
    return isinstance(module, StandIn)


def realize(module) -> None:
    """Run torch's module code in the stand-in ``module`` now (once; nothing when it has run)."""
    loader = getattr(module.__spec__, "loader", None)
    if not isinstance(loader, StandInLoader):
        if isinstance(module, StandIn):
            _plain(module)
        return
    with loader.lock:
        if isinstance(module, StandIn):
            _run_torch(module, loader)


def _plain(module) -> None:
    module.__dict__.pop("__opforge_lazy__", None)
    module.__class__ = types.ModuleType


def _run_torch(module, loader: StandInLoader) -> None:
    """torch's own code into ``module`` (under ``loader.lock``), which becomes a plain module, then ``loader.on_real``."""
    with loader.lock:
        lazy = module.__dict__.pop("__opforge_lazy__", None)
        try:
            loader.real.exec_module(module)
        except BaseException:
            if lazy is not None and isinstance(module, StandIn):
                module.__dict__["__opforge_lazy__"] = lazy  # still the stand-in: the next touch tries again
            raise
        module.__class__ = types.ModuleType
        loader.on_real(module)


class Finder:
    """On ``sys.meta_path``: gives :data:`TARGET` a :class:`StandInLoader` (``make_loader(real_loader)``, which
    may return another loader or None to leave torch's), then leaves ``sys.meta_path``. Finds nothing itself."""

    def __init__(self, make_loader: Callable):
        self.make_loader = make_loader

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        spec = spec_from_others(self, fullname, path, target)
        remove_finder(self)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            loader = self.make_loader(spec.loader)
            if loader is not None:
                spec.loader = loader
        return spec

    def invalidate_caches(self) -> None:
        pass


def spec_from_others(me, fullname, path, target):
    """The spec the other finders on ``sys.meta_path`` give ``fullname``."""
    for finder in list(sys.meta_path):
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def install_finder(make_loader: Callable) -> Finder:
    finder = Finder(make_loader)
    sys.meta_path.insert(0, finder)
    return finder


def remove_finder(finder) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


__all__ = ["TARGET", "Finder", "StandIn", "StandInLoader", "install_finder", "is_stand_in", "realize",
           "remove_finder", "spec_from_others"]
