"""Cache export and import: the entries built for this platform, in one archive.

``opforge cache export FILE`` writes a tar (gzip when FILE ends in ``.gz`` or ``.tgz``)::

    opforge-cache.json                      the index: format, host, torch, and each entry's
                                            files with their size and sha256
    entries/<name>/<entry dir>/<file>       manifest.json, build.log and the binary

``opforge cache import FILE`` reads the index and decides for each entry whether it fits
this machine (:func:`fits`: the same torch build and install, Python, CUDA archs, CPU for
host-tuned builds, and the same sources and headers on disk, since the warm path checks
them). Each file is checked against the index's sha256, and the binary against its manifest's; an
accepted entry is then published like a build (``cache.publish``: a temp dir of the cache,
fsync, rename), atomic per entry, so a process loading meanwhile sees all of it or
nothing. A member's path in the archive is never used as a path: members are looked up by
the names opforge expects (validated), and ``publish`` names every file it writes, so an
archive can't write outside the cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass

from .. import compat
from .. import settings as settings_mod
from ..compat import TorchFacts
from ..decision import Accepted, Decision, Rejected
from ..errors import ArchiveError, CacheError
from . import cache, inventory
from . import deps as deps_mod
from .key import check_name, sha256_file
from .manifest import Manifest
from .relocate import Places

INDEX = "opforge-cache.json"
FORMAT = 1
_ENTRY_DIR = re.compile(r"[0-9a-f]{16}-[0-9a-f]{8}")


@dataclass(frozen=True)
class Here:
    """The facts of this machine that decide whether a cached entry would be found and run here."""

    torch: TorchFacts
    cpu_identity: str
    gpu_archs: str
    """What ``key.cuda_arch_key`` gives here with no explicit arch flags ("list:...", "visible:9.0" or "none")."""
    arch_list: str

    @classmethod
    def detect(cls, s: settings_mod.Settings | None = None) -> Here:
        from . import toolchain
        from .key import cuda_arch_key

        s = s or settings_mod.current()
        return cls(compat.torch_facts(), toolchain.host_cpu_identity(), cuda_arch_key(s, ()),
                   s.cuda_arch_list or "")


@dataclass(frozen=True)
class Outcome:
    name: str
    entry: str
    status: str
    """exported, imported, present (already in the cache), skipped, corrupt."""
    reason: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def fits(inputs: dict, here: Here) -> Decision:
    """Would a binary built from these inputs (its manifest's ``inputs``) be looked up and run on
    a machine with these facts? Pure.

    >>> t = TorchFacts("2.13.0+cpu", "g", root="/t")
    >>> here = Here(t, "cpu", "none", "")
    >>> inputs = {"torch": t.to_json(), "cpu_identity": "", "cuda_archs": "", "stable_abi": "", "env": []}
    >>> bool(fits(inputs, here))
    True
    >>> print(fits(dict(inputs, torch=dict(t.to_json(), version="2.12.0+cpu")), here).reason)
    built for torch 2.12.0+cpu, but here torch is 2.13.0+cpu
    >>> bool(fits(dict(inputs, torch=dict(t.to_json(), root="/u")), here))  # the same torch elsewhere
    True
    >>> print(fits(dict(inputs, torch=dict(t.to_json(), root="/u"), is_standalone=True), here).reason)
    an executable built against the torch in /u (its rpath); this machine's is in /t
    """
    theirs = compat.TorchFacts.from_json(inputs.get("torch")) if isinstance(inputs, dict) else None
    if theirs is None:
        return Rejected("its manifest does not record what it was built for (an older opforge?)")
    stable = inputs.get("stable_abi") or ""
    runs = compat.same_torch(theirs, here.torch, stable)
    if not runs:
        return runs
    where = bool(inputs.get("is_standalone"))  # only an executable's key holds where torch is (its rpath)
    if theirs.abi_key(stable, where) != here.torch.abi_key(stable, where):
        if where and theirs.root != here.torch.root:
            return Rejected(f"an executable built against the torch in {theirs.root} (its rpath); this machine's "
                            f"is in {here.torch.root}")
        return Rejected(f"built for the extension suffix {theirs.ext_suffix!r}; this Python's is "
                        f"{here.torch.ext_suffix!r}")
    if inputs.get("cpu_identity") and inputs["cpu_identity"] != here.cpu_identity:
        return Rejected("tuned for its build host's own CPU (native arch flags), and this CPU differs")
    env = dict(inputs.get("env") or [])
    return compat.cuda_archs(env.get("TORCH_CUDA_ARCH_LIST", ""), inputs.get("cuda_archs") or "", here.arch_list,
                             here.gpu_archs)


def verdict(manifest: Manifest, here: Here, places: Places | None = None) -> Decision:
    """:func:`fits`, then the sources and headers it was built from must be here, unchanged: those
    under the source root in ``places``' root (when given: a pull for a load knows it), else in the root
    it was built in when that is here (``cache export``; an import on another node checks them at
    load time), the others where they were."""
    d = fits(manifest.inputs, here)
    if not d:
        return d
    if places is None and manifest.root and os.path.isdir(manifest.root):
        places = Places(manifest.root)
    changed = deps_mod.check(manifest.deps, places)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        return Rejected(f"its source or header {changed[0]}{more} is missing or different here, so it would be stale")
    return Accepted()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _member(name: str, entry: str, fname: str) -> str:
    return f"entries/{name}/{entry}/{fname}"


def _tarinfo(arcname: str, size: int, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = size, mode, int(time.time())
    return info


def export(path: str, names: list[str] | None = None, root: str | None = None,
           here: Here | None = None, entries: set[str] | None = None, extra: dict[str, bytes] | None = None
           ) -> list[Outcome]:
    """Pack every entry that fits this machine (optionally only these extensions, or these entry
    directories) into ``path``, with ``extra`` members beside the index (a remote entry's
    signature). The archive is written beside ``path`` and renamed onto it when complete."""
    root = root or settings_mod.current().cache_dir
    here = here or Here.detect()
    outcomes, chosen = [], []
    for row in inventory.entries(root):
        if (names and row.name not in names) or (entries is not None and row.path not in entries):
            continue
        entry_name = os.path.basename(row.path)
        m = cache.read_manifest(row.path)
        why: Decision = Rejected("its manifest is missing, truncated or invalid") if m is None else Accepted()
        if why:
            try:
                state = cache.binary_state(cache.Entry(row.path, m), full_hash=True)
            except cache.UnsafeCacheError as exc:
                state = str(exc)
            why = verdict(m, here) if state == "ok" else Rejected(f"its binary is {state}")
        if not why:
            outcomes.append(Outcome(row.name, entry_name, "skipped", why.reason))
            continue
        files = {}
        for fname in (m.binary, cache.MANIFEST, cache.BUILD_LOG):
            fpath = os.path.join(row.path, fname)
            if os.path.isfile(fpath):
                files[fname] = (fpath, os.path.getsize(fpath), sha256_file(fpath))
        chosen.append((row.name, entry_name, m, files))
        outcomes.append(Outcome(row.name, entry_name, "exported"))
    index = {
        "format": FORMAT, "created_at": time.time(), "host": socket.gethostname(), "torch": here.torch.to_json(),
        "entries": [{"name": n, "entry": e, "binary": m.binary, "kind": m.kind,
                     "files": {f: {"size": size, "sha256": h} for f, (_, size, h) in files.items()}}
                    for n, e, m, files in chosen],
    }
    mode = "w:gz" if path.endswith((".gz", ".tgz")) else "w"
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".opforge-export-", dir=directory)
    os.close(fd)
    try:
        with tarfile.open(tmp, mode) as tar:
            blob = json.dumps(index, indent=1, sort_keys=True).encode()
            tar.addfile(_tarinfo(INDEX, len(blob)), io.BytesIO(blob))
            for arcname, data in (extra or {}).items():
                tar.addfile(_tarinfo(arcname, len(data)), io.BytesIO(data))
            for n, e, _, files in chosen:  # entries are immutable: what was hashed is what is packed
                for fname, (fpath, size, _) in files.items():
                    with open(fpath, "rb") as f:
                        tar.addfile(_tarinfo(_member(n, e, fname), size), f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return outcomes


def _read_index(tar: tarfile.TarFile, path: str) -> dict:
    try:
        member = tar.getmember(INDEX)
    except KeyError:
        raise ArchiveError(f"{path} is not an opforge cache archive (no {INDEX}); make one with "
                           "`opforge cache export FILE`") from None
    f = tar.extractfile(member) if member.isreg() else None
    try:
        index = json.loads(f.read()) if f else None
    except ValueError:
        index = None
    if not isinstance(index, dict) or not isinstance(index.get("entries"), list):
        raise ArchiveError(f"{path}: its {INDEX} is corrupt; export the archive again")
    if index.get("format") != FORMAT:
        raise ArchiveError(f"{path} has archive format {index.get('format')!r}; this opforge reads format {FORMAT}. "
                           "Export it again with this opforge version")
    return index


def _check_names(item: object) -> tuple[str, str, str, dict]:
    """An index entry's name, entry dir, binary and files, or ArchiveError when any could escape the cache."""
    if not isinstance(item, dict):
        raise ArchiveError("an index entry is not an object")
    name, entry, binary, files = item.get("name"), item.get("entry"), item.get("binary"), item.get("files")
    try:
        check_name(name)
    except ValueError as exc:
        raise ArchiveError(f"invalid extension name in the archive: {exc}") from None
    if not isinstance(entry, str) or not _ENTRY_DIR.fullmatch(entry):
        raise ArchiveError(f"{name}: invalid entry directory {entry!r} in the archive")
    if binary not in (f"{name}.so", name):
        raise ArchiveError(f"{name}: invalid binary name {binary!r} in the archive")
    allowed = {binary, cache.MANIFEST, cache.BUILD_LOG}
    if not isinstance(files, dict) or binary not in files or cache.MANIFEST not in files or set(files) - allowed:
        raise ArchiveError(f"{name}/{entry}: unexpected file list {sorted(files or {})} in the archive")
    for fname, meta in files.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("size"), int)
                and isinstance(meta.get("sha256"), str) and len(meta["sha256"]) == 64):
            raise ArchiveError(f"{name}/{entry}: invalid size or sha256 for {fname} in the archive")
    return name, entry, binary, files


def _read_member(tar: tarfile.TarFile, arcname: str, size: int, sha256: str) -> bytes:
    try:
        member = tar.getmember(arcname)
    except KeyError:
        raise ArchiveError(f"{arcname} is listed in the index but missing from the archive") from None
    if not member.isreg() or member.size != size:
        raise ArchiveError(f"{arcname} is not a regular file of {size} bytes in the archive")
    f = tar.extractfile(member)
    data = f.read() if f else b""
    if _sha256(data) != sha256:
        raise ArchiveError(f"{arcname}: sha256 mismatch with the index, so the archive is corrupt")
    return data


def _install(root: str, name: str, entry: str, contents: dict[str, bytes], manifest: Manifest) -> str:
    """Publish one verified entry with the cache's own ``publish`` (temp dir, fsync, rename).
    'imported', or 'present' when a valid entry is there already (or another process won the race)."""
    layout = cache.Layout(root)
    name_dir = layout.name_dir(name)
    final = layout.entry_dir(name, manifest.key, manifest.headers_digest)
    if os.path.basename(final) != entry:
        raise ArchiveError(f"{name}/{entry}: its manifest's key names another entry ({os.path.basename(final)})")
    if cache.read_manifest(final) is not None:
        return "present"
    cache.ensure_dir(root, root)
    cache.ensure_dir(name_dir, root)
    cache.check_safe(name_dir)
    with tempfile.NamedTemporaryFile(prefix=".tmp-import-", dir=name_dir) as staged:
        staged.write(contents[manifest.binary])
        staged.flush()
        try:
            cache.publish(layout, name, manifest.key, manifest.headers_digest, staged.name, manifest.binary, manifest,
                          contents.get(cache.BUILD_LOG, b"").decode(errors="replace"))
        except CacheError:
            if cache.read_manifest(final) is None:
                raise
            return "present"  # another importer or builder published it meanwhile
    return "imported"


def import_(path: str, root: str | None = None, here: Here | None = None, dry_run: bool = False,
            places: Places | None = None) -> list[Outcome]:
    """Verify ``path`` against this machine and install the entries that fit (see the module doc);
    ``places``: where the sources of a load are (relative dependency records are checked there)."""
    root = root or settings_mod.current().cache_dir
    here = here or Here.detect()
    try:
        tar = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise ArchiveError(f"cannot read {path} as a cache archive: {exc}") from None
    outcomes = []
    with tar:
        index = _read_index(tar, path)
        for item in index["entries"]:
            name, entry, binary, files = _check_names(item)
            try:
                contents = {f: _read_member(tar, _member(name, entry, f), meta["size"], meta["sha256"])
                            for f, meta in files.items()}
                manifest = Manifest.from_json(json.loads(contents[cache.MANIFEST]), name)
                if manifest is None or manifest.binary != binary:
                    raise ArchiveError(f"{name}/{entry}: its manifest is invalid or names another binary")
                if manifest.binary_sha256 != files[binary]["sha256"]:
                    raise ArchiveError(f"{name}/{entry}: the binary's sha256 differs from its manifest's")
            except (ArchiveError, ValueError, tarfile.TarError, OSError) as exc:
                outcomes.append(Outcome(name, entry, "corrupt", str(exc)))
                continue
            d = verdict(manifest, here, places)
            if not d:
                outcomes.append(Outcome(name, entry, "skipped", d.reason))
            elif dry_run:
                present = cache.read_manifest(os.path.join(root, name, entry)) is not None
                outcomes.append(Outcome(name, entry, "present" if present else "would import"))
            else:
                try:
                    status = _install(root, name, entry, contents, manifest)
                except ArchiveError as exc:
                    outcomes.append(Outcome(name, entry, "corrupt", str(exc)))
                    continue
                outcomes.append(Outcome(name, entry, status))
    return outcomes
