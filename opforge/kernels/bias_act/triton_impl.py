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
* **Formulas** are ``triton_math.py``'s (``reference.py``'s, kept accurate in fp32 near zero
  and where tanh saturates). NaN propagates as in torch (the clamp too). ``y / gain`` is an
  IEEE division (``div_rn``), as torch's.
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
from dataclasses import dataclass

import torch

from . import reference
from .activations import lookup
from .layout import Geometry, bias32, clamp_as_stored, conform, flat, geometry
from .triton_math import act_value, d2_from_pre, d2_from_value, d_from_pre, d_from_value, jit, tl, triton

REF_CODE = {"": 0, "y": 1, "x": 2}
FLAT_BLOCK = 4096
ROW_BLOCKS = (4096, 2048, 1024, 512)
"""Block sizes for the rows walk, largest first: the first that divides ``inner``, or that
``inner`` holds at least 4 times (so the masked tail of a run wastes under a quarter)."""


# -- the kernels --

@jit
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


@jit
def _forward_kernel(x_ptr, b_ptr, y_ptr, n, inner, channels, per_row, alpha, gain, clamp,
                    ACT: tl.constexpr, HAS_B: tl.constexpr, HAS_CLAMP: tl.constexpr, BLOCK: tl.constexpr,
                    ROWS: tl.constexpr, ONE_CHANNEL: tl.constexpr, WIDE: tl.constexpr):
    offs, mask, channel = _block(n, inner, channels, per_row, BLOCK, ROWS, ONE_CHANNEL, WIDE)
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if HAS_B:
        v = v + tl.load(b_ptr + channel)
    u = act_value(v, alpha, ACT) * gain
    if HAS_CLAMP:  # torch's clamp: NaN stays NaN
        u = tl.where(u > clamp, clamp, tl.where(u < -clamp, -clamp, u))
    tl.store(y_ptr + offs, u.to(y_ptr.dtype.element_ty), mask=mask)


@jit
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
            d = g * (gain * d_from_value(a, alpha, ACT))
        else:  # gain cancels
            d = g * d2_from_value(a, ACT)
        if HAS_CLAMP:  # clamp_ref: the clamp as y's dtype stores it
            d = tl.where(tl.abs(y) < clamp_ref, d, 0.0)
    elif REF == 2:  # from x + b
        v = tl.load(ref_ptr + offs, mask=mask).to(tl.float32)
        if HAS_B:
            v = v + tl.load(b_ptr + channel)
        if ORDER == 1:
            d = g * (gain * d_from_pre(v, alpha, ACT))
        else:
            d = g * (gain * d2_from_pre(v, alpha, ACT))
        if HAS_CLAMP:
            d = tl.where(tl.abs(act_value(v, alpha, ACT) * gain) < clamp, d, 0.0)
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
    if reference.left_to_reference(dy, gain):
        return reference.backward(dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
    ref = lookup(act).ref_for(alpha, clamp)
    dx = torch.empty_like(dy)
    db = _grad(1, None, dy, {"y": y, "x": x}.get(ref), b, y, dx, dim, act, ref, alpha, gain, clamp, need_db)
    return dx, db


def backward2(s, dy, x, b, y, dim: int, act: str, alpha: float, gain: float, clamp: float | None,
              need_db: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if reference.left_to_reference(dy, gain, act, alpha, clamp, order=2):
        return reference.backward2(s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
    ref = lookup(act).ref_for(alpha, clamp)
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
            clamp_as_stored(clamp, y.dtype) if ref == "y" else -1.0,
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
