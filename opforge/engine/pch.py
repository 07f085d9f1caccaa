"""Which sources may use the shared precompiled ``torch/extension.h``, read from their text, and which
compilers and flags make one (when it is made and where it lives: ``pch_store.py``).

Sources whose preamble reaches ``#include <torch/extension.h>`` through nothing that could change
what it means (``eligible``) get ``-include`` of the PCH's header. The PCH is only an accelerator:
it is not part of any build key or manifest; GCC falls back to the plain header, silently, when the
PCH does not match (other flags, another compiler) or is gone. GCC only (clang's PCHs work
differently): with another compiler, nothing changes.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess

HEADER = "torch/extension.h"
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


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
