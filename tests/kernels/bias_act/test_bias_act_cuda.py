"""bias_act's CUDA variant (``bias_act_cuda``) on a GPU (skipped without one).

* The public op ``opforge.ops.bias_act`` with autograd on CUDA tensors (forward, dx, db)
  against test_bias_act's fp64 reference, for every activation, with and without bias,
  gain and clamp, dims 0, 1 and -1, contiguous / channels_last / non-dense / misaligned
  layouts, fp32, fp16 and bf16; tolerances are test_bias_act's (its module doc says why).
* The contract (``dispatch.implementation("cuda", "bias_act_cuda")``: forward, backward,
  backward2) against opforge's torch reference run on the same inputs upcast to fp64, given
  the same ``y``; backward2 is checked this way (gradgradcheck in fp64 would run the torch
  reference, not the kernel).
* The raw ops' ``db`` (per channel, in ``b``'s dtype) through both walks that sum it (cols for
  runs of one channel shorter than 256 elements, element by element where the tensor has too
  few rows for 16-byte vectors; rows for longer runs, segmented when there are few), their
  determinism, vector tails and misaligned data, empty tensors, the current stream, bad inputs,
  and tensors of more than 2^31 elements through each walk (slow).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_bias_act import ACTS, CONFIGS, DEFAULTS, DTYPES, EPS, FWD_TOL, GRAD_TOL, reference

import opforge.ops  # noqa: F401  (registers torch.ops.opforge.*)
from opforge.kernel_loader import BiasActLoader
from opforge.kernels.bias_act import dispatch
from opforge.kernels.bias_act import reference as torch_ref
from opforge.kernels.bias_act.activations import lookup
from opforge.kernels.bias_act.layout import flat, geometry
from opforge.ops import bias_act

op_module = importlib.import_module("opforge.ops.bias_act")  # the attribute opforge.ops.bias_act is the function
pytestmark = pytest.mark.cuda

NAME = "bias_act_cuda"
REF_KIND = {"": 0, "y": 1, "x": 2}
# backward2 in fp32: s * dy * (a second derivative of size <~ 2), a few ulps of each factor.
GRAD2_TOL = {torch.float32: (2e-5, 2e-5), torch.float16: GRAD_TOL[torch.float16],
             torch.bfloat16: GRAD_TOL[torch.bfloat16]}

# name: shape, dim, how x is laid out. The comments say which kernel paths they reach.
LAYOUTS = {
    "nchw": ((2, 6, 8, 8), 1, "contiguous"),  # inner 64: one channel per vector; 8 / 16 lanes a run
    "nchw_odd": ((3, 5, 7, 9), 1, "contiguous"),  # inner 63: a channel per element; 945 elements (a tail)
    "channels_last": ((2, 12, 5, 3), 1, "channels_last"),  # inner 1: consecutive channels
    "channels_last_c3": ((2, 3, 4, 5), 1, "channels_last"),  # inner 1, fewer channels than a vector
    "dim0": ((7, 33), 0, "contiguous"),  # inner 33
    "dim-1": ((3, 4, 40), -1, "contiguous"),  # inner 1, 40 channels
    "strided": ((2, 5, 3, 4), 1, "strided"),  # not dense: copied by the adapter
    "offset": ((7, 33), 1, "offset"),  # storage offset 1: no 16-byte access on x (and dy)
    "1d": ((13,), 0, "contiguous"),
    "64x64": ((2, 4, 64, 64), 1, "contiguous"),  # inner 4096: a warp a run
}


@pytest.fixture(scope="module", autouse=True)
def _one_cache(shared_cache):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
        yield


@pytest.fixture(scope="module")
def impl(_one_cache):
    """The contract on bias_act_cuda (built on first use)."""
    found = dispatch.implementation("cuda", NAME)
    assert found.name == NAME, found
    return found


@pytest.fixture
def on_cuda(impl, monkeypatch):
    """The public op runs on bias_act_cuda for CUDA tensors, whatever the loader would pick."""
    monkeypatch.setattr(op_module, "_kernel", lambda t: impl if t.is_cuda else dispatch.implementation(t.device))
    return impl


# -- inputs --

def make(shape, how, dtype, seed=0, uniform=False):
    """A CUDA tensor laid out as ``how`` says: N(0, 2^2), or U(-1, 1) with ``uniform``."""
    gen = torch.Generator().manual_seed(seed)

    def draw(*size):
        return torch.rand(size, generator=gen) * 2 - 1 if uniform else torch.randn(size, generator=gen) * 2

    if how == "strided":  # every other channel, then the last two dims swapped
        x = draw(shape[0], shape[1] * 2, shape[3], shape[2]).to(dtype).cuda()[:, ::2].transpose(2, 3)
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
        return x
    if how == "offset":
        x = draw(math.prod(shape) + 1).to(dtype).cuda()[1:].view(shape)
        assert x.data_ptr() % 16 != 0
        return x
    x = draw(*shape).to(dtype).cuda()
    return x.contiguous(memory_format=torch.channels_last) if how == "channels_last" else x


def make_b(n, dtype, seed=7):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen).to(dtype).cuda()


def resolve(act, alpha=None, gain=None):
    d_alpha, d_gain = DEFAULTS[act]
    return (d_alpha or 0.0) if alpha is None else alpha, d_gain if gain is None else gain


def db_tol(n):
    """db from the fp32 values of n elements, summed in fp32, against fp64."""
    return 1e-5 * math.sqrt(n) + 1e-5


# -- the public op, with autograd --

def check_op(x, b, dim, act, alpha=None, gain=None, clamp=None, how="contiguous", seed=1):
    dtype = x.dtype
    x.requires_grad_()
    if b is not None:
        b.requires_grad_()
    y = bias_act(x, b, dim=dim, act=act, alpha=alpha, gain=gain, clamp=clamp)
    assert y.is_cuda and y.dtype == dtype and y.shape == x.shape
    assert y.stride() == torch.empty_like(x).stride()
    x64 = x.detach().cpu().double().requires_grad_()
    b64 = None if b is None else b.detach().cpu().double().requires_grad_()
    want = reference(x64, b64, dim, act, alpha, gain, clamp)
    rtol, atol = FWD_TOL[dtype]
    torch.testing.assert_close(y.detach().cpu().double(), want, rtol=rtol, atol=atol)

    dy = make(x.shape, how, dtype, seed, uniform=True)
    y.backward(dy)
    want.backward(dy.cpu().double())
    rtol, atol = GRAD_TOL[dtype]
    keep = torch.ones(x.shape, dtype=torch.bool)
    if clamp is not None and dtype in (torch.float16, torch.bfloat16):  # the rounded y may land on the clamp
        u = reference(x64.detach(), None if b64 is None else b64.detach(), dim, act, alpha, gain, clamp, unclamped=True)
        keep = (u.abs() - clamp).abs() > 4 * EPS[dtype] * max(clamp, 1e-3)
    assert x.grad.dtype == dtype and x.grad.is_cuda
    torch.testing.assert_close(torch.where(keep, x.grad.cpu().double(), 0.0), torch.where(keep, x64.grad, 0.0),
                               rtol=rtol, atol=atol)
    if b is not None and bool(keep.all()):
        n = x.numel() // max(b.numel(), 1)
        assert b.grad.dtype == b.dtype
        torch.testing.assert_close(b.grad.cpu().double(), b64.grad, rtol=max(rtol, 2 * EPS[b.dtype]), atol=n * atol)
    return y


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("act", ACTS)
def test_op_matches_the_fp64_reference(on_cuda, act, config, dtype, layout):
    shape, dim, how = LAYOUTS[layout]
    with_b, gain, clamp = CONFIGS[config]
    x = make(shape, how, dtype)
    b = make_b(shape[dim], dtype) if with_b else None
    check_op(x, b, dim, act, gain=gain, clamp=clamp, how=how)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("act", ["lrelu", "elu"])
@pytest.mark.parametrize("alpha", [0.0, 0.05, -0.3])
def test_op_alpha(on_cuda, act, alpha, layout):
    """A negative alpha sends the derivative to x (Activation.ref_for)."""
    shape, dim, how = LAYOUTS[layout]
    check_op(make(shape, how, torch.float32), make_b(shape[dim], torch.float32), dim, act, alpha=alpha, clamp=1.5,
             how=how)


def test_op_b_in_another_dtype(on_cuda):
    x = make((2, 5, 8, 8), "channels_last", torch.float16)
    check_op(x, make_b(5, torch.float32), 1, "swish", clamp=2.0, how="channels_last")


def test_op_second_order_through_autograd(on_cuda):
    """The double backward reaches backward2 (and backward) on CUDA: compare with fp64 on the CPU."""
    for act in ("tanh", "softplus", "swish", "gelu_tanh", "elu"):
        x = make((2, 4, 8, 8), "contiguous", torch.float32).requires_grad_()
        b = make_b(4, torch.float32).requires_grad_()
        x64 = x.detach().cpu().double().requires_grad_()
        b64 = b.detach().cpu().double().requires_grad_()
        got = []
        for xx, bb in ((x, b), (x64, b64)):
            y = bias_act(xx, bb, act=act, clamp=3.0)
            (gx,) = torch.autograd.grad(y.square().sum(), xx, create_graph=True)
            got.append(torch.autograd.grad(gx.sin().sum(), (xx, bb)))
        for mine, want in zip(got[0], got[1], strict=True):
            torch.testing.assert_close(mine.cpu().double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["bias_act_cuda", "bias_act_triton"])
@given(data=st.data())
def test_fuzz_op_shapes_strides_dtypes_and_parameters(variant, data, _one_cache, monkeypatch):
    """Both GPU variants through the public op: any rank, shape (small, or a long inner run that
    takes the vector and row walks), dim, layout (permuted, stepped, at an odd offset), dtype,
    activation, alpha, gain and clamp, bias or not, against the fp64 reference."""
    chosen = dispatch.implementation("cuda", variant)  # that one (loaded by name), or an error
    monkeypatch.setattr(op_module, "_kernel", lambda t: chosen if t.is_cuda else dispatch.implementation(t.device))
    ndim = data.draw(st.integers(1, 4), label="ndim")
    shape = data.draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim), label="shape")
    if data.draw(st.booleans(), label="long last dim"):
        shape[-1] = data.draw(st.integers(60, 2100), label="last dim")
    perm = data.draw(st.permutations(range(ndim)), label="perm")
    step = data.draw(st.integers(1, 2), label="step")
    offset = data.draw(st.integers(0, 1), label="storage offset")
    dim = data.draw(st.integers(-ndim, ndim - 1), label="dim")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    act = data.draw(st.sampled_from(ACTS), label="act")
    alpha = data.draw(st.one_of(st.none(), st.floats(-0.5, 1.5)), label="alpha") if act in ("lrelu", "elu") else None
    gain = data.draw(st.one_of(st.none(), st.just(0.0), st.floats(-2.0, 2.0).map(lambda g: g if abs(g) > 1e-30 else 0.0)),
                     label="gain")
    clamp = data.draw(st.one_of(st.none(), st.floats(0.0, 4.0)), label="clamp")
    b_dtype = data.draw(st.one_of(st.none(), st.sampled_from([dtype, torch.float32])), label="bias dtype")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    gen = torch.Generator().manual_seed(seed)
    base = (torch.randn(offset + math.prod(s * step for s in shape), generator=gen) * 2).to("cuda", dtype)
    x = base[offset:].view([s * step for s in shape])[tuple(slice(None, None, step) for _ in shape)].permute(*perm)
    b = None if b_dtype is None else torch.randn(x.shape[dim], generator=gen).to("cuda", b_dtype)
    check_op(x.detach(), b, dim, act, alpha=alpha, gain=gain, clamp=clamp, seed=seed)


# -- the contract, against opforge's torch reference on the same inputs in fp64 --

@pytest.mark.parametrize("layout", ["nchw", "nchw_odd", "channels_last", "dim0", "dim-1", "offset", "64x64"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("act", ACTS)
def test_contract_matches_the_torch_reference(impl, act, config, dtype, layout):
    shape, dim, how = LAYOUTS[layout]
    dim %= len(shape)
    with_b, gain, clamp = CONFIGS[config]
    alpha, gain = resolve(act, gain=gain)
    x = make(shape, how, dtype)
    b = make_b(shape[dim], dtype) if with_b else None
    x64, b64 = x.double(), None if b is None else b.double()

    y = impl.forward(x, b, dim, act, alpha, gain, clamp)
    rtol, atol = FWD_TOL[dtype]
    torch.testing.assert_close(y.double(), torch_ref.forward(x64, b64, dim, act, alpha, gain, clamp), rtol=rtol,
                               atol=atol)

    # The backward reads the y it is given (rounded to dtype): the reference gets the same.
    # The clamps (0.5, 1.0) are exact in every dtype, so both judge the clamp alike.
    dy = make(shape, how, dtype, seed=1, uniform=True)
    s = make(shape, how, dtype, seed=2, uniform=True)
    y64 = y.double()
    n = x.numel() // shape[dim]
    dx, db = impl.backward(dy, x, b, y, dim, act, alpha, gain, clamp, with_b)
    dx64, db64 = torch_ref.backward(dy.double(), x64, b64, y64, dim, act, alpha, gain, clamp, with_b)
    rtol, atol = GRAD_TOL[dtype]
    assert dx.dtype == dtype and dx.stride() == torch.empty_like(dy).stride()
    torch.testing.assert_close(dx.double(), dx64, rtol=rtol, atol=atol)
    if with_b:
        assert db.dtype == b.dtype and db.shape == b.shape
        torch.testing.assert_close(db.double(), db64, rtol=max(1e-5, 2 * EPS[dtype]), atol=db_tol(n))
    else:
        assert db.numel() == 0

    spec = lookup(act)
    if spec.has_2nd_grad and spec.ref_for(alpha, clamp):
        out, db2 = impl.backward2(s, dy, x, b, y, dim, act, alpha, gain, clamp, with_b)
        out64, db2_64 = torch_ref.backward2(s.double(), dy.double(), x64, b64, y64, dim, act, alpha, gain, clamp,
                                            with_b)
        rtol, atol = GRAD2_TOL[dtype]
        torch.testing.assert_close(out.double(), out64, rtol=rtol, atol=atol)
        if with_b and spec.ref_for(alpha, clamp) == "x":
            torch.testing.assert_close(db2.double(), db2_64, rtol=max(1e-5, 2 * EPS[dtype]), atol=db_tol(n))


@pytest.mark.parametrize("act,alpha", [("lrelu", -0.3), ("elu", -0.3), ("elu", 0.7)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_contract_alpha(impl, act, alpha, dtype):
    shape, dim = (2, 6, 8, 8), 1
    x, b = make(shape, "contiguous", dtype), make_b(6, dtype)
    dy, s = make(shape, "contiguous", dtype, 1, True), make(shape, "contiguous", dtype, 2, True)
    y = impl.forward(x, b, dim, act, alpha, 1.0, None)
    args = (x.double(), b.double(), y.double(), dim, act, alpha, 1.0, None, True)
    mine = impl.backward2(s, dy, x, b, y, dim, act, alpha, 1.0, None, True)
    want = torch_ref.backward2(s.double(), dy.double(), *args)
    torch.testing.assert_close(mine[0].double(), want[0], rtol=GRAD2_TOL[dtype][0], atol=GRAD2_TOL[dtype][1])
    mine = impl.backward(dy, x, b, y, dim, act, alpha, 1.0, None, True)
    want = torch_ref.backward(dy.double(), *args)
    torch.testing.assert_close(mine[0].double(), want[0], rtol=GRAD_TOL[dtype][0], atol=GRAD_TOL[dtype][1])
    torch.testing.assert_close(mine[1].double(), want[1], rtol=max(1e-5, 2 * EPS[dtype]), atol=db_tol(128))


def test_zero_gain_and_zero_clamp(impl):
    x, b = make((2, 8, 4, 4), "contiguous", torch.float16), make_b(8, torch.float32)
    dy = make((2, 8, 4, 4), "contiguous", torch.float16, 1, True)
    for act in ("relu", "tanh", "gelu"):
        for gain, clamp in ((0.0, None), (1.0, 0.0)):
            y = impl.forward(x, b, 1, act, 0.0, gain, clamp)
            assert (y == 0).all()
            dx, db = impl.backward(dy, x, b, y, 1, act, 0.0, gain, clamp, True)
            assert (dx == 0).all() and (db == 0).all()


# -- the raw ops: db as the sum of each run, the paths of the kernels --

RUNS = {  # shape, dim, layout; the walk that sums db (bias_act_cuda.h) for fp16
    "inner1": ((4, 7), 1, "contiguous"),  # cols, element by element (fewer rows than 16-byte vectors need)
    "inner3": ((5, 3), 0, "contiguous"),  # cols, element by element
    "inner8": ((3, 4, 8), 1, "contiguous"),  # cols, one row of vectors
    "inner64": ((8, 16, 8, 8), 1, "contiguous"),  # cols
    "inner81": ((4, 6, 9, 9), 1, "contiguous"),  # cols, runs that start anywhere in a vector
    "inner128": ((64, 6, 128), 1, "contiguous"),  # cols, many row blocks
    "inner255": ((3, 5, 255), 1, "contiguous"),  # cols, the longest runs it takes (element by element)
    "one_channel": ((1000, 1), 1, "contiguous"),  # cols, channels 1, a short last row
    "dim-1_wide": ((257, 1000), 1, "contiguous"),  # cols, 1000 channels: a partly idle block of columns
    "dim-1_many_rows": ((4096, 40), 1, "contiguous"),  # cols, many row blocks of 7 periods
    "inner4096": ((4, 8, 64, 64), 1, "contiguous"),  # rows, a warp a run
    "few_long_runs": ((1, 3, 512, 512), 1, "contiguous"),  # rows, runs split in segments
    "few_odd_runs": ((2, 2, 999, 1001), 1, "contiguous"),
    "channels_last": ((2, 12, 5, 3), 1, "channels_last"),  # cols, inner 1, a short last row
    "offset": ((16, 257), 0, "offset"),  # rows, misaligned, inner 257
    "offset_cols": ((33, 20), 1, "offset"),  # cols, misaligned
}
GRADS = {  # act, alpha, gain, clamp: one of each ref kind
    "none": ("linear", 0.0, 0.8, None),
    "y": ("tanh", 0.0, 1.3, 1.0),  # a clamp exact in every dtype: the reference judges the rounded y alike
    "x": ("gelu", 0.0, 1.0, 1.0),
}


def raw_call(impl, order, grads, x, b, y, dim, act, alpha, gain, clamp, with_db):
    """The op itself: (out, db of one fp32 sum per channel, geometry)."""
    ref = lookup(act).ref_for(alpha, clamp)
    src = {"y": y, "x": x}.get(ref)
    out = torch.empty_like(src if order == 2 else grads[0])
    g = geometry(out, dim, b is not None)
    db = torch.empty(g.channels, dtype=torch.float32, device=out.device) if with_db else None
    clamp_ref = -1.0 if clamp is None or ref != "y" else float(torch.tensor(clamp).to(y.dtype))
    b32 = b.float().contiguous() if b is not None and ref == "x" else None
    op = impl.ops.backward if order == 1 else impl.ops.backward2
    op(*grads, src, b32, out, db, g.channels, g.inner, lookup(act).index, REF_KIND[ref], alpha, gain,
       -1.0 if clamp is None else clamp, clamp_ref)
    return out, db, g


def channel_sums(t64, g):
    return flat(t64).view(-1, g.channels, g.inner).sum((0, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ref", list(GRADS))
@pytest.mark.parametrize("case", list(RUNS))
def test_raw_channel_sums(impl, case, ref, dtype):
    """db is the fp32 sum of the unrounded values (not of the stored fp16/bf16 dx)."""
    shape, dim, how = RUNS[case]
    act, alpha, gain, clamp = GRADS[ref]
    x, b = make(shape, how, dtype), make_b(shape[dim], torch.float32)
    dy = make(shape, how, dtype, 1, True)
    y = impl.forward(x, b, dim, act, alpha, gain, clamp)
    dx, db, g = raw_call(impl, 1, (dy,), x, b, y, dim, act, alpha, gain, clamp, True)
    dx64, _ = torch_ref.backward(dy.double(), x.double(), b.double(), y.double(), dim, act, alpha, gain, clamp, False)
    rtol, atol = GRAD_TOL[dtype]
    torch.testing.assert_close(dx.double(), dx64, rtol=rtol, atol=atol)
    n = g.numel // g.channels
    torch.testing.assert_close(db.double(), channel_sums(dx64, g), rtol=1e-5, atol=db_tol(n))
    # Without db: the elementwise walk, the same dx.
    dx2, none, _ = raw_call(impl, 1, (dy,), x, b, y, dim, act, alpha, gain, clamp, False)
    assert none is None
    torch.testing.assert_close(dx2.double(), dx.double(), rtol=2 * EPS[dtype], atol=1e-6)

    if lookup(act).has_2nd_grad:
        s = make(shape, how, dtype, 2, True)
        out, db2, g = raw_call(impl, 2, (s, dy), x, b, y, dim, act, alpha, gain, clamp, True)
        out64, _ = torch_ref.backward2(s.double(), dy.double(), x.double(), b.double(), y.double(), dim, act, alpha,
                                       gain, clamp, False)
        torch.testing.assert_close(out.double(), out64, rtol=GRAD2_TOL[dtype][0], atol=GRAD2_TOL[dtype][1])
        torch.testing.assert_close(db2.double(), channel_sums(out64, g), rtol=1e-5, atol=db_tol(n))


@pytest.mark.parametrize("bdtype", [torch.float16, torch.bfloat16], ids=str)
def test_raw_bias_and_db_in_half_precision(impl, bdtype):
    """b read in its own dtype, db written in it: the same as with their fp32 values, db rounded once."""
    x = make((4, 6, 8, 8), "contiguous", torch.float16)
    dy = make((4, 6, 8, 8), "contiguous", torch.float16, 1, True)
    b = make_b(6, bdtype)
    out, out32 = torch.empty_like(x), torch.empty_like(x)
    impl.ops.forward(x, b, out, 6, 64, 10, 0.0, 1.0, -1.0)
    impl.ops.forward(x, b.float(), out32, 6, 64, 10, 0.0, 1.0, -1.0)
    assert torch.equal(out, out32)
    for inner in (64, 1):  # the rows walk, then the cols walk (channels last)
        xx, dd = (x, dy) if inner == 64 else (x.permute(0, 2, 3, 1).contiguous(), dy.permute(0, 2, 3, 1).contiguous())
        db, db32 = torch.empty(6, dtype=bdtype, device="cuda"), torch.empty(6, device="cuda")
        dx, dx32 = torch.empty_like(xx), torch.empty_like(xx)
        impl.ops.backward(dd, xx, b, dx, db, 6, inner, 10, 2, 0.0, 1.0, -1.0, -1.0)
        impl.ops.backward(dd, xx, b.float(), dx32, db32, 6, inner, 10, 2, 0.0, 1.0, -1.0, -1.0)
        assert torch.equal(dx, dx32) and torch.equal(db, db32.to(bdtype))


def test_channel_sums_are_deterministic(impl):
    for shape, how in (((1, 3, 512, 512), "contiguous"), ((16, 64, 8, 8), "contiguous"), ((4, 8, 64, 64), "contiguous"),
                       ((64, 40, 32, 32), "channels_last")):  # rows (segments), cols, rows, cols
        x, b = make(shape, how, torch.float16), make_b(shape[1], torch.float32)
        dy = make(shape, how, torch.float16, 1, True)
        y = impl.forward(x, b, 1, "gelu", 0.0, 1.0, None)
        first = raw_call(impl, 1, (dy,), x, b, y, 1, "gelu", 0.0, 1.0, None, True)
        for _ in range(3):
            again = raw_call(impl, 1, (dy,), x, b, y, 1, "gelu", 0.0, 1.0, None, True)
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vector_tails_and_alignment(impl, dtype):
    """Every numel around a vector, every storage offset of x and dy (16-byte accesses or not,
    each tensor on its own), 1-D with a bias per element and 2-D with one per row."""
    gen = torch.Generator().manual_seed(3)
    base = (torch.randn(4200, generator=gen) * 2).to(dtype).cuda()
    gbase = (torch.rand(4200, generator=gen) * 2 - 1).to(dtype).cuda()
    for n in (1, 3, 7, 8, 9, 15, 16, 17, 1023, 4097):
        for xo, go in ((0, 0), (1, 0), (0, 3), (5, 5), (8, 8)):
            for shape, dim in (((n,), 0), ((1, n), 0), ((n, 1), 0)):
                x = base[xo:xo + n].view(shape)
                dy = gbase[go:go + n].view(shape)
                b = make_b(shape[dim], torch.float32, seed=n)
                for act in ("swish", "softplus"):
                    y = impl.forward(x, b, dim, act, 0.0, 1.0, 3.0)
                    want = torch_ref.forward(x.double(), b.double(), dim, act, 0.0, 1.0, 3.0)
                    torch.testing.assert_close(y.double(), want, rtol=FWD_TOL[dtype][0], atol=FWD_TOL[dtype][1])
                    dx, db = impl.backward(dy, x, b, y, dim, act, 0.0, 1.0, 3.0, True)
                    dx64, db64 = torch_ref.backward(dy.double(), x.double(), b.double(), y.double(), dim, act, 0.0,
                                                    1.0, 3.0, True)
                    torch.testing.assert_close(dx.double(), dx64, rtol=GRAD_TOL[dtype][0], atol=GRAD_TOL[dtype][1])
                    torch.testing.assert_close(db.double(), db64, rtol=1e-5, atol=db_tol(n))


def test_empty(impl, on_cuda):
    x = torch.zeros(0, 3, device="cuda", requires_grad=True)
    b = torch.zeros(3, device="cuda", requires_grad=True)
    y = bias_act(x, b, act="gelu")
    assert y.shape == (0, 3) and y.is_cuda
    y.sum().backward()
    assert x.grad.shape == (0, 3) and (b.grad == 0).all()
    e = torch.empty(0, 4, device="cuda", dtype=torch.float16)
    impl.ops.forward(e, None, torch.empty_like(e), 1, 1, 4, 0.0, 1.0, -1.0)  # nothing to do, no error
    impl.ops.backward(e, None, None, torch.empty_like(e), None, 1, 1, 1, 0, 0.0, 1.0, -1.0, -1.0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_no_grad_forward_is_one_op_call(on_cuda, layout, dtype):
    """``forward_fresh`` (the no-grad public op's one call) takes every dense layout, with b in any
    kernel dtype or none, and gives the adapter's forward bit for bit, in x's strides; a layout
    that isn't dense it declines ([]), and the public op then gives the adapter's result."""
    shape, dim, how = LAYOUTS[layout]
    x = make(shape, how, dtype)
    swish = lookup("swish").index
    for b in (make_b(shape[dim], dtype), make_b(shape[dim], torch.float32), None):
        got = on_cuda.fresh(x, b, dim, swish, 0.0, 1.5, 2.0)
        want = on_cuda.forward(x, b, dim % x.ndim, "swish", 0.0, 1.5, 2.0)
        if how == "strided":
            assert got == []
        else:
            (y,) = got
            assert y.stride() == x.stride() and y.dtype == x.dtype
            torch.testing.assert_close(y, want, rtol=0, atol=0)
        torch.testing.assert_close(bias_act(x, b, dim, act="swish", gain=1.5, clamp=2.0), want, rtol=0, atol=0)


def test_the_one_call_forward_declines_what_the_checks_must_see(on_cuda):
    """Every call ``forward_fresh`` can't take returns [], and the public op's checks then raise
    their messages (or run the call another way: b in fp64 or not contiguous, x in fp64)."""
    x = make((2, 6, 8, 8), "contiguous", torch.float16)
    b = make_b(6, torch.float16)
    fresh = on_cuda.fresh
    relu = lookup("relu").index
    declined = {
        "b too short": (x, b[:5], 1), "b on the CPU": (x, b.cpu(), 1), "b 2-D": (x, b[None], 1),
        "b not contiguous": (x, make_b(12, torch.float16)[::2], 1), "b in fp64": (x, b.double(), 1),
        "dim out of range": (x, b, 4), "x on the CPU": (x.cpu(), b, 1), "x in fp64": (x.double(), b.double(), 1),
        "x of ints": (x.to(torch.int32), None, 1), "x empty": (x[:0], b, 1), "x 0-d": (x[0, 0, 0, 0], b[:1], 0),
    }
    for why, (xx, bb, d) in declined.items():
        assert fresh(xx, bb, d, relu, 0.0, 1.0, -1.0) == [], why
    with pytest.raises(ValueError, match=r"b must be 1-D with x.shape\[1\] = 6 elements"):
        bias_act(x, b[:5])
    with pytest.raises(ValueError, match="b is on cpu but x is on cuda"):
        bias_act(x, b.cpu())
    with pytest.raises(ValueError, match="dim=4 is out of range"):
        bias_act(x, b, dim=4)
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64"):
        bias_act(x.to(torch.int32))
    for bb in (make_b(12, torch.float16)[::2], b.double()):
        want = torch.relu(x.float() + bb.float()[:, None, None]) * math.sqrt(2)
        torch.testing.assert_close(bias_act(x, bb, act="relu").float(), want, rtol=1e-3, atol=1e-3)
    assert bias_act(x[:0], b).shape == (0, 6, 8, 8)


def test_runs_on_the_current_stream(impl):
    """The op's kernel follows the producer of x on a side stream: on another stream it would
    read x before the fill (the side stream sleeps first)."""
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.fill_(1.0)
        y = impl.forward(x, None, 0, "linear", 0.0, 2.0, None)
        dx, _ = impl.backward(x, None, None, y, 0, "linear", 0.0, 3.0, None, False)
    side.synchronize()
    assert (y == 2).all() and (dx == 3).all()


def test_the_loader_picks_it_for_cuda_tensors(_one_cache):
    assert BiasActLoader().load(device="cuda").name == NAME
    assert dispatch.implementation("cuda").name == NAME


# -- bad input to the ops themselves (the adapter never sends it) --

def test_bad_input_to_the_raw_ops(impl):
    ops = impl.ops
    x = torch.randn(2, 3, 4, device="cuda")
    y = torch.empty_like(x)
    b = torch.zeros(3, device="cuda")
    ops.forward(x, b, y, 3, 4, 2, 0.0, 1.0, -1.0)
    cases = [
        (lambda: ops.forward(x.cpu(), b, y, 3, 4, 2, 0.0, 1.0, -1.0), "x must be a CUDA tensor, got cpu"),
        (lambda: ops.forward(x, b, y.cpu(), 3, 4, 2, 0.0, 1.0, -1.0), "y must be a CUDA tensor"),
        (lambda: ops.forward(x.half(), b, y, 3, 4, 2, 0.0, 1.0, -1.0), "x must have y's dtype"),
        (lambda: ops.forward(x.double(), b, y.double(), 3, 4, 2, 0.0, 1.0, -1.0), "must be float32, float16 or"),
        (lambda: ops.forward(x, b.double(), y, 3, 4, 2, 0.0, 1.0, -1.0), "b must be float32, float16 or bfloat16"),
        (lambda: ops.forward(x, b[:2], y, 3, 4, 2, 0.0, 1.0, -1.0), "b must have 3 elements"),
        (lambda: ops.forward(x[:, :2], b, y, 3, 4, 2, 0.0, 1.0, -1.0), "elements, expected 24"),
        (lambda: ops.forward(x.transpose(1, 2), b, y, 3, 4, 2, 0.0, 1.0, -1.0), "shape and strides"),
        (lambda: ops.forward(x, b, y[:, :, ::2], 3, 4, 2, 0.0, 1.0, -1.0), "y must be dense"),
        (lambda: ops.forward(x, b, y, 5, 4, 2, 0.0, 1.0, -1.0), "not whole runs"),
        (lambda: ops.forward(x, b, y, 3, 0, 2, 0.0, 1.0, -1.0), "channels and inner must be >= 1"),
        (lambda: ops.forward(x, b, y, 3, 4, 12, 0.0, 1.0, -1.0), "unknown activation id 12"),
        (lambda: ops.forward(x, b, y, 3, 4, 2, 0.0, math.inf, -1.0), "must be finite"),
        (lambda: ops.backward(x, x, None, y, None, 3, 4, 4, 3, 0.0, 1.0, -1.0, -1.0), "ref_kind must be 0"),
        (lambda: ops.backward(x, None, None, y, None, 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0), "ref must be given"),
        (lambda: ops.backward(x, x, None, y, None, 3, 4, 9, 1, 0.0, 1.0, -1.0, -1.0), "swish has no derivative"),
        (lambda: ops.backward(x, x, None, y, torch.empty(5, device="cuda"), 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0),
         "db must have 3 elements"),
        (lambda: ops.backward2(x.half(), x, x, None, y, None, 3, 4, 4, 1, 0.0, 1.0, -1.0, -1.0), "s must have"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


# -- more than 2^31 elements --

@pytest.mark.slow
@pytest.mark.parametrize("dim", [0, 1], ids=["rows", "cols"])
def test_more_than_2_31_elements(impl, dim):
    """fp16, 3 channels of 715827887 elements, 64-bit indexing. dim 0: 3 runs of one channel
    (odd: a channel per element, a vector tail; db by the rows walk, in segments); dim 1: the
    channel is the last dim (the cols walk). Sampled elements of y and dx, and db, against fp64."""
    free, _ = torch.cuda.mem_get_info()
    if free < 24 << 30:
        pytest.skip("needs 24 GiB of free GPU memory")
    channels, inner = 3, 715827887
    n = channels * inner
    assert n > 2**31
    shape = (channels, inner) if dim == 0 else (inner, channels)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)
    dy = torch.rand(shape, device="cuda", dtype=torch.float16, generator=gen) * 2 - 1
    b = torch.tensor([0.5, -0.25, 0.125], device="cuda")
    act, gain = "swish", math.sqrt(2)
    y = impl.forward(x, b, dim, act, 0.0, gain, None)
    dx, db = impl.backward(dy, x, b, y, dim, act, 0.0, gain, None, True)

    idx = torch.randint(0, n, (4096,), device="cuda", generator=gen)
    idx = torch.cat([idx, torch.arange(n - 64, n, device="cuda"), torch.arange(2**31 - 64, n, device="cuda"),
                     torch.arange(0, 64, device="cuda"), torch.arange(inner - 64, inner + 64, device="cuda")])
    ch = idx // inner if dim == 0 else idx % channels
    v = flat(x)[idx].double() + b.double()[ch]
    sig = torch.sigmoid(v)
    torch.testing.assert_close(flat(y)[idx].double(), v * sig * gain, rtol=FWD_TOL[torch.float16][0],
                               atol=FWD_TOL[torch.float16][1])
    d = flat(dy)[idx].double() * gain * sig * (1 + v * (1 - sig))
    torch.testing.assert_close(flat(dx)[idx].double(), d, rtol=GRAD_TOL[torch.float16][0],
                               atol=GRAD_TOL[torch.float16][1])
    del y, dx
    want = torch.zeros(channels, dtype=torch.float64, device="cuda")
    step = 1 << 26
    for c in range(channels):
        for lo in range(0, inner, step):
            xs, dys = (x[c, lo:lo + step], dy[c, lo:lo + step]) if dim == 0 else (x[lo:lo + step, c], dy[lo:lo + step, c])
            v = xs.double() + float(b[c])
            sig = torch.sigmoid(v)
            want[c] += (dys.double() * gain * sig * (1 + v * (1 - sig))).sum()
    torch.testing.assert_close(db.double(), want, rtol=1e-4, atol=1.0)


# -- CUDA graphs and torch.compile's reduce-overhead mode (issue 21) --

def _capture(step, warm_up):
    side = torch.cuda.Stream()  # warm up on a side stream, as torch's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            warm_up()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cuda_graph_replay_equals_eager(on_cuda, grad, dtype):
    x = torch.randn(4, 512, 8, 8, device="cuda", dtype=dtype, requires_grad=grad)
    b = torch.randn(512, device="cuda", dtype=dtype, requires_grad=grad)
    dy = torch.randn(4, 512, 8, 8, device="cuda", dtype=dtype)

    def step():
        y = bias_act(x, b, act="lrelu", clamp=256.0)
        if grad:
            y.backward(dy)
        return y

    def warm_up():
        x.grad = b.grad = None
        step()

    if grad:  # the graph accumulates into these
        x.grad, b.grad = torch.zeros_like(x), torch.zeros_like(b)
    graph, static_y = _capture(step, warm_up)
    grads = (x.grad, b.grad) if grad else ()
    for seed in (1, 2):
        new = torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dtype)
        with torch.no_grad():
            x.copy_(new)
            for t in grads:
                t.zero_()
        graph.replay()
        xe = new.clone().requires_grad_(grad)
        be = b.detach().clone().requires_grad_(grad)
        ye = bias_act(xe, be, act="lrelu", clamp=256.0)
        torch.testing.assert_close(static_y, ye.detach(), rtol=0, atol=0)
        if grad:
            ye.backward(dy)
            torch.testing.assert_close(grads[0], xe.grad, rtol=0, atol=0)
            torch.testing.assert_close(grads[1], be.grad)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
def test_torch_compile_reduce_overhead_equals_eager(on_cuda, grad):
    torch._dynamo.reset()
    b = torch.randn(512, device="cuda", requires_grad=grad)
    f = torch.compile(lambda x, b: bias_act(x, b, act="swish") * 2, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # cudagraph trees record after warm-up runs
        gen = torch.Generator("cuda").manual_seed(seed)
        x = torch.randn(4, 512, 8, 8, device="cuda", generator=gen, requires_grad=grad)
        if grad:
            b.grad = None
            y = f(x, b)
            y.sum().backward()
            got = y.detach().clone(), x.grad.clone(), b.grad.clone()
            b.grad = None
            x2 = x.detach().clone().requires_grad_()
            y2 = bias_act(x2, b, act="swish") * 2
            y2.sum().backward()
            for a, e in zip(got, (y2.detach(), x2.grad, b.grad)):
                torch.testing.assert_close(a, e)
        else:
            with torch.no_grad():
                torch.testing.assert_close(f(x, b).clone(), bias_act(x, b, act="swish") * 2)
