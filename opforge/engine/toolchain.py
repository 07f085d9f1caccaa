"""Facts about the tools a build uses: compilers, nvcc, ninja (torch's facts: ``opforge/compat.py``).

Two speeds:

* ``*_identity()`` is for the warm path. It finds the tool and stats it: no subprocess.
  A compiler upgrade replaces the binary, which changes its (size, mtime), so the
  identity changes and so does the build key.
* ``probe_version()`` runs ``TOOL --version``; only the cold path calls it, and the
  result goes into the manifest for people to read.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ..compat import cuda_major, version_numbers, version_tuple
from ..errors import ToolchainError
from ..process import forgets
from ..settings import Settings


@dataclass(frozen=True)
class Tool:
    """A tool found on this machine."""

    argv: tuple[str, ...]
    """The command to run it with (``CXX`` may hold a wrapper and arguments)."""
    path: str
    """The real path of the executable."""
    size: int
    mtime_ns: int

    @property
    def identity(self) -> str:
        return f"{self.path}:{self.size}:{self.mtime_ns}"


def _resolve(argv: list[str], path_env: str) -> Tool | None:
    exe = argv[0]
    found = exe if os.sep in exe and os.access(exe, os.X_OK) else shutil.which(exe, path=path_env)
    if not found:
        return None
    real = os.path.realpath(found)
    st = os.stat(real)
    return Tool(argv=(found, *argv[1:]), path=real, size=st.st_size, mtime_ns=st.st_mtime_ns)


def find_cxx(settings: Settings) -> Tool | None:
    """The C++ compiler (``$CXX``, else ``c++``, as torch does), or None when there is none."""
    argv = shlex.split(settings.cxx or "c++")
    return _resolve(argv, settings.path) if argv else None


def cxx(settings: Settings) -> Tool:
    """The C++ compiler, or a ToolchainError that says how to get one."""
    command = settings.cxx or "c++"
    tool = find_cxx(settings)
    if tool is None:
        how = (
            f"CXX={command!r} does not name a compiler on PATH; fix CXX or unset it"
            if settings.cxx
            else "install one (e.g. `apt-get install g++`) or point CXX at a compiler, e.g. CXX=/usr/bin/g++"
        )
        raise ToolchainError(f"C++ compiler {command!r} not found: {how}.")
    return tool


def cuda_home(settings: Settings) -> str | None:
    """The CUDA toolkit, found the way torch finds it: CUDA_HOME/CUDA_PATH, nvcc on PATH, /usr/local/cuda."""
    if settings.cuda_home:
        return settings.cuda_home
    nvcc = shutil.which("nvcc", path=settings.path)
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None


def find_nvcc(settings: Settings) -> Tool | None:
    try:
        return nvcc(settings)
    except ToolchainError:
        return None


def nvcc(settings: Settings) -> Tool:
    """nvcc: ``$PYTORCH_NVCC``, else ``$CUDA_HOME/bin/nvcc``, as torch does."""
    if settings.pytorch_nvcc:
        tool = _resolve(shlex.split(settings.pytorch_nvcc), settings.path)
        if tool is None:
            raise ToolchainError(f"PYTORCH_NVCC={settings.pytorch_nvcc!r} is not an executable; fix or unset it.")
        return tool
    home = cuda_home(settings)
    candidate = os.path.join(home, "bin", "nvcc") if home else None
    tool = _resolve([candidate], settings.path) if candidate and os.path.exists(candidate) else None
    if tool is None:
        where = f"{candidate} does not exist" if candidate else "no CUDA toolkit was found"
        raise ToolchainError(
            f"CUDA sources need nvcc, but {where}. Install the CUDA toolkit and set CUDA_HOME "
            "to it (e.g. CUDA_HOME=/usr/local/cuda), or drop the .cu sources."
        )
    return tool


@functools.lru_cache(maxsize=16)
def nvcc_release(argv: tuple[str, ...], identity: str) -> tuple[int, ...]:
    """nvcc's CUDA release, ``(13, 0)``, from ``--version`` (memoized per binary; ``()`` if unreadable)."""
    del identity  # part of the memo key: a reinstalled toolkit is asked again
    try:
        line = probe_version(argv)
    except ToolchainError:
        return ()
    return version_numbers(line)[:2]


def check_cuda(nvcc_tool: Tool, torch_cuda: str | None, notice) -> None:
    """Raises ToolchainError on a CUDA major-version mismatch between nvcc and torch; a notice
    on a minor one (cold path: one ``nvcc --version`` per toolkit and process)."""
    verdict = cuda_major(nvcc_release(nvcc_tool.argv, nvcc_tool.identity), torch_cuda, nvcc_tool.path)
    if not verdict:
        raise ToolchainError(verdict.reason)
    if verdict.reason:
        notice(verdict.reason)


def ccache(settings: Settings) -> str | None:
    """The compiler cache to put in front of c++ and nvcc: ccache, else sccache, as torch
    2.13 does, when ``OPFORGE_CCACHE`` allows it (and ``TORCH_NO_COMPILER_WRAPPER`` is unset)."""
    choice = settings.ccache
    if choice.lower() in ("0", "off", "no", "false", ""):
        return None
    if choice.lower() in ("auto", "1", "on", "yes", "true"):
        return shutil.which("ccache", path=settings.path) or shutil.which("sccache", path=settings.path)
    return choice if os.access(choice, os.X_OK) else None


def ninja() -> str:
    """The ninja executable: the PyPI package's first, else one on PATH."""
    try:
        import ninja as ninja_pkg

        candidate = os.path.join(ninja_pkg.BIN_DIR, "ninja")
        if os.access(candidate, os.X_OK):
            return candidate
    except ImportError:
        pass
    found = shutil.which("ninja")
    if not found:
        raise ToolchainError("ninja is required to build extensions: `pip install ninja`.")
    return found


def probe_version(argv: tuple[str, ...] | list[str]) -> str:
    """First line of ``TOOL --version`` (cold path only)."""
    try:
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"could not run {' '.join(argv)} --version: {exc}") from exc
    lines = [ln for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        raise ToolchainError(f"{' '.join(argv)} --version failed (exit {out.returncode}): {out.stderr.strip()[:300]}")
    # nvcc prints a banner; its last line holds the release.
    return lines[-1].strip() if "nvcc" in argv[0] else lines[0].strip()


@functools.lru_cache(maxsize=16)
def _print_file_name(argv: tuple[str, ...], identity: str, name: str) -> str:
    del identity  # part of the memo key: a reinstalled compiler is asked again
    try:
        out = subprocess.run([*argv, f"-print-file-name={name}"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


#: The linkers ``OPFORGE_LINKER=auto`` tries, fastest first. Linking a kernel against
#: libtorch_cpu.so is mostly reading its symbol table, which these do faster than GNU ld
#: (docs/benchmarks.md, issue 5's build section).
FAST_LINKERS = ("mold", "lld", "gold")


@functools.lru_cache(maxsize=32)
def links_with(argv: tuple[str, ...], identity: str, linker: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether ``CXX -fuse-ld=LINKER`` links a C++ shared object here, with the C++ runtime and
    ``extra`` flags as a kernel's link has them (cold path only, memoised). A C file would not
    do: on the GPU host gold linked one, then failed on the relocated GCC's libstdc++.so."""
    del identity  # part of the memo key
    with tempfile.TemporaryDirectory(prefix="opforge-ld-") as d:
        src = os.path.join(d, "probe.cpp")
        with open(src, "w") as f:
            f.write('#include <string>\nstd::string opforge_probe(int n) { return std::to_string(n) + "!"; }\n')
        try:
            out = subprocess.run([*argv, f"-fuse-ld={linker}", "-shared", "-fPIC", src, "-o",
                                  os.path.join(d, "probe.so"), *extra], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return out.returncode == 0


@functools.lru_cache(maxsize=16)
def accepts_prefix_map(argv: tuple[str, ...], identity: str) -> bool:
    """Whether the compiler takes ``-ffile-prefix-map`` (GCC 8+, clang 10+): one preprocessor run on
    the cold path, memoised per compiler."""
    del identity  # part of the memo key
    try:
        out = subprocess.run([*argv, "-ffile-prefix-map=/opforge-probe=.", "-E", "-x", "c++", os.devnull, "-o",
                              os.devnull], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def linker_flags(cxx: Tool | None, choice: str, extra_ldflags: tuple[str, ...] = (),
                 path_env: str | None = None, runtime: tuple[str, ...] = ()) -> list[str]:
    """``-fuse-ld=...`` for ``OPFORGE_LINKER`` (see settings.py); nothing when the user's own
    flags pick a linker, or with ``default``, or when ``auto`` finds no faster linker. ``auto``
    tries a real link (with the ``runtime`` flags a kernel's link gets) only with the linkers
    whose ``ld.NAME`` is on ``path_env``."""
    if cxx is None or choice == "default" or any(f.startswith("-fuse-ld=") for f in extra_ldflags):
        return []
    if choice != "auto":
        return [f"-fuse-ld={choice}"]
    for name in FAST_LINKERS:
        if shutil.which(f"ld.{name}", path=path_env) and links_with(cxx.argv, cxx.identity, name, runtime):
            return [f"-fuse-ld={name}"]
    return []


def static_libstdcxx(cxx: Tool) -> bool:
    """True when the compiler has no shared libstdc++ of its own (a relocated GCC that ships
    only ``libstdc++.a``): it would link a private copy of the C++ runtime into each kernel,
    and an exception thrown by the kernel (a failed input check) would crash the process
    when torch's runtime tries to catch it. The cold path then links the system's
    ``libstdc++.so.6``, the one torch uses. GCC answers ``-print-file-name`` with the bare
    name when it can't find the file."""
    found = _print_file_name(cxx.argv, cxx.identity, "libstdc++.so")
    return bool(found) and os.sep not in found and "clang" not in os.path.basename(cxx.path)


def default_cxx_std(torch_version: str) -> str:
    """The C++ standard torch's own JIT builds use, by version (2.11 used C++17, 2.13 C++20).

    >>> default_cxx_std("2.13.0+cpu"), default_cxx_std("2.11.0+cu130")
    ('-std=c++20', '-std=c++17')
    """
    return "-std=c++20" if version_tuple(torch_version) >= (2, 13) else "-std=c++17"


def host_cpu_identity() -> str:
    """The host CPU's model and feature flags, for builds tuned to the host (a ``native`` -march, -mtune or -mcpu)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            wanted = {}
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features", "CPU part") and key not in wanted:
                    wanted[key] = value.strip()
                if not line.strip() and wanted:
                    break
        return repr(sorted(wanted.items()))
    except OSError:
        return os.uname().machine


@forgets
def _forget() -> None:
    """The probes memoized per tool identity (``opforge.reset()``)."""
    for memo in (nvcc_release, _print_file_name, links_with, accepts_prefix_map):
        memo.cache_clear()
