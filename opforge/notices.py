"""Warnings opforge gives its users: each message once per process, attributed to the user's line.

Two channels, so a user can filter one without the other:

* :class:`KernelFallbackWarning`: an implementation could not be used and the next one was
  taken (a failed build, a prebuilt binary passed over, a better variant this machine could run);
* :class:`DeclarationWarning`: opforge read an extension's declaration otherwise than it is
  written: it dropped a flag (``-march=native`` of an adopted class), or resolved the relative
  sources of a class that has no file (a notebook cell, ``python -c``) against the current directory.

A warning's location is what Python prints and what filters match on. opforge's warnings are
raised deep inside the loader, often under torch's dispatch or an import, so a fixed
``stacklevel`` would name opforge's or torch's code. :func:`user_stacklevel` walks out to the
first frame that belongs to neither.
"""

from __future__ import annotations

import os
import sys
import warnings


class KernelFallbackWarning(UserWarning):
    """An implementation could not be used, and the loader moved on to the next one."""


class DeclarationWarning(UserWarning):
    """opforge changed or completed an extension's declaration: a flag dropped, a directory assumed."""


_OPFORGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SEEN: set[str] = set()


def _internal(filename: str) -> bool:
    if filename.startswith((_OPFORGE_DIR, "<frozen importlib")):
        return True
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    return bool(torch_file) and filename.startswith(os.path.dirname(torch_file) + os.sep)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by this function's caller, name the
    first frame outside opforge and torch (the caller itself is level 1)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


def warn_once(message: str, category: type[Warning] = KernelFallbackWarning) -> None:
    """Warn with ``message`` the first time it is given in this process, at the user's line."""
    if message in _SEEN:
        return
    _SEEN.add(message)
    warnings.warn(message, category, stacklevel=user_stacklevel())
