"""The block_sparse variants, best first: Triton for CUDA tensors (block sides 16-128, fp16,
bf16, fp32; anything else it hands to the torch path), then torch (gather + batched matmul)
for any device, the reference the GPU kernels are checked against."""

from ...extension import TorchExtension, TritonExtension
from . import cuda_decode, native_autograd  # noqa: F401  (register the companions: the C++ autograd node, the CUDA decode kernel)
from .loader import BlockSparseLoader


@BlockSparseLoader.register_extension
class BlockSparseTorch(TorchExtension):
    name, kind, priority = "block_sparse_torch", "block_sparse", 0
    module = "opforge.kernels.block_sparse.reference"


@BlockSparseLoader.register_extension
class BlockSparseTriton(TritonExtension):
    name, kind, priority = "block_sparse_triton", "block_sparse", 50
    module = "opforge.kernels.block_sparse.triton_impl"
