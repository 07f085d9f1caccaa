"""The loader of every opforge kernel kind: ``from opforge.kernel_loader import SelftestLoader``."""

from .kernels.bias_act import BiasActLoader
from .kernels.block_sparse import BlockSparseLoader
from .kernels.cpu_adam import CPUAdamLoader
from .kernels.native_launch import NativeLaunchLoader
from .kernels.selftest import SelftestLoader

__all__ = ["BiasActLoader", "BlockSparseLoader", "CPUAdamLoader", "NativeLaunchLoader", "SelftestLoader"]
