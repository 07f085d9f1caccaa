"""``OPFORGE_PATCH_TORCH=1 python train.py``, where nothing imports opforge: the startup hook
(``opforge-patch-torch.pth`` -> ``_opforge_startup``) patches torch's ``load`` / ``load_inline`` from the
first import of ``torch.utils.cpp_extension``, in a wheel install and an editable one; unset, it imports
nothing; ``opforge doctor`` says whether it is active."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
from conftest import ROOT, pymod_source
from wheels import build_wheel, checkout_copy, venv_with

import _opforge_startup
from opforge import settings
from opforge.cli import doctor_patch

HEAVY = ("torch", "opforge", "_opforge_startup")


def test_the_variable_is_0_or_1():
    assert [settings.current({"OPFORGE_PATCH_TORCH": v}).patch_torch for v in ("", "0", "1", " 1 ")] == \
        [False, False, True, True]
    assert settings.current({}).patch_torch is False
    for bad in ("2", "true", "yes"):
        with pytest.raises(ValueError, match=rf"OPFORGE_PATCH_TORCH='{bad}': use 1 .* or 0"):
            settings.current({"OPFORGE_PATCH_TORCH": bad})


# What site does with the installed .pth, then a script's own imports (-S: no installed hook runs).
_SITE = _opforge_startup.PTH_LINE
_IMPORTED = "import sys; print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
_LIBRARY = "from torch.utils.cpp_extension import load  # a library's import, right after torch's\n"


def hooked(code: str, value: str | None, tmp_path, site: bool = True):
    """Run ``code`` under ``python -S`` with the .pth line first (``site``), opforge and torch importable,
    and a module ``lib`` that takes torch's ``load`` at its import; OPFORGE_PATCH_TORCH=``value``."""
    (tmp_path / "lib.py").write_text(_LIBRARY)
    paths = os.pathsep.join([str(tmp_path), ROOT, *[p for p in sys.path if p.endswith("site-packages")]])
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_PATCH_TORCH"}
    if value is not None:
        env["OPFORGE_PATCH_TORCH"] = value
    env["PYTHONPATH"] = paths
    full = "import json\n" + (_SITE if site else "") + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-S", "-c", full], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_unset_or_0_the_line_imports_nothing(tmp_path):
    for value in (None, "0"):
        out = hooked(_IMPORTED.format(heavy=HEAVY), value, tmp_path)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == []


def test_set_the_first_import_of_torchs_module_is_patched(tmp_path):
    code = f"""
    {_IMPORTED.format(heavy=HEAVY)}
    import lib                                   # imports torch.utils.cpp_extension for the first time
    from torch.utils import cpp_extension
    print(json.dumps([hasattr(lib.load, "__opforge_routes__"), cpp_extension.load is lib.load]))
    import opforge                               # later: still one patch
    print(json.dumps([opforge.patch._DEPTH[0], type(sys.meta_path[0]).__name__]))
    opforge.unpatch_torch()
    print(json.dumps([cpp_extension.load is lib.load.__opforge_routes__]))
    """
    out = hooked(code, "1", tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert lines == [["_opforge_startup"], [True, True], [1, lines[2][1]], [True]]
    assert lines[2][1] != "_Finder"  # the hook left sys.meta_path


def test_a_bad_value_fails_the_import_it_would_patch(tmp_path):
    code = """
    for _ in range(2):
        try:
            import lib
        except ValueError as exc:
            print(exc)
    """
    out = hooked(code, "2", tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["OPFORGE_PATCH_TORCH='2': use 1 (torch's load and load_inline go through "
                                       "opforge) or 0 (off, the default)"] * 2


def test_import_opforge_without_the_hook_patches_torch_when_it_comes(tmp_path):
    # A source tree on PYTHONPATH and no installed hook: `import opforge` with the variable set does it,
    # without importing torch, and at once when torch's module is there already.
    code = """
    import opforge
    print(json.dumps(["torch" in sys.modules]))
    import lib
    print(json.dumps([hasattr(lib.load, "__opforge_routes__")]))
    """
    out = hooked("import sys\n" + textwrap.dedent(code), "1", tmp_path, site=False)
    assert out.returncode == 0, out.stderr
    assert [json.loads(ln) for ln in out.stdout.splitlines()] == [[False], [True]]
    code = """
    import torch.utils.cpp_extension as c
    import opforge
    print(json.dumps([hasattr(c.load, "__opforge_routes__")]))
    """
    out = hooked(code, "1", tmp_path, site=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True]


# -- installed: a wheel and an editable install, each in a fresh venv ---------------------------------

TRAIN = """
import importlib, json, os, sys
start = sorted(m for m in {heavy!r} if m in sys.modules)
from torch.utils.cpp_extension import load     # the script knows nothing of opforge
mod = load(name="hooked_plugin", sources=[{src!r}])
same = importlib.import_module("hooked_plugin") is mod
print(json.dumps({{"start": start, "value": mod.value(), "file": mod.__file__, "import_module": same,
                  "opforge": sys.modules["opforge"].__file__}}))
"""


@pytest.fixture(scope="module", params=["wheel", "editable"])
def installed(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    src = checkout_copy(tmp / "checkout")
    if request.param == "wheel":
        wheel, _ = build_wheel(src, tmp, {"OPFORGE_BUILD": ""})
        with zipfile.ZipFile(wheel) as z:
            assert z.read(_opforge_startup.PTH_NAME).decode() == _opforge_startup.PTH_LINE
            assert "_opforge_startup.py" in z.namelist()
        return request.param, venv_with(tmp, wheel), tmp, tmp / "venv"
    return request.param, venv_with(tmp, "-e", src), tmp, src


def in_venv(py, tmp, code, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPFORGE_PATCH_TORCH")}
    full.update({"OPFORGE_CACHE_DIR": str(tmp / "cache"), "HOME": str(tmp), "TORCH_EXTENSIONS_DIR": str(tmp / "tx")})
    full.update(env)
    out = subprocess.run([str(py), *code], env=full, capture_output=True, text=True, cwd=str(tmp), timeout=300,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_installed_the_variable_alone_routes_torchs_load(installed):
    kind, py, tmp, home = installed
    plugin = tmp / "hooked_plugin.cpp"
    plugin.write_text(pymod_source("hooked_plugin", 9, multi_phase=True))
    out = json.loads(in_venv(py, tmp, ["-c", TRAIN.format(heavy=HEAVY, src=str(plugin))],
                             OPFORGE_PATCH_TORCH="1").splitlines()[-1])
    assert out["start"] == ["_opforge_startup"]  # neither torch nor opforge at start-up
    assert out["value"] == 9 and out["import_module"] and out["file"].startswith(str(tmp / "cache"))
    assert out["opforge"].startswith(str(home))  # the installed opforge (in the venv; editable: its checkout)
    unset = in_venv(py, tmp, ["-c", "import json; " + _IMPORTED.format(heavy=HEAVY)])
    assert json.loads(unset) == []


def test_installed_doctor_says_whether_the_hook_is_active(installed):
    kind, py, tmp, _ = installed
    by = {}
    for value in ("1", "0") if kind == "editable" else ("1",):  # each run imports torch: the off case once
        data = json.loads(in_venv(py, tmp, ["-m", "opforge", "doctor", "--no-build", "--json"],
                                  OPFORGE_PATCH_TORCH=value))
        (by[value],) = [c for c in data["checks"] if c["name"] == "patch torch"]
    site = in_venv(py, tmp, ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    hook = os.path.join(site, _opforge_startup.PTH_NAME)
    assert by["1"]["status"] == "ok" and by["1"]["detail"].startswith("on (") and hook in by["1"]["detail"]
    if "0" in by:
        assert by["0"]["status"] == "ok" and by["0"]["detail"].startswith("off (") and hook in by["0"]["detail"]


def test_doctor_warns_when_the_variable_is_on_without_the_hook():
    c = doctor_patch.check_patch_torch(True, None, ["/venv/lib/site-packages"])
    assert c.status == "warn" and "not installed" in c.detail and "/venv/lib/site-packages" in c.detail
    assert "reinstall opforge" in c.fix
    assert doctor_patch.check_patch_torch(True, "/x/opforge-patch-torch.pth", [], no_site=True).status == "warn"
    assert doctor_patch.hook_file([ROOT]) is None  # the checkout has the module, not the installed line
