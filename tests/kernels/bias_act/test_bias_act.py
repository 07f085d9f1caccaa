"""bias_act: ``opforge.ops.bias_act`` against an fp64 reference written here from the formulas
(not opforge's torch variant), its gradients (gradcheck, gradgradcheck), the custom ops
(opcheck, torch.compile), the ``BiasAct`` module, and every bad input.

Tolerances (rtol, atol), per dtype of ``x`` (the reference sees the same rounded x and b,
upcast to fp64, so input rounding is shared and only compute and output rounding count):

* fp32: compute in fp32, a few ulps of the operands (|x + b| <~ 6): (1e-5, 1e-5).
* fp16 / bf16 forward: the fp32 result rounded once to 11 / 8 significant bits; the fp32 and
  fp64 values may round to neighbouring values, so 2 ulps: rtol 2^-10 / 2^-7. atol 1e-5
  covers fp32's absolute error on outputs near zero (x + b cancelling).
* fp16 / bf16 ``dx``: the activations that differentiate from ``y`` read the rounded ``y``;
  with ``|dy| <= 1`` (uniform), ``|gain| <= 1.7`` and ``|d act'/d act| <= 2`` for the
  activation's value range, that is an absolute error up to 1.7 * 2 * 2^-11 (fp16) or
  2^-8 (bf16), plus ``dx``'s own rounding: rtol 2^-9 / 2^-6, atol 2^-9 / 2^-6. Elements
  within 4 ulps of the clamp are left out (the rounded ``y`` may land on the clamp).
* ``db``: reduced in fp32 from the unrounded per-element values, so at most n * (the
  per-element atol) for n summed elements, then one rounding to b's dtype.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import opforge.ops  # noqa: F401  (registers torch.ops.opforge.*)
from opforge.kernel_loader import BiasActLoader
from opforge.kernels.bias_act import dispatch
from opforge.nn import BiasAct
from opforge.ops import bias_act
from opforge.registry import loaders

op_module = importlib.import_module("opforge.ops.bias_act")  # the attribute opforge.ops.bias_act is the function

ACTS = ("linear", "relu", "lrelu", "tanh", "sigmoid", "elu", "selu", "softplus", "swish", "gelu", "gelu_tanh")
# What StyleGAN2 users expect: (alpha, gain) when neither is given.
DEFAULTS = {"linear": (None, 1.0), "relu": (None, math.sqrt(2)), "lrelu": (0.2, math.sqrt(2)),
            "tanh": (None, 1.0), "sigmoid": (None, 1.0), "elu": (1.0, 1.0), "selu": (None, 1.0),
            "softplus": (None, 1.0), "swish": (None, math.sqrt(2)), "gelu": (None, 1.0), "gelu_tanh": (None, 1.0)}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FWD_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2**-10, 1e-5), torch.bfloat16: (2**-7, 1e-5),
           torch.float64: (1e-12, 1e-12)}
GRAD_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2**-9, 2**-9), torch.bfloat16: (2**-6, 2**-6),
            torch.float64: (1e-12, 1e-12)}
EPS = {torch.float32: 2**-24, torch.float16: 2**-11, torch.bfloat16: 2**-8, torch.float64: 2**-53}
CONFIGS = {  # bias?, gain, clamp
    "plain": (False, None, None),
    "bias": (True, None, None),
    "gain_clamp": (True, 0.7, 0.5),
    "neg_gain_clamp": (True, -1.7, 1.0),
}
# name: shape, dim, how x is laid out
LAYOUTS = {
    "nchw": ((2, 5, 3, 4), 1, "contiguous"),
    "channels_last": ((2, 5, 3, 4), 1, "channels_last"),
    "dim0_odd": ((7, 3), 0, "contiguous"),
    "dim-1": ((3, 2, 9), -1, "contiguous"),
    "strided": ((2, 5, 3, 4), 1, "strided"),
    "1d": ((13,), 0, "contiguous"),
}


# -- every implementation that runs here: the torch one and the best C++ variant --

def cpu_variants() -> list[str]:
    cands = BiasActLoader().candidates(device="cpu")
    cpp = [c.name for c in cands if c.decision and c.extension.backend == "cpp"][:1]
    return ["bias_act_torch", *cpp]


IMPLS = cpu_variants()


@pytest.fixture(scope="module", autouse=True)
def _one_cache(shared_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
        yield


@pytest.fixture(autouse=True, params=IMPLS)
def impl(request, monkeypatch):
    """The op runs on this implementation (the loader would pick the C++ one)."""
    chosen = dispatch.implementation("cpu", request.param)
    monkeypatch.setattr(op_module, "_kernel", lambda t: chosen)
    return request.param


# -- the fp64 reference --

def act64(v: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    neg = v.clamp(max=0)  # keeps exp() finite in the branch where() discards (its grad would be 0 * inf)
    if name == "linear":
        return v
    if name == "relu":
        return torch.where(v > 0, v, 0.0)
    if name == "lrelu":
        return torch.where(v > 0, v, alpha * v)
    if name == "tanh":
        return torch.tanh(v)
    if name == "sigmoid":
        return 1 / (1 + torch.exp(-v))
    if name == "elu":
        return torch.where(v > 0, v, alpha * torch.expm1(neg))
    if name == "selu":
        return 1.0507009873554805 * torch.where(v > 0, v, 1.6732632423543772 * torch.expm1(neg))
    if name == "softplus":
        return torch.where(v > 20, v, torch.log1p(torch.exp(v.clamp(max=20))))
    if name == "swish":
        return v / (1 + torch.exp(-v))
    if name == "gelu":
        return 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    raise AssertionError(name)


def reference(x, b, dim, act, alpha=None, gain=None, clamp=None, unclamped=False):
    """fp64, differentiable: the gradient is zero where |act(x + b) * gain| >= clamp."""
    d_alpha, d_gain = DEFAULTS[act]
    alpha = d_alpha if alpha is None else alpha
    gain = d_gain if gain is None else gain
    v = x.double()
    if b is not None:
        v = v + b.double().reshape([-1 if i == dim % x.ndim else 1 for i in range(x.ndim)])
    u = act64(v, act, alpha) * gain
    if clamp is None or unclamped:
        return u
    return torch.where(u.abs() < clamp, u, u.sign() * clamp)


def make_x(shape, layout, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if layout == "strided":  # every other channel, then the last two dims swapped
        base = torch.randn(shape[0], shape[1] * 2, shape[3], shape[2], generator=gen) * 2
        x = base[:, ::2].transpose(2, 3)
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    else:
        x = torch.randn(shape, generator=gen) * 2
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
    return x.to(dtype).requires_grad_()


def leaf64(t):
    return None if t is None else t.detach().double().requires_grad_()


def check_against_reference(x, b, dim, act, alpha=None, gain=None, clamp=None, seed=1):
    dtype = x.dtype
    y = bias_act(x, b, dim=dim, act=act, alpha=alpha, gain=gain, clamp=clamp)
    assert y.dtype == dtype and y.shape == x.shape
    assert y.stride() == torch.empty_like(x).stride()
    x64, b64 = leaf64(x), leaf64(b)
    want = reference(x64, b64, dim, act, alpha, gain, clamp)
    rtol, atol = FWD_TOL[dtype]
    torch.testing.assert_close(y.double(), want, rtol=rtol, atol=atol)

    gen = torch.Generator().manual_seed(seed)
    dy = (torch.rand(x.shape, generator=gen) * 2 - 1).to(dtype)
    y.backward(dy)
    want.backward(dy.double())
    rtol, atol = GRAD_TOL[dtype]
    keep = torch.ones(x.shape, dtype=torch.bool)
    if clamp is not None and dtype in (torch.float16, torch.bfloat16):
        u = reference(x64.detach(), None if b64 is None else b64.detach(), dim, act, alpha, gain, clamp, unclamped=True)
        keep = ((u.abs() - clamp).abs() > 4 * EPS[dtype] * max(clamp, 1e-3))
    assert x.grad.dtype == dtype
    torch.testing.assert_close(torch.where(keep, x.grad.double(), 0.0), torch.where(keep, x64.grad, 0.0),
                               rtol=rtol, atol=atol)
    if b is not None and bool(keep.all()):
        n = x.numel() // max(b.numel(), 1)
        assert b.grad.dtype == b.dtype
        torch.testing.assert_close(b.grad.double(), b64.grad, rtol=max(rtol, 2 * EPS[b.dtype]), atol=n * atol)
    return y


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("act", ACTS)
def test_matches_the_fp64_reference(act, config, dtype, layout):
    shape, dim, how = LAYOUTS[layout]
    with_b, gain, clamp = CONFIGS[config]
    x = make_x(shape, how, dtype)
    gen = torch.Generator().manual_seed(7)
    b = (torch.randn(shape[dim], generator=gen)).to(dtype).requires_grad_() if with_b else None
    check_against_reference(x, b, dim, act, gain=gain, clamp=clamp)


@pytest.mark.parametrize("act", ["lrelu", "elu"])
@pytest.mark.parametrize("alpha", [0.0, 0.05, -0.3])
def test_alpha(act, alpha):
    """A negative alpha makes the value ambiguous about the input's sign: the derivative then
    comes from x (see Activation.ref_for)."""
    x = make_x((3, 4, 5), "contiguous", torch.float32)
    b = torch.randn(4).requires_grad_()
    check_against_reference(x, b, 1, act, alpha=alpha, clamp=1.5)


@pytest.mark.parametrize("act", ACTS)
def test_defaults(act):
    x = torch.linspace(-3, 3, 24).reshape(2, 3, 4)
    b = torch.tensor([0.1, -0.2, 0.3])
    want = reference(x, b, 1, act)
    torch.testing.assert_close(bias_act(x, b, act=act).double(), want, rtol=1e-6, atol=1e-6)
    alpha, gain = DEFAULTS[act]
    explicit = bias_act(x, b, act=act, alpha=alpha, gain=gain)
    torch.testing.assert_close(bias_act(x, b, act=act), explicit, rtol=0, atol=0)


def test_b_in_another_float_dtype():
    """b may be any float dtype: it is read in fp32; db comes back in b's dtype."""
    x = make_x((2, 5, 3, 4), "channels_last", torch.float16)
    b = torch.randn(5, dtype=torch.float32).requires_grad_()
    check_against_reference(x, b, 1, "swish", clamp=2.0)
    assert b.grad.dtype == torch.float32


def test_db_is_reduced_in_fp32():
    """Each dx (fp16) is rounded; db, from the same fp32 values unrounded, is not."""
    n, gain = 20000, 0.3
    x = torch.full((1, n), 0.5, dtype=torch.float16, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    y = bias_act(x, b, dim=0, gain=gain)
    y.backward(torch.full_like(y, 0.1))
    want = n * float(torch.tensor(0.1, dtype=torch.float16)) * gain
    assert abs(b.grad.item() - want) < 1e-5 * want
    assert abs(x.grad.double().sum().item() - want) > 1e-4 * want  # the sum of the rounded dx misses it


def test_clamp_zeroes_the_gradient_where_it_clamps():
    x = torch.tensor([-3.0, -0.2, 0.2, 3.0], requires_grad=True)
    for act in ("linear", "tanh", "lrelu", "elu"):  # |y| > 0.4 at -3 and 3 only
        x.grad = None
        bias_act(x, act=act, clamp=0.4).sum().backward()
        assert x.grad[0] == 0 and x.grad[3] == 0 and (x.grad[1:3] != 0).all(), (act, x.grad)


def test_zero_gain_and_zero_clamp():
    x = make_x((3, 4), "contiguous", torch.float32)
    for act in ("relu", "tanh", "gelu"):
        for kw in ({"gain": 0.0}, {"clamp": 0.0}):
            x.grad = None
            y = bias_act(x, torch.ones(4), act=act, **kw)
            assert (y == 0).all()
            y.sum().backward()
            assert (x.grad == 0).all()


def test_output_is_a_new_tensor():
    x = torch.randn(3, 4)
    y = bias_act(x)  # linear, gain 1, no bias: the values of x, in a tensor of its own
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("act,saves", [("relu", "y"), ("tanh", "y"), ("swish", "x"), ("gelu", "x"),
                                       ("linear", ""), ("lrelu", "y")])
def test_saves_only_what_the_derivative_needs(act, saves):
    x = torch.randn(4, 6, 5, requires_grad=True)
    b = torch.randn(6, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = bias_act(x, b, act=act)
    big = {t.data_ptr() for t in saved if t.numel() == x.numel()}
    expect = {"y": {y.data_ptr()}, "x": {x.data_ptr()}, "": set()}[saves]
    assert big == expect, (act, saves)
    assert sum(t.numel() for t in saved) <= x.numel() + b.numel()


@given(st.data())
def test_fuzz_shapes_strides_dtypes_and_parameters(data):
    """Any rank, shape, dim, layout (permuted, stepped, offset), dtype, activation, alpha, gain
    and clamp, with or without a bias (in its own dtype), against the fp64 reference."""
    ndim = data.draw(st.integers(1, 4), label="ndim")
    shape = data.draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim), label="shape")
    perm = data.draw(st.permutations(range(ndim)), label="perm")
    step = data.draw(st.integers(1, 2), label="step")
    offset = data.draw(st.integers(0, 1), label="storage offset")
    dim = data.draw(st.integers(-ndim, ndim - 1), label="dim")
    dtype = data.draw(st.sampled_from(DTYPES + (torch.float64,)), label="dtype")
    act = data.draw(st.sampled_from(ACTS), label="act")
    alpha = data.draw(st.one_of(st.none(), st.floats(-0.5, 1.5)), label="alpha") if act in ("lrelu", "elu") else None
    gain = data.draw(st.one_of(st.none(), st.floats(-2.0, 2.0)), label="gain")
    clamp = data.draw(st.one_of(st.none(), st.floats(0.0, 4.0)), label="clamp")
    b_dtype = data.draw(st.one_of(st.none(), st.sampled_from([dtype, torch.float32])), label="bias dtype")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(offset + math.prod(s * step for s in shape), generator=gen) * 2
    x = base[offset:].view([s * step for s in shape])[tuple(slice(None, None, step) for _ in shape)].permute(*perm)
    x = x.to(dtype).detach().requires_grad_()
    b = None if b_dtype is None else torch.randn(x.shape[dim], generator=gen).to(b_dtype).requires_grad_()
    if gain is not None and 0 < abs(gain) < 2.0**-126:  # fp32 can't take it: a clear error, never NaN
        with pytest.raises(ValueError, match="gain 0 or between"):
            bias_act(x, b, dim=dim, act=act, alpha=alpha, gain=gain, clamp=clamp)
        return
    check_against_reference(x, b, dim, act, alpha=alpha, gain=gain, clamp=clamp, seed=seed)


# -- gradients in fp64 --

@pytest.mark.parametrize("clamp", [None, 0.8], ids=["noclamp", "clamp"])
@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_and_gradgradcheck(act, clamp):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=gen).requires_grad_()
    b = torch.randn(3, dtype=torch.float64, generator=gen).requires_grad_()

    def f(x, b):
        return bias_act(x, b, act=act, gain=1.3, clamp=clamp)

    assert torch.autograd.gradcheck(f, (x, b))
    assert torch.autograd.gradgradcheck(f, (x, b))
    assert torch.autograd.gradgradcheck(lambda x: bias_act(x, act=act, dim=-1, clamp=clamp), (x,))


@pytest.mark.parametrize("act", ["lrelu", "elu"])
def test_gradgradcheck_negative_alpha(act):
    x = torch.randn(3, 5, dtype=torch.float64).requires_grad_()
    b = torch.randn(3, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x, b: bias_act(x, b, dim=0, act=act, alpha=-0.4, clamp=1.0), (x, b))


def test_gradgradcheck_channels_last():
    x = torch.randn(2, 3, 2, 2, dtype=torch.float64).contiguous(memory_format=torch.channels_last).requires_grad_()
    b = torch.randn(3, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x, b: bias_act(x, b, act="swish", clamp=1.0), (x, b))


def test_third_order_is_a_clear_error():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(bias_act(x, act="tanh").sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="third-order"):
        torch.autograd.grad(gg.sum(), x)


# -- the custom ops --

@pytest.mark.parametrize("act,clamp", [("linear", None), ("relu", 1.0), ("tanh", None), ("swish", 0.5),
                                       ("lrelu", 0.5), ("gelu_tanh", None)])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
@pytest.mark.parametrize("with_b", [True, False], ids=["b", "nob"])
def test_opcheck(act, clamp, layout, with_b):
    shape, dim, how = LAYOUTS[layout]
    x = make_x(shape, how, torch.float32)
    b = torch.randn(shape[dim], requires_grad=True) if with_b else None
    alpha = 0.2 if act == "lrelu" else 0.0
    torch.library.opcheck(torch.ops.opforge.bias_act.default, (x, b, dim, act, alpha, 1.4, clamp))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_opcheck_backward_ops(dtype):
    def t(*shape, grad=True):
        return torch.randn(*shape).to(dtype).requires_grad_(grad)

    bwd, bwd2 = torch.ops.opforge.bias_act_backward.default, torch.ops.opforge.bias_act_backward2.default
    torch.library.opcheck(bwd, (t(2, 3, 5), t(2, 3, 5), t(3), None, 1, "swish", 0.0, 1.0, 0.5, True))
    torch.library.opcheck(bwd, (t(2, 3, 5), None, t(3), t(2, 3, 5), 1, "tanh", 0.0, 2.0, None, True))
    torch.library.opcheck(bwd, (t(2, 3, 5), None, None, None, 1, "linear", 0.0, 2.0, None, False))
    # backward2 has no derivative (third order): checked with inputs that need none
    torch.library.opcheck(bwd2, (t(2, 3, 5, grad=False), t(2, 3, 5, grad=False), t(2, 3, 5, grad=False),
                                 t(3, grad=False), None, 1, "gelu", 0.0, 1.0, 0.5, True))
    torch.library.opcheck(bwd2, (t(2, 3, 5, grad=False), t(2, 3, 5, grad=False), None, t(3, grad=False),
                                 t(2, 3, 5, grad=False), 1, "sigmoid", 0.0, 1.0, None, False))


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.act = BiasAct(4, act="lrelu", clamp=2.0)
        self.fc = torch.nn.Linear(4 * 5 * 5, 6, bias=False)
        self.b = torch.nn.Parameter(torch.randn(6))

    def forward(self, x):
        h = self.act(self.conv(x))
        return bias_act(self.fc(h.flatten(1)), self.b, act="gelu", gain=0.5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.act.bias.normal_()
    x = torch.randn(2, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    want = model(x)
    want.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = torch.compile(model, fullgraph=True, backend=backend)(x)  # a graph break would raise
    got.square().sum().backward()
    torch.testing.assert_close(got, want)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_torch_compile_dynamic_shapes():
    torch._dynamo.reset()

    def f(x, b, gain):
        return bias_act(x, b, act="swish", gain=gain, clamp=2.0)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for n, gain in ((3, 1.0), (5, 0.5), (7, -2.0)):
        x = torch.randn(2, n, 4, requires_grad=True)
        b = torch.randn(n, requires_grad=True)
        got = compiled(x, b, gain)
        (gx, gb) = torch.autograd.grad(got.sum(), (x, b))
        want = f(x, b, gain)
        torch.testing.assert_close(got, want)
        for g, w in zip((gx, gb), torch.autograd.grad(want.sum(), (x, b))):
            torch.testing.assert_close(g, w)


def test_the_loader_picks_per_device():
    assert "bias_act" in loaders()
    k = BiasActLoader().load(device="cpu")
    assert k.name == IMPLS[-1]
    chosen = [c for c in BiasActLoader().candidates(device="cpu") if c.chosen]
    assert [c.name for c in chosen] == [IMPLS[-1]]
    meta = {c.name: c for c in BiasActLoader().candidates(device="meta")}
    assert meta["bias_act_torch"].chosen
    for name, c in meta.items():  # the compiled and Triton variants take CPU or CUDA tensors only
        assert name == "bias_act_torch" or (not c.decision and "tensors, not meta" in c.decision.reason)
    assert dispatch.implementation("cpu") is dispatch.implementation(torch.device("cpu"))


# -- the module --

def test_module():
    m = BiasAct(5, act="lrelu", clamp=256)
    assert repr(m) == "BiasAct(5, act='lrelu', alpha=0.2, gain=1.414, clamp=256, dim=1)"
    assert repr(BiasAct(3)) == "BiasAct(3, act='linear', dim=1)"
    assert torch.equal(m.bias, torch.zeros(5)) and m.bias.requires_grad
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(m(x), bias_act(x, torch.zeros(5), act="lrelu", clamp=256))
    m(x).sum().backward()
    assert m.bias.grad is not None and m.bias.grad.shape == (5,)
    last = BiasAct(3, act="tanh", dim=-1, dtype=torch.float64)
    assert last(torch.randn(4, 3, dtype=torch.float64)).dtype == torch.float64
    with pytest.raises(ValueError, match="unknown activation 'nope'; use one of: linear, relu"):
        BiasAct(3, act="nope")
    with pytest.raises(ValueError, match="clamp must be None"):
        BiasAct(3, clamp=-1)


# -- bad input --

BAD = {
    "bias length": ({"b": torch.zeros(5)}, ValueError, r"b must be 1-D with x.shape\[1\] = 4 elements .* got shape \[5\]"),
    "bias 2-D": ({"b": torch.zeros(4, 1)}, ValueError, r"b must be 1-D"),
    "unknown act": ({"act": "leaky"}, ValueError,
                    (r"unknown activation 'leaky'; use one of: linear, relu, lrelu, tanh, sigmoid, elu, selu, "
                    r"softplus, swish, gelu, gelu_tanh")),
    "negative clamp": ({"clamp": -1.0}, ValueError, r"clamp must be None \(no clamping\) or >= 0, got -1.0"),
    "nan clamp": ({"clamp": float("nan")}, ValueError, r"clamp must be None"),
    "int x": ({"x": torch.ones(3, 4, dtype=torch.int32)}, TypeError, r"x must be float16, .* got torch.int32.*x.float\(\)"),
    "int b": ({"b": torch.ones(4, dtype=torch.int64)}, TypeError, r"b must be a float tensor .* got torch.int64"),
    "bool x": ({"x": torch.ones(3, 4, dtype=torch.bool)}, TypeError, r"got torch.bool"),
    "complex x": ({"x": torch.ones(3, 4, dtype=torch.complex64)}, TypeError, r"got torch.complex64"),
    "dim too big": ({"dim": 2}, ValueError, r"dim=2 is out of range for x of 2 dims .* use a dim in \[-2, 1\]"),
    "dim too small": ({"dim": -3}, ValueError, r"dim=-3 is out of range"),
    "alpha for relu": ({"act": "relu", "alpha": 0.1}, ValueError, r"act='relu' takes no alpha .* only lrelu"),
    "inf gain": ({"gain": float("inf")}, ValueError, r"gain and alpha must be finite"),
    # fp32 can't hold these (found by the fuzz test: a gain fp32 rounds to 0 made y / gain NaN)
    "tiny gain": ({"gain": 5e-69}, ValueError, r"gain 0 or between 1.175e-38 and 3.403e\+38 .*pass gain=0"),
    "subnormal gain": ({"gain": -1e-40}, ValueError, r"gain 0 or between"),
    "huge gain": ({"gain": 1e39}, ValueError, r"gain 0 or between"),
    "huge alpha": ({"act": "lrelu", "alpha": -1e39}, ValueError, r"alpha must be at most 3.403e\+38"),
    "scalar x with b": ({"x": torch.tensor(1.0), "b": torch.zeros(1)}, ValueError, r"x is a scalar"),
    "b not a tensor": ({"b": [0.0] * 4}, TypeError, r"b must be a tensor or None"),
    "x not a tensor": ({"x": [[1.0]]}, TypeError, r"x must be a tensor"),
    "b on meta": ({"b": torch.zeros(4, device="meta")}, ValueError, r"b is on meta but x is on cpu: .*b.to\(x.device\)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    kw, exc, match = BAD[case]
    args = {"x": torch.randn(3, 4), "b": torch.zeros(4), "act": "relu"} | kw
    with pytest.raises(exc, match=match):
        bias_act(**args)


def test_bad_input_to_the_op_itself():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="b must be 1-D with"):
        torch.ops.opforge.bias_act(x, torch.zeros(3), 1, "linear", 0.0, 1.0, None)
    with pytest.raises(ValueError, match="unknown activation"):
        torch.ops.opforge.bias_act(x, None, 1, "Relu", 0.0, 1.0, None)
    with pytest.raises(ValueError, match="needs y; it was not given"):
        torch.ops.opforge.bias_act_backward(x, None, None, None, 1, "tanh", 0.0, 1.0, None, False)


def test_bad_input_to_the_raw_cpu_ops(impl):
    """The C++ variant's own checks (the adapter never sends such input): each a clear
    RuntimeError, never a crash."""
    if impl == "bias_act_torch":
        pytest.skip("the C++ variant's ops")
    ops = BiasActLoader().load(device="cpu").ops
    x, y, b = torch.randn(2, 3, 4), torch.empty(2, 3, 4), torch.zeros(3)
    ops.forward(x, b, y, 3, 4, 2, 0.0, 1.0, -1.0)
    torch.testing.assert_close(y, x.relu())
    cases = [
        (lambda: ops.forward(x.to("meta"), b, y, 3, 4, 2, 0.0, 1.0, -1.0), "x must be a CPU tensor, got meta"),
        (lambda: ops.forward(x, b, y[:1], 3, 4, 2, 0.0, 1.0, -1.0), "y has 12 elements, expected 24"),
        (lambda: ops.forward(x.double(), b, y, 3, 4, 2, 0.0, 1.0, -1.0),
         "x must be float32, bfloat16 or float16, got Double"),
        (lambda: ops.forward(x, b, y.half(), 3, 4, 2, 0.0, 1.0, -1.0), "y must have the dtype of x"),
        (lambda: ops.forward(x, b.half(), y, 3, 4, 2, 0.0, 1.0, -1.0), "b must be a contiguous float32 tensor"),
        (lambda: ops.forward(x, b[:2], y, 3, 4, 2, 0.0, 1.0, -1.0), "b has 2 elements, expected 3"),
        (lambda: ops.forward(x, b, y, 3, 0, 2, 0.0, 1.0, -1.0), "channels and inner must be >= 1, got 3 and 0"),
        (lambda: ops.forward(x, b, y, 3, 4, 12, 0.0, 1.0, -1.0), "unknown activation id 12"),
        (lambda: ops.forward(x, b, y, 3, 4, 2, 0.0, 1e-40, -1.0), "gain 0 or a normal float32 magnitude"),
        (lambda: ops.backward(x, x, None, y, None, 3, 4, 4, 1, 1e39, 1.0, -1.0, -1.0), "alpha must be within"),
        (lambda: ops.backward(x, x, None, y, None, 3, 4, 4, 3, 0.0, 1.0, -1.0, -1.0), "ref must be 0"),
        (lambda: ops.backward(x, None, None, y, None, 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0),
         "ref must be given exactly when"),
        (lambda: ops.backward(x, x, None, y, None, 3, 4, 9, 1, 0.0, 1.0, -1.0, -1.0),
         "activation id 9 has no first derivative kernel from ref 1"),
        (lambda: ops.backward(x, x, None, y, torch.empty(5), 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0),
         "db has 5 elements, expected 3"),
        (lambda: ops.backward(x, x.half(), None, y, None, 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0),
         "ref must have the dtype of dy"),
        (lambda: ops.backward2(x.half(), x, x, None, y, None, 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0),
         "s must have the dtype of dy"),
        (lambda: ops.backward2(x, x, x, None, y, None, 3, 4, 2, 1, 0.0, 1.0, -1.0, -1.0),
         "has no second derivative kernel"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    db = torch.full((3,), 7.0)  # an empty input still writes db
    ops.backward(torch.empty(0), None, None, torch.empty(0), db, 3, 1, 1, 0, 0.0, 1.0, -1.0, -1.0)
    assert (db == 0).all()


def test_scalar_and_empty_inputs():
    torch.testing.assert_close(bias_act(torch.tensor(-2.0), act="relu"), torch.tensor(0.0))
    y = bias_act(torch.zeros(0, 3, requires_grad=True), torch.zeros(3, requires_grad=True), act="gelu")
    assert y.shape == (0, 3)
    y.sum().backward()


# -- the compiled variants: sizes that split across threads, SIMD tails, extreme values --

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,dim,how", [((3, 67, 1031), 1, "contiguous"), ((3, 67, 1031), -1, "contiguous"),
                                           ((2, 37, 61, 59), 1, "channels_last"), ((2, 37, 61, 59), 1, "strided")],
                         ids=["runs", "dim-1", "channels_last", "strided"])
@pytest.mark.parametrize("act", ["lrelu", "tanh", "gelu", "softplus"])
def test_large_odd_sizes(act, shape, dim, how, dtype, impl):
    """> 2 x 65536 elements: every thread gets a range, ranges end mid-run, and blocks end in a
    partial vector; db sums runs from several threads."""
    if impl == "bias_act_torch":
        pytest.skip("the compiled variants' case")
    x = make_x(shape, how, dtype, seed=3)
    b = (torch.randn(x.shape[dim], generator=torch.Generator().manual_seed(4))).requires_grad_()
    check_against_reference(x, b, dim, act, clamp=1.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_extreme_values_match_torch(act, dtype, impl):
    """inf, -inf, NaN, huge and tiny inputs: the same as torch's own fp32 functions (NaN stays NaN)."""
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 88.5, -88.5, 100.0, -100.0,
                            30.0, -30.0, 20.0, 19.99, -20.0, 9.5, -9.5, 1e-30, -1e-30, 1e-5, -1e-5, 0.0, -0.0,
                            0.49, -0.49, 0.51, -0.51])
    x = special.repeat(3).to(dtype)
    alpha, gain = DEFAULTS[act]
    y = bias_act(x, act=act)
    want = op_module.dispatch.adapt(BiasActLoader().load(ext_name="bias_act_torch")).forward(
        x, None, 0, act, alpha if alpha is not None else 0.0, gain, None)
    # torch's fp32 gelu(inf) is NaN (its limit is inf): where torch gives NaN for an infinite input, any value
    keep = ~(x.isinf() & want.isnan())
    torch.testing.assert_close(y[keep], want[keep], equal_nan=True, rtol=FWD_TOL[dtype][0], atol=1e-6)


def test_a_tensor_argument_is_read_at_every_call():
    """Resolved arguments are cached per call signature, but only plain scalars: a 0-d tensor
    clamp changed in place takes effect, and the cache holds no tensor."""
    c = torch.tensor(1.0)
    x = torch.full((2, 3), 5.0)
    assert float(bias_act(x, clamp=c).max()) == 1.0
    c.fill_(2.0)
    assert float(bias_act(x, clamp=c).max()) == 2.0
    assert not any(isinstance(v, torch.Tensor) for key in op_module._RESOLVED for v in key)


class _WithFresh:
    """The CPU implementation with a ``fresh`` one-call forward (the CUDA variant's shape) that
    records its arguments and takes the call (``take``: its output) or declines it ([])."""

    def __init__(self, take):
        self.impl, self.take, self.calls = dispatch.implementation("cpu"), take, []

    def __getattr__(self, name):
        return getattr(self.impl, name)

    def fresh(self, x, b, dim, act, alpha, gain, clamp):
        self.calls.append((dim, act, alpha, gain, clamp))
        return [self.take(x)] if self.take else []


def test_a_no_grad_call_is_one_fresh_call_where_the_implementation_has_one(monkeypatch):
    """The op hands a no-grad call of plain tensors to ``fresh`` before its own checks, the
    scalars resolved (activation index, default gain, clamp -1 for none), and returns its output;
    where ``fresh`` declines ([]), the checks run and raise as before, and the result is the
    implementation's own. Calls with grad, or a dim that isn't an int, never reach it."""
    taking = _WithFresh(lambda x: torch.full_like(x, 7.0))
    monkeypatch.setattr(op_module, "_kernel", lambda t: taking)
    x, b = torch.randn(2, 3, 4), torch.randn(3)
    assert (bias_act(x, b, act="lrelu") == 7.0).all()
    assert taking.calls == [(1, 3, 0.2, math.sqrt(2), -1.0)]  # lrelu: index 3, alpha 0.2, gain sqrt(2)
    bias_act(x, b, dim=-2, act="tanh", clamp=2)
    assert taking.calls[-1] == (-2, 4, 0.0, 1.0, 2.0)

    declining = _WithFresh(None)
    monkeypatch.setattr(op_module, "_kernel", lambda t: declining)
    torch.testing.assert_close(bias_act(x, b, act="relu"), torch.relu(x + b[:, None]) * math.sqrt(2))
    with pytest.raises(ValueError, match=r"b must be 1-D with x.shape\[1\] = 3 elements"):
        bias_act(x, torch.randn(4), act="relu")
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64"):
        bias_act(torch.ones(2, 3, dtype=torch.int32), act="relu")
    n = len(declining.calls)
    assert n == 3
    bias_act(x.requires_grad_(), b, act="relu").sum().backward()  # with grad: never fresh
    with pytest.raises(TypeError):
        bias_act(x.detach(), b, dim=1.0)  # not an int: the checks say so, fresh not asked
    assert len(declining.calls) == n
