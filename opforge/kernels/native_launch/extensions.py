"""The native_launch variants, best first: C++ (one portable build: it packs and launches, the
GPU code is the caller's), then Python, which defines recipes and packs them but launches
nothing, so every call misses and the caller's Python launch path runs."""

from ...extension import CppExtension, TorchExtension
from .loader import NativeLaunchLoader


@NativeLaunchLoader.register_extension
class NativeLaunchCpp(CppExtension):
    name, kind, priority = "native_launch_cpp", "native_launch", 50
    devices = ()  # the ops take any tensors: CUDA ones to launch, CPU ones to `pack` (tests)
    include_dirs = ("../common/csrc",)  # opforge_stable.h
    sources = ("csrc/native_launch.cpp",)
    ldflags = ("-ldl",)  # dlopen of libcuda.so.1 and libtorch_cuda.so at the first launch
    stable_abi = "2.10"


@NativeLaunchLoader.register_extension
class NativeLaunchPython(TorchExtension):
    name, kind, priority = "native_launch_python", "native_launch", 0
    module = "opforge.kernels.native_launch.reference"
