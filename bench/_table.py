"""How the benchmark scripts print a table: a rich table on a terminal, aligned text when piped,
or markdown (for docs/benchmarks.md). The first ``left`` columns are labels (left-aligned), the
rest figures (right-aligned)."""

from __future__ import annotations

import sys


def show(title: str, headers: list[str], rows: list[list[str]], left: int = 1, markdown: bool = False) -> None:
    if markdown:
        print(f"\n**{title}**\n")
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i < left else "right")
        for r in rows:
            table.add_row(*r)
        Console().print(table)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *rows]
    print(f"\n{title}")
    print("\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                    for r in lines))
