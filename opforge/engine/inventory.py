"""What is in the cache, and tidying it: list, verify (re-hash) and clean.

Besides the published entries, a cache holds the things builds leave around them
(:func:`leftovers`): the persistent ninja build dirs (a failed build's objects stay there: one
such dir held 750 MB), remembered build failures, ``load_inline``'s generated sources, the
shared precompiled headers, the tuned Triton configs, and the staging dirs of killed processes. Listing shows them with
their size; cleaning removes them, by age too.

Removal renames an entry out of the way before deleting it, so a process that is loading
at the same time either sees the whole entry or none of it (and then rebuilds). Build
dirs and precompiled headers are removed only when their lock is free, ``load_inline``'s
sources only while no build of their extension runs, staging dirs only once an hour old.
The cap on all of it (``OPFORGE_CACHE_MAX_SIZE``) is ``budget.py``'s.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

from ..errors import UnsafeCacheError
from . import cache, failures, usage
from .cache import Entry
from .lock import held

TUNING_DIR = ".tuning"
"""Where ``kernels/tuning.py`` keeps tuned configs (it names this dir; the engine can't import it)."""

STAGING_GRACE_S = 3600.0
"""A ``.tmp-*``/``.trash-*`` dir younger than this may be a live process's (``cache.sweep_stale``'s default)."""


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
    last_used: float = 0.0
    """When a load last found it, to the day (its manifest's mtime, ``usage.note_use``)."""

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.built_at) / 86400) if self.built_at else 0.0

    @property
    def unused_days(self) -> float:
        return max(0.0, (time.time() - self.last_used) / 86400) if self.last_used else 0.0

    def to_json(self) -> dict:
        return {
            "name": self.name, "key": self.key, "path": self.path, "size": self.size, "built_at": self.built_at,
            "age_days": round(self.age_days, 3), "torch": self.torch, "kind": self.kind, "status": self.status,
            "last_used": self.last_used, "unused_days": round(self.unused_days, 3),
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
            try:
                size, used = _dir_size(path), usage.last_used(path)
                m = cache.read_manifest(path)
                if m is None:
                    rows.append(Row(ext, key, path, size, os.lstat(path).st_mtime, "?", "?", "bad manifest", used))
                    continue
            except OSError:  # removed meanwhile
                continue
            rows.append(Row(ext, key, path, size, m.built_at, m.torch or "?", m.kind or "?", "ok", used))
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
    """A running build holds it (its lock, or its extension's build for ``load_inline``'s sources), or a live
    process may be writing it (staging younger than an hour): never removed."""
    detail: str = ""

    @property
    def age_days(self) -> float:
        return max(0.0, (time.time() - self.modified) / 86400) if self.modified else 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "what": self.what, "path": self.path, "size": self.size,
                "age_days": round(self.age_days, 3), "in_use": self.in_use, "detail": self.detail}


def _leftover(name: str, what: str, path: str, detail: str = "", in_use=lambda path: False) -> Leftover:
    st = os.lstat(path)
    size, newest = _walk(path) if os.path.isdir(path) else (st.st_size, st.st_mtime)
    return Leftover(name, what, path, size, newest, in_use(path), detail)


def _locked(path: str) -> bool:
    return held(path + ".lock")


def _young(path: str) -> bool:
    return time.time() - os.lstat(path).st_mtime < STAGING_GRACE_S


def building(root: str, name: str) -> bool:
    """Does a build of extension ``name`` hold one of its build locks in the cache now?"""
    ext_dir = os.path.join(root, name)
    try:
        locks = [n for n in os.listdir(ext_dir) if n.startswith(".build-") and n.endswith(".lock")]
    except OSError:
        return False
    return any(held(os.path.join(ext_dir, n)) for n in locks)


def leftovers(root: str, name: str | None = None) -> list[Leftover]:
    """Everything but the entries (of one extension, or all, with the precompiled headers)."""
    out = []
    for ext in _names(root, name):
        ext_dir = os.path.join(root, ext)
        try:
            items = sorted(os.listdir(ext_dir))
        except OSError:  # removed meanwhile
            continue
        ext_building = None
        for item in items:
            path = os.path.join(ext_dir, item)
            try:
                if item.startswith(".build-") and os.path.isdir(path):
                    out.append(_leftover(ext, "build dir", path, "ninja's objects, for incremental rebuilds",
                                         _locked))
                elif item.startswith(failures.PREFIX) and item.endswith(".json"):
                    f = failures.read(path)
                    out.append(_leftover(ext, "failed build", path, f.first_line() if f else "unreadable record"))
                elif item.startswith(".src-") and os.path.isdir(path):
                    if ext_building is None:  # a build of it may be compiling them now
                        ext_building = building(root, ext)
                    out.append(_leftover(ext, "inline sources", path, "load_inline's generated sources",
                                         lambda p, b=ext_building: b or _locked(p)))  # inline._using
                elif item.startswith((".tmp-", ".trash-")):
                    out.append(_leftover(ext, "staging", path, "left by a process that was killed", _young))
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


def discard_if_idle(path: str) -> bool:
    """Remove a dir (a build dir, ``load_inline``'s sources) unless someone holds its lock (``<path>.lock``)
    now: a build, or a ``load_inline`` writing and loading the sources (its shared flock)."""
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
    """What was kept because a running build holds it (``Leftover.in_use``)."""


def remove(item: Leftover) -> bool:
    """Remove one leftover; False when a build holds it now (a build dir's or a PCH's lock, checked again
    here) or when :func:`leftovers` found it in use."""
    if item.in_use:
        return False
    if item.what == "precompiled header":
        from . import pch_store

        base, n = os.path.split(item.path)
        return pch_store.discard(base, n.removesuffix(".h.gch"))
    if item.what in ("build dir", "inline sources"):  # a load_inline takes its sources' lock shared
        return discard_if_idle(item.path)
    if item.what == "failed build":
        failures.forget(item.path)
    elif item.what == "staging":
        cache.discard(item.path)
    else:
        shutil.rmtree(item.path, ignore_errors=True)
    return True


def clean(root: str, name: str | None = None, older_than_days: float | None = None) -> Cleaned:
    """Remove entries and leftovers (all, one extension's, or those older than N days). What a running
    build holds is kept (``Leftover.in_use``); staging dirs younger than an hour too (a live process may
    be writing them)."""
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
        if not remove(item):
            done.in_use.append(item.path)
            continue
        done.removed.append(item.path)
        done.freed += item.size
    for ext in _names(root, name):
        cache.sweep_stale(os.path.join(root, ext))
    if name is None:
        cache.sweep_stale(os.path.join(root, ".pch"))
    return done
