"""``opforge cache clean`` racing ``load_inline`` (issue 34): load_inline writes its sources to
``<cache>/<name>/.src-<digest>/`` and builds from there; clean removes ``.src-*`` dirs. A clean that
lands between the write and the build (or during the compile) must leave the sources alone (it reports
them in use), and the load must succeed; once no load uses them, a clean removes them.

Each moment is hit exactly, not by chance: the clean runs from inside the load, in this process right
after the files are written, or as `opforge cache clean` from the compiler wrapper, before it compiles.
"""

from __future__ import annotations

import sys
import threading

from conftest import ROOT, pymod_source

import opforge
from opforge.engine import importer, inline, inventory


def _src_dirs(cache_dir, name):
    return sorted(p for p in (cache_dir / name).iterdir() if p.name.startswith(".src-") and p.is_dir())


def test_a_clean_after_load_inline_wrote_its_sources_removes_nothing_it_builds_from(cache_dir, monkeypatch,
                                                                                     counting_cxx):
    real = inline._load
    cleaned = []

    def clean_first(*args, **kwargs):  # the moment between writing the files and hashing and building them
        cleaned.append(inventory.clean(str(cache_dir)))
        return real(*args, **kwargs)

    monkeypatch.setattr(inline, "_load", clean_first)
    mod = opforge.load_inline("inl_race", pymod_source("inl_race", 3), no_implicit_headers=True)
    assert mod.value() == 3 and len(counting_cxx.compiles()) == 1
    (src_dir,) = _src_dirs(cache_dir, "inl_race")
    (done,) = cleaned
    assert str(src_dir) in done.in_use and str(src_dir) not in done.removed, done
    monkeypatch.setattr(inline, "_load", real)
    after = inventory.clean(str(cache_dir))  # no load uses them now
    assert str(src_dir) in after.removed and not src_dir.exists(), after
    importer._LOADED.clear()
    assert opforge.load_inline("inl_race", pymod_source("inl_race", 3), no_implicit_headers=True).value() == 3


def test_a_clean_during_load_inlines_compile_removes_nothing_it_builds_from(cache_dir, tmp_path, monkeypatch,
                                                                           counting_cxx):
    """`opforge cache clean` (the CLI, another process) runs from the compiler wrapper, before the compile."""
    wrapper = tmp_path / "bin" / "clean-then-cxx"
    report = tmp_path / "clean.txt"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -c "*) PYTHONPATH={ROOT} {sys.executable} -m opforge cache clean > {report} 2>&1 ;; esac\n'
        f'exec {counting_cxx.path} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    mod = opforge.load_inline("inl_race2", pymod_source("inl_race2", 4), no_implicit_headers=True)
    assert mod.value() == 4 and len(counting_cxx.compiles()) == 1
    (src_dir,) = _src_dirs(cache_dir, "inl_race2")
    said = report.read_text()
    (kept,) = [line for line in said.splitlines() if line.startswith("kept ")]
    assert str(src_dir) in kept, said


def test_the_source_lock_is_shared_by_loads_and_dropped_after(cache_dir, counting_cxx):
    """Two loads of the same inline sources hold the lock together (neither waits for the other's load to
    end), and nobody holds it once they are done."""
    both = threading.Barrier(2, timeout=30)
    real, errors = inline._load, []

    def meet(*args, **kwargs):
        both.wait()  # both inside the lock at once, or the barrier breaks
        return real(*args, **kwargs)

    def load():
        try:
            assert opforge.load_inline("inl_shared", pymod_source("inl_shared", 5), no_implicit_headers=True).value() == 5
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    inline._load = meet
    try:
        threads = [threading.Thread(target=load) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        inline._load = real
    assert errors == [] and len(counting_cxx.compiles()) == 1
    (src,) = [i for i in inventory.leftovers(str(cache_dir), "inl_shared") if i.what == "inline sources"]
    assert not src.in_use
