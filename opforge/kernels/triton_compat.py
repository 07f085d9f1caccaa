"""triton, where it is installed; else stand-ins, so that a module of Triton kernels still imports
(``pytest --doctest-modules`` collects every module) although calling its kernels can't work.
The loader only uses such modules where triton is (``TritonExtension.check_compatible``).
Annotations in those modules are strings (``from __future__ import annotations``), never
evaluated, so ``tl.constexpr`` in a signature needs no stand-in."""

from __future__ import annotations

import inspect

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


def async_compile_mode():
    """triton's ``AsyncCompileMode`` (``triton.runtime._async_compile``, private; triton 3.6 has it with
    ``ignore_errors``): within ``with mode(executor, ignore_errors=True)``, a kernel's ``warmup`` hands its
    compile to the executor, and the mode waits for every compile as it closes (a failed one left out).
    None where triton is missing or runs kernels in its interpreter, or the module or its argument isn't
    there: callers then compile in turn (``triton_launch.TunedKernel._precompile``; the test:
    tests/kernels/test_triton_compile_threads.py)."""
    if triton is None or INTERPRETED.value:
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return None
    try:
        inspect.signature(AsyncCompileMode).bind(None, ignore_errors=True)
    except TypeError:
        return None
    return AsyncCompileMode


__all__ = ["INTERPRETED", "TensorDescriptor", "async_compile_mode", "gdc_launch_dependents", "gdc_wait", "jit", "tl",
           "triton"]
