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

**Push** (``OPFORGE_REMOTE_PUSH=1``, ``opforge cache push``): the entry is exported, signed with
``OPFORGE_SIGNING_KEY`` and placed, never over an object already there (``_place``: S3's conditional
PUT, a hard link on a directory, WebDAV's MOVE with ``Overwrite: F``): an object, once written, never
changes. With no key the push is refused (``push_refusal``) unless ``OPFORGE_REMOTE_ALLOW_UNSIGNED=1``.
After a build a refused or failed push is a notice (a refusal once per process), never a failed build.

**Prune** (``opforge cache prune --remote``): objects older than N days go, never one younger than
``GRACE_DAYS`` (``prune_verdict``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from .. import settings as settings_mod
from ..decision import Rejected
from ..errors import OpforgeError
from . import archive, signing
from .cache import Entry, Layout
from .key import BuildSpec
from .progress import Reporter

PREFIX = "opforge-remote-v1"
SIGNATURE = "signature.json"

_DEAD: dict[str, str] = {}
"""Store URL -> why it counts as dead in this process."""
_LOCK = threading.Lock()
_REFUSED: set[str] = set()
"""The push refusals said in this process (after a build: once each)."""

GRACE_DAYS = 1.0
"""``cache prune --remote`` never removes an object younger than this (a node may be about to pull it)."""

IMMUTABLE = "already in the store; objects are immutable, so it was not replaced"


class StoreMissing(OpforgeError):
    """The store's root (its directory, or its bucket) doesn't exist: a typo in ``OPFORGE_REMOTE_CACHE``,
    or a store nobody has pushed to yet."""

    def __init__(self, url: str, why: str):
        self.url, self.why = url, why
        start = "create the bucket, or" if why.startswith("no bucket") else "to start a store there,"
        super().__init__(f"the remote cache {url} does not exist ({why}): check OPFORGE_REMOTE_CACHE for a typo; "
                         f"{start} push to it (`opforge cache push`)")


class PushRefused(OpforgeError):
    """``opforge cache push`` can't sign (``push_refusal``): said once, before any upload."""


def url_problem(url: str) -> str | None:
    """Why ``url`` can't name a store, else None. Pure. A directory must be absolute: ``file://tmp/x``
    (two slashes) names ``tmp/x`` under the current directory, which fsspec would quietly use.

    >>> url_problem("file:///nfs/opforge") is None and url_problem("s3://bucket/x") is None
    True
    >>> print(url_problem("file://tmp/x"))
    OPFORGE_REMOTE_CACHE=file://tmp/x names a relative path (tmp/x, under the current directory): \
write an absolute one with three slashes, file:///abs/path (here file:///tmp/x)
    >>> url_problem("/nfs/opforge") is None, url_problem("store") is not None
    (True, True)
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("", "file", "local"):
        return None
    if (scheme and not parts.netloc and parts.path.startswith("/")) or (not scheme and url.startswith("/")):
        return None
    rel = f"{parts.netloc}{parts.path}" if scheme else url
    if parts.netloc == "localhost":
        rel = parts.path.lstrip("/")
    return (f"OPFORGE_REMOTE_CACHE={url} names a relative path ({rel}, under the current directory): write an "
            f"absolute one with three slashes, file:///abs/path (here file:///{rel.lstrip('/')})")


def _fs(url: str, timeout: float = 10.0):
    """The fsspec filesystem and root path of a store URL. ``webdav://host[:port]/path`` (``webdavs``:
    over https) is spelled out for webdav4, whose filesystem takes the server as ``base_url``. A
    relative directory (``file://tmp/x``) is a ValueError (``url_problem``)."""
    why = url_problem(url)
    if why:
        raise ValueError(why)
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


def _protocols(fs) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def _root_missing(fs, root: str) -> str | None:
    """What is missing when the store's root isn't there ("no directory /x", "no bucket 'b'"), else None.
    An object store's root is its bucket: a prefix in it exists once something is written under it."""
    path = root.strip("/")
    if _protocols(fs) & {"s3", "s3a", "gs", "gcs", "abfs", "az"}:
        bucket = path.split("/", 1)[0]
        return None if not bucket or fs.exists(bucket) else f"no bucket {bucket!r}"
    return None if not path or fs.isdir(root) else f"no directory {root}"


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
        then = "the build is kept here only" if what.startswith(("uploading", "looking for the object", "announcing", "withdrawing")) \
            else "building locally"
        reporter.notice(f"the remote cache {url} is not usable ({what}: {why}); {then}, and not asking it again "
                        "in this process")
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


HEARTBEAT = 2.0
"""Seconds between a remote builder's rewrites of its marker in the store (``announce``)."""

STALE_AFTER = 3 * HEARTBEAT
"""A marker not seen to change for this long (three beats) belongs to a builder that is gone (killed): a waiting
node's poller takes over (``ranks.Beats``)."""

POLL_EVERY = 1.0
"""The least seconds between two looks at the store by a node's poller (``Watch``); jittered up to 25 % longer."""

_CLAIMED: dict[tuple[str, str], tuple[str, int]] = {}
"""(name, input key) -> (marker path, generation) this process won with ``Watch.claim``, for ``announce`` to beat."""


def _marker(root: str, spec: BuildSpec, gen: int = 0) -> str:
    """The marker of the ``gen``-th builder of ``spec``'s inputs: 0 is the first, each takeover claims the next."""
    base = f"{object_dir(root, spec.name, spec.portable_key)}/.building-{spec.input_key[:16]}"
    return f"{base}.json" if gen == 0 else f"{base}.{gen}.json"


def marker_gen(filename: str, key16: str) -> int | None:
    """The generation of the builder's marker ``filename`` for the input key ``key16``, else None. Pure.

    >>> k = "0123456789abcdef"
    >>> marker_gen(f".building-{k}.json", k), marker_gen(f".building-{k}.2.json", k)
    (0, 2)
    >>> marker_gen(".building-fedcba9876543210.json", k), marker_gen(f".building-{k}.x.json", k)
    (None, None)
    """
    head = f".building-{key16}"
    if not filename.startswith(head) or not filename.endswith(".json"):
        return None
    middle = filename[len(head):-len(".json")]
    if not middle:
        return 0
    return int(middle[1:]) if middle.startswith(".") and middle[1:].isdigit() else None


def _beat(gen: int) -> bytes:
    import socket

    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time(), "gen": gen}).encode()


def _create(fs, path: str, data: bytes) -> bool:
    """Create the file ``path`` in the store unless one is there (``_place``, never over another): True when created."""
    with tempfile.TemporaryDirectory(prefix="opforge-marker-") as tmp:
        local = os.path.join(tmp, "marker.json")
        with open(local, "wb") as f:
            f.write(data)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        return _place(fs, local, path)


@dataclass(frozen=True)
class Marker:
    """A builder's marker as the store's listing shows it."""

    gen: int
    version: str
    """Changes with each beat: the marker's size, modified time and etag in the listing."""
    age: float | None
    """Seconds since it was written, by the store's modified time and this machine's clock (off by their skew)."""


@dataclass(frozen=True)
class Look:
    """One look at the store for a spec (``Watch.look``): one listing of its directory."""

    objects: tuple[str, ...]
    """The objects this node may take (``_wanted``)."""
    marker: Marker | None
    """The marker of the highest generation, if any."""


def _look(fs, root: str, spec: BuildSpec) -> Look:
    try:
        infos = fs.ls(object_dir(root, spec.name, spec.portable_key), detail=True)
    except FileNotFoundError:
        infos = []
    top = None
    for info in infos:
        gen = marker_gen(info["name"].rsplit("/", 1)[-1], spec.input_key[:16])
        if gen is not None and (top is None or gen > top[0]):
            top = (gen, info)
    marker = None
    if top is not None:
        gen, info = top
        mtime = _mtime(info)
        version = json.dumps([info.get("size"), mtime, info.get("etag") or info.get("ETag")], default=str)
        marker = Marker(gen, version, None if mtime is None else time.time() - mtime)
    return Look(tuple(_wanted([info["name"] for info in infos], spec)), marker)


class Watch:
    """A waiting node's eyes on the store, for one spec (``ranks.await_builder``'s ``store``). Only the node's
    poller calls it, at most once per ``POLL_EVERY`` seconds; it opens the store at its first look."""

    poll_every = POLL_EVERY
    stale_after = STALE_AFTER

    def __init__(self, layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter, find):
        self.layout, self.spec, self.s, self.reporter, self.find = layout, spec, s, reporter, find
        self._store = None
        self._tried: set[str] = set()

    def _fs(self):
        if self._store is None:
            self._store = _open(self.s, self.reporter)
        return self._store

    def look(self) -> Look | None:
        """One listing of the spec's directory: its objects and its builder's marker. None: the store can't be
        asked (said once; it counts as dead in this process)."""
        store = self._fs()
        if store is None:
            return None
        fs, root = store
        return _bounded(self.s, self.reporter, "looking for a build in progress", lambda: _look(fs, root, self.spec))

    def pull(self, look: Look) -> Entry | None:
        """The local entry, pulled (``fetch``) when ``look`` lists an object not tried before; else None."""
        new = [obj for obj in look.objects if obj not in self._tried]
        if not new:
            return None
        self._tried.update(new)
        return fetch(self.layout, self.spec, self.s, self.reporter, self.find)

    def claim(self, gen: int) -> bool | None:
        """Take the builder's part: create the marker of generation ``gen``, unless another process did first
        (``_create``: one winner, whatever the race). True: won (``announce`` beats it from now on); False:
        another process's; None: the store can't be asked."""
        store = self._fs()
        if store is None:
            return None
        fs, root = store
        path = _marker(root, self.spec, gen)
        won = _bounded(self.s, self.reporter, "claiming a build", lambda: _create(fs, path, _beat(gen)))
        if won:
            _CLAIMED[(self.spec.name, self.spec.input_key)] = (path, gen)
        return won


def announce(spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter):
    """Say in the store that this process builds ``spec``, for the other nodes' pollers (``Watch``): its marker
    (the one it claimed with ``Watch.claim``, else a new generation above those there) is rewritten every
    ``HEARTBEAT`` seconds until the returned ``stop()``, which removes it. A killed builder's marker stops
    changing, and a poller takes over once it hasn't for ``STALE_AFTER`` seconds."""
    claimed = _CLAIMED.pop((spec.name, spec.input_key), None)
    store = _open(s, reporter)
    if store is None:
        return lambda: None
    fs, root = store

    def first():
        if claimed is not None:
            fs.pipe_file(claimed[0], _beat(claimed[1]))
            return claimed
        for _ in range(5):  # lost a race for a generation: the next one
            top = _look(fs, root, spec).marker
            gen = 0 if top is None else top.gen + 1
            if _create(fs, _marker(root, spec, gen), _beat(gen)):
                return _marker(root, spec, gen), gen
        return False

    got = _bounded(s, reporter, "announcing a build", first)
    if not got:
        return lambda: None
    path, gen = got
    done = threading.Event()

    def loop():
        while not done.wait(HEARTBEAT):
            if _bounded(s, reporter, "announcing a build", lambda: fs.pipe_file(path, _beat(gen)) or True) is None:
                return

    threading.Thread(target=loop, name="opforge-remote-heartbeat", daemon=True).start()

    def stop():
        done.set()
        _bounded(s, reporter, "withdrawing a build marker", lambda: fs.rm_file(path) or True)

    return stop


PEEK_BLOCK = 64 * 1024
"""Bytes per read when ``_peek`` reads an object in the store (one range request each)."""


class _Ranges:
    """A read-only, seekable file over ``fetch(start, end)`` (the bytes [start, end) of an object of ``size``
    bytes), fetched in aligned blocks of ``PEEK_BLOCK``, each once: what ``tarfile`` needs to read the
    headers and the small members of an object in the store and seek over its binary."""

    def __init__(self, fetch, size: int):
        self.fetch, self.size, self.pos, self.blocks = fetch, size, 0, {}

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            start = i * PEEK_BLOCK
            self.blocks[i] = bytes(self.fetch(start, min(self.size, start + PEEK_BLOCK)))
        return self.blocks[i]

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        out = bytearray()
        while self.pos < end:
            i, off = divmod(self.pos, PEEK_BLOCK)
            chunk = self._block(i)[off:off + end - self.pos]
            if not chunk:
                break
            out += chunk
            self.pos += len(chunk)
        return bytes(out)

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = max(0, pos + (0, self.pos, self.size)[whence])
        return self.pos

    def tell(self) -> int:
        return self.pos


def _fetcher(fs, obj: str):
    """``fetch(start, end)``: a byte range of the object ``obj``, one request. WebDAV (webdav4, whose files
    stream from a position to the end) gets a closed ``Range`` header; other stores ``cat_file``'s range."""
    if "webdav" in _protocols(fs) and hasattr(fs, "client"):
        def fetch(start: int, end: int) -> bytes:
            got = fs.client.request("GET", obj, headers={"Range": f"bytes={start}-{end - 1}"})
            return got.content if got.status_code == 206 else got.content[start:end]  # 200: the server ignored it
        return fetch
    return lambda start, end: fs.cat_file(obj, start=start, end=end)


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


def _place(fs, local: str, final: str) -> bool:
    """Put the file ``local`` at ``final`` in the store unless an object is there: True when placed, False
    when one was there already (it is left as it was). Never replaces, where the store can say so:

    * S3 (s3fs >= 2024.12, ``put_file(mode="create")``): one conditional PUT (``If-None-Match: *``); a
      PUT is whole or absent. An older s3fs: as "elsewhere" below.
    * a directory (``file://``, NFS): the upload goes to a dot-name beside it, then link(2) gives it its
      name, which fails when the name exists.
    * WebDAV (webdav4): the upload goes to a dot-name, then MOVE with ``Overwrite: F`` (412 when the name
      exists; the server checks and renames in one request).
    * elsewhere: a check, then a move: two pushes of one entry at the same moment may both move, the later
      replacing the earlier (the same name: the same entry's key, maybe another signature).
    """
    import inspect

    protocols = _protocols(fs)
    if protocols & {"s3", "s3a"} and "mode" in inspect.signature(fs._put_file).parameters:  # s3fs >= 2024.12
        try:
            fs.put_file(local, final, mode="create")
        except FileExistsError:
            return False
        return True
    staged = f"{final.rsplit('/', 1)[0]}/.{uuid.uuid4().hex}.tar"
    fs.put_file(local, staged)
    moved = False
    try:
        from fsspec.implementations.local import LocalFileSystem

        if isinstance(fs, LocalFileSystem):
            try:
                os.link(staged, final)
                return True
            except FileExistsError:
                return False
            except OSError:  # a filesystem without hard links: check, then move
                pass
        elif "webdav" in protocols and hasattr(fs, "client"):
            from webdav4.client import ResourceAlreadyExists

            try:
                fs.client.move(staged, final, overwrite=False)
            except ResourceAlreadyExists:
                return False
            moved = True
            return True
        if fs.exists(final):
            return False
        fs.mv(staged, final)
        moved = True
        return True
    finally:
        if not moved:
            with contextlib.suppress(Exception):
                fs.rm_file(staged)


@dataclass(frozen=True)
class Pruned:
    """One file of the store that ``prune`` looked at: an object, or a leftover (a push's upload cut off
    before its move, a builder's marker), and what became of it."""

    path: str
    name: str
    what: str
    """object, upload, marker."""
    size: int
    age_days: float | None
    action: str
    """removed, would remove (``--dry-run``), kept, failed."""
    why: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def prune_verdict(age_days: float | None, older_than: float, grace: float = GRACE_DAYS) -> str | None:
    """Why a file of this age stays in the store (None: it goes): it must be older than ``older_than``
    days, and never younger than the grace period. Pure.

    >>> prune_verdict(40, 30) is None, prune_verdict(2, 0) is None
    (True, True)
    >>> prune_verdict(5, 30)
    'younger than 30 days (--older-than)'
    >>> prune_verdict(0.5, 0)
    'younger than the grace period (1 day)'
    >>> prune_verdict(None, 0)
    'its modified time is unknown'
    """
    if age_days is None:
        return "its modified time is unknown"
    if age_days < grace:
        return f"younger than the grace period ({grace:g} day{'s' if grace != 1 else ''})"
    if age_days < older_than:
        return f"younger than {older_than:g} days (--older-than)"
    return None


def _mtime(info: dict) -> float | None:
    """A store listing's modified time (seconds since the epoch), as backends spell it: ``mtime`` (a
    directory), ``LastModified`` (S3), ``modified`` (WebDAV), ``updated`` (GCS), ``last_modified`` (Azure)."""
    import datetime

    for key in ("mtime", "LastModified", "modified", "updated", "last_modified"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(value, datetime.datetime):
            return (value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)).timestamp()
    return None


def prune(older_than: float, s: settings_mod.Settings, reporter: Reporter, dry_run: bool = False,
          now: float | None = None) -> list[Pruned] | None:
    """``opforge cache prune --remote --older-than DAYS``: remove the objects older than ``older_than``
    days by the store's modified time, and leftovers (uploads cut off before their move, builders'
    markers) past the grace; never anything younger than ``GRACE_DAYS`` (``prune_verdict``). Every file
    looked at, with what became of it; None when the store can't be asked; StoreMissing when its root
    isn't there. A node pulling an object as it is removed builds the kernel itself."""
    got = _survey(s, reporter)
    if got is None:
        return None
    fs, _, found = got
    now = time.time() if now is None else now
    out = []
    for parts, path, info in found:
        if len(parts) != 3:
            continue
        base = parts[2]
        what = "object" if _is_object(parts) else "marker" if base.startswith(".building-") else \
            "upload" if base.startswith(".") and base.endswith(".tar") else None
        if what is None:
            continue
        mtime = _mtime(info)
        age = None if mtime is None else max(0.0, (now - mtime) / 86400)
        why = prune_verdict(age, older_than if what == "object" else 0.0)
        row = Pruned(path, parts[0], what, int(info.get("size") or 0), age, "kept", why or "")
        if why is None:
            if dry_run:
                row = Pruned(path, parts[0], what, row.size, age, "would remove")
            else:
                done = _bounded(s, reporter, f"removing {path}", lambda path=path: _remove(fs, path))
                row = Pruned(path, parts[0], what, row.size, age, "removed" if done else "failed",
                             "" if done else _DEAD.get(s.remote_cache or "", "the store did not answer"))
        out.append(row)
    return out


def _remove(fs, path: str) -> bool:
    try:
        fs.rm_file(path)
    except FileNotFoundError:  # another prune was first
        pass
    return True
