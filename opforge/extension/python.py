"""Extensions written in Python: triton kernels and the pure-torch reference. Nothing to build."""

from __future__ import annotations

import importlib
from typing import ClassVar

from ..decision import Accepted, Decision, Rejected
from ..loaded import LoadedKernel
from ..status import Status
from .base import Extension


class PythonExtension(Extension):
    """An implementation written in Python (triton kernels, torch ops): nothing to build."""

    module: ClassVar[str] = ""
    """Dotted path of the module that holds the ops."""

    @classmethod
    def validate(cls) -> None:
        super().validate()
        if not cls.module:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: set `module`, the dotted path of its ops module")

    def _load(self, platform, status: Status | None, verbose: bool) -> LoadedKernel:
        mod = importlib.import_module(self.module)
        return LoadedKernel(self.name, self.kind, self.backend, "python", getattr(mod, "__file__", "") or "", mod)


class TritonExtension(PythonExtension):
    backend = "triton"
    devices = ("cuda",)

    def is_available(self, platform) -> Decision:
        if not platform.gpus:
            return Rejected(f"needs a GPU; none found ({platform.gpu_probe})")
        return Accepted(platform.gpus[0].arch or platform.gpus[0].name)

    def check_compatible(self, platform) -> Decision:
        if platform.triton is None:
            return Rejected("triton is not installed: `pip install triton`")
        return Accepted(f"triton {platform.triton}")


class TorchExtension(PythonExtension):
    """Pure torch: the reference, and the fallback that always works."""

    backend = "torch"
