"""Where a build's files are, said so that the key doesn't depend on it.

A CI job builds in ``/builds/proj/...``; a node runs the same bytes from
``~/venvs/x/lib/python3.11/site-packages/...`` or a container's ``/opt/...``. For the cache (local,
``cache export/import`` and the remote) to find one binary for both, the build key names the
sources' bytes and their *layout*, never this machine's absolute paths:

* the **source root**: the common directory of the sources and of the include dirs that are not
  the system's, or a root the caller declares (``load(..., source_root=...)``). Paths under it go in
  relative to it (``csrc/adam.cpp``, ``-I${root}/include``);
* the **system's dirs** (torch's, Python's and CUDA's includes): by a name (``${torch}``,
  ``${python}``, ``${cuda}``); what is in them is covered by the identities already in the key
  (torch's version and git hash, Python's ABI, nvcc's);
* anything else stays absolute: a dir outside the root (``/opt/cutlass/include``) must be at the
  same place on every node, and the key says so.

The same :class:`Places` gives the compiler's prefix maps (``-ffile-prefix-map``, as reproducible
builds and ccache's ``base_dir`` use them), so the binary doesn't record where it was built either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


def is_under(path: str, root: str) -> bool:
    """
    >>> is_under("/a/b/c.h", "/a/b"), is_under("/a/bc/d.h", "/a/b"), is_under("/a/b", "/a/b")
    (True, False, True)
    >>> is_under("/x/y", "/")
    True
    """
    return path == root or path.startswith(root.rstrip("/") + "/")


def choose_root(sources: list[str], include_dirs: list[str], system: list[str], declared: str | None = None) -> str:
    """The source root of a build (see the module doc). Pure; every path absolute.

    >>> choose_root(["/ci/proj/csrc/a.cpp", "/ci/proj/csrc/k/b.cu"], ["/ci/proj/include"], [])
    '/ci/proj'
    >>> choose_root(["/home/u/p/a.cpp"], ["/opt/cutlass/include", "/t/include"], ["/t/include"])
    '/home/u/p'
    >>> choose_root(["/home/u/p/a.cpp"], [], [], declared="/home/u")
    '/home/u'
    >>> choose_root(["/home/u/p/a.cpp"], [], [], declared="/srv")
    Traceback (most recent call last):
    ...
    ValueError: source_root='/srv' does not hold the source /home/u/p/a.cpp: pass a directory above every source (e.g. '/home/u/p'), or leave it out
    """
    dirs = [os.path.dirname(s) for s in sources]
    if declared:
        root = os.path.abspath(declared)
        for s in sources:
            if not is_under(s, root):
                raise ValueError(f"source_root={declared!r} does not hold the source {s}: pass a directory above "
                                 f"every source (e.g. {os.path.commonpath(dirs)!r}), or leave it out")
        return root
    own = [d for d in include_dirs if not any(is_under(d, p) for p in system)]
    root = os.path.commonpath(dirs + own)
    if root == os.sep and own:  # an include dir elsewhere (/opt/...): it stays absolute, the sources don't
        root = os.path.commonpath(dirs)
    return root


@dataclass(frozen=True)
class Places:
    """This machine's directories that a build's paths are said relative to (absolute, real)."""

    root: str
    """The source root (``choose_root``)."""
    system: tuple[tuple[str, str], ...] = ()
    """(name, dir) of the system's dirs: ``("torch", "/venv/.../torch")``, ``("python", ...)``, ``("cuda", ...)``."""

    def _named(self) -> list[tuple[str, str]]:
        named = [("root", self.root)] if self.root != os.sep else []
        named += [(n, d) for n, d in self.system if d and d != os.sep]
        return sorted(named, key=lambda nd: -len(nd[1]))  # the most specific dir first

    def path(self, path: str) -> str:
        """A path as the key says it: relative to the root, by name under a system dir, else itself.

        >>> p = Places("/ci/proj", (("torch", "/venv/torch"),))
        >>> p.path("/ci/proj/csrc/a.cpp"), p.path("/venv/torch/include"), p.path("/opt/x.h")
        ('csrc/a.cpp', '${torch}/include', '/opt/x.h')
        """
        for name, d in self._named():
            if is_under(path, d):
                rel = os.path.relpath(path, d)
                if name == "root":
                    return rel
                return "${" + name + "}" + ("" if rel == "." else "/" + rel)
        return path

    def text(self, text: str) -> str:
        """A flag as the key says it: every mention of a known dir replaced by its name.

        >>> p = Places("/ci/proj", (("torch", "/venv/torch"),))
        >>> p.text("-I/ci/proj/include"), p.text('-DDATA="/ci/proj/d"'), p.text("-I/ci/project2")
        ('-I${root}/include', '-DDATA="${root}/d"', '-I/ci/project2')
        """
        for name, d in self._named():
            if d in text:
                text = re.sub(re.escape(d) + r"(?=[/\"':;,=\s]|$)", "${" + name + "}", text)
        return text

    def resolve(self, path: str) -> str:
        """A path from a manifest, on this machine: relative ones are under the root.

        >>> Places("/node/b").resolve("csrc/a.cpp"), Places("/node/b").resolve("/opt/x.h")
        ('/node/b/csrc/a.cpp', '/opt/x.h')
        """
        return path if os.path.isabs(path) else os.path.join(self.root, path)

    def prefix_maps(self, build_dir: str) -> list[str]:
        """``-ffile-prefix-map`` flags that take this machine's dirs out of the binary (``__FILE__``,
        debug info): the root and the build dir become ``.``, a system dir its name. GCC and clang
        use the last map that matches, so the most specific comes last.

        >>> Places("/ci/proj", (("torch", "/venv/torch"),)).prefix_maps("/c/ext/.build-1")
        ['-ffile-prefix-map=/ci/proj=.', '-ffile-prefix-map=/venv/torch=torch', '-ffile-prefix-map=/c/ext/.build-1=.']
        """
        maps = [(d, "." if n == "root" else n) for n, d in self._named()]
        maps.append((build_dir, "."))
        return [f"-ffile-prefix-map={old}={new}" for old, new in sorted(maps, key=lambda m: len(m[0]))]
