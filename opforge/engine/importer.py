"""Bringing a built binary into this process, as torch's ``load()`` does, without its staleness traps.

* The same binary asked for again is a dict hit: the module (or path) already returned.
* A Python module rebuilt from other sources (a notebook user edited one and loads again) is
  imported afresh: the first binary of a name under the plain name, each later one under
  ``<name>_v<N>.<name>``. The ``.<name>`` tail keeps CPython's init hook ``PyInit_<name>``;
  the new package part keeps pybind11 (>= 3), which hands back the module it already made
  for a spec name, from returning the old module. torch names its rebuilds ``<name>_v<N>``.
* A library (``is_python_module=False``) whose sources define operators (``TORCH_LIBRARY``)
  can't be loaded twice: the dispatcher refuses a second definition of a namespace, from a
  static initialiser, which aborts the process (torch's ``load()`` does that). A rebuilt one is
  refused with an error that says so, before it is opened.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterable

from ..errors import OpforgeError
from . import bindings

#: binary path -> what was returned for it.
_LOADED: dict[str, object] = {}
#: extension name -> the binaries opened under it in this process, in order.
_BY_NAME: dict[str, list[str]] = {}
_LOCK = threading.RLock()


def loaded(path: str):
    """What was returned for ``path`` in this process, or None."""
    return _LOADED.get(path)


def import_module(name: str, path: str, notice=None):
    """Import the Python extension module at ``path`` (built as ``name``)."""
    with _LOCK:
        if path in _LOADED:
            return _LOADED[path]
        earlier = _BY_NAME.setdefault(name, [])
        spec_name = f"{name}_v{len(earlier)}.{name}" if earlier else name
        if earlier and notice is not None:
            notice(f"{name} was rebuilt from other sources: importing the new build as {spec_name} (the "
                   f"module imported before, from {earlier[-1]}, is unchanged)")
        module_spec = importlib.util.spec_from_file_location(spec_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        earlier.append(path)
        _LOADED[path] = module
        return module


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
