"""Pushes to the remote store: after a build (``OPFORGE_REMOTE_PUSH=1``) and ``opforge cache push``.

The entry is exported, signed with ``OPFORGE_SIGNING_KEY`` and placed, never over an object already there
(``remote_fs._place``): an object, once written, never changes. With no key the push is refused
(``push_refusal``) unless ``OPFORGE_REMOTE_ALLOW_UNSIGNED=1``. After a build a refused or failed push is a
notice (a refusal once per process), never a failed build.
"""

from __future__ import annotations

import json
import os
import tempfile

from .. import settings as settings_mod
from ..errors import OpforgeError
from . import archive, signing
from .cache import Entry
from .progress import Reporter
from .remote_fs import _DEAD, _LOCK, SIGNATURE, _bounded, _open, _place, object_dir

_REFUSED: set[str] = set()
"""The push refusals said in this process (after a build: once each)."""

IMMUTABLE = "already in the store; objects are immutable, so it was not replaced"


class PushRefused(OpforgeError):
    """``opforge cache push`` can't sign (``push_refusal``): said once, before any upload."""


def push_refusal(s: settings_mod.Settings) -> str | None:
    """Why this process may not push, with the fix, else None: no ``OPFORGE_SIGNING_KEY`` (unless
    ``OPFORGE_REMOTE_ALLOW_UNSIGNED=1``: nodes that trust keys refuse an unsigned object, and build it
    themselves), or a key file that can't be read or isn't a secret key."""
    if not s.signing_key:
        if s.remote_allow_unsigned:
            return None
        return ("no signing key, and an unsigned object would be refused by every node that trusts keys: make a key "
                "pair with `opforge cache keygen NAME`, set OPFORGE_SIGNING_KEY=NAME.secret here and "
                "OPFORGE_TRUSTED_KEYS=NAME.public on the nodes (or set OPFORGE_REMOTE_ALLOW_UNSIGNED=1 to push unsigned)")
    try:
        signing.check_secret(s.signing_key)
    except OpforgeError as exc:
        why = str(exc)
        return f"OPFORGE_SIGNING_KEY: {why}" + ("" if "keygen" in why else
                                                "; point it at a NAME.secret that `opforge cache keygen NAME` made")
    return None


def push_names(names, s: settings_mod.Settings, reporter: Reporter) -> list[archive.Outcome]:
    """``opforge cache push [NAME...]``: upload the local entries (of ``names``) that fit this machine;
    PushRefused (before any upload) when ``push_refusal`` says no."""
    from . import cache, inventory

    why = push_refusal(s)
    if why:
        raise PushRefused(why)
    out = []
    for row in inventory.entries(s.cache_dir):
        if names and row.name not in names:
            continue
        m = cache.read_manifest(row.path)
        if m is None:
            out.append(archive.Outcome(row.name, os.path.basename(row.path), "skipped", "its manifest is unreadable"))
            continue
        out.append(upload(Entry(row.path, m), s, reporter))
    return out


def push(entry: Entry, s: settings_mod.Settings, reporter: Reporter) -> str | None:
    """After a build (``OPFORGE_REMOTE_PUSH=1``): ``upload`` the entry; its remote path when it was placed,
    else None. Never raises: a refusal (``push_refusal``) is a notice once per process, a failure a notice."""
    why = push_refusal(s)
    if why:
        said = f"not pushing to the remote cache {s.remote_cache}: {why}"
        with _LOCK:
            first = said not in _REFUSED
            _REFUSED.add(said)
        if first:
            reporter.notice(said)
        return None
    outcome = upload(entry, s, reporter)
    return outcome.reason if outcome.status == "pushed" else None


def upload(entry: Entry, s: settings_mod.Settings, reporter: Reporter) -> archive.Outcome:
    """Export a published entry, sign it with ``OPFORGE_SIGNING_KEY`` (when set) and place it in the store,
    never over an object there: "pushed" (the reason is its path), "present" (one was there: ``IMMUTABLE``)
    or "failed" (why; a notice too)."""
    name, dirname = entry.manifest.name, os.path.basename(entry.path)
    failed = lambda why: archive.Outcome(name, dirname, "failed", why)  # noqa: E731
    store = _open(s, reporter)
    if store is None:
        return failed(f"the remote cache is not usable: {_DEAD.get(s.remote_cache or '', '?')}")
    fs, root = store
    d = object_dir(root, name, entry.manifest.portable_key)
    final = f"{d}/{dirname}.tar"
    try:
        there = _bounded(s, reporter, "looking for the object", lambda: fs.exists(final))
        if there is None:
            return failed(f"the remote cache is not usable: {_DEAD.get(s.remote_cache or '', '?')}")
        placed = False
        if not there:
            with open(os.path.join(entry.path, "manifest.json"), "rb") as f:
                manifest = f.read()
            extra = {SIGNATURE: json.dumps(signing.sign(manifest, s.signing_key)).encode()} if s.signing_key else {}
            with tempfile.TemporaryDirectory(prefix="opforge-push-") as tmp:
                local = os.path.join(tmp, "entry.tar")
                archive.export(local, names=[name], root=os.path.dirname(os.path.dirname(entry.path)),
                               entries={entry.path}, extra=extra)
                placed = _bounded(s, reporter, "uploading", lambda: fs.makedirs(d, exist_ok=True) or
                                  _place(fs, local, final))
    except Exception as exc:  # noqa: BLE001 (a push is a courtesy to other nodes: never a failed build)
        reporter.notice(f"pushing {name} to the remote cache failed: {type(exc).__name__}: {exc}")
        return failed(f"{type(exc).__name__}: {exc}")
    if placed is None:
        return failed(f"the remote cache is not usable: {_DEAD.get(s.remote_cache or '', '?')}")
    if not placed:
        reporter.info(f"{name}: {final} is {IMMUTABLE}")
        return archive.Outcome(name, dirname, "present", IMMUTABLE)
    reporter.info(f"pushed {name} to {final}")
    return archive.Outcome(name, dirname, "pushed", final)
