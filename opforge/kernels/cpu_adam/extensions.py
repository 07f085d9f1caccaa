"""The cpu_adam variants, best first: one per CPU ISA, then torch."""

from ...extension import CppExtension, TorchExtension
from .loader import CPUAdamLoader


class _CPUAdam(CppExtension):
    kind = "cpu_adam"
    include_dirs = ("../common/csrc",)  # opforge_stable.h, opforge_simd.h
    sources = ("csrc/cpu_adam.cpp",)
    stable_abi = "2.10"
    openmp = True


VARIANTS = CPUAdamLoader.register_cpu_variants(_CPUAdam, "cpu_adam")


@CPUAdamLoader.register_extension
class CPUAdamTorch(TorchExtension):
    name, kind, priority = "cpu_adam_torch", "cpu_adam", 0
    module = "opforge.kernels.cpu_adam.reference"
