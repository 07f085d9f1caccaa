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
except ImportError:
    triton = tl = None

    def jit(fn):
        return fn

__all__ = ["jit", "tl", "triton"]
