"""Builds that failed, remembered per input key: ``<root>/<name>/.failed-<key16>.json``.

A failed build publishes nothing, and the next ``load()`` builds again: that is what a developer
fixing their source wants. A kernel loader choosing among variants wants the opposite: a variant
whose source doesn't compile here (an old compiler, a missing intrinsic) would cost its full
compile time in every new process before the loader falls back. So the failure is written down
with what the build read (its sources, the headers the compiler reported, the source and include
dirs), and the loader skips the variant while all of those stat the same (``still_holds``). Any
edit, a new header in an include dir, or other flags or another compiler (a new input key) make
it history. A waiting rank under torch.distributed reads the same record (``ranks.py``).

``opforge cache clean`` removes the records; ``opforge report`` shows a remembered failure as
the variant's rejection.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field

from ..files import atomic_write
from .deps import is_system_path, parse_ninja_deps

PREFIX = ".failed-"


def path_for(name_dir: str, input_key: str) -> str:
    return os.path.join(name_dir, f"{PREFIX}{input_key[:16]}.json")


@dataclass(frozen=True)
class Failure:
    when: float
    pid: int
    host: str
    error: str
    log: str | None = None
    inputs: list = field(default_factory=list)
    """``[path, size, mtime_ns]`` of everything the build read (files and dirs)."""

    def first_line(self) -> str:
        """The compiler's first error line, else the message's first line."""
        lines = [ln.strip() for ln in self.error.splitlines() if ln.strip()]
        return next((ln for ln in lines if "error" in ln.lower() and not ln.startswith("building")),
                    lines[0] if lines else "")

    def still_holds(self) -> bool:
        """True while every input stats as it did when the build failed."""
        for path, size, mtime_ns in self.inputs:
            try:
                st = os.stat(path)
            except OSError:
                return False
            if st.st_size != size or st.st_mtime_ns != mtime_ns:
                return False
        return True

    def describe(self, name: str) -> str:
        age = time.time() - self.when
        ago = f"{age:.0f} s" if age < 120 else f"{age / 60:.0f} min" if age < 7200 else f"{age / 3600:.1f} h"
        return (f"its build failed {ago} ago ({self.first_line() or 'see the log'}); skipped until its sources, "
                f"headers, flags or compiler change: fix them, or run `opforge cache clean {name}` to try again"
                + (f" (log: {self.log})" if self.log else ""))


def record(path: str, exc: BaseException, inputs: list) -> None:
    """Write the record (best effort: without it the next process only builds, and fails, again)."""
    f = Failure(time.time(), os.getpid(), socket.gethostname(), str(exc), getattr(exc, "log_path", None), inputs)
    try:
        atomic_write(path, json.dumps(asdict(f)), durable=False)
    except OSError:
        pass


def read(path: str) -> Failure | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return Failure(**data)
    except (OSError, ValueError, TypeError):
        return None


def recent(path: str, since: float) -> Failure | None:
    """The record, if it was written at ``since`` or later (a waiting rank's view: older is not this job's)."""
    f = read(path)
    return f if f is not None and f.when >= since else None


def forget(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def inputs_of(sources: tuple[str, ...], include_dirs: tuple[str, ...], build_dir: str, ninja: str,
              system: list[str]) -> list:
    """What a failed build read: the sources, the dirs a ``#include`` searches (a header added there
    changes the dir), and the headers outside ``system`` that the compiler reported, from the
    depfiles a failed compile leaves and ninja's log of the objects that compiled."""
    paths = dict.fromkeys([*sources, *(os.path.dirname(s) for s in sources), *include_dirs])
    for obj_deps in _reported(build_dir, ninja).values():
        for p in obj_deps:
            if not is_system_path(p, system):
                paths[p] = None
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append([p, st.st_size, st.st_mtime_ns])
    return out


def _reported(build_dir: str, ninja: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    try:
        out = subprocess.run([ninja, "-t", "deps"], cwd=build_dir, capture_output=True, text=True, timeout=60,
                             check=False)
        found.update(parse_ninja_deps(out.stdout))
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        names = [n for n in os.listdir(build_dir) if n.endswith(".d")]
    except OSError:
        names = []
    for n in names:
        try:
            with open(os.path.join(build_dir, n), encoding="utf-8", errors="replace") as f:
                found[n[:-2]] = parse_depfile(f.read())
        except OSError:
            continue
    return {obj: [os.path.abspath(os.path.join(build_dir, p)) for p in deps] for obj, deps in found.items()}


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Makefile-style depfile (``gcc -MMD``), escapes undone.

    >>> parse_depfile("a.o: /s/a.cpp /s/my\\\\ dir/a.h \\\\\\n /s/b.h\\n")
    ['/s/a.cpp', '/s/my dir/a.h', '/s/b.h']
    """
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for line in text.splitlines():
        _target, sep, rest = line.partition(": ")
        if not sep:
            continue
        word, i = "", 0
        while i < len(rest):
            c = rest[i]
            if (c == "\\" and rest[i + 1:i + 2] in (" ", "#")) or (c == "$" and rest[i + 1:i + 2] == "$"):
                word += rest[i + 1]  # an escaped space, '#' or '$'
                i += 2
                continue
            if c.isspace():
                if word:
                    deps.append(word)
                word = ""
            else:
                word += c
            i += 1
        if word:
            deps.append(word)
    return deps
