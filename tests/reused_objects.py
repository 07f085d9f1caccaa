"""A compile that another build already ran, served from that build's object (CompilerLog's wrapper runs
this for a compile when $CXX_SAVE_OBJECTS or $CXX_REUSE_OBJECTS is set).

``python reused_objects.py <compiler> <args...>``:
* $CXX_SAVE_OBJECTS=<dir>: compile, then keep the object and its depfile in <dir> under the command's
  key;
* $CXX_REUSE_OBJECTS=<dir>: when <dir> holds an object under the command's key, copy it and its depfile
  to this command's outputs and compile nothing; else compile. Each command it served goes to
  $CXX_REUSE_OBJECTS/served.log.

The key is the command's arguments less two kinds that opforge adds to torch's own command on purpose
(``command_key``): ``-ffile-prefix-map=...`` (paths in debug info and ``__FILE__``, never code) and
``-D_GLIBCXX_USE_CXX11_ABI=1``, which is what gcc's headers define when nothing does. The test that reuses
objects asserts that this is the whole difference between the two builds' commands
(tests/clients/test_deepspeed.py), so an object is only ever reused for the command that made it.
Output paths are relative to the build dir in both builds (``-o cpu_adam.o``), so they are part of the key.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

ADDED_BY_OPFORGE = ("-ffile-prefix-map=", "-D_GLIBCXX_USE_CXX11_ABI=1")
"""The prefixes of the arguments opforge adds to the command torch's ``load`` would run (ignored in the key)."""


def command_key(args: list[str]) -> str:
    """The key of a compile's arguments (the compiler left out).

    >>> command_key(["-O3", "-ffile-prefix-map=/b=.", "-c", "a.cpp", "-o", "a.o"]) == command_key(["-O3", "-c", "a.cpp", "-o", "a.o"])
    True
    >>> command_key(["-O3", "-c", "a.cpp", "-o", "a.o"]) == command_key(["-O2", "-c", "a.cpp", "-o", "a.o"])
    False
    """
    kept = [a for a in args if not a.startswith(ADDED_BY_OPFORGE)]
    return hashlib.sha256("\0".join(kept).encode()).hexdigest()[:32]


def _outputs(args: list[str]) -> tuple[str, str | None]:
    out = args[args.index("-o") + 1]
    return out, (args[args.index("-MF") + 1] if "-MF" in args else None)


def _put(src: str, dst: str) -> None:
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def main(argv: list[str]) -> int:
    compiler, args = argv[0], argv[1:]
    key = command_key(args)
    out, depfile = _outputs(args)
    reuse = os.environ.get("CXX_REUSE_OBJECTS")
    if reuse and os.path.exists(os.path.join(reuse, key + ".o")):
        _put(os.path.join(reuse, key + ".o"), out)
        if depfile:
            _put(os.path.join(reuse, key + ".d"), depfile)
        with open(os.path.join(reuse, "served.log"), "a") as f:
            f.write(" ".join(args) + "\n")
        return 0
    rc = subprocess.call([compiler, *args])
    save = os.environ.get("CXX_SAVE_OBJECTS")
    if rc == 0 and save:
        os.makedirs(save, exist_ok=True)
        _put(out, os.path.join(save, key + ".o"))
        if depfile:
            _put(depfile, os.path.join(save, key + ".d"))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
