"""opforge as the build layer of another package: ``examples/downstream_pkg`` (``myops``), built
as a wheel with ``MYOPS_BUILD=all`` (AOT) and without (plain), each installed into a fresh venv.

* AOT: the op loads its prebuilt binary with the compiler hidden and an empty cache.
* Plain: the first process builds the op just in time, the next imports it from the cache;
  with no compiler, the pure-torch implementation runs.
* ``opforge report`` finds the package's kernel kind through its ``opforge.kernels`` entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT
from wheels import build_wheel, fresh_venv, run_in

EXAMPLE = os.path.join(ROOT, "examples", "downstream_pkg")
CODE = """
import json, os, sys, warnings, torch, myops
from myops import ScaleAddLoader
assert myops.__file__.startswith(sys.prefix), myops.__file__
x, y = torch.randn(1001), torch.randn(1001)
torch.testing.assert_close(myops.scale_add(x, y, 3.0), 3.0 * x + y)
k = ScaleAddLoader().load(device="cpu")
cache = os.environ["OPFORGE_CACHE_DIR"]
print(json.dumps({"name": k.name, "origin": k.origin,
                  "cached": sorted(n for n in os.listdir(cache) if not n.startswith(".")) if os.path.isdir(cache) else []}))
"""


def wheel(tmp, build: str):
    return build_wheel(EXAMPLE, tmp, {"MYOPS_BUILD": build})


@pytest.fixture(scope="module")
def aot(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("myops-aot")
    whl, log = wheel(tmp, "all")
    return tmp, whl, log, fresh_venv(tmp, whl)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("myops-plain")
    whl, log = wheel(tmp, "")
    return tmp, whl, log, fresh_venv(tmp, whl)


def test_aot_wheel_carries_the_binary_and_its_record(aot):
    _, whl, log, _ = aot
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        info = json.loads(z.read("myops/_C/build_info.json"))
    assert "myops: MYOPS_BUILD=all: building myops_scale_add_cpp" in log
    record = info["extensions"]["myops_scale_add_cpp"]
    assert f"myops/_C/{record['file']}" in names and record["stable_abi"] == "2.10"
    assert "myops/csrc/scale_add.cpp" in names  # the JIT fallback's source travels too
    assert not [n for n in names if n.startswith("opforge/")]  # opforge's own package is untouched


def test_aot_loads_prebuilt_with_no_compiler(aot):
    tmp, _, _, py = aot
    got = json.loads(run_in(py, tmp, CODE, compiler=False).splitlines()[-1])
    assert got == {"name": "myops_scale_add_cpp", "origin": "prebuilt", "cached": []}


def test_plain_wheel_builds_just_in_time_then_imports_from_the_cache(plain):
    tmp, whl, _, py = plain
    with zipfile.ZipFile(whl) as z:
        assert not [n for n in z.namelist() if n.endswith(".so")]
    first = json.loads(run_in(py, tmp, CODE).splitlines()[-1])
    assert first == {"name": "myops_scale_add_cpp", "origin": "built", "cached": ["myops_scale_add_cpp"]}
    second = json.loads(run_in(py, tmp, CODE, compiler=False).splitlines()[-1])
    assert second["origin"] == "cached" and second["name"] == "myops_scale_add_cpp"


def test_plain_wheel_with_no_compiler_runs_the_torch_fallback(plain, tmp_path):
    _, _, _, py = plain
    got = json.loads(run_in(py, tmp_path, CODE, compiler=False).splitlines()[-1])
    assert got == {"name": "myops_scale_add_torch", "origin": "python", "cached": []}


def test_report_lists_the_package_kernels_through_its_entry_point(aot):
    tmp, _, _, py = aot
    report = json.loads(run_in(py, tmp, code="", args=("-m", "opforge.cli", "report", "myops_scale_add", "--json"),
                               compiler=False))
    (kind,) = report["kinds"]
    assert kind["kind"] == "myops_scale_add" and kind["loader"] == "myops.kernels.ScaleAddLoader"
    assert kind["chosen"] == "myops_scale_add_cpp"
    states = {c["name"]: c["state"] for c in kind["candidates"]}
    assert states == {"myops_scale_add_cpp": "prebuilt", "myops_scale_add_torch": "ready"}
    (pkg,) = report["packages"]  # the package's own prebuilt record, beside opforge's
    assert pkg["package"] == "myops._C" and pkg["present"] and pkg["directory"].endswith(os.path.join("myops", "_C"))
    assert [(e["name"], e["usable"]) for e in pkg["extensions"]] == [("myops_scale_add_cpp", True)]
    text = run_in(py, tmp, code="", args=("-m", "opforge.cli", "report"), compiler=False)
    assert "prebuilt kernels of myops._C" in text and "myops_scale_add_cpp" in text


def test_report_says_a_plain_install_has_no_prebuilt_kernels(plain):
    tmp, _, _, py = plain
    report = json.loads(run_in(py, tmp, code="", args=("-m", "opforge.cli", "report", "--json"), compiler=False))
    (pkg,) = report["packages"]
    assert pkg["package"] == "myops._C" and not pkg["present"] and pkg["extensions"] == []


def test_setup_extensions_refuses_extensions_left_in_opforges_package():
    from opforge.aot import setup_extensions
    from opforge.kernel_loader import SelftestLoader

    with pytest.raises(TypeError, match=r"aot_package = \"<yourpkg>._C\""):
        setup_extensions([SelftestLoader], env="MYOPS_BUILD", request="all")


def test_a_broken_entry_point_is_left_out_with_a_warning(tmp_path):
    """A package whose entry point fails to import must not break opforge."""
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[opforge.kernels]\nbroken = no_such_module_here\n")
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from opforge.registry import loaders, load_plugins\n"
            "kinds = loaders()\n"
            "assert 'selftest' in kinds and load_plugins() == [], load_plugins()\n"
            "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
    assert "entry point 'broken' (no_such_module_here) could not be imported" in out.stderr
    assert "ModuleNotFoundError" in out.stderr


def test_messages_name_the_package_that_prebuilds_it():
    from opforge import CppExtension
    from opforge.kernel_loader import SelftestLoader

    class Theirs(CppExtension):  # declared, not registered: the hint is all this checks
        name, kind, aot_package = "theirs_cpp", "theirs", "myops._C"

    assert Theirs().prebuild_hint() == "reinstall myops with theirs prebuilt (its own build variable, see myops's docs)"
    ours = SelftestLoader().extensions()[0]
    assert ours.prebuild_hint() == f"reinstall opforge with OPFORGE_BUILD={ours.kind} to prebuild it"
