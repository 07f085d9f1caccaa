"""The bias_act variants, best first for each device: CUDA and Triton for GPU tensors, one C++
variant per CPU ISA for CPU tensors, then torch for any device. C++/CUDA ops take the flat,
one-layout tensors of ``compiled.py``; Triton and torch implement ``reference.py``'s contract. Then the
kind's companion, the C++ autograd node the eager path loads by itself (``native_autograd.py``)."""

from ...extension import CppExtension, CudaExtension, TorchExtension, TritonExtension
from .loader import BiasActLoader


class _BiasActCpp(CppExtension):
    kind = "bias_act"
    include_dirs = ("../common/csrc", "csrc")
    # the host code (the only TU with torch headers: the longest, so first), the checks and the
    # walk, the activation loops: three TUs built in parallel (csrc/bias_act_cpu.h)
    sources = ("csrc/bias_act.cpp", "csrc/bias_act_run.cpp", "csrc/bias_act_loops.cpp")
    stable_abi = "2.10"
    openmp = True


CPU_VARIANTS = BiasActLoader.register_cpu_variants(_BiasActCpp, "bias_act")


@BiasActLoader.register_extension
class BiasActCuda(CudaExtension):
    name, kind, priority = "bias_act_cuda", "bias_act", 60
    include_dirs = ("../common/csrc", "csrc")
    # the ops, the launch planning, and the kernels of each dtype: five TUs, built in parallel
    sources = ("csrc/bias_act_cuda.cpp", "csrc/bias_act_cuda_launch.cu", "csrc/bias_act_cuda_f32.cu",
               "csrc/bias_act_cuda_f16.cu", "csrc/bias_act_cuda_bf16.cu")
    stable_abi = "2.10"


@BiasActLoader.register_extension
class BiasActTriton(TritonExtension):
    name, kind, priority = "bias_act_triton", "bias_act", 50
    module = "opforge.kernels.bias_act.triton_impl"


@BiasActLoader.register_extension
class BiasActTorch(TorchExtension):
    name, kind, priority = "bias_act_torch", "bias_act", 0
    module = "opforge.kernels.bias_act.reference"


# -- the companion the eager path loads by itself (native_autograd.py), declared here: registering the kind
# imports no runtime code --


@BiasActLoader.register_companion
class BiasActAutograd(CppExtension):
    """Not a variant of the ``bias_act`` kind (the loader never chooses it): a companion the eager
    path loads by itself, prebuilt and built with the kind."""

    name, kind = "bias_act_autograd", "bias_act"
    include_dirs = ("../common/csrc",)  # opforge_library.h
    sources = ("csrc/bias_act_autograd.cpp",)
    optimize = ("-O2",)
    gpu_torch_only = True  # used for GPU tensors only (native_autograd.DEVICES); tests load it on the CPU by itself
    devices = ()  # its op takes the tensors of whichever variant it drives
