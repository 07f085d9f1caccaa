"""The fault-injection suite's tally: faults injected, loads that succeeded, hangs, torn loads.

Each test records what it did through the ``tally`` fixture. The remote stores' faults are counted
where they land: as the store's middleware injected them (``Tally.seen``), not as tests asked for them. With ``OPFORGE_FAULT_REPORT=FILE``
the session's totals are written there as JSON (``docs/reliability.md`` quotes a full run).
A load is *torn* when it returned a module whose binary does not match its manifest's sha256,
or computes the wrong value; a *hang* is a load that did not finish within its timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest
from conftest import ROOT

# Loads in a fresh interpreter and says whether what it got is whole.
LOAD = r"""
import json, os, sys
import opforge
from opforge.engine import cache
from opforge.engine.key import sha256_file
name, src, expect = sys.argv[1], sys.argv[2], int(sys.argv[3])
mod = opforge.load(name, [src])
m = cache.read_manifest(os.path.dirname(mod.__file__))
whole = m is not None and sha256_file(mod.__file__) == m.binary_sha256 and mod.value() == expect
print(json.dumps({"value": mod.value(), "torn": not whole, "file": mod.__file__}))
"""

_TOTALS: dict[str, dict[str, int]] = defaultdict(lambda: {"faults": 0, "loads": 0, "loads_ok": 0, "hangs": 0,
                                                          "torn": 0})


class Tally:
    def __init__(self, fault: str):
        self.row = _TOTALS[fault]

    def fault(self, n: int = 1) -> None:
        self.row["faults"] += n

    def seen(self, injected) -> int:
        """Count the faults that struck, as the store's middleware counted them (``Misbehave.injected``:
        fault -> times, a Counter, or its change over one load); their number."""
        n = sum(injected.values())
        self.fault(n)
        return n

    def count(self, what: str, n: int = 1) -> None:
        """Count something else of this fault's (the remote rounds' outcomes: pulled, built, errors)."""
        self.row[what] = self.row.get(what, 0) + n

    def load(self, name: str, src, expect: int, env: dict | None = None, timeout: float = 120) -> dict | None:
        """One load in a fresh process, counted; its result, or None when it failed (stderr in ``self.err``)."""
        self.row["loads"] += 1
        result = self.run(LOAD, [name, str(src), str(expect)], env, timeout)
        if result is None:
            return None
        self.row["torn"] += bool(result["torn"])
        self.row["loads_ok"] += not result["torn"]
        return result

    def run(self, code: str, args: list[str], env: dict | None = None, timeout: float = 120) -> dict | None:
        """``code`` in a fresh process (a hang counted); the JSON of its last line of output, or None when
        it failed (stderr in ``self.err``). The caller counts its loads."""
        full = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
        try:
            r = subprocess.run([sys.executable, "-c", code, *args], env=full, capture_output=True, text=True,
                               timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            self.row["hangs"] += 1
            self.err = f"hung for {timeout} s"
            return None
        self.err = r.stderr
        if r.returncode != 0:
            return None
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def tally(request):
    return lambda fault: Tally(fault)


def pytest_sessionfinish(session):
    path = os.environ.get("OPFORGE_FAULT_REPORT")
    if path and _TOTALS:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(_TOTALS), f, indent=1, sort_keys=True)
