"""Triton compiles at once, on a thread pool, before a tuning times its candidates (issue 35's first contact).

A first tuning used to wait for each candidate's compile in turn, as its timing loop came to it.
``TunedKernel._precompile`` (``triton_launch.py``) compiles a kernel's candidates at once in a
``compiling_ahead`` scope; ``triton_decode_plans.decode_route`` opens one scope around a first planning
pass, so its kernels' candidates all compile together. The scope is triton's async compile mode
(``triton_compat.async_compile_mode``) over a ``ThreadPoolExecutor`` of ``compile_threads`` threads
(``OPFORGE_TRITON_COMPILE_THREADS``); without that mode, or with one thread, nothing is compiled ahead and
each compile happens in the timing loop, as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import torch

from .. import settings
from .triton_compat import async_compile_mode, triton

_AHEAD: contextvars.ContextVar = contextvars.ContextVar("opforge_compiling_ahead", default=None)
"""The open ``compiling_ahead`` scope's async compile mode, or None."""


def active() -> bool:
    """Is a ``compiling_ahead`` scope open in this context?"""
    return _AHEAD.get() is not None


def jit_function():
    """triton's ``JITFunction`` (what can be compiled ahead), or ``()`` without triton (matches nothing)."""
    return getattr(getattr(triton, "runtime", None), "JITFunction", ())


def can_compile_ahead() -> bool:
    """Would compiling ahead help here: tuning on (else nothing is compiled ahead), triton's async compile
    mode, and more than one thread?"""
    return settings.current().triton_tuning != "off" and async_compile_mode() is not None and compile_threads(2) > 1


@contextlib.contextmanager
def compiling_ahead(device: int, candidates: int = 64):
    """A scope in which Triton compiles go to a thread pool at once, and which waits for them all as it
    closes. Within it, a ``TunedKernel.choose`` that would tune instead hands its candidates' compiles to
    the pool and returns its first candidate untimed, remembering nothing; so a caller that plans several
    kernels once inside it and again after it (``triton_decode_plans.decode_route``) has every candidate
    of every kernel compiled at once, and then tunes them in turn with nothing left to compile. Nested, or
    where compiles can't run at once (``can_compile_ahead``), it does nothing, and tuning happens inside."""
    threads = compile_threads(candidates)
    mode = async_compile_mode() if threads > 1 else None
    if mode is None or _AHEAD.get() is not None:
        yield
        return
    from concurrent.futures import ThreadPoolExecutor

    with torch.cuda.device(device), ThreadPoolExecutor(threads, thread_name_prefix="opforge-compile") as pool, \
            mode(pool, ignore_errors=True) as opened:
        token = _AHEAD.set(opened)
        try:
            yield
        finally:
            _AHEAD.reset(token)


def compile_threads(candidates: int) -> int:
    """Threads to compile ``candidates`` configs at once: ``OPFORGE_TRITON_COMPILE_THREADS``, else the CPUs
    this process may use, at most 16; never more than the candidates.

    >>> compile_threads(1)
    1
    """
    n = settings.current().triton_compile_threads
    if n is None:
        n = min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return max(1, min(n, candidates))


__all__ = ["active", "can_compile_ahead", "compile_threads", "compiling_ahead", "jit_function"]
