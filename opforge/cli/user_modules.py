"""``--import MODULE``: import the user's own module before a command looks at the kernel kinds, so
the loaders it defines (with no ``opforge.kernels`` entry point) are reported and built too."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys


def add_option(parser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (a dotted name, found from the current directory too, or a path "
                             "to a .py file) so that the kernel loaders it defines are included; repeatable")


def import_all(names: list[str]) -> str | None:
    """Import each; None when all imported, else the first failure, as a message."""
    for name in names:
        try:
            if name.endswith(".py") or os.sep in name:
                _import_file(name)
            else:
                if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` does
                    sys.path.insert(0, os.getcwd())
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (the user's module: report what it raised)
            return f"--import {name}: {type(exc).__name__}: {exc}"
    return None


def _import_file(path: str) -> None:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # classes defined in it name it as their module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
