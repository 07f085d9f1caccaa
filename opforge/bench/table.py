"""The tables ``opforge bench`` prints: one per family and device, a row per case, the median
time of each implementation with its spread (on a GPU, with the host's time to issue a call),
then opforge's speedup over each peer.

``lines(family)`` makes the cells (pure: testable without a terminal); ``show`` prints them
with rich, which draws plain text when stdout is not a terminal.
"""

from __future__ import annotations

from .model import OPFORGE, FamilyResult, Row
from .timing import format_seconds


def time_cell(r: Row | None) -> str:
    """``1.37 ms ±3%`` (± half the interquartile range, relative to the median), ``error`` or
    ``-`` (not run in this case)."""
    if r is None:
        return "-"
    if r.error:
        return "error"
    q1, q3 = r.timing.quartiles
    cell = f"{format_seconds(r.median)} ±{(q3 - q1) / 2 / r.median * 100:.0f}%"
    if r.timing.host_median is not None:
        cell += f" (host {format_seconds(r.timing.host_median)})"
    if r.check is not None and not r.check.ok:
        cell += " WRONG"
    return cell


def ratio_cell(v: float | None) -> str:
    """``2.41x``; ``-`` when either side did not run."""
    return "-" if v is None else f"{v:.2f}x"


def columns(family: FamilyResult) -> tuple[list[str], list[str], list[str]]:
    """The implementations in the order first seen, opforge's, and the peers."""
    impls: list[str] = []
    for c in family.cases:
        for r in c.rows:
            if r.impl not in impls:
                impls.append(r.impl)
    roles = {r.impl: r.role for c in family.cases for r in c.rows}
    ours = [i for i in impls if roles[i] == OPFORGE]
    return impls, ours, [i for i in impls if roles[i] != OPFORGE]


def lines(family: FamilyResult) -> tuple[str, list[str], list[list[str]], list[str]]:
    """Title, headers, rows and footnotes of a family's table."""
    impls, ours, peers = columns(family)
    title = f"{family.kind} on {family.device}"
    if family.variant:
        title += f" (opforge variant: {family.variant})"
    pairs = [(o, p) for o in ours for p in peers]
    headers = ["case", *impls, *[(f"vs {p}" if len(ours) == 1 else f"{o} vs {p}") for o, p in pairs]]
    rows = [[c.name, *[time_cell(c.row(i)) for i in impls], *[ratio_cell(c.ratio(o, p)) for o, p in pairs]]
            for c in family.cases]
    notes = [f"{m.name}: not timed: {m.reason}" for m in family.missing]
    for c in family.cases:
        for r in c.rows:
            if r.error:
                notes.append(f"{c.name}: {r.impl}: {r.error}")
            elif r.check is not None and not r.check.ok:
                notes.append(f"{c.name}: {r.impl}: WRONG: relative error {r.check.rel_err:.2e} against "
                             f"{r.check.against} (tolerance {r.check.tol:.0e})")
    firsts = {r.impl: r.first_call_s for c in family.cases for r in c.rows
              if r.first_call_s is not None and r.first_call_s > 1.0}
    for impl in firsts:
        worst = max(r.first_call_s or 0 for c in family.cases for r in c.rows if r.impl == impl)
        notes.append(f"{impl}: first call up to {format_seconds(worst)} (a compile or a load; untimed)")
    return title, headers, rows, notes


def summary_line(family: FamilyResult) -> str:
    if family.status == "ok":
        return ""
    return f"{family.kind} on {family.device}: {family.status}: {family.reason}"


def show(families: list[FamilyResult], console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: wide enough that a row stays on one line
            console = Console(width=max(console.width, 160))
    for fam in families:
        if fam.status != "ok":
            console.print(summary_line(fam), markup=False, highlight=False)
            continue
        title, headers, rows, notes = lines(fam)
        table = Table(title=Text(title), title_justify="left")
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for r in rows:
            table.add_row(*(Text(c) for c in r))
        console.print(table)
        for n in notes:
            console.print(f"  {n}", markup=False, highlight=False)
