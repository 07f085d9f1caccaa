"""Who builds under torch.distributed, and how the other ranks wait.

Without distribution the build lock alone makes N processes on one cache cost one build:
whoever takes the lock first builds, and the rest find the entry once they get it. Under
torch.distributed (a process group is up, or ``OPFORGE_DISTRIBUTED=1``) one rank is *the*
builder, so the compile happens where its output is expected:

* a node-local cache: the node's local rank 0 builds; the other local ranks wait on the
  build lock of that cache, then load;
* a shared cache (``OPFORGE_SHARED_CACHE=1``): global rank 0 builds, for every node;
* a remote cache with ``OPFORGE_REMOTE_PUSH=1`` (``remote.py``): global rank 0 builds and pushes;
  every other rank pulls (one download per node, under that node's build lock) instead of
  building, while the builder's heartbeat in the store says it is at work.

**No deadlock, by construction.** ``load()`` never calls a collective: ranks reach it at
different times, for different kernels, or not at all, and a collective reached by only
some ranks hangs all of them. A waiting rank uses the filesystem (and the store) only:

1. the entry is published: load it;
2. the build lock is held by a builder (the builder, or anyone building: a holder writes its
   ``.holder`` file under the lock): block on it (``flock``, released by the OS even when its
   holder is killed), without writing a holder file of its own, then load what was published,
   or raise ``BuildError`` when the build failed (its failure note, or the holder left the lock
   without publishing). A holder that was killed leaves its ``.holder`` file behind: then this
   rank takes over (builds it, under the lock; with a remote cache, it goes on waiting on the
   store, which says who builds now). Held with no holder file is another waiting rank's probe
   (microseconds): poll on;
3. nobody holds it: poll, and after ``OPFORGE_DIST_GRACE`` seconds (default 30) build it here,
   under the lock as usual. The builder may be late, or may never load this kernel.

**Remote scope: one poller per node.** The ranks of a node that wait for a builder on another node
don't all ask the store. The one that takes the node-local flock ``<build lock>.poll`` is the node's
poller; the others block on that flock and on the node's cache (a ``listdir`` per quarter second),
and load the entry once the poller has pulled it. The poller lists the spec's directory in the store
at most once per second (``remote_wait.POLL_EVERY``, jittered): one request, which shows both a pushed
object (pulled at once) and the builders' markers. A builder rewrites its marker every 2 s
(``remote_wait.HEARTBEAT``); ``Beats`` dates each change the poller sees, on the poller's own clock (no
clock skew between nodes enters), and:

* a marker that changes: wait;
* one seen changing that has stood still for 6 s (``remote_wait.STALE_AFTER``, three beats): its builder
  was killed. The poller claims the next generation of marker (a create that never replaces, so one
  rank in the whole cluster wins it), builds and pushes; the losers wait on the winner's marker;
* one seen changing that is gone with no object pushed (the build or the push failed): build here;
* no marker seen changing (none, or one an earlier job left) for ``OPFORGE_DIST_GRACE``: claim as
  above and build;
* a store that fails to answer (``OPFORGE_REMOTE_TIMEOUT``): build here.

So every wait ends: with the entry, an error, or a build of its own, and the lock still
makes it one build per cache. The barrier-based variant, for code that all ranks run
together, is :func:`opforge.distributed.build_once`, a collective by contract.
"""

from __future__ import annotations

import contextvars
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .. import settings as settings_mod
from ..errors import BuildError
from . import failures

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in a distributed job (None: not known)."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    group_up: bool = False
    """A torch.distributed default process group is initialised."""

    @classmethod
    def detect(cls, s: settings_mod.Settings) -> Ranks:
        """From torch.distributed when a group is up (never importing it), else from the launcher's env."""
        dist = sys.modules.get("torch.distributed")
        up = bool(dist is not None and dist.is_available() and dist.is_initialized())
        if up:
            return cls(dist.get_rank(), s.local_rank, dist.get_world_size(), True)
        return cls(s.rank, s.local_rank, None, False)


@dataclass(frozen=True)
class Role:
    builds: bool
    """This process compiles on a cache miss (else it waits for ``builder``)."""
    scope: str
    """``off``, ``node`` (a node-local cache) or ``global`` (a shared cache)."""
    builder: str
    reason: str


def decide(ranks: Ranks, mode: str, shared: bool, remote: bool = False) -> Role:
    """The build role of this process. Pure: facts in, a decision with its reason out.

    >>> decide(Ranks(), "auto", False).scope
    'off'
    >>> r = decide(Ranks(rank=5, local_rank=1, group_up=True), "auto", False)
    >>> r.builds, r.scope, r.builder
    (False, 'node', 'local rank 0')
    >>> decide(Ranks(rank=0, local_rank=0), "1", True).builds
    True
    >>> decide(Ranks(rank=4, local_rank=0, group_up=True), "auto", False, remote=True).builder
    'global rank 0'
    >>> print(decide(Ranks(rank=3), "1", False).reason)
    no local rank is known (LOCAL_RANK or SLURM_LOCALID): every process takes the build lock
    """
    on = mode == "1" or (mode == "auto" and ranks.group_up)
    if not on:
        why = "OPFORGE_DISTRIBUTED=0" if mode == "0" else "no torch.distributed process group"
        return Role(True, "off", "", f"{why}: the build lock makes the processes on a cache build once")
    if remote and not shared:
        if ranks.rank is None:
            return Role(True, "off", "", "no global rank is known (RANK or SLURM_PROCID): every process takes "
                        "the build lock")
        return Role(ranks.rank == 0, "remote", "global rank 0",
                    "a remote cache with OPFORGE_REMOTE_PUSH=1: global rank 0 builds and pushes, every other rank "
                    f"pulls (this is rank {ranks.rank})")
    if shared:
        if ranks.rank is None:
            return Role(True, "off", "", "no global rank is known (RANK or SLURM_PROCID): every process takes "
                        "the build lock")
        return Role(ranks.rank == 0, "global", "global rank 0",
                    f"OPFORGE_SHARED_CACHE=1: global rank 0 builds for all nodes (this is rank {ranks.rank})")
    if ranks.local_rank is None:
        return Role(True, "off", "", "no local rank is known (LOCAL_RANK or SLURM_LOCALID): every process takes "
                    "the build lock")
    return Role(ranks.local_rank == 0, "node", "local rank 0",
                f"a node-local cache: local rank 0 builds (this is local rank {ranks.local_rank})")


#: Set by ``opforge.distributed.build_once`` after its barrier: the builder is done, nobody waits.
BUILDER_DONE: contextvars.ContextVar[bool] = contextvars.ContextVar("opforge_builder_done", default=False)


def role(s: settings_mod.Settings) -> Role:
    if BUILDER_DONE.get():
        return Role(True, "off", "", "after build_once's barrier: the builder has finished")
    return decide(Ranks.detect(s), s.distributed, s.shared_cache, bool(s.remote_cache and s.remote_push))


@dataclass
class Beats:
    """What a node's poller has seen of the builders' markers in the store (``remote_wait.Look.marker``: the highest
    generation's), on this process's monotonic clock. Pure: the times are arguments.

    A marker is alive while it changes. A change is dated to the poll before the one that saw it (the beat
    came after that poll); a marker first seen is dated by its age in the store's listing, so one left by an
    earlier job is not taken for a builder at work. ``see`` answers:

    * ``alive``: a beat less than ``stale_after`` seconds ago;
    * ``stale``: a marker seen alive has not changed for ``stale_after``: its builder is gone;
    * ``withdrawn``: the marker seen alive is gone (its builder stopped, pushing nothing: its build failed,
      or its push did);
    * ``none``: no live marker seen (none there, or an earlier job's).

    >>> from opforge.engine.remote_wait import Marker
    >>> b = Beats(stale_after=6.0)
    >>> b.see(None, now=0.0), b.see(Marker(0, "v1", age=0.4), now=1.0)  # the builder announces
    ('none', 'alive')
    >>> b.see(Marker(0, "v1", 1.4), now=2.0), b.see(Marker(0, "v2", 0.3), now=3.1)  # a beat, dated 2.0
    ('alive', 'alive')
    >>> b.see(Marker(0, "v2", 4.9), now=7.9), b.see(Marker(0, "v2", 6.0), now=8.0)  # killed after its beat
    ('alive', 'stale')
    >>> b.lost(1, now=8.1)  # another node's rank claimed generation 1 first: it builds now
    >>> b.see(Marker(1, "w1", 0.1), now=9.0), b.see(Marker(0, "v2", 7.0), now=10.1)  # it gave up, pushing nothing
    ('alive', 'withdrawn')
    >>> Beats(6.0).see(Marker(3, "old", age=3600.0), now=0.0)  # left by an earlier job
    'none'
    """

    stale_after: float
    top: int = -1
    """The highest generation seen (-1: none)."""
    version: str | None = None
    beat: float | None = None
    """When its last beat was (None: never seen alive)."""
    polled: float | None = None

    def see(self, marker, now: float) -> str:
        before, self.polled = self.polled, now
        if marker is None or marker.gen < self.top:
            if self.beat is not None:
                return "withdrawn"
            if marker is None:
                return "none"
        if marker.gen != self.top or marker.version != self.version:
            if marker.gen != self.top or before is None:  # first seen: by its age in the listing
                age = marker.age
                self.beat = now if age is None else (now - max(age, 0.0) if age < self.stale_after else None)
            else:
                self.beat = before
            self.top, self.version = marker.gen, marker.version
        if self.beat is None:
            return "none"
        return "stale" if now - self.beat >= self.stale_after else "alive"

    def lost(self, gen: int, now: float) -> None:
        """A claim of generation ``gen`` was lost: another rank took the builder's part just now."""
        self.top, self.version, self.beat = gen, None, now


def await_builder(find: Callable[[], T | None], lock_path: str, failed: str, what: str, r: Role,
                  s: settings_mod.Settings, reporter, store=None) -> T | None:
    """Wait for ``r.builder`` to publish ``what`` (see the module doc). The entry, or None when this
    process should build it itself; BuildError when the builder gave up without publishing.
    ``store`` (``remote_wait.Watch``): the builder may be on another node; one rank per node polls the store."""
    deadline = time.monotonic() + s.dist_grace
    since = time.time() - s.dist_grace  # a failure older than that is not this job's
    reporter.info(f"{what}: waiting for {r.builder} to build it ({r.reason})")
    if store is not None:
        return _await_store(find, lock_path, failed, what, r, s, reporter, store, deadline, since)
    from .lock import held, read_holder

    delay = 0.05
    while True:
        found = find()
        if found is not None:
            return found
        _check_failure(failed, since, what)
        if held(lock_path) and read_holder(lock_path) is not None:
            # A builder holds it (a holder file names it). Held with no holder file is another waiting rank's
            # probe, for microseconds, or a builder about to write its file: look again.
            return _block_on(find, lock_path, failed, since, what, r, s, reporter)  # None: it was killed
        if time.monotonic() >= deadline:
            reporter.notice(f"{what}: {r.builder} has not started building it in {s.dist_grace:g} s "
                            "(OPFORGE_DIST_GRACE); building it here")
            return None
        time.sleep(delay * (0.5 + random.random()))  # jitter: many ranks must not probe in step
        delay = min(delay * 1.5, 1.0)


def _check_failure(failed: str, since: float, what: str) -> None:
    failure = failures.recent(failed, since)
    if failure is not None:
        raise BuildError(f"{what}: its build failed on {failure.host} (pid {failure.pid}, "
                         f"{time.time() - failure.when:.0f} s ago), so this rank does not retry it. "
                         f"The error was: {failure.error}")


def _block_on(find, lock_path: str, failed: str, since: float, what: str, r: Role, s: settings_mod.Settings,
              reporter):
    """Block on the build lock a builder holds, then: the entry it published; BuildError when its build failed;
    None when it was killed (its holder file is still there), so that this rank takes over."""
    from .lock import BuildLock, read_holder

    with BuildLock(lock_path, what, s.lock_timeout, reporter.notice, record=False):
        found = find()
        dead = read_holder(lock_path) if found is None else None  # under the lock: the holder that died
    if found is not None:
        return found
    failure = failures.recent(failed, since)
    if failure is not None:
        raise BuildError(f"{what}: its build failed: {failure.error}")
    if dead is not None:
        reporter.notice(f"{what}: the process building it (pid {dead.pid} on {dead.host}) died before publishing "
                        "it (killed?); this rank takes over")
        return None
    raise BuildError(
        f"{what}: the process building it ({r.builder}, or a rank that took over) released the build "
        "lock without publishing it: its build failed. See that rank's output for "
        "the compiler's errors; the next load() builds it again."
    )


def _await_store(find, lock_path: str, failed: str, what: str, r: Role, s: settings_mod.Settings, reporter, store,
                 deadline: float, since: float):
    """The remote scope's wait (the module doc): the node's poller asks ``store``, the other ranks wait here."""
    import filelock

    from .lock import held, read_holder

    beats = Beats(store.stale_after)
    poll_lock = filelock.FileLock(lock_path + ".poll", mode=0o600, thread_local=False)
    polling = False
    next_look = 0.0
    try:
        while True:
            found = find()
            if found is not None:
                return found
            _check_failure(failed, since, what)
            if held(lock_path) and read_holder(lock_path) is not None:  # a build on this node: wait for it
                found = _block_on(find, lock_path, failed, since, what, r, s, reporter)
                if found is not None:
                    return found
                continue  # its builder was killed: the store says who builds now
            if not polling:
                try:
                    poll_lock.acquire(timeout=0.25, poll_interval=0.05)
                except filelock.Timeout:
                    continue  # another rank of this node polls the store
                polling = True
                reporter.info(f"{what}: this rank polls the store for its node")
                continue  # the previous poller may have just pulled it: look here first
            now = time.monotonic()
            if now < next_look:
                time.sleep(min(next_look - now, 0.25))
                continue
            next_look = now + store.poll_every * (1 + 0.25 * random.random())  # jitter: nodes not in step
            look = store.look()
            if look is None:
                reporter.notice(f"{what}: the remote cache can't be asked whether {r.builder} built it; building "
                                "it here")
                return None
            found = store.pull(look) if look.objects else None
            if found is not None:
                return found
            state = beats.see(look.marker, now)
            if state == "withdrawn":
                reporter.notice(f"{what}: the rank building it stopped without pushing it (its build or its push "
                                "failed: see that rank's output); building it here")
                return None
            if state == "stale" or (state == "none" and now >= deadline):
                won = store.claim(beats.top + 1)
                if won is None:
                    reporter.notice(f"{what}: the remote cache can't be asked; building it here")
                    return None
                if won:
                    why = (f"the heartbeat of the rank building it stopped {now - beats.beat:.1f} s ago (killed?)"
                           if state == "stale" else
                           f"{r.builder} has not started building it in {s.dist_grace:g} s (OPFORGE_DIST_GRACE)")
                    reporter.notice(f"{what}: {why}; this rank takes over: it builds and pushes it")
                    return None
                beats.lost(beats.top + 1, now)  # another node's rank was first: wait for it
    finally:
        if polling:
            poll_lock.release()
