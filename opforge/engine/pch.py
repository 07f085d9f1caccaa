"""An optional precompiled ``torch/extension.h``, shared by every extension (``OPFORGE_PCH=1``).

Precompiling the header once costs more than one plain compile of a source that includes it,
and each later source built with the same flags compiles in about half the time, so it pays
from the third extension and is off by default: the first build would be slower than torch's
(the figures: docs/benchmarks.md, "What was tried to make cold builds faster").

How: the PCH is built with the extension's own C++ flags (less ``TORCH_EXTENSION_NAME``,
which torch's headers don't use), once per (compiler, flags), into
``<cache>/.pch/<key16>/``, published atomically under a lock like any entry. Sources
whose first ``#include`` is ``<torch/extension.h>`` get ``-include`` of it. The PCH is
only an accelerator: it is not part of any build key or manifest, GCC falls back to the
plain header when the PCH does not match, and a PCH that fails to build is skipped with a
notice. GCC only (clang's PCHs work differently).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile

from .key import digest
from .progress import Reporter
from .toolchain import Tool

HEADER = "torch/extension.h"
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


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
        reporter.info("OPFORGE_PCH: the compiler is not GCC; building without a precompiled header")
        return None
    flags = pch_flags(cflags)
    key = digest({"cxx": cxx.identity, "flags": flags, "header": HEADER})[:16]
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
            with reporter.building("a precompiled torch/extension.h", 1):
                done = subprocess.run([*cxx_argv, *flags, "-x", "c++-header", tmp_header, "-o", tmp_header + ".gch"],
                                      capture_output=True, text=True)
            if done.returncode != 0:
                reporter.notice(f"OPFORGE_PCH: precompiling {HEADER} failed; building without it:\n"
                                f"{done.stderr.strip()[:2000]}")
                return None
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return header
