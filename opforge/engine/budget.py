"""The cache's cap, ``OPFORGE_CACHE_MAX_SIZE`` (10 GiB by default; ``0``: no cap): what counts as a
use, and what goes when the cache is over it.

* **Use.** A load that finds an entry (``lookup.find_entry``) marks it, at most once a day: the mtime
  of its ``manifest.json`` (``usage.py``, the warm path's part: one ``stat``, and a ``utime`` a day).
  Leftovers are used when they are written: a build dir by each build, a PCH by each build that
  -include's it (its record's ``last_used``).
* **The cap.** After each build, once its entry is published and its lock released, :func:`enforce`
  sizes the cache (``inventory``: the entries, their leftovers, the PCHs) and removes the least
  recently used until the total is at most the cap (:func:`select`, pure).
* **Never removed:** what a running build holds (a build dir whose lock is held; a PCH being made;
  ``load_inline``'s sources while a build of their extension runs), staging dirs younger than an
  hour (a live process may be writing them), the entry just built and the entries this process
  has found, and the tuned Triton configs (a few KB; tuning again costs GPU time).

Entries go with ``cache.discard`` (renamed, then deleted): a process that is loading one either
gets all of it or rebuilds. A binary already mapped by a process stays usable there (Linux).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace

from . import usage

#: Serialises enforcing in one cache (two builds ending at once would each remove for the other).
LOCK = ".budget.lock"
#: How long a build's end waits for another one's enforcing (milliseconds, usually) before leaving it be.
LOCK_WAIT_S = 10.0


@dataclass(frozen=True)
class Item:
    """One thing in the cache, as the cap sees it."""

    path: str
    what: str
    """``entry``, or a leftover's kind (``inventory.Leftover.what``)."""
    size: int
    last_used: float
    kept: str = ""
    """Why it can't be removed now (empty: it can)."""


@dataclass(frozen=True)
class Plan:
    """What :func:`select` decided (or what :func:`enforce` did): the total before, the cap, what goes."""

    total: int
    cap: int
    remove: tuple[Item, ...] = ()

    @property
    def freed(self) -> int:
        return sum(i.size for i in self.remove)

    @property
    def after(self) -> int:
        return self.total - self.freed

    @property
    def over(self) -> bool:
        return self.cap > 0 and self.after > self.cap


def select(items: Iterable[Item], cap: int) -> Plan:
    """What to remove to bring ``items`` to at most ``cap`` bytes: the least recently used first, skipping
    the kept ones. ``cap`` 0: nothing (no cap).

    >>> items = [Item("a", "entry", 5, last_used=1.0), Item("b", "build dir", 4, 2.0, kept="a build holds it"),
    ...          Item("c", "entry", 3, 3.0), Item("d", "entry", 2, 4.0)]
    >>> plan = select(items, cap=6)
    >>> [i.path for i in plan.remove], plan.total, plan.after, plan.over
    (['a', 'c'], 14, 6, False)
    >>> [i.path for i in select(items, cap=3).remove], select(items, cap=3).over
    (['a', 'c', 'd'], True)
    >>> select(items, cap=0).remove, select(items, cap=14).remove
    ((), ())
    """
    items = list(items)
    total = sum(i.size for i in items)
    if cap <= 0:
        return Plan(total, cap)
    left, remove = total, []
    for item in sorted(items, key=lambda i: (i.last_used, i.path)):
        if left <= cap:
            break
        if not item.kept:
            remove.append(item)
            left -= item.size
    return Plan(total, cap, tuple(remove))


def scan(root: str) -> tuple[list[Item], dict]:
    """The cache's items (the entries this process found or built kept), and the leftovers by path."""
    from . import inventory

    keep = {os.path.normpath(p) for p in usage.found}
    items = [Item(r.path, "entry", r.size, r.last_used,
                  "built or loaded by this process" if os.path.normpath(r.path) in keep else "")
             for r in inventory.entries(root)]
    others = {}
    for lo in inventory.leftovers(root):
        kept = ""
        if lo.what == "tuned configs":
            kept = "tuned configs are kept"
        elif lo.in_use:
            kept = "a live process may be writing it" if lo.what == "staging" else "in use by a running build"
        items.append(Item(lo.path, lo.what, lo.size, lo.modified, kept))
        others[lo.path] = lo
    return items, others


def _text(n: float) -> str:
    """Bytes, as ``opforge cache list`` writes them (``cli/output.size``, which the engine can't import).

    >>> _text(150 * 1024), _text(10 * 2**30), _text(512)
    ('150.0 KiB', '10.0 GiB', '512 B')
    """
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def enforce(root: str, cap: int, reporter, keep: Iterable[str] = ()) -> Plan | None:
    """Bring the cache at ``root`` under ``cap`` bytes (see the module doc); ``keep``: entries this process
    built, not to be removed under it (now or at a later build's end). Returns what was removed (None: no
    cap, another process at it for 10 s, or a failure). Never raises: the cap is housekeeping, and a build that got this far
    succeeded; a failure is a notice."""
    usage.found.update(keep)
    if cap <= 0:
        return None
    try:
        import filelock

        lock = filelock.FileLock(os.path.join(root, LOCK), mode=0o600, thread_local=False)
        try:
            lock.acquire(timeout=LOCK_WAIT_S)
        except filelock.Timeout:  # another build's end is still at it: the next build's end does it
            return None
        try:
            done = _enforce(root, cap)
        finally:
            lock.release()
    except Exception as exc:  # noqa: BLE001 (never fail a build over housekeeping)
        reporter.notice(f"could not keep the cache {root} under OPFORGE_CACHE_MAX_SIZE ({_text(cap)}): {exc}")
        return None
    if done.remove:
        reporter.info(f"the cache {root} was over OPFORGE_CACHE_MAX_SIZE ({_text(cap)}): removed the "
                      f"{len(done.remove)} least recently used item(s), {_text(done.freed)}; {_text(done.after)} now")
    if done.over:
        reporter.notice(f"the cache {root} holds {_text(done.after)}, over OPFORGE_CACHE_MAX_SIZE ({_text(cap)}), "
                        "all of it in use now or just built; raise OPFORGE_CACHE_MAX_SIZE (e.g. "
                        f"OPFORGE_CACHE_MAX_SIZE={max(1, -(-done.after * 2 // 2**30))}G)")
    return done


def _enforce(root: str, cap: int) -> Plan:
    from . import cache, inventory

    items, others = scan(root)
    plan = select(items, cap)
    removed = []
    for item in plan.remove:
        if item.what == "entry":
            cache.discard(item.path)
        elif not inventory.remove(others[item.path]):
            continue  # a build took it since the scan
        removed.append(item)
    return replace(plan, remove=tuple(removed))
