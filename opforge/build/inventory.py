"""What is in the cache, and tidying it: list, verify (re-hash) and clean.

Removal renames an entry out of the way before deleting it, so a process that is loading
at the same time either sees the whole entry or none of it (and then rebuilds). Build
dirs are removed only when their lock is free.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

from ..errors import UnsafeCacheError
from . import cache, failures
from .cache import Entry


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
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def entries(root: str, name: str | None = None) -> list[Row]:
    """Every published entry (optionally of one extension), oldest first."""
    rows = []
    try:
        names = sorted(os.listdir(root)) if name is None else [name]
    except FileNotFoundError:
        return []
    for ext in names:
        ext_dir = os.path.join(root, ext)
        if ext.startswith(".") or not os.path.isdir(ext_dir):
            continue
        for key in sorted(os.listdir(ext_dir)):
            path = os.path.join(ext_dir, key)
            if key.startswith(".") or not os.path.isdir(path):
                continue
            m = cache.read_manifest(path)
            if m is None:
                rows.append(Row(ext, key, path, _dir_size(path), os.lstat(path).st_mtime, "?", "?", "bad manifest"))
                continue
            rows.append(Row(ext, key, path, _dir_size(path), m.get("built_at", 0.0), m.get("torch", "?"),
                            m.get("kind", "?")))
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


def _discard_if_idle(path: str) -> bool:
    """Remove a build dir or PCH dir unless a build holds its lock (``<path>.lock``) now."""
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


def clean(root: str, name: str | None = None, older_than_days: float | None = None) -> list[str]:
    """Remove entries (all, one extension's, or those older than N days), idle build dirs and,
    with no name given, the shared precompiled headers."""
    removed = []
    for row in entries(root, name):
        if older_than_days is not None and row.age_days < older_than_days:
            continue
        cache.discard(row.path)
        removed.append(row.path)
    if older_than_days is not None:
        return removed
    if name is None:
        removed += _clean_pch(root)
    try:
        names = os.listdir(root) if name is None else [name]
    except FileNotFoundError:
        return removed
    for ext in names:
        ext_dir = os.path.join(root, ext)
        if not os.path.isdir(ext_dir) or ext.startswith("."):
            continue
        for item in os.listdir(ext_dir):
            path = os.path.join(ext_dir, item)
            if item.startswith(".build-") and os.path.isdir(path) and _discard_if_idle(path):
                removed.append(path)
            elif item.startswith(".src-") and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif item.startswith(failures.PREFIX):  # a remembered failed build: the next load tries again
                failures.forget(path)
        cache.sweep_stale(ext_dir)  # .tmp-/.trash- of killed processes; fresh ones may be in use
    return removed


def _clean_pch(root: str) -> list[str]:
    """The shared precompiled headers (OPFORGE_PCH), each only when its lock is free."""
    base = os.path.join(root, ".pch")
    try:
        items = os.listdir(base)
    except OSError:
        return []
    dirs = [os.path.join(base, i) for i in items if not i.startswith(".") and os.path.isdir(os.path.join(base, i))]
    removed = [p for p in dirs if _discard_if_idle(p)]
    cache.sweep_stale(base)
    return removed
