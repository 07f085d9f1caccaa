"""opforge report: candidates with their reasons, platform facts, prebuilt record; plain,
rich and JSON output; with and without a compiler."""

from __future__ import annotations

import io
import json
import re

import jsonschema
from conftest import run_python

from opforge import isa, prebuilt
from opforge.cli import report_cmd
from opforge.cli.main import main
from opforge.compat import TorchFacts
from opforge.platform import Cpu, Gpu, Platform, ToolInfo

ANSI = re.compile(r"\x1b\[")
CANDIDATE_KEYS = {"name", "backend", "priority", "available", "available_reason", "compatible", "compatible_reason",
                  "accepted", "reason", "state", "note", "chosen", "adopted_from", "remote", "remote_pull"}
GCC = ToolInfo("/usr/bin/g++", "g++ 12.2.0")
NINJA = ToolInfo("/usr/bin/ninja", "1.11")
HASWELL = Platform(cpu=Cpu(microarch="haswell", features=frozenset(isa.AVX2.features), cores=8), cxx=GCC, ninja=NINJA)


def report_json(capsys, *args) -> dict:
    """The command's JSON, validated against its schema file (``report_cmd.SCHEMA_FILE``)."""
    assert main(["report", "--json", *args]) == 0
    data = json.loads(capsys.readouterr().out)
    with open(report_cmd.SCHEMA_FILE, encoding="utf-8") as f:
        jsonschema.validate(data, json.load(f))
    return data


def test_json_follows_the_documented_schema(cache_dir, capsys):
    data = report_json(capsys)
    assert data["schema"] == "opforge.report/1"
    assert set(data) == {"schema", "opforge", "platform", "prebuilt", "packages", "kinds"}
    assert data["packages"] == []  # no other package's kernels installed here
    assert {"os", "machine", "cpu", "gpus", "gpu_probe", "cxx", "nvcc", "ninja", "torch_version", "torch_cuda",
            "torch_hip", "cxx11_abi", "python_tag", "triton"} <= set(data["platform"])
    assert isinstance(data["platform"]["cpu"]["features"], list)
    assert {"directory", "present", "torch", "extensions"} <= set(data["prebuilt"])
    (kind,) = [k for k in data["kinds"] if k["kind"] == "selftest"]
    assert kind["loader"] == "opforge.kernels.selftest.loader.SelftestLoader"
    names = [c["name"] for c in kind["candidates"]]
    assert names[0] == "selftest_avx512" and names[-1] == "selftest_torch"
    for c in kind["candidates"]:
        assert set(c) == CANDIDATE_KEYS
        assert c["accepted"] == (c["available"] and c["compatible"])
        if c["accepted"]:
            assert c["state"] in ("prebuilt", "cached", "needs build", "ready")
        if not c["available"]:
            assert c["state"] is None and not c["chosen"]
    chosen = [c["name"] for c in kind["candidates"] if c["chosen"]]
    assert chosen == [kind["chosen"]]
    assert next(c for c in kind["candidates"] if c["accepted"])["name"] == kind["chosen"]
    neon = next(c for c in kind["candidates"] if c["name"] == "selftest_neon")
    if data["platform"]["machine"] == "x86_64":
        assert not neon["available"] and "aarch64" in neon["available_reason"] and neon["state"] is None


def test_plain_text_has_the_facts_and_no_ansi(cache_dir, capsys):
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert not ANSI.search(out)
    data = report_json(capsys)
    chosen = data["kinds"][0]["chosen"]
    assert re.search(rf"^\s+\*\s+{chosen}\s", out, re.MULTILINE), out
    for label in ("selftest_neon", "platform", "simd features", "c++ compiler", "nvcc", "ninja", "torch",
                  "c++11 abi", "python", "triton", "prebuilt kernels", data["platform"]["torch_version"],
                  data["platform"]["cpu"]["microarch"]):
        assert label in out, label


def test_piped_output_has_no_ansi(cache_dir):
    out = run_python("import sys; from opforge.cli.main import main; sys.exit(main(['report', 'selftest']))",
                     env={"TERM": "xterm-256color", "FORCE_COLOR": "1"})
    assert out.returncode == 0, out.stderr
    assert "selftest_avx512" in out.stdout and not ANSI.search(out.stdout)


def test_without_a_compiler_the_reasons_say_so(cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    data = report_json(capsys, "selftest")
    assert data["platform"]["cxx"] is None
    (kind,) = data["kinds"]
    assert kind["chosen"] == "selftest_torch"
    cpp = [c for c in kind["candidates"] if c["backend"] == "cpp" and c["available"]]
    assert cpp
    for c in cpp:
        assert not c["compatible"] and not c["accepted"] and not c["chosen"]
        assert "no C++ compiler" in c["compatible_reason"] and c["state"] == "needs build"
    assert main(["report", "selftest"]) == 0
    out = capsys.readouterr().out
    assert "no C++ compiler" in out and re.search(r"c\+\+ compiler\s+not found", out)
    assert re.search(r"^\s+\*\s+selftest_torch\s", out, re.MULTILINE)


def test_unknown_kind_exits_2_naming_the_kinds(capsys):
    assert main(["report", "nope"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "selftest" in err


def test_hand_built_platform_and_stale_prebuilt_record(cache_dir, tmp_path, capsys):
    info = {"format": 1, "torch": "2.12.0+cpu", "torch_git": "abc", "cuda": None, "hip": None, "cxx11_abi": True,
            "machine": "x86_64",
            "extensions": {"selftest_avx2": {"file": "selftest_avx2.so", "kind": "selftest", "backend": "cpp",
                                             "isa": "avx2"}}}
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    pb = prebuilt.read(str(tmp_path))
    gpu = Platform(cpu=HASWELL.cpu, cxx=GCC, ninja=NINJA, gpus=(Gpu(0, "NVIDIA H100", "nvidia", (9, 0), "sm_90", 80 << 30),),
                   torch=TorchFacts(cuda="13.0"))
    with open(report_cmd.SCHEMA_FILE, encoding="utf-8") as f:
        schema = json.load(f)

    def as_printed(d):  # tuples become lists, as --json prints them
        return json.loads(json.dumps(d))

    jsonschema.validate(as_printed(report_cmd.collect(("selftest",), platform=gpu, prebuilt=pb)), schema)
    data = report_cmd.collect(("selftest",), platform=HASWELL, prebuilt=pb)
    jsonschema.validate(as_printed(data), schema)
    (kind,) = data["kinds"]
    cands = {c["name"]: c for c in kind["candidates"]}
    assert kind["chosen"] == "selftest_avx2"
    assert "lacks avx512f" in cands["selftest_avx512"]["available_reason"]
    assert "prebuilt binary skipped" in cands["selftest_avx2"]["note"]
    (ext,) = data["prebuilt"]["extensions"]
    assert data["prebuilt"]["present"] and not ext["usable"] and "2.12.0+cpu" in ext["reason"]
    buf = io.StringIO()
    report_cmd.print_plain(data, buf)
    text = buf.getvalue()
    assert "haswell" in text and "8 cores" in text and "torch 2.12.0+cpu" in text and "not usable" in text
    assert "avx512f" not in text.split("simd features")[1].splitlines()[0]


def test_rich_tables_render(cache_dir):
    from rich.console import Console

    buf = io.StringIO()
    report_cmd.print_rich(report_cmd.collect(platform=HASWELL), Console(file=buf, force_terminal=True, width=160))
    text = buf.getvalue()
    assert ANSI.search(text)
    assert "selftest_avx2" in text and "haswell" in text and "prebuilt kernels" in text
