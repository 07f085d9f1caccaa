"""Every opforge kernel kind's loader, and their base class, where ColossalAI keeps them:
``from opforge.kernel_loader import KernelLoader, CPUAdamLoader`` reads as
``from colossalai.kernel.kernel_loader import KernelLoader, CPUAdamLoader`` does (docs/migrating.md).
The base class lives in ``loader.py``, below the families that subclass it."""

from .kernels.bias_act import BiasActLoader
from .kernels.block_sparse import BlockSparseLoader
from .kernels.cpu_adam import CPUAdamLoader
from .kernels.native_launch import NativeLaunchLoader
from .kernels.selftest import SelftestLoader
from .loader import KernelLoader

__all__ = ["BiasActLoader", "BlockSparseLoader", "CPUAdamLoader", "KernelLoader", "NativeLaunchLoader", "SelftestLoader"]
