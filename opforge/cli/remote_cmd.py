"""``opforge cache push | pull | keygen`` and ``opforge cache list --remote``: the remote binary cache
(``OPFORGE_REMOTE_CACHE``; ``engine/remote.py``) from the command line.

* ``push [NAME...]``: upload the local entries (of these extensions) that fit this machine, signed
  with ``OPFORGE_SIGNING_KEY`` (a CI job that builds once for a fleet). An object already in the store
  is left as it is ("present"). With no key (unless ``OPFORGE_REMOTE_ALLOW_UNSIGNED=1``) or a key that
  can't sign, nothing is pushed: one message, exit 2.
* ``pull NAME...``: every remote entry of these extensions that fits here, verified (signature,
  sha256, platform) and published locally: warms a node ahead of a job. A name the store holds
  nothing of is "missing" (exit 1), with where it looked.
* ``list --remote``: what the store holds.
* ``prune --remote --older-than DAYS [--dry-run]``: remove the store's objects older than DAYS, never
  one younger than the grace period (``remote_prune.GRACE_DAYS``), for a CI's scheduled job.
* ``keygen NAME [--dir DIR]``: ``NAME.secret`` (0600) and ``NAME.public`` for signing.

Exit 2 when no store is configured, its URL is unusable (``file://relative``), it can't be reached, or
a push can't be signed; 1 when something was refused, missing or failed, or the store's root (its
directory, its bucket) doesn't exist.
"""

from __future__ import annotations

import json
import sys

from .. import settings as settings_mod
from . import output
from .doctor_checks import FAIL, OK, WARN, Check


def add_actions(csub, days) -> None:
    """The remote actions, on ``opforge cache``'s subparsers; ``days`` parses ``--older-than`` (cache_cmd's
    rule, handed down: cache_cmd imports this module)."""
    ps = csub.add_parser("push", help="upload local builds to the remote cache (OPFORGE_REMOTE_CACHE)")
    ps.add_argument("names", nargs="*", metavar="NAME", help="only these extensions")
    ps.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ps.set_defaults(func=cmd_push)

    pl = csub.add_parser("pull", help="fetch, verify and install remote builds of these extensions")
    pl.add_argument("names", nargs="+", metavar="NAME")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.set_defaults(func=cmd_pull)

    pr = csub.add_parser("prune", help="remove old objects from the remote cache (a CI's scheduled job)")
    pr.add_argument("--remote", action="store_true", required=True,
                    help="the remote cache (OPFORGE_REMOTE_CACHE); for the local cache: `opforge cache clean "
                         "--older-than DAYS`")
    pr.add_argument("--older-than", type=days, required=True, metavar="DAYS",
                    help="remove objects older than DAYS days (a number >= 0) by the store's modified time; "
                         "never one younger than the grace period (1 day)")
    pr.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    pr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pr.set_defaults(func=cmd_prune)

    kg = csub.add_parser("keygen", help="make an ed25519 key pair for signing remote cache entries")
    kg.add_argument("name", help="the key's name: writes NAME.secret (mode 0600) and NAME.public")
    kg.add_argument("--dir", default=".", help="where to write them (default: here)")
    kg.set_defaults(func=cmd_keygen)


def _store(command: str):
    from ..engine import remote_fs
    from ..engine.progress import Reporter

    s = settings_mod.current()
    if not s.remote_cache:
        print(f"opforge cache {command}: no remote cache: set OPFORGE_REMOTE_CACHE (e.g. s3://bucket/opforge, "
              "webdav://host/opforge, file:///nfs/opforge)", file=sys.stderr)
        return None, None
    why = remote_fs.url_problem(s.remote_cache)
    if why:
        print(f"opforge cache {command}: {why}", file=sys.stderr)
        return None, None
    return s, Reporter(s.verbose)


def _missing(command: str, exc) -> int:
    print(f"opforge cache {command}: {exc}", file=sys.stderr)
    return 1


def _dead(command: str, s) -> int:
    print(f"opforge cache {command}: the remote cache {s.remote_cache} could not be reached (see above)", file=sys.stderr)
    return 2


def _show(outcomes, title: str, as_json: bool, extra: dict) -> int:
    output.outcomes(outcomes, title, as_json, extra)
    print(output.counts(outcomes), file=sys.stderr if as_json else sys.stdout)
    return 1 if any(o.status in ("refused", "failed", "missing") for o in outcomes) else 0


def _transfer(args, command: str) -> int:
    """``push`` (the local cache to the store) or ``pull`` (the store to the local cache), with a table."""
    from ..engine import remote, remote_fs, remote_push

    s, reporter = _store(command)
    if s is None:
        return 2
    move = remote_push.push_names if command == "push" else remote.pull_names
    try:
        outcomes = move(args.names, s, reporter)
    except remote_push.PushRefused as exc:
        print(f"opforge cache push: nothing pushed: {exc}", file=sys.stderr)
        return 2
    except remote_fs.StoreMissing as exc:
        return _missing(command, exc)
    if outcomes is None:
        return _dead(command, s)
    src, dst = (s.cache_dir, s.remote_cache) if command == "push" else (s.remote_cache, s.cache_dir)
    return _show(outcomes, f"opforge cache {command}: {src} -> {dst}", args.json,
                 {"cache_dir": s.cache_dir, "remote": s.remote_cache})


def cmd_push(args) -> int:
    return _transfer(args, "push")


def cmd_pull(args) -> int:
    return _transfer(args, "pull")


def cmd_list_remote(args) -> int:
    from ..engine import remote, remote_fs
    s, reporter = _store("list --remote")
    if s is None:
        return 2
    try:
        rows = remote.listing(s, reporter)
    except remote_fs.StoreMissing as exc:
        return _missing("list --remote", exc)
    if rows is None:
        return _dead("list --remote", s)
    if args.json:
        json.dump({"remote": s.remote_cache, "entries": rows}, sys.stdout, indent=1)
        print()
    elif not rows:
        print(f"the remote cache {s.remote_cache} holds nothing")
    else:
        output.table(f"opforge cache (remote): {s.remote_cache}", ["name", "entry", "portable key", "size"],
                     [[r["name"], r["entry"], r["portable_key"][:16], output.size(r["size"])] for r in rows], right=("size",))
    return 0


def prune_summary(rows, dry_run: bool) -> tuple[dict, str]:
    """What ``remote_prune.prune`` did (its ``Pruned`` rows): counts and bytes per action, and one line saying
    so, with why each kept file stayed.

    >>> from opforge.engine.remote_prune import Pruned
    >>> rows = [Pruned("p1", "m", "object", 2048, 40.0, "removed"), Pruned("p2", "m", "object", 1024, 0.2, "kept",
    ...         "younger than the grace period (1 day)")]
    >>> summary, line = prune_summary(rows, dry_run=False)
    >>> summary["removed"], line
    ({'count': 1, 'bytes': 2048}, 'removed 1 file (2.0 KiB), kept 1 (1.0 KiB): 1 younger than the grace period (1 day)')
    """
    verb = "would remove" if dry_run else "removed"
    groups = {verb: [r for r in rows if r.action in ("removed", "would remove")],
              "kept": [r for r in rows if r.action == "kept"], "failed": [r for r in rows if r.action == "failed"]}
    summary = {k: {"count": len(v), "bytes": sum(r.size for r in v)} for k, v in groups.items()}
    reasons: dict[str, int] = {}
    for r in groups["kept"]:
        reasons[r.why] = reasons.get(r.why, 0) + 1
    n = summary[verb]["count"]
    line = (f"{verb} {n} file{'s' if n != 1 else ''} ({output.size(summary[verb]['bytes'])}), "
            f"kept {summary['kept']['count']} ({output.size(summary['kept']['bytes'])})"
            + (f": {', '.join(f'{c} {why}' for why, c in sorted(reasons.items()))}" if reasons else "")
            + (f"; {summary['failed']['count']} failed (see above)" if groups["failed"] else ""))
    return summary, line


def cmd_prune(args) -> int:
    from ..engine import remote_fs, remote_prune

    s, reporter = _store("prune --remote")
    if s is None:
        return 2
    try:
        rows = remote_prune.prune(args.older_than, s, reporter, dry_run=args.dry_run)
    except remote_fs.StoreMissing as exc:
        return _missing("prune --remote", exc)
    if rows is None:
        return _dead("prune --remote", s)
    summary, line = prune_summary(rows, args.dry_run)
    shown = [r for r in rows if r.action != "kept"]
    if args.json:
        json.dump({"remote": s.remote_cache, "older_than_days": args.older_than, "grace_days": remote_prune.GRACE_DAYS,
                   "dry_run": args.dry_run, "summary": summary, "files": [r.to_json() for r in rows]}, sys.stdout,
                  indent=1)
        print()
    elif shown:
        output.table(f"opforge cache prune --remote: {s.remote_cache}", ["name", "what", "size", "age", "action", "path"],
                     [[r.name, r.what, output.size(r.size), f"{r.age_days:.1f} d", r.action, r.path] for r in shown],
                     right=("size", "age"), styles=["red" if r.action == "failed" else None for r in shown])
    print(line, file=sys.stderr if args.json else sys.stdout)
    return 1 if summary["failed"]["count"] else 0


def cmd_keygen(args) -> int:
    from ..engine import signing
    from ..errors import OpforgeError

    try:
        secret, public = signing.keygen(args.name, args.dir)
    except (OpforgeError, ValueError) as exc:
        print(f"opforge cache keygen: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {secret} (keep it secret: OPFORGE_SIGNING_KEY={secret} signs pushes)")
    print(f"wrote {public} (give it to the nodes: OPFORGE_TRUSTED_KEYS={public})")
    return 0


def _store_check(settings: settings_mod.Settings) -> Check:
    from ..engine import remote, remote_fs
    from ..engine.progress import Reporter

    url = settings.remote_cache
    why = remote_fs.url_problem(url)
    if why:
        return Check("remote cache", FAIL, why, "write an absolute path with three slashes: file:///abs/path")
    try:
        rows = remote.listing(settings, Reporter(False))
    except remote_fs.StoreMissing as exc:
        return Check("remote cache", FAIL, f"{url}: missing ({exc.why})",
                     "check OPFORGE_REMOTE_CACHE for a typo; a new store is made by its first push (`opforge cache "
                     "push`)" + (", once the bucket exists" if exc.why.startswith("no bucket") else ""))
    if rows is None:
        return Check("remote cache", FAIL, f"{url}: {remote_fs._DEAD.get(url, 'unreachable')}",
                     "check the URL, the store's credentials and the network; OPFORGE_REMOTE_TIMEOUT sets the wait")
    return Check("remote cache", OK, f"{url}: reachable, {len(rows)} entr{'y' if len(rows) == 1 else 'ies'}")


def check_remote(settings: settings_mod.Settings) -> list:
    """The remote cache (OPFORGE_REMOTE_CACHE): a usable URL, there (its directory or bucket exists: else
    "missing"), reachable within its timeout, and the keys usable. Nothing to check (one OK line) when no
    store is set."""
    if not settings.remote_cache:
        return [Check("remote cache", OK, "not set (OPFORGE_REMOTE_CACHE): builds stay on this machine")]
    from ..engine import signing
    from ..errors import OpforgeError

    out = [_store_check(settings)]
    try:
        keys = signing.trusted(settings.trusted_keys)
    except OpforgeError as exc:
        out.append(Check("trusted keys", FAIL, str(exc), "point OPFORGE_TRUSTED_KEYS at .public files "
                                                          "(`opforge cache keygen NAME` makes a pair)"))
    else:
        if keys:
            out.append(Check("trusted keys", OK, f"pulls accept entries signed by {', '.join(k.name for k in keys)}"))
        elif settings.remote_allow_unsigned:
            out.append(Check("trusted keys", WARN, "none, and OPFORGE_REMOTE_ALLOW_UNSIGNED=1: any entry in the store "
                                                   "is accepted (its sha256 and platform are still checked)",
                             "sign pushes and set OPFORGE_TRUSTED_KEYS"))
        else:
            out.append(Check("trusted keys", WARN, "none: every remote entry will be refused, so each build happens here",
                             "set OPFORGE_TRUSTED_KEYS to the signer's .public file"))
    if settings.signing_key:
        try:
            name = signing.check_secret(settings.signing_key)
            out.append(Check("signing key", OK, f"pushes are signed with {name} ({settings.signing_key})"))
        except OpforgeError as exc:
            out.append(Check("signing key", FAIL, f"{exc}: pushes are refused", "`opforge cache keygen NAME` makes a "
                                                                                 "key pair; OPFORGE_SIGNING_KEY=NAME.secret"))
    elif settings.remote_push:
        if settings.remote_allow_unsigned:
            out.append(Check("signing key", WARN, "OPFORGE_REMOTE_PUSH=1 with no OPFORGE_SIGNING_KEY and "
                                                  "OPFORGE_REMOTE_ALLOW_UNSIGNED=1: pushes are unsigned, and nodes "
                                                  "that trust keys will refuse them",
                             "`opforge cache keygen NAME`, then OPFORGE_SIGNING_KEY=NAME.secret"))
        else:
            out.append(Check("signing key", WARN, "OPFORGE_REMOTE_PUSH=1 with no OPFORGE_SIGNING_KEY: pushes are "
                                                  "refused (builds go on, unshared)",
                             "`opforge cache keygen NAME`, then OPFORGE_SIGNING_KEY=NAME.secret (or "
                             "OPFORGE_REMOTE_ALLOW_UNSIGNED=1 to push unsigned)"))
    return out
