"""``selftest``: ``axpy`` (alpha * x + y) built once per CPU ISA on the LibTorch stable ABI.

It is how ``opforge doctor --build`` and ``opforge build`` prove, in a couple of seconds,
that this machine can compile, link, load and run an opforge kernel; and how the AOT
tests prove that a wheel carries every x86 variant and loads the right one with no
compiler. ``simd_width()`` says which ISA the loaded binary was compiled for.
"""

from . import extensions  # noqa: F401  (registers the variants)
from .loader import SelftestLoader

__all__ = ["SelftestLoader"]
