"""The torch implementation of ``bias_act``: the reference, and the fallback that always works.

Every variant (C++, CUDA, Triton) implements these three functions with the same
arguments and results; ``opforge.ops.bias_act`` owns the checks, the defaults and autograd:

* ``forward(x, b, dim, act, alpha, gain, clamp) -> y``:
  ``y = clamp(act(x + b) * gain, -clamp, clamp)``, ``b`` broadcast along ``dim``.
* ``backward(dy, x, b, y, dim, act, alpha, gain, clamp, need_db) -> (dx, db)``:
  ``dx = dy * d y / d(x + b)``; ``db`` its sum over every dim but ``dim``.
* ``backward2(s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db) -> (dref, db)``: the
  gradient of ``backward``'s ``dx`` with respect to the tensor it was computed from (``y`` or
  ``x``), for ``s``, the gradient flowing into ``dx``: ``s * dy * d(dx/dy)/d ref``; ``db`` its
  sum over every dim but ``dim`` when ``ref`` is ``x``.

Only the tensors ``Activation.ref_for(alpha, clamp)`` names are given to the backward ones
(``y`` for "y"; ``x`` and ``b`` for "x"); ``b`` is passed whenever the op has one. ``dim`` is
non-negative. ``clamp`` is None (no clamp) or >= 0; the gradient is zero where
``|act(x + b) * gain| >= clamp``. ``db`` is an empty tensor when ``need_db`` is false or
there is no ``b``.

Compute is in fp32 (fp64 when the tensors are fp64). ``y`` and ``dx`` are in their source's
dtype (``x``'s, ``dy``'s) with its strides when it is dense, else contiguous
(``torch.empty_like``); ``db`` is reduced in fp32 and returned in ``b``'s dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .activations import SELU_ALPHA, SELU_SCALE, lookup

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K = math.sqrt(2.0 / math.pi)  # gelu_tanh: u = K * (v + C * v^3)
_C = 0.044715


def left_to_reference(dy: torch.Tensor, gain: float, act: str = "", alpha: float = 0.0,
                      clamp: float | None = None, order: int = 1) -> bool:
    """Whether a kernel variant hands its ``backward`` (``order`` 1) or ``backward2`` (2) to this
    reference: fp64 (for checking), a zero gain or an empty tensor (all zeros), and for the
    second order an activation without one or with nothing saved (zeros too)."""
    if dy.dtype == torch.float64 or gain == 0 or dy.numel() == 0:
        return True
    if order == 1:
        return False
    spec = lookup(act)
    return not spec.has_2nd_grad or spec.ref_for(alpha, clamp) == ""


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _shaped(b: torch.Tensor, ndim: int, dim: int, cd: torch.dtype) -> torch.Tensor:
    return b.to(cd).reshape([-1 if i == dim else 1 for i in range(ndim)])


def _pre(x: torch.Tensor, b: torch.Tensor | None, dim: int, cd: torch.dtype) -> torch.Tensor:
    v = x.to(cd)
    return v if b is None else v + _shaped(b, x.ndim, dim, cd)


def _act(v: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    if name == "linear":
        return v
    if name == "relu":
        return torch.relu(v)
    if name == "lrelu":
        return F.leaky_relu(v, alpha)
    if name == "tanh":
        return torch.tanh(v)
    if name == "sigmoid":
        return torch.sigmoid(v)
    if name == "elu":
        return torch.where(v > 0, v, alpha * torch.expm1(v))
    if name == "selu":
        return torch.selu(v)
    if name == "softplus":
        return F.softplus(v)
    if name == "swish":
        return F.silu(v)
    if name == "gelu":
        return F.gelu(v)
    if name == "gelu_tanh":
        return F.gelu(v, approximate="tanh")
    raise AssertionError(name)


def _out(value: torch.Tensor, like: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``value`` as a new tensor laid out as ``torch.empty_like(like)`` (never ``src`` itself)."""
    out = torch.empty_like(like)
    if value is not src and value.dtype == out.dtype and value.stride() == out.stride():
        return value
    return out.copy_(value)


def _reduce(t: torch.Tensor, dim: int, b: torch.Tensor | None, need: bool, src: torch.Tensor) -> torch.Tensor:
    """``t`` summed (in its fp32/fp64 dtype) over every dim but ``dim``, in ``b``'s dtype; or an
    empty tensor (``b``'s dtype, else ``src``'s) when not needed."""
    if b is None or not need:
        return t.new_empty(0, dtype=b.dtype if b is not None else src.dtype)
    dims = [d for d in range(t.ndim) if d != dim]
    return t.sum(dims).to(b.dtype) if dims else t.to(b.dtype, copy=True)


def _value(v: torch.Tensor, name: str, alpha: float, gain: float) -> torch.Tensor:
    u = _act(v, name, alpha)
    return u * gain if gain != 1 else u


def forward(x, b, dim: int, act: str, alpha: float, gain: float, clamp: float | None) -> torch.Tensor:
    u = _value(_pre(x, b, dim, compute_dtype(x)), act, alpha, gain)
    if clamp is not None:
        u = u.clamp(-clamp, clamp)
    return _out(u, x, x)


# -- derivatives: d act / d v as a function of the value a = act(v) ("y"), or of v ("x") --

def _d_from_value(a: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    if name == "linear":
        return torch.ones_like(a)
    if name == "relu":
        return (a > 0).to(a.dtype)
    if name == "lrelu":
        return torch.where(a > 0, torch.ones_like(a), alpha)  # alpha in a's dtype (a where() of two scalars is fp32)
    if name == "tanh":
        return 1 - a * a
    if name == "sigmoid":
        return a * (1 - a)
    if name == "elu":
        return torch.where(a > 0, 1.0, a + alpha)
    if name == "selu":
        return torch.where(a > 0, SELU_SCALE, a + SELU_SCALE * SELU_ALPHA)
    if name == "softplus":
        return -torch.expm1(-a)
    raise AssertionError(name)


def _d2_from_value(a: torch.Tensor, name: str) -> torch.Tensor:
    """d/da of ``_d_from_value`` (only for activations with a second derivative)."""
    if name == "tanh":
        return -2 * a
    if name == "sigmoid":
        return 1 - 2 * a
    if name in ("elu", "selu"):
        return (a <= 0).to(a.dtype)
    if name == "softplus":
        return torch.exp(-a)
    raise AssertionError(name)


def _d_from_pre(v: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    if name == "linear":
        return torch.ones_like(v)
    if name == "lrelu":
        return torch.where(v > 0, torch.ones_like(v), alpha)
    if name == "elu":
        return torch.where(v > 0, 1.0, alpha * torch.exp(v))
    if name == "swish":
        s = torch.sigmoid(v)
        return s * (1 + v * (1 - s))
    if name == "gelu":
        return 0.5 * (1 + torch.erf(v * math.sqrt(0.5))) + v * _INV_SQRT_2PI * torch.exp(-0.5 * v * v)
    if name == "gelu_tanh":
        t = torch.tanh(_K * (v + _C * v * v * v))
        du = _K * (1 + 3 * _C * v * v)
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * du
    raise AssertionError(name)


def _d2_from_pre(v: torch.Tensor, name: str, alpha: float) -> torch.Tensor:
    if name == "elu":
        return torch.where(v > 0, 0.0, alpha * torch.exp(v))
    if name == "swish":
        s = torch.sigmoid(v)
        return s * (1 - s) * (2 + v * (1 - 2 * s))
    if name == "gelu":
        return _INV_SQRT_2PI * torch.exp(-0.5 * v * v) * (2 - v * v)
    if name == "gelu_tanh":
        t = torch.tanh(_K * (v + _C * v * v * v))
        du = _K * (1 + 3 * _C * v * v)
        d2u = 6 * _K * _C * v
        return (1 - t * t) * (du + 0.5 * v * (d2u - 2 * t * du * du))
    raise AssertionError(name)


def _value_mask(y: torch.Tensor, cd: torch.dtype, clamp: float | None) -> torch.Tensor | None:
    """Where the output was not clamped, judged from ``y`` against the clamp as ``y`` stores it."""
    if clamp is None:
        return None
    c = torch.tensor(clamp, dtype=cd).to(y.dtype).to(cd)
    return y.to(cd).abs() < c


def _pre_mask(v: torch.Tensor, name: str, alpha: float, gain: float, clamp: float | None) -> torch.Tensor | None:
    if clamp is None:
        return None
    return _value(v, name, alpha, gain).abs() < clamp


def _masked(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return t if mask is None else torch.where(mask, t, 0.0)


def backward(dy, x, b, y, dim: int, act: str, alpha: float, gain: float, clamp: float | None,
             need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    spec = lookup(act)
    ref = spec.ref_for(alpha, clamp)
    cd = compute_dtype(dy)
    g = dy.to(cd)
    if gain == 0:
        d = torch.zeros_like(g)
    elif ref == "":
        d = g * gain
    elif ref == "y":
        yc = y.to(cd)
        d = _masked(g * (gain * _d_from_value(yc / gain, act, alpha)), _value_mask(y, cd, clamp))
    else:
        v = _pre(x, b, dim, cd)
        d = _masked(g * (gain * _d_from_pre(v, act, alpha)), _pre_mask(v, act, alpha, gain, clamp))
    return _out(d, dy, dy), _reduce(d, dim, b, need_db, dy)


def backward2(s, dy, x, b, y, dim: int, act: str, alpha: float, gain: float, clamp: float | None,
              need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    spec = lookup(act)
    ref = spec.ref_for(alpha, clamp)
    src = y if ref == "y" else x if ref == "x" else dy
    cd = compute_dtype(dy)
    g = s.to(cd) * dy.to(cd)
    if gain == 0 or not spec.has_2nd_grad or ref == "":
        d = torch.zeros_like(g)
    elif ref == "y":  # d/dy [gain * act'(y / gain)] = act''(a) as a function of a: gain cancels
        d = _masked(g * _d2_from_value(y.to(cd) / gain, act), _value_mask(y, cd, clamp))
    else:
        v = _pre(x, b, dim, cd)
        d = _masked(g * (gain * _d2_from_pre(v, act, alpha)), _pre_mask(v, act, alpha, gain, clamp))
    return _out(d, src, src), _reduce(d, dim, b, need_db and ref == "x", dy)
