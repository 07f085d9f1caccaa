"""A builder's heartbeat in the remote store, and how the ranks of other nodes watch it (``ranks.await_builder``).

The builder (global rank 0, or a rank that took over) writes ``<object dir>/.building-<key16>[.<gen>].json``
every ``HEARTBEAT`` seconds (``announce``). On each waiting node one rank polls (``Watch``): at most once per
``POLL_EVERY`` seconds it lists the kernel's directory, which shows a pushed object and the marker at once. A
marker not seen to change for ``STALE_AFTER`` seconds is a dead builder's: the next generation is claimed with
the store's create-without-overwrite (``remote_fs._create``), so exactly one rank in the cluster takes over.
docs/distributed.md, "Waits for a builder on another node".
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

from .. import settings as settings_mod
from .cache import Entry, Layout
from .key import BuildSpec
from .progress import Reporter
from .remote import _wanted, fetch
from .remote_fs import _bounded, _create, _mtime, _open, object_dir

HEARTBEAT = 2.0
"""Seconds between a remote builder's rewrites of its marker in the store (``announce``)."""

STALE_AFTER = 3 * HEARTBEAT
"""A marker not seen to change for this long (three beats) belongs to a builder that is gone (killed): a waiting
node's poller takes over (``ranks.Beats``)."""

POLL_EVERY = 1.0
"""The least seconds between two looks at the store by a node's poller (``Watch``); jittered up to 25 % longer."""

_CLAIMED: dict[tuple[str, str], tuple[str, int]] = {}
"""(name, input key) -> (marker path, generation) this process won with ``Watch.claim``, for ``announce`` to beat."""


def _marker(root: str, spec: BuildSpec, gen: int = 0) -> str:
    """The marker of the ``gen``-th builder of ``spec``'s inputs: 0 is the first, each takeover claims the next."""
    base = f"{object_dir(root, spec.name, spec.portable_key)}/.building-{spec.input_key[:16]}"
    return f"{base}.json" if gen == 0 else f"{base}.{gen}.json"


def marker_gen(filename: str, key16: str) -> int | None:
    """The generation of the builder's marker ``filename`` for the input key ``key16``, else None. Pure.

    >>> k = "0123456789abcdef"
    >>> marker_gen(f".building-{k}.json", k), marker_gen(f".building-{k}.2.json", k)
    (0, 2)
    >>> marker_gen(".building-fedcba9876543210.json", k), marker_gen(f".building-{k}.x.json", k)
    (None, None)
    """
    head = f".building-{key16}"
    if not filename.startswith(head) or not filename.endswith(".json"):
        return None
    middle = filename[len(head):-len(".json")]
    if not middle:
        return 0
    return int(middle[1:]) if middle.startswith(".") and middle[1:].isdigit() else None


def _beat(gen: int) -> bytes:
    import socket

    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time(), "gen": gen}).encode()


@dataclass(frozen=True)
class Marker:
    """A builder's marker as the store's listing shows it."""

    gen: int
    version: str
    """Changes with each beat: the marker's size, modified time and etag in the listing."""
    age: float | None
    """Seconds since it was written, by the store's modified time and this machine's clock (off by their skew)."""


@dataclass(frozen=True)
class Look:
    """One look at the store for a spec (``Watch.look``): one listing of its directory."""

    objects: tuple[str, ...]
    """The objects this node may take (``_wanted``)."""
    marker: Marker | None
    """The marker of the highest generation, if any."""


def _look(fs, root: str, spec: BuildSpec) -> Look:
    try:
        infos = fs.ls(object_dir(root, spec.name, spec.portable_key), detail=True)
    except FileNotFoundError:
        infos = []
    top = None
    for info in infos:
        gen = marker_gen(info["name"].rsplit("/", 1)[-1], spec.input_key[:16])
        if gen is not None and (top is None or gen > top[0]):
            top = (gen, info)
    marker = None
    if top is not None:
        gen, info = top
        mtime = _mtime(info)
        version = json.dumps([info.get("size"), mtime, info.get("etag") or info.get("ETag")], default=str)
        marker = Marker(gen, version, None if mtime is None else time.time() - mtime)
    return Look(tuple(_wanted([info["name"] for info in infos], spec)), marker)


class Watch:
    """A waiting node's eyes on the store, for one spec (``ranks.await_builder``'s ``store``). Only the node's
    poller calls it, at most once per ``POLL_EVERY`` seconds; it opens the store at its first look."""

    poll_every = POLL_EVERY
    stale_after = STALE_AFTER

    def __init__(self, layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter, find):
        self.layout, self.spec, self.s, self.reporter, self.find = layout, spec, s, reporter, find
        self._store = None
        self._tried: set[str] = set()

    def _fs(self):
        if self._store is None:
            self._store = _open(self.s, self.reporter)
        return self._store

    def look(self) -> Look | None:
        """One listing of the spec's directory: its objects and its builder's marker. None: the store can't be
        asked (said once; it counts as dead in this process)."""
        store = self._fs()
        if store is None:
            return None
        fs, root = store
        return _bounded(self.s, self.reporter, "looking for a build in progress", lambda: _look(fs, root, self.spec))

    def pull(self, look: Look) -> Entry | None:
        """The local entry, pulled (``fetch``) when ``look`` lists an object not tried before; else None."""
        new = [obj for obj in look.objects if obj not in self._tried]
        if not new:
            return None
        self._tried.update(new)
        return fetch(self.layout, self.spec, self.s, self.reporter, self.find)

    def claim(self, gen: int) -> bool | None:
        """Take the builder's part: create the marker of generation ``gen``, unless another process did first
        (``_create``: one winner, whatever the race). True: won (``announce`` beats it from now on); False:
        another process's; None: the store can't be asked."""
        store = self._fs()
        if store is None:
            return None
        fs, root = store
        path = _marker(root, self.spec, gen)
        won = _bounded(self.s, self.reporter, "claiming a build", lambda: _create(fs, path, _beat(gen)))
        if won:
            _CLAIMED[(self.spec.name, self.spec.input_key)] = (path, gen)
        return won


def announce(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter):
    """Say in the store that this process builds ``spec``, for the other nodes' pollers (``Watch``): its marker
    (the one it claimed with ``Watch.claim``, else a new generation above those there) is rewritten every
    ``HEARTBEAT`` seconds until the returned ``stop()``, which removes it. A killed builder's marker stops
    changing, and a poller takes over once it hasn't for ``STALE_AFTER`` seconds."""
    claimed = _CLAIMED.pop((spec.name, spec.input_key), None)
    store = _open(s, reporter)
    if store is None:
        return lambda: None
    fs, root = store

    def first():
        if claimed is not None:
            fs.pipe_file(claimed[0], _beat(claimed[1]))
            return claimed
        for _ in range(5):  # lost a race for a generation: the next one
            top = _look(fs, root, spec).marker
            gen = 0 if top is None else top.gen + 1
            if _create(fs, _marker(root, spec, gen), _beat(gen)):
                return _marker(root, spec, gen), gen
        return False

    got = _bounded(s, reporter, "announcing a build", first)
    if not got:
        return lambda: None
    path, gen = got
    done = threading.Event()

    def loop():
        while not done.wait(HEARTBEAT):
            if _bounded(s, reporter, "announcing a build", lambda: fs.pipe_file(path, _beat(gen)) or True) is None:
                return

    threading.Thread(target=loop, name="opforge-remote-heartbeat", daemon=True).start()

    def stop():
        done.set()
        _bounded(s, reporter, "withdrawing a build marker", lambda: fs.rm_file(path) or True)

    return stop
