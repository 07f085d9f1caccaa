"""``Extension``: one implementation of one kernel kind, and how to get it loaded.

An extension declares what it is (``name``, ``kind``, ``backend``, ``priority``), what it
is built from (sources, include dirs, flags), whether it can be built ahead of time
(``support_aot``) and just in time (``support_jit``), and two checks that read only a
:class:`~opforge.platform.Platform`:

* ``is_available(platform)``: is the hardware it needs here (an ISA, a GPU)?
* ``check_compatible(platform)``: can it be built and run with this software (torch,
  CUDA, triton)?

The subclasses keep a kernel's declaration to a few lines::

    @SelftestLoader.register_extension
    class SelftestAvx2(CppExtension):
        name, kind, priority = "selftest_avx2", "selftest", 30
        isa = AVX2
        sources = ("csrc/axpy.cpp",)
        stable_abi = "2.10"

and ``SelftestLoader.register_cpu_variants(Base, "selftest")`` declares one such class per CPU ISA.

A compiled extension is found, in order: prebuilt in the package (``opforge/_C``, when it
was built against a torch this one can run), then the JIT cache, then a JIT build.
``load()`` returns a :class:`LoadedKernel`, whose attributes are the extension's ops.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
from typing import ClassVar

from . import compat
from . import isa as isa_mod
from . import settings as settings_mod
from .decision import Accepted, Decision, Rejected
from .errors import OpforgeError
from .loaded import LoadedKernel
from .notices import KernelFallbackWarning, warn_once  # noqa: F401 (KernelFallbackWarning: re-exported)
from .status import CACHED, FAILED, NEEDS_BUILD, PREBUILT, READY, Status  # noqa: F401 (re-exported)

BACKENDS = ("cpp", "cuda", "triton", "torch")

_LOADED: dict[str, LoadedKernel] = {}
_LOADED_LOCK = threading.RLock()

# Not forgotten by opforge.reset(): a loaded kernel stays this extension's kernel. Loading its
# binary again from another cache directory would register a second library under the same op
# namespace (a crash inside torch's loader, seen in CI when a test pointed the cache elsewhere).


class Extension:
    """Base class; use :class:`CppExtension`, :class:`CudaExtension`, :class:`TritonExtension`
    or :class:`TorchExtension`."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    backend: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    """Higher is tried first."""
    support_aot: ClassVar[bool] = False
    support_jit: ClassVar[bool] = True
    devices: ClassVar[tuple[str, ...]] = ()
    """The tensor device types (``torch.device.type``) its ops take; empty: any."""
    aot_package: ClassVar[str] = "opforge._C"
    """The package its binary is prebuilt into at ``pip install``, and looked for at load time.
    A downstream package sets its own (``"mypkg._C"``; see ``opforge.aot.setup_extensions``)."""

    sources: ClassVar[tuple[str, ...]] = ()
    """Relative to the directory of the module that declares the class."""
    include_dirs: ClassVar[tuple[str, ...]] = ()
    cflags: ClassVar[tuple[str, ...]] = ()
    cuda_cflags: ClassVar[tuple[str, ...]] = ()
    ldflags: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def validate(cls) -> None:
        """Raise a TypeError that says what is wrong with the declaration."""
        from .engine.key import check_name

        where = f"{cls.__module__}.{cls.__qualname__}"
        if not cls.name:
            raise TypeError(
                f"{where} has no `name`: opforge reads an extension's declaration (name, priority, sources, "
                "flags) from class attributes, before any instance exists, so attributes set in __init__ (as "
                "ColossalAI's `self._name = ...` or `self.priority = ...`) are not seen. Declare them in the class "
                f"body: `class {cls.__name__}(CppExtension): name = 'my_ext'; priority = 10` and drop __init__")
        try:
            check_name(cls.name)
        except ValueError as exc:
            raise TypeError(f"{where}: {exc}") from None
        try:
            inspect.signature(cls).bind()
        except TypeError:
            raise TypeError(f"{where}: opforge creates extensions with no arguments, but its __init__ needs some "
                            f"({inspect.signature(cls)}); move what __init__ sets into class attributes") from None
        if cls.backend not in BACKENDS:
            raise TypeError(f"{where}: backend {cls.backend!r} is not one of {', '.join(BACKENDS)}")
        if not cls.kind:
            raise TypeError(f"{where}: set `kind` (the kernel kind it implements, e.g. 'cpu_adam')")

    # -- checks (pure: they read the Platform only) --

    def is_available(self, platform) -> Decision:
        return Accepted()

    def check_compatible(self, platform) -> Decision:
        return Accepted()

    def serves(self, device: str | None) -> Decision:
        """Do its ops take tensors on ``device`` (a ``torch.device.type``; None: any device)?"""
        if device is None or not self.devices or device in self.devices:
            return Accepted()
        return Rejected(f"takes {' or '.join(self.devices)} tensors, not {device}")

    @property
    def needs_compiler(self) -> bool:
        return False

    # -- state and loading --

    def status(self, platform, prebuilt, settings: settings_mod.Settings | None = None) -> Status:
        return Status(READY)

    def load(self, platform=None, status: Status | None = None, verbose: bool = False) -> LoadedKernel:
        """Load this implementation (once per process)."""
        with _LOADED_LOCK:
            found = _LOADED.get(self.name)
            if found is None:
                found = _LOADED[self.name] = self._load(platform, status, verbose)
            return found

    def _load(self, platform, status: Status | None, verbose: bool) -> LoadedKernel:
        raise NotImplementedError

    def prebuild_hint(self) -> str:
        """How to have it prebuilt, for messages: opforge's ``OPFORGE_BUILD``, or the variable of
        the package it belongs to (``opforge.aot.setup_extensions``)."""
        top = self.aot_package.split(".")[0]
        if top == "opforge":
            return f"reinstall opforge with OPFORGE_BUILD={self.kind} to prebuild it"
        return f"reinstall {top} with {self.kind} prebuilt (its own build variable, see {top}'s docs)"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.kind}, {self.backend}, priority {self.priority})>"


class CompiledExtension(Extension):
    """Shared by C++ and CUDA extensions: built by the engine (JIT) or by setuptools (AOT)."""

    support_aot = True
    stable_abi: ClassVar[str | None] = None
    """E.g. ``"2.10"`` when the sources use only the LibTorch stable ABI of that torch: the
    binary then runs on every later torch, and its cache key carries this target instead of
    the exact torch version."""
    op_namespace: ClassVar[str | None] = None
    """The ``torch.ops`` namespace the sources register (default: ``name``); passed as ``-DOPFORGE_NS``."""
    optimize: ClassVar[tuple[str, ...]] = ("-O3",)
    openmp: ClassVar[bool] = False

    @classmethod
    def validate(cls) -> None:
        super().validate()
        where = f"{cls.__module__}.{cls.__qualname__}"
        if not cls.sources:
            raise TypeError(f"{where}: a {cls.backend} extension needs `sources`")
        for path in cls.source_paths():
            if not os.path.isfile(path):
                raise TypeError(f"{where}: source {path} does not exist")

    @classmethod
    def source_dir(cls) -> str:
        return os.path.dirname(os.path.abspath(inspect.getfile(cls)))

    @classmethod
    def source_paths(cls) -> list[str]:
        return [os.path.join(cls.source_dir(), s) for s in cls.sources]

    @classmethod
    def include_paths(cls) -> list[str]:
        return [os.path.join(cls.source_dir(), d) for d in cls.include_dirs]

    @property
    def namespace(self) -> str:
        return self.op_namespace or self.name

    @property
    def needs_compiler(self) -> bool:
        return True

    def compile_flags(self) -> list[str]:
        flags = [*self.optimize, f"-DOPFORGE_NS={self.namespace}", *self.cflags]
        return flags + (["-fopenmp"] if self.openmp else [])

    def cuda_compile_flags(self) -> list[str]:
        """nvcc's flags: the same optimisation and op namespace as the C++ side, plus ``cuda_cflags``."""
        return [*self.optimize, f"-DOPFORGE_NS={self.namespace}", *self.cuda_cflags]

    def link_flags(self) -> list[str]:
        return [*self.ldflags] + (["-fopenmp"] if self.openmp else [])

    def check_compatible(self, platform) -> Decision:
        if self.stable_abi:
            return compat.stable_abi(self.stable_abi, platform.torch_version)
        return Accepted()

    def spec(self, settings: settings_mod.Settings):
        from .engine.key import make_spec

        return make_spec(settings, self.name, self.source_paths(), self.compile_flags(), self.cuda_compile_flags(),
                         self.link_flags(), self.include_paths(), self.backend == "cuda", False, False, self.stable_abi or "")

    def status(self, platform, prebuilt, settings: settings_mod.Settings | None = None) -> Status:
        note = ""
        if self.name in prebuilt.names:
            verdict = prebuilt.check(self.name, platform)
            if verdict:
                return Status(PREBUILT, verdict.reason)
            note = f"prebuilt binary skipped: {verdict.reason}"
        from .engine import failures, jit
        from .engine.cache import Layout
        from .engine.progress import Reporter

        s = settings or settings_mod.current()
        layout = Layout(s.cache_dir)
        try:
            spec = self.spec(s)
            entry = jit.find_entry(layout, spec, Reporter(False))
        except OpforgeError as exc:  # e.g. an unsafe cache: the load will raise it; the report shows it
            return Status(NEEDS_BUILD, "; ".join(filter(None, [note, f"cache unusable: {exc}"])))
        if entry is not None:
            return Status(CACHED, note, spec, entry, s)
        failure = failures.read(failures.path_for(layout.name_dir(self.name), spec.input_key))
        if failure is not None and failure.still_holds():
            return Status(FAILED, "; ".join(filter(None, [note, failure.describe(self.name)])), spec, None, s)
        return Status(NEEDS_BUILD, note, spec, None, s)

    def _load(self, platform, status: Status | None, verbose: bool) -> LoadedKernel:
        from . import prebuilt as prebuilt_mod

        s = settings_mod.current()
        if platform is None:
            from .platform import current

            platform = current(s)
        pb = prebuilt_mod.for_package(self.aot_package)
        status = status or self.status(platform, pb, s)
        if status.note and status.state != PREBUILT:  # a prebuilt binary was passed over: say why
            warn_once(f"{self.name}: {status.note}; using the JIT cache or building it")
        if status.state == PREBUILT:
            path = pb.path(self.name)
            try:
                pb.verify(self.name)
                return self._open(path, PREBUILT)
            except (OSError, RuntimeError) as exc:  # includes a sha256 mismatch (OpforgeError)
                warn_once(f"{self.name}: the prebuilt binary {path} can't be used ({exc}); using the JIT path")
        if not self.support_jit and status.state != CACHED:
            raise OpforgeError(f"{self.name} is built ahead of time only, and no prebuilt binary fits here: "
                               f"{self.prebuild_hint()}")
        from .engine import jit
        from .engine.progress import Reporter

        if status.state != CACHED:
            self._check_bindings()
        fresh = status.spec is not None and status.settings == s  # worked out just now, for these settings
        spec = status.spec if fresh else self.spec(s)
        path = jit.load_spec(spec, s, None, Reporter(verbose or s.verbose), status.entry if fresh else None)
        return self._open(path, CACHED if status.state == CACHED else "built", loaded=True)

    def build_jit(self, verbose: bool = False, settings: settings_mod.Settings | None = None, reporter=None):
        """Compile into the JIT cache (or find it there) without loading it. Returns the cache
        ``Entry`` (``.path``, ``.binary``, ``.manifest``)."""
        from .engine import jit
        from .engine.progress import Reporter

        s = settings or settings_mod.current()
        self._check_bindings()
        return jit.ensure_built(self.spec(s), s, reporter or Reporter(verbose or s.verbose))

    def bindings_decision(self) -> Decision:
        """Do its sources register ops with torch (not only a Python module)? Read from the sources."""
        from .engine import bindings

        return bindings.library_decision(self.name, self.namespace, self.source_paths(), self.include_paths())

    def _check_bindings(self) -> None:
        verdict = self.bindings_decision()
        if not verdict:
            raise OpforgeError(verdict.reason)

    def _open(self, path: str, origin: str, loaded: bool = False) -> LoadedKernel:
        import torch

        if not loaded:
            from .engine import importer

            importer.load_library(self.name, path, self.source_paths())
        return LoadedKernel(self.name, self.kind, self.backend, origin, path, getattr(torch.ops, self.namespace))


class CppExtension(CompiledExtension):
    """C++ for the CPU, one extension per ISA variant (``isa``), compiled with explicit flags."""

    backend = "cpp"
    devices = ("cpu",)
    isa: ClassVar[isa_mod.Isa] = isa_mod.PORTABLE

    def compile_flags(self) -> list[str]:
        return [*self.isa.flags, *super().compile_flags()]

    def is_available(self, platform) -> Decision:
        return self.isa.supports(platform)


class CudaExtension(CompiledExtension):
    """C++/CUDA. Needs an NVIDIA GPU of at least ``min_capability`` and a CUDA build of torch."""

    backend = "cuda"
    devices = ("cuda",)
    min_capability: ClassVar[tuple[int, int]] = (7, 0)

    def is_available(self, platform) -> Decision:
        caps = platform.cuda_capabilities
        if not caps:
            return Rejected(f"needs an NVIDIA GPU; none found ({platform.gpu_probe})")
        ok = [c for c in caps if c >= self.min_capability]
        if not ok:
            need = ".".join(map(str, self.min_capability))
            return Rejected(f"needs compute capability >= {need}; the GPUs here are "
                            f"{', '.join('.'.join(map(str, c)) for c in caps)}")
        return Accepted(f"sm_{ok[0][0]}{ok[0][1]}")

    def check_compatible(self, platform) -> Decision:
        if platform.torch_cuda is None:
            return Rejected(f"torch {platform.torch_version} is built without CUDA: install a CUDA build of torch")
        if platform.nvcc is not None:
            verdict = compat.cuda_major(platform.nvcc.version_tuple, platform.torch_cuda, platform.nvcc.path)
            if not verdict:
                return verdict
        return super().check_compatible(platform)


class PythonExtension(Extension):
    """An implementation written in Python (triton kernels, torch ops): nothing to build."""

    module: ClassVar[str] = ""
    """Dotted path of the module that holds the ops."""

    @classmethod
    def validate(cls) -> None:
        super().validate()
        if not cls.module:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: set `module`, the dotted path of its ops module")

    def _load(self, platform, status: Status | None, verbose: bool) -> LoadedKernel:
        mod = importlib.import_module(self.module)
        return LoadedKernel(self.name, self.kind, self.backend, "python", getattr(mod, "__file__", "") or "", mod)


class TritonExtension(PythonExtension):
    backend = "triton"
    devices = ("cuda",)

    def is_available(self, platform) -> Decision:
        if not platform.gpus:
            return Rejected(f"needs a GPU; none found ({platform.gpu_probe})")
        return Accepted(platform.gpus[0].arch or platform.gpus[0].name)

    def check_compatible(self, platform) -> Decision:
        if platform.triton is None:
            return Rejected("triton is not installed: `pip install triton`")
        return Accepted(f"triton {platform.triton}")


class TorchExtension(PythonExtension):
    """Pure torch: the reference, and the fallback that always works."""

    backend = "torch"
