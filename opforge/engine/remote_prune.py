"""``opforge cache prune --remote --older-than DAYS``: objects older than DAYS go, never one younger than
``GRACE_DAYS`` (``prune_verdict``, pure); leftovers (cut-off uploads, dead builders' markers) once past it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from .. import settings as settings_mod
from .progress import Reporter
from .remote import _is_object, _survey
from .remote_fs import _DEAD, _bounded, _mtime

GRACE_DAYS = 1.0
"""``cache prune --remote`` never removes an object younger than this (a node may be about to pull it)."""


@dataclass(frozen=True)
class Pruned:
    """One file of the store that ``prune`` looked at: an object, or a leftover (a push's upload cut off
    before its move, a builder's marker), and what became of it."""

    path: str
    name: str
    what: str
    """object, upload, marker."""
    size: int
    age_days: float | None
    action: str
    """removed, would remove (``--dry-run``), kept, failed."""
    why: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def prune_verdict(age_days: float | None, older_than: float, grace: float = GRACE_DAYS) -> str | None:
    """Why a file of this age stays in the store (None: it goes): it must be older than ``older_than``
    days, and never younger than the grace period. Pure.

    >>> prune_verdict(40, 30) is None, prune_verdict(2, 0) is None
    (True, True)
    >>> prune_verdict(5, 30)
    'younger than 30 days (--older-than)'
    >>> prune_verdict(0.5, 0)
    'younger than the grace period (1 day)'
    >>> prune_verdict(None, 0)
    'its modified time is unknown'
    """
    if age_days is None:
        return "its modified time is unknown"
    if age_days < grace:
        return f"younger than the grace period ({grace:g} day{'s' if grace != 1 else ''})"
    if age_days < older_than:
        return f"younger than {older_than:g} days (--older-than)"
    return None




def prune(older_than: float, s: settings_mod.Settings, reporter: Reporter, dry_run: bool = False,
          now: float | None = None) -> list[Pruned] | None:
    """``opforge cache prune --remote --older-than DAYS``: remove the objects older than ``older_than``
    days by the store's modified time, and leftovers (uploads cut off before their move, builders'
    markers) past the grace; never anything younger than ``GRACE_DAYS`` (``prune_verdict``). Every file
    looked at, with what became of it; None when the store can't be asked; StoreMissing when its root
    isn't there. A node pulling an object as it is removed builds the kernel itself."""
    got = _survey(s, reporter)
    if got is None:
        return None
    fs, _, found = got
    now = time.time() if now is None else now
    out = []
    for parts, path, info in found:
        if len(parts) != 3:
            continue
        base = parts[2]
        what = "object" if _is_object(parts) else "marker" if base.startswith(".building-") else \
            "upload" if base.startswith(".") and base.endswith(".tar") else None
        if what is None:
            continue
        mtime = _mtime(info)
        age = None if mtime is None else max(0.0, (now - mtime) / 86400)
        why = prune_verdict(age, older_than if what == "object" else 0.0)
        row = Pruned(path, parts[0], what, int(info.get("size") or 0), age, "kept", why or "")
        if why is None:
            if dry_run:
                row = Pruned(path, parts[0], what, row.size, age, "would remove")
            else:
                done = _bounded(s, reporter, f"removing {path}", lambda path=path: _remove(fs, path))
                row = Pruned(path, parts[0], what, row.size, age, "removed" if done else "failed",
                             "" if done else _DEAD.get(s.remote_cache or "", "the store did not answer"))
        out.append(row)
    return out


def _remove(fs, path: str) -> bool:
    try:
        fs.rm_file(path)
    except FileNotFoundError:  # another prune was first
        pass
    return True
