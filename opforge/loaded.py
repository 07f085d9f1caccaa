"""``LoadedKernel``: what a kernel loader returns, an implementation with its ops as attributes."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
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
    """``torch.ops.<namespace>`` for C++/CUDA, the module for triton/torch backends and for compiled
    extensions declared ``python_module = True``."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        try:
            return getattr(self.ops, attr)
        except AttributeError:
            if self.backend not in ("cpp", "cuda"):
                raise
            if type(self.ops) is ModuleType:  # python_module = True (torch.ops.<ns> is a subclass of ModuleType)
                names = sorted(n for n in dir(self.ops) if not n.startswith("_"))
                raise AttributeError(f"{self.name} ({self.path}) is a Python module with no function {attr!r}; its "
                                     f"PYBIND11_MODULE block defines: {', '.join(names) or 'nothing'}") from None
            namespace = getattr(self.ops, "name", "?")
            raise AttributeError(
                f"{self.name} ({self.path}) registers no op {attr!r} in torch.ops.{namespace}: check that its "
                f"TORCH_LIBRARY({namespace}, m) block defines it (the namespace is the extension's op_namespace or "
                "name, passed to its sources as OPFORGE_NS)") from None
