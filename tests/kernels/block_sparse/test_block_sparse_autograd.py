"""block_sparse's C++ autograd node (``kernels/block_sparse/native_autograd.py``), driven here with
CPU tensors (the node's devices widened to ``cpu``), where every launch goes through the custom
ops and the torch reference: the same values and gradients as the Python ``_Linear``, gradcheck
and gradgradcheck in fp64, partial ``requires_grad``, no bias, inference mode, and opcheck of the
helper op it calls. On the GPU (tests/kernels/native_launch/test_native_launch_cuda.py) the launches are replayed."""

from __future__ import annotations

import pytest
import torch
from conftest import has_cxx, in_cache
from test_block_sparse import dense_reference, layout_of

import opforge.ops  # noqa: F401
from opforge.kernels.block_sparse import native_autograd
from opforge.ops import block_sparse as ops_bs
from opforge.ops import block_sparse_linear

pytestmark = pytest.mark.skipif(not has_cxx(), reason="needs a C++ compiler")


@pytest.fixture(scope="module")
def node(shared_cache):
    got = in_cache(shared_cache, native_autograd.op)
    assert got is not None
    return got


@pytest.fixture
def on_cpu(node, monkeypatch):
    monkeypatch.setattr(native_autograd, "DEVICES", ("cuda", "cpu"))
    return node


def _grads(layout, x, w, b, dy):
    xs = [t.detach().clone().requires_grad_(t.requires_grad) for t in (x, w, b) if t is not None]
    y = block_sparse_linear(xs[0], xs[1], xs[2] if b is not None else None, layout)
    y.backward(dy)
    return y.detach(), [t.grad for t in xs]


@pytest.mark.parametrize("bias", [True, False])
def test_the_node_gives_the_python_functions_values_and_gradients(on_cpu, monkeypatch, bias):
    layout = layout_of("0.5", 48, 64, (16, 16), seed=3)
    x = torch.randn(7, 64, requires_grad=True)
    w = torch.randn(layout.nnz, 16, 16, requires_grad=True)
    b = torch.randn(48, requires_grad=True) if bias else None
    dy = torch.randn(7, 48)
    y = block_sparse_linear(x, w, b, layout)
    assert type(y.grad_fn).__name__ == "CppFunction"
    got = _grads(layout, x, w, b, dy)
    monkeypatch.setattr(native_autograd, "DEVICES", ("cuda",))
    y2 = block_sparse_linear(x, w, b, layout)
    assert type(y2.grad_fn).__name__ != "CppFunction"
    want = _grads(layout, x, w, b, dy)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for g, h in zip(got[1], want[1]):
        torch.testing.assert_close(g, h, rtol=0, atol=0)
    ry, rdx, rdw, rdb = dense_reference(x, w, b, layout, dy)
    torch.testing.assert_close(got[0].double(), ry, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1][0].double(), rdx, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1][1].double(), rdw, rtol=1e-5, atol=1e-4)
    if bias:
        torch.testing.assert_close(got[1][2].double(), rdb, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", ["0.5", "empty_rows_cols"])
def test_gradcheck_and_gradgradcheck_through_the_node(on_cpu, kind):
    layout = layout_of(kind, 8, 12, (2, 3), seed=5)
    x = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    w = torch.randn(layout.nnz, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)

    def f(x, w, b):
        y = block_sparse_linear(x, w, b, layout)
        assert type(y.grad_fn).__name__ == "CppFunction"
        return y

    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


@pytest.mark.parametrize("wanted", ["x", "w", "b", "w_and_b"])
def test_only_the_wanted_gradients_are_computed(on_cpu, wanted):
    layout = layout_of("0.5", 32, 32, (16, 16), seed=6)
    x = torch.randn(4, 32, requires_grad="x" in wanted)
    w = torch.randn(layout.nnz, 16, 16, requires_grad="w" in wanted)
    b = torch.randn(32, requires_grad="b" in wanted)
    dy = torch.randn(4, 32)
    block_sparse_linear(x, w, b, layout).backward(dy)
    _, rdx, rdw, rdb = dense_reference(x, w, b, layout, dy)
    for t, ref, name in ((x, rdx, "x"), (w, rdw, "w"), (b, rdb, "b")):
        if name in wanted:
            torch.testing.assert_close(t.grad.double(), ref, rtol=1e-5, atol=1e-4)
        else:
            assert t.grad is None


def test_the_op_runs_the_forward_alone_in_inference_mode(on_cpu):
    layout = layout_of("0.5", 32, 32, (16, 16), seed=7)
    x, w, b = torch.randn(4, 32), torch.randn(layout.nnz, 16, 16), torch.randn(32)
    idx = layout.indices()
    with torch.inference_mode():
        y = on_cpu(x, w, b, *idx, 32, False, [0, 0, 0], "")
    torch.testing.assert_close(y, block_sparse_linear(x, w, b, layout))


def test_the_node_refuses_a_malformed_table_list(on_cpu):
    layout = layout_of("0.5", 32, 32, (16, 16), seed=8)
    x = torch.randn(4, 32, requires_grad=True)
    w, b = torch.randn(layout.nnz, 16, 16), torch.randn(32)
    with pytest.raises(RuntimeError, match="tables must be"):
        on_cpu(x, w, b, *layout.indices(), 32, False, [0, 0], "")


def test_opcheck_of_the_bias_gradient_helper():
    layout = layout_of("0.5", 32, 48, (16, 16))
    idx = layout.indices()
    x, dy = torch.randn(5, 48), torch.randn(5, 32)
    for with_bias in (True, False):
        torch.library.opcheck(torch.ops.opforge.block_sparse_sddmm_bias.default, (dy, x, *idx, 16, 16, with_bias),
                              test_utils=("test_schema", "test_faketensor"))
    dw, db = torch.ops.opforge.block_sparse_sddmm_bias(dy, x, *idx, 16, 16, True)
    torch.testing.assert_close(dw, torch.ops.opforge.block_sparse_sddmm(dy, x, *idx, 16, 16))
    torch.testing.assert_close(db, dy.sum(0))


def test_a_failed_build_falls_back_to_the_python_function(monkeypatch):
    monkeypatch.setattr(native_autograd, "_OP", [None])
    monkeypatch.setattr(native_autograd, "DEVICES", ("cuda", "cpu"))
    layout = layout_of("0.5", 16, 16, (8, 8))
    x = torch.randn(2, 16, requires_grad=True)
    y = ops_bs.block_sparse_linear(x, torch.randn(layout.nnz, 8, 8), None, layout)
    assert type(y.grad_fn).__name__ == "_LinearBackward"
