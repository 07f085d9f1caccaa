"""DeepSpeed's own CPU Adam (``csrc/adam/cpu_adam.cpp``, a pybind11 module), declared for opforge:
one variant per CPU ISA, best first, and a pure-torch implementation of the same functions.

The C++ sources are DeepSpeed's, unchanged: ``setup.py`` copies them from the installed
``deepspeed`` package into ``dsadam/csrc`` (the wheel carries them, for the JIT path). Where
DeepSpeed's builder passes ``-march=native`` and one SIMD macro that it picks from the build
host's CPU, each variant here gets opforge's explicit ISA flags and the macro that matches them,
so one wheel runs on any x86 (or Arm) machine and the loader picks at run time."""

from opforge import CppExtension, KernelLoader, TorchExtension

#: DeepSpeed's SIMD macro (``simd.h``) for each of opforge's ISAs.
SIMD_MACRO = {"avx512": "__AVX512__", "avx2": "__AVX256__", "neon": "__NEON__", "portable": "__SCALAR__"}


class DSCPUAdamLoader(KernelLoader):
    kind = "dsadam_cpu_adam"


class _DeepSpeedCPUAdam(CppExtension):
    python_module = True  # PYBIND11_MODULE(TORCH_EXTENSION_NAME, m): the kernel's attributes are its functions
    sources = ("csrc/adam/cpu_adam.cpp", "csrc/adam/cpu_adam_impl.cpp")
    include_dirs = ("csrc/includes",)
    cflags = ("-Wno-reorder",)  # DeepSpeed's own, less -march=native and -g
    openmp = True
    aot_package = "dsadam._C"

    def compile_flags(self) -> list[str]:
        return [*super().compile_flags(), f"-D{SIMD_MACRO[self.isa.name]}"]


DSCPUAdamLoader.register_cpu_variants(_DeepSpeedCPUAdam, "dsadam_cpu_adam")


@DSCPUAdamLoader.register_extension
class DSCPUAdamTorch(TorchExtension):
    name, priority = "dsadam_cpu_adam_torch", 0
    module = "dsadam.reference"
