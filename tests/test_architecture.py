"""The architecture contract and the lint rules (issue 22), checked on every ``make test``.

* ``.importlinter`` at the repository's root, checked with import-linter: imports point down the
  layers that docs/architecture.md lists, and no package's modules import each other in a cycle
  (how the cycles are counted: import-linter's ``acyclic_siblings`` over every package of
  opforge, function-level imports included).
* ruff with ``pyproject.toml``'s rule set.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")


@pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e '.[test]')")
def test_imports_point_down_the_layers_and_form_no_cycle():
    run = subprocess.run([LINT, os.path.join(ROOT, ".importlinter")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "2 kept, 0 broken" in run.stdout, run.stdout[-2000:]


def test_every_top_level_module_has_a_layer():
    """A new module of opforge must be placed in the contract, or it escapes it."""
    with open(os.path.join(ROOT, ".importlinter"), encoding="utf-8") as f:
        text = f.read()
    layered = {name.strip() for line in text.split("layers =", 1)[1].split("[", 1)[0].splitlines()
               for name in line.split("|") if name.strip().startswith("opforge.")}
    here = os.path.join(ROOT, "opforge")
    mine = {f"opforge.{n[:-3] if n.endswith('.py') else n}" for n in os.listdir(here)
            if (n.endswith(".py") and n != "__init__.py") or os.path.isfile(os.path.join(here, n, "__init__.py"))}
    assert mine - layered == set(), f"add these to a layer of .importlinter: {sorted(mine - layered)}"
    assert layered - mine == set(), f"no such modules: {sorted(layered - mine)}"


RUFF = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_passes_with_the_repositorys_rules():
    """pyproject.toml's [tool.ruff.lint] rule set over the package, the tests, the benchmarks and
    the examples."""
    run = subprocess.run([RUFF, "check", "--no-cache", "opforge", "tests", "bench", "examples", "setup.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
