import os

from torch.utils.cpp_extension import load

from .flavour import CUDA

module_path = os.path.dirname(__file__)
upfirdn2d_op = load(
    "upfirdn2d",
    sources=[os.path.join(module_path, "upfirdn2d.cpp")]
    + ([os.path.join(module_path, "upfirdn2d_kernel.cu")] if CUDA else []),
    extra_cflags=["-DOP_CUDA"] if CUDA else [],
)


def upfirdn2d(x):
    return upfirdn2d_op.upsample2x(x)
