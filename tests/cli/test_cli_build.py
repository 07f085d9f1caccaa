"""opforge build: warm the JIT cache with every variant that fits here, in parallel; report
built / cached / skipped / failed; unknown kinds exit 2.

The selftest variants are built once for the module (about 2 s each); the other tests
reuse that cache."""

from __future__ import annotations

import io
import json
import re
import sys

import jsonschema
import pytest

from opforge import platform, prebuilt, registry, settings
from opforge.cli import build_cmd
from opforge.cli.main import main
from opforge.extension import CppExtension, TorchExtension
from opforge.kernel_loader import SelftestLoader
from opforge.loader import KernelLoader


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One fresh cache, built into by ``opforge build selftest --json``: (root, json, exit code)."""
    root = tmp_path_factory.mktemp("build-cmd-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(root))
        mp.setenv("OPFORGE_CCACHE", "0")
        out = io.StringIO()
        mp.setattr(sys, "stdout", out)
        rc = main(["build", "selftest", "--json"])
        # What the loader accepts here, computed the same way the command does.
        accepted = [c.name for c in SelftestLoader().candidates()
                    if c.decision and c.extension.needs_compiler]
    return root, valid(json.loads(out.getvalue())), rc, accepted


def valid(data: dict) -> dict:
    """``data``, validated against the command's schema file (``build_cmd.SCHEMA_FILE``)."""
    with open(build_cmd.SCHEMA_FILE, encoding="utf-8") as f:
        jsonschema.validate(data, json.load(f))
    return data


@pytest.fixture
def use_built(built, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(built[0]))
    return built


def test_first_run_builds_every_accepted_cpp_variant(built):
    root, data, rc, accepted = built
    assert rc == 0 and data["ok"] and data["schema"] == "opforge.build/1"
    assert data["cache_dir"] == str(root) and data["jobs"] >= 1 and data["wall_seconds"] > 0
    results = {r["name"]: r for r in data["results"]}
    assert data["results"][0]["name"] == "selftest_avx512"
    assert accepted and "selftest_scalar" in accepted  # here: avx512, avx2, scalar on icelake
    for name in accepted:
        r = results[name]
        assert r["result"] == "built" and r["seconds"] > 0 and r["detail"] == "", r
        assert r["path"].startswith(str(root)) and (root / name).is_dir()
    assert data["counts"]["built"] == len(accepted) and data["counts"]["failed"] == 0
    assert results["selftest_torch"]["result"] == "skipped"
    assert "nothing to build" in results["selftest_torch"]["detail"]
    for name, r in results.items():
        if name not in accepted and r["backend"] == "cpp":
            assert r["result"] == "skipped" and r["detail"] and r["seconds"] is None  # e.g. neon: needs aarch64


def test_second_run_finds_them_cached(use_built, capsys):
    accepted = use_built[3]
    assert main(["build", "selftest"]) == 0  # (--all would also build the other kinds: slow, and tested below)
    out = capsys.readouterr().out
    assert "\x1b[" not in out
    for name in accepted:
        assert re.search(rf"^selftest\s+{name}\s+cached\s+\d+\.\d s", out, re.MULTILINE), out
    assert not re.search(r"\sbuilt\s", out.split("total:")[0].split("\n", 1)[1])
    assert re.search(rf"total: 0 built, {len(accepted)} cached, \d+ skipped, 0 failed in \d+\.\d s", out)


def test_an_extension_name_selects_it_alone(use_built, capsys):
    assert main(["build", "selftest_scalar", "--json"]) == 0
    data = valid(json.loads(capsys.readouterr().out))
    assert [(r["name"], r["result"]) for r in data["results"]] == [("selftest_scalar", "cached")]


def test_unknown_kind_exits_2_naming_the_valid_kinds(capsys):
    assert main(["build", "selftest", "no_such_kind"]) == 2
    err = capsys.readouterr().err
    assert "no_such_kind" in err and re.search(r"the kinds are: .*selftest", err)


def test_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["build", "--jobs", "0"])
    assert exc.value.code == 2


def test_one_failure_does_not_stop_the_others(use_built, tmp_path_factory, monkeypatch, capsys):
    src = tmp_path_factory.mktemp("broken-src") / "broken.cpp"
    src.write_text("int broken() { return this_symbol_does_not_exist; }\n")

    class ToyLoader(KernelLoader):
        pass

    ToyLoader.kind = "buildcmd_toy"  # set after creation: stays out of the global registry

    class Broken(CppExtension):
        name, kind, priority, sources = "buildcmd_toy_broken", "buildcmd_toy", 10, (str(src),)

    class Ref(TorchExtension):
        name, kind, module = "buildcmd_toy_ref", "buildcmd_toy", "opforge.kernels.selftest.reference"

    ToyLoader.register_extension(Broken)
    ToyLoader.register_extension(Ref)
    kinds = {"buildcmd_toy": ToyLoader, "selftest": SelftestLoader}
    monkeypatch.setattr(registry, "loaders", lambda: dict(kinds))

    assert main(["build", "--json", "--jobs", "2"]) == 1
    data = valid(json.loads(capsys.readouterr().out))
    results = {r["name"]: r for r in data["results"]}
    assert not data["ok"] and data["counts"]["failed"] == 1
    broken = results["buildcmd_toy_broken"]
    assert broken["result"] == "failed" and "this_symbol_does_not_exist" in broken["detail"]
    assert broken["log"] and broken["path"] is None
    assert results["selftest_scalar"]["result"] == "cached"  # the others went on
    assert data["results"][0]["kind"] == "buildcmd_toy"  # sorted by kind

    assert main(["build", "buildcmd_toy"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^buildcmd_toy\s+buildcmd_toy_broken\s+failed\s", out, re.MULTILINE), out
    assert "1 failed" in out


def test_progress_bar_and_rich_table_on_a_terminal(use_built, capsys):
    from rich.console import Console

    s = settings.current()
    planned = build_cmd.plan({"selftest": None}, {"selftest": SelftestLoader}, platform.current(s), prebuilt.read())
    results = build_cmd._run_with_progress(planned, s, 2, tty=True, quiet=False)
    assert {r.result for r in results} <= {"cached", "skipped"}
    buf = io.StringIO()
    build_cmd.print_rich(results, 1.0, 2, Console(file=buf, force_terminal=True, width=160))
    text = buf.getvalue()
    assert "\x1b[" in text and "selftest_scalar" in text and "cached" in text and "total:" in text


def test_all_covers_every_kind(use_built, capsys):
    assert main(["build", "--all", "--json"]) == 0
    data = valid(json.loads(capsys.readouterr().out))
    kinds = {r["kind"] for r in data["results"]}
    assert kinds == set(registry.loaders())
    assert data["ok"] and data["counts"]["failed"] == 0
