"""``LoadedKernel``: what a kernel loader returns, an implementation with its ops as attributes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoadedKernel:
    """A loaded implementation. Its attributes are the ops: ``k.axpy(x, y, 2.0)``."""

    name: str
    kind: str
    backend: str
    origin: str
    """``prebuilt``, ``cached``, ``built`` or ``python``."""
    path: str
    ops: Any
    """``torch.ops.<namespace>`` for C++/CUDA, the module for triton/torch backends."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            return getattr(self.ops, attr)
        except AttributeError:
            if self.backend not in ("cpp", "cuda"):
                raise
            namespace = getattr(self.ops, "name", "?")
            raise AttributeError(
                f"{self.name} ({self.path}) registers no op {attr!r} in torch.ops.{namespace}: check that its "
                f"TORCH_LIBRARY({namespace}, m) block defines it (the namespace is the extension's op_namespace or "
                "name, passed to its sources as OPFORGE_NS)") from None
