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
    # or OPFORGE_PATCH_TORCH=1 python train.py: no code at all (see "The variable" below)

**What goes to torch.** A call opforge can't take goes to torch's own function, with one notice (a
``KernelFallbackWarning``) that says why:

* SYCL arguments, CUDA sources on a ROCm torch (opforge doesn't hipify), an argument this opforge
  doesn't know (a newer torch's);
* a ``ValueError`` from opforge's input checks, which are stricter than torch's (an extension
  name that is no identifier, a source listed twice);
* a ``CacheError`` (the cache root can't be written, or another user could write it:
  ``UnsafeCacheError``) or a ``LockTimeoutError`` (another process held the build lock past
  ``OPFORGE_LOCK_TIMEOUT``): the trouble is opforge's cache, which torch doesn't use; its own
  build directory may do.

Every other ``OpforgeError`` is the answer, raised as it is, because torch would fail the same way
after doing the work again: a ``BuildError`` (the compiler rejected the source: handing it on made
torch compile the same source again, 28.6 s instead of 8 s, with the error printed twice), a
``ToolchainError`` (no compiler, nvcc or ninja; nvcc of another CUDA major than torch's; CUDA
sources with a CPU torch: torch needs the same tools and refuses the same mismatch), and a rebuilt
library that defines operators (torch would load it and abort the process).

**Where the patch takes.** The functions are replaced on the ``torch.utils.cpp_extension`` module,
which is where the builders above look them up when they call. A module that did ``from
torch.utils.cpp_extension import load`` at its own import time, before ``patch_torch()``, keeps
torch's function.

**The variable.** ``OPFORGE_PATCH_TORCH=1`` patches from the first import of
``torch.utils.cpp_extension`` on, in a process that never imports opforge: a startup hook installed
with the package (``opforge-patch-torch.pth``, a line that reads the variable and, only when it is
set, imports the stdlib-only ``_opforge_startup`` module) puts an import hook on ``sys.meta_path``
that calls :func:`patch_by_setting` as soon as torch's module has run, before the importer (``from
torch.utils.cpp_extension import load`` included) takes its names. ``import opforge`` does the same
(at once when torch's module is already imported), for a process that runs opforge from a source
tree with no startup hook. The setting's patch is one patch, however many times it is applied.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable

from . import settings as settings_mod
from .errors import CacheError, LockTimeoutError
from .notices import warn_once

_LOCK = threading.Lock()
_ORIGINALS: dict[str, Callable] = {}
_DEPTH = [0]
_BY_SETTING = [False]
_TORCH_MODULE = "torch.utils.cpp_extension"

#: opforge's errors that send a call to torch (see the module): opforge's cache is the trouble.
TO_TORCH = (ValueError, CacheError, LockTimeoutError)

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


def patch_by_setting() -> bool:
    """``OPFORGE_PATCH_TORCH=1``: patch now, once for the setting (the startup hook and ``import opforge``
    both call this). False when the variable is off; a value other than 0 or 1 is a ``ValueError``."""
    if not settings_mod.current().patch_torch:
        return False
    with _LOCK:
        if _BY_SETTING[0]:
            return True
        _BY_SETTING[0] = True
    patch_torch()
    return True


def follow_setting() -> None:
    """At ``import opforge`` with ``OPFORGE_PATCH_TORCH=1``: patch when ``torch.utils.cpp_extension`` is first
    imported (through the startup module's import hook, which the ``.pth`` line may have installed
    already), or now if it has been; without importing torch."""
    if sys.modules.get(_TORCH_MODULE) is None:
        try:
            import _opforge_startup
        except ImportError:  # opforge's package without its startup module: patch now
            patch_by_setting()
            return
        _opforge_startup.install()
        return
    patch_by_setting()


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
    _BY_SETTING[0] = False


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
            except TO_TORCH as exc:  # any other error of opforge's is the answer (see the module)
                why = f"{type(exc).__name__}: {exc}"
        warn_once(f"opforge.patch_torch: {name}({ext!r}) goes to torch's own {name}: {why}")
        return theirs(*args, **kwargs)

    routed.__opforge_routes__ = theirs
    return routed


__all__ = ["Patched", "follow_setting", "is_patched", "original", "patch_by_setting", "patch_torch", "unpatch_torch"]
