"""Faults injected into builds, publishes and loads; after each, the next load must succeed,
no load may hang, and no load may return a torn binary.

The default run (CI) takes a few rounds of each; ``-m slow`` runs the full counts
(``docs/reliability.md``). Modules are plain CPython-API ones (well under a second to build).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, pymod_source

import opforge
from opforge.engine import cache, importer, inventory

from .conftest import LOAD


def _write(path, name: str, value: int, header: str | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = f'#include "{header}"' if header else ""
    path.write_text(pymod_source(name, "VALUE" if header else value, extra=extra))
    return str(path)


def _assert_clean(tally, what: str) -> None:
    row = tally.row
    assert row["hangs"] == 0, f"{what}: {row['hangs']} hung"
    assert row["torn"] == 0, f"{what}: {row['torn']} torn loads"
    assert row["loads_ok"] == row["loads"], f"{what}: {row['loads'] - row['loads_ok']} loads failed: {tally.err}"


# --------------------------------------------------------------------------- kill -9

@pytest.mark.parametrize("rounds", [pytest.param(4, id="4-rounds"),
                                    pytest.param(20, id="20-rounds", marks=pytest.mark.slow)])
def test_kill_9_at_random_moments_of_a_build(cache_dir, tmp_path, tally, rounds):
    """Each round edits the source (a new build under the same lock and build dir), kills the
    loading process group at a random moment, then loads in a fresh process."""
    t = tally("kill -9 during a build")
    rng = random.Random(1234)
    src = tmp_path / "src" / "k9.cpp"
    for i in range(rounds):
        _write(src, "k9", i)
        proc = subprocess.Popen([sys.executable, "-c", LOAD, "k9", str(src), str(i)],
                                env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0.2, 3.0))  # from interpreter start-up to after the publish
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        t.fault()
        result = t.load("k9", src, i)
        assert result is not None, t.err
    _assert_clean(t, "kill -9")
    rows = inventory.verify(str(cache_dir), remove=False)
    assert all(r.status == "ok" for r in rows), rows


# --------------------------------------------------------------------------- a full disk

def test_enospc_while_publishing_is_a_clear_error_and_caches_nothing(cache_dir, make_pymod, monkeypatch, tally):
    t = tally("ENOSPC (injected) while publishing")
    src = make_pymod("nospace_pub", 3)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache.shutil, "copyfile", full)
    with pytest.raises(opforge.CacheError, match="No space left on device.*free some space"):
        opforge.load("nospace_pub", [str(src)])
    t.fault()
    assert [n for n in os.listdir(cache_dir / "nospace_pub") if not n.startswith(".build-")] == []
    monkeypatch.undo()
    assert t.load("nospace_pub", src, 3, env={"OPFORGE_CACHE_DIR": str(cache_dir)}) is not None, t.err
    _assert_clean(t, "ENOSPC publish")


def _mount_tmpfs(path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'not root'})")


def _fill(path, leave: int) -> None:
    """Fill the filesystem at ``path`` (a filler file, written until ENOSPC), then free ``leave`` bytes."""
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    os.truncate(path / "filler", max(0, os.path.getsize(path / "filler") - leave))


@pytest.mark.parametrize("rounds", [pytest.param(3, id="3-rounds"),
                                    pytest.param(12, id="12-rounds", marks=pytest.mark.slow)])
def test_a_full_disk_at_every_stage(tmp_path, tally, rounds):
    """The cache on a small tmpfs, filled to leave 0..96 KiB: the build, the link or the publish
    runs out of space. The load fails with a clear error, then succeeds once there is room."""
    t = tally("ENOSPC (a full tmpfs) during the build or the publish")
    root = tmp_path / "tmpfs"
    _mount_tmpfs(root, "4m")
    try:
        env = {"OPFORGE_CACHE_DIR": str(root / "cache")}
        failed = 0
        for i in range(rounds):
            src = _write(tmp_path / "src" / f"full_{i}.cpp", f"full_{i}", i)
            _fill(root, leave=i * (96 * 1024) // max(1, rounds - 1))
            r = subprocess.run([sys.executable, "-c", f"import opforge; opforge.load('full_{i}', [{src!r}])"],
                               env=dict(os.environ, PYTHONPATH=ROOT, **env), capture_output=True, text=True,
                               timeout=120, check=False)
            t.fault()
            if r.returncode != 0:  # a clear error, from opforge, that says what happened
                assert "No space left" in r.stderr and "opforge.errors." in r.stderr, r.stderr[-2000:]
                failed += 1
            os.unlink(root / "filler")
            assert t.load(f"full_{i}", src, i, env=env) is not None, t.err
        assert failed >= 1  # at least the round with no space left hit the fault
        rows = inventory.verify(str(root / "cache"), remove=False)
        assert rows and all(r.status == "ok" for r in rows), rows
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
    _assert_clean(t, "full disk")


# --------------------------------------------------------------------------- a read-only cache

@contextlib.contextmanager
def _read_only(path):
    if os.geteuid() != 0:
        for d, _, _ in os.walk(path):
            os.chmod(d, 0o500)
        try:
            yield
        finally:
            for d, _, _ in os.walk(path):
                os.chmod(d, 0o700)
        return
    r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, check=False)
    if r.returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_cache_serves_its_builds_and_explains_a_miss(cache_dir, make_pymod, tmp_path, tally):
    t = tally("a read-only cache")
    src = make_pymod("ro_hit", 9)
    assert t.load("ro_hit", src, 9) is not None, t.err
    other = make_pymod("ro_miss", 1)
    with _read_only(cache_dir):
        t.fault()
        assert t.load("ro_hit", src, 9) is not None, t.err
        r = subprocess.run([sys.executable, "-c", f"import opforge; opforge.load('ro_miss', [{str(other)!r}])"],
                           env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60,
                           check=False)
        assert r.returncode != 0 and "opforge.errors.CacheError" in r.stderr and "OPFORGE_CACHE_DIR" in r.stderr
    _assert_clean(t, "read-only")


# --------------------------------------------------------------------------- manifests and mtimes

@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "wrong types", "another name", "escapes"])
def test_a_damaged_manifest_means_a_rebuild(cache_dir, make_pymod, tally, damage):
    t = tally("a corrupt or truncated manifest.json")
    name = "man_" + damage.replace(" ", "_")
    src = make_pymod(name, 4)
    assert t.load(name, src, 4) is not None, t.err
    (entry,) = [n for n in os.listdir(cache_dir / name) if not n.startswith(".")]
    mpath = cache_dir / name / entry / "manifest.json"
    m = json.loads(mpath.read_text())
    text = {
        "truncated": mpath.read_text()[: len(mpath.read_text()) // 2],
        "empty": "",
        "garbage": "\x00\xff not json",
        "wrong types": json.dumps(dict(m, deps="all of them", binary_size="big")),
        "another name": json.dumps(dict(m, name="other")),
        "escapes": json.dumps(dict(m, binary="../../../../tmp/evil.so")),
    }[damage]
    mpath.write_text(text)
    t.fault()
    assert t.load(name, src, 4) is not None, t.err
    assert "missing or corrupt manifest; rebuilding" in t.err
    _assert_clean(t, "manifest")


def test_dependency_mtimes_in_the_future_and_the_past(cache_dir, tmp_path, counting_cxx, tally):
    """A header stamped a year ahead loads warm (same bytes); then new bytes stamped an hour in
    the past, older than the object files, must still rebuild (ninja alone would skip it)."""
    t = tally("a dependency mtime in the future (and in the past)")
    header = tmp_path / "src" / "value.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define VALUE 1\n")
    src = _write(tmp_path / "src" / "mtime_dep.cpp", "mtime_dep", 0, header="value.h")
    assert t.load("mtime_dep", src, 1) is not None, t.err
    year = time.time() + 365 * 86400
    os.utime(header, (year, year))
    t.fault()
    counting_cxx.clear()
    assert t.load("mtime_dep", src, 1) is not None, t.err
    assert counting_cxx.compiles() == []  # the stat moved, the bytes did not: warm
    header.write_text("#define VALUE 2\n")
    past = time.time() - 3600
    os.utime(header, (past, past))
    t.fault()
    assert t.load("mtime_dep", src, 2) is not None, t.err
    assert len(counting_cxx.compiles()) == 1
    _assert_clean(t, "mtimes")


# --------------------------------------------------------------------------- crowds

_LOOP = r"""
import json, sys
import opforge
from opforge.engine import importer
names, srcs, rounds = sys.argv[1].split(","), sys.argv[2].split(","), int(sys.argv[3])
ok = 0
for i in range(rounds):
    for k, (name, src) in enumerate(zip(names, srcs)):
        importer._LOADED.clear()  # a real lookup each time, not the process's memo
        mod = opforge.load(name, [src])
        assert mod.value() == k + 1, (name, mod.value())
        ok += 1
print(json.dumps({"ok": ok}))
"""


@pytest.mark.parametrize("rounds", [pytest.param(10, id="10-rounds"),
                                    pytest.param(60, id="60-rounds", marks=pytest.mark.slow)])
def test_cache_clean_while_others_load(cache_dir, tmp_path, tally, rounds):
    """4 processes load 2 kernels in a loop (a real cache lookup each time) while the cache is
    cleaned every 0.1 s until they are done."""
    t = tally("`opforge cache clean` while 4 processes load")
    names = ["cl_a", "cl_b"]
    srcs = [_write(tmp_path / "src" / f"{n}.cpp", n, k + 1) for k, n in enumerate(names)]
    procs = [subprocess.Popen([sys.executable, "-c", _LOOP, ",".join(names), ",".join(srcs), str(rounds)],
                              env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    deadline = time.monotonic() + 300
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                t.row["hangs"] += 1
                pytest.fail("the loaders did not finish in 300 s")
            time.sleep(0.1)
            inventory.clean(str(cache_dir))
            t.fault()
        for p in procs:
            out, err = p.communicate()
            t.row["loads"] += rounds * len(names)
            assert p.returncode == 0, err[-3000:]
            t.row["loads_ok"] += json.loads(out.strip().splitlines()[-1])["ok"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert t.row["faults"] >= 10
    _assert_clean(t, "clean while loading")


@pytest.mark.parametrize("n", [pytest.param(8, id="8-loaders"),
                               pytest.param(16, id="16-loaders", marks=pytest.mark.slow)])
def test_concurrent_loaders_across_four_kernels(cache_dir, tmp_path, counting_cxx, tally, n):
    t = tally("16 concurrent loaders across 4 kernels")
    srcs = [_write(tmp_path / "src" / f"crowd4_{k}.cpp", f"crowd4_{k}", k) for k in range(4)]
    go = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.005)\n" + LOAD
    procs = [subprocess.Popen([sys.executable, "-c", code, f"crowd4_{i % 4}", srcs[i % 4], str(i % 4)],
                              env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(n)]
    time.sleep(1.0)
    go.touch()
    t.fault()
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            t.row["loads"] += 1
            assert p.returncode == 0, err[-3000:]
            res = json.loads(out.strip().splitlines()[-1])
            t.row["torn"] += res["torn"]
            t.row["loads_ok"] += not res["torn"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    compiles = counting_cxx.compiles()
    for k in range(4):
        assert sum(f"crowd4_{k}.cpp" in c for c in compiles) == 1, compiles
    _assert_clean(t, "crowd")


def test_publish_errors_leave_no_temp_dirs(cache_dir, make_pymod, monkeypatch):
    """A publish that fails half-way (the manifest write) removes its temp dir."""
    src = make_pymod("pub_tmp", 2)

    def boom(path):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(cache, "_fsync_file", boom)
    with pytest.raises(opforge.CacheError, match="Input/output error"):
        opforge.load("pub_tmp", [str(src)])
    monkeypatch.undo()
    assert [n for n in os.listdir(cache_dir / "pub_tmp") if n.startswith(".tmp-")] == []
    importer._LOADED.clear()
    assert opforge.load("pub_tmp", [str(src)]).value() == 2
