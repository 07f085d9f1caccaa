"""triton, where it is installed; else stand-ins, so that a module of Triton kernels still imports
(``pytest --doctest-modules`` collects every module) although calling its kernels can't work.
The loader only uses such modules where triton is (``TritonExtension.check_compatible``).
Annotations in those modules are strings (``from __future__ import annotations``), never
evaluated, so ``tl.constexpr`` in a signature needs no stand-in."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    jit = triton.jit
    try:  # host-side TMA descriptors (triton >= 3.3)
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        TensorDescriptor = None
    try:  # programmatic dependent launch (triton >= 3.4): kernels call them only where launched so
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:
        gdc_launch_dependents = gdc_wait = None
except ImportError:
    triton = tl = TensorDescriptor = gdc_launch_dependents = gdc_wait = None

    def jit(fn):
        return fn

__all__ = ["TensorDescriptor", "gdc_launch_dependents", "gdc_wait", "jit", "tl", "triton"]
