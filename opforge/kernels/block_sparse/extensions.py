"""The block_sparse variants, best first: Triton for CUDA tensors (block sides 16-128, fp16,
bf16, fp32; anything else it hands to the torch path), then torch (gather + batched matmul)
for any device, the reference the GPU kernels are checked against. Then the kind's companions, which
the variants load by themselves (``KernelLoader.register_companion``): the C++ autograd node
(``native_autograd.py``) and the CUDA decode kernel (``cuda_decode.py``)."""

from ...extension import CppExtension, CudaExtension, TorchExtension, TritonExtension
from .loader import BlockSparseLoader


@BlockSparseLoader.register_extension
class BlockSparseTorch(TorchExtension):
    name, kind, priority = "block_sparse_torch", "block_sparse", 0
    module = "opforge.kernels.block_sparse.reference"


@BlockSparseLoader.register_extension
class BlockSparseTriton(TritonExtension):
    name, kind, priority = "block_sparse_triton", "block_sparse", 50
    module = "opforge.kernels.block_sparse.triton_impl"


# -- companions: loaded by the variants themselves (declared here, beside the variants, so that registering
# the kind imports no runtime code; native_autograd.py and cuda_decode.py load them) --


@BlockSparseLoader.register_companion
class BlockSparseAutograd(CppExtension):
    """Not a variant of the ``block_sparse`` kind (the loader never chooses it): a companion the
    eager path loads by itself, prebuilt and built with the kind."""

    name, kind = "block_sparse_autograd", "block_sparse"
    include_dirs = ("../common/csrc",)  # opforge_library.h
    sources = ("csrc/block_sparse_autograd.cpp",)
    optimize = ("-O2",)
    gpu_torch_only = True  # used for GPU tensors only (native_autograd.DEVICES); tests load it on the CPU by itself
    devices = ()  # its op takes the tensors of whichever variant runs the launches


@BlockSparseLoader.register_companion
class BlockSparseDecodeCuda(CudaExtension):
    """Not a variant of the ``block_sparse`` kind (the loader never chooses it): a companion the
    Triton variant's decode route loads by itself, prebuilt and built with the kind."""

    name, kind = "block_sparse_decode_cuda", "block_sparse"
    include_dirs = ("../common/csrc", "csrc")
    # sm_90 built as sm_90a (engine.flags.ARCH_SPECIFIC, spelled out: registering imports no engine code): the
    # 64-token tile's wgmma; the host code (decode_cuda.cpp's token limit) sees the define too
    cflags = ("-DOPFORGE_ARCH_SPECIFIC=1",)
    cuda_cflags = ("-DOPFORGE_ARCH_SPECIFIC=1",)
    # the ops, the grid and launch, the kernels of each dtype: four TUs, built in parallel
    sources = ("csrc/decode_cuda.cpp", "csrc/decode_cuda_launch.cu", "csrc/decode_cuda_bf16.cu",
               "csrc/decode_cuda_f16.cu")
    stable_abi = "2.10"
    min_capability = (9, 0)
