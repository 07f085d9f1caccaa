"""Facts about this machine, as one frozen :class:`Platform`.

Everything that decides which kernel can run here goes into it: the OS and CPU (its
microarchitecture and feature flags, from ``archspec``), the GPUs and their compute
capabilities, the compilers and ninja with their versions, and torch's build (a
:class:`~opforge.compat.TorchFacts`: version, CUDA/HIP, C++ ABI, Python).

``current()`` detects it once per process. Selection (``selection.select``) takes a Platform
as an argument and nothing else from the machine, so tests build Platforms by hand for
hardware we don't have: every field has a default, and a test states only what matters::

    >>> arm = Platform(machine="aarch64", cpu=Cpu(family="aarch64", microarch="neoverse_v1",
    ...                features=frozenset({"asimd", "fphp"})))
    >>> arm.cpu.has("asimd"), arm.is_x86, arm.has_cuda_gpu
    (True, False, False)
    >>> Platform(gpus=(Gpu(0, "A100", "nvidia", (8, 0)),)).cuda_capabilities
    ((8, 0),)

GPUs are listed without initialising CUDA unless asked (``init_cuda=True``) or CUDA is
initialised already: a process that initialises CUDA and then forks (a DataLoader with
workers) breaks its children. NVIDIA GPUs come from NVML (``nvml.py``), which is safe.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform as _stdlib_platform
import threading
from dataclasses import asdict, dataclass, field

from . import compat
from . import settings as settings_mod
from .compat import TorchFacts, version_numbers
from .errors import ToolchainError
from .files import atomic_write
from .process import forgets


@dataclass(frozen=True)
class Cpu:
    family: str = "x86_64"
    """archspec's family: ``x86_64``, ``aarch64``, ``ppc64le``..."""
    microarch: str = "x86_64"
    """archspec's name for the host: ``icelake``, ``zen4``, ``neoverse_v2``... (the family when unknown)."""
    vendor: str = ""
    features: frozenset[str] = frozenset()
    """Feature flags as archspec (and ``/proc/cpuinfo``) spell them: ``avx512f``, ``avx2``, ``fma``, ``asimd``..."""
    cores: int = 1
    """CPUs this process may run on (its affinity mask)."""

    def has(self, *names: str) -> bool:
        return all(n in self.features for n in names)

    def missing(self, *names: str) -> list[str]:
        return [n for n in names if n not in self.features]


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    vendor: str
    """``nvidia`` or ``amd``."""
    capability: tuple[int, int] | None = None
    """CUDA compute capability, e.g. ``(9, 0)``; None on ROCm."""
    arch: str = ""
    """``sm_90`` on CUDA, the gfx target (``gfx90a``) on ROCm."""
    memory_bytes: int = 0


@dataclass(frozen=True)
class ToolInfo:
    path: str
    version: str = ""
    """First line of ``--version`` (nvcc: its release line); empty when it could not be run."""

    @property
    def version_tuple(self) -> tuple[int, ...]:
        """The first dotted number of the version line, e.g. ``(12, 2, 0)``; ``()`` if none.

        >>> ToolInfo("/usr/bin/g++", "g++ (Debian 12.2.0-14) 12.2.0").version_tuple
        (12, 2, 0)
        >>> ToolInfo("/cuda/bin/nvcc", "Build cuda_13.0.r13.0/compiler.36260728_0").version_tuple
        (13, 0)
        """
        return version_numbers(self.version)


@dataclass(frozen=True)
class Platform:
    os: str = "Linux"
    machine: str = "x86_64"
    cpu: Cpu = field(default_factory=Cpu)
    gpus: tuple[Gpu, ...] = ()
    gpu_probe: str = "none"
    """How the GPUs were found: ``nvml``, ``torch``, or why they were not looked for."""
    cxx: ToolInfo | None = None
    nvcc: ToolInfo | None = None
    ninja: ToolInfo | None = None
    torch: TorchFacts = field(default_factory=TorchFacts)
    """The running torch's build: ``Platform(torch=TorchFacts("2.9.1", cuda="12.8"))`` in a test."""
    triton: str | None = None
    """The installed triton's version (not imported), or None."""

    @property
    def is_x86(self) -> bool:
        return self.machine in ("x86_64", "AMD64", "i686")

    @property
    def has_cuda_gpu(self) -> bool:
        return any(g.vendor == "nvidia" for g in self.gpus)

    @property
    def cuda_capabilities(self) -> tuple[tuple[int, int], ...]:
        return tuple(g.capability for g in self.gpus if g.capability is not None)

    @property
    def torch_version(self) -> str:
        return self.torch.version

    @property
    def torch_minor(self) -> tuple[int, int]:
        """``(2, 13)`` for torch 2.13.0+cpu."""
        return compat.version_tuple(self.torch.version)

    @property
    def torch_git(self) -> str:
        return self.torch.git_version

    @property
    def torch_cuda(self) -> str | None:
        return self.torch.cuda

    @property
    def torch_hip(self) -> str | None:
        return self.torch.hip

    def to_json(self) -> dict:
        data = asdict(self)
        data["cpu"]["features"] = sorted(self.cpu.features)
        t = data.pop("torch")  # the report's flat keys (cli/report.schema.json), as before TorchFacts was embedded
        data.update(torch_version=t["version"], torch_git=t["git_version"], torch_cuda=t["cuda"], torch_hip=t["hip"],
                    cxx11_abi=t["cxx11_abi"], python_tag=t["python_tag"])
        return data


_CURRENT: dict[tuple, Platform] = {}
_CURRENT_LOCK = threading.Lock()


@forgets
def _forget() -> None:
    with _CURRENT_LOCK:
        _CURRENT.clear()
    detect_cpu.cache_clear()


def current(settings: settings_mod.Settings | None = None, init_cuda: bool = False) -> Platform:
    """This machine's Platform, detected once per process (per settings that matter)."""
    s = settings or settings_mod.current()
    memo = (s.cxx, s.path, s.cuda_home, s.pytorch_nvcc, s.cuda_visible_devices, s.cuda_device_order, s.cache_dir,
            init_cuda or _cuda_initialized())
    with _CURRENT_LOCK:
        found = _CURRENT.get(memo)
        if found is None:
            found = _CURRENT[memo] = detect(s, init_cuda)
        return found


def detect(s: settings_mod.Settings, init_cuda: bool = False) -> Platform:
    from .engine import toolchain

    torch = compat.torch_facts()
    gpus, probe = _gpus(s, init_cuda, torch.cuda, torch.hip)
    cxx = toolchain.find_cxx(s)
    nvcc = toolchain.find_nvcc(s)
    try:
        ninja: str | None = toolchain.ninja()
    except ToolchainError:  # ninja missing: a fact, reported as None
        ninja = None
    return Platform(
        os=_stdlib_platform.system(),
        machine=os.uname().machine,
        cpu=detect_cpu(),
        gpus=gpus,
        gpu_probe=probe,
        cxx=_tool_info(cxx.argv, cxx.identity, s) if cxx else None,
        nvcc=_tool_info(nvcc.argv, nvcc.identity, s) if nvcc else None,
        ninja=_tool_info((ninja,), _identity(ninja), s) if ninja else None,
        torch=torch,
        triton=_triton_version(),
    )


@functools.lru_cache(maxsize=1)
def detect_cpu() -> Cpu:
    """The host CPU through archspec (``/proc/cpuinfo`` on Linux)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        import archspec.cpu

        host = archspec.cpu.host()
    except Exception:  # noqa: BLE001 - archspec can't read this host: keep the machine name, no features
        machine = os.uname().machine
        return Cpu(family=machine, microarch=machine, cores=cores)
    return Cpu(
        family=str(host.family.name),
        microarch=str(host.name),
        vendor=str(host.vendor),
        features=frozenset(host.features),
        cores=cores,
    )


def _cuda_initialized() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _gpus(s: settings_mod.Settings, init_cuda: bool, cuda: str | None, hip: str | None) -> tuple[tuple[Gpu, ...], str]:
    if cuda is None and hip is None:
        return (), "none: this torch is built without CUDA or ROCm"
    if init_cuda or _cuda_initialized():
        import torch

        if not torch.cuda.is_available():
            return (), "torch: no GPU visible"
        found = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            if hip is not None:
                arch = str(getattr(p, "gcnArchName", "")).split(":")[0]
                found.append(Gpu(i, p.name, "amd", None, arch, int(p.total_memory)))
            else:
                cap = (int(p.major), int(p.minor))
                found.append(Gpu(i, p.name, "nvidia", cap, f"sm_{cap[0]}{cap[1]}", int(p.total_memory)))
        return tuple(found), "torch"
    if hip is not None:
        return (), "not probed: listing ROCm GPUs would initialise HIP (pass init_cuda=True)"
    from . import nvml
    from .engine import gpu_record

    everything = gpu_record.listed(s.cache_dir)  # NVML's list, or the cache's record of this GPU set
    if everything is None:
        return (), "none: NVML (the NVIDIA driver) is not available"
    listed = nvml.arrange(s.cuda_visible_devices, everything, s.cuda_device_order)
    if listed is None:
        return (), ("not probed: mixed GPUs numbered by CUDA_DEVICE_ORDER=FASTEST_FIRST can't be told apart without "
                    "initialising CUDA (set CUDA_DEVICE_ORDER=PCI_BUS_ID, or pass init_cuda=True)")
    return tuple(
        Gpu(g.index, g.name, "nvidia", g.capability, f"sm_{g.capability[0]}{g.capability[1]}", g.memory_bytes)
        for g in listed
    ), "nvml"


def _triton_version() -> str | None:
    from importlib import metadata

    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _identity(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def _tool_info(argv: tuple[str, ...], identity: str, s: settings_mod.Settings) -> ToolInfo:
    """The tool and its ``--version``. The version is memoised on disk by the tool's identity
    (real path, size, mtime), so a process pays the subprocess only once per installed tool."""
    from .engine import toolchain

    memo = os.path.join(s.cache_dir, ".tools", hashlib.sha256(identity.encode()).hexdigest()[:24])
    try:
        with open(memo, encoding="utf-8") as f:
            return ToolInfo(argv[0], f.read().strip())
    except OSError:
        pass
    try:
        version = toolchain.probe_version(argv)
    except ToolchainError:  # it exists but won't run: report it without a version
        return ToolInfo(argv[0], "")
    try:
        os.makedirs(os.path.dirname(memo), mode=0o700, exist_ok=True)
        atomic_write(memo, version, durable=False)
    except OSError:
        pass  # an unwritable cache only costs the probe next time
    return ToolInfo(argv[0], version)
