"""A remote binary cache behind fsspec (``OPFORGE_REMOTE_CACHE``): pull on a local miss, push after a build.

**Layout** (version 1; docs/architecture.md, "The remote cache")::

    <url>/opforge-remote-v1/<name>/<portable key>/<entry>.tar

``<entry>`` is the local cache's entry directory name (``<input key16>-<headers8>``). Each object
is one entry in the format of ``opforge cache export`` (the index, ``manifest.json``, the
binary, ``build.log``) plus ``signature.json``: an ed25519 signature over the manifest's bytes,
which pin the binary's sha256. Objects are immutable and written whole: uploaded under a
dot-name, then moved onto their name, so a reader never lists half an entry.

**Pull** (``fetch``): after a local miss, under the entry's build lock (N processes: one
download), the objects under the spec's portable key are listed; with a compiler here only those
of its exact input key are taken, with none any toolchain's (as the local cache's warm path
does). Each is downloaded to a temp file, its signature checked against ``OPFORGE_TRUSTED_KEYS``
(unsigned ones are refused unless ``OPFORGE_REMOTE_ALLOW_UNSIGNED=1``), and handed to
``archive.import_``, which checks all that ``cache import`` checks (names, sizes, sha256 of
each file and of the binary against its manifest, the platform fit, the sources and headers
here) and publishes atomically. What fails a check is said once and never published.

**Bounded**: the lookup and download run in a worker thread given ``OPFORGE_REMOTE_TIMEOUT``
seconds; past that, or on an error from the store, the store counts as dead for the rest of the
process (said once) and the build goes on locally.

This module is the pull side and what reads objects (``inspect_object``, ``trust``, ``listing``, ``predict``).
The store itself (opening it, bounded calls, writes that never replace an object, byte-range reads) is
``remote_fs.py``, which **push** (``remote_push.py``), **prune** (``remote_prune.py``) and a builder's
heartbeat with the waits of other nodes (``remote_wait.py``) use too.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile

from .. import settings as settings_mod
from ..decision import Rejected
from . import archive, signing
from .cache import Layout
from .key import BuildSpec
from .progress import Reporter
from .remote_fs import (
    _DEAD,
    PREFIX,
    SIGNATURE,
    StoreMissing,
    _bounded,
    _fetcher,
    _open,
    _Ranges,
    _root_missing,
    object_dir,
)


def _candidates(fs, root: str, spec: BuildSpec) -> list[str]:
    d = object_dir(root, spec.name, spec.portable_key)
    try:
        found = fs.ls(d, detail=False)
    except FileNotFoundError:
        return []
    return _wanted(found, spec)


def _wanted(paths, spec: BuildSpec) -> list[str]:
    """The objects among ``paths`` (a listing of the spec's directory) that this node may take."""
    names = sorted(p for p in paths if p.rsplit("/", 1)[-1].endswith(".tar") and not p.rsplit("/", 1)[-1].startswith("."))
    if spec.toolchain_missing:  # no compiler here: an entry built with any toolchain (portable key)
        return names
    return [p for p in names if p.rsplit("/", 1)[-1].startswith(spec.input_key[:16])]


def inspect_object(path: str, fileobj=None) -> tuple[str, str, bytes, dict | None] | None:
    """A downloaded one-entry archive's extension name, entry directory, manifest bytes and signature
    document; None when it is not one (truncated, another format). ``fileobj``: read it from there (a
    store's file, seekable: the members not read are skipped, ``_peek``)."""
    try:
        with tarfile.open(path, "r:*", fileobj=fileobj) as tar:
            index = json.loads(tar.extractfile(archive.INDEX).read())
            (item,) = index["entries"]
            manifest = tar.extractfile(archive._member(item["name"], item["entry"], "manifest.json")).read()
            try:
                doc = json.loads(tar.extractfile(SIGNATURE).read())
            except (KeyError, ValueError, AttributeError):
                doc = None
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError, AttributeError, EOFError):
        return None
    return str(item["name"]), str(item["entry"]), manifest, doc if isinstance(doc, dict) else None


def trust(found: tuple[str, str, bytes, dict | None], name: str, entry: str, s: settings_mod.Settings):
    """May the object (``inspect_object``'s answer) stored as ``name``/``entry`` be imported? A Decision:
    it must hold that entry, signed by a trusted key (or unsigned, where that is allowed)."""
    from ..decision import Accepted

    theirs_name, theirs_entry, manifest, doc = found
    if (theirs_name, theirs_entry) != (name, entry):
        return Rejected(f"it holds another entry ({theirs_name}/{theirs_entry}) than its name says ({name}/{entry})")
    if doc is None and s.remote_allow_unsigned:
        return Accepted("unsigned, allowed by OPFORGE_REMOTE_ALLOW_UNSIGNED=1")
    verdict = signing.verify(manifest, doc, signing.trusted(s.trusted_keys))
    if not verdict and doc is None:
        return Rejected("it is unsigned: sign pushes with OPFORGE_SIGNING_KEY and trust the key with "
                        "OPFORGE_TRUSTED_KEYS (or set OPFORGE_REMOTE_ALLOW_UNSIGNED=1)")
    return verdict


def _copy_object(fs, obj: str, out) -> bool:
    with fs.open(obj, "rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)
    return True


def _pull_object(fs, obj: str, root: str, s: settings_mod.Settings, reporter: Reporter,
                 places=None) -> archive.Outcome | None:
    """Download one object, check its signature, import it (every ``cache import`` check) into the
    cache at ``root``. The outcome (imported, present, refused, skipped), or None when the store died."""
    name, entry = obj.rsplit("/", 3)[-3], obj.rsplit("/", 1)[-1][:-len(".tar")]
    with tempfile.TemporaryDirectory(prefix=".remote-", dir=root) as tmp:
        local = os.path.join(tmp, "entry.tar")
        # Into a file opened here: a download that outlives the timeout goes on in its thread, and must not
        # recreate the staging dir after it is gone (as fs.get_file(obj, path) would); it writes to a closed file.
        with open(local, "wb") as out:
            if _bounded(s, reporter, f"downloading {obj}", lambda: _copy_object(fs, obj, out)) is None:
                return None
        found = inspect_object(local)
        try:
            verdict = Rejected("it is not a whole one-entry opforge archive (truncated?)") if found is None else \
                trust(found, name, entry, s)
        except Exception as exc:  # noqa: BLE001 (an unreadable trusted key file)
            verdict = Rejected(str(exc))
        if not verdict:
            return archive.Outcome(name, entry, "refused", verdict.reason)
        try:
            (outcome,) = archive.import_(local, root=root, places=places)  # the load's sources, at their place here
        except Exception as exc:  # noqa: BLE001 (a corrupt object: said, never published)
            return archive.Outcome(name, entry, "refused", f"{type(exc).__name__}: {exc}")
        if outcome.status == "corrupt":
            return archive.Outcome(name, entry, "refused", outcome.reason)
        return archive.Outcome(name, entry, outcome.status, outcome.reason or verdict.reason)


def pull(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> bool:
    """Download, verify and publish a remote entry for ``spec``; True when one was published."""
    store = _open(s, reporter)
    if store is None:
        return False
    fs, root = store
    found = _bounded(s, reporter, "listing", lambda: _candidates(fs, root, spec))
    for obj in found or []:
        outcome = _pull_object(fs, obj, layout.root, s, reporter, spec.places)
        if outcome is None:
            return False
        if outcome.status in ("imported", "present"):
            reporter.info(f"{spec.name}: {outcome.status} from the remote cache ({obj}; {outcome.reason})")
            return True
        reporter.notice(f"remote entry {obj} {outcome.status}: {outcome.reason}")
    return False


def _peek(fs, obj: str):
    """``inspect_object`` of an object in the store, reading only the tar headers and the small members
    (index, signature, manifest): the binary is seeked over, so a 100 MB object costs two or three
    ranges of ``PEEK_BLOCK``. False (not None) when it is not a whole one-entry archive."""
    return inspect_object(obj.rsplit("/", 1)[-1], fileobj=_Ranges(_fetcher(fs, obj), int(fs.size(obj)))) or False


def _name_entry(obj: str) -> tuple[str, str]:
    """An object path's extension name and entry directory (``.../<name>/<portable key>/<entry>.tar``)."""
    return obj.rsplit("/", 3)[-3], obj.rsplit("/", 1)[-1][:-len(".tar")]


def pull_verdict(found, name: str, entry: str, s: settings_mod.Settings) -> str:
    """What a pull would do with the object stored as ``name``/``entry`` (``inspect_object``'s answer, or
    None): ``would be pulled (<why>)``, ``refused: unsigned (<fix>)``, ``refused: untrusted key (<why>)``,
    or ``refused: <why>``. The signature and the entry's name only: the sha256 and platform checks of the
    pull itself need the whole object."""
    if not found:
        return "refused: not a whole one-entry opforge archive (truncated?)"
    try:
        verdict = trust(found, name, entry, s)
    except Exception as exc:  # noqa: BLE001 (an unreadable trusted key file)
        return f"refused: {exc}"
    if verdict:
        return f"would be pulled ({verdict.reason})"
    if found[3] is None:
        return ("refused: unsigned (sign pushes with OPFORGE_SIGNING_KEY and trust the key with OPFORGE_TRUSTED_KEYS, "
                "or set OPFORGE_REMOTE_ALLOW_UNSIGNED=1)")
    if found[:2] == (name, entry) and "base64" not in verdict.reason:
        return f"refused: untrusted key ({verdict.reason})"
    return f"refused: {verdict.reason}"


def predict(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> str | None:
    """What a pull of ``spec`` would do now, under the trust settings (for ``opforge report``): the first
    object that would be pulled (``pull_verdict``), else the first refusal; "" when the store holds none for
    ``spec``; None when the store can't be asked. Reads each object's signature and manifest only."""
    store = _open(s, reporter)
    if store is None:
        return None
    fs, root = store
    found = _bounded(s, reporter, "listing", lambda: _candidates(fs, root, spec))
    if found is None:
        return None
    refused = []
    for obj in found:
        peeked = _bounded(s, reporter, f"reading {obj}'s signature", lambda obj=obj: _peek(fs, obj))
        if peeked is None:
            return None
        verdict = pull_verdict(peeked, *_name_entry(obj), s)
        if verdict.startswith("would be pulled"):
            return verdict
        refused.append(verdict)
    return refused[0] if refused else ""


def _survey(s: settings_mod.Settings, reporter: Reporter):
    """(fs, root, [(parts, path, info)]) of every file under the store's prefix, ``parts`` being the path
    below it split at "/"; None when the store can't be asked. Raises StoreMissing when its root isn't there."""
    store = _open(s, reporter)
    if store is None:
        return None
    fs, root = store
    base = f"{root}/{PREFIX}".strip("/")

    def walk():
        missing = _root_missing(fs, root)
        if missing:
            return missing
        try:
            found = fs.find(f"{root}/{PREFIX}", detail=True)
        except FileNotFoundError:
            return []
        rows = []
        for path, info in sorted(found.items()):
            rel = path.strip("/")  # backends differ on the leading "/"
            if rel.startswith(base + "/"):
                rows.append((rel[len(base) + 1:].split("/"), path, info))
        return rows

    got = _bounded(s, reporter, "listing", walk)
    if isinstance(got, str):
        raise StoreMissing(s.remote_cache or "", got)
    return None if got is None else (fs, root, got)


def _is_object(parts: list[str]) -> bool:
    return len(parts) == 3 and parts[2].endswith(".tar") and not parts[2].startswith(".")


def listing(s: settings_mod.Settings, reporter: Reporter, names=None) -> list[dict] | None:
    """What the store holds (optionally of ``names``): name, portable key, entry, size, path. None: store
    dead. Raises StoreMissing when the store's root isn't there."""
    got = _survey(s, reporter)
    if got is None:
        return None
    return [{"name": parts[0], "portable_key": parts[1], "entry": parts[2][:-4], "size": int(info.get("size") or 0),
             "path": path}
            for parts, path, info in got[2] if _is_object(parts) and (not names or parts[0] in names)]


def pull_names(names, s: settings_mod.Settings, reporter: Reporter) -> list[archive.Outcome] | None:
    """``opforge cache pull NAME...``: every remote entry of these extensions that fits here, verified
    and published into the local cache (ahead of a job); a name the store holds nothing of is a
    "missing" outcome that says where it looked. None when the store is dead; StoreMissing when its
    root isn't there."""
    got = _survey(s, reporter)
    if got is None:
        return None
    fs, root, found = got
    from . import cache

    cache.ensure_dir(s.cache_dir, s.cache_dir)
    out = []
    for name in dict.fromkeys(names):
        paths = [path for parts, path, _ in found if _is_object(parts) and parts[0] == name]
        if not paths:
            out.append(archive.Outcome(name, "", "missing", f"the store {s.remote_cache} holds nothing of {name}: "
                                                            f"looked in {root}/{PREFIX}/{name}/"))
        for path in paths:
            outcome = _pull_object(fs, path, s.cache_dir, s, reporter)
            if outcome is None:
                return None
            out.append(outcome)
    return out


def fetch(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter, find):
    """Under the entry's build lock: ``find()`` again (another process may have pulled or built
    it), else ``pull`` and ``find()``. Returns the local entry, or None."""
    from . import cache
    from .lock import BuildLock

    if s.remote_cache in _DEAD:
        return None
    cache.ensure_dir(layout.root, layout.root)
    cache.ensure_dir(layout.name_dir(spec.name), layout.root)
    # record=False: no holder file, so ranks waiting for a builder (ranks.await_builder) read this as
    # a short probe, not as a build in progress
    with BuildLock(layout.lock_path(spec.name, spec.config_key), spec.name, s.lock_timeout, reporter.notice,
                   record=False):
        entry = find()
        if entry is None and pull(layout, spec, s, reporter):
            entry = find()
        return entry


