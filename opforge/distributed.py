"""Loading under torch.distributed, for code that every rank runs together.

``opforge.load()`` and the kernel loaders need nothing from you: under a process group one
rank builds and the others wait on the cache's lock, without any collective (see
``opforge/engine/ranks.py`` for why that can't deadlock). :func:`build_once` is the
barrier-based variant, for a point in the program that all ranks reach::

    kernel = opforge.distributed.build_once(lambda: CPUAdamLoader().load())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from . import settings as settings_mod
from .engine import ranks

T = TypeVar("T")


def build_once(load: Callable[[], T], group=None) -> T:
    """**A collective**: every rank of ``group`` (default: the default group) must call it, at the
    same point, like ``torch.distributed.barrier``. The builder ranks (the local rank 0 of each
    node, or global rank 0 with ``OPFORGE_SHARED_CACHE=1``) call ``load()`` first, filling the cache;
    all ranks meet at a barrier; then the others call ``load()``, a warm load. A builder's error is
    raised on that rank after the barrier, so a failed build never leaves the others waiting.

    Without an initialised process group it is just ``load()``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return load()
    role = ranks.role(settings_mod.current())
    result: T | None = None
    error: BaseException | None = None
    if role.builds:
        try:
            result = load()
        except Exception as exc:  # raised after the barrier, so that no rank is left in it alone
            error = exc
    dist.barrier(group=group)
    if error is not None:
        raise error
    if role.builds:
        return result  # type: ignore[return-value]
    token = ranks.BUILDER_DONE.set(True)
    try:
        return load()
    finally:
        ranks.BUILDER_DONE.reset(token)
