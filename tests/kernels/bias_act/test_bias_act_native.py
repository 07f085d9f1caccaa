"""bias_act's C++ autograd node (``opforge/kernels/bias_act/native_autograd.py``).

The node drives the CUDA variant by default; here it also drives this CPU's C++ variant
(``DEVICES`` patched), so it is checked without a GPU. It runs the same kernels as the Python
autograd.Function path, so the two must agree exactly: outputs, dx, db, and the second
derivative (which the node hands to the differentiable custom op). The fp64 reference checks
of test_bias_act.py and test_bias_act_cuda.py then carry over; on a GPU those run through the
node already (it is the default there), and the CUDA case below compares the two paths too.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from test_bias_act import ACTS, make_x

from opforge.kernels.bias_act import dispatch, native_autograd
from opforge.ops import bias_act

op_module = importlib.import_module("opforge.ops.bias_act")


@pytest.fixture(scope="module", autouse=True)
def _one_cache(shared_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
        yield


@pytest.fixture
def cpu_variant(monkeypatch):
    monkeypatch.setattr(native_autograd, "DEVICES", ("cuda", "cpp"))
    impl = dispatch.implementation("cpu")
    if type(impl) is not native_autograd.Compiled:
        pytest.skip("no C++ variant here")
    monkeypatch.setattr(op_module, "_kernel", lambda t: impl)
    return impl


def run(x, b, g, gg, devices, monkeypatch, **kw):
    """y, dx, db and the second-order grads (of <dx, gg> wrt x and b) with the node on or off."""
    monkeypatch.setattr(native_autograd, "DEVICES", devices)
    x = x.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = bias_act(x, b, **kw)
    leaves = (x,) if b is None else (x, b)
    grads = torch.autograd.grad(y, leaves, g, create_graph=gg is not None)
    second = ()
    if gg is not None and grads[0].requires_grad:
        second = torch.autograd.grad(grads[0], leaves, gg, allow_unused=True)
    return y.grad_fn, (y.detach(), *[t.detach() for t in grads], *[t for t in second if t is not None])


def compare(x, b, monkeypatch, second=True, **kw):
    g = torch.randn_like(x)
    gg = torch.randn_like(x) if second else None
    on_fn, on = run(x, b, g, gg, ("cuda", "cpp"), monkeypatch, **kw)
    off_fn, off = run(x, b, g, gg, (), monkeypatch, **kw)
    assert type(on_fn).__name__ == "CppFunction" and type(off_fn).__name__ != "CppFunction"
    assert len(on) == len(off)
    for a, c in zip(on, off):
        torch.testing.assert_close(a, c, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("config", ["plain", "bias", "gain_clamp"])
def test_the_node_matches_the_python_path(act, config, cpu_variant, monkeypatch):
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(1)) * 2
    b = torch.randn(5) if config != "plain" else None
    kw = {"gain": 0.7, "clamp": 0.5} if config == "gain_clamp" else {}
    compare(x, b, monkeypatch, act=act, **kw)


@pytest.mark.parametrize("how,dim", [("channels_last", 1), ("strided", 1), ("contiguous", -1), ("contiguous", 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_the_node_on_layouts_and_dtypes(how, dim, dtype, cpu_variant, monkeypatch):
    x = make_x((2, 6, 5, 3), how, dtype, seed=2)
    compare(x, torch.randn(x.shape[dim]), monkeypatch, dim=dim, act="lrelu", clamp=1.0)


def test_the_node_with_an_expanded_grad_and_grads_of_one_input(cpu_variant, monkeypatch):
    """``y.sum().backward()`` hands the node an expanded (stride 0) dy; only x or only b may
    want a gradient."""
    monkeypatch.setattr(native_autograd, "DEVICES", ("cuda", "cpp"))
    x0, b0 = torch.randn(4, 3, 5), torch.randn(3)
    sums = {}
    for devices in [("cuda", "cpp"), ()]:
        monkeypatch.setattr(native_autograd, "DEVICES", devices)
        x, b = x0.clone().requires_grad_(), b0.clone().requires_grad_()
        bias_act(x, b, act="gelu").sum().backward()
        only_x = torch.autograd.grad(bias_act(x, b0, act="swish").sum(), x)[0]
        only_b = torch.autograd.grad(bias_act(x0, b, act="tanh").sum(), b)[0]
        sums[devices] = (x.grad, b.grad, only_x, only_b)
    for a, c in zip(*sums.values()):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_the_node_skips_what_it_does_not_cover(cpu_variant, monkeypatch):
    """fp64, empty tensors, a zero gain, a bias the C++ variant can't read as it is: the
    Python path (the same results by other means)."""
    x = torch.randn(2, 3, requires_grad=True)
    assert type(bias_act(x, torch.zeros(3, requires_grad=True), act="relu").grad_fn).__name__ == "CppFunction"
    for xx, bb, gain in [(x.double(), None, None), (torch.zeros(0, 3, requires_grad=True), None, None),
                         (x, None, 0.0), (x, torch.zeros(3, dtype=torch.float16, requires_grad=True), None),
                         (x, torch.zeros(6, requires_grad=True)[::2], None)]:
        y = bias_act(xx, bb, act="relu", gain=gain)
        assert type(y.grad_fn).__name__ != "CppFunction", (xx.dtype, xx.shape, gain)
    x.grad = None
    with torch.no_grad():
        assert bias_act(x, act="relu").grad_fn is None


def test_a_node_that_fails_to_build_warns_once_and_python_takes_over(cpu_variant, monkeypatch):
    monkeypatch.setattr(native_autograd, "_OP", [])

    def broken(self):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(native_autograd.BiasActAutograd, "load", broken)
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.warns(UserWarning, match=r"C\+\+ autograd node could not be built .*no compiler today"):
        y = bias_act(x, act="tanh")
    assert type(y.grad_fn).__name__ != "CppFunction"
    y.sum().backward()
    torch.testing.assert_close(x.grad, 1 - torch.tanh(x.detach()) ** 2)


def test_the_node_under_the_loader_is_not_a_variant():
    from opforge.kernel_loader import BiasActLoader

    assert "bias_act_autograd" not in [c.name for c in BiasActLoader().candidates(device="cpu")]


@pytest.mark.cuda
@pytest.mark.parametrize("act", ["lrelu", "gelu", "tanh", "linear"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_the_node_on_cuda_matches_the_python_path(act, dtype, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = torch.randn(4, 16, 8, 8, device="cuda", dtype=dtype)
    b = torch.randn(16, device="cuda", dtype=dtype)
    compare(x, b, monkeypatch, act=act, clamp=0.8)
    compare(x.contiguous(memory_format=torch.channels_last), b, monkeypatch, act=act)
