"""``bias_act`` in Triton: ``reference.py``'s contract (``forward``, ``backward``, ``backward2``) on
elementwise kernels over each tensor's storage as one flat array (``layout.py``).

Design:

* **Layout.** The output is ``torch.empty_like`` of its source (as the fake implementations
  say); every input is ``conform``-ed to its strides (a copy only when they differ) and keeps
  its own dtype, so one flat index ``k`` addresses the same element in every tensor of a call.
  Element ``k`` has channel ``(k // inner) % channels`` (``Geometry``); the bias is read from
  its fp32 copy (``bias32``).
* **Blocks.** A 1-D grid of programs, each ``BLOCK`` contiguous elements (vectorised loads),
  in one of two walks chosen per call by ``plan``:

  - *flat*: program ``p`` takes ``[p * BLOCK, (p + 1) * BLOCK)``; the channel (when there
    is more than one) is gathered per element;
  - *rows*: when a run of one channel is long (``inner`` a multiple of a block size, or at
    least 4 blocks), the runs are cut into ``per_row`` blocks each, the last one masked, so
    a program stays inside one run: its channel, and its bias, is one scalar.

  Offsets are int32 (cheaper index arithmetic) unless the tensor comes within two blocks of
  2**31 elements, where the ``WIDE`` constexpr switches them to int64.
* **Compute.** In fp32, whatever the tensors' dtypes (fp32, fp16, bf16: loaded and stored in
  their own); fp64, a zero gain, empty tensors and second derivatives that are zero
  (``has_2nd_grad`` false, or nothing saved) go to ``reference``, as in ``compiled.py``.
  The activation (``Activation.index``), what the derivative is taken from (``REF``: 0
  nothing, 1 ``y``, 2 ``x``), the derivative order, the bias and the clamp are constexprs:
  each combination compiles to a straight-line kernel.
* **Formulas** are ``reference.py``'s (softplus's threshold at 20, torch's selu constants,
  gelu with erf), with care where fp32 would lose them: only ``tl.exp``, ``tl.log`` and
  ``tl.math.erf`` are used (they also run under ``TRITON_INTERPRET=1``, where libdevice
  does not); ``expm1``, ``log1p`` and ``tanh`` keep their relative accuracy near zero (a
  short series there; ``tanh`` from ``expm1``); gelu_tanh's derivatives take ``1 - tanh^2``
  as ``sech^2`` (no cancellation where tanh saturates: more accurate than the reference's
  fp32 there). NaN propagates as in torch (``relu``, ``lrelu``, the clamp). ``y / gain`` is
  an IEEE division (``div_rn``), as torch's.
* **db** is reduced in fp32 and deterministically. When every program lies in one channel
  (the *rows* walk, or a single channel), each writes the fp32 sum of its unrounded ``dx``
  and torch sums those partials per channel; otherwise ``db`` is summed (in fp32) from the
  stored ``dx``, which for fp16/bf16 is the rounded value.

Without triton installed this module still imports (``pytest --doctest-modules`` collects
every module), but calling it raises; the loader only imports it where triton is
(``TritonExtension.check_compatible``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from . import reference
from .activations import ACTIVATIONS, SELU_ALPHA, SELU_SCALE, lookup
from .layout import Geometry, bias32, clamp_as_stored, conform, flat, geometry

try:
    import triton
    import triton.language as tl

    _jit = triton.jit
except ImportError:  # see the module doc; annotations are strings (``from __future__``), never evaluated
    triton = tl = None

    def _jit(fn):
        return fn

CODES = {"linear": 1, "relu": 2, "lrelu": 3, "tanh": 4, "sigmoid": 5, "elu": 6, "selu": 7, "softplus": 8,
         "swish": 9, "gelu": 10, "gelu_tanh": 11}
"""``Activation.index`` as the kernels spell it: literals, since each global a kernel reads is
compared again at every launch (triton checks that it has not changed), which costs time."""
assert CODES == {name: a.index for name, a in ACTIVATIONS.items()}, "activations.py renumbered its rows"
assert (SELU_SCALE, SELU_ALPHA) == (1.0507009873554805, 1.6732632423543772)
assert (reference._INV_SQRT_2PI, reference._K, reference._C) == (0.3989422804014327, 0.7978845608028654, 0.044715)

REF_CODE = {"": 0, "y": 1, "x": 2}
FLAT_BLOCK = 4096
ROW_BLOCKS = (4096, 2048, 1024, 512)
"""Block sizes for the rows walk, largest first: the first that divides ``inner``, or that
``inner`` holds at least 4 times (so the masked tail of a run wastes under a quarter)."""


# -- math that keeps its accuracy near zero --

@_jit
def _expm1(x):
    """``exp(x) - 1``: its Taylor series to x^8 for ``|x| < 0.5`` (relative error < 2e-8),
    else ``exp(x) - 1`` (no cancellation beyond 1.5 ulp there)."""
    p = x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664 + x * (
        0.008333333333333333 + x * (0.001388888888888889 + x * (1.984126984126984e-4 + x * 2.48015873015873e-5)))))))
    return tl.where(tl.abs(x) < 0.5, p, tl.exp(x) - 1.0)


@_jit
def _log1p_pos(e):
    """``log(1 + e)`` for ``e >= 0``: ``2 atanh(e / (2 + e))`` as its series for ``e < 0.5``
    (``z < 0.2``; relative error < 1e-9), else ``log(1 + e)``."""
    z = e / (2.0 + e)
    z2 = z * z
    p = 2.0 * z * (1.0 + z2 * (0.3333333333333333 + z2 * (0.2 + z2 * (0.14285714285714285 + z2 * (
        0.1111111111111111 + z2 * 0.09090909090909091)))))
    return tl.where(e < 0.5, p, tl.log(1.0 + e))


@_jit
def _tanh(x):
    """``tanh(x) = -t / (2 + t)`` with ``t = expm1(-2|x|)``, the sign put back."""
    t = _expm1(-2.0 * tl.abs(x))
    r = -t / (2.0 + t)
    return tl.where(x < 0, -r, r)


@_jit
def _sech2(x):
    """``1 - tanh(x)^2`` as ``4e / (1 + e)^2``, ``e = exp(-2|x|)``: no cancellation where tanh
    saturates (``1 - t * t`` loses all but a few bits of it there)."""
    e = tl.exp(-2.0 * tl.abs(x))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


@_jit
def _sigmoid(x):
    """``1 / (1 + exp(-x))``, from ``exp(-|x|)`` so that nothing overflows."""
    e = tl.exp(-tl.abs(x))
    r = 1.0 / (1.0 + e)
    return tl.where(x >= 0, r, e * r)


# -- the activations and their derivatives (reference.py's _act, _d_*, _d2_*) --

@_jit
def _act(v, alpha, ACT: tl.constexpr):
    if ACT == 2:  # relu
        u = tl.where(v < 0, 0.0, v)  # NaN stays NaN, as torch.relu
    elif ACT == 3:  # lrelu
        u = tl.where(v > 0, v, v * alpha)
    elif ACT == 4:  # tanh
        u = _tanh(v)
    elif ACT == 5:  # sigmoid
        u = _sigmoid(v)
    elif ACT == 6:  # elu
        u = tl.where(v > 0, v, alpha * _expm1(v))
    elif ACT == 7:  # selu
        u = tl.where(v > 0, v, _expm1(v) * 1.6732632423543772) * 1.0507009873554805
    elif ACT == 8:  # softplus
        u = tl.where(v > 20.0, v, _log1p_pos(tl.exp(v)))
    elif ACT == 9:  # swish
        u = v * _sigmoid(v)
    elif ACT == 10:  # gelu
        u = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    elif ACT == 11:  # gelu_tanh
        u = 0.5 * v * (1.0 + _tanh((v + v * v * v * 0.044715) * 0.7978845608028654))
    else:
        u = v
    return u


@_jit
def _d_from_value(a, alpha, ACT: tl.constexpr):
    """d act / d v as a function of ``a = act(v)``."""
    if ACT == 2:  # relu
        d = tl.where(a > 0, 1.0, 0.0)
    elif ACT == 3:  # lrelu
        d = tl.where(a > 0, 1.0, alpha)
    elif ACT == 4:  # tanh
        d = 1.0 - a * a
    elif ACT == 5:  # sigmoid
        d = a * (1.0 - a)
    elif ACT == 6:  # elu
        d = tl.where(a > 0, 1.0, a + alpha)
    elif ACT == 7:  # selu
        d = tl.where(a > 0, 1.0507009873554805, a + 1.7580993408473766)  # scale, scale * alpha
    elif ACT == 8:  # softplus
        d = -_expm1(-a)
    else:  # linear (saved y for its clamp)
        d = tl.zeros_like(a) + 1.0
    return d


@_jit
def _d2_from_value(a, ACT: tl.constexpr):
    """d/da of ``_d_from_value`` (activations with a second derivative)."""
    if ACT == 4:  # tanh
        d = -2.0 * a
    elif ACT == 5:  # sigmoid
        d = 1.0 - 2.0 * a
    elif ACT == 8:  # softplus
        d = tl.exp(-a)
    else:  # elu, selu
        d = tl.where(a <= 0, 1.0, 0.0)
    return d


@_jit
def _d_from_pre(v, alpha, ACT: tl.constexpr):
    """d act / d v as a function of ``v = x + b``."""
    if ACT == 3:  # lrelu
        d = tl.where(v > 0, 1.0, alpha)
    elif ACT == 6:  # elu
        d = tl.where(v > 0, 1.0, alpha * tl.exp(v))
    elif ACT == 9:  # swish
        s = _sigmoid(v)
        d = s * (1.0 + v * (1.0 - s))
    elif ACT == 10:  # gelu
        d = 0.5 * (1.0 + tl.math.erf(v * 0.7071067811865476)) + v * 0.3989422804014327 * tl.exp(-0.5 * v * v)
    elif ACT == 11:  # gelu_tanh
        w = (v + v * v * v * 0.044715) * 0.7978845608028654
        du = (1.0 + v * v * 0.134145) * 0.7978845608028654
        d = 0.5 * (1.0 + _tanh(w)) + 0.5 * v * _sech2(w) * du
    else:  # linear
        d = tl.zeros_like(v) + 1.0
    return d


@_jit
def _d2_from_pre(v, alpha, ACT: tl.constexpr):
    """d/dv of ``_d_from_pre`` (activations with a second derivative)."""
    if ACT == 6:  # elu
        d = tl.where(v > 0, 0.0, alpha * tl.exp(v))
    elif ACT == 9:  # swish
        s = _sigmoid(v)
        d = s * (1.0 - s) * (2.0 + v * (1.0 - 2.0 * s))
    elif ACT == 10:  # gelu
        d = tl.exp(-0.5 * v * v) * 0.3989422804014327 * (2.0 - v * v)
    else:  # gelu_tanh
        w = (v + v * v * v * 0.044715) * 0.7978845608028654
        du = (1.0 + v * v * 0.134145) * 0.7978845608028654
        d = _sech2(w) * (du + 0.5 * v * (v * 0.21406444881780076 - 2.0 * _tanh(w) * du * du))
    return d


# -- the kernels --

@_jit
def _block(n, inner, channels, per_row, BLOCK: tl.constexpr, ROWS: tl.constexpr, ONE_CHANNEL: tl.constexpr,
           WIDE: tl.constexpr):
    """This program's offsets, their mask, and their channel (a scalar when the block lies in
    one channel, else one per element)."""
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    lane = tl.arange(0, BLOCK)
    if ROWS:
        run = pid // per_row
        col = (pid - run * per_row) * BLOCK + lane
        offs = run * inner + col
        mask = col < inner
        channel = run % channels
    else:
        offs = pid * BLOCK + lane
        mask = offs < n
        if ONE_CHANNEL:
            channel = 0
        else:
            channel = (offs // inner) % channels
    return offs, mask, channel


@_jit
def _forward_kernel(x_ptr, b_ptr, y_ptr, n, inner, channels, per_row, alpha, gain, clamp,
                    ACT: tl.constexpr, HAS_B: tl.constexpr, HAS_CLAMP: tl.constexpr, BLOCK: tl.constexpr,
                    ROWS: tl.constexpr, ONE_CHANNEL: tl.constexpr, WIDE: tl.constexpr):
    offs, mask, channel = _block(n, inner, channels, per_row, BLOCK, ROWS, ONE_CHANNEL, WIDE)
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if HAS_B:
        v = v + tl.load(b_ptr + channel)
    u = _act(v, alpha, ACT) * gain
    if HAS_CLAMP:  # torch's clamp: NaN stays NaN
        u = tl.where(u > clamp, clamp, tl.where(u < -clamp, -clamp, u))
    tl.store(y_ptr + offs, u.to(y_ptr.dtype.element_ty), mask=mask)


@_jit
def _grad_kernel(s_ptr, dy_ptr, ref_ptr, b_ptr, out_ptr, part_ptr, n, inner, channels, per_row,
                 alpha, gain, clamp, clamp_ref,
                 ACT: tl.constexpr, REF: tl.constexpr, ORDER: tl.constexpr, HAS_B: tl.constexpr,
                 HAS_CLAMP: tl.constexpr, PARTIAL: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                 ONE_CHANNEL: tl.constexpr, WIDE: tl.constexpr):
    """``ORDER`` 1: ``backward``'s ``dx`` from ``dy``; 2: ``backward2``'s ``dref`` from ``s * dy``.
    With ``PARTIAL``, also this program's fp32 sum of it (the block lies in one channel)."""
    offs, mask, channel = _block(n, inner, channels, per_row, BLOCK, ROWS, ONE_CHANNEL, WIDE)
    g = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    if ORDER == 2:
        g = tl.load(s_ptr + offs, mask=mask).to(tl.float32) * g
    if REF == 1:  # from y: the activation's value is y / gain
        y = tl.load(ref_ptr + offs, mask=mask).to(tl.float32)
        a = tl.math.div_rn(y, gain)
        if ORDER == 1:
            d = g * (gain * _d_from_value(a, alpha, ACT))
        else:  # gain cancels
            d = g * _d2_from_value(a, ACT)
        if HAS_CLAMP:  # clamp_ref: the clamp as y's dtype stores it
            d = tl.where(tl.abs(y) < clamp_ref, d, 0.0)
    elif REF == 2:  # from x + b
        v = tl.load(ref_ptr + offs, mask=mask).to(tl.float32)
        if HAS_B:
            v = v + tl.load(b_ptr + channel)
        if ORDER == 1:
            d = g * (gain * _d_from_pre(v, alpha, ACT))
        else:
            d = g * (gain * _d2_from_pre(v, alpha, ACT))
        if HAS_CLAMP:
            d = tl.where(tl.abs(_act(v, alpha, ACT) * gain) < clamp, d, 0.0)
    else:  # linear, no clamp
        d = g * gain
    tl.store(out_ptr + offs, d.to(out_ptr.dtype.element_ty), mask=mask)
    if PARTIAL:
        tl.store(part_ptr + tl.program_id(0), tl.sum(tl.where(mask, d, 0.0), axis=0))


# -- launching --

@dataclass(frozen=True)
class Plan:
    """How a call's grid walks the flat storage (see the module doc)."""

    rows: bool
    block: int
    programs: int
    per_row: int
    """Programs per run of one channel (rows walk); 1 for the flat walk."""
    wide: bool

    @property
    def num_warps(self) -> int:
        return 8 if self.block >= 2048 else 4

    def one_channel(self, g: Geometry) -> bool:
        """Does every program's block lie in one channel (so it can sum its own part of ``db``)?"""
        return self.rows or g.channels == 1


def plan(g: Geometry) -> Plan:
    """The walk for ``g``.

    >>> plan(Geometry(numel=2 * 5 * 12, channels=5, inner=12))  # short runs: flat
    Plan(rows=False, block=4096, programs=1, per_row=1, wide=False)
    >>> plan(Geometry(numel=2 * 3 * 8192, channels=3, inner=8192))
    Plan(rows=True, block=4096, programs=12, per_row=2, wide=False)
    >>> plan(Geometry(numel=3 * 5000, channels=3, inner=5000))  # 5000 >= 4 * 1024: 5 blocks a run
    Plan(rows=True, block=1024, programs=15, per_row=5, wide=False)
    """
    if g.channels > 1:
        for block in ROW_BLOCKS:
            if g.inner % block == 0 or g.inner >= 4 * block:
                per_row = -(-g.inner // block)
                return Plan(True, block, g.rows * per_row, per_row, _wide(g.numel, block))
    return Plan(False, FLAT_BLOCK, -(-g.numel // FLAT_BLOCK), 1, _wide(g.numel, FLAT_BLOCK))


def _wide(numel: int, block: int) -> bool:
    """int64 offsets: some offset (a masked lane's too, up to a block past the end) would not fit int32."""
    return numel + 2 * block >= 2**31


_clamp_ref = functools.lru_cache(maxsize=64)(clamp_as_stored)  # a few tensor ops each call otherwise


def _on(t: torch.Tensor):
    """Launch on ``t``'s GPU (triton uses the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _require_triton() -> None:
    if triton is None:
        raise ImportError("bias_act's Triton variant needs triton: `pip install triton`")


def forward(x, b, dim: int, act: str, alpha: float, gain: float, clamp: float | None) -> torch.Tensor:
    if x.dtype == torch.float64:
        return reference.forward(x, b, dim, act, alpha, gain, clamp)
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    _require_triton()
    g = geometry(y, dim, b is not None)
    p = plan(g)
    b32 = bias32(b)
    with _on(y):
        _forward_kernel[(p.programs,)](
            conform(x, y), y if b32 is None else b32, y, g.numel, g.inner, g.channels, p.per_row,
            float(alpha), float(gain), 0.0 if clamp is None else float(clamp),
            ACT=lookup(act).index, HAS_B=b32 is not None, HAS_CLAMP=clamp is not None, BLOCK=p.block,
            ROWS=p.rows, ONE_CHANNEL=g.channels == 1, WIDE=p.wide, num_warps=p.num_warps)
    return y


def backward(dy, x, b, y, dim: int, act: str, alpha: float, gain: float, clamp: float | None,
             need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if dy.dtype == torch.float64 or gain == 0 or dy.numel() == 0:
        return reference.backward(dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
    ref = lookup(act).ref_for(alpha, clamp)
    dx = torch.empty_like(dy)
    db = _grad(1, None, dy, {"y": y, "x": x}.get(ref), b, y, dx, dim, act, ref, alpha, gain, clamp, need_db)
    return dx, db


def backward2(s, dy, x, b, y, dim: int, act: str, alpha: float, gain: float, clamp: float | None,
              need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    spec = lookup(act)
    ref = spec.ref_for(alpha, clamp)
    if dy.dtype == torch.float64 or gain == 0 or not spec.has_2nd_grad or ref == "" or dy.numel() == 0:
        return reference.backward2(s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
    src = y if ref == "y" else x
    out = torch.empty_like(src)
    db = _grad(2, s, dy, src, b, y, out, dim, act, ref, alpha, gain, clamp, need_db and ref == "x")
    return out, db


def _grad(order, s, dy, src, b, y, out, dim, act, ref, alpha, gain, clamp, need_db) -> torch.Tensor:
    """Run ``_grad_kernel`` into ``out``; return ``db`` (or the empty tensor the contract says)."""
    _require_triton()
    g = geometry(out, dim, b is not None)
    p = plan(g)
    want_db = need_db and b is not None
    part = torch.empty(p.programs, dtype=torch.float32, device=out.device) \
        if want_db and p.one_channel(g) else None
    b32 = bias32(b) if ref == "x" else None

    def keep(t):  # out's strides, the tensor's own dtype: loaded as it is
        return conform(t, out, t.dtype)

    with _on(out):
        _grad_kernel[(p.programs,)](
            out if s is None else keep(s), keep(dy), out if src is None else keep(src), out if b32 is None else b32,
            out, out if part is None else part, g.numel, g.inner, g.channels, p.per_row,
            float(alpha), float(gain), 0.0 if clamp is None else float(clamp),
            _clamp_ref(clamp, y.dtype) if ref == "y" else -1.0,
            ACT=lookup(act).index, REF=REF_CODE[ref], ORDER=order, HAS_B=b32 is not None,
            HAS_CLAMP=clamp is not None, PARTIAL=part is not None, BLOCK=p.block, ROWS=p.rows,
            ONE_CHANNEL=g.channels == 1, WIDE=p.wide, num_warps=p.num_warps)
    if not want_db:
        return reference._reduce(out, dim, b, False, dy)
    if part is not None:
        db = part.view(-1, g.channels, p.per_row).sum((0, 2))
    else:
        db = flat(out).view(-1, g.channels, g.inner).sum((0, 2), dtype=torch.float32)
    return db.to(b.dtype)


__all__ = ["Plan", "backward", "backward2", "forward", "plan"]
