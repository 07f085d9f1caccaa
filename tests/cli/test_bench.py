"""``opforge bench``: the timing, the checks, the JSON against its schema, the table, the plot
and the command line's errors. The real run is ``--quick`` (seconds); its figures are not
checked, only that they are there, consistent and valid."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jsonschema
import pytest
import torch
from conftest import ROOT, has_cxx

from opforge.bench import plot, table
from opforge.bench.model import OPFORGE, PEER, Case, FamilyResult, Impl, Missing, Options
from opforge.bench.report import SCHEMA, SCHEMA_FILE
from opforge.bench.runner import rel_err, run_case
from opforge.bench.timing import Plan, Timing, format_seconds, measure

FAST = Plan(warmup=1, repeats=3, target_s=1e-4)


def validate(doc: dict) -> None:
    with open(SCHEMA_FILE) as f:
        jsonschema.validate(doc, json.load(f))


def opforge_bench(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "opforge.cli", "bench", *args], env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)


# -- timing


def test_timing_statistics():
    t = Timing((3.0, 1.0, 2.0, 10.0, 2.5), calls=4)
    assert (t.median, t.min, t.max, t.calls) == (2.5, 1.0, 10.0, 4)
    assert t.quartiles == (2.0, 3.0)
    assert t.spread == pytest.approx(9.0 / 2.5)
    j = t.to_json()
    assert j["repeats"] == 5 and j["samples_s"] == [3.0, 1.0, 2.0, 10.0, 2.5] and j["q1_s"] == 2.0


def test_measure_warms_up_sizes_batches_and_rotates():
    order, calls = [], {"a": 0, "b": 0}

    def fn(name):
        def call():
            calls[name] += 1
            order.append(name)
        return call

    got = measure({"a": fn("a"), "b": fn("b")}, torch.device("cpu"), Plan(warmup=2, repeats=4, target_s=1e-9))
    assert {n: (len(t.samples), t.calls) for n, t in got.items()} == {"a": (4, 1), "b": (4, 1)}
    # 2 warm-up + 1 trial each, then 4 rounds whose order rotates: ab, ba, ab, ba
    assert order[6:] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert calls == {"a": 7, "b": 7}


def test_measure_batches_fast_calls_to_the_target():
    got = measure({"noop": lambda: None}, torch.device("cpu"), Plan(warmup=0, repeats=2, target_s=1e-3))
    assert got["noop"].calls > 10  # a no-op lasts well under 100 µs: many calls a batch


def test_plan_rejects_nonsense():
    for bad in ({"warmup": -1}, {"repeats": 0}, {"target_s": 0.0}):
        with pytest.raises(ValueError, match="Plan"):
            Plan(**bad)


def test_format_seconds():
    assert [format_seconds(v) for v in (2.5, 0.0125, 3.2e-5, None)] == ["2.50 s", "12.50 ms", "32.0 µs", "-"]


# -- checks and failures


def test_rel_err():
    a = torch.tensor([1.0, 2.0])
    assert rel_err([a], [a]) == 0.0
    a64 = a.double()
    assert rel_err([a64 + 1e-3], [a64]) == pytest.approx(math.sqrt(2e-6) / math.sqrt(5))
    assert rel_err([torch.tensor([1.0, float("nan")])], [a]) == math.inf
    assert rel_err([a[:1]], [a]) == math.inf
    assert rel_err([a], [a, a]) == math.inf


def _case(opforge_call, op="fwd", baseline="ref") -> Case:
    x = torch.arange(8.0)
    return Case(op, "8 fp32", {"dtype": "fp32", "numel": 8}, (
        Impl("ref", PEER, lambda: x * 2),
        Impl("broken peer", PEER, lambda: 1 / 0),
        Impl("mine", OPFORGE, opforge_call),
    ), baseline, tol=1e-6)


def test_run_case_checks_against_the_reference_and_reports_errors():
    x = torch.arange(8.0)
    res = run_case(_case(lambda: x + x), torch.device("cpu"), FAST)
    ref, peer, mine = res.rows
    assert peer.error.startswith("ZeroDivisionError") and peer.timing is None and peer.check is None
    assert mine.check.ok and mine.check.rel_err == 0.0 and mine.check.against == "ref"
    assert ref.speedup == pytest.approx(1.0) and mine.speedup == pytest.approx(ref.median / mine.median)
    assert res.failures == []  # a peer that can't run is not opforge's failure
    assert res.ratio("mine", "ref") == pytest.approx(mine.speedup)
    assert res.ratio("mine", "broken peer") is None


def test_a_wrong_or_raising_opforge_is_a_failure():
    x = torch.arange(8.0)
    wrong = run_case(_case(lambda: x * 3), torch.device("cpu"), FAST)
    assert not wrong.row("mine").check.ok
    assert wrong.failures and "relative error" in wrong.failures[0]
    assert wrong.row("mine").timing is not None  # timed anyway, marked
    raising = run_case(_case(lambda: torch.zeros(2) @ torch.zeros(3)), torch.device("cpu"), FAST)
    assert raising.row("mine").error and raising.row("mine").timing is None
    assert "mine" in raising.failures[0]


def test_outputs_are_snapshotted_before_the_next_implementation_runs():
    buf = torch.zeros(4)

    def writes(v):
        def call():
            buf.fill_(v)
            return buf
        return call

    case = Case("fwd", "4", {"dtype": "fp32"}, (Impl("ref", PEER, writes(1.0)), Impl("mine", OPFORGE, writes(2.0))),
                "ref", tol=1e-6)
    # both return the same buffer: compared as the values each call left, not the buffer's last state
    assert not run_case(case, torch.device("cpu"), FAST).row("mine").check.ok


def test_impl_role_is_checked():
    with pytest.raises(ValueError, match="role"):
        Impl("x", "other", lambda: None)


# -- the JSON, the table and the plot, from a synthetic run (no kernels)


def synthetic_doc(tmp_path) -> dict:
    from opforge.bench.report import Report
    from opforge.platform import current

    x = torch.arange(8.0)
    cases = tuple(run_case(_case(lambda: x + x, op), torch.device("cpu"), FAST) for op in ("fwd", "fwd+bwd"))
    dens = []
    for d in (0.5, 0.25):
        c = run_case(_case(lambda: x + x), torch.device("cpu"), FAST)
        dens.append(type(c)(c.op, f"d={d}", {"dtype": "fp32", "block": 32, "density": d, "tokens": 8,
                                              "in_features": 8, "out_features": 8}, c.baseline, c.rows))
    fams = (FamilyResult("bias_act", "cpu", "ok", "", "bias_act_avx2", 0.1, (Missing("torch.compile", "off"),), cases),
            FamilyResult("block_sparse", "cpu", "ok", "", "block_sparse_torch", 0.0, (), tuple(dens)),
            FamilyResult("cpu_adam", "cuda", "skipped", "cpu_adam has no cuda kernels"),
            FamilyResult("bias_act", "cuda", "failed", "could not load opforge's kernel: BuildError: x"))
    report = Report(fams, current(), Options(quick=True, compile=False), {"cpu": FAST}, 0.0, 1.0)
    path = tmp_path / "run.json"
    report.write_json(str(path))
    return json.loads(path.read_text())


def test_synthetic_report_validates_and_counts_failures(tmp_path):
    doc = synthetic_doc(tmp_path)
    validate(doc)
    assert doc["schema"] == SCHEMA
    assert [f["status"] for f in doc["families"]] == ["ok", "ok", "skipped", "failed"]
    broken = doc["families"][0]["cases"][0]["results"][1]
    assert broken["time"] is None and broken["error"].startswith("ZeroDivisionError")


def test_schema_rejects_what_it_should(tmp_path):
    doc = synthetic_doc(tmp_path)
    for damage in (lambda d: d.pop("platform"), lambda d: d.update(schema="opforge.bench/0"),
                   lambda d: d["families"][0].update(status="fine"),
                   lambda d: d["families"][0]["cases"][0]["results"][0]["time"].update(repeats=0),
                   lambda d: d["families"][0]["cases"][0]["results"][0].update(role="mine"),
                   lambda d: d["families"][2].update(cases=d["families"][0]["cases"])):
        bad = json.loads(json.dumps(doc))
        damage(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)


def test_table_lines(tmp_path):
    from opforge.bench.model import CaseResult, Row

    t = Timing((1e-3, 1e-3, 1e-3), 1)
    slow = Timing((4e-3, 4e-3, 4e-3), 1)
    case = CaseResult("fwd", "8 fp32", {"dtype": "fp32"}, "eager", (
        Row("eager", PEER, slow, speedup=1.0), Row("compile", PEER, None, error="BackendCompilerFailed: no cc"),
        Row("opforge", OPFORGE, t, first_call_s=2.0, speedup=4.0)))
    fam = FamilyResult("bias_act", "cpu", "ok", "", "bias_act_avx2", 0.1, (Missing("DeepSpeed", "not installed"),),
                       (case,))
    title, headers, rows, notes = table.lines(fam)
    assert title == "bias_act on cpu (opforge variant: bias_act_avx2)"
    assert headers == ["case", "eager", "compile", "opforge", "vs eager", "vs compile"]
    assert rows == [["fwd 8 fp32", "4.00 ms ±0%", "error", "1.00 ms ±0%", "4.00x", "-"]]
    assert any("DeepSpeed: not timed: not installed" in n for n in notes)
    assert any("compile: BackendCompilerFailed" in n for n in notes)
    assert any(n.startswith("opforge: first call up to 2.00 s") for n in notes)


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    doc = synthetic_doc(tmp_path)
    out = tmp_path / "run.png"
    drawn = plot.draw(doc, str(out))
    assert drawn == ["bars: bias_act on cpu", "density: block_sparse on cpu"]
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1650, 550)  # two panels side by side, 7.5 x 5 in at 110 dpi
    assert plot.main([str(tmp_path / "run.json"), str(tmp_path / "again.png")]) == 0


def test_plot_with_nothing_to_draw_says_so(tmp_path):
    pytest.importorskip("matplotlib")
    doc = synthetic_doc(tmp_path)
    doc["families"] = doc["families"][2:]
    with pytest.raises(ValueError, match="nothing to plot"):
        plot.draw(doc, str(tmp_path / "x.png"))


# -- the command line


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "unknown kernel kind: nosuch; the kinds are: bias_act, block_sparse, block_sparse_decode, cpu_adam"),
    (["--plot", "out.svg"], "give a file name ending in .png"),
    (["--json", "/nonexistent-dir/x.json"], "/nonexistent-dir does not exist"),
    (["--repeats", "0"], "give at least 1"),
])
def test_bad_arguments_exit_2_before_running(args, message):
    r = opforge_bench(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "opforge bench:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_a_clear_error():
    r = opforge_bench("--device", "cuda", "cpu_adam")
    assert r.returncode == 2 and "torch sees no CUDA GPU" in r.stderr


def test_plot_without_matplotlib_names_the_fix(tmp_path):
    blocker = tmp_path / "no_mpl"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('hidden for this test')\n")
    r = opforge_bench("--plot", str(tmp_path / "x.png"), env={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})
    assert r.returncode == 2 and "pip install 'opforge[plot]'" in r.stderr


def check_real_run(doc: dict, devices: set[str]) -> None:
    validate(doc)
    assert doc["options"]["quick"] and not doc["options"]["compile"]
    ran = {(f["kind"], f["device"]) for f in doc["families"] if f["status"] == "ok"}
    expected = {("cpu_adam", "cpu"), ("bias_act", "cpu"), ("block_sparse", "cpu"), ("warm_start", "cpu")} | \
        ({("bias_act", "cuda"), ("block_sparse", "cuda"), ("block_sparse_decode", "cuda")} if "cuda" in devices
         else set())
    assert ran == expected, [(f["kind"], f["device"], f["reason"]) for f in doc["families"]]
    for fam in doc["families"]:
        for case in fam["cases"]:
            res = {r["impl"]: r for r in case["results"]}
            base = res[case["baseline"]]
            assert base["speedup"] == pytest.approx(1.0)
            ours = [r for r in case["results"] if r["role"] == "opforge"]
            assert len(ours) == 1, case
            (mine,) = ours
            assert mine["error"] is None and mine["check"]["ok"], (fam["kind"], case["label"], mine)
            repeats = doc["options"]["plans"][fam["device"]]["repeats"]
            assert len(mine["time"]["samples_s"]) == repeats
            assert mine["speedup"] == pytest.approx(base["time"]["median_s"] / mine["time"]["median_s"])
    by_kind = {f["kind"]: f for f in doc["families"] if f["device"] == "cpu"}
    assert {m["impl"] for m in by_kind["bias_act"]["missing"]} == {"torch.compile"}  # --quick leaves it out
    densities = {c["params"]["density"] for c in by_kind["block_sparse"]["cases"]}
    assert len(densities) >= 3


@pytest.mark.skipif(not has_cxx(), reason="needs a C++ compiler")
def test_quick_run_writes_valid_json_and_a_plot(tmp_path, shared_cache):
    """DeepSpeed hidden: its peer row would have torch's load build DeepSpeed's cpu_adam (two torch/extension.h
    sources, ~3 min here) into ~/.cache/torch_extensions. The row with the real DeepSpeedCPUAdam, built once:
    tests/clients/test_deepspeed.py::test_the_bench_times_deepspeeds_cpu_adam_beside_opforges."""
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["--quick", "--json", str(out)] + (["--plot", str(png)] if _has_matplotlib() else [])
    blocker = tmp_path / "no_deepspeed"
    blocker.mkdir()
    (blocker / "deepspeed.py").write_text("raise ImportError('hidden for this test')\n")
    r = opforge_bench(*args, "--device", "cpu", env={"OPFORGE_CACHE_DIR": str(shared_cache),
                                                      "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}",
                                                      "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")})
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    check_real_run(doc, {"cpu"})
    (adam,) = [f for f in doc["families"] if f["kind"] == "cpu_adam"]
    assert [(m["impl"], m["reason"].split(" (")[0]) for m in adam["missing"]] == [
        ("DeepSpeedCPUAdam", "deepspeed is not installed")]
    assert "vs torch AdamW fused" in r.stdout and "vs torch eager" in r.stdout and "vs dense" in r.stdout
    if _has_matplotlib():
        assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.cuda
def test_quick_run_on_the_gpu(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    args = ["--quick", "--json", str(out)] + (["--plot", str(png)] if _has_matplotlib() else [])
    r = opforge_bench(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    check_real_run(json.loads(out.read_text()), {"cpu", "cuda"})


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", ["bench_h100.json", "bench_cpu_2core.json"])
def test_published_runs_validate(name):
    """The runs docs/benchmarks.md quotes (docs/data/) are in the schema's current version."""
    with open(os.path.join(ROOT, "docs", "data", name)) as f:
        doc = json.load(f)
    validate(doc)
    assert all(f["status"] != "failed" for f in doc["families"])


def test_a_case_that_cannot_be_set_up_fails_the_family_not_the_run(monkeypatch):
    from opforge.bench import runner
    from opforge.bench.suites.base import Suite

    x = torch.arange(8.0)

    class Flaky(Suite):
        kind = "flaky"

        def __init__(self, device, options):
            super().__init__(device, options)
            self.variant = "flaky_torch"

        def cases(self):
            yield _case(lambda: x + x)
            raise MemoryError("no room for the second case's inputs")

    monkeypatch.setitem(runner.SUITES, "flaky", Flaky)
    fam = runner.run_family("flaky", torch.device("cpu"), Options(), FAST)
    assert fam.status == "failed" and len(fam.cases) == 1
    assert "could not set up a case after 1: MemoryError: no room" in fam.reason
    assert fam.failures == [f"flaky on cpu: {fam.reason}"]
    from opforge.bench.report import Report
    from opforge.platform import current

    validate(json.loads(json.dumps(Report((fam,), current(), Options(), {"cpu": FAST}, 0.0, 1.0).to_json())))
