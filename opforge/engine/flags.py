"""Compile and link flags, derived the way torch's JIT derives them.

Include and library paths come from torch's public ``cpp_extension.include_paths`` /
``library_paths``; nvcc's common flags from its public ``COMMON_NVCC_FLAGS``. The CUDA
arch flags come from torch's private ``_get_cuda_arch_flags`` when it exists, else from
:func:`fallback_cuda_arch_flags` (tested to agree with it). Only the cold path imports
``torch.utils.cpp_extension`` (about 80 ms, or seconds in a process that hasn't imported torch: a
CPU build's paths and ``-std=`` are recorded in the cache beside torch's facts, ``torch_record.cpu_build``).
"""

from __future__ import annotations

import inspect
import os
import re
import sysconfig
from dataclasses import dataclass

from .. import compat
from ..errors import ToolchainError
from ..settings import Settings
from . import torch_record
from .key import BuildSpec
from .toolchain import default_cxx_std, linker_flags

_STD_RE = re.compile(r"['\"](-std=c\+\+\d\d)['\"]")

_NAMED_ARCHS = {"Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX", "Turing": "7.5+PTX", "Volta": "7.0+PTX"}


@dataclass(frozen=True)
class Flags:
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]


def fallback_cuda_arch_flags(arch_list: str | None, capabilities: list[tuple[int, int]]) -> list[str]:
    """``-gencode`` flags for a ``TORCH_CUDA_ARCH_LIST`` (or the visible GPUs), as torch makes them.

    >>> fallback_cuda_arch_flags("8.0;9.0+PTX", [])
    ['-gencode=arch=compute_80,code=sm_80', '-gencode=arch=compute_90,code=compute_90', '-gencode=arch=compute_90,code=sm_90']
    """
    if arch_list and arch_list != "native":
        text = arch_list.replace(" ", ";")
        for named, value in _NAMED_ARCHS.items():
            text = text.replace(named, value)
        archs = [a for a in text.split(";") if a]
    else:
        archs = sorted({f"{a}.{b}" for a, b in capabilities})
        if not archs:
            raise ValueError("no GPU is visible and TORCH_CUDA_ARCH_LIST is not set: set it, e.g. TORCH_CUDA_ARCH_LIST=9.0")
        archs[-1] += "+PTX"
    flags = set()
    for arch in archs:
        version = arch.split("+")[0]
        if "." not in version:
            raise ValueError(f"Unknown CUDA arch ({arch}) in TORCH_CUDA_ARCH_LIST: use forms like 8.0, 9.0a or 9.0+PTX")
        num = version.replace(".", "")
        flags.add(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.add(f"-gencode=arch=compute_{num},code=compute_{num}")
    return sorted(flags)


ARCH_SPECIFIC = "-DOPFORGE_ARCH_SPECIFIC=1"
"""In an extension's ``extra_cuda_cflags`` (and its C++ flags, for its host code): its sm_90 code is
built as sm_90a (wgmma, setmaxnreg: Hopper's arch-specific features, which run on compute capability 9.0
only). So where this define is set, a 9.0 GPU runs the build's sm_90a code, or else PTX older than
compute_90 (a list without 9.0), never sm_90 code. PTX (``+PTX``) stays compute_90, for the GPUs after it.
In the key, as every flag is."""


def arch_specific(flags: list[str]) -> list[str]:
    """``-gencode`` flags with sm_90's SASS built as sm_90a (``ARCH_SPECIFIC``).

    >>> arch_specific(['-gencode=arch=compute_80,code=sm_80', '-gencode=arch=compute_90,code=compute_90',
    ...                '-gencode=arch=compute_90,code=sm_90'])
    ['-gencode=arch=compute_80,code=sm_80', '-gencode=arch=compute_90,code=compute_90', '-gencode=arch=compute_90a,code=sm_90a']
    """
    return [f.replace("arch=compute_90,code=sm_90", "arch=compute_90a,code=sm_90a") for f in flags]


def cuda_arch_flags(extra_cuda_cflags: tuple[str, ...], settings: Settings) -> list[str]:
    from torch.utils import cpp_extension

    private = getattr(cpp_extension, "_get_cuda_arch_flags", None)
    if private is not None:
        try:
            return list(private(list(extra_cuda_cflags)))
        except TypeError:
            pass
    if any("arch" in f for f in extra_cuda_cflags):
        return []
    import torch

    caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    return fallback_cuda_arch_flags(settings.cuda_arch_list, caps)


def torch_cxx_std(torch_version: str) -> str:
    """The ``-std=`` torch's own JIT uses, read from its (private) ninja writer, or else
    inferred from the version."""
    from torch.utils import cpp_extension

    writer = getattr(cpp_extension, "_write_ninja_file_to_build_library", None)
    try:
        found = _STD_RE.findall(inspect.getsource(writer)) if writer else []
    except (OSError, TypeError):
        found = []
    return found[0] if found else default_cxx_std(torch_version)


def _torch_paths(fn, device: str) -> list[str]:
    """torch's include or library paths; its OSError when it knows no CUDA toolkit ("CUDA_HOME
    environment variable is not set") is a ToolchainError, not a failed write of the cache."""
    try:
        return list(fn(device))
    except OSError as exc:
        raise ToolchainError(f"torch found no CUDA toolkit for its {device} paths ({exc}): set CUDA_HOME to the "
                             "toolkit, e.g. CUDA_HOME=/usr/local/cuda") from exc


def _ask_torch(device: str, torch_version: str) -> dict:
    from torch.utils import cpp_extension

    return {"include": _torch_paths(cpp_extension.include_paths, device),
            "lib": _torch_paths(cpp_extension.library_paths, device), "std": torch_cxx_std(torch_version)}


def derive(spec: BuildSpec, settings: Settings) -> Flags:
    """All the flags of a build: torch's defaults plus the user's extras. A CPU build takes torch's
    answers from the cache's record of them where there is one (``torch_record.cpu_build``)."""
    device = "cuda" if spec.with_cuda else "cpu"
    if spec.with_cuda:
        asked = _ask_torch(device, spec.torch.version)
    else:
        asked = torch_record.cpu_build(settings.cache_dir, spec.torch, lambda: _ask_torch(device, spec.torch.version))
    system_includes = list(asked["include"])
    py_include = sysconfig.get_path("include", scheme="posix_prefix")
    if py_include and not spec.stable_abi:
        system_includes.append(py_include)
    common = []
    if spec.stable_abi:  # a plain library on the stable C ABI: no Python, no torch C++ API
        common += [compat.stable_abi_macro(spec.stable_abi)]
    elif not spec.is_standalone:
        common += [f"-DTORCH_EXTENSION_NAME={spec.name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    common += [f"-D_GLIBCXX_USE_CXX11_ABI={int(spec.torch.cxx11_abi)}"]
    common += [f"-I{p}" for p in spec.extra_include_paths]
    for p in system_includes:
        common += ["-isystem", p]  # two arguments: nvcc rejects the joined form

    std = asked["std"]
    cflags = common + ["-fPIC", std, *spec.extra_cflags]

    cuda_cflags: list[str] = []
    if spec.with_cuda:
        from torch.utils import cpp_extension

        cuda_cflags = common + list(cpp_extension.COMMON_NVCC_FLAGS)
        arch = cuda_arch_flags(spec.extra_cuda_cflags, settings)
        cuda_cflags += arch_specific(arch) if ARCH_SPECIFIC in spec.extra_cuda_cflags else arch
        cuda_cflags += ["--compiler-options", "-fPIC", *spec.extra_cuda_cflags]
        if not any(f.startswith("-std=") for f in cuda_cflags):
            cuda_cflags.append(std)
        if settings.cc:
            cuda_cflags = ["-ccbin", settings.cc, *cuda_cflags]

    lib_dirs = list(asked["lib"])  # torch's lib dir (+ CUDA's for device="cuda")
    torch_lib = lib_dirs[0]
    ldflags = [] if spec.is_standalone else ["-shared"]
    ldflags += list(spec.extra_ldflags)
    ldflags += [f"-L{p}" for p in lib_dirs]
    ldflags.append("-lc10")
    if spec.with_cuda:
        ldflags.append("-lc10_cuda")
    ldflags.append("-ltorch_cpu")
    if spec.with_cuda:
        ldflags.append("-ltorch_cuda")
    ldflags.append("-ltorch")
    if spec.is_standalone:
        ldflags.append(f"-Wl,-rpath,{torch_lib}")
    elif not spec.stable_abi:
        ldflags.append("-ltorch_python")
    if spec.with_cuda:
        ldflags.append("-lcudart")
    runtime = runtime_ldflags(spec.cxx)
    ldflags += runtime
    ldflags += linker_flags(spec.cxx, settings.linker, spec.extra_ldflags, settings.path, tuple(runtime))
    return Flags(tuple(cflags), tuple(cuda_cflags), tuple(ldflags))


def runtime_ldflags(cxx) -> list[str]:
    """Link the shared C++ runtime torch uses when the compiler would link a static copy."""
    from .toolchain import static_libstdcxx

    return [SHARED_LIBSTDCXX] if cxx is not None and static_libstdcxx(cxx) else []


SHARED_LIBSTDCXX = "-l:libstdc++.so.6"


def system_prefixes(spec: BuildSpec, cuda_home: str | None) -> list[str]:
    """Directories whose headers the key covers already (torch, Python, CUDA, the OS)."""
    prefixes = [os.path.join(spec.torch.root, "include"), "/usr/include", "/usr/lib/gcc", "/usr/lib/llvm"]
    py_include = sysconfig.get_path("include", scheme="posix_prefix")
    if py_include:
        prefixes.append(py_include)
    if cuda_home:
        prefixes.append(os.path.realpath(cuda_home))
        prefixes.append(cuda_home)
    return prefixes
