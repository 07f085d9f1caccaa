"""opforge's startup hook: ``OPFORGE_PATCH_TORCH=1 python train.py`` patches torch with no ``import opforge``.

opforge's wheel (and an editable install) puts ``opforge-patch-torch.pth`` in site-packages, one line
(:data:`PTH_LINE`) that Python's ``site`` runs at every start-up. With the variable unset or ``0`` the
line is a dict lookup and nothing is imported. Otherwise it imports this module, a top-level one so
that opforge's package (and torch) are not imported at start-up, and calls :func:`install`, which
puts an import hook first on ``sys.meta_path``. The hook waits for ``torch.utils.cpp_extension``:
when that module has run, and before the importer takes names from it (``from
torch.utils.cpp_extension import load`` gets the patched one), it imports opforge and calls
``opforge.patch.patch_by_setting()``, which reads the variable (a value other than 0 or 1 is a
``ValueError`` there) and patches. The hook then leaves ``sys.meta_path``.

Stdlib only, and no environment read here: ``opforge/settings.py`` reads the variable.
"""

from __future__ import annotations

import _thread
import sys

#: The module the hook waits for.
TARGET = "torch.utils.cpp_extension"
#: The startup file's name. ``site`` reads ``.pth`` files in name order: this one comes after an
#: editable install's ``__editable__.*.pth``, which makes this module importable.
PTH_NAME = "opforge-patch-torch.pth"
#: The startup file's one line. ``site`` runs a line that starts with ``import``.
PTH_LINE = ('import os; os.environ.get("OPFORGE_PATCH_TORCH", "0").strip() in ("", "0") or '
            '__import__("_opforge_startup").install()\n')

_LOCK = _thread.allocate_lock()  # not threading, whose import cost more than this module (bench/startup_hook.py)


def install() -> None:
    """Patch torch's ``load`` / ``load_inline`` as soon as ``torch.utils.cpp_extension`` is imported (now, if it is)."""
    if sys.modules.get(TARGET) is not None:
        _patch()
        return
    with _LOCK:
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    with _LOCK:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


class _Finder:
    """Finds nothing itself: gives the spec the other finders give :data:`TARGET` opforge's loader
    (``opforge.patch.loader_by_setting``: the stand-in's, or torch's then the patch), then leaves
    ``sys.meta_path``. A bad value of the variable fails that import (a ``ValueError``), and the next one the
    same way."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        from opforge.patch import loader_by_setting, stand_in

        spec = stand_in.spec_from_others(self, fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            loader = loader_by_setting(spec.loader)  # a bad value raises here, and this hook stays for the next try
            if loader is not None:
                spec.loader = loader
        uninstall()
        return spec

    def invalidate_caches(self) -> None:
        pass


def _patch() -> None:
    from opforge import patch

    patch.patch_by_setting()
