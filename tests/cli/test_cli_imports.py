"""The command line answers at once: what it imports, read from ``python -X importtime``.

``opforge --help``, ``--version``, every ``<command> --help`` and the cache's ``list``, ``clean`` and
``verify`` never import torch (issue 33: each took 1.5 s, torch's import, through ``bench_cmd``).
``report``, ``build``, ``doctor`` and ``bench`` do: their answers are made of torch's facts (its C++ ABI
flag, its headers in the build keys) and of the kernel families, which are torch code."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_python

from opforge.cli.main import build_parser


def imports(*args: str, cache_dir=None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m opforge ARGS``; its result and the modules it imported."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    if cache_dir is not None:
        env["OPFORGE_CACHE_DIR"] = str(cache_dir)
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "opforge", *args], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    names = {ln.rsplit("|", 1)[1].strip() for ln in out.stderr.splitlines() if ln.startswith("import time:")}
    assert "opforge.cli.main" in names, out.stderr[-2000:]  # -X importtime did report
    return out, names


def heavy(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in ("torch", "numpy", "triton", "rich"))


def subcommands(parser: argparse.ArgumentParser, prefix=()) -> list[tuple[str, ...]]:
    """Every (sub)command path of the parser: ``("cache",)``, ``("cache", "list")``, ..."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += subcommands(sub, (*prefix, name))
    return found


COMMANDS = subcommands(build_parser())


def test_the_command_list_is_complete():
    assert {c[0] for c in COMMANDS} == {"report", "doctor", "build", "cache", "bench"}
    assert ("cache", "list") in COMMANDS and ("cache", "push") in COMMANDS


@pytest.mark.parametrize("args", [("--help",), ("--version",), ()] + [(*c, "--help") for c in COMMANDS],
                         ids=lambda a: " ".join(a) or "(none)")
def test_help_and_version_import_nothing_heavy(args, cache_dir):
    out, names = imports(*args, cache_dir=cache_dir)
    assert out.returncode == (2 if not args else 0), out.stderr[-2000:]
    assert "usage: opforge" in out.stdout or out.stdout.startswith("opforge ")
    assert heavy(names) == []


def test_bench_help_names_every_family_without_importing_them(cache_dir):
    from opforge.bench import KINDS
    from opforge.bench.suites import SUITES

    assert KINDS == tuple(SUITES)  # the kinds bench names without importing its suites are the suites'
    out, names = imports("bench", "--help", cache_dir=cache_dir)
    assert all(k in out.stdout for k in KINDS) and heavy(names) == []


def test_cache_list_clean_and_verify_never_import_torch(cache_dir, make_pymod):
    src = make_pymod("cli_light", 5)
    built = run_python(f"import opforge; opforge.load('cli_light', [{str(src)!r}])", env={"OPFORGE_CACHE_DIR": str(cache_dir)})
    assert built.returncode == 0, built.stderr
    for args in (("cache", "list"), ("cache", "list", "--json"), ("cache", "verify", "--keep"),
                 ("cache", "verify", "--json"), ("cache", "clean", "--older-than", "30"), ("cache", "clean", "nosuch"),
                 ("cache", "clean", "cli_light"), ("cache", "clean")):
        out, names = imports(*args, cache_dir=cache_dir)
        assert out.returncode == (1 if args[-1] == "nosuch" else 0), (args, out.stderr[-2000:])
        assert "torch" not in names, args
        if args == ("cache", "list", "--json"):
            assert '"cli_light"' in out.stdout
        if args == ("cache", "verify", "--keep"):
            assert "1 ok, 0 corrupt" in out.stdout


def test_report_imports_torch_because_its_answer_is_torchs(cache_dir):
    out, names = imports("report", "selftest", "--json", cache_dir=cache_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch" in names and '"torch_version"' in out.stdout
