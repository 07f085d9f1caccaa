"""``Extension``: one implementation of one kernel kind, and how to get it loaded.

An extension declares what it is (``name``, ``kind``, ``backend``, ``priority``), what it
is built from (sources, include dirs, flags), whether it can be built ahead of time
(``support_aot``) and just in time (``support_jit``), and two checks that read only a
:class:`~opforge.platform.Platform`:

* ``is_available(platform)``: is the hardware it needs here (an ISA, a GPU)?
* ``check_compatible(platform)``: can it be built and run with this software (torch,
  CUDA, triton)?

The subclasses keep a kernel's declaration to a few lines::

    @SelftestLoader.register_extension
    class SelftestAvx2(CppExtension):
        name, kind, priority = "selftest_avx2", "selftest", 30
        isa = AVX2
        sources = ("csrc/axpy.cpp",)
        stable_abi = "2.10"

and ``SelftestLoader.register_cpu_variants(Base, "selftest")`` declares one such class per CPU ISA.

A compiled extension is found, in order: prebuilt in the package (``opforge/_C``, when it
was built against a torch this one can run), then the JIT cache, then a JIT build.
``load()`` returns a :class:`LoadedKernel`, whose attributes are the extension's ops.

The package: ``base.py`` (``Extension``), ``compiled.py`` (``CompiledExtension``, ``CppExtension``,
``CudaExtension``: built by the engine or at ``pip install``) and ``python.py`` (``TritonExtension``,
``TorchExtension``: nothing to build).
"""

from ..loaded import LoadedKernel
from ..notices import KernelFallbackWarning
from ..status import CACHED, FAILED, NEEDS_BUILD, PREBUILT, READY, Status
from .base import _LOADED, BACKENDS, Extension  # noqa: F401 (_LOADED: tests look at it)
from .compiled import CompiledExtension, CppExtension, CudaExtension
from .python import PythonExtension, TorchExtension, TritonExtension

__all__ = ["BACKENDS", "CACHED", "FAILED", "NEEDS_BUILD", "PREBUILT", "READY", "CompiledExtension", "CppExtension",
           "CudaExtension", "Extension", "KernelFallbackWarning", "LoadedKernel", "PythonExtension", "Status",
           "TorchExtension", "TritonExtension"]
