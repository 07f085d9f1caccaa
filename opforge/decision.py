"""An explainable yes/no: :class:`Accepted` or :class:`Rejected`, each with its reason.

>>> d = Rejected("needs AVX-512F/BW/VL; this CPU (haswell) lacks avx512f")
>>> bool(d), str(d)
(False, 'rejected: needs AVX-512F/BW/VL; this CPU (haswell) lacks avx512f')
>>> first_rejection([Accepted("x86_64"), d]) is d
True
>>> bool(first_rejection([Accepted(), Accepted()]))
True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    reason: str = ""
    ok: bool = True

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        verdict = "accepted" if self.ok else "rejected"
        return f"{verdict}: {self.reason}" if self.reason else verdict


@dataclass(frozen=True)
class Accepted(Decision):
    ok: bool = True


@dataclass(frozen=True)
class Rejected(Decision):
    ok: bool = False


def first_rejection(decisions: Iterable[Decision]) -> Decision:
    """The first Rejected, else an Accepted joining the reasons given."""
    reasons = []
    for d in decisions:
        if not d:
            return d
        if d.reason:
            reasons.append(d.reason)
    return Accepted("; ".join(reasons))
