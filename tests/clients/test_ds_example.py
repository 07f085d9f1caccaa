"""DeepSpeed's cpu_adam sources, unchanged, as a pybind11 Extension of an example package
(``examples/ds_cpu_adam``, ``dsadam``): built AOT into a wheel and loaded with no compiler, built
JIT otherwise, reported, and checked against torch's AdamW and the package's pure-torch version.

One variant is prebuilt (the best this CPU runs) to keep the suite's time: every variant builds the
same two DeepSpeed sources with other ``-m`` flags. DeepSpeed must be installed (``make test`` does
it); without it these tests skip, unless ``OPFORGE_TEST_REQUIRE_CLIENTS=1`` (``.ci/run``)."""

from __future__ import annotations

import json
import os
import zipfile

import pytest
from conftest import ROOT
from wheels import build_wheel, fresh_venv, run_in

if os.environ.get("OPFORGE_TEST_REQUIRE_CLIENTS") != "1":
    pytest.importorskip("deepspeed")

EXAMPLE = os.path.join(ROOT, "examples", "ds_cpu_adam")
CODE = """
import hashlib, json, os, torch, dsadam
from dsadam import reference
k = dsadam.load()
torch.manual_seed(0)
n = 10007  # SIMD tails on every width
p0, grads = torch.randn(n), [torch.randn(n) for _ in range(3)]
def run(impl):
    p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
    impl.create_adam(7, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, False)
    for step, g in enumerate(grads, 1):
        impl.adam_update(7, step, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, p, g.clone(), m, v)
    impl.destroy_adam(7)
    return p
ours = run(k.ops)
ref = torch.nn.Parameter(p0.clone())
adamw = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01)
for g in grads:
    ref.grad = g.clone()
    adamw.step()
cache = os.environ["OPFORGE_CACHE_DIR"]
print(json.dumps({"name": k.name, "origin": k.origin, "path": k.path,
                  "vs_adamw": float((ours - ref.detach()).abs().max()),
                  "vs_reference": float((ours - run(reference)).abs().max()),
                  "bits": hashlib.sha256(ours.numpy().tobytes()).hexdigest(),
                  "cached": sorted(n for n in os.listdir(cache) if not n.startswith(".")) if os.path.isdir(cache) else []}))
"""


def best_variant() -> str:
    from opforge import isa
    from opforge.platform import current

    here = current()
    return next(f"dsadam_cpu_adam_{suffix}" for suffix, target, _ in isa.CPU_VARIANTS
                if target.buildable_on(here.machine) and target.supports(here))


def deepspeed_csrc() -> str:
    import importlib.util

    return os.path.join(importlib.util.find_spec("deepspeed").submodule_search_locations[0], "ops", "csrc")


@pytest.fixture(scope="module")
def aot(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dsadam-aot")
    whl, log = build_wheel(EXAMPLE, tmp, {"DSADAM_BUILD": best_variant()})
    return tmp, whl, log, fresh_venv(tmp, whl)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dsadam-plain")
    whl, log = build_wheel(EXAMPLE, tmp, {"DSADAM_BUILD": ""})
    return tmp, whl, log, fresh_venv(tmp, whl)


def _use(py, tmp, compiler=True) -> dict:
    return json.loads(run_in(py, tmp, CODE, compiler=compiler).splitlines()[-1])


@pytest.fixture(scope="module")
def prebuilt(aot):
    """CODE run against the wheel's prebuilt variant with no compiler: one run for the two tests that read it."""
    tmp, _, _, py = aot
    return _use(py, tmp, compiler=False)


def test_the_wheel_carries_deepspeeds_sources_unchanged_and_one_prebuilt_variant(aot):
    _, whl, log, _ = aot
    variant = best_variant()
    with zipfile.ZipFile(whl) as z:
        info = json.loads(z.read("dsadam/_C/build_info.json"))
        for rel in ("adam/cpu_adam.cpp", "adam/cpu_adam_impl.cpp", "includes/cpu_adam.h", "includes/simd.h"):
            with open(os.path.join(deepspeed_csrc(), rel), "rb") as f:
                assert z.read(f"dsadam/csrc/{rel}") == f.read(), rel
        names = z.namelist()
    assert f"dsadam: DSADAM_BUILD={variant}: building {variant}" in log
    assert list(info["extensions"]) == [variant] and f"dsadam/_C/{info['extensions'][variant]['file']}" in names
    assert "-march=native" not in " ".join(info["extensions"][variant]["cflags"])  # explicit ISA flags instead


def test_prebuilt_loads_with_no_compiler_and_steps_as_torch_adamw(prebuilt):
    got = prebuilt
    assert (got["name"], got["origin"], got["cached"]) == (best_variant(), "prebuilt", [])
    assert got["vs_adamw"] < 1e-5 and got["vs_reference"] < 1e-5


def test_the_report_lists_the_variants_with_their_verdicts(aot):
    tmp, _, _, py = aot
    report = json.loads(run_in(py, tmp, None, args=("-m", "opforge.cli", "report", "dsadam_cpu_adam", "--json"),
                               compiler=False))
    (kind,) = report["kinds"]
    assert kind["loader"] == "dsadam.kernels.DSCPUAdamLoader" and kind["chosen"] == best_variant()
    states = {c["name"]: c["state"] for c in kind["candidates"]}
    assert states[best_variant()] == "prebuilt" and states["dsadam_cpu_adam_torch"] == "ready"


def test_doctor_checks_the_packages_prebuilt_binary(aot):
    tmp, _, _, py = aot
    doctor = json.loads(run_in(py, tmp, None, args=("-m", "opforge.cli", "doctor", "--no-build", "--json")))
    (check,) = [c for c in doctor["checks"] if c["name"] == f"prebuilt {best_variant()} of dsadam._C"]
    assert check["status"] == "ok", check


def test_plain_wheel_builds_just_in_time_then_loads_from_the_cache_identically(prebuilt, plain):
    tmp, whl, _, py = plain
    with zipfile.ZipFile(whl) as z:
        assert not [n for n in z.namelist() if n.endswith(".so")] and "dsadam/csrc/adam/cpu_adam.cpp" in z.namelist()
    first = _use(py, tmp)
    assert (first["name"], first["origin"], first["cached"]) == (best_variant(), "built", [best_variant()])
    assert first["vs_adamw"] < 1e-5 and first["vs_reference"] < 1e-5
    second = _use(py, tmp, compiler=False)
    assert (second["origin"], second["path"], second["bits"]) == ("cached", first["path"], first["bits"])
    assert prebuilt["bits"] == first["bits"]  # setuptools' build of the same sources and flags


def test_plain_wheel_with_no_compiler_runs_deepspeeds_functions_in_torch(plain, tmp_path):
    _, _, _, py = plain
    got = _use(py, tmp_path, compiler=False)
    assert (got["name"], got["origin"]) == ("dsadam_cpu_adam_torch", "python")
    assert got["vs_adamw"] < 1e-5  # the torch version of DeepSpeed's functions steps as AdamW does
