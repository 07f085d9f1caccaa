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
that hands torch's module to :func:`loader_by_setting` as it is imported, before the importer (``from
torch.utils.cpp_extension import load`` included) takes its names. ``import opforge`` does the same
(at once when torch's module is already imported), for a process that runs opforge from a source
tree with no startup hook. The setting's patch is one patch, however many times it is applied.

**Torch's module as a stand-in.** Patched before ``torch.utils.cpp_extension`` is first imported (by
the variable, or by ``patch_torch()``), its import costs opforge's, not setuptools': the module is a
stand-in (``stand_in.py``) that answers what libraries ask of it at a warm start (``answers.py``:
``load``, ``load_inline``, ``CUDA_HOME``, ``include_paths``, ``verify_ninja_availability``,
``_get_build_directory``...) and runs torch's own code in the same module object the first time
anything else is touched (``BuildExtension``, ``CppExtension``, ``CUDAExtension``...), the patch then
routing its ``load`` and ``load_inline`` as on the real module. For a torch whose module the answers
were not checked against, or a ROCm one, the real module is imported and patched. ``importlib.reload``
of the module runs torch's code again, as with torch alone; the patch is not applied to what it makes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import threading
from collections.abc import Callable

from .. import settings as settings_mod
from ..errors import CacheError, LockTimeoutError
from ..notices import warn_once
from . import answers as answers_mod
from . import stand_in

_LOCK = threading.RLock()
_ORIGINALS: dict[str, Callable] = {}
"""torch's own ``load`` and ``load_inline``, taken when they are replaced on the real module."""
_DEPTH = [0]
_BY_SETTING = [False]
_TORCH_MODULE = stand_in.TARGET
_ROUTED = ("load", "load_inline")

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
    with _LOCK:
        _DEPTH[0] += 1
        if _DEPTH[0] == 1:
            try:
                _apply()
            except BaseException:
                _DEPTH[0] = 0
                raise
    return Patched()


def unpatch_torch() -> None:
    """Put torch's own ``load`` / ``load_inline`` back, however many patches are in force."""
    with _LOCK:
        _restore()


def is_patched() -> bool:
    return _DEPTH[0] > 0


def patch_by_setting() -> bool:
    """``OPFORGE_PATCH_TORCH=1``: patch now, once for the setting (``import opforge`` calls this when torch's
    module is imported already). False when the variable is off; a value other than 0 or 1 is a
    ``ValueError``."""
    if not settings_mod.current().patch_torch:
        return False
    with _LOCK:
        if _BY_SETTING[0]:
            return True
        _BY_SETTING[0] = True
    patch_torch()
    return True


def loader_by_setting(real_loader):
    """The loader for ``torch.utils.cpp_extension`` as it is first imported with ``OPFORGE_PATCH_TORCH`` set
    (the startup hook's import hook and ``import opforge``'s call this): the stand-in's, or where it isn't
    offered one that runs torch's module and patches it. None with the variable off, or when the setting's
    patch is in force already (torch's own loader); a bad value is a ``ValueError``, which fails the import."""
    if not settings_mod.current().patch_torch:
        return None
    with _LOCK:
        if _BY_SETTING[0]:
            return None
        _BY_SETTING[0] = True
        _DEPTH[0] += 1
    return _loader(real_loader)


def follow_setting() -> None:
    """At ``import opforge`` with ``OPFORGE_PATCH_TORCH=1``: patch when ``torch.utils.cpp_extension`` is first
    imported (unless the startup hook waits for it already), or now if it has been; without importing torch."""
    if sys.modules.get(_TORCH_MODULE) is None:
        waiting = any(type(f).__module__ == "_opforge_startup" or isinstance(f, stand_in.Finder)
                      for f in sys.meta_path)
        if not waiting:
            stand_in.install_finder(loader_by_setting)
        return
    patch_by_setting()


def original(name: str) -> Callable:
    """torch's own ``load`` or ``load_inline``, patched or not (runs torch's module if it is a stand-in)."""
    with _LOCK:
        if name in _ORIGINALS:
            return _ORIGINALS[name]
    module = sys.modules.get(_TORCH_MODULE) or importlib.import_module(_TORCH_MODULE)
    stand_in.realize(module)
    with _LOCK:
        return _ORIGINALS.get(name) or getattr(module, name)


def _loader(real_loader):
    """The stand-in's loader where it is offered for this torch, else one that runs torch's module and
    patches it."""
    import torch

    if answers_mod.offered(torch):
        return _PatchingLoader(real_loader)
    return stand_in.StandInLoader(real_loader, _fill, _on_real)


class _PatchingLoader:
    """torch's own loader, then the patch, before the module is handed to its importer."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _on_real(module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...: torch's loader's
        return getattr(self._loader, name)


def _apply() -> None:
    """Route torch's functions (under ``_LOCK``, at the first patch): on a stand-in, made now if torch's module
    isn't imported yet, else on the real module."""
    module = sys.modules.get(_TORCH_MODULE)
    if module is None:
        finder = stand_in.install_finder(_loader)
        try:
            module = importlib.import_module(_TORCH_MODULE)
        finally:
            stand_in.remove_finder(finder)
        if stand_in.is_stand_in(module):
            return  # its loader's _fill routed it
    if stand_in.is_stand_in(module):
        _route_stand_in(module)
    else:
        _route_real(module)


def _restore() -> None:
    module = sys.modules.get(_TORCH_MODULE)
    _DEPTH[0] = 0
    _BY_SETTING[0] = False
    if module is not None and stand_in.is_stand_in(module):
        for name in _ROUTED:  # torch's own, run when called: not torch's module now
            module.__dict__[name] = _torch_own(module, name)
    elif module is not None:
        for name, fn in _ORIGINALS.items():
            setattr(module, name, fn)
    _ORIGINALS.clear()


def _release() -> None:
    with _LOCK:
        if _DEPTH[0] == 1:
            _restore()
        elif _DEPTH[0] > 1:
            _DEPTH[0] -= 1


def _ours() -> dict[str, Callable]:
    from ..engine.inline import load_inline
    from ..engine.jit import load

    return {"load": load, "load_inline": load_inline}


def _route_real(module) -> None:
    ours = _ours()
    for name in _ROUTED:
        theirs = getattr(module, name)
        _ORIGINALS[name] = theirs
        setattr(module, name, _routed(name, theirs, ours[name]))


def _route_stand_in(module) -> None:
    ours = _ours()
    for name in _ROUTED:
        module.__dict__[name] = _routed(name, _torch_own(module, name), ours[name], binding=ours[name])


def _on_real(module) -> None:
    """torch's code has run in ``module`` (a stand-in realized, or the real module under the setting): route
    its functions if the patch is in force."""
    with _LOCK:
        if _DEPTH[0] > 0:
            _route_real(module)


def _fill(module) -> None:
    """The stand-in's answers (``answers.py``), under the environment as it is at the module's import."""
    import torch

    s = settings_mod.current()
    known = answers_mod.Answers(torch, module.__file__, s, lambda: _gpus_visible(s))

    def real():
        stand_in.realize(module)
        return module

    def include_paths(device_type: str = "cpu", torch_include_dirs=True) -> list[str]:
        if device_type not in ("cpu", "cuda"):
            return real().include_paths(device_type, torch_include_dirs)
        return known.include_paths(module.CUDA_HOME, device_type, torch_include_dirs)

    def library_paths(device_type: str = "cpu", torch_include_dirs: bool = True,
                      cross_target_platform: str | None = None) -> list[str]:
        if device_type not in ("cpu", "cuda") or cross_target_platform is not None:
            return real().library_paths(device_type, torch_include_dirs, cross_target_platform)
        return known.library_paths(module.CUDA_HOME, device_type, torch_include_dirs)

    names = module.__dict__
    names["__opforge_lazy__"] = {"CUDA_HOME": known.cuda_home, "ROCM_HOME": known.rocm_home}
    names.update(include_paths=include_paths, library_paths=library_paths,
                 is_ninja_available=known.is_ninja_available,
                 verify_ninja_availability=known.verify_ninja_availability,
                 _get_build_directory=known.get_build_directory,
                 _import_module_from_library=known.import_module_from_library)
    with _LOCK:
        if _DEPTH[0] > 0:
            _route_stand_in(module)
        else:
            for name in _ROUTED:
                names[name] = _torch_own(module, name)


_OWN: dict[str, tuple[object, Callable]] = {}
"""name -> (the stand-in, its ``_torch_own`` function): one function a name, so that what the routed one
says it routes (``__opforge_routes__``) is what an unpatch puts back."""


def _torch_own(module, name: str) -> Callable:
    """torch's ``name`` on a stand-in: runs torch's module when called, then its function."""
    with _LOCK:
        held = _OWN.get(name)
        if held is not None and held[0] is module:
            return held[1]

    @functools.wraps(_ours()[name])
    def call(*args, **kwargs):
        stand_in.realize(module)
        with _LOCK:
            fn = _ORIGINALS.get(name) or module.__dict__[name]
        return fn(*args, **kwargs)

    call.__module__ = _TORCH_MODULE
    del call.__wrapped__
    with _LOCK:
        _OWN[name] = (module, call)
    return call


def _gpus_visible(s: settings_mod.Settings) -> bool:
    """Would CUDA find a GPU in this process? Asked of NVML (or the cache's record of it), not of CUDA."""
    from .. import nvml
    from ..engine import gpu_record

    gpus = gpu_record.listed(s.cache_dir)
    if gpus is None:
        return False
    return bool(nvml.visible_capabilities(s.cuda_visible_devices, gpus, s.cuda_device_order))


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


def _routed(name: str, theirs: Callable, ours: Callable, binding: Callable | None = None) -> Callable:
    """``ours`` under torch's name, taking torch's arguments, bound against ``binding``'s signature (by default
    ``theirs``, torch's own function; on a stand-in opforge's, which is torch's in torch's order); what opforge
    can't take goes to ``theirs``."""
    signature = inspect.signature(binding or theirs)
    our_signature = inspect.signature(ours)

    @functools.wraps(binding or theirs)
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

    if binding is not None:
        routed.__module__ = _TORCH_MODULE
        del routed.__wrapped__
    routed.__opforge_routes__ = theirs
    return routed


__all__ = ["Patched", "follow_setting", "is_patched", "loader_by_setting", "original", "patch_by_setting", "patch_torch",
           "unpatch_torch"]
