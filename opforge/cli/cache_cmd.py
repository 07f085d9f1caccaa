"""``opforge cache list | clean | verify``."""

from __future__ import annotations

import json
import sys

from .. import settings as settings_mod
from ..build import inventory


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="list, verify or clean the build cache")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")

    ls = csub.add_parser("list", help="every cached build: name, key, size, age, torch version")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=cmd_list)

    cl = csub.add_parser("clean", help="remove cached builds (all, one extension's, or old ones)")
    cl.add_argument("name", nargs="?", help="only this extension")
    cl.add_argument("--older-than", type=float, metavar="DAYS", help="only builds older than DAYS days")
    cl.set_defaults(func=cmd_clean)

    vf = csub.add_parser("verify", help="re-hash every binary; remove corrupt entries")
    vf.add_argument("--keep", action="store_true", help="report corrupt entries without removing them")
    vf.add_argument("--json", action="store_true", help="print JSON instead of a table")
    vf.set_defaults(func=cmd_verify)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _age(days: float) -> str:
    if days < 1 / 24:
        return f"{days * 1440:.0f} min"
    if days < 1:
        return f"{days * 24:.1f} h"
    return f"{days:.1f} d"


def _table(rows, title: str, with_status: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("name", "key", "size", "age", "torch", "kind") + (("status",) if with_status else ()):
        table.add_column(col, justify="right" if col in ("size", "age") else "left")
    for r in rows:
        cells = [r.name, r.key, _size(r.size), _age(r.age_days), r.torch, r.kind]
        if with_status:
            cells.append(r.status if r.status == "ok" else f"[red]{r.status}[/red]")
        table.add_row(*cells)
    Console().print(table)


def cmd_list(args) -> int:
    root = settings_mod.current().cache_dir
    rows = inventory.entries(root)
    if args.json:
        json.dump({"cache_dir": root, "entries": [r.to_json() for r in rows]}, sys.stdout, indent=1)
        print()
    elif not rows:
        print(f"no cached builds in {root}")
    else:
        _table(rows, f"opforge cache: {root}", with_status=False)
    return 0


def cmd_clean(args) -> int:
    root = settings_mod.current().cache_dir
    removed = inventory.clean(root, args.name, args.older_than)
    what = f" of {args.name}" if args.name else ""
    age = f" older than {args.older_than:g} days" if args.older_than is not None else ""
    print(f"removed {len(removed)} item(s){what}{age} from {root}")
    return 0


def cmd_verify(args) -> int:
    root = settings_mod.current().cache_dir
    rows = inventory.verify(root, remove=not args.keep)
    bad = [r for r in rows if r.status != "ok"]
    if args.json:
        json.dump({"cache_dir": root, "entries": [r.to_json() for r in rows]}, sys.stdout, indent=1)
        print()
    elif rows:
        _table(rows, f"opforge cache verify: {root}", with_status=True)
    print(f"{len(rows) - len(bad)} ok, {len(bad)} corrupt" + ("" if args.keep or not bad else " (removed)"),
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0
