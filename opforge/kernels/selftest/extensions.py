"""The selftest variants, best first: one per ISA, then the torch reference."""

from ... import isa
from ...extension import CppExtension, TorchExtension
from .loader import SelftestLoader


class _Selftest(CppExtension):
    kind = "selftest"
    include_dirs = ("../common/csrc",)  # opforge_stable.h
    sources = ("csrc/axpy.cpp",)
    stable_abi = "2.10"


@SelftestLoader.register_extension
class SelftestAvx512(_Selftest):
    name, priority, isa = "selftest_avx512", 40, isa.AVX512


@SelftestLoader.register_extension
class SelftestAvx2(_Selftest):
    name, priority, isa = "selftest_avx2", 30, isa.AVX2


@SelftestLoader.register_extension
class SelftestNeon(_Selftest):
    name, priority, isa = "selftest_neon", 30, isa.NEON


@SelftestLoader.register_extension
class SelftestScalar(_Selftest):
    name, priority, isa = "selftest_scalar", 10, isa.PORTABLE


@SelftestLoader.register_extension
class SelftestTorch(TorchExtension):
    name, kind, priority = "selftest_torch", "selftest", 0
    module = "opforge.kernels.selftest.reference"
