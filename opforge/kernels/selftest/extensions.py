"""The selftest variants, best first: one per CPU ISA, then the torch reference."""

from ...extension import CppExtension, TorchExtension
from .loader import SelftestLoader


class _Selftest(CppExtension):
    kind = "selftest"
    include_dirs = ("../common/csrc",)  # opforge_stable.h
    sources = ("csrc/axpy.cpp",)
    stable_abi = "2.10"


VARIANTS = SelftestLoader.register_cpu_variants(_Selftest, "selftest")


@SelftestLoader.register_extension
class SelftestTorch(TorchExtension):
    name, kind, priority = "selftest_torch", "selftest", 0
    module = "opforge.kernels.selftest.reference"
