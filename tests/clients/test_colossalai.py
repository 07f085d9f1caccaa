"""ColossalAI's own ``CpuAdamX86Extension`` / ``CpuAdamArmExtension`` classes (the ``extensions/``
directory of its PyPI sdist, unchanged), adopted by an opforge loader (``examples/colossalai_adopt``).

* Here (no GPU): the x86 class is a ColossalAI ``_CudaExtension``, which wants CUDA; the report
  shows every x86 variant rejected with that reason, the Arm one rejected by its own check, and
  the loader falls back to the torch version, which steps as torch's AdamW does.
* On a GPU machine (``-m cuda``): the best ISA variant builds through opforge, steps as AdamW
  does, and the next process loads it from the cache.

``make test`` downloads the sdist into ``.venv/clients``; ``OPFORGE_TEST_COLOSSALAI_SDIST`` names
another (``.ci/gpu`` sets it to the one carried in ``.whl/``: the GPU machine has no network). Without
it these tests skip, unless ``OPFORGE_TEST_REQUIRE_CLIENTS=1`` (``.ci/run`` and ``.ci/gpu``): then a
missing sdist is an error."""

from __future__ import annotations

import glob
import json
import os
import tarfile

import pytest
from conftest import ROOT, has_cuda, run_python

EXAMPLE = os.path.join(ROOT, "examples", "colossalai_adopt")


def sdist() -> str | None:
    given = os.environ.get("OPFORGE_TEST_COLOSSALAI_SDIST")
    if given:
        return given
    found = sorted(glob.glob(os.path.join(ROOT, ".venv", "clients", "colossalai-*.tar.gz")))
    return found[-1] if found else None


if sdist() is None or not os.path.isfile(sdist()):
    if os.environ.get("OPFORGE_TEST_REQUIRE_CLIENTS") == "1":
        raise RuntimeError(f"ColossalAI's sdist is missing ({sdist() or '.venv/clients/colossalai-*.tar.gz'}): "
                           "`make test` downloads it into .venv/clients; on the GPU machine .ci/gpu takes it from .whl/")
    pytest.skip("ColossalAI's sdist is not here (make test downloads it)", allow_module_level=True)

USE = """
import json, sys, warnings, torch
from cai_kernels import ColossalCPUAdamLoader
k = ColossalCPUAdamLoader().load(device="cpu")
torch.manual_seed(0)
n = 10007
p0, grads = torch.randn(n), [torch.randn(n) for _ in range(3)]
opt = k.CPUAdamOptimizer(1e-2, 0.9, 0.999, 1e-8, 0.01, True)
p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
for step, g in enumerate(grads, 1):
    opt.step(step, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, p, g.clone(), m, v, -1.0)
ref = torch.nn.Parameter(p0.clone())
adamw = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01)
for g in grads:
    ref.grad = g.clone()
    adamw.step()
print(json.dumps({"name": k.name, "origin": k.origin, "path": k.path, "err": float((p - ref.detach()).abs().max())}))
"""


@pytest.fixture(scope="module")
def colossalai(tmp_path_factory):
    """The sdist's ``extensions/`` (and licence), unpacked: the directory to put on sys.path."""
    root = tmp_path_factory.mktemp("colossalai")
    with tarfile.open(sdist()) as tar:
        top = tar.getnames()[0].split("/")[0]
        members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/extensions/") or m.name == f"{top}/LICENSE"]
        tar.extractall(root, members=members, filter="data")
    return root / top


def _env(colossalai, cache_dir, **extra) -> dict:
    path = [str(colossalai), EXAMPLE, ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path), "OPFORGE_CACHE_DIR": str(cache_dir), **extra}


def _use(colossalai, cache_dir) -> dict:
    out = run_python(USE, env=_env(colossalai, cache_dir), timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "stderr": out.stderr[-3000:]}


@pytest.mark.skipif(has_cuda(), reason="the CPU-only half: on a GPU machine the x86 class is accepted")
def test_on_a_cpu_machine_the_report_shows_the_x86_class_rejected_needing_cuda(colossalai, cache_dir):
    report = run_python("import runpy, sys; sys.argv = ['opforge', 'report', 'colossal_cpu_adam', '--import', "
                        "'cai_kernels', '--json']; runpy.run_module('opforge.cli', run_name='__main__')",
                        env=_env(colossalai, cache_dir), timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    # said once, as a notice about its flags (not a fallback), with the architecture read from its own checks
    assert report.stderr.count("-march=native") == 1 and "KernelFallbackWarning" not in report.stderr
    assert ("DeclarationWarning: cpu_adam_x86 (extensions.pybind.cpu_adam.cpu_adam_x86.CpuAdamX86Extension): opforge "
            "dropped -march=native (one variant per CPU ISA instead), -std=c++14") in report.stderr
    assert '; its variants are for x86_64 only: its checks say x86_64 ("x86_64")' in report.stderr
    (kind,) = json.loads(report.stdout)["kinds"]
    cands = {c["name"]: c for c in kind["candidates"]}
    x86 = [c for name, c in cands.items() if name.startswith("cpu_adam_x86_")]
    assert sorted(c["name"] for c in x86) == ["cpu_adam_x86_avx2", "cpu_adam_x86_avx512", "cpu_adam_x86_scalar"]
    for c in x86:
        assert not c["accepted"] and "it is a _CudaExtension: it needs CUDA" in c["available_reason"]
        assert c["adopted_from"] == "extensions.pybind.cpu_adam.cpu_adam_x86.CpuAdamX86Extension"
    arm = cands["cpu_adam_arm"]
    assert not arm["accepted"] and "requires the CPU architecture to be aarch64" in arm["compatible_reason"]
    assert kind["chosen"] == "colossal_cpu_adam_torch"
    text = run_python("import runpy, sys; sys.argv = ['opforge', 'report', 'colossal_cpu_adam', '--import', "
                      "'cai_kernels']; runpy.run_module('opforge.cli', run_name='__main__')",
                      env=_env(colossalai, cache_dir), timeout=300)
    assert text.returncode == 0 and "prebuilt kernels of" not in text.stdout, text.stdout  # no empty section

    got = _use(colossalai, cache_dir)  # the loader falls back to the torch version of ColossalAI's API
    assert (got["name"], got["origin"]) == ("colossal_cpu_adam_torch", "python") and got["err"] < 1e-5


@pytest.mark.cuda
def test_on_a_gpu_machine_the_x86_class_builds_through_opforge_and_steps_as_adamw(colossalai, cache_dir):
    cold = _use(colossalai, cache_dir)
    assert cold["name"].startswith("cpu_adam_x86_") and cold["origin"] == "built", cold["stderr"]
    assert cold["path"].startswith(str(cache_dir)) and cold["err"] < 1e-5
    warm = _use(colossalai, cache_dir)
    assert (warm["name"], warm["origin"], warm["path"]) == (cold["name"], "cached", cold["path"])
    print(f"ColossalAI {os.path.basename(sdist())}: {cold['name']} built by opforge, max |diff| vs torch AdamW "
          f"{cold['err']:.2e}; next process: {warm['origin']}")
