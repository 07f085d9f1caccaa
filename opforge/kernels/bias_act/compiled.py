"""The ``bias_act`` contract (``reference.py``) over a compiled variant's ops (C++ or CUDA).

The compiled ops take tensors that share one dense layout and walk them as flat arrays
(``layout.py``); this adapter makes the outputs (``torch.empty_like`` of their source, as the
fake implementations promise), brings the inputs to that layout, and gives ``db`` ``b``'s dtype.
fp64, a zero gain and the second derivative of an activation that has none go to the torch
reference: they are for checking, or all zeros.

The ops, registered by ``csrc/bias_act.cpp`` and ``csrc/bias_act_cuda.cpp`` under the
extension's namespace (``clamp < 0``: no clamp; ``act`` is ``Activation.index``; ``ref``
0 none, 1 ``y``, 2 ``x``; ``clamp_ref`` the clamp as ``y``'s dtype holds it):

* ``forward(Tensor x, Tensor? b, Tensor(a!) y, int channels, int inner, int act, float alpha,
  float gain, float clamp) -> ()``
* ``backward(Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) dx, Tensor(b!)? db, int channels,
  int inner, int act, int ref, float alpha, float gain, float clamp, float clamp_ref) -> ()``
* ``backward2(Tensor s, Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) out, Tensor(b!)? db, ...)``,
  the same scalars.

``b`` is fp32 for the C++ ops, and float32, float16 or bfloat16 as given for the CUDA ops
(``Compiled.any_bias_dtype``: no conversion kernel per call); ``db`` (``channels`` elements)
gets the finished per-channel sums of the unrounded values, summed in fp32 (fp64 on the CPU)
in a fixed order, in fp32 for the C++ ops and in ``b``'s dtype for the CUDA ops.
"""

from __future__ import annotations

import torch

from . import reference
from .activations import ACTIVATIONS, lookup
from .layout import bias32, clamp_as_stored, conform, geometry

REF_CODE = {"": 0, "y": 1, "x": 2}
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX = {name: a.index for name, a in ACTIVATIONS.items()}


class Compiled:
    """``forward``, ``backward`` and ``backward2`` of the contract, on ``kernel``'s ops."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.ops = kernel.ops
        self.name = kernel.name
        self.any_bias_dtype = kernel.backend == "cuda"
        self._forward = kernel.ops.forward
        fresh = getattr(kernel.ops, "forward_fresh", None)
        self.fresh = None if fresh is None else fresh.default
        """The CUDA variant's ``forward_fresh(x, b, dim, act index, alpha, gain, clamp or -1)``:
        the whole no-grad forward in one op call (the output allocated and the geometry worked
        out in C++), ``[y]``, or ``[]`` for a call it does not take (``csrc/bias_act_cuda.cpp``);
        None for the C++ variants."""

    def __repr__(self) -> str:
        return f"<bias_act on {self.name}>"

    def forward(self, x, b, dim, act, alpha, gain, clamp):
        if x.dtype == torch.float64:
            return reference.forward(x, b, dim, act, alpha, gain, clamp)
        y = torch.empty_like(x)
        if y.numel() == 0:
            return y
        g = geometry(y, dim, b is not None)
        self._forward(x if x.stride() == y.stride() else conform(x, y), self._bias(b), y, g.channels, g.inner,
                      INDEX[act], alpha, gain, -1.0 if clamp is None else clamp)
        return y

    def backward(self, dy, x, b, y, dim, act, alpha, gain, clamp, need_db):
        if reference.left_to_reference(dy, gain):
            return reference.backward(dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
        ref = lookup(act).ref_for(alpha, clamp)
        dx = torch.empty_like(dy)
        src = {"y": y, "x": x}.get(ref)
        db = self._run(self.ops.backward, (conform(dy, dx),), src, b, dx, dim, act, ref, alpha, gain, clamp,
                       need_db, y)
        return dx, db

    def backward2(self, s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db):
        if reference.left_to_reference(dy, gain, act, alpha, clamp, order=2):
            return reference.backward2(s, dy, x, b, y, dim, act, alpha, gain, clamp, need_db)
        ref = lookup(act).ref_for(alpha, clamp)
        src = y if ref == "y" else x
        out = torch.empty_like(src)
        db = self._run(self.ops.backward2, (conform(s, out), conform(dy, out)), src, b, out, dim, act, ref, alpha,
                       gain, clamp, need_db and ref == "x", y)
        return out, db

    def _bias(self, b):
        if self.any_bias_dtype and b is not None and b.dtype in KERNEL_DTYPES and b.is_contiguous():
            return b
        return bias32(b)

    def _run(self, op, grads, src, b, out, dim, act, ref, alpha, gain, clamp, need_db, y):
        g = geometry(out, dim, b is not None)
        db = None
        if need_db and b is not None:
            db_dtype = b.dtype if self.any_bias_dtype and b.dtype in KERNEL_DTYPES else torch.float32
            db = torch.empty(g.channels, dtype=db_dtype, device=out.device)
        clamp_ref = clamp_as_stored(clamp, y.dtype) if ref == "y" else -1.0
        op(*grads, None if src is None else conform(src, out), self._bias(b) if ref == "x" else None, out, db,
           g.channels, g.inner, INDEX[act], REF_CODE[ref], alpha, gain, -1.0 if clamp is None else clamp,
           clamp_ref)
        if db is None:
            return out.new_empty(0, dtype=b.dtype if b is not None else out.dtype)
        return db if db.dtype == b.dtype else db.to(b.dtype)
