"""Compiled extensions: C++ (one per CPU ISA) and CUDA, built just in time by the engine or ahead of
time by setuptools, found prebuilt → cached → built."""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import ClassVar

from .. import compat
from .. import isa as isa_mod
from .. import settings as settings_mod
from ..decision import Accepted, Decision, Rejected
from ..errors import OpforgeError
from ..loaded import LoadedKernel
from ..notices import DeclarationWarning, warn_once
from ..status import CACHED, FAILED, NEEDS_BUILD, PREBUILT, Status
from .base import Extension


class CompiledExtension(Extension):
    """Shared by C++ and CUDA extensions: built by the engine (JIT) or by setuptools (AOT)."""

    support_aot = True
    stable_abi: ClassVar[str | None] = None
    """E.g. ``"2.10"`` when the sources use only the LibTorch stable ABI of that torch: the
    binary then runs on every later torch, and its cache key carries this target instead of
    the exact torch version."""
    op_namespace: ClassVar[str | None] = None
    """The ``torch.ops`` namespace the sources register (default: ``name``); passed as ``-DOPFORGE_NS``."""
    python_module: ClassVar[bool] = False
    """True when the sources define a Python module (``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``),
    as DeepSpeed's and ColossalAI's ops do, rather than register torch ops: the loaded kernel's
    attributes are then the module's functions. Same path otherwise: prebuilt, cached, built."""
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
                why = ""
                if _declaring_file(cls) is None:
                    why = (" (it is declared where there is no file, so its relative sources are looked for in the "
                           "current directory: give absolute paths, or run from the directory that holds them)")
                raise TypeError(f"{where}: source {path} does not exist{why}")
        if cls.python_module and cls.stable_abi:
            raise TypeError(f"{where}: a Python module (python_module = True) uses CPython's and torch's C++ APIs, "
                            "so it can't be a stable-ABI build: drop `stable_abi`")

    @classmethod
    def source_dir(cls) -> str:
        """The directory its relative ``sources`` and ``include_dirs`` are resolved against: that of the
        module that declares the class. A class with no file (declared in a notebook cell, a REPL,
        ``python -c``) gets the current directory, said once (``DeclarationWarning``). Found once per
        class, and kept: a later ``chdir`` doesn't move its sources."""
        with _SOURCE_DIRS_LOCK:
            found = _SOURCE_DIRS.get(cls)
            if found is None:
                path = _declaring_file(cls)
                found = _SOURCE_DIRS[cls] = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
                if not path:
                    _say_no_file(cls, found)
            return found

    @classmethod
    def source_paths(cls) -> list[str]:
        return _resolve(cls, cls.sources)

    @classmethod
    def include_paths(cls) -> list[str]:
        return _resolve(cls, cls.include_dirs)

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
        from ..engine.key import make_spec

        return make_spec(settings, self.name, self.source_paths(), self.compile_flags(), self.cuda_compile_flags(),
                         self.link_flags(), self.include_paths(), self.backend == "cuda", self.python_module, False,
                         self.stable_abi or "")

    def status(self, platform, prebuilt, settings: settings_mod.Settings | None = None) -> Status:
        note = ""
        if self.name in prebuilt.names:
            verdict = prebuilt.check(self.name, platform)
            if verdict:
                return Status(PREBUILT, verdict.reason)
            note = f"prebuilt binary skipped: {verdict.reason}"
        from ..engine import failures, jit
        from ..engine.cache import Layout
        from ..engine.progress import Reporter

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
        return Status(NEEDS_BUILD, note, spec, None, s, remote=_in_remote(spec, s))

    def _load(self, platform, status: Status | None, verbose: bool) -> LoadedKernel:
        from .. import prebuilt as prebuilt_mod

        s = settings_mod.current()
        if platform is None:
            from ..platform import current

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
        from ..engine import jit
        from ..engine.progress import Reporter

        if status.state != CACHED:
            self._check_bindings()
        fresh = status.spec is not None and status.settings == s  # worked out just now, for these settings
        spec = status.spec if fresh else self.spec(s)
        got = jit.load_spec(spec, s, None, Reporter(verbose or s.verbose), status.entry if fresh else None)
        origin = CACHED if status.state == CACHED else "built"
        if self.python_module:  # the engine imported it: ``got`` is the module
            return LoadedKernel(self.name, self.kind, self.backend, origin, got.__file__, got)
        return self._open(got, origin, loaded=True)

    def build_jit(self, verbose: bool = False, settings: settings_mod.Settings | None = None, reporter=None):
        """Compile into the JIT cache (or find it there) without loading it. Returns the cache
        ``Entry`` (``.path``, ``.binary``, ``.manifest``)."""
        from ..engine import jit
        from ..engine.progress import Reporter

        s = settings or settings_mod.current()
        self._check_bindings()
        return jit.ensure_built(self.spec(s), s, reporter or Reporter(verbose or s.verbose))

    def bindings_decision(self) -> Decision:
        """Do its sources offer what it declares: torch ops, or (``python_module``) a Python module?
        Read from the sources, before a build."""
        from ..engine import bindings

        if self.python_module:
            return bindings.module_decision(self.name, self.source_paths())
        return bindings.library_decision(self.name, self.namespace, self.source_paths(), self.include_paths())

    def _check_bindings(self) -> None:
        verdict = self.bindings_decision()
        if not verdict:
            raise OpforgeError(verdict.reason)

    def _open(self, path: str, origin: str, loaded: bool = False) -> LoadedKernel:
        import torch

        from ..engine import importer

        if self.python_module:
            return LoadedKernel(self.name, self.kind, self.backend, origin, path, importer.import_module(self.name, path))
        if not loaded:
            importer.load_library(self.name, path, self.source_paths())
        return LoadedKernel(self.name, self.kind, self.backend, origin, path, getattr(torch.ops, self.namespace))


def _in_remote(spec, s: settings_mod.Settings) -> bool:
    """With no compiler here, does the remote cache hold a build of ``spec`` that a pull would take under
    the trust settings (``remote.predict``: a listing and the signatures, bounded by OPFORGE_REMOTE_TIMEOUT)?
    With a compiler the load asks the store itself before building."""
    if not (s.remote_cache and spec.toolchain_missing):
        return False
    from ..engine import remote
    from ..engine.progress import Reporter

    return (remote.predict(spec, s, Reporter(s.verbose)) or "").startswith("would be pulled")


_SOURCE_DIRS: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()
_SOURCE_DIRS_LOCK = threading.Lock()


def _resolve(cls, paths) -> list[str]:
    """``paths`` made absolute against ``cls.source_dir()``; absolute ones need no directory (nor a file)."""
    if all(os.path.isabs(p) for p in paths):
        return list(paths)
    base = cls.source_dir()
    return [os.path.join(base, p) for p in paths]


def _say_no_file(cls, directory: str) -> None:
    """The one notice for a class with no file, naming the class whose body declares its sources (the
    variants ``register_cpu_variants`` makes of one base share it)."""
    declarer = next((k for k in cls.__mro__ if "sources" in vars(k)), cls)
    relative = [p for p in (*cls.sources, *cls.include_dirs) if not os.path.isabs(p)]
    what = "sources and include dirs" if any(not os.path.isabs(d) for d in cls.include_dirs) else "sources"
    warn_once(f"{declarer.__module__}.{declarer.__qualname__} is declared where there is no file (a notebook cell, a "
              f"REPL, python -c), so opforge resolves its relative {what} ({', '.join(relative)}) against the current "
              f"directory, {directory}; give absolute paths to say where they are", DeclarationWarning)


def _declaring_file(cls) -> str | None:
    """The file of the module that declares ``cls``; None when it has none: ``__main__`` under a notebook
    (IPython's user module), a REPL or ``python -c``, or a module made in memory."""
    return getattr(sys.modules.get(cls.__module__), "__file__", None) or None


class CppExtension(CompiledExtension):
    """C++ for the CPU, one extension per ISA variant (``isa``), compiled with explicit flags."""

    backend = "cpp"
    devices = ("cpu",)
    isa: ClassVar[isa_mod.Isa] = isa_mod.PORTABLE
    gpu_torch_only: ClassVar[bool] = False
    """True for host code that only drives GPU kernels (a C++ autograd node over CUDA launches): where
    torch has no CUDA or ROCm it is not offered, and an AOT build against such a torch leaves it out."""

    def compile_flags(self) -> list[str]:
        return [*self.isa.flags, *super().compile_flags()]

    def is_available(self, platform) -> Decision:
        if self.gpu_torch_only and platform.torch_cuda is None and platform.torch_hip is None:
            return Rejected(f"it drives GPU kernels, and torch {platform.torch_version} has no CUDA or ROCm")
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
