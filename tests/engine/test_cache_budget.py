"""The cache's cap, OPFORGE_CACHE_MAX_SIZE (engine/budget.py, engine/usage.py).

Builds go through the engine's real cold path (``ensure_built``: ninja, the lock, publish, then the
cap) with a compiler that writes its outputs without compiling (g++ answers the probes), so a build
takes a fraction of a second and its binary has the size a test asks for; one test compiles for real,
through ``opforge.load``."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

import filelock
import pytest
from conftest import FAKE_CXX as FAKE  # noqa: E402

from opforge import settings
from opforge.cli import output
from opforge.cli.main import main
from opforge.engine import budget, cache, inventory, jit, pch_store, usage
from opforge.engine.key import make_spec
from opforge.engine.progress import Reporter

DAY = 86400.0
KB = 1024


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A cache whose builds make 100 KiB binaries, capped at 350 KiB; this process has found no entry yet."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ on PATH (the fake compiler's probes)")
    cxx = tmp_path / "fakecxx"
    cxx.write_text(f"#!{sys.executable}\n{FAKE}")
    cxx.chmod(0o755)
    for k, v in {"CXX": str(cxx), "FAKE_BINARY_BYTES": str(100 * KB), "OPFORGE_CACHE_DIR": str(tmp_path / "cache"),
                 "OPFORGE_CACHE_MAX_SIZE": "350K", "OPFORGE_PCH": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(usage, "found", set())
    (tmp_path / "src").mkdir()
    return tmp_path


def spec_of(tmp, name: str):
    src = tmp / "src" / f"{name}.cpp"
    if not src.exists():
        src.write_text(f"int {name}() {{ return 1; }}\n")
    return make_spec(settings.current(), name, [str(src)], ["-O1"], None, None, None, None, True, False)


def build(tmp, name: str):
    return jit.ensure_built(spec_of(tmp, name), settings.current(), Reporter(False))


def set_used(entry_dir: str, ago_s: float) -> None:
    t = time.time() - ago_s
    os.utime(os.path.join(entry_dir, cache.MANIFEST), (t, t))


def entry_names(tmp) -> set[str]:
    return {r.name for r in inventory.entries(str(tmp / "cache"))}


def total(tmp) -> int:
    items, _ = budget.scan(str(tmp / "cache"))
    return sum(i.size for i in items)


def new_process(monkeypatch) -> None:
    """What a fresh process knows: no entry found yet."""
    monkeypatch.setattr(usage, "found", set())


def built(tmp, monkeypatch, names, used_days_ago) -> list[cache.Entry]:
    """Entries of ``names`` (no cap while building), last used that many days ago, and no build dir: each
    build's dir holds as much as its entry (ninja's copy of the binary), which a test of the order between
    entries leaves out."""
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "0")
    entries = [build(tmp, n) for n in names]
    for e, days in zip(entries, used_days_ago):
        set_used(e.path, days * DAY)
    for item in inventory.leftovers(str(tmp / "cache")):
        if item.what == "build dir":
            cache.discard(item.path)
    monkeypatch.delenv("OPFORGE_CACHE_MAX_SIZE")
    return entries


# --- the cap after a build ------------------------------------------------------------------------

def test_over_the_cap_the_least_recently_used_go_after_the_next_build(fake, monkeypatch):
    a, b, c, d = built(fake, monkeypatch, ("bud_a", "bud_b", "bud_c", "bud_d"), (5, 4, 3, 2))
    new_process(monkeypatch)
    assert jit.find_entry(cache.Layout(str(fake / "cache")), spec_of(fake, "bud_a"), Reporter(False)) is not None
    assert time.time() - usage.last_used(a.path) < 60  # a load found it: the most recently used now
    new_process(monkeypatch)  # (and the process that found it is gone)
    assert 400 * KB < total(fake) < 450 * KB  # 4 entries: over 350 KiB already, but nothing is built

    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "450K")
    build(fake, "bud_e")  # + an entry and its build dir (ninja's copy): 6 x 100 KiB, so two go
    assert entry_names(fake) == {"bud_a", "bud_d", "bud_e"}  # b then c, the least recently used
    assert not os.path.exists(b.path) and not os.path.exists(c.path)
    assert total(fake) <= 450 * KB


def test_the_entries_this_process_found_or_built_are_kept(fake, monkeypatch, capfd):
    built(fake, monkeypatch, ("keep_b", "keep_c"), (2, 1))
    new_process(monkeypatch)
    built(fake, monkeypatch, ("keep_a",), (9,))  # the least recently used by far, but this process built it
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "450K")
    build(fake, "keep_d")
    assert entry_names(fake) == {"keep_a", "keep_c", "keep_d"}  # keep_b went instead
    # A cap below what this process holds: none of it goes, and a notice names the setting
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "150K")
    capfd.readouterr()
    build(fake, "keep_e")
    assert entry_names(fake) == {"keep_a", "keep_d", "keep_e"}
    err = capfd.readouterr().err
    assert re.search(r"holds 3\d\d\.\d KiB, over OPFORGE_CACHE_MAX_SIZE \(150\.0 KiB\), all of it in use now or "
                     r"just built; raise OPFORGE_CACHE_MAX_SIZE \(e\.g\. OPFORGE_CACHE_MAX_SIZE=1G\)", err), err
    plan = budget.enforce(str(fake / "cache"), 150 * KB, Reporter(False))
    assert plan is not None and plan.over and plan.remove == ()


def test_no_cap_removes_nothing(fake, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "0")
    for n in ("nocap_a", "nocap_b", "nocap_c", "nocap_d", "nocap_e"):
        build(fake, n)
    assert len(entry_names(fake)) == 5 and total(fake) > 500 * KB


def test_a_failure_of_the_cap_never_fails_the_build(fake, monkeypatch, capfd):
    def broken(root, name=None):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(inventory, "entries", broken)
    entry = build(fake, "broken_inv")
    assert os.path.exists(entry.binary)
    err = capfd.readouterr().err
    assert "could not keep the cache" in err and "OPFORGE_CACHE_MAX_SIZE" in err and "Input/output error" in err


# --- what is never removed ------------------------------------------------------------------------

def _blob(path, size: int, ago_s: float) -> None:
    """A dir holding ``size`` bytes, last written ``ago_s`` ago."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "blob"), "wb") as f:
        f.write(b"x" * size)
    t = time.time() - ago_s
    for p in (os.path.join(path, "blob"), path):
        os.utime(p, (t, t))


def _pch(base, key: str, size: int, used: float) -> pch_store.Pch:
    p = pch_store.Pch(str(base), key, (), ())
    os.makedirs(base, exist_ok=True)
    with open(p.header, "w") as f:
        f.write("#include <torch/extension.h>\n")
    with open(p.gch, "wb") as f:
        f.write(b"g" * size)
    with open(p.path(".json"), "w") as f:
        json.dump({"last_used": used, "builds": 2}, f)
    return p


def test_nothing_a_running_build_holds_is_removed(fake, monkeypatch):
    build(fake, "held")  # the extension's dir, an entry, a build dir
    new_process(monkeypatch)
    root = fake / "cache"
    ext = root / "held"
    (built_dir,) = [p for p in ext.iterdir() if p.name.startswith(".build-") and p.is_dir()]
    old = 30 * DAY
    busy_dir, idle_dir = ext / ".build-busy0000000000", ext / ".build-idle0000000000"
    _blob(busy_dir, 200 * KB, old)
    _blob(idle_dir, 200 * KB, old)
    _blob(ext / ".src-0123456789abcdef", 200 * KB, old)  # load_inline's sources, while a build of theirs runs
    _blob(ext / ".tmp-live", 200 * KB, 60)  # a live process's staging
    _blob(ext / ".tmp-dead", 200 * KB, 2 * 3600)  # a killed one's
    making = _pch(root / ".pch", "making", 200 * KB, time.time() - old)
    idle_pch = _pch(root / ".pch", "idle", 200 * KB, time.time() - old)
    with open(making.path(".pending"), "w") as f:
        f.write("{}")

    (entry,) = inventory.entries(str(root))

    with filelock.FileLock(str(busy_dir) + ".lock"), filelock.FileLock(making.path(".lock")):
        plan = budget.enforce(str(root), 1, Reporter(False))
        removed = {i.path for i in plan.remove}
        assert removed == {str(idle_dir), str(ext / ".tmp-dead"), idle_pch.gch, str(built_dir), entry.path}
        for kept in (busy_dir, ext / ".src-0123456789abcdef", ext / ".tmp-live"):
            assert kept.exists(), kept
        assert os.path.exists(making.gch) and os.path.exists(making.path(".pending"))
        assert not idle_dir.exists() and not (ext / ".tmp-dead").exists() and not os.path.exists(idle_pch.gch)
        assert plan.over  # what is held is over a cap of 1 byte
    plan = budget.enforce(str(root), 1, Reporter(False))  # the build is over: they go
    assert {i.path for i in plan.remove} >= {str(busy_dir), str(ext / ".src-0123456789abcdef"), making.gch}
    assert (ext / ".tmp-live").exists()  # still young


# --- recording use --------------------------------------------------------------------------------

def _entry(tmp, name: str, key: str, dir_ago_s: float, used_ago_s: float) -> cache.Entry:
    path = tmp / "cache" / name / key
    path.mkdir(parents=True)
    (path / cache.MANIFEST).write_text("{}")
    set_used(str(path), used_ago_s)
    t = time.time() - dir_ago_s
    os.utime(path, (t, t))
    return cache.Entry(str(path), None)


def test_a_use_is_marked_at_most_once_a_day_with_one_stat(tmp_path, monkeypatch):
    entry = _entry(tmp_path, "use", "k" * 16 + "-aaaaaaaa", 3 * DAY, 2 * DAY)
    manifest = os.path.join(entry.path, cache.MANIFEST)
    dir_mtime = os.stat(entry.path).st_mtime_ns
    calls = {"stat": 0, "utime": 0}
    real_stat, real_utime = os.stat, os.utime

    def counted(name, real):
        def call(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return call

    monkeypatch.setattr(usage.os, "stat", counted("stat", real_stat))
    monkeypatch.setattr(usage.os, "utime", counted("utime", real_utime))
    for _ in range(3):
        usage.note_use(entry)
    assert calls == {"stat": 3, "utime": 1}  # one stat a load; the mark once
    monkeypatch.undo()
    assert time.time() - os.stat(manifest).st_mtime < 60
    assert os.stat(entry.path).st_mtime_ns == dir_mtime  # candidates' order (the dir's mtime) untouched

    set_used(entry.path, DAY - 3600)  # marked 23 h ago: not again
    before = os.stat(manifest).st_mtime_ns
    usage.note_use(entry)
    assert os.stat(manifest).st_mtime_ns == before


def test_marking_keeps_candidates_newest_build_first(tmp_path):
    key = "c" * 16
    older = _entry(tmp_path, "cand", key + "-aaaaaaaa", 5 * DAY, 5 * DAY)
    newer = _entry(tmp_path, "cand", key + "-bbbbbbbb", 1 * DAY, 1 * DAY)
    layout = cache.Layout(str(tmp_path / "cache"))
    assert layout.candidates("cand", key * 4) == [newer.path, older.path]
    usage.note_use(older)
    assert layout.candidates("cand", key * 4) == [newer.path, older.path]
    assert usage.last_used(older.path) > usage.last_used(newer.path)


def test_a_read_only_cache_still_loads(tmp_path, monkeypatch):
    entry = _entry(tmp_path, "ro", "r" * 16 + "-aaaaaaaa", 3 * DAY, 3 * DAY)

    def refuse(*a, **k):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(usage.os, "utime", refuse)
    usage.note_use(entry)  # no error


# --- the setting and the listing ------------------------------------------------------------------

@pytest.mark.parametrize("value, size", [(None, 10 * 2**30), ("", 10 * 2**30), ("20G", 20 * 2**30),
                                         ("500M", 500 * 2**20), ("1.5g", 3 * 2**29), ("4096", 4096), ("0", 0)])
def test_the_setting(value, size):
    env = {} if value is None else {"OPFORGE_CACHE_MAX_SIZE": value}
    assert settings.current(env).cache_max_size == size


@pytest.mark.parametrize("value", ["lots", "-1G", "10X", "1e9", "G"])
def test_a_bad_value_names_the_variable(value):
    with pytest.raises(ValueError, match=rf"^OPFORGE_CACHE_MAX_SIZE='{re.escape(value)}' is not a size; give e\.g\. "
                                         r"OPFORGE_CACHE_MAX_SIZE=2G .*\(0: no cap\)$"):
        settings.current({"OPFORGE_CACHE_MAX_SIZE": value})


def test_cache_list_shows_the_total_against_the_cap(fake, monkeypatch, capsys):
    build(fake, "list_a")
    build(fake, "list_b")
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "1G")
    assert main(["cache", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_size"] == 2**30
    assert data["total"] == sum(e["size"] for e in data["entries"]) + sum(i["size"] for i in data["leftovers"])
    assert data["total"] == total(fake) and data["total"] > 200 * KB
    assert all(e["unused_days"] < 0.01 for e in data["entries"])
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert f"total: {output.size(data['total'])} of 1.0 GiB (OPFORGE_CACHE_MAX_SIZE" in out
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "0")
    assert main(["cache", "list"]) == 0
    assert "(OPFORGE_CACHE_MAX_SIZE=0: no cap)" in capsys.readouterr().out
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "big")
    assert main(["cache", "list"]) == 2
    assert "OPFORGE_CACHE_MAX_SIZE='big' is not a size" in capsys.readouterr().err


# --- end to end, compiled for real ----------------------------------------------------------------

def test_a_real_load_keeps_the_cap(cache_dir, make_pymod, counting_cxx, monkeypatch, capfd):
    import opforge

    monkeypatch.setattr(usage, "found", set())
    monkeypatch.setenv("OPFORGE_CACHE_MAX_SIZE", "1K")  # below any entry: only what a process holds stays
    first = opforge.load("cap_e2e_a", [str(make_pymod("cap_e2e_a", 1))])
    assert first.value() == 1
    assert opforge.load("cap_e2e_b", [str(make_pymod("cap_e2e_b", 2))]).value() == 2
    assert entry_names(cache_dir.parent) == {"cap_e2e_a", "cap_e2e_b"}  # this process loaded both
    assert "over OPFORGE_CACHE_MAX_SIZE" in capfd.readouterr().err
    new_process(monkeypatch)
    assert opforge.load("cap_e2e_c", [str(make_pymod("cap_e2e_c", 3))]).value() == 3
    assert entry_names(cache_dir.parent) == {"cap_e2e_c"}
    assert first.value() == 1  # a binary already mapped stays usable
    assert len(counting_cxx.compiles()) == 3
