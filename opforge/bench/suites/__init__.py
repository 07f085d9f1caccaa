"""The benchmark of each kernel family, by kind: ``SUITES["bias_act"]`` is a :class:`Suite`."""

from __future__ import annotations

from .base import Suite
from .bias_act import BiasActSuite
from .block_sparse import BlockSparseSuite
from .block_sparse_decode import BlockSparseDecodeSuite
from .cpu_adam import CPUAdamSuite
from .warm_start import WarmStartSuite

SUITES: dict[str, type[Suite]] = {s.kind: s for s in (CPUAdamSuite, BiasActSuite, BlockSparseSuite, BlockSparseDecodeSuite,
                                                        WarmStartSuite)}

__all__ = ["SUITES", "Suite"]
