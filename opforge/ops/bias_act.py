"""``opforge.ops.bias_act``: ``y = clamp(act(x + b) * gain, -clamp, clamp)``, ``b`` broadcast along
``dim``, on the best ``bias_act`` kernel (``BiasActLoader``), with first and second derivatives.

Three ``torch.library`` custom ops, each with a fake implementation:

* ``opforge::bias_act(x, b, dim, act, alpha, gain, clamp) -> y``;
* ``opforge::bias_act_backward(dy, x, b, y, ..., need_db) -> (dx, db)``, its autograd;
* ``opforge::bias_act_backward2(s, dy, x, b, y, ..., need_db) -> (dref, db)``, the autograd
  of ``bias_act_backward``: the double backward goes through these ops, so a kernel variant
  implements three functions and never autograd (see ``kernels/bias_act/reference.py``).

What the backward keeps is ``Activation.ref_for``: ``y`` (the output) for the activations
whose derivative is a function of their value, ``x`` and ``b`` for the others, nothing for
``linear`` without a clamp. Third-order gradients are not supported (a clear error).

Arguments are checked here, at the boundary, with messages that name the fix. Policy:

* ``x``: float16, bfloat16, float32 or float64, any shape, any strides; compute in fp32
  (fp64 for fp64 input); ``y`` in ``x``'s dtype, with ``x``'s strides when ``x`` is dense.
* ``b``: None, or a 1-D tensor of ``x.shape[dim]`` elements on ``x``'s device, of any float
  dtype (it is read in the compute dtype; ``db`` comes back in ``b``'s dtype).
  ``dim`` is only checked when there is a ``b``.
* ``alpha``: only for ``lrelu`` (negative slope, default 0.2) and ``elu`` (default 1.0);
  given to another activation it is an error. ``gain``: default sqrt(2) for relu, lrelu
  and swish, else 1. ``clamp``: None, or >= 0; the gradient is zero where
  ``|act(x + b) * gain| >= clamp``.
"""

from __future__ import annotations

import math

import torch

from ..kernels.bias_act import dispatch, native_autograd
from ..kernels.bias_act.activations import NAMES, Activation, lookup

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FP32_MAX = 3.4028234663852886e38
FP32_TINY = 2.0**-126
"""fp32's largest and smallest normal magnitudes: the scalars' range (a gain below it has no
finite reciprocal in fp32, and the derivatives that read ``y`` divide by the gain)."""


def _kernel(t: torch.Tensor):
    """The best implementation for tensors on ``t``'s device (``BiasActLoader``): the C++
    variant of this CPU's ISA for CPU tensors, CUDA or Triton for GPU ones, else torch."""
    return dispatch.for_tensor(t)


def check(x: torch.Tensor, b: torch.Tensor | None, dim: int, spec: Activation, alpha: float, gain: float,
          clamp: float | None) -> int:
    """Raise on bad arguments (saying what to do); return ``dim``, made non-negative."""
    check_scalars(alpha, gain, clamp)
    return check_tensors(x, b, dim)


def check_scalars(alpha: float, gain: float, clamp: float | None) -> None:
    if clamp is not None and not clamp >= 0:  # also catches NaN
        raise ValueError(f"bias_act: clamp must be None (no clamping) or >= 0, got {clamp}")
    # Plain comparisons (math.isfinite would break a dynamic graph); each is false for NaN.
    if not (abs(gain) < math.inf and abs(alpha) < math.inf):
        raise ValueError(f"bias_act: gain and alpha must be finite, got gain={gain}, alpha={alpha}")
    if not (abs(alpha) <= FP32_MAX and (gain == 0 or FP32_TINY <= abs(gain) <= FP32_MAX)):
        raise ValueError(f"bias_act: gain={gain}, alpha={alpha}: the kernels compute in float32, where alpha must "
                         f"be at most {FP32_MAX:.4g} in magnitude and gain 0 or between {FP32_TINY:.4g} and "
                         f"{FP32_MAX:.4g} (the derivatives divide by it): pass gain=0 for a zero output, or "
                         f"scale the result yourself")


def check_tensors(x: torch.Tensor, b: torch.Tensor | None, dim: int) -> int:
    """The checks that depend on the tensors (every call); return ``dim``, made non-negative."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"bias_act: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in FLOATS:
        raise TypeError(f"bias_act: x must be float16, bfloat16, float32 or float64, got {x.dtype}: "
                        f"convert it first, e.g. x.float()")
    if x.layout != torch.strided:
        raise ValueError(f"bias_act: x must be a dense (strided) tensor, got {x.layout}: use x.to_dense()")
    if b is None:
        return dim
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"bias_act: b must be a tensor or None, got {type(b).__name__}")
    if x.ndim == 0:
        raise ValueError("bias_act: x is a scalar (0-d), so it has no dim to add b along: pass b=None, "
                         "or give x a dimension")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"bias_act: dim={dim} is out of range for x of {x.ndim} dims "
                         f"(shape {list(x.shape)}): use a dim in [{-x.ndim}, {x.ndim - 1}]")
    dim = dim % x.ndim
    if b.dtype not in FLOATS:
        raise TypeError(f"bias_act: b must be a float tensor (any of float16, bfloat16, float32, float64), "
                        f"got {b.dtype}: convert it first, e.g. b.float()")
    if b.device != x.device:
        raise ValueError(f"bias_act: b is on {b.device} but x is on {x.device}: move b there, b.to(x.device)")
    if b.ndim != 1 or b.shape[0] != x.shape[dim]:
        raise ValueError(f"bias_act: b must be 1-D with x.shape[{dim}] = {x.shape[dim]} elements (x has shape "
                         f"{list(x.shape)}, dim={dim}), got shape {list(b.shape)}: pass the bias of dim {dim}, "
                         f"or the dim that b belongs to")
    return dim


def _resolve(act: str, alpha: float | None, gain: float | None) -> tuple[Activation, float, float]:
    spec = lookup(act)
    if alpha is not None and not spec.uses_alpha:
        raise ValueError(f"bias_act: act={spec.name!r} takes no alpha (got alpha={alpha}); only lrelu (negative "
                         f"slope) and elu use it: drop alpha")
    alpha = spec.default_alpha if alpha is None else float(alpha)
    gain = spec.default_gain if gain is None else float(gain)
    return spec, alpha, gain


def bias_act(x: torch.Tensor, b: torch.Tensor | None = None, dim: int = 1, act: str = "linear",
             alpha: float | None = None, gain: float | None = None,
             clamp: float | None = None) -> torch.Tensor:
    """``clamp(act(x + b) * gain, -clamp, clamp)``, ``b`` (1-D, ``x.shape[dim]`` elements)
    broadcast along ``dim``.

    ``act``: one of ``linear``, ``relu``, ``lrelu``, ``tanh``, ``sigmoid``, ``elu``, ``selu``,
    ``softplus``, ``swish`` (SiLU), ``gelu`` (erf) and ``gelu_tanh`` (tanh approximation).
    ``alpha``: the slope of ``lrelu`` (default 0.2) or the alpha of ``elu`` (default 1.0).
    ``gain``: default sqrt(2) for relu, lrelu and swish, else 1. ``clamp``: None or >= 0.

    >>> import torch
    >>> bias_act(torch.tensor([[-1.0, 2.0]]), torch.tensor([0.5]), dim=0, act="relu", gain=1.0)
    tensor([[0.0000, 2.5000]])
    """
    if torch.compiler.is_compiling():  # traced: the custom op, no process-wide state
        spec, alpha, gain = _resolve(act, alpha, gain)
        clamp = None if clamp is None else float(clamp)
        dim = check(x, b, dim, spec, alpha, gain, clamp)
        return torch.ops.opforge.bias_act(x, b, dim, spec.name, alpha, gain, clamp)
    key = (act, alpha, gain, clamp)
    try:
        spec, alpha, gain, clamp = _RESOLVED[key]
    except (KeyError, TypeError):  # TypeError: an unhashable argument; _resolve says what is wrong
        spec, alpha, gain = _resolve(act, alpha, gain)
        clamp = None if clamp is None else float(clamp)
        check_scalars(alpha, gain, clamp)
        if len(_RESOLVED) < 1024 and type(act) is str and all(type(v) in _SCALARS for v in key[1:]):
            _RESOLVED[key] = spec, alpha, gain, clamp
    if type(x) in _PLAIN and (b is None or type(b) in _PLAIN):
        impl = _kernel(x)
        if torch.is_grad_enabled() and (x.requires_grad or (b is not None and b.requires_grad)):
            dim = check_tensors(x, b, dim)
            if native_autograd.covers(impl, x, b, gain):
                node = native_autograd.op()
                if node is not None:
                    return native_autograd.call(node, impl, x, b, dim, spec, alpha, gain, clamp)
            return _Forward.apply(x, b, ((dim, spec.name, alpha, gain, clamp), impl))
        fresh = getattr(impl, "fresh", None)
        if fresh is not None and type(dim) is int:
            # One op call for the whole forward; it takes only calls whose tensors pass every
            # check below (else [] and the checks run, raising as before)
            got = fresh(x, b, dim, spec.index, alpha, gain, -1.0 if clamp is None else clamp)
            if got:
                return got[0]
        dim = check_tensors(x, b, dim)
        return impl.forward(x, b, dim, spec.name, alpha, gain, clamp)
    dim = check_tensors(x, b, dim)
    return torch.ops.opforge.bias_act(x, b, dim, spec.name, alpha, gain, clamp)


_RESOLVED: dict[tuple, tuple] = {}
"""(act, alpha, gain, clamp) as given -> (Activation, alpha, gain, clamp) resolved and checked:
a call's defaults, lookups and scalar checks are worked out once (the tensors' every call).
Only plain Python scalars are kept: a 0-d tensor (hashed by identity) could change in place,
and the cache would keep it alive."""
_SCALARS = (type(None), int, float)

_PLAIN = (torch.Tensor, torch.nn.Parameter)
"""Plain tensors outside torch.compile take the fast path (the kernel's own functions; for
autograd, the C++ node of ``native_autograd.py`` where it covers the call, else ``_Forward``),
which skips the custom op's Python dispatch (tens of microseconds a call: the whole time of a
small tensor). Under torch.compile, and for fake or subclassed tensors, the custom op."""


# -- the custom ops --

def _checked(x, b, dim, act, alpha, gain, clamp) -> int:
    return check(x, b, dim, lookup(act), alpha, gain, clamp)


def _db_meta(b: torch.Tensor | None, need: bool, src: torch.Tensor) -> torch.Tensor:
    if b is None or not need:
        return src.new_empty(0, dtype=b.dtype if b is not None else src.dtype)
    return b.new_empty(b.shape)


@torch.library.custom_op("opforge::bias_act", mutates_args=())
def _bias_act(x: torch.Tensor, b: torch.Tensor | None, dim: int, act: str, alpha: float, gain: float,
              clamp: float | None) -> torch.Tensor:
    dim = _checked(x, b, dim, act, alpha, gain, clamp)
    return _kernel(x).forward(x, b, dim, act, alpha, gain, clamp)


@_bias_act.register_fake
def _(x, b, dim, act, alpha, gain, clamp):
    _checked(x, b, dim, act, alpha, gain, clamp)
    return torch.empty_like(x)


@torch.library.custom_op("opforge::bias_act_backward", mutates_args=())
def _bias_act_backward(dy: torch.Tensor, x: torch.Tensor | None, b: torch.Tensor | None,
                       y: torch.Tensor | None, dim: int, act: str, alpha: float, gain: float,
                       clamp: float | None, need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx = dy * dy/d(x + b)`` and, with ``need_db``, ``db`` (``dx`` summed in fp32 over every
    dim but ``dim``). Give the tensors ``ref_for`` names: ``y``, or ``x`` and ``b``."""
    _check_saved(dy, x, b, y, dim, act, alpha, clamp)
    return _kernel(dy).backward(dy, x, b, y, dim % dy.ndim if dy.ndim else dim, act, alpha, gain, clamp, need_db)


@_bias_act_backward.register_fake
def _(dy, x, b, y, dim, act, alpha, gain, clamp, need_db):
    _check_saved(dy, x, b, y, dim, act, alpha, clamp)
    return torch.empty_like(dy), _db_meta(b, need_db, dy)


@torch.library.custom_op("opforge::bias_act_backward2", mutates_args=())
def _bias_act_backward2(s: torch.Tensor, dy: torch.Tensor, x: torch.Tensor | None, b: torch.Tensor | None,
                        y: torch.Tensor | None, dim: int, act: str, alpha: float, gain: float,
                        clamp: float | None, need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of ``bias_act_backward``'s ``dx`` with respect to its ``y`` (or ``x``, and
    ``b`` with ``need_db``), given ``s``, the gradient flowing into ``dx``."""
    _check_saved(dy, x, b, y, dim, act, alpha, clamp)
    return _kernel(dy).backward2(s, dy, x, b, y, dim % dy.ndim if dy.ndim else dim, act, alpha, gain, clamp, need_db)


@_bias_act_backward2.register_fake
def _(s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db):
    _check_saved(dy, x, b, y, dim, act, alpha, clamp)
    ref = lookup(act).ref_for(alpha, clamp)
    src = y if ref == "y" else x if ref == "x" else dy
    return torch.empty_like(src), _db_meta(b, need_db and ref == "x", dy)


def _check_saved(dy, x, b, y, dim, act, alpha, clamp) -> None:
    ref = lookup(act).ref_for(alpha, clamp)
    needed = {"x": ("x", x), "y": ("y", y)}.get(ref)
    if needed is not None and needed[1] is None:
        raise ValueError(f"bias_act backward: act={act!r} (alpha={alpha}, clamp={clamp}) needs {needed[0]}; "
                         f"it was not given")
    for name, t in (("x", x), ("y", y)):
        if t is not None and t.shape != dy.shape:
            raise ValueError(f"bias_act backward: {name} has shape {list(t.shape)}, dy {list(dy.shape)}")
    if ref == "x" and b is not None:
        check(x, b, dim, lookup(act), alpha, 1.0, clamp)


# -- autograd --

def _setup(ctx, inputs, output):
    x, b, dim, act, alpha, gain, clamp = inputs
    ref = lookup(act).ref_for(alpha, clamp)
    ctx.args = (dim, act, alpha, gain, clamp)
    ctx.save_for_backward(x if ref == "x" else None, b, output if ref == "y" else None)


def _backward(ctx, dy):
    x, b, y = ctx.saved_tensors
    need_dx, need_db = ctx.needs_input_grad[0], b is not None and ctx.needs_input_grad[1]
    if not (need_dx or need_db):
        return (None,) * 7
    dx, db = torch.ops.opforge.bias_act_backward(dy, x, b, y, *ctx.args, need_db)
    return dx if need_dx else None, db if need_db else None, None, None, None, None, None


_bias_act.register_autograd(_backward, setup_context=_setup)


def _setup_backward(ctx, inputs, output):
    dy, x, b, y, dim, act, alpha, gain, clamp, need_db = inputs
    ctx.args = (dim, act, alpha, gain, clamp)
    ctx.need_db = need_db
    ctx.save_for_backward(dy, x, b, y)


def _backward_backward(ctx, gdx, gdb):
    return _double(ctx, gdx, gdb, torch.ops.opforge.bias_act_backward, torch.ops.opforge.bias_act_backward2)


def _double(ctx, gdx, gdb, backward, backward2):
    """``dx = dy * h(ref)`` and ``db = sum(dx)``: the gradient into ``dy`` is ``s * h`` (``s`` =
    ``gdx`` plus ``gdb`` broadcast along ``dim``), a first backward of ``s``; into ``ref``, it is
    ``s * dy * h'(ref)``, ``backward2``. ``backward``/``backward2``: the ops (custom op or
    ``_Backward``/``_Backward2``), with the custom ops' arguments."""
    dy, x, b, y = ctx.saved_tensors
    dim, act, alpha, gain, clamp = ctx.args
    s = gdx
    if ctx.need_db and b is not None and gdb is not None and gdb.numel():
        s = s + gdb.to(s.dtype).reshape([-1 if i == dim else 1 for i in range(s.ndim)])
    d_dy = None
    if ctx.needs_input_grad[0]:
        d_dy = backward(s, x, b, y, dim, act, alpha, gain, clamp, False)[0]
    spec = lookup(act)
    ref = spec.ref_for(alpha, clamp)
    d_x = d_b = d_y = None
    wants = {"x": ctx.needs_input_grad[1] or ctx.needs_input_grad[2], "y": ctx.needs_input_grad[3]}.get(ref, False)
    if spec.has_2nd_grad and wants:
        need_db = ref == "x" and b is not None and ctx.needs_input_grad[2]
        dref, db = backward2(s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
        if ref == "x":
            d_x, d_b = dref, (db if need_db else None)
        else:
            d_y = dref
    return d_dy, d_x, d_b, d_y, None, None, None, None, None, None


_bias_act_backward.register_autograd(_backward_backward, setup_context=_setup_backward)


def _no_third(ctx, *grads):
    raise RuntimeError("bias_act: third-order gradients are not implemented (first and second order are)")


_bias_act_backward2.register_autograd(_no_third, setup_context=lambda ctx, inputs, output: None)


# -- the eager fast path: the same autograd as the custom ops, through autograd.Function --
# Each Function takes its scalars packed in one tuple (``cfg``): autograd.Function.apply
# inspects every argument, and a call is short enough for that to show.

class _Forward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b, cfg):
        call, impl = cfg  # call: (dim, act, alpha, gain, clamp)
        y = impl.forward(x, b, *call)
        ctx.impl = impl
        _setup(ctx, (x, b, *call), y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, b, y = ctx.saved_tensors
        need_dx, need_db = ctx.needs_input_grad[0], b is not None and ctx.needs_input_grad[1]
        if not (need_dx or need_db):
            return None, None, None
        if torch.is_grad_enabled():  # create_graph: differentiable, through _Backward
            dx, db = _Backward.apply(dy, x, b, y, (ctx.args, need_db, ctx.impl))
        else:
            dx, db = ctx.impl.backward(dy, x, b, y, *ctx.args, need_db)
        return dx if need_dx else None, db if need_db else None, None


def _backward_fn(impl):
    """``bias_act_backward``'s signature over ``_Backward``, for ``_double``."""
    return lambda dy, x, b, y, *rest: _Backward.apply(dy, x, b, y, (rest[:5], rest[5], impl))


def _backward2_fn(impl):
    return lambda s, dy, x, b, y, *rest: _Backward2.apply(s, dy, x, b, y, (rest[:5], rest[5], impl))


class _Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dy, x, b, y, cfg):
        call, need_db, impl = cfg
        ctx.impl = impl
        _setup_backward(ctx, (dy, x, b, y, *call, need_db), None)
        return impl.backward(dy, x, b, y, *call, need_db)

    @staticmethod
    def backward(ctx, gdx, gdb):
        grads = _double(ctx, gdx, gdb, _backward_fn(ctx.impl), _backward2_fn(ctx.impl))
        return (*grads[:4], None)


class _Backward2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, dy, x, b, y, cfg):
        call, need_db, impl = cfg
        return impl.backward2(s, dy, x, b, y, *call, need_db)

    @staticmethod
    def backward(ctx, *grads):
        _no_third(ctx)


__all__ = ["NAMES", "bias_act", "check"]
