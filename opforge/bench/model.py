"""What a benchmark is made of (cases of implementations) and what it yields (rows of timings).

A family's suite (``suites/``) yields :class:`Case` objects: one operation at one size, with
the implementations that compute it (opforge's and its peers') and the one the ratios are
taken and opforge's results checked against (``baseline``). The runner turns each into a :class:`CaseResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .timing import Timing

OPFORGE, PEER = "opforge", "peer"


@dataclass(frozen=True)
class Options:
    """What to run: ``quick`` (a few small sizes, for a check in under a minute) and whether
    torch.compile is among the peers (its first compile costs tens of seconds on a small CPU)."""

    quick: bool = False
    compile: bool = True


@dataclass(frozen=True)
class Impl:
    """One implementation of a case. ``call`` runs it once (the timed unit); ``output`` returns
    what its last call computed, for the check (default: ``call``'s return value). ``sample``: an
    implementation that times itself (a new process reporting its own window): each sample is what one
    call of it returns, in seconds, and the runner's clock is not used."""

    name: str
    role: str
    call: Callable[[], object]
    output: Callable[[], object] | None = None
    note: str = ""
    sample: Callable[[], float] | None = None

    def __post_init__(self):
        if self.role not in (OPFORGE, PEER):
            raise ValueError(f"Impl {self.name!r}: role must be {OPFORGE!r} or {PEER!r}, not {self.role!r}")


@dataclass(frozen=True)
class Missing:
    """A peer that is not timed here, and why (``deepspeed is not installed``)."""

    name: str
    reason: str

    def to_json(self) -> dict:
        return {"impl": self.name, "reason": self.reason}


@dataclass(frozen=True)
class Case:
    """One operation at one size. ``params`` are JSON scalars (shape, dtype, density...) that
    the plots and readers select on; ``baseline``: the implementation the ratios are taken
    against and opforge's outputs checked against; ``tol``: the largest relative error
    (``||out - ref|| / ||ref||``) an opforge output may have against the baseline's."""

    op: str
    label: str
    params: dict
    impls: tuple[Impl, ...]
    baseline: str
    tol: float

    @property
    def name(self) -> str:
        return f"{self.op} {self.label}"


@dataclass(frozen=True)
class Check:
    """An opforge output against the baseline's."""

    ok: bool
    rel_err: float
    tol: float
    against: str

    def to_json(self) -> dict:
        finite = self.rel_err == self.rel_err and self.rel_err != float("inf")
        return {"ok": self.ok, "rel_err": self.rel_err if finite else None, "tol": self.tol, "against": self.against}


@dataclass(frozen=True)
class Row:
    """One implementation's outcome: its timing, or the error that stopped it."""

    impl: str
    role: str
    timing: Timing | None = None
    first_call_s: float | None = None
    """The first call, untimed by the plan: a torch.compile's compile, a lazy build or load."""
    speedup: float | None = None
    """The baseline's median / this one's (> 1: faster than the baseline)."""
    check: Check | None = None
    error: str | None = None
    note: str = ""

    @property
    def median(self) -> float | None:
        return self.timing.median if self.timing else None

    def to_json(self) -> dict:
        return {"impl": self.impl, "role": self.role, "time": self.timing.to_json() if self.timing else None,
                "first_call_s": self.first_call_s, "speedup": self.speedup,
                "check": self.check.to_json() if self.check else None, "error": self.error, "note": self.note}


@dataclass(frozen=True)
class CaseResult:
    op: str
    label: str
    params: dict
    baseline: str
    rows: tuple[Row, ...]

    @property
    def name(self) -> str:
        return f"{self.op} {self.label}"

    def row(self, impl: str) -> Row | None:
        return next((r for r in self.rows if r.impl == impl), None)

    def ratio(self, impl: str, peer: str) -> float | None:
        """``peer``'s median / ``impl``'s: > 1 when ``impl`` is faster."""
        a, b = self.row(impl), self.row(peer)
        if a is None or b is None or not a.median or not b.median:
            return None
        return b.median / a.median

    @property
    def failures(self) -> list[str]:
        """What went wrong with opforge's rows: an error, or a failed check."""
        out = []
        for r in self.rows:
            if r.role != OPFORGE:
                continue
            if r.error:
                out.append(f"{self.name}: {r.impl}: {r.error}")
            elif r.check is not None and not r.check.ok:
                out.append(f"{self.name}: {r.impl}: relative error {r.check.rel_err:.2e} against "
                           f"{r.check.against} (tolerance {r.check.tol:.0e})")
        return out

    def to_json(self) -> dict:
        return {"op": self.op, "label": self.label, "params": self.params, "baseline": self.baseline,
                "results": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class FamilyResult:
    """One kernel family on one device: the variant opforge chose and its cases, or why the
    family was skipped."""

    kind: str
    device: str
    status: str
    """``ok``, ``skipped`` (not for this device or machine) or ``failed`` (opforge's kernel
    could not load)."""
    reason: str = ""
    variant: str | None = None
    load_s: float | None = None
    """Seconds the loader took to give the kernel (a build, the first time)."""
    missing: tuple[Missing, ...] = ()
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

    @property
    def failures(self) -> list[str]:
        own = [f"{self.kind} on {self.device}: {self.reason}"] if self.status == "failed" else []
        return own + [f"{self.kind} on {self.device}: {f}" for c in self.cases for f in c.failures]

    def to_json(self) -> dict:
        return {"kind": self.kind, "device": self.device, "status": self.status, "reason": self.reason,
                "variant": self.variant, "load_s": self.load_s, "missing": [m.to_json() for m in self.missing],
                "cases": [c.to_json() for c in self.cases]}
