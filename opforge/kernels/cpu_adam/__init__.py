"""``cpu_adam``: the Adam/AdamW step for parameters that live in CPU memory (ZeRO-Offload).

Variants, best first: AVX-512, AVX2 (x86), NEON (aarch64), portable C++, then torch (its
fused CPU Adam when the dtypes allow, else plain torch ops). The C++ is on the LibTorch
stable ABI, one source compiled per ISA with explicit flags, threaded with OpenMP.
"""

from . import extensions  # noqa: F401  (registers the variants)
from .loader import CPUAdamLoader

__all__ = ["CPUAdamLoader"]
