"""opforge cache list | clean | verify."""

from __future__ import annotations

import json
import os
import time

from conftest import run_python
from opforge.cli.main import main


def build_two(make_pymod):
    """Build in a child process: these tests damage binaries, which must not be mapped here."""
    a, b = make_pymod("cli_a", 1), make_pymod("cli_b", 2)
    code = f"import opforge; opforge.load('cli_a', [{str(a)!r}]); opforge.load('cli_b', [{str(b)!r}])"
    out = run_python(code)
    assert out.returncode == 0, out.stderr


def test_list_shows_each_entry(cache_dir, make_pymod, capsys):
    build_two(make_pymod)
    assert main(["cache", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cache_dir"] == str(cache_dir)
    names = sorted(e["name"] for e in data["entries"])
    assert names == ["cli_a", "cli_b"]
    for e in data["entries"]:
        assert e["size"] > 0 and e["torch"] and e["kind"] == "python_module" and e["age_days"] < 1
    assert main(["cache", "list"]) == 0
    table = capsys.readouterr().out
    assert "cli_a" in table and "cli_b" in table


def test_list_on_an_empty_cache(cache_dir, capsys):
    assert main(["cache", "list"]) == 0
    assert "no cached builds" in capsys.readouterr().out


def test_clean_one_name_then_all(cache_dir, make_pymod, capsys):
    build_two(make_pymod)
    assert main(["cache", "clean", "cli_a"]) == 0
    left = {p.name for p in cache_dir.iterdir()}
    assert not [p for p in (cache_dir / "cli_a").iterdir() if not p.name.startswith(".")]
    assert [p for p in (cache_dir / "cli_b").iterdir() if not p.name.startswith(".")]
    assert "cli_b" in left
    assert main(["cache", "clean"]) == 0
    assert not [p for p in (cache_dir / "cli_b").iterdir() if not p.name.endswith(".lock")]


def test_clean_older_than_keeps_recent_builds(cache_dir, make_pymod, capsys):
    build_two(make_pymod)
    (entry,) = [p for p in (cache_dir / "cli_a").iterdir() if not p.name.startswith(".")]
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["built_at"] = time.time() - 10 * 86400
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert main(["cache", "clean", "--older-than", "7"]) == 0
    assert "removed 1 item" in capsys.readouterr().out
    assert not entry.exists()
    assert [p for p in (cache_dir / "cli_b").iterdir() if not p.name.startswith(".")]


def test_verify_reports_and_removes_corrupt_binaries(cache_dir, make_pymod, capsys):
    build_two(make_pymod)
    (entry,) = [p for p in (cache_dir / "cli_b").iterdir() if not p.name.startswith(".")]
    so = entry / "cli_b.so"
    st = os.stat(so)
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, and the mtime is put back: only a re-hash sees it
    so.write_bytes(bytes(data))
    os.utime(so, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert main(["cache", "verify", "--keep", "--json"]) == 1
    rows = {e["name"]: e["status"] for e in json.loads(capsys.readouterr().out)["entries"]}
    assert rows == {"cli_a": "ok", "cli_b": "corrupt"}
    assert entry.exists()
    assert main(["cache", "verify"]) == 1
    assert not entry.exists()
    assert main(["cache", "verify"]) == 0


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 2
    assert "cache" in capsys.readouterr().out
