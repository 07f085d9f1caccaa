"""The content-addressed build key.

A :class:`BuildSpec` holds everything that changes the binary and is known before the
build: the sources' bytes, the flags, the compiler's identity, nvcc's, torch's and
Python's versions, the C++ ABI, the target archs, and opforge's own build format.
Headers are only known after the first build (from the compiler's dependency output);
they are recorded in the manifest and checked on every load (see ``deps.py``), and their
digest names the cache entry next to the spec's key.

Two keys come out of a spec:

* ``config_key``: everything but the sources' bytes. It names the persistent ninja
  build directory, so an edit to one source recompiles that translation unit alone.
* ``input_key``: the config plus the sources' bytes. It names the cache entries.

Neither depends on where the files are on this machine (``relocate.py``): sources and include
dirs go in relative to the source root, torch's, Python's and CUDA's dirs by name, so a binary
built by CI at one path is found by a node that has the same bytes at another.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields

from .. import compat
from ..compat import TorchFacts
from ..errors import ToolchainError
from ..settings import Settings
from . import gpu_record, toolchain, torch_record
from .relocate import Places, choose_root
from .toolchain import Tool

#: Bump when the flags opforge derives, or the cache layout, change.
#: 2: the shared libstdc++ is linked explicitly when the compiler only has a static one.
#: 3: paths in the key relative to the source root (relocate.py); prefix maps; torch's place left out.
BUILD_FORMAT = 3

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NATIVE_RE = re.compile(r"^-m(arch|tune|cpu)=native$")
CUDA_SUFFIXES = (".cu", ".cuh")


def is_cuda_file(path: str) -> bool:
    return os.path.splitext(path)[1] in CUDA_SUFFIXES


def check_name(name: object) -> str:
    """An extension name must be a C identifier: it becomes ``PyInit_<name>``.

    >>> check_name("my_ext")
    'my_ext'
    >>> check_name("my-ext")
    Traceback (most recent call last):
    ...
    ValueError: extension name 'my-ext' is not a valid identifier: use letters, digits and '_', not starting with a digit (e.g. 'my_ext')
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        suggestion = re.sub(r"[^A-Za-z0-9_]", "_", str(name)) or "my_ext"
        if suggestion[0] in "0123456789":
            suggestion = "_" + suggestion
        raise ValueError(
            f"extension name {name!r} is not a valid identifier: use letters, digits and '_', "
            f"not starting with a digit (e.g. {suggestion!r})"
        )
    return name


def sha256_file(path: str) -> str:
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size <= 1 << 22:  # sources and most binaries: one read
            return hashlib.sha256(f.readall()).hexdigest()
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        return h.hexdigest()


def digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class BuildSpec:
    """Everything about one requested build that is known before compiling."""

    name: str
    sources: tuple[str, ...]
    source_digests: tuple[str, ...]
    extra_cflags: tuple[str, ...]
    extra_cuda_cflags: tuple[str, ...]
    extra_ldflags: tuple[str, ...]
    extra_include_paths: tuple[str, ...]
    with_cuda: bool
    is_python_module: bool
    is_standalone: bool
    cxx: Tool | None
    """None when no compiler is installed: cached builds can still load (see ``portable_key``)."""
    nvcc: Tool | None
    torch: TorchFacts
    env: tuple[tuple[str, str], ...]
    cuda_archs: str = ""
    cpu_identity: str = ""
    stable_abi: str = ""
    """``"2.10"`` etc. for sources built on the LibTorch stable ABI (``TORCH_TARGET_VERSION``):
    the binary runs on that torch and every later one, so the key carries this target in
    place of the exact torch version. Empty for sources that use torch's C++ API."""
    format: int = field(default=BUILD_FORMAT)
    root: str = ""
    """The source root on this machine (``relocate.choose_root``); not in the key: paths under it are."""
    system_dirs: tuple[tuple[str, str], ...] = ()
    """(name, dir) of torch's, Python's and CUDA's dirs here; in the key by name only."""

    @property
    def places(self) -> Places:
        return Places(self.root or os.sep, self.system_dirs)

    @functools.cached_property
    def key_sources(self) -> tuple[str, ...]:
        """The sources as the key and the manifest name them: relative to the root."""
        return tuple(self.places.path(p) for p in self.sources)

    @property
    def kind(self) -> str:
        if self.is_standalone:
            return "executable"
        return "python_module" if self.is_python_module else "library"

    @property
    def toolchain_missing(self) -> bool:
        """No compiler here (or no nvcc for CUDA sources): only builds made elsewhere can load."""
        return self.cxx is None or (self.with_cuda and self.nvcc is None)

    @property
    def binary_name(self) -> str:
        return self.name if self.is_standalone else f"{self.name}.so"

    def _config(self) -> dict:
        local = ("source_digests", "root", "system_dirs")
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in local}
        places = self.places
        data["sources"] = list(self.key_sources)
        data["extra_include_paths"] = [places.path(p) for p in self.extra_include_paths]
        for name in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
            data[name] = [places.text(f) for f in getattr(self, name)]
        data["cxx"] = self.cxx.identity if self.cxx else ""
        data["nvcc"] = self.nvcc.identity if self.nvcc else ""
        data["torch"] = self.torch_key()
        return data

    def torch_key(self) -> tuple:
        """What about torch the binary depends on (``TorchFacts.abi_key``). Where torch is installed
        is left out (it is the same build, named by its version and git hash), except for an
        executable, which records torch's library dir as its rpath."""
        return self.torch.abi_key(self.stable_abi, where=self.is_standalone)

    @functools.cached_property
    def config_key(self) -> str:
        return digest(self._config())

    @functools.cached_property
    def input_key(self) -> str:
        return digest({"config": self._config(), "sources": list(zip(self.key_sources, self.source_digests))})

    @functools.cached_property
    def portable_key(self) -> str:
        """The input key without the toolchain's identity: how a machine with no compiler
        finds a binary that was built elsewhere with the same everything else."""
        config = self._config()
        config.pop("cxx")
        config.pop("nvcc")
        config["env"] = [kv for kv in config["env"] if kv[0] not in ("CXX", "CC", "CUDA_HOME", "PYTORCH_NVCC")]
        return digest({"config": config, "sources": list(zip(self.key_sources, self.source_digests))})

    def describe(self) -> dict:
        """The key's inputs, for the manifest and ``opforge cache list``."""
        data = self._config()
        data["torch"] = asdict(self.torch)
        data["sources"] = dict(zip(self.key_sources, self.source_digests))
        data["root"] = self.root
        return data


def cuda_arch_key(settings: Settings, extra_cuda_cflags: tuple[str, ...]) -> str:
    """What decides the CUDA archs of a build, as torch decides them.

    Explicit ``-gencode``/``-arch`` flags win (they are in the key already); then
    ``TORCH_CUDA_ARCH_LIST``; then the capabilities of the visible GPUs, from NVML or the cache's record of
    it, without initialising CUDA (``gpu_record.py``).
    """
    if any(f.startswith(("-gencode", "-arch", "--generate-code", "--gpu-architecture")) for f in extra_cuda_cflags):
        return "flags"
    if settings.cuda_arch_list:
        return "list:" + settings.cuda_arch_list
    caps = gpu_record.visible_capabilities(settings.cache_dir, settings.cuda_visible_devices, settings.cuda_device_order)
    if caps:
        return "visible:" + ";".join(f"{a}.{b}" for a, b in caps)
    return "none"


def make_spec(
    settings: Settings,
    name: str,
    sources: list[str],
    extra_cflags: list[str] | None,
    extra_cuda_cflags: list[str] | None,
    extra_ldflags: list[str] | None,
    extra_include_paths: list[str] | None,
    with_cuda: bool | None,
    is_python_module: bool,
    is_standalone: bool,
    stable_abi: str = "",
    source_root: str | None = None,
) -> BuildSpec:
    """Check the request and gather its key inputs. Raises ValueError on bad input."""
    check_name(name)
    if is_python_module and is_standalone:
        raise ValueError("`is_python_module` and `is_standalone` are mutually exclusive: set is_python_module=False")
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [os.fspath(s) for s in (sources or [])]
    if not sources:
        raise ValueError(f"extension {name!r}: the source list is empty; pass at least one .cpp or .cu file")
    abs_sources = []
    for src in sources:
        path = os.path.abspath(src)
        if not os.path.isfile(path):
            raise ValueError(f"extension {name!r}: source file {src!r} does not exist (looked at {path})")
        abs_sources.append(path)
    if len(set(abs_sources)) != len(abs_sources):
        raise ValueError(f"extension {name!r}: a source file is listed twice: {sources}")

    def clean(flags: list[str] | None, what: str) -> tuple[str, ...]:
        if flags is None:
            return ()
        if isinstance(flags, str):
            raise ValueError(f"{what} must be a list of strings, not the string {flags!r}")
        return tuple(str(f).strip() for f in flags if str(f).strip())

    cflags = clean(extra_cflags, "extra_cflags")
    cuda_cflags = clean(extra_cuda_cflags, "extra_cuda_cflags")
    ldflags = clean(extra_ldflags, "extra_ldflags")
    includes = tuple(os.path.abspath(p) for p in clean(extra_include_paths, "extra_include_paths"))

    if with_cuda is None:
        with_cuda = any(is_cuda_file(s) for s in abs_sources)
    facts = torch_record.torch_facts(settings.cache_dir)  # no torch import where the cache has its facts
    nvcc = None
    archs = ""
    if with_cuda:
        if facts.cuda is None and facts.hip is None:
            raise ToolchainError(
                f"extension {name!r} has CUDA sources (or with_cuda=True), but this torch "
                f"({facts.version}) was built without CUDA. Install a CUDA build of torch, "
                "or build without the .cu sources."
            )
        nvcc = toolchain.find_nvcc(settings)
        archs = cuda_arch_key(settings, cuda_cflags)
    if stable_abi:
        check_stable_abi(name, stable_abi, facts.version, is_python_module)
    native = any(_NATIVE_RE.match(f) for f in cflags + cuda_cflags)
    system = system_dirs(facts, toolchain.cuda_home(settings) if with_cuda else None)
    root = choose_root(abs_sources, list(includes), [d for _, d in system] + ["/usr/include"], source_root)
    return BuildSpec(
        name=name,
        sources=tuple(abs_sources),
        source_digests=tuple(sha256_file(s) for s in abs_sources),
        extra_cflags=cflags,
        extra_cuda_cflags=cuda_cflags,
        extra_ldflags=ldflags,
        extra_include_paths=includes,
        with_cuda=bool(with_cuda),
        is_python_module=bool(is_python_module),
        is_standalone=bool(is_standalone),
        cxx=toolchain.find_cxx(settings),
        nvcc=nvcc,
        torch=facts,
        env=settings.build_env(),
        cuda_archs=archs,
        cpu_identity=toolchain.host_cpu_identity() if native else "",
        stable_abi=stable_abi,
        root=root,
        system_dirs=system,
    )


def python_include() -> str:
    """Python's include dir, as ``sysconfig.get_path("include", scheme="posix_prefix")`` gives it (a test
    checks they agree), without the 1-2 ms that sysconfig's first call costs a warm load."""
    import sys

    return os.path.join(sys.base_prefix, "include", f"python{sys.version_info[0]}.{sys.version_info[1]}{sys.abiflags}")


def system_dirs(facts: compat.TorchFacts, cuda_home: str | None) -> tuple[tuple[str, str], ...]:
    """torch's, Python's and CUDA's dirs on this machine, by the names the key gives them."""
    found = [("torch", facts.root), ("python", python_include())]
    if cuda_home:
        found.append(("cuda", os.path.realpath(cuda_home)))
    return tuple((n, d) for n, d in found if d)


def check_stable_abi(name: str, target: str, torch_version: str, is_python_module: bool) -> None:
    if is_python_module:
        raise ValueError(f"extension {name!r}: a stable-ABI build is a plain library; pass is_python_module=False")
    verdict = compat.stable_abi(target, torch_version)
    if not verdict:
        raise ToolchainError(f"extension {name!r} {verdict.reason}")

