"""``opforge cache export`` / ``import``: build once, carry the archive, load with no compiler.

Every module is a plain CPython-API one (compiles in well under a second). Tampered archives
are written by hand with ``tarfile``, the way an attacker or a broken copy would.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile

import pytest
from conftest import run_python

import opforge
from opforge.cli.main import main as cli_main
from opforge.engine import archive, cache


def _build(name: str, make_pymod, value: int = 7) -> str:
    src = make_pymod(name, value)
    assert opforge.load(name, [str(src)]).value() == value
    return str(src)


def _entries(root, name: str) -> list[str]:
    d = os.path.join(root, name)
    return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []


def _no_compiler_load(name: str, src: str, root, value: int) -> str:
    """Load in a fresh interpreter whose CXX does not exist: only a cached entry can serve it."""
    code = f"import opforge; print(opforge.load({name!r}, [{src!r}]).value())"
    r = run_python(code, env={"OPFORGE_CACHE_DIR": str(root), "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(value)
    return r.stderr


def test_round_trip_to_a_node_with_no_compiler(cache_dir, make_pymod, tmp_path, monkeypatch, capsys):
    src = _build("arch_round", make_pymod, 11)
    out = tmp_path / "cache.tar.gz"
    assert cli_main(["cache", "export", str(out)]) == 0
    assert "1 exported" in capsys.readouterr().out

    node = tmp_path / "node-cache"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(node))
    assert cli_main(["cache", "import", str(out), "--dry-run"]) == 0
    assert "would import" in capsys.readouterr().out and not node.exists()
    assert cli_main(["cache", "import", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [e["status"] for e in report["entries"]] == ["imported"]
    assert _entries(node, "arch_round") == _entries(cache_dir, "arch_round")
    assert oct(os.stat(node / "arch_round").st_mode & 0o777) == "0o700"
    _no_compiler_load("arch_round", src, node, 11)

    # Importing again changes nothing.
    assert [o.status for o in archive.import_(str(out), str(node))] == ["present"]


def test_warm_path_keeps_its_stat_fast_path(cache_dir, make_pymod, tmp_path):
    """The imported binary gets the manifest's mtime back, so a warm load need not re-hash it."""
    _build("arch_mtime", make_pymod)
    out = tmp_path / "c.tar"
    archive.export(str(out), root=str(cache_dir))
    node = tmp_path / "node"
    archive.import_(str(out), str(node))
    (entry,) = _entries(node, "arch_mtime")
    m = cache.read_manifest(str(node / "arch_mtime" / entry))
    assert os.stat(node / "arch_mtime" / entry / m.binary).st_mtime_ns == m.binary_mtime_ns


def _facts(**torch_changes) -> archive.Here:
    here = archive.Here.detect()
    return archive.Here(dataclasses.replace(here.torch, **torch_changes), here.cpu_identity, here.gpu_archs, here.arch_list)


def test_entries_for_another_platform_are_skipped_with_the_reason(cache_dir, make_pymod, tmp_path):
    _build("arch_other", make_pymod)
    out = tmp_path / "c.tar"
    archive.export(str(out), root=str(cache_dir))
    node = tmp_path / "node"
    (o,) = archive.import_(str(out), str(node), here=_facts(version="9.9.0"))
    assert o.status == "skipped" and "here torch is 9.9.0" in o.reason
    (o,) = archive.import_(str(out), str(node), here=_facts(python_tag="cpython-399"))
    assert o.status == "skipped" and "here Python is cpython-399" in o.reason
    assert not node.exists()
    # Export applies the same rule to this machine's cache.
    (o,) = archive.export(str(tmp_path / "d.tar"), root=str(cache_dir), here=_facts(cuda="13.0"))
    assert o.status == "skipped" and "here CUDA is 13.0" in o.reason


def test_export_skips_corrupt_and_stale_entries(cache_dir, make_pymod, tmp_path):
    _build("arch_bad", make_pymod)
    src = _build("arch_stale", make_pymod, 3)
    (entry,) = _entries(cache_dir, "arch_bad")
    so = cache_dir / "arch_bad" / entry / "arch_bad.so"
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (so.parent / "new.so").write_bytes(bytes(data))
    os.replace(so.parent / "new.so", so)  # a new inode: the copy mapped into this process stays intact
    with open(src, "a") as f:
        f.write("// edited\n")
    outcomes = {o.name: o for o in archive.export(str(tmp_path / "c.tar"), root=str(cache_dir))}
    assert outcomes["arch_bad"].status == "skipped" and "corrupt" in outcomes["arch_bad"].reason
    assert outcomes["arch_stale"].status == "skipped" and "stale" in outcomes["arch_stale"].reason
    assert archive.import_(str(tmp_path / "c.tar"), str(tmp_path / "node")) == []


def _exported(cache_dir, make_pymod, tmp_path, name: str) -> tuple[dict, dict[str, bytes]]:
    _build(name, make_pymod)
    out = tmp_path / "good.tar"
    archive.export(str(out), root=str(cache_dir))
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return json.loads(files.pop(archive.INDEX)), files


def _write_tar(path, index: dict, files: dict[str, bytes], links: dict[str, str] | None = None) -> str:
    with tarfile.open(path, "w") as tar:
        blob = json.dumps(index).encode()
        tar.addfile(archive._tarinfo(archive.INDEX, len(blob)), io.BytesIO(blob))
        for n, data in files.items():
            tar.addfile(archive._tarinfo(n, len(data)), io.BytesIO(data))
        for n, target in (links or {}).items():
            info = tarfile.TarInfo(n)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return str(path)


def test_a_flipped_byte_in_the_binary_is_caught(cache_dir, make_pymod, tmp_path, monkeypatch, capsys):
    index, files = _exported(cache_dir, make_pymod, tmp_path, "arch_flip")
    so = next(n for n in files if n.endswith(".so"))
    data = bytearray(files[so])
    data[100] ^= 1
    files[so] = bytes(data)
    bad = _write_tar(tmp_path / "bad.tar", index, files)
    node = tmp_path / "node"
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(node))
    assert cli_main(["cache", "import", bad]) == 1
    assert "sha256 mismatch" in capsys.readouterr().out
    assert _entries(node, "arch_flip") == []


def test_a_binary_that_disagrees_with_its_manifest_is_caught(cache_dir, make_pymod, tmp_path):
    """Index and file agree, but the manifest names another sha256: refused."""
    index, files = _exported(cache_dir, make_pymod, tmp_path, "arch_mism")
    so = next(n for n in files if n.endswith(".so"))
    files[so] = files[so] + b"\0"
    entry = index["entries"][0]
    entry["files"]["arch_mism.so"] = {"size": len(files[so]), "sha256": archive._sha256(files[so])}
    (o,) = archive.import_(_write_tar(tmp_path / "bad.tar", index, files), str(tmp_path / "node"))
    assert o.status == "corrupt" and "differs from its manifest" in o.reason


@pytest.mark.parametrize("field,value", [
    ("name", "../../escape"), ("name", "a/b"), ("entry", "../../../tmp/x"), ("entry", "0123456789abcdef-0123456/"),
    ("binary", "../evil.so"), ("binary", "/tmp/evil.so"), ("name", "arch_esc\n"),
    ("entry", "0123456789abcdef-01234567\n"),
])
def test_names_that_could_escape_the_cache_are_refused(cache_dir, make_pymod, tmp_path, field, value):
    index, files = _exported(cache_dir, make_pymod, tmp_path, "arch_esc")
    index["entries"][0][field] = value
    node = tmp_path / "node"
    with pytest.raises(opforge.ArchiveError, match="invalid"):
        archive.import_(_write_tar(tmp_path / "bad.tar", index, files), str(node))
    assert not node.exists() and not (tmp_path / "escape").exists() and not os.path.exists("/tmp/evil.so")


def test_a_manifest_pointing_outside_its_entry_is_refused(cache_dir, make_pymod, tmp_path):
    index, files = _exported(cache_dir, make_pymod, tmp_path, "arch_man")
    mname = next(n for n in files if n.endswith("manifest.json"))
    manifest = json.loads(files[mname])
    manifest["binary"] = "../../../evil.so"
    files[mname] = json.dumps(manifest).encode()
    index["entries"][0]["files"]["manifest.json"] = {"size": len(files[mname]), "sha256": archive._sha256(files[mname])}
    (o,) = archive.import_(_write_tar(tmp_path / "bad.tar", index, files), str(tmp_path / "node"))
    assert o.status == "corrupt" and "manifest is invalid" in o.reason
    assert _entries(tmp_path / "node", "arch_man") == []


def test_links_and_stray_members_are_never_written(cache_dir, make_pymod, tmp_path):
    index, files = _exported(cache_dir, make_pymod, tmp_path, "arch_link")
    so = next(n for n in files if n.endswith(".so"))
    files["../../stray.txt"] = b"x"
    files["/tmp/opforge-stray.txt"] = b"x"
    del files[so]
    bad = _write_tar(tmp_path / "bad.tar", index, files, links={so: "/etc/passwd"})
    (o,) = archive.import_(bad, str(tmp_path / "node"))
    assert o.status == "corrupt" and "not a regular file" in o.reason
    assert not (tmp_path / "stray.txt").exists() and not os.path.exists("/tmp/opforge-stray.txt")
    assert _entries(tmp_path / "node", "arch_link") == []


def test_not_an_archive_says_how_to_make_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "c"))
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(opforge.ArchiveError, match="cannot read"):
        archive.import_(str(junk))
    empty = _write_tar(tmp_path / "empty.tar", {"format": 99, "entries": []}, {})
    assert cli_main(["cache", "import", empty]) == 2
    assert "format 99" in capsys.readouterr().err
    with tarfile.open(tmp_path / "other.tar", "w") as tar:
        tar.addfile(archive._tarinfo("hello.txt", 1), io.BytesIO(b"x"))
    with pytest.raises(opforge.ArchiveError, match="cache export FILE"):
        archive.import_(str(tmp_path / "other.tar"))


def test_a_failed_import_leaves_no_partial_entry(cache_dir, make_pymod, tmp_path, monkeypatch):
    _build("arch_atomic", make_pymod)
    out = tmp_path / "c.tar"
    archive.export(str(out), root=str(cache_dir))

    def full(path):  # the disk fills up after the binary is copied, before the manifest
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "_fsync_file", full)
    node = tmp_path / "node"
    with pytest.raises(opforge.CacheError, match="No space left on device.*free some space"):
        archive.import_(str(out), str(node))
    assert os.listdir(node / "arch_atomic") == []  # no entry, no temp dir, no staged binary
    monkeypatch.undo()
    assert [o.status for o in archive.import_(str(out), str(node))] == ["imported"]


def test_an_entry_dir_that_disagrees_with_its_manifest_key_is_refused(cache_dir, make_pymod, tmp_path):
    index, files = _exported(cache_dir, make_pymod, tmp_path, "arch_key")
    old = index["entries"][0]["entry"]
    index["entries"][0]["entry"] = "f" * 16 + old[16:]
    files = {n.replace(old, index["entries"][0]["entry"]): d for n, d in files.items()}
    (o,) = archive.import_(_write_tar(tmp_path / "bad.tar", index, files), str(tmp_path / "node"))
    assert o.status == "corrupt" and "names another entry" in o.reason
    assert _entries(tmp_path / "node", "arch_key") == []


def test_a_tampered_manifest_in_the_cache_is_never_followed(cache_dir, make_pymod, tmp_path):
    """A manifest whose binary points outside its entry is not ours: the load rebuilds."""
    _build("arch_tamper", make_pymod, 5)
    (entry,) = _entries(cache_dir, "arch_tamper")
    mpath = cache_dir / "arch_tamper" / entry / "manifest.json"
    m = json.loads(mpath.read_text())
    m["binary"] = "../../evil.so"
    mpath.write_text(json.dumps(m))
    assert cache.read_manifest(str(mpath.parent)) is None
    code = f"import opforge; print(opforge.load('arch_tamper', [{str(tmp_path / 'src' / 'arch_tamper.cpp')!r}]).value())"
    r = run_python(code, env={"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert r.returncode == 0 and r.stdout.strip() == "5", r.stderr
    assert "corrupt manifest" in r.stderr
