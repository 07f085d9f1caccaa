"""Example packages built as wheels and installed into fresh venvs, as a user's machine would have
them (tests/loader/test_downstream.py, tests/clients/test_ds_example.py); opforge itself installed
from a wheel or in editable mode (tests/engine/test_patch_hook.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

from conftest import ROOT


def build_wheel(example: str, tmp, env: dict, timeout: float = 900):
    """``pip wheel`` of a copy of the ``example`` directory (less what a build left there) with
    ``env`` added; returns (wheel, log)."""
    src = tmp / "src"
    shutil.copytree(example, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.so",
                                                                  "build_info.json"))
    full = {**os.environ, **env, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w",
                          str(tmp / "wheels"), str(src)], env=full, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (found,) = (tmp / "wheels").glob("*.whl")
    return found, run.stdout + run.stderr


def fresh_venv(tmp, wheel_path):
    """A venv with the wheel installed; torch, opforge (this checkout) and their dependencies
    come from this interpreter's paths, after the venv's own site-packages."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                          str(wheel_path)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    deps = [ROOT] + [p for p in sys.path if p and os.path.isdir(p) and not os.path.samefile(p, ROOT)]
    with open(os.path.join(site, "zz_deps.pth"), "w") as f:
        f.write("\n".join(deps + [sysconfig.get_paths()["purelib"]]) + "\n")
    return py


def run_in(py, tmp, code: str | None, compiler: bool = True, args=(), timeout: float = 600) -> str:
    """Run ``code`` (or ``python args``) with the venv's interpreter, its own cache dir under ``tmp``;
    ``compiler=False`` points CXX at nothing."""
    env = {"PATH": str(py.parent) + (os.pathsep + os.environ["PATH"] if compiler else ""),
           "OPFORGE_CACHE_DIR": str(tmp / "cache"), "HOME": str(tmp), "OPFORGE_CCACHE": "0",
           "OPFORGE_PCH": os.environ.get("OPFORGE_PCH", "0")}
    if not compiler:
        env.update(CXX="/nonexistent/c++", CC="/nonexistent/cc")
    argv = [str(py), "-c", code] if code else [str(py), *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=str(tmp), timeout=timeout, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


#: What a copy of this checkout leaves out: the venv, git, build output.
CHECKOUT_IGNORE = shutil.ignore_patterns(".git", ".venv", "*.egg-info", "__pycache__", "*.so", ".pytest_cache",
                                         ".hypothesis", ".cache", "*.whl", ".bench-cache", "build_info.json",
                                         "build", "dist")


def checkout_copy(dest):
    """A copy of this checkout's sources at ``dest`` (so a build writes nothing into the checkout)."""
    shutil.copytree(ROOT, dest, ignore=CHECKOUT_IGNORE)
    return dest


def venv_with(tmp, *install_args, timeout: float = 300):
    """A venv at ``tmp/venv`` where ``pip install --no-deps --no-build-isolation <install_args>`` ran (a
    wheel, or ``-e <dir>``), with this interpreter's packages (torch, setuptools, opforge's dependencies)
    reachable after its own site-packages but not this checkout: opforge comes only from what was installed."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    inside = lambda p: os.path.abspath(p) == ROOT or os.path.abspath(p).startswith(ROOT + os.sep)  # noqa: E731
    deps = [p for p in sys.path if p and os.path.isdir(p) and not inside(p)]
    with open(os.path.join(site, "zz_deps.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys([*deps, sysconfig.get_paths()["purelib"]])) + "\n")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-build-isolation",
                          "-q", *map(str, install_args)], env=env, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return py
