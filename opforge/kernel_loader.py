"""The loader of every opforge kernel kind: ``from opforge.kernel_loader import SelftestLoader``."""

from .kernels.selftest import SelftestLoader

__all__ = ["SelftestLoader"]
