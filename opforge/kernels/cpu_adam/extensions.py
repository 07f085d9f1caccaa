"""The cpu_adam variants, best first: one per ISA, then torch."""

from ... import isa
from ...extension import CppExtension, TorchExtension
from .loader import CPUAdamLoader


class _CPUAdam(CppExtension):
    kind = "cpu_adam"
    include_dirs = ("../common/csrc",)  # opforge_stable.h
    sources = ("csrc/cpu_adam.cpp",)
    stable_abi = "2.10"
    openmp = True


@CPUAdamLoader.register_extension
class CPUAdamAvx512(_CPUAdam):
    name, priority, isa = "cpu_adam_avx512", 40, isa.AVX512


@CPUAdamLoader.register_extension
class CPUAdamAvx2(_CPUAdam):
    name, priority, isa = "cpu_adam_avx2", 30, isa.AVX2


@CPUAdamLoader.register_extension
class CPUAdamNeon(_CPUAdam):
    name, priority, isa = "cpu_adam_neon", 30, isa.NEON


@CPUAdamLoader.register_extension
class CPUAdamScalar(_CPUAdam):
    name, priority, isa = "cpu_adam_scalar", 10, isa.PORTABLE


@CPUAdamLoader.register_extension
class CPUAdamTorch(TorchExtension):
    name, kind, priority = "cpu_adam_torch", "cpu_adam", 0
    module = "opforge.kernels.cpu_adam.reference"
