"""The kernels built at ``pip install`` (``OPFORGE_BUILD=...``) into ``opforge/_C``.

``opforge/_C/build_info.json`` records what they were built against; ``check`` decides,
from that record and the running :class:`~opforge.platform.Platform` alone, whether a
binary may be loaded here:

* a stable-ABI binary needs a torch at least as new as its stable ABI target;
* any other binary needs the very torch build it was compiled against (version and git
  hash), the same CUDA/HIP and the same C++ ABI.

Schema of ``build_info.json`` (``format`` 1)::

    {"format": 1, "opforge": "0.1.0", "built_at": 1763780000.0, "compiler": "g++ (...) 12.2.0",
     "torch": "2.13.0+cpu", "torch_git": "...", "cuda": null, "hip": null, "cxx11_abi": true,
     "python_tag": "cpython-311", "machine": "x86_64",
     "extensions": {"selftest_avx2": {"file": "selftest_avx2.abi3.so", "sha256": "...", "kind": "selftest",
                                      "backend": "cpp", "isa": "avx2", "stable_abi": "2.10"}}}
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field

from .decision import Accepted, Decision, Rejected

FORMAT = 1
PACKAGE = "opforge._C"
"""Where opforge's own kernels are prebuilt; a downstream package's extensions name their own
(``Extension.aot_package``, e.g. ``"mypkg._C"``)."""
DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C")
INFO_FILE = "build_info.json"


@dataclass(frozen=True)
class Prebuilt:
    """What ``build_info.json`` says (empty when the package was installed without AOT kernels)."""

    directory: str = DIRECTORY
    info: dict = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.info.get("extensions", {}))

    def entry(self, name: str) -> dict | None:
        return self.info.get("extensions", {}).get(name)

    def path(self, name: str) -> str | None:
        e = self.entry(name)
        return os.path.join(self.directory, e["file"]) if e else None

    def verify(self, name: str) -> None:
        """Raise OpforgeError unless the binary's sha256 is the one recorded at build time."""
        from .build.key import sha256_file
        from .errors import OpforgeError

        e, path = self.entry(name), self.path(name)
        if e is None or path is None:
            raise OpforgeError(f"no prebuilt binary {name}")
        if e.get("sha256") and sha256_file(path) != e["sha256"]:
            raise OpforgeError(f"{path} does not match the sha256 recorded in {INFO_FILE}: reinstall opforge")

    def check(self, name: str, platform) -> Decision:
        """May the prebuilt ``name`` be loaded under this platform's torch? Pure.

        >>> from opforge.platform import Platform
        >>> pb = Prebuilt("/x", {"torch": "2.12.0+cpu", "torch_git": "g", "cuda": None, "hip": None,
        ...   "cxx11_abi": True, "machine": "x86_64", "extensions": {"a": {"file": "a.so"},
        ...   "s": {"file": "s.so", "stable_abi": "2.10"}}})
        >>> pb.check("a", Platform(torch_version="2.13.0+cpu"))
        Rejected(reason='prebuilt for torch 2.12.0+cpu, but torch 2.13.0+cpu is running', ok=False)
        >>> bool(pb.check("s", Platform(torch_version="2.13.0+cpu")))
        True
        >>> pb.check("s", Platform(torch_version="2.9.1"))
        Rejected(reason='prebuilt on the stable ABI of torch 2.10, but torch 2.9.1 is running', ok=False)
        """
        from .build.key import version_tuple

        e = self.entry(name)
        if e is None:
            return Rejected("no prebuilt binary (install with OPFORGE_BUILD=... to have one)")
        info = self.info
        if info.get("machine") and info["machine"] != platform.machine:
            return Rejected(f"prebuilt for {info['machine']}, but this machine is {platform.machine}")
        if (info.get("cuda") or None) != (platform.torch_cuda or None) and e.get("backend") == "cuda":
            return Rejected(f"prebuilt for CUDA {info.get('cuda')}, but torch has CUDA {platform.torch_cuda}")
        if e.get("stable_abi"):
            if version_tuple(platform.torch_version) < version_tuple(e["stable_abi"]):
                return Rejected(f"prebuilt on the stable ABI of torch {e['stable_abi']}, "
                                f"but torch {platform.torch_version} is running")
            return Accepted(f"stable ABI {e['stable_abi']}, torch {platform.torch_version}")
        if info.get("torch") != platform.torch_version:
            return Rejected(f"prebuilt for torch {info.get('torch')}, but torch {platform.torch_version} is running")
        if info.get("torch_git") and platform.torch_git and info["torch_git"] != platform.torch_git:
            return Rejected(f"prebuilt for another build of torch {platform.torch_version} "
                            f"(git {info['torch_git'][:12]}, running {platform.torch_git[:12]})")
        if (info.get("cuda") or None) != (platform.torch_cuda or None) or \
                (info.get("hip") or None) != (platform.torch_hip or None):
            return Rejected(f"prebuilt for CUDA {info.get('cuda')} / HIP {info.get('hip')}, but torch has "
                            f"CUDA {platform.torch_cuda} / HIP {platform.torch_hip}")
        if bool(info.get("cxx11_abi", True)) != bool(platform.cxx11_abi):
            return Rejected("prebuilt with another C++ ABI (_GLIBCXX_USE_CXX11_ABI) than torch's")
        return Accepted(f"torch {platform.torch_version}")


def read(directory: str | None = None) -> Prebuilt:
    """The package's prebuilt record; an empty one when there is none or it is unreadable."""
    directory = directory or DIRECTORY
    try:
        with open(os.path.join(directory, INFO_FILE), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return Prebuilt(directory, {})
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("extensions"), dict):
        return Prebuilt(directory, {})
    return Prebuilt(directory, info)


def for_package(package: str) -> Prebuilt:
    """The prebuilt record of ``package`` (``opforge._C``, or a downstream ``mypkg._C``); an
    empty one when the package has none (installed without AOT kernels, or no such package)."""
    if package == PACKAGE:
        return read()
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # its parent is not installed
        spec = None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    return read(dirs[0]) if dirs else Prebuilt("", {})
