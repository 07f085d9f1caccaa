"""Dependency records: what a binary was built from, and whether that still holds.

A record is (path, size, mtime_ns, sha256). ``check`` stats each path; when a stat
matches the record the file is taken as unchanged (no read). When it differs, the
contents are hashed before deciding, so a ``touch`` or a checkout that restores the same
bytes does not force a rebuild, and a change with a preserved mtime is still caught
when the size moves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from .key import digest, sha256_file
from .relocate import Places


@dataclass(frozen=True)
class DepRecord:
    path: str
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: str) -> DepRecord:
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns, sha256_file(path))

    def to_json(self) -> dict:
        return asdict(self)


def check(records: Iterable[DepRecord], places: Places | None = None) -> list[str]:
    """Paths whose contents no longer match their record ([] when all hold). A record's path
    relative to the source root (``relocate.py``) is looked up under ``places``' root; without
    ``places`` such records are not checked (``cache import`` knows no root: the load checks them)."""
    changed = []
    for rec in records:
        if places is not None:
            path = places.resolve(rec.path)
        elif os.path.isabs(rec.path):
            path = rec.path
        else:
            continue
        try:
            st = os.stat(path)
        except OSError:
            changed.append(path)
            continue
        if st.st_size == rec.size and st.st_mtime_ns == rec.mtime_ns:
            continue
        if st.st_size != rec.size:
            changed.append(path)
            continue
        try:
            if sha256_file(path) != rec.sha256:
                changed.append(path)
        except OSError:
            changed.append(path)
    return changed


def headers_digest(records: Iterable[DepRecord], sources: Iterable[str]) -> str:
    """A digest over the headers' contents (sources are in the input key already)."""
    skip = set(sources)
    return digest(sorted((r.path, r.sha256) for r in records if r.path not in skip))


def parse_ninja_deps(text: str) -> dict[str, list[str]]:
    """Parse ``ninja -t deps`` output into {target: [dependency, ...]}.

    >>> parse_ninja_deps("a.o: #deps 2, deps mtime 1 (VALID)\\n    /s/a.cpp\\n    /s/a.h\\n\\n")
    {'a.o': ['/s/a.cpp', '/s/a.h']}
    """
    result: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            current = None
        elif line.startswith((" ", "\t")):
            if current is not None:
                current.append(line.strip())
        elif ": #deps" in line:
            target = line.split(": #deps", 1)[0]
            current = result.setdefault(target, [])
    return result


def is_system_path(path: str, system_prefixes: Iterable[str]) -> bool:
    """True for headers that belong to torch, Python, CUDA or the compiler (covered by the key)."""
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in system_prefixes)
