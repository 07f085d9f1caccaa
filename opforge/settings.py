"""Every environment variable opforge reads, in one place.

``current()`` reads the environment into a frozen :class:`Settings` each time it is
called (a handful of dict lookups), so a test or a user that changes a variable at run
time is seen at the next ``load()``. No other module reads ``os.environ``.

>>> s = current({"OPFORGE_CACHE_DIR": "/tmp/c", "MAX_JOBS": "3", "OPFORGE_VERBOSE": "1"})
>>> (s.cache_dir, s.max_jobs, s.verbose)
('/tmp/c', 3, True)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Variables that are part of a build's identity: they change the binary.
BUILD_ENV_VARS = ("CXX", "CC", "CUDA_HOME", "PYTORCH_NVCC", "TORCH_CUDA_ARCH_LIST")

DEFAULT_LOCK_TIMEOUT = 1800.0
DEFAULT_CACHE_MAX_SIZE = 10 * 2**30


@dataclass(frozen=True)
class TorchEnv:
    """The variables ``torch.utils.cpp_extension`` reads for the values a library asks of it at a warm start
    (``CUDA_HOME``, ``include_paths``, ``_get_build_directory``...), as raw as torch reads them (unset is None,
    empty is ""), for the patch's stand-in of that module (``opforge/patch/answers.py``)."""

    cuda_home: str | None = None
    """``CUDA_HOME``"""
    cuda_path: str | None = None
    """``CUDA_PATH``"""
    cudnn_home: str | None = None
    """``CUDNN_HOME``"""
    cudnn_path: str | None = None
    """``CUDNN_PATH``"""
    cuda_inc_path: str | None = None
    """``CUDA_INC_PATH``"""
    extensions_dir: str | None = None
    """``TORCH_EXTENSIONS_DIR``"""
    xdg_cache_home: str | None = None
    """``XDG_CACHE_HOME`` (torch's default extensions dir is under it)"""


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment, as opforge understands it."""

    cache_dir: str
    """``OPFORGE_CACHE_DIR``: root of the build cache (default ``~/.cache/opforge``)."""
    cache_dir_from_env: bool
    verbose: bool
    """``OPFORGE_VERBOSE``: log every step of a load (also ``load(verbose=True)``)."""
    lock_timeout: float
    """``OPFORGE_LOCK_TIMEOUT``: seconds to wait for another process's build (default 1800)."""
    max_jobs: int | None
    """``MAX_JOBS``: parallel compile jobs, as in torch; None: one per usable CPU (``compile.default_jobs``)."""
    ccache: str
    """``OPFORGE_CCACHE``: ``auto`` (ccache or sccache when installed, as torch does), ``0`` (never), or a path.
    ``TORCH_NO_COMPILER_WRAPPER`` set also turns it off, as in torch."""
    linker: str
    """``OPFORGE_LINKER``: ``auto`` (the fastest of mold, lld and gold that links here, else the
    compiler's default), ``default``, or one of ``mold``, ``lld``, ``gold``, ``bfd`` (passed as
    ``-fuse-ld=``). The linker doesn't change what a binary does, so it is not part of the key."""
    pch_mode: str
    """``OPFORGE_PCH``: the shared precompiled ``torch/extension.h`` (GCC; ``engine/pch_store.py``). ``auto``
    (the default; ``1`` too): a build uses the PCH of its compiler and flags when there is one and never waits
    for one; the second build of a flag set makes it in the background, for later builds. ``eager``: made
    before the first build that can use it. ``0``: never."""
    pch_max_size: int
    """``OPFORGE_PCH_MAX_SIZE``: the PCHs' total size on disk (``2G``, ``800M``, bytes; default 2 GiB),
    the least recently used removed first; ``0`` makes none."""
    cache_max_size: int
    """``OPFORGE_CACHE_MAX_SIZE``: the whole cache's size on disk (``10G``, ``500M``, bytes; default 10 GiB):
    entries, build dirs, failed-build records, ``load_inline``'s sources, staging and the PCHs (whose own cap,
    ``OPFORGE_PCH_MAX_SIZE``, applies inside this one). After each build the least recently used go first,
    never what a running build holds (``engine/budget.py``). ``0``: no cap (a cap of 0 bytes would keep only
    the last build). 10 GiB holds the PCHs' 2 GiB and a failed build's dir or two (one held 750 MB) beside
    dozens of entries and their build dirs, and stays a small share of a home quota (ccache's default:
    5 GiB); docs/architecture.md, "Bounded caches"."""
    cxx: str | None
    """``CXX``: the C++ compiler, as in torch (default ``c++``)."""
    cc: str | None
    """``CC``: host compiler handed to nvcc as ``-ccbin``, as in torch."""
    cuda_home: str | None
    """``CUDA_HOME`` / ``CUDA_PATH``: the CUDA toolkit (torch's own discovery otherwise)."""
    pytorch_nvcc: str | None
    """``PYTORCH_NVCC``: an nvcc command to use instead of ``$CUDA_HOME/bin/nvcc``, as in torch."""
    cuda_arch_list: str | None
    """``TORCH_CUDA_ARCH_LIST``: CUDA archs to build for, as in torch."""
    nvcc_gen_deps: bool
    """False when ``TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1`` (as in torch)."""
    path: str
    """``PATH``: where compilers are looked up."""
    aot_build: str
    """``OPFORGE_BUILD``: at ``pip install``, the kernels to prebuild into ``opforge._C``:
    ``all``, or a comma list of kinds and extension names. Empty: a pure-Python install."""
    distributed: str = "auto"
    """``OPFORGE_DISTRIBUTED``: ``auto`` (on when a torch.distributed process group is up), ``1`` (on,
    with the ranks from ``RANK`` / ``LOCAL_RANK``), ``0`` (off). On: one rank builds, the others wait
    (see ``engine/ranks.py``)."""
    shared_cache: bool = False
    """``OPFORGE_SHARED_CACHE``: the cache is on a filesystem all nodes share; global rank 0 builds
    (else the local rank 0 of each node does)."""
    dist_grace: float = 30.0
    """``OPFORGE_DIST_GRACE``: seconds a waiting rank gives the builder rank to start a build it
    does not see begin, before building it itself (default 30)."""
    rank: int | None = None
    """``RANK`` (torchrun) or ``SLURM_PROCID``: this process's global rank, when no process group is up."""
    local_rank: int | None = None
    """``LOCAL_RANK`` (torchrun) or ``SLURM_LOCALID``: this process's rank on its node."""
    cuda_visible_devices: str | None = None
    """``CUDA_VISIBLE_DEVICES``: read to list GPUs without initialising CUDA (see ``platform.py``)."""
    cuda_device_order: str | None = None
    """``CUDA_DEVICE_ORDER``: how CUDA numbers GPUs (``PCI_BUS_ID`` matches NVML's order)."""
    fallback_notice: bool = True
    """``OPFORGE_FALLBACK_NOTICE``: ``0`` silences the notice a kernel loader gives once per kind when it
    settles for a lower-priority implementation because better ones can't be had with this software
    (no compiler, ninja or nvcc; a failed build; an old torch)."""
    triton_tuning: str = "auto"
    """``OPFORGE_TRITON_TUNING``: ``auto`` (a Triton kernel times its candidate configs once per shape
    class and keeps the winner in the cache, ``kernels/tuning.py``) or ``off`` (the first config
    that fits, untimed: no tuning at start-up, maybe slower kernels)."""
    triton_compile_threads: int | None = None
    """``OPFORGE_TRITON_COMPILE_THREADS``: threads that compile a tuning's candidate configs at once before
    they are timed (``kernels/triton_launch.py``); ``1`` compiles each in turn as it is timed. Default (unset,
    or not a positive number): the CPUs this process may use, at most 16."""
    triton_direct: bool = True
    """``OPFORGE_TRITON_DIRECT``: ``0`` sends every Triton launch through triton's own ``kernel[grid](...)``
    path instead of the compiled kernel's launcher (``kernels/triton_launch.py``; read once per process)."""
    native_launch: bool = True
    """``OPFORGE_NATIVE_LAUNCH``: ``0`` keeps Triton launches in Python (``kernels/triton_launch.py``)
    instead of replaying each call shape's launch from C++ (``kernels/native_launch``; read once per
    process)."""
    block_sparse_cuda: bool = True
    """``OPFORGE_BLOCK_SPARSE_CUDA``: ``0`` keeps the CUDA decode kernel (``kernels/block_sparse/cuda_decode.py``)
    out of the block-sparse decode route: no build of it, the Triton kernels take every call."""
    block_sparse_overlap: bool = True
    """``OPFORGE_BLOCK_SPARSE_OVERLAP``: ``0`` launches the block-sparse decode kernels (Triton's and the CUDA
    one) as plain kernels instead of programmatic dependents (on sm_90 and newer, each starts while the
    kernel before it on the stream finishes: ``kernels/block_sparse/triton_decode.py``)."""
    patch_torch: bool = False
    """``OPFORGE_PATCH_TORCH``: ``1`` routes ``torch.utils.cpp_extension.load`` / ``load_inline`` through
    opforge for every library that calls them, from the first import of ``torch.utils.cpp_extension`` on,
    with no ``import opforge`` (the startup hook, ``opforge-patch-torch.pth``); ``0`` or unset: off; any
    other value is an error. ``opforge.patch_torch()`` does it in code (``opforge/patch.py``)."""

    torch_env: TorchEnv = TorchEnv()
    """What torch's ``cpp_extension`` reads of the environment (see :class:`TorchEnv`)."""

    remote_cache: str | None = None
    """``OPFORGE_REMOTE_CACHE``: an fsspec URL (``s3://bucket/opforge``, ``webdav://host/opforge``,
    ``file:///nfs/opforge``) looked up after a local miss, before compiling (``engine/remote.py``)."""
    remote_push: bool = False
    """``OPFORGE_REMOTE_PUSH``: ``1`` uploads each entry this process builds to the remote cache."""
    remote_timeout: float = 10.0
    """``OPFORGE_REMOTE_TIMEOUT``: seconds a remote lookup and download may take; past it the store
    counts as dead for the rest of the process and the build goes on locally."""
    signing_key: str | None = None
    """``OPFORGE_SIGNING_KEY``: an ed25519 secret key file (``opforge cache keygen``) that signs pushed entries."""
    trusted_keys: tuple[str, ...] = ()
    """``OPFORGE_TRUSTED_KEYS``: public key files, comma-separated: pulled entries must be signed by one."""
    remote_allow_unsigned: bool = False
    """``OPFORGE_REMOTE_ALLOW_UNSIGNED``: ``1`` accepts unsigned remote entries (every other check still runs)."""

    @property
    def pch_cap(self) -> int:
        """The PCHs' cap inside the cache's: ``OPFORGE_PCH_MAX_SIZE``, but at most half of
        ``OPFORGE_CACHE_MAX_SIZE``, else a small cache cap would evict each PCH right after it is made.

        >>> current({"OPFORGE_CACHE_MAX_SIZE": "1G"}).pch_cap == 2**29, current({}).pch_cap == 2 * 2**30
        (True, True)
        """
        if not self.cache_max_size:
            return self.pch_max_size
        return min(self.pch_max_size, self.cache_max_size // 2)

    def build_env(self) -> tuple[tuple[str, str], ...]:
        """The variables that change a binary, as (name, value) pairs for the build key."""
        values = {
            "CXX": self.cxx,
            "CC": self.cc,
            "CUDA_HOME": self.cuda_home,
            "PYTORCH_NVCC": self.pytorch_nvcc,
            "TORCH_CUDA_ARCH_LIST": self.cuda_arch_list,
        }
        return tuple((k, values[k] or "") for k in BUILD_ENV_VARS)


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds; unset it or give e.g. {name}=600") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive; unset it or give e.g. {name}=600")
    return value


def _rank(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = (env.get(name) or "").strip()
        if raw.isdigit():  # another tool's variable: a value that is no rank is ignored, not an error
            return int(raw)
    return None


def _distributed(raw: str | None) -> str:
    value = (raw or "auto").strip().lower() or "auto"
    value = {"true": "1", "yes": "1", "on": "1", "false": "0", "no": "0", "off": "0"}.get(value, value)
    if value not in ("auto", "1", "0"):
        raise ValueError(f"OPFORGE_DISTRIBUTED={raw!r}: use auto (the default), 1 or 0")
    return value


def _max_jobs(raw: str | None) -> int | None:
    # torch honours MAX_JOBS only when it is all digits, and ignores it otherwise.
    if raw is not None and raw.isdigit() and int(raw) > 0:
        return int(raw)
    return None


LINKERS = ("mold", "lld", "gold", "bfd")


def _linker(raw: str | None) -> str:
    value = (raw or "auto").strip().lower() or "auto"
    if value not in ("auto", "default", *LINKERS):
        raise ValueError(f"OPFORGE_LINKER={raw!r} is not a linker opforge knows; use auto, default, or one of "
                         f"{', '.join(LINKERS)}")
    return value


def _pch_mode(raw: str | None) -> str:
    value = (raw or "auto").strip().lower() or "auto"
    value = {"1": "auto", "true": "auto", "yes": "auto", "on": "auto", "false": "0", "no": "0", "off": "0"}.get(value, value)
    if value not in ("auto", "eager", "0"):
        raise ValueError(f"OPFORGE_PCH={raw!r}: use auto (the default), eager or 0")
    return "off" if value == "0" else value


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?$")


def _size(env: Mapping[str, str], name: str, default: int, zero: str = "none") -> int:
    """A size in bytes, with an optional binary unit (``zero``: what 0 means, for the error).

    >>> [_size({"S": v}, "S", 7) for v in ("", "2G", "1.5g", "800M", "800MiB", "4096", "0")]
    [7, 2147483648, 1610612736, 838860800, 838860800, 4096, 0]
    >>> _size({"S": "-1G"}, "S", 7, zero="no cap")
    Traceback (most recent call last):
    ValueError: S='-1G' is not a size; give e.g. S=2G or S=800M (0: no cap)
    """
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    m = _SIZE.match(raw.upper())
    if m is None:
        raise ValueError(f"{name}={raw!r} is not a size; give e.g. {name}=2G or {name}=800M (0: {zero})")
    return int(float(m.group(1)) * 2 ** (10 * " KMGT".index(m.group(2) or " ")))


def _patch_torch(raw: str | None) -> bool:
    """``OPFORGE_PATCH_TORCH``: 1 or 0 (unset or empty: 0).

    >>> [_patch_torch(v) for v in (None, "", "0", " 1 ")]
    [False, False, False, True]
    """
    value = (raw or "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"OPFORGE_PATCH_TORCH={raw!r}: use 1 (torch's load and load_inline go through opforge) "
                         "or 0 (off, the default)")
    return value == "1"


def _tuning(raw: str | None) -> str:
    value = (raw or "auto").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    return "auto"


def current(env: Mapping[str, str] | None = None) -> Settings:
    """Read the environment (or ``env``) into a :class:`Settings`."""
    env = os.environ if env is None else env
    cache_env = env.get("OPFORGE_CACHE_DIR")
    if cache_env:
        cache_dir = os.path.abspath(os.path.expanduser(cache_env))
    else:
        home = env.get("HOME") or os.path.expanduser("~")
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
        cache_dir = os.path.join(xdg, "opforge")
    return Settings(
        cache_dir=cache_dir,
        cache_dir_from_env=bool(cache_env),
        verbose=_flag(env.get("OPFORGE_VERBOSE")),
        lock_timeout=_float(env, "OPFORGE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT),
        max_jobs=_max_jobs(env.get("MAX_JOBS")),
        ccache="0" if env.get("TORCH_NO_COMPILER_WRAPPER") else (env.get("OPFORGE_CCACHE") or "auto").strip(),
        linker=_linker(env.get("OPFORGE_LINKER")),
        pch_mode=_pch_mode(env.get("OPFORGE_PCH")),
        pch_max_size=_size(env, "OPFORGE_PCH_MAX_SIZE", 2 * 2**30),
        cache_max_size=_size(env, "OPFORGE_CACHE_MAX_SIZE", DEFAULT_CACHE_MAX_SIZE, zero="no cap"),
        remote_cache=(env.get("OPFORGE_REMOTE_CACHE") or "").strip() or None,
        remote_push=_flag(env.get("OPFORGE_REMOTE_PUSH")),
        remote_timeout=_float(env, "OPFORGE_REMOTE_TIMEOUT", 10.0),
        signing_key=(env.get("OPFORGE_SIGNING_KEY") or "").strip() or None,
        trusted_keys=tuple(p.strip() for p in (env.get("OPFORGE_TRUSTED_KEYS") or "").split(",") if p.strip()),
        remote_allow_unsigned=_flag(env.get("OPFORGE_REMOTE_ALLOW_UNSIGNED")),
        cxx=env.get("CXX") or None,
        cc=env.get("CC") or None,
        cuda_home=env.get("CUDA_HOME") or env.get("CUDA_PATH") or None,
        pytorch_nvcc=env.get("PYTORCH_NVCC") or None,
        cuda_arch_list=env.get("TORCH_CUDA_ARCH_LIST") or None,
        nvcc_gen_deps=env.get("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "0") != "1",
        path=env.get("PATH", os.defpath),
        aot_build=(env.get("OPFORGE_BUILD") or "").strip(),
        distributed=_distributed(env.get("OPFORGE_DISTRIBUTED")),
        shared_cache=_flag(env.get("OPFORGE_SHARED_CACHE")),
        dist_grace=_float(env, "OPFORGE_DIST_GRACE", 30.0),
        rank=_rank(env, "RANK", "SLURM_PROCID"),
        local_rank=_rank(env, "LOCAL_RANK", "SLURM_LOCALID"),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
        fallback_notice=(env.get("OPFORGE_FALLBACK_NOTICE") or "1").strip().lower() not in ("0", "false", "no", "off"),
        triton_tuning=_tuning(env.get("OPFORGE_TRITON_TUNING")),
        triton_compile_threads=_max_jobs((env.get("OPFORGE_TRITON_COMPILE_THREADS") or "").strip() or None),
        triton_direct=(env.get("OPFORGE_TRITON_DIRECT") or "1").strip().lower() not in ("0", "false", "no", "off"),
        native_launch=(env.get("OPFORGE_NATIVE_LAUNCH") or "1").strip().lower() not in ("0", "false", "no", "off"),
        block_sparse_cuda=(env.get("OPFORGE_BLOCK_SPARSE_CUDA") or "1").strip().lower() not in ("0", "false", "no", "off"),
        block_sparse_overlap=(env.get("OPFORGE_BLOCK_SPARSE_OVERLAP") or "1").strip().lower()
        not in ("0", "false", "no", "off"),
        patch_torch=_patch_torch(env.get("OPFORGE_PATCH_TORCH")),
        torch_env=TorchEnv(env.get("CUDA_HOME"), env.get("CUDA_PATH"), env.get("CUDNN_HOME"), env.get("CUDNN_PATH"),
                           env.get("CUDA_INC_PATH"), env.get("TORCH_EXTENSIONS_DIR"), env.get("XDG_CACHE_HOME")),
    )


def build_request(var: str, env: Mapping[str, str] | None = None) -> str:
    """A package's AOT request at ``pip install``: ``OPFORGE_BUILD`` for opforge's kernels, the
    variable a downstream package names (``MYPKG_BUILD``) for its own (``opforge.aot``)."""
    return ((os.environ if env is None else env).get(var) or "").strip()


def subprocess_env(without: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment for a subprocess: this process's, less the variables ``without``, plus ``extra``.

    >>> "OPFORGE_PATCH_TORCH" in subprocess_env(("OPFORGE_PATCH_TORCH",), X_TEST="1")
    False
    """
    env = {k: v for k, v in os.environ.items() if k not in without}
    env.update(extra)
    return env
