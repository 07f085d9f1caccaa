"""The remote cache's store (``OPFORGE_REMOTE_CACHE``, behind fsspec): what ``remote.py`` (pull),
``remote_push.py``, ``remote_prune.py`` and ``remote_wait.py`` ask of it, and nothing about entries.

* **Opening** (``_open``, ``_fs``): a URL to an fsspec filesystem and its root; ``url_problem`` says why
  a URL can't name one, ``StoreMissing`` that its root (directory, bucket) isn't there.
* **Bounded calls** (``_bounded``): each request runs in a worker thread given ``OPFORGE_REMOTE_TIMEOUT``
  seconds; past that, or on an error from the store, the store counts as dead for the rest of the
  process (``_DEAD``, said once) and the caller goes on without it.
* **Writes that never replace** (``_place``, ``_create``): S3's conditional PUT, a hard link on a
  directory, WebDAV's MOVE with ``Overwrite: F``: an object, once written, never changes.
* **Reads of a part of an object** (``_Ranges`` over ``_fetcher``): byte ranges, so the small members of
  a large object can be read without its binary.
* **Listings** (``_mtime``): the modified time as each backend spells it.

The layout (``PREFIX``, ``object_dir``; docs/architecture.md, "The remote cache")::

    <url>/opforge-remote-v1/<name>/<portable key>/<entry>.tar
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from urllib.parse import urlsplit

from .. import settings as settings_mod
from ..errors import OpforgeError
from .progress import Reporter

PREFIX = "opforge-remote-v1"
SIGNATURE = "signature.json"
"""An object's member holding the signature over its manifest (``signing.py``)."""

_DEAD: dict[str, str] = {}
"""Store URL -> why it counts as dead in this process."""
_LOCK = threading.Lock()


class StoreMissing(OpforgeError):
    """The store's root (its directory, or its bucket) doesn't exist: a typo in ``OPFORGE_REMOTE_CACHE``,
    or a store nobody has pushed to yet."""

    def __init__(self, url: str, why: str):
        self.url, self.why = url, why
        start = "create the bucket, or" if why.startswith("no bucket") else "to start a store there,"
        super().__init__(f"the remote cache {url} does not exist ({why}): check OPFORGE_REMOTE_CACHE for a typo; "
                         f"{start} push to it (`opforge cache push`)")


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
    if worker.is_alive() or _timed_out(box.get("error")):  # the client's own timeout may fire first
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


def _timed_out(exc: BaseException | None) -> bool:
    """Whether a store's client gave up waiting (TimeoutError, httpx's and aiohttp's timeouts, given the
    same timeout as ``_bounded``'s wait)."""
    return exc is not None and (isinstance(exc, TimeoutError) or any("Timeout" in c.__name__ for c in type(exc).__mro__))


def _open(s: settings_mod.Settings, reporter: Reporter):
    """(fs, root) of the store, or None (said once, the store marked dead) when it can't be opened:
    fsspec or the store's backend missing, an unknown protocol, a malformed URL."""
    return _bounded(s, reporter, "opening it", lambda: _fs(s.remote_cache, s.remote_timeout))


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


def _create(fs, path: str, data: bytes) -> bool:
    """Create the file ``path`` in the store unless one is there (``_place``, never over another): True when created."""
    with tempfile.TemporaryDirectory(prefix="opforge-marker-") as tmp:
        local = os.path.join(tmp, "marker.json")
        with open(local, "wb") as f:
            f.write(data)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        return _place(fs, local, path)


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
