"""ColossalAI's own CPU Adam extension classes, adopted by an opforge loader as they are.

``extensions`` is the directory of that name in ColossalAI's sdist (or ``colossalai.kernel.extensions``
in an installed ColossalAI); nothing in it is changed. opforge reads each class's declaration
(``sources_files()``, ``cxx_flags()``, ...), turns ``-march=native`` into one variant per CPU ISA,
and builds, caches and selects them; their checks (``is_available()``, ``assert_compatible()``)
decide, with their own messages, and a pure-torch version of the same API is the fallback."""

try:
    from extensions import CpuAdamArmExtension, CpuAdamX86Extension
except ImportError:  # an installed ColossalAI
    from colossalai.kernel.extensions import CpuAdamArmExtension, CpuAdamX86Extension

from opforge import KernelLoader, TorchExtension


class ColossalCPUAdamLoader(KernelLoader):
    kind = "colossal_cpu_adam"


ColossalCPUAdamLoader.register_extension(CpuAdamX86Extension)  # x86: needs CUDA's headers (and, by its check, a GPU)
ColossalCPUAdamLoader.register_extension(CpuAdamArmExtension)  # aarch64 only


@ColossalCPUAdamLoader.register_extension
class ColossalCPUAdamTorch(TorchExtension):
    name, priority, module = "colossal_cpu_adam_torch", 0, "cai_reference"
