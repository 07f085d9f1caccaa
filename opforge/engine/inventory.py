"""What is in the cache, and tidying it: list, verify (re-hash) and clean.

Besides the published entries, a cache holds the things builds leave around them
(:func:`leftovers`): the persistent ninja build dirs (a failed build's objects stay there: one
such dir held 750 MB), remembered build failures, ``load_inline``'s generated sources, the
shared precompiled headers, the tuned Triton configs, and the staging dirs of killed processes. Listing shows them with
their size; cleaning removes them, by age too.

Removal renames an entry out of the way before deleting it, so a process that is loading
at the same time either sees the whole entry or none of it (and then rebuilds). Build
dirs and precompiled headers are removed only when their lock is free.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

from ..errors import UnsafeCacheError
from . import cache, failures
from .cache import Entry
from .lock import held

TUNING_DIR = ".tuning"
"""Where ``kernels/tuning.py`` keeps tuned configs (it names this dir; the engine can't import it)."""


@dataclass(frozen=True)
class Row:
    name: str
    key: str
    path: str
    size: int
    built_at: float
    torch: str
    kind: str
    status: str = "ok"

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.built_at) / 86400) if self.built_at else 0.0

    def to_json(self) -> dict:
        return {
            "name": self.name, "key": self.key, "path": self.path, "size": self.size, "built_at": self.built_at,
            "age_days": round(self.age_days, 3), "torch": self.torch, "kind": self.kind, "status": self.status,
        }


def _dir_size(path: str) -> int:
    return _walk(path)[0]


def _walk(path: str) -> tuple[int, float]:
    """The total size of the files under ``path``, and the newest mtime among them and the dir."""
    total, newest = 0, 0.0
    for root, _, files in os.walk(path):
        try:
            newest = max(newest, os.lstat(root).st_mtime)
        except OSError:
            pass
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            total += st.st_size
            newest = max(newest, st.st_mtime)
    return total, newest


def entries(root: str, name: str | None = None) -> list[Row]:
    """Every published entry (optionally of one extension), oldest first."""
    rows = []
    for ext in _names(root, name):
        ext_dir = os.path.join(root, ext)
        for key in sorted(os.listdir(ext_dir)):
            path = os.path.join(ext_dir, key)
            if key.startswith(".") or not os.path.isdir(path):
                continue
            m = cache.read_manifest(path)
            if m is None:
                rows.append(Row(ext, key, path, _dir_size(path), os.lstat(path).st_mtime, "?", "?", "bad manifest"))
                continue
            rows.append(Row(ext, key, path, _dir_size(path), m.built_at, m.torch or "?", m.kind or "?"))
    return sorted(rows, key=lambda r: r.built_at)


def verify(root: str, remove: bool = True) -> list[Row]:
    """Re-hash every binary; return each entry with its status ('ok', 'corrupt', ...).
    Corrupt entries are removed when ``remove`` (the next load rebuilds them)."""
    out = []
    for row in entries(root):
        status = row.status
        if status == "ok":
            m = cache.read_manifest(row.path)
            try:
                status = cache.binary_state(Entry(row.path, m), full_hash=True) if m else "bad manifest"
            except UnsafeCacheError:
                status = "unsafe (a link, another owner, or writable by others)"
        if status != "ok" and remove:
            cache.discard(row.path)
            status += ", removed"
        out.append(Row(**{**row.__dict__, "status": status}))
    return out


@dataclass(frozen=True)
class Leftover:
    """Something in the cache beside the entries (see the module doc)."""

    name: str
    """The extension it belongs to (empty for the shared precompiled headers)."""
    what: str
    """``build dir``, ``failed build``, ``inline sources``, ``precompiled header`` or ``staging``."""
    path: str
    size: int
    modified: float
    in_use: bool = False
    """Its lock is held (a build is running): never removed."""
    detail: str = ""

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.modified) / 86400) if self.modified else 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "what": self.what, "path": self.path, "size": self.size,
                "age_days": round(self.age_days, 3), "in_use": self.in_use, "detail": self.detail}


def _leftover(name: str, what: str, path: str, detail: str = "", locked: bool = False) -> Leftover:
    st = os.lstat(path)
    size, newest = _walk(path) if os.path.isdir(path) else (st.st_size, st.st_mtime)
    return Leftover(name, what, path, size, newest, locked and held(path + ".lock"), detail)


def leftovers(root: str, name: str | None = None) -> list[Leftover]:
    """Everything but the entries (of one extension, or all, with the precompiled headers)."""
    out = []
    for ext in _names(root, name):
        ext_dir = os.path.join(root, ext)
        try:
            items = sorted(os.listdir(ext_dir))
        except OSError:  # removed meanwhile
            continue
        for item in items:
            path = os.path.join(ext_dir, item)
            try:
                if item.startswith(".build-") and os.path.isdir(path):
                    out.append(_leftover(ext, "build dir", path, "ninja's objects, for incremental rebuilds",
                                         locked=True))
                elif item.startswith(failures.PREFIX) and item.endswith(".json"):
                    f = failures.read(path)
                    out.append(_leftover(ext, "failed build", path, f.first_line() if f else "unreadable record"))
                elif item.startswith(".src-") and os.path.isdir(path):
                    out.append(_leftover(ext, "inline sources", path, "load_inline's generated sources"))
                elif item.startswith((".tmp-", ".trash-")):
                    out.append(_leftover(ext, "staging", path, "left by a process that was killed"))
            except OSError:  # removed meanwhile
                continue
    out += _tuned(root, name)
    if name is None:
        from . import pch_store

        base = os.path.join(root, ".pch")
        for item in pch_store.stored(base):
            out.append(Leftover("", "precompiled header", item.path, item.size, item.last_used,
                                held(os.path.join(base, item.key + ".lock")),
                                "shared torch/extension.h PCH (modified: last used)"))
    return out


def _tuned(root: str, name: str | None) -> list[Leftover]:
    """The tuned Triton configs (``kernels/tuning.py``): one dir per family and fingerprint."""
    out = []
    for family in _names(os.path.join(root, TUNING_DIR), name):
        base = os.path.join(root, TUNING_DIR, family)
        try:
            items = sorted(os.listdir(base))
        except OSError:
            continue
        for item in items:
            path = os.path.join(base, item)
            try:
                if not item.startswith(".") and os.path.isdir(path):
                    n = sum(f.endswith(".json") for f in os.listdir(path))
                    out.append(_leftover(family, "tuned configs", path, f"{n} Triton configs, tuned once"))
            except OSError:
                continue
    return out


def _names(root: str, name: str | None) -> list[str]:
    try:
        names = sorted(os.listdir(root)) if name is None else [name]
    except FileNotFoundError:
        return []
    return [n for n in names if not n.startswith(".") and os.path.isdir(os.path.join(root, n))]


def known(root: str, name: str) -> bool:
    """Does the cache hold anything of extension ``name``?"""
    return name in _names(root, name) or name in _names(os.path.join(root, TUNING_DIR), name)


def _discard_if_idle(path: str) -> bool:
    """Remove a build dir unless a build holds its lock (``<path>.lock``) now."""
    import filelock

    lock = filelock.FileLock(path + ".lock", thread_local=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return False
    try:
        cache.discard(path)
        return True
    finally:
        lock.release()


@dataclass
class Cleaned:
    removed: list[str] = field(default_factory=list)
    freed: int = 0
    in_use: list[str] = field(default_factory=list)
    """Build dirs or precompiled headers kept because a build holds their lock."""


def clean(root: str, name: str | None = None, older_than_days: float | None = None) -> Cleaned:
    """Remove entries and leftovers (all, one extension's, or those older than N days). A build dir
    or precompiled header whose lock is held is kept; staging dirs younger than an hour too (a live
    process may be writing them)."""
    if older_than_days is not None and not older_than_days >= 0:
        raise ValueError(f"older_than_days must be >= 0, not {older_than_days}")
    done = Cleaned()
    old = (lambda age: age >= older_than_days) if older_than_days is not None else (lambda age: True)
    for row in entries(root, name):
        if old(row.age_days):
            cache.discard(row.path)
            done.removed.append(row.path)
            done.freed += row.size
    for item in leftovers(root, name):
        if not old(item.age_days):
            continue
        if item.what == "staging":
            continue  # cache.sweep_stale below: only those a killed process left
        if item.what == "precompiled header":
            from . import pch_store

            base, n = os.path.split(item.path)
            if not pch_store.discard(base, n.removesuffix(".h.gch")):
                done.in_use.append(item.path)
                continue
        elif item.what == "build dir":
            if not _discard_if_idle(item.path):
                done.in_use.append(item.path)
                continue
        elif item.what == "failed build":
            failures.forget(item.path)
        else:
            shutil.rmtree(item.path, ignore_errors=True)
        done.removed.append(item.path)
        done.freed += item.size
    for ext in _names(root, name):
        cache.sweep_stale(os.path.join(root, ext))
    if name is None:
        cache.sweep_stale(os.path.join(root, ".pch"))
    return done
