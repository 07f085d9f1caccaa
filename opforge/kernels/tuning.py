"""Tuned kernel configs, kept in opforge's cache so a process tunes a shape class once, ever.

A Triton kernel family (``block_sparse_triton``, ...) tunes its configs per *tuning key* (a
tuple of small ints and strings: block shape, dtype, size class). The winners live under the
cache root, one immutable file per key, published like a build (written to a temp file, then
renamed into place, so a reader sees all of it or nothing)::

    <root>/.tuning/<family>/<fingerprint16>/<key16>.json

The *fingerprint* names everything a winner depends on besides its key: the kernels' source,
the candidate configs, triton's and torch's versions, the device's name and compute
capability. Change any of them and the old winners are simply not found (``opforge cache
clean`` removes them). A file that is unreadable or names a config no longer offered is
ignored, and the key is tuned again.

>>> import tempfile
>>> store = TuningStore(tempfile.mkdtemp(), "demo", fingerprint("src", "configs", "H100"))
>>> store.get(("fwd", 64, 16)) is None
True
>>> store.put(("fwd", 64, 16), 3, {"ms": 0.012})
>>> store.get(("fwd", 64, 16))
3
"""

from __future__ import annotations

import hashlib
import json
import os

from ..engine.inventory import TUNING_DIR as DIR
from ..files import atomic_write

FORMAT = 1


def fingerprint(*parts: object) -> str:
    """sha256 of the parts' reprs: what every winner of a family depends on besides its key."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def key_name(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:16]


class TuningStore:
    """The winners of one family under one fingerprint: ``get(key)`` -> the index of the winning
    config in the family's candidate list, or None; ``put(key, index, facts)`` publishes one."""

    def __init__(self, root: str, family: str, fp: str):
        self.dir = os.path.join(root, DIR, family, fp[:16])
        self.fingerprint = fp

    def path(self, key: tuple) -> str:
        return os.path.join(self.dir, key_name(key) + ".json")

    def get(self, key: tuple) -> int | None:
        try:
            with open(self.path(key), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        ok = (isinstance(data, dict) and data.get("format") == FORMAT and data.get("fingerprint") == self.fingerprint
              and data.get("key") == repr(key) and isinstance(data.get("config"), int))
        return data["config"] if ok else None

    def put(self, key: tuple, index: int, facts: dict) -> None:
        """Publish a winner (best effort: a cache that can't be written costs a tuning run in the
        next process, never an error in this one)."""
        data = {"format": FORMAT, "fingerprint": self.fingerprint, "key": repr(key), "config": int(index), **facts}
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            atomic_write(self.path(key), json.dumps(data, indent=1, sort_keys=True).encode())
        except OSError:
            pass


__all__ = ["DIR", "TuningStore", "fingerprint", "key_name"]
