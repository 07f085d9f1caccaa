"""opforge cache list | clean | verify."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import TESTS, run_python

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


# -- sharp edges: bad arguments, unknown names, leftovers, piped output, --version, --import -------


def test_clean_refuses_a_negative_age_and_removes_nothing(cache_dir, make_pymod, capsys):
    build_two(make_pymod)
    for bad in ("-3", "nan", "soon"):
        with pytest.raises(SystemExit) as exc:
            main(["cache", "clean", "--older-than", bad])
        assert exc.value.code == 2
        assert "--older-than" in capsys.readouterr().err
    assert main(["cache", "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["entries"]) == 2


def test_clean_of_an_unknown_name_says_so_and_fails(cache_dir, make_pymod, capsys):
    build_two(make_pymod)
    assert main(["cache", "clean", "cli_nosuch"]) == 1
    assert "holds nothing of 'cli_nosuch'" in capsys.readouterr().err
    assert main(["cache", "clean", "../cli_a"]) == 2  # never a path
    assert "not a valid identifier" in capsys.readouterr().err
    assert main(["cache", "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["entries"]) == 2


def failed_build(tmp_path, name="cli_broken"):
    import opforge

    src = tmp_path / f"{name}.cpp"
    src.write_text("int broken() { return this_symbol_does_not_exist; }\n")
    with pytest.raises(opforge.BuildError):
        opforge.load(name, [str(src)])


def test_a_failed_builds_leftovers_are_listed_with_their_size_and_cleaned_by_age(cache_dir, tmp_path, capsys):
    failed_build(tmp_path)
    assert main(["cache", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entries"] == []
    what = {i["what"]: i for i in data["leftovers"]}
    assert set(what) == {"build dir", "failed build"}, what
    assert what["build dir"]["size"] > 0 and not what["build dir"]["in_use"]
    assert "this_symbol_does_not_exist" in what["failed build"]["detail"]
    assert main(["cache", "list"]) == 0
    text = capsys.readouterr().out
    assert "build dir" in text and what["build dir"]["path"] in text

    assert main(["cache", "clean", "--older-than", "7"]) == 0  # both are minutes old: kept
    assert "removed 0 item(s)" in capsys.readouterr().out
    old = time.time() - 10 * 86400
    for root, _, files in os.walk(cache_dir / "cli_broken"):
        for p in [root, *(os.path.join(root, f) for f in files)]:
            os.utime(p, (old, old))
    assert main(["cache", "clean", "--older-than", "7"]) == 0
    assert "removed 2 item(s) older than 7 days" in capsys.readouterr().out
    assert sorted(p.name for p in (cache_dir / "cli_broken").iterdir() if not p.name.endswith(".lock")) == []


def test_clean_never_removes_a_build_dir_whose_lock_is_held(cache_dir, tmp_path, capsys):
    import filelock

    failed_build(tmp_path)
    (build_dir,) = [p for p in (cache_dir / "cli_broken").iterdir() if p.name.startswith(".build-") and p.is_dir()]
    with filelock.FileLock(str(build_dir) + ".lock"):
        assert main(["cache", "list", "--json"]) == 0
        rows = {i["what"]: i for i in json.loads(capsys.readouterr().out)["leftovers"]}
        assert rows["build dir"]["in_use"]
        assert main(["cache", "clean", "cli_broken"]) == 0
        assert f"kept 1 in use by a running build: {build_dir}" in capsys.readouterr().out
        assert build_dir.exists()
    assert main(["cache", "clean", "cli_broken"]) == 0
    assert not build_dir.exists()


def test_piped_list_and_verify_print_plain_full_width_text(cache_dir, make_pymod, capsys):
    name = "cli_a_name_longer_than_any_eighty_column_table_would_leave_whole_pyb_scale_add"
    src = make_pymod(name, 3)
    out = run_python(f"import opforge; opforge.load({name!r}, [{str(src)!r}])")
    assert out.returncode == 0, out.stderr
    for cmd in (["cache", "list"], ["cache", "verify"]):
        assert main(cmd) == 0
        text = capsys.readouterr().out
        assert name in text and not any(c in text for c in "│┃━─…\x1b"), text


def test_version_and_python_dash_m():
    import opforge

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = run_python("import runpy, sys; sys.argv = ['opforge', '--version']; runpy.run_module('opforge', run_name='__main__')")
    assert out.stdout.strip() == f"opforge {opforge.__version__}", out.stderr
    out = run_python("import runpy, sys; sys.argv = ['opforge', 'cache', 'clean', '--older-than', '-1']; "
                     "runpy.run_module('opforge', run_name='__main__')")
    assert out.returncode == 2 and "--older-than" in out.stderr


USER_MODULE = '''
from opforge import KernelLoader, TorchExtension

class UserLoader(KernelLoader):
    kind = "cli_user_kind"

@UserLoader.register_extension
class UserRef(TorchExtension):
    name, priority, module = "cli_user_kind_ref", 1, "toy_reference"
'''


def test_report_imports_the_users_module_to_show_its_kernels(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_user_kernels.py").write_text(USER_MODULE)
    code = ("import sys; from opforge.cli.main import main; sys.exit(main(['report', '--json', '--import', "
            "'cli_user_kernels', 'cli_user_kind']))")
    out = run_python(code, cwd=str(tmp_path), env={"PYTHONPATH": TESTS})
    assert out.returncode == 0, out.stderr
    (kind,) = json.loads(out.stdout)["kinds"]
    assert kind["kind"] == "cli_user_kind" and kind["chosen"] == "cli_user_kind_ref"
    out = run_python("import sys; from opforge.cli.main import main; sys.exit(main(['report', 'cli_user_kind']))")
    assert out.returncode == 2 and "unknown kernel kind: cli_user_kind" in out.stderr  # without --import
    assert main(["report", "--import", str(tmp_path / "no_such.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "raises.py").write_text("raise RuntimeError('broken plugin')\n")
    assert main(["report", "--import", str(tmp_path / "raises.py")]) == 2
    assert "RuntimeError: broken plugin" in capsys.readouterr().err


def test_build_takes_import_too(tmp_path, capsys):
    (tmp_path / "cli_user_kernels2.py").write_text(USER_MODULE.replace("cli_user_kind", "cli_user_kind2"))
    assert main(["build", "--json", "--import", str(tmp_path / "cli_user_kernels2.py"), "cli_user_kind2"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert row["name"] == "cli_user_kind2_ref" and row["result"] == "skipped"
