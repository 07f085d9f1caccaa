"""When each cache entry was last used, for the cache's cap (``budget.py``); on the warm path, so it
imports nothing but what the warm path has already.

A load that finds an entry (``lookup.find_entry``) marks it at most once a day: when the mtime of the
entry's ``manifest.json`` is more than a day old, it is set to now. That costs one ``stat`` per load,
and a ``utime`` per entry and day. The manifest's bytes don't change, and the entry dir's own mtime
is left alone: ``cache.Layout.candidates`` tries an input key's entries newest build first by it.
"""

from __future__ import annotations

import os
import time

from .cache import MANIFEST

#: A use is recorded at most this often per entry.
RESOLUTION_S = 86400.0

found: set[str] = set()
"""The entry dirs this process found: the cap never removes them under it."""


def note_use(entry) -> None:
    """Mark ``entry`` (a ``cache.Entry``) used: one ``stat`` of its manifest, and a ``utime`` when the last
    mark is a day old. A cache that can't take it (read-only) loads as before."""
    found.add(entry.path)
    path = os.path.join(entry.path, MANIFEST)
    try:
        if os.stat(path).st_mtime < time.time() - RESOLUTION_S:
            os.utime(path)
    except OSError:
        pass


def last_used(entry_dir: str) -> float:
    """The entry's last use, to the day (or its publication): its manifest's mtime; the dir's own when
    the manifest is gone."""
    try:
        return os.lstat(os.path.join(entry_dir, MANIFEST)).st_mtime
    except OSError:
        return os.lstat(entry_dir).st_mtime
