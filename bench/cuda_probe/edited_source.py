"""The decode probes' variants of the package's kernels: ``triton_decode.py``'s source with edits made on a
copy, loaded as a module of its own (triton's ``jit`` reads a kernel's source from its file)."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile

from opforge.kernels.block_sparse import triton_decode

_IMPORT = ("from ..triton_compat import", "from opforge.kernels.triton_compat import")


def source() -> str:
    """The package's ``triton_decode.py`` as it is now."""
    with open(triton_decode.__file__) as f:
        return f.read()


def replaced(src: str, edits) -> str:
    """``src`` with each ``(old, new)`` of ``edits`` made; each ``old`` must be there exactly once, so a probe
    stops with a clear error once the package's source moves on."""
    for old, new in edits:
        if src.count(old) != 1:
            raise RuntimeError(f"the package's decode kernels changed: {old!r} is there {src.count(old)} times")
        src = src.replace(old, new)
    return src


def load(src: str, name: str):
    """``src`` (an edited ``triton_decode.py``, relative import and all) as the module ``name``."""
    src = replaced(src, [_IMPORT])
    where = tempfile.mkdtemp(prefix=f"{name}_")
    with open(os.path.join(where, f"{name}.py"), "w") as f:
        f.write(src)
    sys.path.insert(0, where)
    return importlib.import_module(name)
