"""Bringing a built binary into this process, as torch's ``load()`` does, without its staleness traps.

* The same binary asked for again is a dict hit: the module (or path) already returned.
* A Python module rebuilt from other sources (a notebook user edited one and loads again) is
  imported afresh: the first binary of a name under the plain name, each later one under
  ``<name>_v<N>.<name>``. The ``.<name>`` tail keeps CPython's init hook ``PyInit_<name>``;
  the new package part keeps pybind11 (>= 3), which hands back the module it already made
  for a spec name, from returning the old module. torch names its rebuilds ``<name>_v<N>``.
* A Python module is put in ``sys.modules`` under its extension name, as torch 1.x's loader left it,
  so ``load(...); importlib.import_module(name)`` works (StyleGAN's custom ops and their forks do
  that; torch 2.x's loader puts nothing there, and a pybind11 >= 3 module, initialised in two
  phases, doesn't put itself there either). After a rebuild the name holds the new build: the rule
  is that ``sys.modules[name]`` is what ``load()`` last returned for that name in this process (a
  build already imported, asked for again, takes the name back), because the user who edits a
  source and loads again, in a notebook or through a plugin loader, wants the import that follows
  to give the code they just built, as ``load()``'s own return does. The earlier module object
  stays valid for whoever holds it. A module of that name that opforge did not load (a package,
  a test's stand-in, torch's own build) is never replaced: the first time, a notice says so and
  ``load()``'s return value is the way to the build. A single-phase module puts itself in
  ``sys.modules`` while it is created, over whatever was there: what held the name is put back.
* A module that links torch's libraries is imported after torch (``import torch`` first, when the
  process hasn't): the binary carries no path to ``libc10.so`` and friends, which torch's import loads,
  and its functions hand tensors to and from torch's Python types. A script that calls ``opforge.load``
  before it imports torch gets what torch's ``load()`` gives it (which imports torch to be called).
* A library (``is_python_module=False``) whose sources define operators (``TORCH_LIBRARY``)
  can't be loaded twice: the dispatcher refuses a second definition of a namespace, from a
  static initialiser, which aborts the process (torch's ``load()`` does that). A rebuilt one is
  refused with an error that says so, before it is opened.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Iterable

from ..errors import OpforgeError
from . import bindings, elf

#: binary path -> what was returned for it.
_LOADED: dict[str, object] = {}
#: extension name -> the binaries opened under it in this process, in order.
_BY_NAME: dict[str, list[str]] = {}
#: extension name -> the module opforge last put in sys.modules under it.
_PUBLISHED: dict[str, object] = {}
#: names whose sys.modules slot holds a module opforge did not load (said once).
_FOREIGN_SAID: set[str] = set()
_LOCK = threading.RLock()


def import_module(name: str, path: str, notice=None, warn=None):
    """Import the Python extension module at ``path`` (built as ``name``) and put it in
    ``sys.modules[name]`` unless another module holds that name. ``notice`` gets what a verbose load
    says; ``warn`` what is always said (default: stderr), here once per name: a foreign module there."""
    with _LOCK:
        if path in _LOADED:
            module = _LOADED[path]
            _take_name(name, module, warn)
            return module
        earlier = _BY_NAME.setdefault(name, [])
        spec_name = f"{name}_v{len(earlier)}.{name}" if earlier else name
        if earlier and notice is not None:
            notice(f"{name} was rebuilt from other sources: importing the new build as {spec_name} (the "
                   f"module imported before, from {earlier[-1]}, is unchanged; {name} now names the new one)")
        module_spec = importlib.util.spec_from_file_location(spec_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        torch_first(path)
        holder = sys.modules.get(spec_name, _ABSENT)
        try:
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        finally:  # a single-phase module sets sys.modules[spec_name] itself while it is created
            if holder is _ABSENT:
                sys.modules.pop(spec_name, None)
            else:
                sys.modules[spec_name] = holder
        earlier.append(path)
        _LOADED[path] = module
        _take_name(name, module, warn)
        return module


_ABSENT = object()


def torch_first(path: str) -> None:
    """Import torch before the binary at ``path`` when it links torch's libraries and torch isn't imported."""
    if "torch" not in sys.modules and elf.needs_torch(path):
        import torch  # noqa: F401  (loads libc10.so, libtorch*.so: what the binary names)


def _take_name(name: str, module, warn) -> None:
    """``sys.modules[name] = module``, unless a module opforge did not load holds the name."""
    holder = sys.modules.get(name, _ABSENT)
    if holder is _ABSENT or holder is module or holder is _PUBLISHED.get(name):
        sys.modules[name] = _PUBLISHED[name] = module  # free, or opforge's own earlier build: the newer load takes it
        return
    if name not in _FOREIGN_SAID:
        _FOREIGN_SAID.add(name)
        (warn or _stderr)(
            f"sys.modules[{name!r}] already holds another module ({_describe(holder)}), so the {name} that opforge "
            f"loaded is not put there: use the module load() returns (importlib.import_module({name!r}) gives the "
            "other one)")


def _describe(module) -> str:
    where = getattr(module, "__file__", None)
    return f"from {where}" if where else repr(module)


def _stderr(message: str) -> None:
    print(f"opforge: {message}", file=sys.stderr, flush=True)


def load_library(name: str, path: str, sources: Iterable[str] = ()) -> str:
    """Load the library at ``path`` into the process (``torch.ops.load_library``), once. A second,
    different binary of ``name`` is refused when ``sources`` (or the headers beside them) define
    operators; one that only adds kernels (``TORCH_LIBRARY_IMPL``) or none is loaded."""
    with _LOCK:
        if path in _LOADED:
            return path
        earlier = _BY_NAME.setdefault(name, [])
        if earlier:
            sources = list(sources)
            found = bindings.scan([*sources, *bindings.headers_in(_dirs(sources))])
            if found.defines_ops:
                raise OpforgeError(
                    f"extension {name!r} was rebuilt from other sources, but its library is already loaded in this "
                    f"process (from {earlier[-1]}) and defines operators (TORCH_LIBRARY): torch registers an op "
                    f"namespace once per process, so the new build ({path}) is not loaded. Restart Python to use "
                    "it (it is cached: the next process loads it without compiling), or give the changed "
                    "version another extension name and op namespace."
                )
        import torch

        torch.ops.load_library(path)
        earlier.append(path)
        _LOADED[path] = path
        return path


def _dirs(paths: list[str]) -> list[str]:
    return [os.path.dirname(os.path.abspath(p)) for p in paths]
