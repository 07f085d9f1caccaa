"""The shared precompiled ``torch/extension.h``: where each PCH lives, when one is made, and the cap
on their disk (``OPFORGE_PCH``, ``OPFORGE_PCH_MAX_SIZE``; which sources may use one: ``pch.py``).

A PCH saves about two thirds of each later compile of a source that includes the header, but
making one costs about one plain compile and 0.7-0.9 GB, and most flag sets are built once. So
it never costs a build (``auto``, the default):

* a build uses the PCH of its compiler and flags when it is there, and never waits for one;
* a build with none is the plain build, the same commands as with ``OPFORGE_PCH=0``;
* the second build of a flag set (``builds`` in the record), once published and unlocked,
  starts a detached process at the lowest CPU priority (``nice 19``) that makes the PCH for
  next time, under the PCH's lock; one such process at a time per cache (each takes a core and
  1-2 GB of memory); a failure is recorded and not tried again;
* the PCHs' total size stays under ``OPFORGE_PCH_MAX_SIZE`` (2 GiB by default): the least
  recently used go first.

``eager`` (and ``load_inline(use_pch=True)``, as torch's ``use_pch``) makes it before the build
that asked. Layout, in ``<cache>/.pch/``::

    <key>.h          #include <torch/extension.h>: what a build -include's (kept when the PCH goes,
                     so a build that named it falls back to the plain header, silently, in GCC)
    <key>.h.gch      the PCH, published whole with os.replace
    <key>.json       the record: builds seen, last use, flags, how long it took, size, a failure
    <key>.lock       held while it is made; <key>.pending while a maker is on its way; <key>.log

The key covers the compiler, the flags (less ``TORCH_EXTENSION_NAME``), torch's identity and
Python's version (GCC does not check that the header's files are unchanged), and the CPU when a
flag says ``native``. Architecture notes: docs/architecture.md, "The precompiled header".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .. import settings as settings_mod
from ..errors import UnsafeCacheError
from ..files import atomic_write
from . import cache
from . import pch as pch_text
from .key import digest
from .toolchain import host_cpu_identity

#: A maker that has not taken the lock this long after it was started is taken for dead.
_PENDING_GRACE_S = 30.0


@dataclass(frozen=True)
class Pch:
    """One precompiled header: its directory, key, and how it is made."""

    base: str
    """``<cache>/.pch``."""
    key: str
    argv: tuple[str, ...]
    """The compiler command (with its ccache wrapper, if any)."""
    flags: tuple[str, ...]

    def path(self, suffix: str) -> str:
        return os.path.join(self.base, self.key + suffix)

    @property
    def header(self) -> str:
        return self.path(".h")

    @property
    def gch(self) -> str:
        return self.path(".h.gch")


def describe(root: str, compiler_identity: str, cxx_argv, cflags, toolchain_identity: str) -> Pch:
    """The PCH a build with these flags would use (pure: nothing is read or written)."""
    flags = pch_text.pch_flags(tuple(cflags))
    native = any(f.endswith("=native") for f in flags)  # -march=native is this CPU's flags: key them so
    key = digest({"cxx": compiler_identity, "flags": flags, "header": pch_text.HEADER, "toolchain": toolchain_identity,
                  "python": sys.version, "cpu": host_cpu_identity() if native else ""})[:16]
    return Pch(os.path.join(root, ".pch"), key, tuple(cxx_argv), tuple(flags))


# --- the record ---------------------------------------------------------------------------------

def read_record(p: Pch) -> dict:
    try:
        with open(p.path(".json"), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _update(p: Pch, **changes) -> dict:
    record = {**read_record(p), **changes}
    with contextlib.suppress(OSError):  # only bookkeeping: a full disk must not fail the build
        atomic_write(p.path(".json"), json.dumps(record, sort_keys=True), durable=False)
    return record


# --- what a build does --------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What a build does about its PCH: ``use`` (the header to -include in ``sources``, or None), and
    whether to make the PCH in the background once the build is published (``make_after``)."""

    pch: Pch
    use: str | None
    make_after: bool
    sources: frozenset[str] = frozenset()


def plan(p: Pch, mode: str, cap: int, timeout: float, reporter, sources: frozenset[str] = frozenset()) -> Plan:
    """Decide for one build (``mode``: ``auto`` or ``eager``; ``cap``: the PCHs' size limit), and
    note it in the record."""
    if os.path.exists(p.gch):
        try:  # the compiler reads it as code: only one that nobody else could have written
            for path in (p.base, p.header, p.gch):
                cache.check_safe(path)
        except (OSError, UnsafeCacheError) as exc:
            reporter.notice(f"building without the precompiled header {p.gch}: {exc}")
            return Plan(p, None, False, sources)
        _update(p, last_used=time.time())
        return Plan(p, p.header, False, sources)
    try:
        return _plan_missing(p, mode, cap, timeout, reporter, sources)
    except OSError as exc:  # an accelerator: a cache that can't take it builds without
        reporter.info(f"building without a precompiled header: {exc}")
        return Plan(p, None, False, sources)


def _plan_missing(p: Pch, mode: str, cap: int, timeout: float, reporter, sources: frozenset[str]) -> Plan:
    record = read_record(p)
    settled = record.get("failed") or record.get("too_big")
    if mode == "eager":
        if settled:
            return Plan(p, None, False, sources)
        reporter.notice(f"precompiling {pch_text.HEADER} before this build, once for these flags (asked for: "
                        f"use_pch=True or OPFORGE_PCH=eager; {p.gch})")
        return Plan(p, p.header if make(p, cap, timeout, reporter) else None, False, sources)
    builds = int(record.get("builds", 0)) + 1
    os.makedirs(p.base, mode=0o700, exist_ok=True)
    _update(p, builds=builds, flags=list(p.flags))
    return Plan(p, None, builds >= 2 and not settled and cap > 0, sources)


def make(p: Pch, cap: int, timeout: float, reporter) -> bool:
    """Make the PCH under its lock (another maker holding it: wait for that one), then keep the PCHs
    under ``cap`` bytes (``evict``). True when it is there afterwards."""
    from .lock import BuildLock

    if os.path.exists(p.gch):
        return True
    os.makedirs(p.base, mode=0o700, exist_ok=True)
    with BuildLock(p.path(".lock"), "the torch/extension.h PCH", timeout, reporter.notice):
        if os.path.exists(p.gch):
            return True
        fd = os.open(p.header, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:  # what builds -include; GCC finds <it>.gch beside it
            f.write(f"#include <{pch_text.HEADER}>\n")
        os.chmod(p.header, 0o600)  # (whatever the umask: check_safe refuses one that others could write)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=p.base)
        try:
            out = os.path.join(tmp, "pch.gch")
            started = time.monotonic()
            done = subprocess.run([*p.argv, *p.flags, "-x", "c++-header", p.header, "-o", out],
                                  capture_output=True, text=True)
            took = time.monotonic() - started
            if done.returncode != 0:  # builds go on without it; their own compiles say what is wrong, if anything
                _update(p, failed=done.stderr.strip()[-2000:] or f"exit {done.returncode}")
                reporter.info(f"precompiling {pch_text.HEADER} failed; building without it:\n{done.stderr.strip()[:2000]}")
                return False
            size = os.path.getsize(out)
            os.chmod(out, 0o600)
            os.replace(out, p.gch)
            _update(p, made_s=round(took, 1), size=size, last_used=time.time(), failed=None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    reporter.info(f"precompiled {pch_text.HEADER} in {took:.1f} s ({size / 2**20:.0f} MiB, {p.gch})")
    evict(p.base, cap, keep=p.key)
    return os.path.exists(p.gch)


# --- in the background --------------------------------------------------------------------------

def start_background(p: Pch, cap: int, reporter) -> int | None:
    """Start a detached, lowest-priority process that makes ``p`` and then keeps the PCHs under
    ``cap`` bytes. Returns its pid (None when it could not start: said with OPFORGE_VERBOSE)."""
    from .lock import held

    if os.path.exists(p.gch) or held(p.path(".lock")) or _makers(p.base):
        return None  # one maker at a time per cache (each takes a core and 1-2 GB): a later build starts this one
    job = json.dumps({"base": p.base, "key": p.key, "argv": list(p.argv), "flags": list(p.flags), "cap": cap})
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = settings_mod.subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join(x for x in (package_root, env.get("PYTHONPATH")) if x)
    try:
        atomic_write(p.path(".pending"), json.dumps({"since": time.time()}), durable=False)
        with open(p.path(".log"), "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", __name__, job], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, env=env)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(p.path(".pending"))
        reporter.info(f"could not start making the PCH in the background: {exc}")
        return None
    _STARTED.append(proc)
    reporter.notice(f"these flags were built before: precompiling {pch_text.HEADER} for them in the background "
                    f"(pid {proc.pid}, lowest priority; {p.gch}, the PCHs capped at {cap / 2**30:.1f} GiB), so that "
                    "later builds with them compile faster (OPFORGE_PCH=0 turns this off)")
    return proc.pid


#: This process's makers (reaped by ``wait``).
_STARTED: list[subprocess.Popen] = []


def _pending_alive(path: str) -> bool:
    """A maker was started and has not finished: its marker is fresh, or its lock is held."""
    from .lock import held

    try:
        since = os.stat(path).st_mtime
    except OSError:
        return False
    if held(path[: -len(".pending")] + ".lock") or time.time() - since < _PENDING_GRACE_S:
        return True
    with contextlib.suppress(OSError):  # its maker died before it took the lock
        os.unlink(path)
    return False


def _makers(base: str) -> list[str]:
    """The markers of the makers at work in ``base`` now."""
    try:
        markers = [os.path.join(base, n) for n in os.listdir(base) if n.endswith(".pending")]
    except OSError:
        return []
    return [m for m in markers if _pending_alive(m)]


def wait(root: str, timeout: float = 600.0) -> bool:
    """Wait for the PCH makers working in cache ``root`` (this process's and others'); True when none
    is left. For tests, benchmarks and ``make demo``; builds never wait."""
    deadline = time.monotonic() + timeout
    base = os.path.join(root, ".pch")
    while True:
        for proc in list(_STARTED):
            if proc.poll() is not None:
                _STARTED.remove(proc)
        if not _makers(base):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _worker(job: dict) -> int:
    """The background maker: ``python -m opforge.engine.pch_store JOB``."""
    from .progress import Reporter

    p = Pch(job["base"], job["key"], tuple(job["argv"]), tuple(job["flags"]))
    with contextlib.suppress(OSError):
        os.nice(19)
    try:
        make(p, int(job["cap"]), timeout=3600.0, reporter=Reporter(True))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(p.path(".pending"))
    return 0


# --- the cap ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stored:
    """A PCH on disk, for the cap and ``opforge cache``."""

    key: str
    path: str
    size: int
    last_used: float


def stored(base: str) -> list[Stored]:
    """The PCHs in ``base`` (``<cache>/.pch``), least recently used first."""
    out = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for n in names:
        path = os.path.join(base, n)
        if n.endswith(".h.gch"):
            key = n[: -len(".h.gch")]
            try:
                st = os.stat(path)
            except OSError:
                continue
            used = read_record(Pch(base, key, (), ())).get("last_used")
            out.append(Stored(key, path, st.st_size, float(used) if used else st.st_mtime))
        elif not n.startswith(".") and os.path.isdir(path):  # the layout before issue 33: <key>/torch_extension.h.gch
            size = sum(e.stat().st_size for e in os.scandir(path) if e.is_file(follow_symlinks=False))
            out.append(Stored(n, path, size, os.stat(path).st_mtime))
    return sorted(out, key=lambda s: s.last_used)


def evict(base: str, cap: int, keep: str = "") -> list[str]:
    """Remove the least recently used PCHs until they take at most ``cap`` bytes; ``keep`` (the one just
    made) goes last, and when it alone is over the cap it is marked ``too_big``, not to be made again. One
    being made is skipped. Returns the paths removed.
    A build that already -include'd a removed PCH's header compiles on with the plain header."""
    items = stored(base)
    total = sum(s.size for s in items)
    removed = []
    for s in sorted(items, key=lambda s: (s.key == keep, s.last_used)):
        if total <= cap:
            break
        if discard(base, s.key, record=s.key != keep):
            removed.append(s.path)
            total -= s.size
            if s.key == keep and s.size > cap:  # alone over the cap: not worth making again
                _update(Pch(base, keep, (), ()), too_big=True)
    return removed


def discard(base: str, key: str, record: bool = True) -> bool:
    """Remove one PCH unless it is being made now; its ``.h`` stays (a running build may have named it).
    ``record``: forget its record too (builds seen: a later second build makes it again)."""
    from .lock import held

    if held(os.path.join(base, key + ".lock")):
        return False
    old = os.path.join(base, key)
    if os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
        return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(base, key + ".h.gch"))
    if record:
        for suffix in (".json", ".log"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(base, key + suffix))
    return True


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1])))
