"""Which ``bias_act`` implementation serves tensors on a device, as an object with the
contract's three functions (``reference.py``): the loader's best for that device type, adapted
(``compiled.py``) when it is a C++ or CUDA variant."""

from __future__ import annotations

import threading

import torch

from ...process import forgets
from .compiled import Compiled
from .loader import BiasActLoader

_ADAPTED: dict[str, object] = {}
_LOCK = threading.Lock()


def adapt(kernel):
    """The contract over a loaded kernel: the module itself (torch, triton), or a ``Compiled``."""
    if kernel.backend not in ("cpp", "cuda"):
        return kernel.ops
    with _LOCK:
        found = _ADAPTED.get(kernel.name)
        if found is None:
            found = _ADAPTED[kernel.name] = Compiled(kernel)
        return found


_BY_DEVICE: dict[str, object] = {}


def implementation(device: torch.device | str, ext_name: str | None = None):
    """The implementation for tensors on ``device`` (``ext_name``: that one). The loader's
    choice per device type is kept for the process (``forget()`` drops it)."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if ext_name is None:
        found = _BY_DEVICE.get(kind)
        if found is None:
            found = _BY_DEVICE[kind] = adapt(BiasActLoader().load(device=kind))
        return found
    return adapt(BiasActLoader().load(ext_name=ext_name, device=kind))


def for_tensor(t: torch.Tensor):
    """``implementation(t.device)``, with the kept choice looked up first (the per-call path)."""
    found = _BY_DEVICE.get(t.device.type)
    return found if found is not None else implementation(t.device)


@forgets
def forget() -> None:
    """Choose again at the next call (``opforge.reset()``)."""
    _BY_DEVICE.clear()
    with _LOCK:
        _ADAPTED.clear()


__all__ = ["adapt", "for_tensor", "forget", "implementation"]
