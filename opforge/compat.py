"""Will a binary built here run there? One place for each rule of binary compatibility.

Facts about the torch a binary is built against (:class:`TorchFacts`) and the rules that
compare them, each a pure function returning a :class:`~opforge.decision.Decision` whose
reason names what differs and the fix. The rules are written once and called by every
place that decides: the build key (``engine/key.py``), a loader's ``check_compatible``
(``extension/``), prebuilt binaries (``prebuilt.py``), cache archives
(``engine/archive.py``), and ``opforge doctor``:

* :func:`stable_abi`: a binary on the LibTorch stable ABI runs on its target torch and
  every later one;
* :func:`same_torch`: any other binary needs the very torch build it was compiled against
  (version, git hash, CUDA/HIP, C++ ABI, Python, machine);
* :func:`cuda_major`: nvcc's CUDA major version must be torch's;
* :func:`cuda_archs`: a CUDA binary was built for the archs this machine asks for.

Versions are read by one parser, :func:`version_numbers`.

This module sits low in the layers: it imports only ``decision`` and ``process`` (torch
lazily, in :func:`torch_facts`).
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import re
import sys
from dataclasses import asdict, dataclass, fields, replace

from .decision import Accepted, Decision, Rejected
from .process import forgets

_NUMBERS = re.compile(r"(?<![\w.])(\d+)\.(\d+)(?:\.(\d+))?")


def version_numbers(text: str) -> tuple[int, ...]:
    """The first dotted number in a version string or a tool's ``--version`` line; ``()`` if none.

    >>> version_numbers("2.11.0a0+git123"), version_numbers("2.10"), version_numbers("12.8")
    ((2, 11, 0), (2, 10), (12, 8))
    >>> version_numbers("g++ (Debian 12.2.0-14) 12.2.0")
    (12, 2, 0)
    >>> version_numbers("Build cuda_13.0.r13.0/compiler.36260728_0"), version_numbers("unknown")
    ((13, 0), ())
    """
    m = _NUMBERS.search(text.replace("_", " "))
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def version_tuple(version: str) -> tuple[int, int]:
    """A torch-style version's ``(major, minor)``; ValueError when it has none.

    >>> version_tuple("2.13.0+cpu"), version_tuple("2.11.0a0+git123"), version_tuple("2.10")
    ((2, 13), (2, 11), (2, 10))
    """
    numbers = version_numbers(version)
    if len(numbers) < 2:
        raise ValueError(f"{version!r} is not a version of the form MAJOR.MINOR (e.g. '2.10')")
    return numbers[0], numbers[1]


@dataclass(frozen=True)
class TorchFacts:
    """What about the running torch and Python changes a binary built against them.

    Every field has a default, so a test states only what matters: ``TorchFacts("2.9.0")``."""

    version: str = "2.13.0"
    git_version: str = ""
    cuda: str | None = None
    hip: str | None = None
    cxx11_abi: bool = True
    root: str = ""
    """Where torch is installed (its libraries are linked from there)."""
    python_tag: str = "cpython-311"
    ext_suffix: str = ".so"
    machine: str = "x86_64"

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> TorchFacts | None:
        """Facts read back from a record (a manifest, ``build_info.json``); None when ``data``
        is not such a record. Missing fields read as unknown (empty), never as this machine's."""
        if not isinstance(data, dict) or not isinstance(data.get("version"), str):
            return None
        known = {f.name for f in fields(cls)}
        unknown = dict.fromkeys(known, "") | {"cuda": None, "hip": None, "cxx11_abi": True}
        return cls(**(unknown | {k: v for k, v in data.items() if k in known}))

    def abi_key(self, stable_abi: str = "", where: bool = False) -> tuple:
        """What about torch a binary depends on, as the build key hashes it: the exact build for
        torch's C++ API; on the stable ABI only its target, CUDA/HIP, the C++ ABI and the machine.
        Where torch is installed only with ``where`` (an executable records it as its rpath).

        >>> TorchFacts("2.13.0+cpu", "abc").abi_key("2.10")
        ('stable-abi', '2.10', None, None, True, 'x86_64')
        >>> TorchFacts("2.13.0", root="/a").abi_key() == TorchFacts("2.13.0", root="/b").abi_key()
        True
        """
        if stable_abi:
            return ("stable-abi", stable_abi, self.cuda, self.hip, self.cxx11_abi, self.machine)
        return self.as_tuple() if where else replace(self, root="").as_tuple()


@functools.lru_cache(maxsize=1)
def torch_facts() -> TorchFacts:
    """The running torch's facts (imports torch; memoized, forgotten by ``opforge.reset()``)."""
    import torch

    return TorchFacts(
        version=str(torch.__version__),
        git_version=str(getattr(torch.version, "git_version", "")),
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        cxx11_abi=bool(torch.compiled_with_cxx11_abi()),
        root=os.path.dirname(os.path.realpath(torch.__file__)),
        python_tag=sys.implementation.cache_tag or "",
        ext_suffix=importlib.machinery.EXTENSION_SUFFIXES[0],
        machine=os.uname().machine,
    )


forgets(torch_facts.cache_clear)


_TF32_GETTER = "_get_cublas_allow_tf32"


def tf32_reader():
    """A callable that reads ``torch.backends.cuda.matmul.allow_tf32`` as it is now, for the per-call paths
    of the fp32 kernels. That is torch's own getter, ``torch._C._get_cublas_allow_tf32``, where it exists:
    it is private, and 13x cheaper than the property, whose ``__getattr__`` compares names first (0.04
    against 0.53 µs a read on the 2-core dev machine: bench/block_sparse_replay_python.py). Else the property (tests/engine/test_compat.py checks
    that the two agree)."""
    import torch

    getter = getattr(torch._C, _TF32_GETTER, None)
    if callable(getter):
        return getter
    return lambda: torch.backends.cuda.matmul.allow_tf32


def stable_abi_macro(target: str) -> str:
    """The ``TORCH_TARGET_VERSION`` define that builds against a stable ABI target.

    >>> stable_abi_macro("2.10")
    '-DTORCH_TARGET_VERSION=0x020a000000000000'
    """
    major, minor = version_tuple(target)
    return f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"


def stable_abi(target: str, torch_version: str) -> Decision:
    """A binary on the LibTorch stable ABI of torch ``target`` runs on that torch and every later one.

    >>> bool(stable_abi("2.10", "2.13.0+cpu")), str(stable_abi("2.10", "2.9.1"))
    (True, 'rejected: targets the LibTorch stable ABI of torch 2.10, but torch 2.9.1 is installed: upgrade torch to >= 2.10')
    """
    if version_tuple(torch_version) < version_tuple(target):
        return Rejected(f"targets the LibTorch stable ABI of torch {target}, but torch {torch_version} "
                        f"is installed: upgrade torch to >= {target}")
    return Accepted(f"stable ABI {target}, torch {torch_version}")


#: What a binary built on torch's C++ API shares with the torch it runs on, in the order checked.
_SAME_BUILD = ("machine", "version", "git_version", "cuda", "hip", "cxx11_abi", "python_tag")
_WHAT = {"machine": "machine", "version": "torch", "git_version": "torch build (git)", "cuda": "CUDA",
         "hip": "HIP", "cxx11_abi": "C++ ABI (_GLIBCXX_USE_CXX11_ABI)", "python_tag": "Python"}


def same_torch(built: TorchFacts, here: TorchFacts, stable_abi_target: str = "", uses_cuda: bool = True) -> Decision:
    """May a binary built against ``built`` run with ``here``'s torch? On the stable ABI: the same
    machine, CUDA/HIP (when the binary uses them) and C++ ABI, and :func:`stable_abi`. Otherwise the
    very torch build it was compiled against. A field recorded as unknown (empty) is not compared.

    >>> here = TorchFacts("2.13.0+cpu", "g13")
    >>> str(same_torch(TorchFacts("2.12.0+cpu"), here))
    'rejected: built for torch 2.12.0+cpu, but here torch is 2.13.0+cpu'
    >>> bool(same_torch(TorchFacts("2.10.0", cuda="12.8"), here, "2.10", uses_cuda=False))
    True
    >>> str(same_torch(TorchFacts("2.13.0+cpu", "g12"), here))
    'rejected: built for torch build (git) g12, but here torch build (git) is g13'
    """
    checked = ("machine", "cuda", "hip", "cxx11_abi") if stable_abi_target else _SAME_BUILD
    for name in checked:
        if name in ("cuda", "hip") and stable_abi_target and not uses_cuda:
            continue
        theirs, ours = getattr(built, name), getattr(here, name)
        if theirs == "" or ours == "":
            continue
        if (theirs or None) != (ours or None):
            return Rejected(f"built for {_WHAT[name]} {theirs}, but here {_WHAT[name]} is {ours}")
    if stable_abi_target:
        return stable_abi(stable_abi_target, here.version)
    return Accepted(f"torch {here.version}")


def cuda_major(nvcc_release: tuple[int, ...], torch_cuda: str | None, nvcc_path: str = "nvcc") -> Decision:
    """nvcc's CUDA against torch's, as torch's own JIT checks it: another major version is
    Rejected (a binary built with it would not load, or misbehave); another minor is Accepted
    with a note; Accepted with no reason when they match or either is unknown.

    >>> bool(cuda_major((11, 8), "12.8", "/usr/local/cuda-11.8/bin/nvcc"))
    False
    >>> cuda_major((12, 4), "12.8").reason
    'nvcc is CUDA 12.4, torch was built with CUDA 12.8: a minor-version difference, which torch accepts too'
    >>> cuda_major((13, 0), "13.0"), cuda_major((), "12.8"), cuda_major((12, 8), None)
    (Accepted(reason='', ok=True), Accepted(reason='', ok=True), Accepted(reason='', ok=True))
    """
    torch_v = version_numbers(torch_cuda or "")[:2]
    if len(torch_v) < 2 or len(nvcc_release) < 2:
        return Accepted()
    ours = f"{nvcc_release[0]}.{nvcc_release[1]}"
    if nvcc_release[0] != torch_v[0]:
        return Rejected(f"{nvcc_path} is CUDA {ours}, but torch was built with CUDA {torch_cuda}: a binary built "
                        f"with it would not load (or not run) with this torch. Point CUDA_HOME at a CUDA "
                        f"{torch_v[0]}.x toolkit (e.g. CUDA_HOME=/usr/local/cuda-{torch_cuda}), or install a torch "
                        f"built for CUDA {nvcc_release[0]}")
    if tuple(nvcc_release[:2]) != torch_v:
        return Accepted(f"nvcc is CUDA {ours}, torch was built with CUDA {torch_cuda}: a minor-version difference, "
                        f"which torch accepts too")
    return Accepted()


def cuda_archs(built_list: str, built_archs: str, here_list: str, here_archs: str) -> Decision:
    """Was a binary built for the CUDA archs a build here would target? ``*_list`` is
    ``TORCH_CUDA_ARCH_LIST`` ("" when unset); ``*_archs`` is what decided the archs (the build
    key's ``cuda_archs``: "flags" for explicit ``-gencode`` flags, "list:...", "visible:9.0",
    "none", or "" for a binary without CUDA).

    >>> bool(cuda_archs("", "visible:9.0", "", "visible:9.0")), bool(cuda_archs("", "flags", "", "none"))
    (True, True)
    >>> cuda_archs("", "visible:8.0", "", "visible:9.0").reason.split(";")[0]
    "built for the CUDA archs 'visible:8.0'"
    """
    if built_list != here_list:
        return Rejected(f"built with TORCH_CUDA_ARCH_LIST={built_list!r}; here it is {here_list!r}")
    if built_archs and built_archs != "flags" and built_archs != here_archs:
        return Rejected(f"built for the CUDA archs {built_archs!r}; this machine needs {here_archs!r} "
                        "(build with the same TORCH_CUDA_ARCH_LIST on both machines)")
    return Accepted()


__all__ = ["TorchFacts", "cuda_archs", "cuda_major", "same_torch", "stable_abi", "stable_abi_macro", "torch_facts",
           "version_numbers", "version_tuple"]
