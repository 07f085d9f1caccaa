"""The block_sparse variants, best first: torch (gather + batched matmul) for any device, the
reference the GPU kernels are checked against."""

from ...extension import TorchExtension
from .loader import BlockSparseLoader


@BlockSparseLoader.register_extension
class BlockSparseTorch(TorchExtension):
    name, kind, priority = "block_sparse_torch", "block_sparse", 0
    module = "opforge.kernels.block_sparse.reference"
