"""Which implementation of a kernel kind runs here: pure functions, facts in and decisions with reasons out
(``KernelLoader``, in ``loader.py``, gathers the facts and walks the result).

``select(extensions, platform, statuses)`` orders a kind's extensions by priority and decides each
(``decide``: its hardware, its software, and whether it can be had in its state: ``toolchain_decision``);
the first accepted is chosen. ``passed_over`` and ``fallback_notice`` say which better ones this
software kept out. ``with_used`` follows ``KernelLoader.uses`` from a kind to the kinds its variants load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from . import checks
from .decision import Accepted, Decision, Rejected, first_rejection
from .extension import CACHED, FAILED, NEEDS_BUILD, PREBUILT, Extension, Status


@dataclass(frozen=True)
class Candidate:
    extension: Extension
    decision: Decision
    """Both checks below, and whether it can be had in its state (prebuilt, cached, or built here)."""
    available: Decision
    """``is_available``: is the hardware it needs here?"""
    compatible: Decision
    """``check_compatible`` and the toolchain: can it be built (or is it prebuilt/cached) and run here?"""
    status: Status | None
    """None when the checks rejected it before its state was looked at."""
    chosen: bool = False

    @property
    def name(self) -> str:
        return self.extension.name


def toolchain_decision(ext: Extension, platform, status: Status) -> Decision:
    """Can the extension be had in its current state: prebuilt, cached, or built here?"""
    if status.state in (PREBUILT, CACHED) or not ext.needs_compiler:
        return Accepted()
    if status.remote:
        return Accepted("no compiler here; the remote cache holds a build, which the load pulls")
    if status.state == FAILED:
        return Rejected(status.note)
    how = ext.prebuild_hint()
    if not ext.support_jit:
        return Rejected(f"no prebuilt binary fits and it is not built just in time: {how}")
    if platform.cxx is None:
        return Rejected(f"no C++ compiler, and no prebuilt or cached binary: install g++ (or set CXX), or {how}")
    if ext.backend == "cuda" and platform.nvcc is None:
        return Rejected("nvcc not found, and no prebuilt or cached binary: install the CUDA toolkit and set CUDA_HOME")
    if platform.ninja is None:
        return Rejected("ninja not found, and no prebuilt or cached binary: `pip install ninja`")
    return Accepted()


def select(extensions: Sequence[Extension], platform, statuses: Mapping[str, Status],
           device: str | None = None) -> list[Candidate]:
    """Order the extensions by priority and decide each. Pure.

    ``statuses`` holds the state of the extensions that pass their checks (prebuilt /
    cached / needs build); the first accepted candidate is ``chosen``. ``device`` (a
    ``torch.device.type``): only extensions whose ops take tensors there can be chosen.
    """
    out: list[Candidate] = []
    chosen = False
    for ext in sorted(extensions, key=lambda e: (-e.priority, e.name)):
        c = decide(ext, platform, statuses, device)
        pick = bool(c.decision) and not chosen
        chosen = chosen or pick
        out.append(replace(c, chosen=pick) if pick else c)
    return out


def decide(ext: Extension, platform, statuses: Mapping[str, Status], device: str | None = None) -> Candidate:
    """One extension's verdict, never ``chosen``: its hardware, its software, and whether it can be had
    in its state (``statuses``, as for ``select``). Pure."""
    available = first_rejection([ext.serves(device), checks.run(ext, checks.AVAILABLE, platform)])
    compatible = checks.run(ext, checks.COMPATIBLE, platform)
    status = None
    if available and compatible:
        status = statuses.get(ext.name, Status(NEEDS_BUILD))
        compatible = first_rejection([compatible, toolchain_decision(ext, platform, status)])
    return Candidate(ext, first_rejection([available, compatible]), available, compatible, status)


def with_used(kind: str, uses: Mapping[str, Sequence[str]]) -> list[str]:
    """``kind`` and every kind it uses (``KernelLoader.uses``), directly or through another, once each,
    ``kind`` first. Pure.

    >>> with_used("a", {"a": ("b", "c"), "b": ("c", "a")})
    ['a', 'b', 'c']
    """
    out, todo = [], [kind]
    while todo:
        k = todo.pop(0)
        if k not in out:
            out.append(k)
            todo.extend(uses.get(k, ()))
    return out


def passed_over(cands: Sequence[Candidate], chosen: Candidate) -> list[Candidate]:
    """The candidates better than ``chosen`` whose hardware is here but that can't be had with this
    software: no compiler, ninja or nvcc, a build that failed, a torch too old. Each is fixable, so
    the user should hear of it. Pure."""
    out = []
    for c in cands:
        if c is chosen:
            break
        if c.available and not c.compatible:
            out.append(c)
    return out


def fallback_notice(kind: str, chosen: Candidate, better: Sequence[Candidate]) -> str:
    """One line per reason, naming the candidates it kept out.

    >>> from opforge.decision import Accepted, Rejected
    >>> from opforge.extension import TorchExtension
    >>> def cand(name, ok):
    ...     ext = type(name, (TorchExtension,), {"name": name})()
    ...     return Candidate(ext, Accepted() if ok else Rejected("no C++ compiler: install g++"), Accepted(),
    ...                      Accepted() if ok else Rejected("no C++ compiler: install g++"), None, ok)
    >>> print(fallback_notice("toy", cand("toy_torch", True), [cand("toy_avx2", False), cand("toy_scalar", False)]))
    toy: using toy_torch (torch backend), not a better implementation that this machine's hardware can run:
      toy_avx2, toy_scalar: no C++ compiler: install g++
    Fix that to get the faster one, or set OPFORGE_FALLBACK_NOTICE=0 to silence this notice.
    """
    by_reason: dict[str, list[str]] = {}
    for c in better:
        by_reason.setdefault(c.compatible.reason, []).append(c.name)
    lines = [f"{kind}: using {chosen.name} ({chosen.extension.backend} backend), not a better implementation that "
             "this machine's hardware can run:"]
    lines += [f"  {', '.join(names)}: {reason}" for reason, names in by_reason.items()]
    lines.append("Fix that to get the faster one, or set OPFORGE_FALLBACK_NOTICE=0 to silence this notice.")
    return "\n".join(lines)


__all__ = ["Candidate", "decide", "fallback_notice", "passed_over", "select", "toolchain_decision", "with_used"]
