"""The on-disk cache: layout, manifests, safety checks and atomic publish.

Layout under the root (``OPFORGE_CACHE_DIR``, default ``~/.cache/opforge``)::

    <root>/<name>/<key16>-<hdr8>/          one immutable entry
        <name>.so  manifest.json  build.log
    <root>/<name>/.build-<cfg16>/          persistent ninja build dir (incremental builds)
    <root>/<name>/.build-<cfg16>.lock      its lock (flock; dies with its holder)
    <root>/<name>/.tmp-*  .trash-*         staging and removal, never read as entries

``<key16>`` is the input key (sources' bytes, flags, toolchain, torch, Python, archs);
``<hdr8>`` is the digest of the headers the compiler reported. An entry is written in a
temp dir on the same filesystem and renamed into place, so readers see all of it or
nothing, and it is never modified after that.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from ..errors import CacheError, UnsafeCacheError
from ..files import atomic_write
from . import manifest as manifest_mod
from .deps import DepRecord
from .key import sha256_file
from .manifest import Manifest

MANIFEST = manifest_mod.FILE
BUILD_LOG = "build.log"


@dataclass(frozen=True)
class Layout:
    root: str

    def name_dir(self, name: str) -> str:
        return os.path.join(self.root, name)

    def build_dir(self, name: str, config_key: str) -> str:
        return os.path.join(self.root, name, f".build-{config_key[:16]}")

    def lock_path(self, name: str, config_key: str) -> str:
        return os.path.join(self.root, name, f".build-{config_key[:16]}.lock")

    def entry_dir(self, name: str, input_key: str, headers_digest: str) -> str:
        return os.path.join(self.root, name, f"{input_key[:16]}-{headers_digest[:8]}")

    def candidates(self, name: str, input_key: str) -> list[str]:
        """Entry dirs published for this input key, newest first (one scandir, no reads)."""
        prefix = input_key[:16] + "-"
        try:
            with os.scandir(self.name_dir(name)) as it:
                found = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in it if e.name.startswith(prefix)]
        except OSError:  # no such dir, or a file in the way: nothing cached (the cold path says why)
            return []
        return [p for _, p in sorted(found, reverse=True)]


@dataclass
class Entry:
    path: str
    manifest: Manifest = field(repr=False)

    @property
    def binary(self) -> str:
        return os.path.join(self.path, self.manifest.binary)

    @property
    def deps(self) -> tuple[DepRecord, ...]:
        return self.manifest.deps


def cache_hint(root: str) -> str:
    return f"set OPFORGE_CACHE_DIR to a directory you can write (now {root})"


def write_error(doing: str, where: str, root: str, exc: OSError) -> CacheError:
    """A failed write into the cache (a full disk, a read-only mount), as an error that names the fix."""
    return CacheError(f"could not {doing} in {where}: {exc.strerror or exc}. Nothing was cached; free some space "
                      f"there, or {cache_hint(root)}")


def ensure_dir(path: str, root: str) -> None:
    """Create ``path`` (and parents) with mode 0700; errors name OPFORGE_CACHE_DIR."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot create cache directory {path}: {exc.strerror or exc}; {cache_hint(root)}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheError(f"cache directory {path} is not writable; {cache_hint(root)}")


def check_safe(path: str) -> os.stat_result:
    """Refuse a path that is a symlink, owned by another user, or writable by group/others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(
            f"refusing to load from {path}: it is a symbolic link (cache entries are never links). "
            f"Remove it (`rm {path}`) and load again to rebuild."
        )
    if st.st_uid != os.geteuid():
        raise UnsafeCacheError(
            f"refusing to load from {path}: it is owned by uid {st.st_uid}, not you (uid {os.geteuid()}). "
            f"Use your own cache (OPFORGE_CACHE_DIR) or remove it: `rm -r {path}`."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"refusing to load from {path}: it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), "
            f"so anyone could swap the binary. Fix it with `chmod go-w {path}`."
        )
    return st


def read_manifest(entry_dir: str) -> Manifest | None:
    """The entry's manifest, or None when it is missing, truncated or not ours (``Manifest.from_json``)."""
    try:
        with open(os.path.join(entry_dir, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return Manifest.from_json(data, os.path.basename(os.path.dirname(os.path.abspath(entry_dir))))


def binary_state(entry: Entry, full_hash: bool = False) -> str:
    """'ok', 'missing' or 'corrupt'. One ``lstat`` (which also refuses an unsafe binary, see
    ``check_safe``); the contents are hashed only when the stat moved, or when asked."""
    m = entry.manifest
    try:
        st = check_safe(entry.binary)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    if st.st_size != m.binary_size:
        return "corrupt"
    if not full_hash and st.st_mtime_ns == m.binary_mtime_ns:
        return "ok"
    return "ok" if sha256_file(entry.binary) == m.binary_sha256 else "corrupt"


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(
    layout: Layout,
    name: str,
    input_key: str,
    headers_digest: str,
    binary_src: str,
    binary_name: str,
    manifest: Manifest,
    log_text: str,
) -> Entry:
    """Copy a built binary into a new entry and rename it into place atomically; the entry's
    manifest is ``manifest`` with the binary's name, sha256, size and mtime as copied."""
    name_dir = layout.name_dir(name)
    final = layout.entry_dir(name, input_key, headers_digest)
    try:
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=name_dir)
    except OSError as exc:
        raise write_error(f"publish {name}", name_dir, layout.root, exc) from exc
    try:
        os.chmod(tmp, 0o700)
        dst = os.path.join(tmp, binary_name)
        shutil.copyfile(binary_src, dst)
        os.chmod(dst, 0o755 if manifest.kind == "executable" else 0o644)
        _fsync_file(dst)
        st = os.stat(dst)
        manifest = manifest.with_binary(binary_name, sha256_file(dst), st.st_size, st.st_mtime_ns)
        with open(os.path.join(tmp, BUILD_LOG), "w", encoding="utf-8") as f:
            f.write(log_text)
        atomic_write(os.path.join(tmp, MANIFEST), json.dumps(manifest.to_json(), indent=1, sort_keys=True))
        if os.path.lexists(final):
            discard(final)  # a corrupt or unreadable entry under the same name
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(f"publish {name}", name_dir, layout.root, exc) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Entry(final, manifest)


def discard(path: str) -> None:
    """Remove an entry or dir: rename it out of the way first, so no reader sees it half-deleted."""
    parent = os.path.dirname(path)
    trash = os.path.join(parent, f".trash-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def sweep_stale(name_dir: str, older_than_s: float = 3600.0) -> None:
    """Remove ``.tmp-*``/``.trash-*`` left by killed processes (old ones only: a live one may be writing)."""
    now = time.time()
    try:
        with os.scandir(name_dir) as it:
            stale = [
                e.path
                for e in it
                if e.name.startswith((".tmp-", ".trash-")) and now - e.stat(follow_symlinks=False).st_mtime > older_than_s
            ]
    except FileNotFoundError:
        return
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
