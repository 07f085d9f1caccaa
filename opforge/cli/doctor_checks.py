"""One doctor check's verdict: a name, a status (ok, warn, fail), what was found, and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_json(self) -> dict:
        return asdict(self)
