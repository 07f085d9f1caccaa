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

**Push** (``OPFORGE_REMOTE_PUSH=1``): after a build, the entry is exported, signed with
``OPFORGE_SIGNING_KEY`` when set, and uploaded; a failed upload is a notice, never a failed build.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
import threading
import uuid

from .. import settings as settings_mod
from ..decision import Rejected
from . import archive, signing
from .cache import Entry, Layout
from .key import BuildSpec
from .progress import Reporter

PREFIX = "opforge-remote-v1"
SIGNATURE = "signature.json"

_DEAD: dict[str, str] = {}
"""Store URL -> why it counts as dead in this process."""
_LOCK = threading.Lock()


def _fs(url: str, timeout: float = 10.0):
    """The fsspec filesystem and root path of a store URL. ``webdav://host[:port]/path`` (``webdavs``:
    over https) is spelled out for webdav4, whose filesystem takes the server as ``base_url``."""
    from urllib.parse import urlsplit

    try:
        import fsspec
    except ImportError:
        raise OSError("OPFORGE_REMOTE_CACHE needs fsspec: pip install 'opforge[remote]'") from None
    parts = urlsplit(url)
    if parts.scheme in ("webdav", "webdavs"):
        base = f"{'https' if parts.scheme == 'webdavs' else 'http'}://{parts.netloc}"
        return fsspec.filesystem("webdav", base_url=base, timeout=timeout, skip_instance_cache=True), \
            parts.path.rstrip("/")
    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def object_dir(root: str, name: str, portable_key: str) -> str:
    return f"{root}/{PREFIX}/{name}/{portable_key}"


def _bounded(s: settings_mod.Settings, reporter: Reporter, what: str, fn):
    """``fn()`` within the timeout; None (and the store marked dead) when it fails or takes too long."""
    url = s.remote_cache or ""
    if url in _DEAD:
        return None
    box: dict = {}

    def work():
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 (any store error: the build goes on locally)
            box["error"] = exc

    worker = threading.Thread(target=work, name="opforge-remote", daemon=True)
    worker.start()
    worker.join(s.remote_timeout)
    if worker.is_alive():
        why = f"no answer within {s.remote_timeout:g} s (OPFORGE_REMOTE_TIMEOUT)"
    elif "error" in box:
        exc = box["error"]
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    else:
        return box.get("value")
    with _LOCK:
        first = url not in _DEAD
        _DEAD[url] = why
    if first:
        reporter.notice(f"the remote cache {url} is not usable ({what}: {why}); building locally, and not asking "
                        "it again in this process")
    return None


def _open(s: settings_mod.Settings, reporter: Reporter):
    """(fs, root) of the store, or None (said once, the store marked dead) when it can't be opened:
    fsspec or the store's backend missing, an unknown protocol, a malformed URL."""
    return _bounded(s, reporter, "opening it", lambda: _fs(s.remote_cache, s.remote_timeout))


def _candidates(fs, root: str, spec: BuildSpec) -> list[str]:
    d = object_dir(root, spec.name, spec.portable_key)
    try:
        found = fs.ls(d, detail=False)
    except FileNotFoundError:
        return []
    names = sorted(p for p in found if p.rsplit("/", 1)[-1].endswith(".tar") and not p.rsplit("/", 1)[-1].startswith("."))
    if spec.toolchain_missing:  # no compiler here: an entry built with any toolchain (portable key)
        return names
    return [p for p in names if p.rsplit("/", 1)[-1].startswith(spec.input_key[:16])]


def inspect_object(path: str) -> tuple[str, str, bytes, dict | None] | None:
    """A downloaded one-entry archive's extension name, entry directory, manifest bytes and signature
    document; None when it is not one (truncated, another format)."""
    try:
        with tarfile.open(path, "r:*") as tar:
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


def _pull_object(fs, obj: str, root: str, s: settings_mod.Settings, reporter: Reporter) -> archive.Outcome | None:
    """Download one object, check its signature, import it (every ``cache import`` check) into the
    cache at ``root``. The outcome (imported, present, refused, skipped), or None when the store died."""
    name, entry = obj.rsplit("/", 3)[-3], obj.rsplit("/", 1)[-1][:-len(".tar")]
    with tempfile.TemporaryDirectory(prefix=".remote-", dir=root) as tmp:
        local = os.path.join(tmp, "entry.tar")
        if _bounded(s, reporter, f"downloading {obj}", lambda: fs.get_file(obj, local) or True) is None:
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
            (outcome,) = archive.import_(local, root=root)
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
        outcome = _pull_object(fs, obj, layout.root, s, reporter)
        if outcome is None:
            return False
        if outcome.status in ("imported", "present"):
            reporter.info(f"{spec.name}: {outcome.status} from the remote cache ({obj}; {outcome.reason})")
            return True
        reporter.notice(f"remote entry {obj} {outcome.status}: {outcome.reason}")
    return False


HEARTBEAT = 10.0
"""Seconds between a remote builder's refreshes of its marker; a marker older than 3 of them is stale."""


def _marker(root: str, spec: BuildSpec) -> str:
    return f"{object_dir(root, spec.name, spec.portable_key)}/.building-{spec.input_key[:16]}.json"


def announce(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter):
    """Say in the store that this process is building ``spec`` (for the ranks of other nodes, which wait
    while the marker is fresh), refreshed every ``HEARTBEAT`` seconds until the returned ``stop()``,
    which removes it. A killed builder's marker goes stale within ``3 * HEARTBEAT``."""
    import socket
    import time

    store = _open(s, reporter)
    if store is None:
        return lambda: None
    fs, root = store
    path = _marker(root, spec)
    done = threading.Event()

    def beat():
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}).encode())
        return True

    if _bounded(s, reporter, "announcing a build", beat) is None:
        return lambda: None

    def loop():
        while not done.wait(HEARTBEAT):
            if _bounded(s, reporter, "announcing a build", beat) is None:
                return

    threading.Thread(target=loop, name="opforge-remote-heartbeat", daemon=True).start()

    def stop():
        done.set()
        _bounded(s, reporter, "withdrawing a build marker", lambda: fs.rm_file(path) or True)

    return stop


def building(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> bool:
    """Is another node building ``spec`` for the store right now (a fresh marker)?"""
    import time

    store = _open(s, reporter)
    if store is None:
        return False
    fs, root = store

    def look():
        try:
            doc = json.loads(fs.cat_file(_marker(root, spec)))
        except FileNotFoundError:
            return False
        return time.time() - float(doc.get("at", 0)) < 3 * HEARTBEAT

    return bool(_bounded(s, reporter, "looking for a build in progress", look))


def has(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> bool | None:
    """Does the store hold an entry for ``spec`` (for ``opforge report``)? None when it can't be asked."""
    store = _open(s, reporter)
    if store is None:
        return None
    fs, root = store
    found = _bounded(s, reporter, "listing", lambda: _candidates(fs, root, spec))
    return None if found is None else bool(found)


def listing(s: settings_mod.Settings, reporter: Reporter, names=None) -> list[dict] | None:
    """What the store holds (optionally of ``names``): name, portable key, entry, size, path. None: store dead."""
    store = _open(s, reporter)
    if store is None:
        return None
    fs, root = store

    def walk():
        base = f"{root}/{PREFIX}"
        try:
            found = fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        rows = []
        for path, info in sorted(found.items()):
            parts = path[len(base):].strip("/").split("/")
            if len(parts) != 3 or not parts[2].endswith(".tar") or parts[2].startswith("."):
                continue
            if names and parts[0] not in names:
                continue
            rows.append({"name": parts[0], "portable_key": parts[1], "entry": parts[2][:-4],
                         "size": int(info.get("size") or 0), "path": path})
        return rows

    return _bounded(s, reporter, "listing", walk)


def pull_names(names, s: settings_mod.Settings, reporter: Reporter) -> list[archive.Outcome] | None:
    """``opforge cache pull NAME...``: every remote entry of these extensions that fits here, verified
    and published into the local cache (ahead of a job). None when the store is dead."""
    rows = listing(s, reporter, set(names))
    if rows is None:
        return None
    store = _open(s, reporter)
    if store is None:
        return None
    fs = store[0]
    from . import cache

    cache.ensure_dir(s.cache_dir, s.cache_dir)
    out = []
    for row in rows:
        outcome = _pull_object(fs, row["path"], s.cache_dir, s, reporter)
        if outcome is None:
            return None
        out.append(outcome)
    return out


def push_names(names, s: settings_mod.Settings, reporter: Reporter) -> list[archive.Outcome]:
    """``opforge cache push [NAME...]``: upload the local entries (of ``names``) that fit this machine."""
    from . import cache, inventory

    out = []
    for row in inventory.entries(s.cache_dir):
        if names and row.name not in names:
            continue
        m = cache.read_manifest(row.path)
        if m is None:
            out.append(archive.Outcome(row.name, os.path.basename(row.path), "skipped", "its manifest is unreadable"))
            continue
        done = push(Entry(row.path, m), s, reporter)
        out.append(archive.Outcome(row.name, os.path.basename(row.path), "pushed" if done else "failed",
                                   done or "see the notice above"))
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


def push(entry: Entry, s: settings_mod.Settings, reporter: Reporter) -> str | None:
    """Upload a published entry (signed with ``OPFORGE_SIGNING_KEY`` when set); its remote path, or None."""
    name = entry.manifest.name
    try:
        fs, root = _fs(s.remote_cache, s.remote_timeout)
        with open(os.path.join(entry.path, "manifest.json"), "rb") as f:
            manifest = f.read()
        extra = {SIGNATURE: json.dumps(signing.sign(manifest, s.signing_key)).encode()} if s.signing_key else {}
        with tempfile.TemporaryDirectory(prefix="opforge-push-") as tmp:
            local = os.path.join(tmp, "entry.tar")
            archive.export(local, names=[name], root=os.path.dirname(os.path.dirname(entry.path)),
                           entries={entry.path}, extra=extra)
            d = object_dir(root, name, entry.manifest.portable_key)
            final = f"{d}/{os.path.basename(entry.path)}.tar"
            staged = f"{d}/.{uuid.uuid4().hex}.tar"

            def upload():
                fs.makedirs(d, exist_ok=True)
                fs.put_file(local, staged)
                fs.mv(staged, final)
                return final

            done = _bounded(s, reporter, "uploading", upload)
    except Exception as exc:  # noqa: BLE001 (a push is a courtesy to other nodes: never a failed build)
        reporter.notice(f"pushing {name} to the remote cache failed: {type(exc).__name__}: {exc}")
        return None
    if done:
        reporter.info(f"pushed {name} to {done}")
    return done
