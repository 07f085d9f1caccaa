"""Build locks that die with their holder.

The lock is ``flock`` on a file (through ``filelock``): the kernel releases it when the
holding process exits, however it exits, so a ``kill -9`` never leaves a lock behind.
Next to it, ``<lock>.holder`` names the holder (pid, host, since) for the waiters'
messages. The holder removes it before releasing; finding one on acquiring means the
previous holder died mid-build, which the caller uses to start from a clean build dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import filelock

from ..errors import LockTimeoutError
from ..files import atomic_write

#: How often a waiter re-prints who holds the lock.
NOTICE_EVERY_S = 30.0


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    since: float
    what: str

    def describe(self) -> str:
        started = time.strftime("%H:%M:%S", time.localtime(self.since))
        alive = ""
        if self.host == socket.gethostname():
            alive = "" if _pid_alive(self.pid) else " (that process has exited)"
        return f"pid {self.pid} on {self.host}, building {self.what} since {started} ({time.time() - self.since:.0f} s){alive}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(lock_path: str) -> Holder | None:
    try:
        with open(lock_path + ".holder", encoding="utf-8") as f:
            return Holder(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def held(lock_path: str) -> bool:
    """True when some process holds the lock now (a non-blocking probe; a lock file that does not
    exist is held by nobody, and is not created)."""
    if not os.path.exists(lock_path):
        return False
    lock = filelock.FileLock(lock_path, mode=0o600, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    lock.release()
    return False


class BuildLock:
    """``with BuildLock(path, what, timeout, notify) as lock: ...``; ``lock.previous`` is a dead holder, if any.

    ``record=False``: take the lock only to wait for its holder (a rank waiting for its builder),
    writing no holder file and removing none, so nobody takes this process for a builder."""

    def __init__(self, path: str, what: str, timeout: float, notify: Callable[[str], None], record: bool = True):
        self.path = path
        self.what = what
        self.timeout = timeout
        self.notify = notify
        self.record = record
        self.previous: Holder | None = None
        self._lock = filelock.FileLock(path, mode=0o600, thread_local=False, fallback_to_soft=False)

    def __enter__(self) -> BuildLock:
        start = time.monotonic()
        try:  # a moment's grace first: a waiting rank's probe (engine/ranks.py) holds it for microseconds
            self._lock.acquire(timeout=0.2, poll_interval=0.01)
        except filelock.Timeout:
            self._wait(start)
        if not self.record:
            return self
        # We hold it. A holder file still here was left by a holder that died.
        self.previous = read_holder(self.path)
        me = Holder(os.getpid(), socket.gethostname(), time.time(), self.what)
        try:
            atomic_write(self.path + ".holder", json.dumps(me.__dict__), durable=False)
        except OSError:  # only the waiters' messages need it (a full disk must not leave the lock held)
            pass
        return self

    def _wait(self, start: float) -> None:
        last_notice = -NOTICE_EVERY_S
        while True:
            waited = time.monotonic() - start
            if waited - last_notice >= NOTICE_EVERY_S:
                holder = read_holder(self.path)
                who = holder.describe() if holder else "another process"
                self.notify(f"waiting for the build lock of {self.what}: held by {who} (lock {self.path})")
                last_notice = waited
            left = self.timeout - waited
            if left <= 0:
                holder = read_holder(self.path)
                who = holder.describe() if holder else "an unknown process"
                raise LockTimeoutError(
                    f"gave up after {self.timeout:.0f} s waiting for the build lock of {self.what}, held by {who}. "
                    "The lock is released by the OS when its holder exits, so a live process holds it: "
                    "let it finish, kill it if it is stuck, or raise OPFORGE_LOCK_TIMEOUT (seconds). "
                    f"Lock file: {self.path}"
                )
            try:
                self._lock.acquire(timeout=min(left, NOTICE_EVERY_S), poll_interval=0.02)
                return
            except filelock.Timeout:
                continue

    def __exit__(self, *exc) -> None:
        if self.record:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path + ".holder")
        self._lock.release()
