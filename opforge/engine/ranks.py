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
  building, waiting while the builder's marker in the store is fresh.

**No deadlock, by construction.** ``load()`` never calls a collective: ranks reach it at
different times, for different kernels, or not at all, and a collective reached by only
some ranks hangs all of them. A waiting rank uses the filesystem only:

1. the entry is published: load it;
2. the build lock is held by a builder (the builder, or anyone building: a holder writes its
   ``.holder`` file under the lock): block on it (``flock``, released by the OS even when its
   holder is killed), without writing a holder file of its own, then load what was published,
   or raise ``BuildError`` when nothing was (the build failed, or its process died). Held with
   no holder file is another waiting rank's probe (microseconds): poll on;
3. nobody holds it: poll, and after ``OPFORGE_DIST_GRACE`` seconds (default 30) build it here,
   under the lock as usual. The builder may be late, or may never load this kernel.

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


def await_builder(find: Callable[[], T | None], lock_path: str, failed: str, what: str, r: Role,
                  s: settings_mod.Settings, reporter, still_building: Callable[[], bool] | None = None) -> T | None:
    """Wait for ``r.builder`` to publish ``what`` (see the module doc). The entry, or None when this
    process should build it itself; BuildError when the builder gave up without publishing."""
    from .lock import BuildLock, held, read_holder

    deadline = time.monotonic() + s.dist_grace
    since = time.time() - s.dist_grace  # a failure older than that is not this job's
    delay = 0.05
    reporter.info(f"{what}: waiting for {r.builder} to build it ({r.reason})")
    while True:
        found = find()
        if found is not None:
            return found
        failure = failures.recent(failed, since)
        if failure is not None:
            raise BuildError(f"{what}: its build failed on {failure.host} (pid {failure.pid}, "
                             f"{time.time() - failure.when:.0f} s ago), so this rank does not retry it. "
                             f"The error was: {failure.error}")
        if held(lock_path) and read_holder(lock_path) is not None:
            # A builder holds it (a holder file names it). Held with no holder file is another
            # waiting rank's probe, for microseconds, or a builder about to write its file: look again.
            with BuildLock(lock_path, what, s.lock_timeout, reporter.notice, record=False):
                found = find()
            if found is not None:
                return found
            failure = failures.recent(failed, since)
            raise BuildError(f"{what}: its build failed: {failure.error}") if failure else BuildError(
                f"{what}: the process building it ({r.builder}, or a rank that took over) released the build "
                "lock without publishing it: its build failed or it was killed. See that rank's output for "
                "the compiler's errors; the next load() builds it again."
            )
        if time.monotonic() >= deadline and still_building is not None and still_building():
            deadline = time.monotonic() + s.dist_grace  # another node's builder is at it (remote scope)
        if time.monotonic() >= deadline:
            reporter.notice(f"{what}: {r.builder} has not started building it in {s.dist_grace:g} s "
                   "(OPFORGE_DIST_GRACE); building it here")
            return None
        time.sleep(delay * (0.5 + random.random()))  # jitter: many ranks must not probe in step
        delay = min(delay * 1.5, 1.0)
