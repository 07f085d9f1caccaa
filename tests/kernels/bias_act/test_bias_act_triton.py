"""bias_act's Triton variant (``kernels/bias_act/triton_impl.py``) against the torch reference
(``kernels/bias_act/reference.py``, the contract both implement), fed the same tensors.

* Without a GPU: the kernels run in Triton's interpreter on CPU tensors. Triton decides at
  decoration time whether ``@triton.jit`` compiles or interprets, so the ``interp`` fixture
  loads a private copy of the module with ``TRITON_INTERPRET=1`` set (the real module may
  already be imported, compiled, by doctest collection or the GPU tests).
* With a GPU (``cuda`` marker): the variant as the loader gives it
  (``dispatch.implementation("cuda", "bias_act_triton")``), on CUDA tensors; through the op
  and its autograd too; and (also ``slow``) a tensor of more than 2**31 elements, where the
  kernels switch to 64-bit offsets.

Tolerances (rtol, atol), by dtype of the result: both sides compute in fp32 from the same
inputs, so the results differ by a few fp32 ulps of the operands (1e-5, 1e-5; ``atol`` also
covers the reference's own cancellation in gelu_tanh's derivatives, ~4e-6 for unit
gradients), and for fp16/bf16 results by that rounded to the dtype: one ulp either way,
rtol 2^-10 / 2^-7. Elements whose unclamped value lies within 1e-5 (relative) of the clamp
are left out where the gradient is masked from ``x + b`` (the two sides may fall on either
side of it). ``db`` sums n elements: ``n`` times the element atol, plus, where the variant
sums its stored fp16/bf16 ``dx`` (the flat walk with several channels), one rounding of
each.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, triton_or_skip
from test_bias_act import CONFIGS, DTYPES  # noqa: I001  (beside this file: on sys.path under pytest)

from opforge.kernels.bias_act import reference
from opforge.kernels.bias_act.activations import ACTIVATIONS, lookup
from opforge.kernels.bias_act.layout import geometry

triton = triton_or_skip()

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ACTS = tuple(ACTIVATIONS)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2**-10, 1e-5), torch.bfloat16: (2**-7, 1e-5)}
EPS = {torch.float32: 0.0, torch.float16: 2**-11, torch.bfloat16: 2**-8}
# name: shape, dim, layout; the comment says which walk (triton_impl.plan) it takes
LAYOUTS = {
    "nchw": ((2, 5, 3, 4), 1, "contiguous"),  # flat, channel per element (inner 12)
    "channels_last": ((2, 5, 3, 4), 1, "channels_last"),  # flat, inner 1
    "dim0_odd": ((7, 3), 0, "contiguous"),
    "dim-1": ((3, 2, 9), -1, "contiguous"),
    "strided": ((2, 5, 3, 4), 1, "strided"),  # not dense: conformed
    "1d": ((13,), 0, "contiguous"),
    "flat_blocks": ((5, 1700), 1, "contiguous"),  # flat, 3 blocks, the last one partial
    "one_channel": ((3, 1, 700), 1, "contiguous"),  # flat, one channel: per-program db
    "rows": ((2, 3, 1024), 1, "contiguous"),  # rows, a run of one block
    "rows_ragged": ((2, 2, 2051), 1, "contiguous"),  # rows, 5 blocks of 512 a run, the last masked; runs 2, 3
    # go back to channels 0, 1 (20 programs: the interpreter's time goes by programs, the most of any layout)
}


# -- the variant under test, and the comparison --

@pytest.mark.skipif(INTERPRETED, reason="this is the interpreter's run")
def test_the_interpreter_suite():
    """This file's interpreter tests, in a fresh process with TRITON_INTERPRET=1: triton reads it
    at import and at decoration time (its own library of jit functions too), so a process that
    has imported triton without it cannot interpret."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "pytest", os.path.abspath(__file__), "-q", "-p", "no:cacheprovider",
                          "-m", "not cuda", "-W", "ignore::RuntimeWarning"],
                         check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    report = run.stdout[-20000:] + run.stderr[-5000:]
    assert run.returncode == 0 and " passed" in run.stdout, report


@pytest.fixture(scope="module")
def interp():
    """triton_impl, its kernels run by Triton's interpreter on CPU tensors."""
    if not INTERPRETED:
        pytest.skip("run by test_the_interpreter_suite, in a process started with TRITON_INTERPRET=1")
    from opforge.kernels.bias_act import triton_impl

    return triton_impl


def make_x(shape, layout, dtype, device="cpu", seed=0, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    if layout == "strided":  # every other channel, then the last two dims swapped
        x = (torch.randn(shape[0], shape[1] * 2, shape[3], shape[2], generator=gen) * scale)[:, ::2].transpose(2, 3)
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    else:
        x = torch.randn(shape, generator=gen) * scale
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
    return x.to(device=device, dtype=dtype)


def _rand(like, seed, contiguous=True):
    gen = torch.Generator().manual_seed(seed)
    t = (torch.rand(like.shape, generator=gen) * 2 - 1).to(device=like.device, dtype=like.dtype)
    return t if contiguous else t.transpose(0, -1).contiguous().transpose(0, -1)


def _near_clamp(x, b, dim, act, alpha, gain, clamp):
    """Where ``|act(x + b) * gain|`` lies within 1e-5 of the clamp (fp64): either side may mask it."""
    if clamp is None:
        return torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    u = reference._value(reference._pre(x.double(), None if b is None else b.double(), dim, torch.float64),
                         act, alpha, gain)
    return (u.abs() - clamp).abs() <= 1e-5 * max(clamp, 1e-3)


def _close(got, want, dtype, what, keep=None):
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), what
    rtol, atol = TOL[dtype]
    g, w = got.double(), want.double()
    if keep is not None:
        g, w = torch.where(keep, g, 0.0), torch.where(keep, w, 0.0)
    torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _close_db(got, want, variant_db_from_dx, d, n, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.numel() == 0:
        return
    rtol = TOL.get(got.dtype, TOL[torch.float32])[0]
    rounding = EPS[d.dtype] * float(d.double().abs().max()) if variant_db_from_dx else 0.0
    torch.testing.assert_close(got.double(), want.double(), rtol=max(rtol, 2 * EPS.get(got.dtype, 0.0)),
                               atol=n * (TOL[d.dtype][1] + rounding) + 1e-6, msg=lambda m: f"{what}: {m}")


def check_variant(impl, x, b, dim, act, alpha=None, gain=None, clamp=None, seed=1, order2=True):
    """``impl``'s forward, backward and backward2 against the reference's on the same tensors."""
    spec = lookup(act)
    alpha = spec.default_alpha if alpha is None else alpha
    gain = spec.default_gain if gain is None else gain
    dim = dim % x.ndim
    ref = spec.ref_for(alpha, clamp)

    y = impl.forward(x, b, dim, act, alpha, gain, clamp)
    want = reference.forward(x, b, dim, act, alpha, gain, clamp)
    _close(y, want, x.dtype, "forward")

    keep = ~_near_clamp(x, b, dim, act, alpha, gain, clamp) if ref == "x" else None
    g = geometry(torch.empty_like(x), dim, b is not None)
    from_dx = not impl.plan(g).one_channel(g) if hasattr(impl, "plan") else False
    n = x.numel() // max(1, g.channels)
    saved_x, saved_y = (x if ref == "x" else None), (want if ref == "y" else None)

    dy = _rand(x, seed, contiguous=x.ndim < 2 or x.is_contiguous())  # another layout than x's, often
    dx, db = impl.backward(dy, saved_x, b, saved_y, dim, act, alpha, gain, clamp, b is not None)
    dx_want, db_want = reference.backward(dy, saved_x, b, saved_y, dim, act, alpha, gain, clamp, b is not None)
    _close(dx, dx_want, dy.dtype, "backward dx", keep)
    if keep is None or bool(keep.all()):
        _close_db(db, db_want, from_dx, dx_want, n, "backward db")

    if order2 and spec.has_2nd_grad and ref:
        s = _rand(x, seed + 1)
        d2, db2 = impl.backward2(s, dy, saved_x, b, saved_y, dim, act, alpha, gain, clamp, b is not None)
        d2_want, db2_want = reference.backward2(s, dy, saved_x, b, saved_y, dim, act, alpha, gain, clamp,
                                                b is not None)
        _close(d2, d2_want, dy.dtype, "backward2", keep)
        if keep is None or bool(keep.all()):
            _close_db(db2, db2_want, from_dx, d2_want, n, "backward2 db")
    return y


def _case(act, config, dtype, layout, device="cpu"):
    shape, dim, how = LAYOUTS[layout]
    with_b, gain, clamp = CONFIGS[config]
    x = make_x(shape, how, dtype, device)
    gen = torch.Generator().manual_seed(7)
    b = torch.randn(shape[dim], generator=gen).to(device=device, dtype=dtype) if with_b else None
    return x, b, dim, gain, clamp


# -- the interpreter, on CPU tensors --

PAIRWISE = ("flat_blocks", "rows_ragged")
"""The layouts of several programs a call (3 and 20), there for their walks' index arithmetic (blocks
after the first, a masked last block, runs of several blocks wrapping back to channel 0), which no
activation, config or dtype changes (``_block``): each is run on every pair of act and config, of act
and dtype and of config and dtype (44 cases of the 132, the interpreter's time going by programs).
Every other layout, "rows" (the rows walk, 6 programs) among them, runs every act x config x dtype."""


def _interpreted_cases():
    for layout in LAYOUTS:
        for d, dtype in enumerate(DTYPES):
            for c, config in enumerate(CONFIGS):
                for a, act in enumerate(ACTS):
                    # (a + c) % 3: each act meets each dtype over its 4 configs, each config each dtype over the acts
                    if layout not in PAIRWISE or (a + c) % len(DTYPES) == d:
                        yield pytest.param(act, config, dtype, layout, id=f"{act}-{config}-{dtype}-{layout}")


def test_the_pairwise_layouts_meet_every_pair():
    """PAIRWISE's promise, checked on the cases the interpreter runs (this needs no triton run)."""
    for layout in PAIRWISE:
        cases = [p.values[:3] for p in _interpreted_cases() if p.values[3] == layout]
        assert len(cases) == len(ACTS) * len(CONFIGS)
        for i, j, n in ((0, 1, len(ACTS) * len(CONFIGS)), (0, 2, len(ACTS) * len(DTYPES)), (1, 2, len(CONFIGS) * len(DTYPES))):
            assert len({(case[i], case[j]) for case in cases}) == n, (layout, i, j)


@pytest.mark.parametrize("act, config, dtype, layout", list(_interpreted_cases()))
def test_interpreted_matches_the_reference(interp, act, config, dtype, layout):
    x, b, dim, gain, clamp = _case(act, config, dtype, layout)
    check_variant(interp, x, b, dim, act, gain=gain, clamp=clamp)


@pytest.mark.parametrize("act", ["lrelu", "elu"])
@pytest.mark.parametrize("alpha", [0.0, 0.05, -0.3])
def test_interpreted_alpha(interp, act, alpha):
    """A negative alpha differentiates from x (Activation.ref_for)."""
    x = make_x((3, 4, 5), "contiguous", torch.float32)
    b = torch.randn(4)
    check_variant(interp, x, b, 1, act, alpha=alpha, clamp=1.5)
    check_variant(interp, x, b, 1, act, alpha=alpha)


@pytest.mark.parametrize("act", ACTS)
def test_interpreted_extremes(interp, act):
    """Large and tiny inputs: saturation, softplus's threshold at 20, expm1 and log1p near 0."""
    v = torch.cat([torch.linspace(-40, 40, 8001), torch.tensor([-1e-6, -1e-30, 0.0, 1e-30, 1e-6, 20.0, 20.001])])
    y = check_variant(interp, v.reshape(1, -1), None, 1, act, gain=1.0)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("act", ACTS)
def test_interpreted_nan_propagates(interp, act):
    """NaN in, NaN out (as torch: relu and lrelu too, and through the clamp)."""
    x = torch.tensor([[float("nan"), -1.0, 1.0, float("nan")]])
    for clamp in (None, 0.5):
        y = interp.forward(x, None, 1, act, lookup(act).default_alpha, 1.0, clamp)
        assert torch.isnan(y[0, [0, 3]]).all() and not torch.isnan(y[0, 1:3]).any(), (act, clamp, y)
    dy = torch.tensor([[1.0, float("nan"), 1.0, 1.0]])
    want = reference.backward(dy, x, None, reference.forward(x, None, 1, act, 0.2, 1.0, None), 1, act, 0.2, 1.0,
                              None, False)[0]
    spec = lookup(act)
    ref = spec.ref_for(0.2, None)
    got = interp.backward(dy, x if ref == "x" else None, None,
                          reference.forward(x, None, 1, act, 0.2, 1.0, None) if ref == "y" else None,
                          1, act, 0.2, 1.0, None, False)[0]
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "rows_ragged", "flat_blocks"])
def test_interpreted_wide_offsets(interp, monkeypatch, dtype, layout):
    """The int64-offset kernels (taken from 2**31 elements) give the same results."""
    monkeypatch.setattr(interp, "_wide", lambda numel, block: True)
    x, b, dim, gain, clamp = _case("swish", "gain_clamp", dtype, layout)
    assert interp.plan(geometry(x, dim % x.ndim, True)).wide
    check_variant(interp, x, b, dim, "swish", gain=gain, clamp=clamp)
    check_variant(interp, x, b, dim, "tanh", gain=gain, clamp=clamp)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,dim", [((1, 5000), 0), ((3, 2, 4096), 1), ((2, 2, 2051), 1)],
                         ids=["one_channel", "rows", "rows_ragged"])
def test_interpreted_db_is_the_fp32_sum_of_unrounded_dx(interp, dtype, shape, dim):
    """Where each program lies in one channel, db sums the unrounded fp32 values (deterministic,
    not from the rounded dx): it matches the reference's fp32 sum to fp32 precision."""
    b = torch.zeros(shape[dim], dtype=torch.float32)
    dy = torch.full(shape, 0.1, dtype=dtype)
    dx, db = interp.backward(dy, None, b, None, dim, "linear", 0.0, 0.7, None, True)
    want = reference.backward(dy, None, b, None, dim, "linear", 0.0, 0.7, None, True)[1]
    assert db.dtype == torch.float32
    torch.testing.assert_close(db, want, rtol=1e-6, atol=0)
    from_dx = dx.float().sum([d for d in range(dx.ndim) if d != dim])  # what the rounded dx sums to
    assert not torch.allclose(from_dx, want, rtol=1e-6, atol=0)


def test_interpreted_mixed_dtypes(interp):
    """Each input is read in its own dtype: fp32 b and s with fp16 x; fp64 b; db in b's dtype."""
    x = make_x((2, 5, 3, 4), "channels_last", torch.float16)
    for b in (torch.randn(5), torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.bfloat16)):
        check_variant(interp, x, b, 1, "gelu", clamp=2.0)
    y = reference.forward(x, None, 1, "tanh", 0.0, 1.0, None)
    s, dy = torch.randn(x.shape), torch.randn(x.shape, dtype=torch.float16)
    got = interp.backward2(s, dy, None, None, y, 1, "tanh", 0.0, 1.0, None, False)
    want = reference.backward2(s, dy, None, None, y, 1, "tanh", 0.0, 1.0, None, False)
    torch.testing.assert_close(got[0], want[0], rtol=2**-10, atol=1e-5)
    assert got[1].shape == (0,) and got[1].dtype == want[1].dtype


def test_interpreted_delegates(interp, monkeypatch):
    """fp64, a zero gain, empty tensors, zero second derivatives: the reference, and no kernel."""
    def boom(*args, **kwargs):
        raise AssertionError("no kernel expected")

    monkeypatch.setattr(interp, "_require_triton", boom)
    x64, b64 = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(interp.forward(x64, b64, 1, "gelu", 0.0, 1.0, None),
                               reference.forward(x64, b64, 1, "gelu", 0.0, 1.0, None))
    x, b = torch.randn(2, 3, 4), torch.randn(3)
    dx, db = interp.backward(x, x, b, None, 1, "swish", 0.0, 0.0, None, True)
    assert (dx == 0).all() and (db == 0).all() and db.shape == (3,)
    empty = torch.empty(0, 3)
    assert interp.forward(empty, b, 1, "relu", 0.0, 1.0, None).shape == (0, 3)
    dx, db = interp.backward(empty, None, b, empty, 1, "relu", 0.0, 1.0, None, True)
    assert dx.shape == (0, 3) and torch.equal(db, torch.zeros(3))
    for act in ("relu", "lrelu", "linear"):  # no second derivative
        d2, _ = interp.backward2(x, x, x, b, x, 1, act, 0.2, 1.0, 1.0, True)
        assert (d2 == 0).all()


def _through_the_op(ops, monkeypatch, impl, x, b, act, clamp):
    """y, its gradients and their gradients (opforge.ops.bias_act's autograd) with ``impl`` as the kernel."""
    monkeypatch.setattr(ops, "_kernel", lambda t: impl)
    x, b = x.detach().requires_grad_(), b.detach().requires_grad_()
    y = ops.bias_act(x, b, act=act, gain=1.3, clamp=clamp)
    weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).view(y.shape)
    gx, gb = torch.autograd.grad((y * weights).sum(), (x, b), create_graph=True)
    ggx, ggb = torch.autograd.grad(gx.square().sum() + gb.square().sum(), (x, b), allow_unused=True)
    return [y, gx, gb, ggx, ggb]


def check_through_the_op(impl, monkeypatch, x, b, cases):
    """The variant (fp32) against the reference in fp64 on the same values: its fp32 error is
    a few ulps of the largest values (rtol 1e-5, atol 1e-6 of the largest); gelu_tanh's
    derivatives are more accurate here than the torch reference's own fp32 ones."""
    ops = importlib.import_module("opforge.ops.bias_act")
    for act, clamp in cases:
        got = _through_the_op(ops, monkeypatch, impl, x, b, act, clamp)
        want = _through_the_op(ops, monkeypatch, reference, x.double(), b.double(), act, clamp)
        for name, g, w in zip(("y", "dx", "db", "ddx", "ddb"), got, want):
            if w is None:
                assert g is None, (act, name)
                continue
            assert g.dtype == torch.float32 and g.stride() == w.stride(), (act, name)
            torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6 * (1 + float(w.detach().abs().max())),
                                       msg=lambda m, where=f"{act} {name}": f"{where}: {m}")


def test_interpreted_through_the_op_to_second_order(interp, monkeypatch):
    """opforge.ops.bias_act with its autograd (first and second order) on the interpreted variant."""
    x = make_x((2, 3, 5, 4), "channels_last", torch.float32)
    b = torch.randn(3, generator=torch.Generator().manual_seed(3))
    check_through_the_op(interp, monkeypatch, x, b, [("swish", 1.5), ("tanh", None), ("elu", 0.8),
                                                     ("gelu_tanh", None), ("lrelu", 0.5), ("softplus", 2.0)])


# -- a GPU --

@pytest.fixture(scope="module")
def gpu_impl():
    if INTERPRETED:
        pytest.skip("compiled kernels; this process interprets them")
    from opforge.kernels.bias_act import dispatch

    impl = dispatch.implementation("cuda", "bias_act_triton")
    assert impl.__name__ == "opforge.kernels.bias_act.triton_impl"
    return impl


GPU_LAYOUTS = ("nchw", "channels_last", "strided", "one_channel", "rows_ragged")


@pytest.mark.cuda
@pytest.mark.parametrize("layout", GPU_LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_gpu_matches_the_reference(gpu_impl, act, dtype, layout):
    for config in ("bias", "neg_gain_clamp"):
        x, b, dim, gain, clamp = _case(act, config, dtype, layout, device="cuda")
        check_variant(gpu_impl, x, b, dim, act, gain=gain, clamp=clamp)


@pytest.mark.cuda
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gpu_layouts_and_configs(gpu_impl, config, layout):
    for act in ("lrelu", "gelu"):
        x, b, dim, gain, clamp = _case(act, config, torch.float16, layout, device="cuda")
        check_variant(gpu_impl, x, b, dim, act, gain=gain, clamp=clamp)


@pytest.mark.cuda
@pytest.mark.parametrize("act", ACTS)
def test_gpu_extremes_and_nan(gpu_impl, act):
    v = torch.cat([torch.linspace(-40, 40, 8001), torch.tensor([-1e-6, 0.0, 1e-6, 20.0, 20.001, float("nan")])])
    x = v.reshape(1, -1).cuda()
    y = check_variant(gpu_impl, x, None, 1, act, gain=1.0)
    assert torch.isnan(y[0, -1])


@pytest.mark.cuda
def test_gpu_through_the_op_to_second_order(gpu_impl, monkeypatch):
    x = make_x((4, 8, 16, 16), "channels_last", torch.float32, "cuda")
    b = torch.randn(8, generator=torch.Generator().manual_seed(3)).cuda()
    check_through_the_op(gpu_impl, monkeypatch, x, b, [("swish", 1.5), ("tanh", None), ("elu", 0.8),
                                                       ("relu", 0.5), ("linear", None), ("gelu", 2.0)])
    x = make_x((2, 3, 64, 64), "contiguous", torch.float32, "cuda")  # the rows walk
    check_through_the_op(gpu_impl, monkeypatch, x, b[:3], [("gelu_tanh", 1.0), ("sigmoid", None)])


@pytest.mark.cuda
def test_gpu_db_is_deterministic(gpu_impl):
    x = make_x((8, 16, 64, 64), "contiguous", torch.float16, "cuda")
    b = torch.randn(16, device="cuda")
    dy = _rand(x, 3)
    dbs = [gpu_impl.backward(dy, x, b, None, 1, "swish", 0.0, 1.0, None, True)[1] for _ in range(3)]
    assert all(torch.equal(dbs[0], d) for d in dbs[1:])


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("shape,dim", [((2**31 // 5 + 7, 5), 1), ((3, 2**31 // 3 + 4099), 0)],
                         ids=["flat_channels_last", "rows"])
def test_gpu_more_than_2_31_elements(gpu_impl, shape, dim):
    """A fp16 tensor past 2**31 elements (4 GiB): 64-bit offsets. Checked against the reference on
    slices (elementwise, so a slice's reference is the reference's slice), and db in full."""
    free, _ = torch.cuda.mem_get_info()
    numel = math.prod(shape)
    assert numel > 2**31
    if free < 6 * 2 * numel + (1 << 30):
        pytest.skip(f"needs ~{6 * 2 * numel / 2**30:.0f} GiB of GPU memory, {free / 2**30:.0f} free")
    x = torch.empty(shape, dtype=torch.float16, device="cuda").normal_(0, 2)
    b = torch.randn(shape[dim], device="cuda")
    g = geometry(x, dim, True)
    assert gpu_impl.plan(g).wide
    args = (dim, "lrelu", 0.2, 1.4, 3.0)
    y = gpu_impl.forward(x, b, *args)
    dy = torch.empty_like(x).uniform_(-1, 1)
    dx, db = gpu_impl.backward(dy, None, b, y, *args, True)
    span = 3 * 4096
    for start in (0, 2**31 - span // 2, numel - span):  # the start, across 2**31, the end
        if dim == 1:
            part = (slice(start // shape[1], (start + span) // shape[1] + 1),)
        else:
            part = (slice(None), slice(start % shape[1], start % shape[1] + span))
        xs, ys, dys, dxs = x[part], y[part], dy[part], dx[part]
        _close(ys.contiguous(), reference.forward(xs, b, *args), x.dtype, f"y at {start}")
        _close(dxs.contiguous(), reference.backward(dys, None, b, ys, *args, False)[0].contiguous(), x.dtype,
               f"dx at {start}")
    want = torch.zeros(shape[dim], dtype=torch.float64, device="cuda")
    chunk = 2**26 // shape[dim]
    for ys, dys in zip(y.split(chunk, dim=1 - dim), dy.split(chunk, dim=1 - dim)):
        want += reference.backward(dys, None, b, ys, *args, True)[1].double()
    n = numel // shape[dim]  # db from the stored fp16 dx (flat walk): random roundings, ~1e-4 sqrt(n)
    torch.testing.assert_close(db.double(), want, rtol=1e-4, atol=1e-3 * math.sqrt(n))
