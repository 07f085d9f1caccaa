"""A precompiled ``torch/extension.h``, shared by every build with the same compiler and flags (on by
default; ``OPFORGE_PCH=0`` turns it off).

Precompiling the header costs about one plain compile of a source that includes it, once per
(compiler, flags): the notice says how long it took. After that each such source compiles in
about a third of the time (docs/benchmarks.md, issue 23).

How: the PCH is built with the build's own C++ flags (less ``TORCH_EXTENSION_NAME``, which
torch's headers don't use; with ``-march=native``, the CPU is part of its key) into
``<cache>/.pch/<key16>/``, published atomically under a lock like any entry. Sources whose
preamble reaches ``#include <torch/extension.h>`` through nothing that could change what it
means (``eligible``) get ``-include`` of it. The PCH is only an accelerator: it is not part of any
build key or manifest; GCC falls back to the plain header, silently, when the PCH does not match
(other flags, another compiler); one that fails to build is skipped (said with OPFORGE_VERBOSE=1).
GCC only (clang's PCHs work differently): with another compiler, nothing changes.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time

from .key import digest
from .progress import Reporter
from .toolchain import Tool, host_cpu_identity

HEADER = "torch/extension.h"
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


#: Macros that only Windows headers read: defined before torch/extension.h, they change nothing here
#: (DeepSpeed's cpu_adam.h defines NOMINMAX first).
_WINDOWS_ONLY = frozenset({"NOMINMAX", "WIN32_LEAN_AND_MEAN", "_USE_MATH_DEFINES", "_CRT_SECURE_NO_WARNINGS"})
_DIRECTIVE = re.compile(r"^\s*#\s*(\w+)\s*(.*?)\s*$")


def eligible(source: str, include_dirs=()) -> bool:
    """Can ``source`` be compiled with the precompiled ``torch/extension.h`` ``-include``'d ahead of
    it, meaning the same? Yes when its preamble reaches ``#include <torch/extension.h>`` through
    nothing that could change what that header means: comments, ``#pragma once``, an include
    guard, system includes (``<...>``, guarded and read again later as no-ops), the Windows-only
    macros above, and local includes (``"..."``, found beside the file or in ``include_dirs``)
    whose own preambles pass the same test. Any other code or directive first: no."""
    return _walk(os.path.abspath(source), tuple(include_dirs), set()) is True


def _walk(path: str, include_dirs: tuple[str, ...], seen: set[str]):
    """True: reaches the header; None: ended harmlessly without it; False: something else came first."""
    if path in seen or len(seen) > 16:
        return False
    seen.add(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = _COMMENTS.sub("", f.read())
    except OSError:
        return False
    lines = [ln for ln in text.splitlines() if ln.strip()]
    guard = None
    for i, line in enumerate(lines):
        m = _DIRECTIVE.match(line)
        if m is None:
            return False  # code
        word, rest = m.groups()
        if word == "pragma" and rest == "once":
            continue
        if word == "ifndef" and i == 0 and i + 1 < len(lines):
            guard = rest
            continue
        if word == "define" and (rest == guard or rest.split()[0] in _WINDOWS_ONLY):
            continue
        if word == "endif" and guard is not None and i == len(lines) - 1:
            return None
        if word != "include":
            return False
        if rest.startswith("<"):
            if rest.startswith(f"<{HEADER}>"):
                return True
            continue
        name = rest.strip('"')
        here = os.path.dirname(path)
        found = next((os.path.join(d, name) for d in (here, *include_dirs) if os.path.isfile(os.path.join(d, name))),
                     None)
        verdict = False if found is None else _walk(os.path.abspath(found), include_dirs, seen)
        if verdict is not None:
            return verdict
    return None


def first_include(source: str) -> str | None:
    """The first header a source file includes (comments skipped)."""
    try:
        with open(source, encoding="utf-8", errors="replace") as f:
            return first_include_in(f.read())
    except OSError:
        return None


def first_include_in(text: str) -> str | None:
    """
    >>> first_include_in('// hi\\n/* #include <a.h> */\\n#include <torch/extension.h>\\n#include "b.h"')
    'torch/extension.h'
    """
    m = _INCLUDE.search(_COMMENTS.sub("", text))
    return m.group(1) if m else None


@functools.lru_cache(maxsize=8)
def is_gcc(cxx_argv: tuple[str, ...]) -> bool:
    """True for GCC (whose ``.gch`` files this uses), False for clang and the rest."""
    try:
        out = subprocess.run([*cxx_argv, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "__GNUC__" in out and "__clang__" not in out


def pch_flags(cflags: tuple[str, ...]) -> list[str]:
    return [f for f in cflags if not f.startswith("-DTORCH_EXTENSION_NAME=")]


def ensure(root: str, cxx: Tool, cxx_argv: list[str], cflags: tuple[str, ...], timeout: float,
           reporter: Reporter) -> str | None:
    """The path of a header to ``-include`` (its ``.gch`` beside it), building it on first use.
    None when this compiler can't use one or the build failed (the caller builds without)."""
    from .lock import BuildLock

    if not is_gcc(tuple(cxx.argv)):
        reporter.info("the compiler is not GCC; building without a precompiled torch/extension.h")
        return None
    flags = pch_flags(cflags)
    native = any(f.endswith("=native") for f in flags)  # -march=native is this CPU's flags: key them so
    key = digest({"cxx": cxx.identity, "flags": flags, "header": HEADER,
                  "cpu": host_cpu_identity() if native else ""})[:16]
    base = os.path.join(root, ".pch")
    final = os.path.join(base, key)
    header = os.path.join(final, "torch_extension.h")
    if os.path.exists(header + ".gch"):
        return header
    os.makedirs(base, mode=0o700, exist_ok=True)
    with BuildLock(os.path.join(base, key + ".lock"), "the torch/extension.h PCH", timeout, reporter.notice):
        if os.path.exists(header + ".gch"):
            return header
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=base)
        try:
            tmp_header = os.path.join(tmp, "torch_extension.h")
            with open(tmp_header, "w", encoding="utf-8") as f:
                f.write(f"#include <{HEADER}>\n")
            started = time.monotonic()
            with reporter.building("a precompiled torch/extension.h", 1):
                done = subprocess.run([*cxx_argv, *flags, "-x", "c++-header", tmp_header, "-o", tmp_header + ".gch"],
                                      capture_output=True, text=True)
            if done.returncode != 0:  # the build goes on without it; its own compile says what is wrong, if anything
                reporter.info(f"precompiling {HEADER} failed; building without it:\n{done.stderr.strip()[:2000]}")
                return None
            os.rename(tmp, final)
            reporter.notice(f"precompiled {HEADER} in {time.monotonic() - started:.1f} s, once for this compiler and "
                            f"these flags ({final}): builds that use them compile faster from now on "
                            "(OPFORGE_PCH=0 turns this off)")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return header
