"""When the shared precompiled torch/extension.h is made, and the cap on its disk (engine/pch_store.py).

A build never pays for a PCH: the first build of a flag set runs the plain build's commands, the
second makes the PCH afterwards in a detached lowest-priority process, the third uses it. Driven
through the engine's real cold path (``ensure_built``: ninja, the lock, publish) with a compiler
that writes its outputs without compiling (GCC's own answers for the probes), so each build takes
milliseconds; the real GCC PCH is built and used in test_load.py."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from conftest import FAKE_CXX as FAKE  # noqa: E402

from opforge import settings
from opforge.engine import jit, pch_store
from opforge.engine.key import make_spec
from opforge.engine.lock import BuildLock
from opforge.engine.progress import Reporter

SOURCE = "// an extension\n#include <torch/extension.h>\nint f() { return 1; }\n"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A cache, CXX set to the fake compiler, its log; PCH on (auto) with a cap of 1 MiB."""
    cxx = tmp_path / "fakecxx"
    cxx.write_text(f"#!{sys.executable}\n{FAKE}")
    cxx.chmod(0o755)
    log = tmp_path / "cxx.log"
    log.write_text("")
    for k, v in {"CXX": str(cxx), "FAKE_CXX_LOG": str(log), "OPFORGE_CACHE_DIR": str(tmp_path / "cache"),
                 "OPFORGE_PCH": "auto", "OPFORGE_PCH_MAX_SIZE": "1M", "OPFORGE_CCACHE": "0"}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "src").mkdir()
    yield tmp_path
    assert pch_store.wait(str(tmp_path / "cache"), timeout=60)  # no maker left behind


def build(tmp, name: str, flags=("-O1",), text: str = SOURCE, where: str = "src"):
    src = tmp / where / f"{name}.cpp"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(text)
    s = settings.current()
    spec = make_spec(s, name, [str(src)], list(flags), None, None, None, None, True, False)
    return jit.ensure_built(spec, s, Reporter(False))


def calls(tmp, what: str) -> list[str]:
    lines = (tmp / "cxx.log").read_text().splitlines()
    return [ln for ln in lines if what in ln.split(" | ")[0].split()]


def compiles(tmp, name: str) -> list[str]:
    return [ln.split(" | ")[0] for ln in calls(tmp, "-c") if f"{name}.cpp" in ln]


def pch_dir(tmp):
    return tmp / "cache" / ".pch"


def test_a_first_build_runs_the_same_commands_as_with_the_pch_off(fake, monkeypatch, capfd):
    build(fake, "first")
    assert calls(fake, "c++-header") == []  # no PCH made, before or after
    assert not any(p.name.endswith((".gch", ".pending")) for p in pch_dir(fake).iterdir())
    (auto_compile,) = compiles(fake, "first")
    assert "-include" not in auto_compile
    monkeypatch.setenv("OPFORGE_PCH", "0")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(fake / "cache-off"))
    build(fake, "first")
    _, off_compile = compiles(fake, "first")
    assert auto_compile.replace(str(fake / "cache"), "CACHE") == off_compile.replace(str(fake / "cache-off"), "CACHE")
    assert "precompil" not in capfd.readouterr().err  # nothing said either


def test_the_second_build_of_a_flag_set_makes_it_in_the_background_for_the_third(fake, capfd):
    build(fake, "one")
    build(fake, "two")  # another extension, the same flags: the same PCH
    err = capfd.readouterr().err
    assert "in the background" in err and "lowest priority" in err
    assert all("-include" not in c for c in compiles(fake, "two"))  # it did not wait for it
    assert pch_store.wait(str(fake / "cache"), timeout=60)
    (made,) = calls(fake, "c++-header")
    assert made.endswith("nice=19")  # at the lowest priority
    (gch,) = pch_dir(fake).glob("*.h.gch")
    build(fake, "three")
    (third,) = compiles(fake, "three")
    assert f"-include {str(gch)[:-len('.gch')]}" in third
    record = json.loads(gch.with_name(gch.name.replace(".h.gch", ".json")).read_text())
    assert record["builds"] == 2 and record["size"] == 1000 and record["last_used"] > 0
    build(fake, "four", flags=("-O2",))  # other flags: another PCH, not made on its first build
    assert all("-include" not in c for c in compiles(fake, "four"))
    assert len(calls(fake, "c++-header")) == 1


def test_a_build_never_waits_for_a_maker_that_holds_the_lock(fake):
    build(fake, "one")
    p = _only_pch(fake)
    started = time.monotonic()
    with BuildLock(p.path(".lock"), "a slow PCH", 5, print):
        build(fake, "two")  # the second sighting: would start a maker, but one is at work
    assert time.monotonic() - started < 30
    assert calls(fake, "c++-header") == [] and not os.path.exists(p.path(".pending"))


def test_a_pch_that_fails_is_recorded_and_not_tried_again(fake, monkeypatch):
    monkeypatch.setenv("FAKE_PCH_FAIL", "1")
    build(fake, "one")
    build(fake, "two")
    assert pch_store.wait(str(fake / "cache"), timeout=60)
    assert len(calls(fake, "c++-header")) == 1
    p = _only_pch(fake)
    assert "no PCH for you" in pch_store.read_record(p)["failed"] and not os.path.exists(p.gch)
    build(fake, "three")
    assert pch_store.wait(str(fake / "cache"), timeout=60)
    assert len(calls(fake, "c++-header")) == 1 and all("-include" not in c for c in compiles(fake, "three"))


def test_eager_makes_it_before_the_first_build_and_uses_it(fake, monkeypatch, capfd):
    monkeypatch.setenv("OPFORGE_PCH", "eager")
    build(fake, "one")
    assert len(calls(fake, "c++-header")) == 1
    (only,) = compiles(fake, "one")
    assert "-include" in only
    assert "precompiling torch/extension.h before this build" in capfd.readouterr().err


def test_one_larger_than_the_cap_is_removed_and_not_made_again(fake, monkeypatch):
    monkeypatch.setenv("FAKE_PCH_BYTES", str(2 * 2**20))  # the cap is 1 MiB
    for name in ("one", "two", "three"):
        build(fake, name)
        assert pch_store.wait(str(fake / "cache"), timeout=60)
    assert len(calls(fake, "c++-header")) == 1
    p = _only_pch(fake)
    assert not os.path.exists(p.gch) and pch_store.read_record(p)["too_big"] is True


def _only_pch(tmp) -> pch_store.Pch:
    (record,) = pch_dir(tmp).glob("*.json")
    return pch_store.Pch(str(pch_dir(tmp)), record.name[: -len(".json")], (), ())


# -- the cap, on the store alone ----------------------------------------------------------------------

def _stored(base, key: str, size: int, used: float) -> pch_store.Pch:
    p = pch_store.Pch(str(base), key, (), ())
    base.mkdir(exist_ok=True)
    open(p.header, "w").write("#include <torch/extension.h>\n")
    open(p.gch, "wb").write(b"x" * size)
    open(p.path(".json"), "w").write(json.dumps({"last_used": used, "builds": 2}))
    return p


def test_the_least_recently_used_go_first_until_under_the_cap(tmp_path):
    base = tmp_path / ".pch"
    now = time.time()
    old, mid, new = (_stored(base, k, 400, now - age) for k, age in (("old", 300), ("mid", 200), ("new", 100)))
    (base / "legacy").mkdir()  # the layout before issue 33: <key>/torch_extension.h.gch, never used since
    (base / "legacy" / "torch_extension.h.gch").write_bytes(b"y" * 400)
    os.utime(base / "legacy", (now - 1000, now - 1000))
    assert [s.key for s in pch_store.stored(str(base))] == ["legacy", "old", "mid", "new"]
    removed = pch_store.evict(str(base), cap=900)
    assert removed == [str(base / "legacy"), old.gch]
    assert [s.key for s in pch_store.stored(str(base))] == ["mid", "new"]
    assert os.path.exists(old.header)  # a build that named it compiles on with the plain header
    assert not os.path.exists(old.path(".json"))  # its builds are forgotten: a second build makes it again


def test_eviction_skips_a_pch_being_made_and_takes_the_new_one_last(tmp_path):
    base = tmp_path / ".pch"
    now = time.time()
    busy = _stored(base, "busy", 500, now - 500)
    fresh = _stored(base, "fresh", 500, now - 900)  # older stamp, but it is the one just made
    other = _stored(base, "other", 500, now - 100)
    with BuildLock(busy.path(".lock"), "busy", 5, print):
        assert pch_store.evict(str(base), cap=1000, keep="fresh") == [other.gch]
        assert os.path.exists(busy.gch) and os.path.exists(fresh.gch)
        assert pch_store.evict(str(base), cap=600, keep="fresh") == [fresh.gch]  # the busy one can't go
    assert "too_big" not in pch_store.read_record(fresh)  # it fits alone: made again on a later build
    assert pch_store.evict(str(base), cap=499, keep="busy") == [busy.gch]
    assert pch_store.read_record(busy)["too_big"] is True


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), ("1", "auto"), ("auto", "auto"),
                                         ("eager", "eager"), ("0", "off"), ("off", "off")])
def test_the_setting(value, mode):
    env = {} if value is None else {"OPFORGE_PCH": value}
    assert settings.current(env).pch_mode == mode
    assert settings.current(env).pch_max_size == 2 * 2**30


@pytest.mark.parametrize("var, value", [("OPFORGE_PCH", "2"), ("OPFORGE_PCH_MAX_SIZE", "lots"),
                                        ("OPFORGE_PCH_MAX_SIZE", "-1G")])
def test_a_bad_value_names_the_fix(var, value):
    with pytest.raises(ValueError, match=f"{var}="):
        settings.current({var: value})


def test_cache_list_shows_them_and_clean_removes_those_not_being_made(tmp_path):
    from opforge.engine import inventory

    base = tmp_path / ".pch"
    now = time.time()
    idle, busy = _stored(base, "idle", 300, now - 86400 * 3), _stored(base, "busy", 200, now)
    found = {item.path: item for item in inventory.leftovers(str(tmp_path)) if item.what == "precompiled header"}
    assert set(found) == {idle.gch, busy.gch}
    assert found[idle.gch].size == 300 and 2.9 < found[idle.gch].age_days < 3.1  # its age: since last used
    assert not found[busy.gch].in_use
    with BuildLock(busy.path(".lock"), "busy", 5, print):
        assert [i.in_use for i in inventory.leftovers(str(tmp_path)) if i.path == busy.gch] == [True]
        done = inventory.clean(str(tmp_path))
    assert done.removed == [idle.gch] and done.in_use == [busy.gch] and done.freed == 300
    assert not os.path.exists(idle.gch) and os.path.exists(busy.gch)


def test_a_pch_others_could_have_written_is_not_used(fake, capfd):
    build(fake, "one")
    build(fake, "two")
    assert pch_store.wait(str(fake / "cache"), timeout=60)
    (gch,) = pch_dir(fake).glob("*.h.gch")
    gch.chmod(0o666)  # the compiler would run what is in it
    build(fake, "three")
    assert all("-include" not in c for c in compiles(fake, "three"))
    assert f"building without the precompiled header {gch}" in capfd.readouterr().err


def test_one_maker_at_a_time(fake, monkeypatch):
    """Each maker takes a core and 1-2 GB: while one works, another flag set's second build starts none
    (its next build will)."""
    build(fake, "one")
    build(fake, "other_one", flags=("-O2",))
    busy = _only_pch_for(fake, "-O1")
    open(busy.path(".pending"), "w").write("{}")  # a maker on its way (fresh marker)
    build(fake, "other_two", flags=("-O2",))
    assert calls(fake, "c++-header") == []
    os.unlink(busy.path(".pending"))
    build(fake, "other_three", flags=("-O2",))
    assert pch_store.wait(str(fake / "cache"), timeout=60)
    assert len(calls(fake, "c++-header")) == 1 and "-O2" in calls(fake, "c++-header")[0]


def _only_pch_for(tmp, flag: str) -> pch_store.Pch:
    for record in pch_dir(tmp).glob("*.json"):
        if flag in json.loads(record.read_text())["flags"]:
            return pch_store.Pch(str(pch_dir(tmp)), record.name[: -len(".json")], (), ())
    raise AssertionError(flag)


def test_eager_keeps_the_cap_and_does_not_retry_a_failure(fake, monkeypatch):
    monkeypatch.setenv("OPFORGE_PCH", "eager")
    monkeypatch.setenv("FAKE_PCH_BYTES", str(2 * 2**20))  # over the 1 MiB cap alone
    build(fake, "one")
    assert all("-include" not in c for c in compiles(fake, "one")) and not list(pch_dir(fake).glob("*.gch"))
    build(fake, "two")  # too big: recorded, not made again
    assert len(calls(fake, "c++-header")) == 1
    monkeypatch.setenv("FAKE_PCH_FAIL", "1")
    build(fake, "three", flags=("-O2",))
    build(fake, "four", flags=("-O2",))  # failed: recorded, not tried again
    assert len(calls(fake, "c++-header")) == 2


def test_the_same_flags_with_sources_at_another_path_share_the_pch(fake):
    """A PCH is keyed by the compiler and flags, not where the sources are: a checkout at another path
    (another node's layout, StyleGAN's per-digest copy of a plugin's folder) with an edit counts as a
    second build; the same bytes at another path are no build at all (relocatable keys)."""
    build(fake, "one", where="checkout_a/ops")
    build(fake, "one", where="moved/checkout_a/ops")
    assert len(compiles(fake, "one")) == 1
    build(fake, "one", where="elsewhere/checkout_b/ops", text=SOURCE + "// edited\n")
    assert len(compiles(fake, "one")) == 2
    assert pch_store.wait(str(fake / "cache"), timeout=60)
    assert len(calls(fake, "c++-header")) == 1
    build(fake, "one", where="third/ops", text=SOURCE + "// edited again\n")
    assert f"-include {str(_only_pch(fake).header)}" in compiles(fake, "one")[-1]
