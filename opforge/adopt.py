"""Extensions written the ColossalAI way, adopted as they are: ``Loader.register_extension(TheirClass)``.

ColossalAI's ``_CppExtension`` / ``_CudaExtension`` subclasses (and classes shaped like them) set
``name`` and ``priority`` in ``__init__`` and answer through methods: ``is_available()``,
``assert_compatible()``, ``sources_files()``, ``include_dirs()``, ``cxx_flags()``, ``nvcc_flags()``,
``build_jit()``, ``build_aot()``, ``load()``. The adapter makes one instance, reads the
declaration from those methods, and declares opforge extensions from it: a pybind11 module
(``python_module``) built by opforge's engine, so it gets the content-keyed cache, the locks that
die with their holder, the warm path, AOT and the report. Their ``build_jit``/``build_aot``/``load``
are not called: those call torch's ``load`` with a build directory of their own.

* Their checks run through ``checks.py``: ``is_available()``/``is_hardware_available()`` answer
  "is the hardware here", ``assert_compatible()``/``assert_hardware_compatible()`` "can it be built
  and run", and a failed assertion is ``Rejected(its message)``.
* Flags that break portability are fixed, with one notice (``DeclarationWarning``): ``-march=native``
  (a binary tuned to the build host, which crashes elsewhere) becomes one extension per CPU ISA of the
  class's own architecture, each with opforge's explicit flags: ``<name>_avx512``, ``_avx2`` and
  ``_scalar`` for an x86 class, ``_neon`` and ``_scalar`` for an Arm one, all four when nothing says
  which. The architecture is read from the class itself (``isa.declared_machine``): its flags
  (``-mavx2``, ``-march=armv8-a``), then the literals of its checks (ColossalAI's
  ``platform.machine() == "aarch64"``), then its names (``CpuAdamX86Extension``, ``cpu_adam_arm``).
  Of several ``-std=`` flags the last (the one the compiler would use) is kept.
* Sources are taken as ``sources_files()`` gives them: absolute (ColossalAI's are), or relative to the
  current directory, as torch's ``load`` would take them; the class needs no file of its own (one
  declared in a notebook or under ``python -c`` is adopted the same way).
* Priorities: theirs orders their classes (×100), the ISA orders a class's variants.
* A method that raises while the declaration is read (ColossalAI's ``include_dirs()`` wants
  ``CUDA_HOME``) rejects the extension with that error, rather than failing the registration.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import ClassVar

from . import checks
from . import isa as isa_mod
from .decision import Decision, Rejected, first_rejection
from .extension import CompiledExtension, CppExtension, CudaExtension, Extension
from .notices import DeclarationWarning, warn_once

#: What a class needs to be adopted: the methods that declare what it builds.
SHAPE = ("sources_files", "cxx_flags")
_NATIVE = ("-march=native", "-mtune=native", "-mcpu=native")
_ADOPTED: dict[tuple[type, str], list[type[Extension]]] = {}
_LOCK = threading.Lock()


def is_adoptable(cls) -> bool:
    """A class (not an opforge Extension) that declares its build the ColossalAI way."""
    return isinstance(cls, type) and not issubclass(cls, Extension) and all(callable(getattr(cls, m, None)) for m in SHAPE)


def clean_flags(flags) -> tuple[list[str], bool, list[str]]:
    """``flags`` less what breaks portability. Returns (flags, native, notes): ``native`` says a
    ``-march=native`` (or ``-mtune``/``-mcpu``) was dropped, ``notes`` what was dropped and why. Pure.

    >>> clean_flags(["-O3", "-std=c++14", "-std=c++17", "", "-march=native", "-fopenmp"])
    (['-O3', '-std=c++17', '-fopenmp'], True, ['-march=native (one variant per CPU ISA instead)', '-std=c++14 (-std=c++17 comes later)'])
    """
    flags = [str(f).strip() for f in (flags or []) if str(f).strip()]
    native = [f for f in flags if f in _NATIVE]
    stds = [i for i, f in enumerate(flags) if f.startswith("-std=")]
    kept = [f for i, f in enumerate(flags) if f not in _NATIVE and not (i in stds and i != stds[-1])]
    notes = [f"{f} (one variant per CPU ISA instead)" for f in dict.fromkeys(native)]
    notes += [f"{f} ({flags[stds[-1]]} comes later)" for f in dict.fromkeys(flags[i] for i in stds[:-1])]
    return kept, bool(native), notes


class AdoptedExtension:
    """Mixed into the extensions the adapter declares: their checks, then the ISA's."""

    adopted: ClassVar[object] = None
    """The instance of the adopted class that the declaration was read from."""
    adoption_error: ClassVar[str] = ""
    """What went wrong reading the declaration (a method that raised), if anything."""

    @classmethod
    def validate(cls) -> None:
        if cls.adoption_error and not cls.sources:  # rejected at selection with the error: no sources to check
            super(CompiledExtension, cls).validate()
            return
        super().validate()

    def is_available(self, platform) -> Decision:
        theirs = checks.run(self.adopted, checks.AVAILABLE, platform)
        if not theirs and any("Cuda" in k.__name__ for k in type(self.adopted).__mro__):
            theirs = Rejected(f"{theirs.reason} (it is a {_cuda_base(self.adopted)}: it needs CUDA, which "
                              "it looks for with torch.cuda.is_available() or FORCE_CUDA=1)")
        elif not theirs:
            theirs = Rejected(f"{theirs.reason} on this {getattr(platform, 'machine', '?')} machine")
        return first_rejection([theirs, super().is_available(platform)])

    def check_compatible(self, platform) -> Decision:
        if self.adoption_error:
            return Rejected(self.adoption_error)
        return first_rejection([checks.run(self.adopted, checks.COMPATIBLE[1:], platform),
                                super().check_compatible(platform)])


def _cuda_base(obj) -> str:
    return next(k.__name__ for k in type(obj).__mro__ if "Cuda" in k.__name__)


def _read(obj, method: str, errors: list[str]) -> list[str]:
    try:
        return [str(x) for x in (getattr(obj, method)() or []) if str(x).strip()]
    except Exception as exc:  # noqa: BLE001 (e.g. ColossalAI's include_dirs() without CUDA_HOME): rejects, later
        errors.append(f"{type(obj).__name__}.{method}() raised {type(exc).__name__}: {exc}")
        return []


def adopt(cls: type, kind: str) -> list[type[Extension]]:
    """The opforge extensions declared from ``cls`` for the kernel kind ``kind`` (made once per class
    and kind): one per CPU ISA of its architecture when its flags ask for ``-march=native``, else one."""
    with _LOCK:
        key = (cls, kind)
        if key not in _ADOPTED:
            _ADOPTED[key] = _declare(cls, kind)
        return _ADOPTED[key]


def _declare(cls: type, kind: str) -> list[type[Extension]]:
    where = f"{cls.__module__}.{cls.__qualname__}"
    try:
        obj = cls()
    except TypeError as exc:
        raise TypeError(f"{where} can't be adopted: opforge makes one instance with no arguments, as ColossalAI's "
                        f"loader does, and its __init__ refused ({exc})") from None
    name = getattr(obj, "name", "") or getattr(obj, "_name", "")
    errors: list[str] = []
    sources = _read(obj, "sources_files", errors)
    includes = _read(obj, "include_dirs", errors) if hasattr(obj, "include_dirs") else []
    raw_cflags = _read(obj, "cxx_flags", errors)
    cflags, native, notes = clean_flags(raw_cflags)
    cuda = any(os.path.splitext(s)[1] in (".cu", ".cuh") for s in sources)  # nvcc's flags matter only then
    nvcc_flags, _, cuda_notes = clean_flags(_read(obj, "nvcc_flags", errors) if cuda and hasattr(obj, "nvcc_flags")
                                            else [])
    openmp = "-fopenmp" in cflags
    base_attrs = {
        "kind": kind, "adopted": obj, "adoption_error": "; ".join(errors), "python_module": True,
        "sources": tuple(os.path.abspath(s) for s in sources), "include_dirs": tuple(os.path.abspath(d) for d in includes),
        "cflags": tuple(f for f in cflags if f != "-fopenmp"), "cuda_cflags": tuple(nvcc_flags), "openmp": openmp,
        "optimize": (), "support_aot": bool(getattr(obj, "support_aot", True)),
        "support_jit": bool(getattr(obj, "support_jit", True)),
        "aot_package": getattr(obj, "prebuilt_module_path", None) or f"{cls.__module__.split('.')[0]}._C",
        "__module__": cls.__module__, "__doc__": f"{where}, adopted by opforge (opforge/adopt.py).",
    }
    priority = int(getattr(obj, "priority", 0) or 0) * 100
    machine, why = None, ""
    if native and not cuda:  # one variant per CPU ISA: of its own architecture, when it says which
        machine, why = isa_mod.declared_machine(raw_cflags, _check_sources(cls),
                                                [cls.__name__, name, *isa_mod.source_names(sources)])
    if notes or cuda_notes:
        only = f"; its variants are for {machine} only: {why}" if machine else ""
        warn_once(f"{name} ({where}): opforge dropped {', '.join(dict.fromkeys(notes + cuda_notes))}{only}",
                  DeclarationWarning)
    if cuda:
        attrs = {**base_attrs, "name": name, "priority": priority + 50}
        return [type(cls.__name__, (AdoptedExtension, CudaExtension), attrs)]
    if not native:
        attrs = {**base_attrs, "name": name, "priority": priority + 10}
        return [type(cls.__name__, (AdoptedExtension, CppExtension), attrs)]
    return [type(f"{cls.__name__}_{suffix}", (AdoptedExtension, CppExtension),
                 {**base_attrs, "name": f"{name}_{suffix}", "priority": priority + rank, "isa": target})
            for suffix, target, rank in isa_mod.variants_for(machine)]


def _check_sources(cls: type) -> list[str]:
    """The source text of the checks ``cls`` answers with (``checks.AVAILABLE``/``COMPATIBLE``), for
    ``isa.declared_machine``; a check with no source to read (declared in a notebook cell, a builtin)
    says nothing."""
    texts = []
    for method in dict.fromkeys(getattr(cls, m, None) for m in (*checks.AVAILABLE, *checks.COMPATIBLE)):
        try:
            texts.append(inspect.getsource(method))
        except (OSError, TypeError):
            continue
    return texts


def describe(ext) -> str | None:
    """``module.Class`` of the class an extension was adopted from, or None (for the report)."""
    obj = getattr(ext, "adopted", None)
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


__all__ = ["AdoptedExtension", "adopt", "clean_flags", "describe", "is_adoptable"]
