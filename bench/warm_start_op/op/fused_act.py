import os

from torch.utils.cpp_extension import load

from .flavour import CUDA

module_path = os.path.dirname(__file__)
fused = load(
    "fused",
    sources=[os.path.join(module_path, "fused_bias_act.cpp")]
    + ([os.path.join(module_path, "fused_bias_act_kernel.cu")] if CUDA else []),
    extra_cflags=["-DOP_CUDA"] if CUDA else [],
)


def fused_leaky_relu(x, bias):
    return fused.fused_bias_act(x, bias)
