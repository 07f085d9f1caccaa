"""Tables for the commands: rich ones on a terminal, plain full-width text otherwise (a pipe, a
file, CI logs), so that nothing is cut to 80 columns or carries ANSI escapes where a program reads it."""

from __future__ import annotations

import json
import sys


def aligned(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Plain text columns, padded to the widest cell (the last column is not padded)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [cell.ljust(w) for cell, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def table(title: str, columns: list[str], rows: list[list[str]], out=None, right: tuple[str, ...] = (),
          styles: list[str | None] | None = None) -> None:
    """Print a titled table: a rich one when ``out`` (stdout) is a terminal, else aligned text.
    ``right``: the columns to right-align; ``styles``: a rich style per row (terminal only)."""
    out = out or sys.stdout
    if not out.isatty():
        print(title, file=out)
        for line in aligned([columns, *rows]):
            print(line, file=out)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col, justify="right" if col in right else "left", overflow="fold")
    for i, r in enumerate(rows):
        t.add_row(*(escape(c) for c in r), style=(styles[i] if styles else None))
    Console(file=out).print(t)


def size(n: float) -> str:
    """Bytes, in B / KiB / MiB / GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def outcomes(rows, title: str, as_json: bool, extra: dict) -> None:
    """What happened to each entry of an export, import, push or pull (``archive.Outcome``s)."""
    if as_json:
        json.dump(dict(extra, entries=[o.to_json() for o in rows]), sys.stdout, indent=1)
        print()
        return
    if rows:
        colour = {"skipped": "yellow", "corrupt": "red", "refused": "red", "failed": "red"}
        table(title, ["name", "entry", "status", "why"], [[o.name, o.entry, o.status, o.reason] for o in rows],
              styles=[colour.get(o.status) for o in rows])


def counts(rows) -> str:
    """``2 imported, 1 skipped``."""
    from collections import Counter

    return ", ".join(f"{n} {status}" for status, n in sorted(Counter(o.status for o in rows).items())) or "nothing"
