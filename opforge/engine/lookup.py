"""The warm path of ``load()`` (``jit.py``): the cache's entry for a spec whose recorded inputs all
still hold, found with stats and no subprocess::

    for each entry published under the key: manifest -> stat deps -> stat binary
"""

from __future__ import annotations

import os

from . import cache
from . import deps as deps_mod
from .cache import Entry, Layout
from .key import BuildSpec
from .progress import Reporter


def find_entry(layout: Layout, spec: BuildSpec, reporter: Reporter, corrupt: list | None = None) -> Entry | None:
    """The warm path: a published entry whose recorded inputs all still hold, else None."""
    if spec.toolchain_missing:
        candidates = _portable_candidates(layout, spec)
    else:
        candidates = layout.candidates(spec.name, spec.input_key)
    if not candidates:
        return None
    try:
        cache.check_safe(layout.name_dir(spec.name))
    except FileNotFoundError:
        return None
    for path in candidates:
        manifest = cache.read_manifest(path)
        if manifest is None:
            reporter.notice(f"cache entry {path} has a missing or corrupt manifest; rebuilding")
            if corrupt is not None:
                corrupt.append(path)
            continue
        if not spec.toolchain_missing and manifest.key != spec.input_key:
            continue
        entry = Entry(path, manifest)
        # The sources' bytes are in the key already: only the headers need a look (under this spec's root).
        changed = deps_mod.check((r for r in entry.deps if r.path not in spec.key_sources), spec.places)
        if changed:
            reporter.info(f"{path} is stale: {', '.join(changed[:3])} changed")
            continue
        try:
            cache.check_safe(path)
        except FileNotFoundError:
            continue  # removed since the scan (`opforge cache clean`): as if never found
        state = cache.binary_state(entry)
        if state != "ok":
            why = "corrupt (sha256 mismatch with its manifest)" if state == "corrupt" else "missing"
            reporter.notice(f"cached binary {entry.binary} is {why}; rebuilding")
            if corrupt is not None:
                corrupt.append(path)
            continue
        from .usage import note_use  # a stat, and a utime once a day (OPFORGE_CACHE_MAX_SIZE's LRU)

        note_use(entry)
        return entry
    return None


def _portable_candidates(layout: Layout, spec: BuildSpec) -> list[str]:
    """With no compiler here, entries built elsewhere for the same inputs (any toolchain)."""
    name_dir = layout.name_dir(spec.name)
    try:
        names = [n for n in os.listdir(name_dir) if not n.startswith(".")]
    except OSError:
        return []
    wanted = spec.portable_key
    found = []
    for n in names:
        m = cache.read_manifest(os.path.join(name_dir, n))
        if m is not None and m.portable_key == wanted:
            found.append((m.built_at, os.path.join(name_dir, n)))
    return [p for _, p in sorted(found, reverse=True)]
