"""Route torch's JIT through opforge, opt-in: ``opforge.patch_torch()``.

Most ops in the field are built by a library's own builder (DeepSpeed's ``OpBuilder.jit_load``,
ColossalAI's ``build_jit``, StyleGAN's ``custom_ops``), which calls
``torch.utils.cpp_extension.load`` or ``load_inline``. Patched, those two functions are
wrappers with torch's own signature that hand the call to :func:`opforge.load` /
:func:`opforge.load_inline` (same arguments, same results), so the library gets opforge's
content-addressed cache, its locks and its warm path without a line changed::

    import opforge
    opforge.patch_torch()                      # until opforge.unpatch_torch()
    with opforge.patch_torch():                # or for a block
        op = CPUAdamBuilder().load()
    # or OPFORGE_PATCH_TORCH=1: patched from `import opforge` on

A call opforge can't honour goes to torch's own function, with one notice (a
``KernelFallbackWarning``) that says why: SYCL arguments, CUDA sources on a ROCm torch (opforge
doesn't hipify), an argument this opforge doesn't know (a newer torch's), or an opforge error
(its input checks, a locked or unsafe cache, a failed build). So the patch never fails where
torch would have worked: at worst torch does the work, as it would have unpatched.

The functions are replaced on the ``torch.utils.cpp_extension`` module, which is where the
builders above look them up when they call. A module that did ``from torch.utils.cpp_extension
import load`` at its own import time, before the patch, keeps torch's function.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable

from .errors import OpforgeError
from .notices import warn_once

_LOCK = threading.Lock()
_ORIGINALS: dict[str, Callable] = {}
_DEPTH = [0]

#: torch's arguments for SYCL (Intel XPU) sources, which opforge does not build.
_SYCL = ("extra_sycl_cflags", "with_sycl", "sycl_sources")


class Patched:
    """What :func:`patch_torch` returns: as a context manager, the patch ends with the block (nested
    patches end with the outermost)."""

    def __enter__(self) -> Patched:
        return self

    def __exit__(self, *exc) -> None:
        _release()


def patch_torch() -> Patched:
    """Make ``torch.utils.cpp_extension.load`` / ``load_inline`` go through opforge (see the module)."""
    from torch.utils import cpp_extension

    from .engine.inline import load_inline
    from .engine.jit import load

    with _LOCK:
        if _DEPTH[0] == 0:
            for name, ours in (("load", load), ("load_inline", load_inline)):
                original = getattr(cpp_extension, name)
                _ORIGINALS[name] = original
                setattr(cpp_extension, name, _routed(name, original, ours))
        _DEPTH[0] += 1
    return Patched()


def unpatch_torch() -> None:
    """Put torch's own ``load`` / ``load_inline`` back, however many patches are in force."""
    with _LOCK:
        _restore()


def is_patched() -> bool:
    return _DEPTH[0] > 0


def original(name: str) -> Callable:
    """torch's own ``load`` or ``load_inline``, patched or not."""
    from torch.utils import cpp_extension

    return _ORIGINALS.get(name) or getattr(cpp_extension, name)


def _release() -> None:
    with _LOCK:
        if _DEPTH[0] == 1:
            _restore()
        elif _DEPTH[0] > 1:
            _DEPTH[0] -= 1


def _restore() -> None:
    from torch.utils import cpp_extension

    for name, fn in _ORIGINALS.items():
        setattr(cpp_extension, name, fn)
    _ORIGINALS.clear()
    _DEPTH[0] = 0


def unsupported(arguments: dict, ours: inspect.Signature, torch_hip: str | None) -> str:
    """Why opforge can't take a call with these (bound, torch-named) arguments; "" when it can. Pure.

    >>> import inspect
    >>> def ours(name, sources, with_cuda=None, extra_sycl_cflags=None): ...
    >>> sig = inspect.signature(ours)
    >>> unsupported({"name": "x", "sources": ["a.cpp"]}, sig, None)
    ''
    >>> unsupported({"name": "x", "sources": ["a.cpp"], "extra_sycl_cflags": ["-O2"]}, sig, None)
    'SYCL sources (extra_sycl_cflags) are not built by opforge'
    >>> unsupported({"name": "x", "sources": ["a.cpp"], "new_flag": True}, sig, None)
    "this opforge does not know torch's argument new_flag"
    >>> unsupported({"name": "x", "sources": ["k.cu"]}, sig, "6.2")
    "CUDA sources on a ROCm torch (HIP 6.2): opforge doesn't hipify"
    """
    for key in _SYCL:
        if arguments.get(key):
            return f"SYCL sources ({key}) are not built by opforge"
    for key in arguments:
        if key not in ours.parameters:
            return f"this opforge does not know torch's argument {key}"
    if torch_hip:
        sources = arguments.get("sources") or ()
        sources = [sources] if isinstance(sources, str) else list(sources)
        cuda = arguments.get("with_cuda") or arguments.get("cuda_sources") or any(
            str(s).endswith((".cu", ".cuh")) for s in sources)
        if cuda:
            return f"CUDA sources on a ROCm torch (HIP {torch_hip}): opforge doesn't hipify"
    return ""


def _routed(name: str, theirs: Callable, ours: Callable) -> Callable:
    signature = inspect.signature(theirs)
    our_signature = inspect.signature(ours)

    @functools.wraps(theirs)
    def routed(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return theirs(*args, **kwargs)  # torch's own message for a call that doesn't fit its signature
        import torch

        ext = bound.arguments.get("name")
        why = unsupported(bound.arguments, our_signature, getattr(torch.version, "hip", None))
        if not why:
            try:
                return ours(**bound.arguments)
            except (OpforgeError, ValueError) as exc:
                why = f"{type(exc).__name__}: {exc}"
        warn_once(f"opforge.patch_torch: {name}({ext!r}) goes to torch's own {name}: {why}")
        return theirs(*args, **kwargs)

    routed.__opforge_routes__ = theirs
    return routed


__all__ = ["Patched", "is_patched", "original", "patch_torch", "unpatch_torch"]
