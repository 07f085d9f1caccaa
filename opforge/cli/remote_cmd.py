"""``opforge cache push | pull | keygen`` and ``opforge cache list --remote``: the remote binary cache
(``OPFORGE_REMOTE_CACHE``; ``engine/remote.py``) from the command line.

* ``push [NAME...]``: upload the local entries (of these extensions) that fit this machine, signed
  with ``OPFORGE_SIGNING_KEY`` when set (a CI job that builds once for a fleet).
* ``pull NAME...``: every remote entry of these extensions that fits here, verified (signature,
  sha256, platform) and published locally: warms a node ahead of a job.
* ``list --remote``: what the store holds.
* ``keygen NAME [--dir DIR]``: ``NAME.secret`` (0600) and ``NAME.public`` for signing.

Exit 2 when no store is configured or it can't be reached; 1 when something was refused.
"""

from __future__ import annotations

import json
import sys

from .. import settings as settings_mod
from . import output
from .doctor_checks import FAIL, OK, WARN, Check


def add_actions(csub) -> None:
    ps = csub.add_parser("push", help="upload local builds to the remote cache (OPFORGE_REMOTE_CACHE)")
    ps.add_argument("names", nargs="*", metavar="NAME", help="only these extensions")
    ps.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ps.set_defaults(func=cmd_push)

    pl = csub.add_parser("pull", help="fetch, verify and install remote builds of these extensions")
    pl.add_argument("names", nargs="+", metavar="NAME")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pl.set_defaults(func=cmd_pull)

    kg = csub.add_parser("keygen", help="make an ed25519 key pair for signing remote cache entries")
    kg.add_argument("name", help="the key's name: writes NAME.secret (mode 0600) and NAME.public")
    kg.add_argument("--dir", default=".", help="where to write them (default: here)")
    kg.set_defaults(func=cmd_keygen)


def _store(command: str):
    from ..engine.progress import Reporter

    s = settings_mod.current()
    if not s.remote_cache:
        print(f"opforge cache {command}: no remote cache: set OPFORGE_REMOTE_CACHE (e.g. s3://bucket/opforge, "
              "webdav://host/opforge, file:///nfs/opforge)", file=sys.stderr)
        return None, None
    return s, Reporter(s.verbose)


def _dead(command: str, s) -> int:
    print(f"opforge cache {command}: the remote cache {s.remote_cache} could not be reached (see above)", file=sys.stderr)
    return 2


def _show(outcomes, title: str, as_json: bool, extra: dict) -> int:
    output.outcomes(outcomes, title, as_json, extra)
    print(output.counts(outcomes), file=sys.stderr if as_json else sys.stdout)
    return 1 if any(o.status in ("refused", "failed") for o in outcomes) else 0


def _transfer(args, command: str) -> int:
    """``push`` (the local cache to the store) or ``pull`` (the store to the local cache), with a table."""
    from ..engine import remote

    s, reporter = _store(command)
    if s is None:
        return 2
    move = remote.push_names if command == "push" else remote.pull_names
    outcomes = move(args.names, s, reporter)
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
    from ..engine import remote
    s, reporter = _store("list --remote")
    if s is None:
        return 2
    rows = remote.listing(s, reporter)
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


def check_remote(settings: settings_mod.Settings) -> list:
    """The remote cache (OPFORGE_REMOTE_CACHE): reachable within its timeout, and the keys usable.
    Nothing to check (one OK line) when no store is set."""
    if not settings.remote_cache:
        return [Check("remote cache", OK, "not set (OPFORGE_REMOTE_CACHE): builds stay on this machine")]
    from ..engine import remote, signing
    from ..engine.progress import Reporter
    from ..errors import OpforgeError

    url = settings.remote_cache
    out = []
    rows = remote.listing(settings, Reporter(False))
    if rows is None:
        out.append(Check("remote cache", FAIL, f"{url}: {remote._DEAD.get(url, 'unreachable')}",
                         "check the URL, the store's credentials and the network; OPFORGE_REMOTE_TIMEOUT sets the wait"))
    else:
        out.append(Check("remote cache", OK, f"{url}: reachable, {len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"))
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
    if settings.remote_push:
        if settings.signing_key:
            try:
                signing.sign(b"doctor", settings.signing_key)
                out.append(Check("signing key", OK, f"pushes are signed with {settings.signing_key}"))
            except OpforgeError as exc:
                out.append(Check("signing key", FAIL, str(exc), "`opforge cache keygen NAME` makes a key pair"))
        else:
            out.append(Check("signing key", WARN, "OPFORGE_REMOTE_PUSH=1 with no OPFORGE_SIGNING_KEY: pushes are "
                                                  "unsigned, and nodes that trust keys will refuse them",
                             "`opforge cache keygen NAME`, then OPFORGE_SIGNING_KEY=NAME.secret"))
    return out
