"""``KernelLoader``: a registry of extensions per kernel kind, a pure selection, and a
fallback that says why.

Each kernel kind has a subclass (``SelftestLoader``, later ``CPUAdamLoader``...). Its
extensions register with ``register_extension``, as a call or a class decorator.

``select(extensions, platform, statuses)`` (``selection.py``) is pure: facts in, ordered candidates
with their Decisions out. ``KernelLoader.load()`` walks that list:

1. the prebuilt binary in the package, if it was built for a torch that can run it;
2. the JIT cache;
3. a JIT build.

A failure warns once (``KernelFallbackWarning``) with the reason, and the next candidate
is tried; ``strict=True`` raises instead. The result is cached per process and the
lookup is thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import ClassVar

from . import adopt, checks
from . import prebuilt as prebuilt_mod
from . import settings as settings_mod
from .errors import OpforgeError
from .extension import Extension, LoadedKernel, Status
from .notices import warn_once
from .process import forgets
from .selection import Candidate, decide, fallback_notice, passed_over, select, toolchain_decision

BEFORE_FOREIGN: list = []
"""Callables run before another package's loader or extension registers. ``opforge/__init__.py``
installs one that imports opforge's own kernel families, so they register first and a clash
of names is refused at the newcomer's registration, not later at ``import opforge.optim``.
(A hook rather than an import here: the families import this module, so this module must not
import them.)"""


def _own_kernels_first(module: str) -> None:
    if module != "opforge" and not module.startswith("opforge."):
        for hook in BEFORE_FOREIGN:
            hook()


_LOADERS: dict[str, type[KernelLoader]] = {}
_NAMES: dict[str, type[Extension]] = {}
_REGISTRY_LOCK = threading.RLock()


class KernelLoader:
    """One subclass per kernel kind: ``class CPUAdamLoader(KernelLoader): kind = "cpu_adam"``."""

    kind: ClassVar[str] = ""
    uses: ClassVar[tuple[str, ...]] = ()
    """The kinds whose loaders this kind's variants load (block_sparse's Triton variant launches through
    ``native_launch``'s): prebuilt with it (``OPFORGE_BUILD=<kind>``) and built with it (``opforge build``)."""
    _extensions: ClassVar[list[type[Extension]]] = []
    _companions: ClassVar[list[type[Extension]]] = []
    _cache: ClassVar[dict[tuple, LoadedKernel]] = {}
    _lock: ClassVar[threading.RLock] = threading.RLock()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._extensions = []
        cls._companions = []
        cls._cache = {}
        cls._lock = threading.RLock()
        if cls.kind:
            _own_kernels_first(cls.__module__)
            with _REGISTRY_LOCK:
                other = _LOADERS.get(cls.kind)
                if other is not None and other.__qualname__ != cls.__qualname__:
                    raise TypeError(f"kernel kind {cls.kind!r} already has a loader: {other.__module__}.{other.__qualname__}; "
                                    "pick another kind, or register your extensions with that loader")
                _LOADERS[cls.kind] = cls

    @classmethod
    def register_extension(cls, ext_cls):
        """Add an implementation of this kind; usable as ``@Loader.register_extension``. A class written
        the ColossalAI way (``sources_files()``, ``cxx_flags()``, ...) is adopted (``opforge/adopt.py``)."""
        if adopt.is_adoptable(ext_cls):
            for made in adopt.adopt(ext_cls, cls.kind):
                cls.register_extension(made)
            return ext_cls
        if not (isinstance(ext_cls, type) and issubclass(ext_cls, Extension)):
            raise TypeError(f"{cls.__name__}.register_extension takes a subclass of opforge.Extension, or a class "
                            f"written the ColossalAI way (with sources_files() and cxx_flags()), not {ext_cls!r}")
        cls._enter(ext_cls, cls._extensions)
        return ext_cls

    @classmethod
    def register_companion(cls, ext_cls):
        """Add an extension this kind's variants load by themselves, outside the priority order (a C++
        autograd node, a CUDA kernel one of their routes may pick); usable as ``@Loader.register_companion``.
        ``load()`` never chooses it, but it is prebuilt with the kind (``OPFORGE_BUILD=<kind>``), built by
        ``opforge build <kind>`` and listed by ``opforge report``, so its first use compiles nothing either."""
        if not (isinstance(ext_cls, type) and issubclass(ext_cls, Extension)):
            raise TypeError(f"{cls.__name__}.register_companion takes a subclass of opforge.Extension, not {ext_cls!r}")
        cls._enter(ext_cls, cls._companions)
        return ext_cls

    @classmethod
    def _enter(cls, ext_cls, into: list) -> None:
        """Give ``ext_cls`` this kind (or refuse another), validate it and register its name (unique across
        kinds, variants and companions alike)."""
        if not ext_cls.kind:
            ext_cls.kind = cls.kind
        if ext_cls.kind != cls.kind:
            raise TypeError(f"{ext_cls.__qualname__} is of kind {ext_cls.kind!r}; register it with the "
                            f"loader of that kind, not {cls.__name__} ({cls.kind!r})")
        ext_cls.validate()
        _own_kernels_first(ext_cls.__module__)
        with _REGISTRY_LOCK:
            other = _NAMES.get(ext_cls.name)
            if other is not None and other is not ext_cls:
                raise ValueError(f"an extension named {ext_cls.name!r} is already registered "
                                 f"({other.__module__}.{other.__qualname__}); pick another name")
            if ext_cls in (cls._companions if into is cls._extensions else cls._extensions):
                raise ValueError(f"{ext_cls.__qualname__} is registered with {cls.__name__} as a variant and as a "
                                 "companion: it is one or the other")
            _NAMES[ext_cls.name] = ext_cls
            if ext_cls not in into:
                into.append(ext_cls)

    @classmethod
    def register_cpu_variants(cls, base: type[Extension], prefix: str) -> list[type[Extension]]:
        """Declare and register one subclass of ``base`` (a CppExtension) per CPU ISA
        (``isa.CPU_VARIANTS``): ``<prefix>_avx512``, ``_avx2``, ``_neon`` and ``_scalar``, each built
        from ``base``'s sources with that ISA's flags."""
        from . import isa

        made = []
        for suffix, target, priority in isa.CPU_VARIANTS:
            variant = type(f"{base.__name__.lstrip('_')}_{suffix}", (base,),
                           {"name": f"{prefix}_{suffix}", "priority": priority, "isa": target,
                            "__module__": base.__module__})
            made.append(cls.register_extension(variant))
        return made

    @classmethod
    def extensions(cls) -> list[Extension]:
        return [e() for e in cls._extensions]

    @classmethod
    def companions(cls) -> list[Extension]:
        """The extensions registered with ``register_companion``, by name."""
        return sorted((e() for e in cls._companions), key=lambda e: e.name)

    def companion_candidates(self, platform=None, prebuilt=None) -> list[Candidate]:
        """Every companion with its Decision and state, as ``candidates`` gives the variants; none chosen."""
        from .platform import current

        s = settings_mod.current()
        platform = platform or current(s)
        exts = self.companions()
        statuses = _statuses(exts, platform, prebuilt, s)
        return [decide(e, platform, statuses) for e in exts]

    def candidates(self, platform=None, prebuilt=None, lazy: bool = False, device: str | None = None) -> list[Candidate]:
        """Every extension of this kind with its Decision and state, best first; with ``device``,
        only those whose ops take tensors on that device type can be chosen.

        ``lazy``: look up states (prebuilt? cached?) only down to the first candidate that can
        be had; the ones after it are left undecided ("needs build"), which is all ``load()``
        needs until something fails."""
        from .platform import current

        s = settings_mod.current()
        platform = platform or current(s)
        exts = sorted(self.extensions(), key=lambda e: (-e.priority, e.name))
        return select(exts, platform, _statuses(exts, platform, prebuilt, s, lazy, device), device)

    def load(self, ext_name: str | None = None, strict: bool = False, verbose: bool = False,
             device: str | None = None) -> LoadedKernel:
        """The best implementation that works here (or ``ext_name``), loaded. ``device`` (a
        ``torch.device.type`` such as ``"cpu"``): the best one whose ops take tensors there."""
        key = (ext_name, strict, device)
        found = self._cache.get(key)  # the per-call path (ops call this): a dict read, no lock
        if found is not None:
            return found
        with self._lock:
            found = self._cache.get(key)
            if found is None:
                found = self._cache[key] = self._load(ext_name, strict, verbose, device)
            return found

    def _load(self, ext_name: str | None, strict: bool, verbose: bool, device: str | None = None) -> LoadedKernel:
        from .platform import current

        platform = current()
        names = [e.name for e in self._extensions]
        if ext_name is not None and ext_name not in names:
            raise ValueError(f"{type(self).__name__} has no extension {ext_name!r}; "
                             f"the {self.kind} extensions are: {', '.join(sorted(names))}")
        if ext_name is not None:
            (c,) = [c for c in self.candidates(platform, device=device) if c.name == ext_name]
            if not c.decision:
                raise OpforgeError(f"{ext_name} can't be used here: {c.decision.reason}")
            return c.extension.load(platform, c.status, verbose)
        cands = self.candidates(platform, lazy=True, device=device)
        failures: list[str] = []
        tried: set[str] = set()
        while True:
            c = next((c for c in cands if c.decision and c.name not in tried), None)
            if c is None:
                break
            try:
                kernel = c.extension.load(platform, c.status, verbose)
            except Exception as exc:  # a failed build or load: fall back to the next, unless strict
                if strict:
                    raise
                reason = _one_line(exc)
                failures.append(f"{c.name}: {reason}")
                tried.add(c.name)
                warn_once(f"{c.name} could not be loaded ({reason}); falling back to the next {self.kind} implementation")
                cands = self.candidates(platform, device=device)  # now decide every candidate, not just the first
                continue
            better = [x for x in passed_over(cands, c) if x.name not in tried]  # (a failure here was said already)
            if better and settings_mod.current().fallback_notice:
                warn_once(fallback_notice(self.kind, c, better))
            return kernel
        rejected = [f"{c.name}: {c.decision.reason}" for c in cands if not c.decision]
        raise OpforgeError(f"no {self.kind} implementation can be loaded here:\n  "
                           + "\n  ".join(failures + rejected or ["(none is registered)"]))


def _statuses(exts: Sequence[Extension], platform, prebuilt, s: settings_mod.Settings, lazy: bool = False,
              device: str | None = None) -> dict[str, Status]:
    """The state (prebuilt, cached, needs build) of each extension that passes its checks, in order;
    ``lazy``: only down to the first that can be had. ``prebuilt`` stands for opforge's own package's
    record (None: read it); other packages' records are read."""
    statuses = {}
    records: dict[str, prebuilt_mod.Prebuilt] = {}
    for ext in exts:
        if ext.serves(device) and checks.run(ext, checks.AVAILABLE, platform) and \
                checks.run(ext, checks.COMPATIBLE, platform):
            package = ext.aot_package
            if package not in records:
                given = prebuilt if package == prebuilt_mod.PACKAGE else None
                records[package] = given if given is not None else prebuilt_mod.for_package(package)
            status = statuses[ext.name] = ext.status(platform, records[package], s)
            if lazy and toolchain_decision(ext, platform, status):
                break
    return statuses


def _one_line(exc: BaseException) -> str:
    """The error's first line; for a build, the compiler's first error line as well."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}"
    excerpt = getattr(exc, "excerpt", "") or ""
    first = next((ln.strip() for ln in excerpt.splitlines() if "error" in ln.lower()), "")
    return f"{line} {first}" if first else line


def registered() -> dict[str, type[KernelLoader]]:
    """The loaders registered so far, by kind (``opforge.registry.loaders()`` imports every family
    and plugin first)."""
    with _REGISTRY_LOCK:
        return dict(sorted(_LOADERS.items()))


def registered_extension(name: str) -> type[Extension] | None:
    """The extension registered under ``name`` so far, if any."""
    with _REGISTRY_LOCK:
        return _NAMES.get(name)


@forgets
def clear_cache() -> None:
    """Forget which implementations were chosen (``opforge.reset()`` calls it; loaded libraries stay
    loaded)."""
    for cls in list(_LOADERS.values()):
        with cls._lock:
            cls._cache.clear()


__all__ = ["KernelLoader", "clear_cache", "registered", "registered_extension"]
