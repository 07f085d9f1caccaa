"""Writing a file whole or not at all: the one temp-file-then-rename in opforge.

A leaf (the standard library only), so every layer can use it: the platform probes' memo, the
build's ninja and state files, the cache's entries and tuning records, the lock's holder
record, the failure records, AOT's ``build_info.json`` and the bench's JSON report.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> atomic_write(os.path.join(d, "a.json"), '{"x": 1}', durable=False)
>>> open(os.path.join(d, "a.json")).read(), os.listdir(d)
('{"x": 1}', ['a.json'])
>>> write_if_changed(os.path.join(d, "a.json"), '{"x": 1}')  # the same text: not rewritten
False
"""

from __future__ import annotations

import os
import threading
import uuid


def atomic_write(path: str, data: bytes | str, *, durable: bool = True) -> None:
    """Write ``path`` whole or not at all: a temp file beside it, then ``os.replace``. A reader
    sees the old file or the new one, never half of one; the temp file is removed on error (the
    error is raised). ``str`` is written as UTF-8. ``durable``: fsync the data before the rename,
    so a crash can't leave an empty file under the final name (the cache's entries want that;
    files that a rebuild recreates, such as ninja's, don't need the milliseconds)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_if_changed(path: str, text: str) -> bool:
    """``atomic_write(path, text, durable=False)`` unless ``path`` already holds ``text`` (its
    mtime then stays, so ninja sees no change); True when it wrote."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    atomic_write(path, text, durable=False)
    return True


__all__ = ["atomic_write", "write_if_changed"]
