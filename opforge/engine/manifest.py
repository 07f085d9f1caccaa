"""A cache entry's ``manifest.json``: what was built, from what, and the binary's identity.

``Manifest`` is the one shape of that record. ``build.py`` makes it after a build, ``cache.publish``
fills in the binary's fields as it copies the binary into the entry, and every reader (the warm
path, ``cache list / verify``, archive export and import) gets a ``Manifest`` from
``Manifest.from_json``, which refuses anything that is not a manifest of ours (so a tampered
file can't point a load outside its entry). The file format is ``FORMAT`` 1, unchanged from the
dict it replaces: entries and archives written before still read.

>>> m = Manifest(name="ext", key="k" * 64, kind="python_module")
>>> m = m.with_binary("ext.so", "0" * 64, 10, 5)
>>> Manifest.from_json(m.to_json(), "ext") == m
True
>>> Manifest.from_json(m.to_json() | {"binary": "../../evil.so"}, "ext") is None
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .deps import DepRecord

FILE = "manifest.json"
FORMAT = 1
_REQUIRED = ("format", "key", "binary", "binary_sha256", "binary_size", "binary_mtime_ns", "deps")


@dataclass(frozen=True)
class Manifest:
    name: str
    key: str
    """The input key: everything known before the build (``key.BuildSpec.input_key``)."""
    kind: str = ""
    """The spec's kind: ``python_module``, ``library``, ``executable``."""
    binary: str = ""
    """The binary's file name inside the entry: ``<name>.so``, or ``<name>`` for an executable."""
    binary_sha256: str = ""
    binary_size: int = 0
    binary_mtime_ns: int = 0
    deps: tuple[DepRecord, ...] = ()
    """Every source and header the compiler read outside torch, Python, CUDA and the OS; under the
    source root by a path relative to it (``relocate.py``), elsewhere by its absolute path."""
    portable_key: str = ""
    config_key: str = ""
    headers_digest: str = ""
    inputs: dict = field(default_factory=dict)
    """The key's inputs (``BuildSpec.describe()``): what ``cache export/import`` checks a machine against."""
    flags: dict = field(default_factory=dict)
    compiler: str = ""
    nvcc: str | None = None
    ccache: str | None = None
    torch: str = ""
    cuda: str | None = None
    built_at: float = 0.0
    build_seconds: float = 0.0
    host: str = ""
    root: str = ""
    """The source root where it was built (for people; matching never uses it)."""

    def with_binary(self, binary: str, sha256: str, size: int, mtime_ns: int) -> Manifest:
        """This manifest for the binary ``binary`` of the entry, as published."""
        return dataclasses.replace(self, binary=binary, binary_sha256=sha256, binary_size=size,
                                   binary_mtime_ns=mtime_ns)

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["deps"] = [d.to_json() for d in self.deps]
        data["format"] = FORMAT
        return data

    @classmethod
    def from_json(cls, data: object, name: str) -> Manifest | None:
        """The manifest ``data`` holds, for extension ``name``; None when it is not one of ours: another
        format, a missing or mistyped field, another extension's, or a binary that is not a plain file
        of its entry. Keys this version doesn't know are ignored (a newer opforge may add some)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT or any(k not in data for k in _REQUIRED):
            return None
        if data.get("name", name) != name or data["binary"] not in (f"{name}.so", name):
            return None
        if not (isinstance(data["deps"], list) and isinstance(data["binary_size"], int)
                and isinstance(data["binary_mtime_ns"], int) and isinstance(data["binary_sha256"], str)
                and isinstance(data["key"], str)):
            return None
        try:
            deps = tuple(DepRecord(**d) for d in data["deps"])
        except TypeError:
            return None
        known = {f.name for f in dataclasses.fields(cls)} - {"deps"}
        fields = {k: v for k, v in data.items() if k in known}
        fields["name"] = name
        try:
            return cls(deps=deps, **fields)
        except TypeError:
            return None


__all__ = ["FILE", "FORMAT", "Manifest"]
