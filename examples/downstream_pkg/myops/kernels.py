"""myops' kernels, declared for opforge: a loader for the kind and its implementations, best
first. This is all a package writes to get AOT at pip install, the JIT fallback, selection
with reasons, and `opforge report`."""

from opforge import CppExtension, KernelLoader, TorchExtension


class ScaleAddLoader(KernelLoader):
    kind = "myops_scale_add"


@ScaleAddLoader.register_extension
class ScaleAddCpp(CppExtension):
    name, priority = "myops_scale_add_cpp", 10
    sources = ("csrc/scale_add.cpp",)
    stable_abi = "2.10"  # LibTorch stable ABI only: one binary for torch 2.10 and later
    aot_package = "myops._C"  # prebuilt here by MYOPS_BUILD=... at pip install, looked for here at load


@ScaleAddLoader.register_extension
class ScaleAddTorch(TorchExtension):
    name, priority = "myops_scale_add_torch", 0
    module = "myops.reference"
