"""The loader of every opforge kernel kind: ``from opforge.kernel_loader import SelftestLoader``."""

from .kernels.cpu_adam import CPUAdamLoader
from .kernels.selftest import SelftestLoader

__all__ = ["CPUAdamLoader", "SelftestLoader"]
