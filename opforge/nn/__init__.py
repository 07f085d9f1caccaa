"""opforge's modules: thin ``torch.nn.Module`` wrappers over ``opforge.ops``."""

from .bias_act import BiasAct
from .block_sparse import BlockSparseLinear, SparsifyReport, sparsify

__all__ = ["BiasAct", "BlockSparseLinear", "SparsifyReport", "sparsify"]
