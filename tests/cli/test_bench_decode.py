"""The decode benchmark's model (issue 35): the SwiGLU stack it times, its dense twin (the
baseline its outputs are checked against), the bytes it counts, and its place in ``opforge bench``
(CUDA only: skipped, saying why, on the CPU)."""

from __future__ import annotations

import pytest
import torch

from opforge.bench.model import Options
from opforge.bench.runner import run_family
from opforge.bench.suites import SUITES
from opforge.bench.suites.block_sparse_decode import dense_twin, mlp_stack, run_stack, weight_bytes


@pytest.mark.parametrize("density", [0.5, 0.25])
def test_the_sparse_stack_and_its_dense_twin_compute_the_same(density):
    sparse = mlp_stack(3, 128, 320, density, 32, "cpu", torch.float64, seed=1)
    dense = dense_twin(sparse)
    x = torch.randn(5, 128, dtype=torch.float64)
    torch.testing.assert_close(run_stack(sparse, x), run_stack(dense, x))
    assert not any(p.requires_grad for p in sparse.parameters())
    assert weight_bytes(dense) == 3 * 3 * 128 * 320 * 8
    assert weight_bytes(sparse) == pytest.approx(density * weight_bytes(dense), rel=0.02)


def test_each_layer_has_its_own_layout_and_a_seed_repeats_them():
    a, b = mlp_stack(2, 64, 128, 0.5, 32, "cpu", torch.float32, seed=3), mlp_stack(2, 64, 128, 0.5, 32, "cpu",
                                                                                  torch.float32, seed=3)
    def masks(stack):
        return [m.layout.mask for blk in stack for m in (blk.gate, blk.up, blk.down)]

    assert all(torch.equal(x, y) for x, y in zip(masks(a), masks(b)))
    assert not torch.equal(a[0].gate.layout.mask, a[0].up.layout.mask)


def test_the_decode_suite_runs_on_gpus_only_and_says_so_on_the_cpu():
    assert SUITES["block_sparse_decode"].devices == ("cuda",)
    result = run_family("block_sparse_decode", torch.device("cpu"), Options(quick=True), None)
    assert result.status == "skipped" and "runs on cuda" in result.reason


def test_the_stack_compiles_whole_with_inductor_and_matches_eager():
    """bench/block_sparse_decode.py's compiled rows: the stack through torch.compile(fullgraph=True) with
    inductor (a graph break would raise), opforge's op an extern call inside inductor's code, equal to eager."""
    stack = mlp_stack(2, 128, 320, 0.25, 32, "cpu", torch.float32, seed=2)
    x = torch.randn(3, 128)
    torch.compiler.reset()
    try:
        with torch.no_grad():
            got = torch.compile(lambda h: run_stack(stack, h), fullgraph=True)(x)
            want = run_stack(stack, x)
    finally:
        torch.compiler.reset()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
