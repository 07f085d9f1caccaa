"""Every kernel kind and its loader: opforge's own families (``kernel_loader.py``) and those of
the packages that declare an ``opforge.kernels`` entry point.

This module sits above the kernel families (it imports them); ``loader.py``, below them, holds
the registration itself (``KernelLoader``, ``register_extension``), which the families call as
they are imported. Asking for every kind (``loaders()``) therefore lives here, not in
``loader.py``: there it would import the families that import it.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points

from . import kernel_loader  # noqa: F401  (opforge's own families register as they are imported)
from .extension import Extension
from .loader import KernelLoader, registered, registered_extension
from .notices import warn_once

ENTRY_POINTS = "opforge.kernels"
"""The entry point group through which other packages' kernels are found: each names a module
that declares loaders and extensions when imported (``myops = "myops.kernels"``)."""
_PLUGINS: list[str] = []
_PLUGINS_LOCK = threading.RLock()  # a plugin that calls loaders() while imported gets the list so far


def load_plugins() -> list[str]:
    """Import every ``opforge.kernels`` entry point once per process; one that fails to import
    is left out with a warning that says why. Returns the entry points imported."""
    with _PLUGINS_LOCK:
        if _PLUGINS:
            return _PLUGINS[1:]
        _PLUGINS.append("")  # the marker: done (also when an import below fails)
        for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
            try:
                ep.load()
            except Exception as exc:  # noqa: BLE001 (a broken package must not break opforge: say so, go on)
                warn_once(f"the {ENTRY_POINTS} entry point {ep.name!r} ({ep.value}) could not be imported, "
                          f"so its kernels are left out: {type(exc).__name__}: {exc}")
                continue
            _PLUGINS.append(f"{ep.name} = {ep.value}")
        return _PLUGINS[1:]


def loaders() -> dict[str, type[KernelLoader]]:
    """Every kernel kind with its loader: opforge's own, those of the packages that declare an
    ``opforge.kernels`` entry point, and any imported so far."""
    load_plugins()
    return registered()


def find_extension(name: str) -> type[Extension] | None:
    """The extension registered as ``name`` (every family and plugin imported first), or None."""
    loaders()
    return registered_extension(name)


__all__ = ["ENTRY_POINTS", "find_extension", "load_plugins", "loaders"]
