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


def signature_of(path: str) -> tuple[bytes | None, dict | None]:
    """The manifest bytes and the signature document of a one-entry archive."""
    with tarfile.open(path, "r:*") as tar:
        try:
            index = json.loads(tar.extractfile(archive.INDEX).read())
            (item,) = index["entries"]
            manifest = tar.extractfile(archive._member(item["name"], item["entry"], "manifest.json")).read()
        except (KeyError, ValueError, TypeError, AttributeError):
            return None, None
        try:
            doc = json.loads(tar.extractfile(SIGNATURE).read())
        except (KeyError, ValueError, AttributeError):
            doc = None
    return manifest, doc if isinstance(doc, dict) else None


def trust(path: str, s: settings_mod.Settings):
    """Is the downloaded entry at ``path`` signed by a trusted key (or is unsigned allowed)? A Decision."""
    from ..decision import Accepted

    manifest, doc = signature_of(path)
    if manifest is None:
        return Rejected("it is not a one-entry opforge archive")
    if doc is None and s.remote_allow_unsigned:
        return Accepted("unsigned, allowed by OPFORGE_REMOTE_ALLOW_UNSIGNED=1")
    verdict = signing.verify(manifest, doc, signing.trusted(s.trusted_keys))
    if not verdict and doc is None:
        return Rejected("it is unsigned: sign pushes with OPFORGE_SIGNING_KEY and trust the key with "
                        "OPFORGE_TRUSTED_KEYS (or set OPFORGE_REMOTE_ALLOW_UNSIGNED=1)")
    return verdict


def pull(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter) -> bool:
    """Download, verify and publish a remote entry for ``spec``; True when one was published."""
    fs, root = _fs(s.remote_cache, s.remote_timeout)
    found = _bounded(s, reporter, "listing", lambda: _candidates(fs, root, spec))
    for obj in found or []:
        with tempfile.TemporaryDirectory(prefix=".remote-", dir=layout.root) as tmp:
            local = os.path.join(tmp, "entry.tar")
            if _bounded(s, reporter, f"downloading {obj}", lambda o=obj, to=local: fs.get_file(o, to) or True) is None:
                return False
            try:
                verdict = trust(local, s)
            except Exception as exc:  # noqa: BLE001 (an unreadable trusted key file, a broken archive)
                verdict = Rejected(str(exc))
            if not verdict:
                reporter.notice(f"remote entry {obj} refused: {verdict.reason}")
                continue
            try:
                outcomes = archive.import_(local, root=layout.root)
            except Exception as exc:  # noqa: BLE001 (a corrupt object: said, never published)
                reporter.notice(f"remote entry {obj} refused: {exc}")
                continue
            for o in outcomes:
                if o.status in ("imported", "present"):
                    reporter.info(f"{spec.name}: {o.status} from the remote cache ({obj}; {verdict.reason})")
                    return True
                reporter.notice(f"remote entry {obj} refused: {o.status}: {o.reason}")
    return False


def fetch(layout: Layout, spec: BuildSpec, s: settings_mod.Settings, reporter: Reporter, find):
    """Under the entry's build lock: ``find()`` again (another process may have pulled or built
    it), else ``pull`` and ``find()``. Returns the local entry, or None."""
    from . import cache
    from .lock import BuildLock

    if s.remote_cache in _DEAD:
        return None
    cache.ensure_dir(layout.root, layout.root)
    cache.ensure_dir(layout.name_dir(spec.name), layout.root)
    with BuildLock(layout.lock_path(spec.name, spec.config_key), spec.name, s.lock_timeout, reporter.notice):
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
