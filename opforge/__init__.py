"""opforge: build, cache and load PyTorch kernels, ahead of time or just in time.

``opforge.load`` and ``opforge.load_inline`` are drop-ins for
``torch.utils.cpp_extension.load``/``load_inline`` over a content-addressed cache whose
warm path is a stat and an import.

``Extension`` declares one implementation of a kernel kind; ``KernelLoader`` picks the
best one for this machine and falls back, saying why (``opforge.kernel_loader``).

``opforge.patch_torch()`` routes torch's own ``load``/``load_inline`` through opforge, for
libraries that call them (DeepSpeed's and ColossalAI's builders, StyleGAN's custom ops).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .decision import Accepted, Decision, Rejected  # noqa: E402
from .engine.inline import load_inline  # noqa: E402
from .engine.jit import load  # noqa: E402
from .errors import (  # noqa: E402
    ArchiveError,
    BuildError,
    CacheError,
    LockTimeoutError,
    OpforgeError,
    ToolchainError,
    UnsafeCacheError,
)
from .extension import (  # noqa: E402
    CppExtension,
    CudaExtension,
    Extension,
    LoadedKernel,
    TorchExtension,
    TritonExtension,
)
from .loader import BEFORE_FOREIGN as _BEFORE_FOREIGN  # noqa: E402
from .loader import KernelLoader  # noqa: E402
from .notices import DeclarationWarning, KernelFallbackWarning  # noqa: E402
from .patch import patch_torch, unpatch_torch  # noqa: E402
from .process import reset  # noqa: E402
from .settings import current as _settings  # noqa: E402


def _own_families() -> None:
    from . import kernel_loader  # noqa: F401  (opforge's own kernel families register)


_BEFORE_FOREIGN.append(_own_families)  # before another package's loader or extension registers (loader.py)

if _settings().patch_torch:  # OPFORGE_PATCH_TORCH=1: torch's load/load_inline go through opforge (patch.py)
    from .patch import follow_setting as _follow_setting  # noqa: E402

    _follow_setting()

__all__ = [
    "load",
    "load_inline",
    "Accepted",
    "Decision",
    "Rejected",
    "Extension",
    "CppExtension",
    "CudaExtension",
    "TritonExtension",
    "TorchExtension",
    "KernelLoader",
    "KernelFallbackWarning",
    "DeclarationWarning",
    "reset",
    "patch_torch",
    "unpatch_torch",
    "LoadedKernel",
    "ArchiveError",
    "BuildError",
    "CacheError",
    "LockTimeoutError",
    "OpforgeError",
    "ToolchainError",
    "UnsafeCacheError",
]
