"""The kernels built at ``pip install`` (``OPFORGE_BUILD=...``) into ``opforge/_C``.

``opforge/_C/build_info.json`` records what they were built against; ``check`` decides,
from that record and the running :class:`~opforge.platform.Platform` alone, whether a
binary may be loaded here:

* a stable-ABI binary needs a torch at least as new as its stable ABI target;
* any other binary needs the very torch build it was compiled against (version and git
  hash), the same CUDA/HIP and the same C++ ABI.

Both rules are ``opforge/compat.py``'s (``same_torch``); this module reads the record.

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

from . import compat
from .decision import Decision, Rejected

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
        from .engine.key import sha256_file
        from .errors import OpforgeError

        e, path = self.entry(name), self.path(name)
        if e is None or path is None:
            raise OpforgeError(f"no prebuilt binary {name}")
        if e.get("sha256") and sha256_file(path) != e["sha256"]:
            raise OpforgeError(f"{path} does not match the sha256 recorded in {INFO_FILE}: reinstall opforge")

    def check(self, name: str, platform) -> Decision:
        """May the prebuilt ``name`` be loaded under this platform's torch? Pure.

        >>> from opforge.compat import TorchFacts
        >>> from opforge.platform import Platform
        >>> pb = Prebuilt("/x", {"torch": "2.12.0+cpu", "torch_git": "g", "cuda": None, "hip": None,
        ...   "cxx11_abi": True, "machine": "x86_64", "extensions": {"a": {"file": "a.so"},
        ...   "s": {"file": "s.so", "stable_abi": "2.10"}}})
        >>> pb.check("a", Platform(torch=TorchFacts("2.13.0+cpu")))
        Rejected(reason='prebuilt for torch 2.12.0+cpu, but here torch is 2.13.0+cpu', ok=False)
        >>> bool(pb.check("s", Platform(torch=TorchFacts("2.13.0+cpu"))))
        True
        >>> pb.check("s", Platform(torch=TorchFacts("2.9.1"))).reason
        'targets the LibTorch stable ABI of torch 2.10, but torch 2.9.1 is installed: upgrade torch to >= 2.10'

        """
        e = self.entry(name)
        if e is None:
            return Rejected("no prebuilt binary (install with OPFORGE_BUILD=... to have one)")
        built = facts_of(self.info)
        if built is None:
            return Rejected(f"{INFO_FILE} does not record the torch it was built against: reinstall opforge")
        verdict = compat.same_torch(built, platform.torch, e.get("stable_abi") or "", e.get("backend") == "cuda")
        if not verdict:
            return Rejected(verdict.reason.replace("built for", "prebuilt for", 1))
        return verdict


#: ``build_info.json``'s keys for the fields of :class:`~opforge.compat.TorchFacts` it records.
_INFO_KEYS = {"version": "torch", "git_version": "torch_git", "cuda": "cuda", "hip": "hip", "cxx11_abi": "cxx11_abi",
              "python_tag": "python_tag", "machine": "machine"}


def info_of(facts: compat.TorchFacts) -> dict:
    """The torch facts a ``build_info.json`` records (format 1's flat keys)."""
    return {key: getattr(facts, name) for name, key in _INFO_KEYS.items()}


def facts_of(info: dict) -> compat.TorchFacts | None:
    """The torch facts a ``build_info.json`` recorded (:func:`info_of`'s inverse); None if it has none."""
    return compat.TorchFacts.from_json({name: info[key] for name, key in _INFO_KEYS.items() if key in info})


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
