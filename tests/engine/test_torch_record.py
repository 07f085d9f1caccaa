"""torch's facts recorded in the cache (``engine/torch_record.py``): a process that has not imported
torch computes the build key from the record instead of importing torch, and a changed torch (its
version, its build) is never read from an old record: it changes the key as before."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap

from conftest import ROOT, run_python

from opforge import compat, settings
from opforge.engine import key, torch_record

SPEC = textwrap.dedent("""
    import json, sys
    from opforge import settings
    from opforge.engine import key
    spec = key.make_spec(settings.current(), "rec_mod", [sys.argv[1]], None, None, None, None, None, True, False)
    print(json.dumps({"imported": "torch" in sys.modules, "version": spec.torch.version,
                      "abi": spec.torch.cxx11_abi, "root": spec.torch.root, "key": spec.input_key}))
""")


def _fake_torch(site, version: str, abi: bool = True) -> None:
    """A stand-in torch package with what ``compat.torch_facts`` reads (its version.py as torch's)."""
    pkg = site / "torch"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "version.py").write_text(f"__version__ = {version!r}\ngit_version = 'g{version}'\ncuda = None\nhip = None\n")
    (pkg / "__init__.py").write_text(f"from . import version\nfrom .version import __version__\n"
                                     f"def compiled_with_cxx11_abi():\n    return {abi!r}\n")


def _spec(site, cache, src) -> dict:
    code = SPEC.replace("sys.argv[1]", repr(str(src)))
    out = run_python(code, env={"PYTHONPATH": os.pathsep.join([str(site), ROOT]), "OPFORGE_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_reads_the_record_and_a_changed_torch_is_asked_again(tmp_path):
    site, cache, src = tmp_path / "site", tmp_path / "cache", tmp_path / "rec.cpp"
    src.write_text("int f() { return 1; }\n")
    _fake_torch(site, "2.99.0")
    first = _spec(site, cache, src)
    assert first["imported"] and first["version"] == "2.99.0"
    assert first["root"] == os.path.realpath(site / "torch")
    (record,) = (cache / ".tools").glob("torch-*.json")

    again = _spec(site, cache, src)
    assert not again["imported"] and again == {**first, "imported": False}  # the record: same facts, same key

    _fake_torch(site, "2.99.10")  # an upgrade: version.py changes
    upgraded = _spec(site, cache, src)
    assert upgraded["imported"] and upgraded["version"] == "2.99.10" and upgraded["key"] != first["key"]
    assert not _spec(site, cache, src)["imported"]

    _fake_torch(site, "2.99.10", abi=False)  # the same version built otherwise: torch's files change
    rebuilt = _spec(site, cache, src)
    assert rebuilt["imported"] and rebuilt["abi"] is False and rebuilt["key"] != upgraded["key"]
    assert len(list((cache / ".tools").glob("torch-*.json"))) == 3 and record.exists()


def test_an_imported_torch_that_disk_no_longer_holds_is_not_recorded(tmp_path, monkeypatch):
    """A process whose torch was replaced on disk since it imported it (here: facts that the installed
    version.py doesn't say) keeps its own facts, and records nothing for the next process to read."""
    real = compat.torch_facts()
    stale = dataclasses.replace(real, version="2.0.0")
    monkeypatch.setattr(compat, "torch_facts", lambda: stale)
    cache = tmp_path / "cache"
    assert torch_record.torch_facts(str(cache)) == stale
    assert not list(cache.glob(".tools/torch-*.json"))

    monkeypatch.setattr(compat, "torch_facts", lambda: real)
    assert torch_record.torch_facts(str(tmp_path / "other")) == real  # as installed: recorded
    (record,) = (tmp_path / "other" / ".tools").glob("torch-*.json")
    assert compat.TorchFacts.from_json(json.loads(record.read_text())) == real
    assert record == type(record)(torch_record.record_path(str(tmp_path / "other"), torch_record.identity(real.root)))


def test_the_key_in_process_is_the_recorded_key(tmp_path, monkeypatch):
    """A process that has torch imported and one that reads the record compute the same key."""
    src = tmp_path / "same.cpp"
    src.write_text("int f() { return 2; }\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(cache))
    here = key.make_spec(settings.current(), "rec_mod", [str(src)], None, None, None, None, None, True, False)
    code = SPEC.replace("sys.argv[1]", repr(str(src)))
    out = run_python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    there = json.loads(out.stdout.strip().splitlines()[-1])
    assert not there["imported"] and there["key"] == here.input_key


def test_a_cpu_build_in_a_fresh_process_has_torchs_flags_without_importing_it(tmp_path, monkeypatch):
    """torch's include and library dirs and -std= for a CPU build, recorded by a process that imported torch,
    give a fresh process the very flags torch gives, and it doesn't import torch for them."""
    from opforge.engine import flags

    src = tmp_path / "flags.cpp"
    src.write_text("int f() { return 3; }\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(cache))
    s = settings.current()
    here = flags.derive(key.make_spec(s, "rec_mod", [str(src)], ["-O1"], None, None, None, None, True, False), s)
    (record,) = (cache / ".tools").glob("torch-*.cpu-build.json")
    code = textwrap.dedent(f"""
        import json, sys
        from opforge import settings
        from opforge.engine import flags, key
        s = settings.current()
        spec = key.make_spec(s, "rec_mod", [{str(src)!r}], ["-O1"], None, None, None, None, True, False)
        f = flags.derive(spec, s)
        print(json.dumps({{"imported": "torch" in sys.modules, "cflags": f.cflags, "ldflags": f.ldflags}}))
    """)
    out = run_python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    there = json.loads(out.stdout.strip().splitlines()[-1])
    assert not there["imported"]
    assert (tuple(there["cflags"]), tuple(there["ldflags"])) == (here.cflags, here.ldflags)
    assert json.loads(record.read_text())["std"] in here.cflags


def test_a_warm_process_that_imported_torch_reads_no_torch_file_but_the_record(tmp_path, monkeypatch):
    """Issue 60, item 4: with torch imported, a warm load's facts cost a stat of each of torch's files and a read of
    the record: torch's version.py is read (to check that disk still holds the imported torch) only when the
    record says otherwise, and only torch's own location is resolved (a realpath of each file cost 0.1 ms, the
    exec of version.py another 0.15)."""
    import opforge

    cache = str(tmp_path / "cache")
    reads, resolved = [], []
    real_version, real_realpath = torch_record._on_disk_version, os.path.realpath
    monkeypatch.setattr(torch_record, "_on_disk_version", lambda root: reads.append(root) or real_version(root))
    first = torch_record.torch_facts(cache)  # the record is written: torch's version.py read once
    assert len(reads) == 1
    opforge.reset()  # as a new process
    monkeypatch.setattr(os.path, "realpath", lambda p, **k: resolved.append(p) or real_realpath(p, **k))
    assert torch_record.torch_facts(cache) == first
    assert len(reads) == 1
    assert [os.path.basename(p) for p in resolved] == ["__init__.py"]  # where torch lies (compat), not each file
