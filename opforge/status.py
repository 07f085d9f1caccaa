"""Where a candidate extension stands before it is loaded here: its :class:`Status`."""

from __future__ import annotations

from dataclasses import dataclass, field

# What a candidate needs before it can be loaded here.
PREBUILT = "prebuilt"
CACHED = "cached"
NEEDS_BUILD = "needs build"
READY = "ready"
"""A Python backend (triton, torch): nothing to build."""
FAILED = "failed"
"""Its last build, from these same inputs, failed (``engine/failures.py``): the loader skips it."""


@dataclass(frozen=True)
class Status:
    state: str
    note: str = ""
    """Why a prebuilt binary that is present was passed over, if it was."""
    spec: object = field(default=None, compare=False, repr=False)
    """The ``BuildSpec`` the status was worked out for (compiled extensions), with ``entry``, the
    cache entry it found (``CACHED``), and the ``settings`` they were made under: a load right
    after reuses them rather than hashing the sources and scanning the cache a second time."""
    entry: object = field(default=None, compare=False, repr=False)
    settings: object = field(default=None, compare=False, repr=False)
    remote: bool = False
    """Not cached here, no compiler here, and the remote cache holds it: a load pulls it."""
