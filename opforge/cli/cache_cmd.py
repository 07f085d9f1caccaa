"""``opforge cache list | clean | verify | export | import`` (and ``push | pull | keygen``: ``remote_cmd.py``).

Tables are rich on a terminal and plain full-width text otherwise (``output.table``); ``--json``
prints JSON. ``list`` shows the entries, then what builds leave around them (build dirs, failed
builds, generated sources, precompiled headers) with their sizes, and the total against the cap
(``OPFORGE_CACHE_MAX_SIZE``, kept after each build: ``engine/budget.py``); ``clean`` removes either, by
extension or by age, never what a running build holds, and exits 1 for a name the cache doesn't
hold (2 for a bad argument)."""

from __future__ import annotations

import argparse
import json
import sys

from .. import settings as settings_mod
from ..engine import inventory
from ..engine.key import check_name
from . import output, remote_cmd


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="list, verify or clean the build cache")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")

    ls = csub.add_parser("list", help="every cached build (name, key, size, age, last use, torch version), what "
                                      "builds left beside them, and the total against OPFORGE_CACHE_MAX_SIZE")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument("--remote", action="store_true", help="what the remote cache (OPFORGE_REMOTE_CACHE) holds")
    ls.set_defaults(func=cmd_list)

    cl = csub.add_parser("clean", help="remove cached builds and leftovers (all, one extension's, or old ones)")
    cl.add_argument("name", nargs="?", help="only this extension")
    cl.add_argument("--older-than", type=_days, metavar="DAYS",
                    help="only what is older than DAYS days (a number >= 0)")
    cl.set_defaults(func=cmd_clean)

    vf = csub.add_parser("verify", help="re-hash every binary; remove corrupt entries")
    vf.add_argument("--keep", action="store_true", help="report corrupt entries without removing them")
    vf.add_argument("--json", action="store_true", help="print JSON instead of a table")
    vf.set_defaults(func=cmd_verify)
    ex = csub.add_parser("export", help="pack the builds that fit this machine into one archive, for other nodes")
    ex.add_argument("file", help="the archive to write (.tar, or .tar.gz / .tgz for gzip)")
    ex.add_argument("names", nargs="*", metavar="NAME", help="only these extensions")
    ex.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ex.set_defaults(func=cmd_export)

    im = csub.add_parser("import", help="verify an exported archive against this machine; install what fits")
    im.add_argument("file", help="an archive written by `opforge cache export`")
    im.add_argument("--dry-run", action="store_true", help="say what would be imported, write nothing")
    im.add_argument("--json", action="store_true", help="print JSON instead of a table")
    im.set_defaults(func=cmd_import)
    remote_cmd.add_actions(csub, days=_days)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _days(text: str) -> float:
    """``--older-than``: a number of days, >= 0 (``-3`` once meant everything)."""
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not days >= 0 or days == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of days >= 0, e.g. --older-than 30")
    return days


def _age(days: float) -> str:
    if days < 1 / 24:
        return f"{days * 1440:.0f} min"
    if days < 1:
        return f"{days * 24:.1f} h"
    return f"{days:.1f} d"


def _entries_table(rows, title: str, with_status: bool) -> None:
    columns = ["name", "key", "size", "age", "used", "torch", "kind"] + (["status"] if with_status else [])
    cells = [[r.name, r.key, output.size(r.size), _age(r.age_days), _used(r.unused_days), r.torch, r.kind]
             + ([r.status] if with_status else []) for r in rows]
    styles = [None if not with_status or r.status == "ok" else "red" for r in rows]
    output.table(title, columns, cells, right=("size", "age", "used"), styles=styles)


def _used(days: float) -> str:
    """The last use, to the day (``engine/usage.py`` marks it at most once a day)."""
    return "today" if days < 1 else f"{days:.0f} d ago"


def _total(total: int, cap: int) -> str:
    if cap <= 0:
        return f"{output.size(total)} in all (OPFORGE_CACHE_MAX_SIZE=0: no cap)"
    return (f"{output.size(total)} of {output.size(cap)} (OPFORGE_CACHE_MAX_SIZE; past it, the least recently used "
            f"go after a build), {100 * total / cap:.0f}%")


def _leftovers_table(items, title: str) -> None:
    cells = [[i.name or "-", i.what, output.size(i.size), _age(i.age_days), "in use" if i.in_use else "", i.path, i.detail]
             for i in items]
    output.table(title, ["name", "what", "size", "age", "", "path", "detail"], cells, right=("size", "age"))


def cmd_list(args) -> int:
    if args.remote:
        return remote_cmd.cmd_list_remote(args)
    try:
        s = settings_mod.current()
    except ValueError as exc:  # a malformed variable, named in the message
        print(f"opforge cache list: {exc}", file=sys.stderr)
        return 2
    root = s.cache_dir
    rows = inventory.entries(root)
    extra = inventory.leftovers(root)
    total = sum(r.size for r in rows) + sum(i.size for i in extra)
    if args.json:
        json.dump({"cache_dir": root, "entries": [r.to_json() for r in rows],
                   "leftovers": [i.to_json() for i in extra], "total": total, "max_size": s.cache_max_size},
                  sys.stdout, indent=1)
        print()
        return 0
    if not rows:
        print(f"no cached builds in {root}")
    else:
        _entries_table(rows, f"opforge cache: {root}", with_status=False)
    if extra:
        print()
        _leftovers_table(extra, f"beside them ({output.size(sum(i.size for i in extra))}; `opforge cache clean` removes "
                                "them, --older-than DAYS the old ones)")
    print(f"\ntotal: {_total(total, s.cache_max_size)}")
    return 0


def cmd_clean(args) -> int:
    root = settings_mod.current().cache_dir
    if args.name is not None:
        try:
            check_name(args.name)
        except ValueError as exc:
            print(f"opforge cache clean: {exc}", file=sys.stderr)
            return 2
        if not inventory.known(root, args.name):
            print(f"opforge cache clean: the cache ({root}) holds nothing of {args.name!r}; `opforge cache list` "
                  "shows what it holds", file=sys.stderr)
            return 1
    done = inventory.clean(root, args.name, args.older_than)
    what = f" of {args.name}" if args.name else ""
    age = f" older than {args.older_than:g} days" if args.older_than is not None else ""
    print(f"removed {len(done.removed)} item(s){what}{age} ({output.size(done.freed)}) from {root}")
    if done.in_use:
        print(f"kept {len(done.in_use)} in use by a running build: {', '.join(done.in_use)}")
    return 0


def cmd_verify(args) -> int:
    root = settings_mod.current().cache_dir
    rows = inventory.verify(root, remove=not args.keep)
    bad = [r for r in rows if r.status != "ok"]
    if args.json:
        json.dump({"cache_dir": root, "entries": [r.to_json() for r in rows]}, sys.stdout, indent=1)
        print()
    elif rows:
        _entries_table(rows, f"opforge cache verify: {root}", with_status=True)
    print(f"{len(rows) - len(bad)} ok, {len(bad)} corrupt" + ("" if args.keep or not bad else " (removed)"),
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0


def cmd_export(args) -> int:
    from ..engine import archive

    root = settings_mod.current().cache_dir
    outcomes = archive.export(args.file, args.names or None, root)
    output.outcomes(outcomes, f"opforge cache export: {root} -> {args.file}", args.json, {"cache_dir": root, "file": args.file})
    print(f"{args.file}: {output.counts(outcomes)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_import(args) -> int:
    from ..engine import archive
    from ..errors import ArchiveError

    root = settings_mod.current().cache_dir
    try:
        outcomes = archive.import_(args.file, root, dry_run=args.dry_run)
    except ArchiveError as exc:
        print(f"opforge cache import: {exc}", file=sys.stderr)
        return 2
    output.outcomes(outcomes, f"opforge cache import: {args.file} -> {root}", args.json, {"cache_dir": root, "file": args.file})
    print(f"{args.file}: {output.counts(outcomes)}", file=sys.stderr if args.json else sys.stdout)
    return 1 if any(o.status == "corrupt" for o in outcomes) else 0
