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
    # kernels run in triton's interpreter (TRITON_INTERPRET=1, read by triton when it decorates them):
    # one program after another, in order, so a kernel must not wait for a later program there
    INTERPRETED = tl.constexpr(bool(getattr(getattr(getattr(triton, "knobs", None), "runtime", None), "interpret",
                                            False)))
except ImportError:
    triton = tl = TensorDescriptor = gdc_launch_dependents = gdc_wait = None
    INTERPRETED = False

    def jit(fn):
        return fn

__all__ = ["INTERPRETED", "TensorDescriptor", "gdc_launch_dependents", "gdc_wait", "jit", "tl", "triton"]
