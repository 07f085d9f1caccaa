"""torch's facts for the build key, without importing torch where the cache has them recorded.

The key holds :class:`~opforge.compat.TorchFacts` (version, git hash, CUDA/HIP, C++ ABI, where torch
lies). ``compat.torch_facts()`` imports torch for them: 2.5-4 s in a process that has not imported it
yet, which is every warm load of a plain Python module in a fresh interpreter (a CLI command, a
worker, the tests' subprocesses). So the facts are recorded in the cache under torch's identity, as
``platform`` memoises a tool's ``--version`` under the tool's (``<cache>/.tools/``):

* the identity is where torch lies and the file identity (device, inode), size and mtime of the files
  the facts come from (``version.py``: version, git hash, CUDA, HIP; the ``_C`` extension and
  ``libtorch_python`` / ``libc10``: the C++ ABI), and the running Python (tag, extension suffix,
  machine). Reinstalling or upgrading torch replaces those files, so the identity, and the record read,
  change with it. One ``stat`` a file, following links (a ``realpath`` of each cost a warm load 0.1 ms);
* a process that has imported torch reads the record and is done when it says what the imported
  torch says; else it records its facts, only when the ``version.py`` on disk still says what the
  imported torch says (torch was not replaced under a running process);
* a process that has not imported torch reads the record of the torch it would import
  (``importlib.util.find_spec``: nothing is imported), and imports torch only when there is none;
* beside the facts, torch's answers for a CPU build (include dirs, library dirs, ``-std=``:
  :func:`cpu_build`), so a fresh process's cold build of a CPU extension doesn't import torch either.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading

from .. import compat
from ..files import atomic_write
from ..process import forgets

#: The files under torch's directory whose bytes the facts come from.
_FILES = ("version.py", "__init__.py", "_C" + importlib.machinery.EXTENSION_SUFFIXES[0],
          os.path.join("lib", "libtorch_python.so"), os.path.join("lib", "libc10.so"))

_SEEN: dict[str, compat.TorchFacts] = {}
"""Cache dir -> the facts recorded (or read) there by this process: one look a process and cache."""
_LOCK = threading.Lock()


@forgets
def _forget() -> None:
    with _LOCK:
        _SEEN.clear()


def identity(root: str) -> str:
    """What the recorded facts of the torch installed at ``root`` are valid for.

    >>> identity("/nowhere").startswith("/nowhere|version.py:-")
    True
    """
    parts = [root]
    for rel in _FILES:
        try:
            st = os.stat(os.path.join(root, rel))
            parts.append(f"{rel}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{rel}:-")
    parts += [sys.implementation.cache_tag or "", importlib.machinery.EXTENSION_SUFFIXES[0], os.uname().machine]
    return "|".join(parts)


def record_path(cache_dir: str, ident: str) -> str:
    return os.path.join(cache_dir, ".tools", "torch-" + hashlib.sha256(ident.encode()).hexdigest()[:24] + ".json")


def _installed_root() -> str | None:
    """Where ``import torch`` would load torch from (the real path), without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None
    return os.path.dirname(os.path.realpath(spec.origin))


def _read(path: str) -> compat.TorchFacts | None:
    try:
        with open(path, encoding="utf-8") as f:
            return compat.TorchFacts.from_json(json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _on_disk_version(root: str) -> dict:
    """``version.py``'s names as the file now says them (torch's own file; the import would run it too)."""
    names: dict = {}
    try:
        with open(os.path.join(root, "version.py"), encoding="utf-8") as f:
            exec(compile(f.read(), "version.py", "exec"), names)  # noqa: S102 - torch's own, as import would
    except Exception:  # noqa: BLE001 - unreadable: not recorded
        return {}
    return names


def _still_installed(facts: compat.TorchFacts) -> bool:
    """Does the torch on disk at ``facts.root`` say what the imported one said?"""
    on_disk = _on_disk_version(facts.root)
    return (str(on_disk.get("__version__", "")), str(on_disk.get("git_version", "")), on_disk.get("cuda"),
            on_disk.get("hip")) == (facts.version, facts.git_version, facts.cuda, facts.hip)


def _record(path: str, facts: compat.TorchFacts) -> None:
    if _read(path) != facts:
        write_record(path, facts.to_json())


def write_record(path: str, data) -> None:
    """``data`` as JSON at ``path``, a record under the cache's ``.tools`` (its root and ``.tools`` made 0700, as
    the engine makes them, whatever the umask), atomically; an unwritable cache only costs the record."""
    try:
        for d in (os.path.dirname(os.path.dirname(path)), os.path.dirname(path)):  # the cache's root first, as
            os.makedirs(d, mode=0o700, exist_ok=True)  # the engine makes it: 0700 whatever the umask
        atomic_write(path, json.dumps(data, sort_keys=True), durable=False)
    except OSError:
        pass


def cpu_build(cache_dir: str, facts: compat.TorchFacts, ask_torch) -> dict:
    """torch's answers for a CPU build (``ask_torch()``: its include dirs, library dirs and ``-std=``, which
    import torch), recorded beside ``facts`` under the same identity: a fresh process builds a CPU
    extension without importing torch. Recorded only from a torch that disk still holds."""
    path = record_path(cache_dir, identity(facts.root))[: -len(".json")] + ".cpu-build.json"
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        recorded = None
    if not (isinstance(recorded, dict) and isinstance(recorded.get("std"), str)
            and all(isinstance(recorded.get(k), list) and all(isinstance(p, str) for p in recorded[k])
                    for k in ("include", "lib"))):
        recorded = None
    if recorded is not None and "torch" not in sys.modules:
        return recorded
    data = ask_torch()
    if data != recorded and _still_installed(facts):
        write_record(path, data)
    return data


def torch_facts(cache_dir: str) -> compat.TorchFacts:
    """``compat.torch_facts()``, from ``cache_dir``'s record when this process has not imported torch
    and the record's identity is the installed torch's; recorded there otherwise."""
    with _LOCK:
        found = _SEEN.get(cache_dir)
    if found is not None:
        return found
    if "torch" not in sys.modules:
        root = _installed_root()
        path = record_path(cache_dir, identity(root)) if root else None
        found = _read(path) if path else None
        if found is not None and found.root == root:
            with _LOCK:
                _SEEN[cache_dir] = found
            return found
        before = identity(root) if root else None
        facts = compat.torch_facts()  # imports torch
        if root == facts.root and identity(facts.root) == before:  # not replaced while it was imported
            _record(path, facts)
    else:
        facts = compat.torch_facts()
        path = record_path(cache_dir, identity(facts.root))
        if _read(path) != facts and _still_installed(facts):
            write_record(path, facts.to_json())
    with _LOCK:
        _SEEN[cache_dir] = facts
    return facts


__all__ = ["cpu_build", "identity", "record_path", "torch_facts", "write_record"]
