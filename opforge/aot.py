"""Ahead-of-time builds for other packages: opforge as the build layer of a library's kernels.

A package declares its loaders and extensions (setting ``aot_package`` to a package of its
own, such as ``"myops._C"``), and in its ``setup.py``::

    from setuptools import setup
    from opforge.aot import setup_extensions
    from myops.kernels import ScaleAddLoader

    setup(**setup_extensions([ScaleAddLoader], env="MYOPS_BUILD"))

``MYOPS_BUILD=all pip install --no-build-isolation .`` (or a comma list of kinds and
extension names) then compiles them into ``myops/_C`` with a ``build_info.json`` record; a
plain ``pip install .`` compiles nothing. At run time the loaders look there first (each
binary checked against the running torch), then in the JIT cache, then build. With an
``opforge.kernels`` entry point naming the module that declares the loaders, ``opforge
report`` and ``opforge build`` list the package's kernels too. ``examples/downstream_pkg``
is a complete example.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import settings as settings_mod
from .build import aot as _aot


def setup_extensions(loaders: Iterable[type], env: str, request: str | None = None) -> dict:
    """Keyword arguments for ``setuptools.setup()`` (``ext_modules``, ``cmdclass``) that build
    the compiled extensions of ``loaders`` that ``env`` (``MYPKG_BUILD``) names; ``{}`` when it
    is unset, ``0`` or ``none``. ``request`` overrides the variable's value."""
    from .extension import CompiledExtension
    from .prebuilt import PACKAGE

    exts = {e.name: e for cls in loaders for e in cls.extensions() if isinstance(e, CompiledExtension)}
    mine = sorted(e.name for e in exts.values() if e.aot_package == PACKAGE)
    if mine:
        raise TypeError(f"{', '.join(mine)} would be prebuilt into opforge's own package ({PACKAGE}) and "
                        f"looked for there: set `aot_package = \"<yourpkg>._C\"` on your extensions")
    packages = sorted({e.aot_package for e in exts.values()})
    request = settings_mod.build_request(env) if request is None else request
    return _aot.extension_kwargs(request, exts, env, packages[0].split(".")[0] if packages else env)


__all__ = ["setup_extensions"]
