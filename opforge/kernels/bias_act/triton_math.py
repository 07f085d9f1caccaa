"""``bias_act``'s activations and their derivatives as Triton device functions, for the kernels of
``triton_impl.py``; the formulas are ``reference.py``'s (softplus's threshold at 20, torch's selu
constants, gelu with erf), with care where fp32 would lose them.

Only ``tl.exp``, ``tl.log`` and ``tl.math.erf`` are used (they also run under
``TRITON_INTERPRET=1``, where libdevice does not); ``expm1``, ``log1p`` and ``tanh`` keep their
relative accuracy near zero (a short series there; ``tanh`` from ``expm1``); gelu_tanh's
derivatives take ``1 - tanh^2`` as ``sech^2`` (no cancellation where tanh saturates). NaN
propagates as in torch (``relu``, ``lrelu``). ``ACT`` is ``Activation.index`` (``CODES``).

Without triton installed this module still imports (``pytest --doctest-modules`` collects every
module); the loader only uses it where triton is (``TritonExtension.check_compatible``).
"""

from __future__ import annotations

from ..triton_compat import jit, tl, triton
from . import reference
from .activations import ACTIVATIONS, SELU_ALPHA, SELU_SCALE

CODES = {"linear": 1, "relu": 2, "lrelu": 3, "tanh": 4, "sigmoid": 5, "elu": 6, "selu": 7, "softplus": 8,
         "swish": 9, "gelu": 10, "gelu_tanh": 11}
"""``Activation.index`` as the kernels spell it: literals, since each global a kernel reads is
compared again at every launch (triton checks that it has not changed), which costs time."""
assert CODES == {name: a.index for name, a in ACTIVATIONS.items()}, "activations.py renumbered its rows"
assert (SELU_SCALE, SELU_ALPHA) == (1.0507009873554805, 1.6732632423543772)
assert (reference._INV_SQRT_2PI, reference._K, reference._C) == (0.3989422804014327, 0.7978845608028654, 0.044715)


# -- math that keeps its accuracy near zero --

@jit
def _expm1(x):
    """``exp(x) - 1``: its Taylor series to x^8 for ``|x| < 0.5`` (relative error < 2e-8),
    else ``exp(x) - 1`` (no cancellation beyond 1.5 ulp there)."""
    p = x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664 + x * (
        0.008333333333333333 + x * (0.001388888888888889 + x * (1.984126984126984e-4 + x * 2.48015873015873e-5)))))))
    return tl.where(tl.abs(x) < 0.5, p, tl.exp(x) - 1.0)


@jit
def _log1p_pos(e):
    """``log(1 + e)`` for ``e >= 0``: ``2 atanh(e / (2 + e))`` as its series for ``e < 0.5``
    (``z < 0.2``; relative error < 1e-9), else ``log(1 + e)``."""
    z = e / (2.0 + e)
    z2 = z * z
    p = 2.0 * z * (1.0 + z2 * (0.3333333333333333 + z2 * (0.2 + z2 * (0.14285714285714285 + z2 * (
        0.1111111111111111 + z2 * 0.09090909090909091)))))
    return tl.where(e < 0.5, p, tl.log(1.0 + e))


@jit
def _tanh(x):
    """``tanh(x) = -t / (2 + t)`` with ``t = expm1(-2|x|)``, the sign put back."""
    t = _expm1(-2.0 * tl.abs(x))
    r = -t / (2.0 + t)
    return tl.where(x < 0, -r, r)


@jit
def _sech2(x):
    """``1 - tanh(x)^2`` as ``4e / (1 + e)^2``, ``e = exp(-2|x|)``: no cancellation where tanh
    saturates (``1 - t * t`` loses all but a few bits of it there)."""
    e = tl.exp(-2.0 * tl.abs(x))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


@jit
def _sigmoid(x):
    """``1 / (1 + exp(-x))``, from ``exp(-|x|)`` so that nothing overflows."""
    e = tl.exp(-tl.abs(x))
    r = 1.0 / (1.0 + e)
    return tl.where(x >= 0, r, e * r)


# -- the activations and their derivatives (reference.py's _act, _d_*, _d2_*) --

@jit
def act_value(v, alpha, ACT: tl.constexpr):
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


@jit
def d_from_value(a, alpha, ACT: tl.constexpr):
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


@jit
def d2_from_value(a, ACT: tl.constexpr):
    """d/da of ``d_from_value`` (activations with a second derivative)."""
    if ACT == 4:  # tanh
        d = -2.0 * a
    elif ACT == 5:  # sigmoid
        d = 1.0 - 2.0 * a
    elif ACT == 8:  # softplus
        d = tl.exp(-a)
    else:  # elu, selu
        d = tl.where(a <= 0, 1.0, 0.0)
    return d


@jit
def d_from_pre(v, alpha, ACT: tl.constexpr):
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


@jit
def d2_from_pre(v, alpha, ACT: tl.constexpr):
    """d/dv of ``d_from_pre`` (activations with a second derivative)."""
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


__all__ = ["CODES", "act_value", "d2_from_pre", "d2_from_value", "d_from_pre", "d_from_value", "jit", "tl", "triton"]
