"""The process's memory of its decisions, forgotten in one call: ``opforge.reset()``.

A module that keeps a decision for the life of the process (the loaders' picks, the
platform's facts and tool probes, bias_act's implementation per
device, block-sparse's launch plans and replay tables, tuned configs held in memory) registers
the function that forgets it with ``@forgets`` as it is imported; ``reset()`` calls them all.
A module not imported yet has nothing to forget. What ``reset()`` keeps: each extension's loaded
kernel (a binary can't be unloaded, and a second copy of it would register its ops twice), the
entry-point plugins imported, and everything on disk (the cache, tuned configs).

A leaf: every layer can register.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_FORGETTERS: list[Callable[[], None]] = []
_LOCK = threading.Lock()


def forgets(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` (no arguments) to run at ``reset()``; usable as a decorator."""
    with _LOCK:
        if fn not in _FORGETTERS:
            _FORGETTERS.append(fn)
    return fn


def reset() -> None:
    """Forget every decision this process made, so the next call decides again: for tests, and
    for a process whose environment (``OPFORGE_*``, ``PATH``, ``CXX``, ``CUDA_VISIBLE_DEVICES``)
    changed after opforge first looked."""
    with _LOCK:
        found = list(_FORGETTERS)
    for fn in found:
        fn()


__all__ = ["forgets", "reset"]
