"""The block-sparse Triton kernels without a GPU: every plan of ``triton_impl.py`` and the decode
kernel's run cutting, in triton's interpreter on CPU tensors (``interpreted.py``, in a process of
its own), against the masked dense fp64 reference. Skipped where triton isn't installed (a
failure under ``OPFORGE_TEST_REQUIRE_TRITON=1``).

What this catches: wrong index arithmetic, masks, partial sums and arrival counts in any kernel
and plan, for the kernels' block sides, grids with empty rows and columns and token counts from
0 to past a thousand, fp16, bf16 and fp32. What it can't: the kernels' concurrency and timing,
and the compiled code itself, which test_block_sparse_*_cuda.py check on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, triton_or_skip

triton_or_skip()

SCRIPT = Path(__file__).with_name("interpreted.py")
PLAN_KINDS = {"fwd:plain", "fwd:split", "fwd:decode", "fwd:uncut", "fwd:tma", "fwd:pair", "fwd:reference", "dx:plain", "dx:tma",
              "dw:whole"}


def interpreted(*args) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)  # the script sets it before triton is imported
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seed, cases, sms", [(3, 60, 2), (2, 25, 132)], ids=["2-SMs", "132-SMs"])
def test_every_plan_equals_masked_dense(seed, cases, sms):
    """Random calls, each planned afresh with a random kept config and route: forward, input and
    weight gradients (with the bias gradient or not) all within the GPU tests' tolerances. Two
    SM counts: a few SMs give the decode kernel runs of several blocks, many give runs of one."""
    got = interpreted("op", seed, cases, sms)
    assert got["bad"] == [], json.dumps(got["bad"][:3], indent=1)
    assert got["cases"] == cases
    if sms == 2:
        # seed 3's 60 calls take every kind (the rarest: tokens 0, the paired and the split forward);
        # a kind none takes any more: a plan became unreachable, or the draws changed (widen them)
        assert PLAN_KINDS <= set(got["cover"]), got["cover"]


def test_the_weight_gradient_split_over_tokens():
    """Enough tokens (over 1024) that the weight gradient splits them and adds the fp32 partials."""
    got = interpreted("op", 11, 6, 132, 1024)
    assert got["bad"] == [], json.dumps(got["bad"][:3], indent=1)
    assert got["cover"].get("dw:split", 0) >= 3, got["cover"]


def test_decode_kernel_every_run_length():
    """``_decode_kernel`` on 30 random tiny layouts (empty ones, empty and full rows), every count of
    blocks a program from one to past the longest row, then the whole list and past it
    (``interpreted.shares``): rows cut anywhere, owners after any number of partials; NaN in the
    partial slots, counts back at zero after each launch."""
    got = interpreted("decode", 3, 30)
    assert got["bad"] == [], json.dumps(got["bad"][:3], indent=1)
    assert got["launches"] > 150


def test_uncut_kernel_every_share():
    """``_decode_uncut_kernel`` on 30 random tiny layouts, units of a whole block-row, a half or a
    quarter, every share a program from one slice to past the longest row, then the whole list and past
    it (``interpreted.shares``): each output stored once by one program (y starts as NaN), empty rows
    (the bias) too, wherever the shares fall."""
    got = interpreted("uncut", 3, 30)
    assert got["bad"] == [], json.dumps(got["bad"][:3], indent=1)
    assert got["launches"] > 150
