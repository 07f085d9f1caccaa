"""``opforge.ops.block_sparse_linear``: ``y = x Wᵀ + bias`` with ``W`` block-sparse, on the best
``block_sparse`` kernel for the tensors' device (``BlockSparseLoader``).

Three ``torch.library`` custom ops, each with a fake implementation and registered autograd:

* ``opforge::block_sparse_mm(x, w, bias, *indices, out_features) -> y``: ``y = x Wᵀ (+ bias)``;
* ``opforge::block_sparse_mm_t(dy, w, *indices, in_features) -> dx``: ``dx = dy W``;
* ``opforge::block_sparse_sddmm(dy, x, *indices, bh, bw) -> dw``: ``dyᵀ x`` on the kept blocks.

Each is linear in each argument, and their derivatives are each other, so gradients of any
order work: the backward of ``mm`` is ``mm_t`` (for ``x``) and ``sddmm`` (for ``w``); of
``mm_t``, ``mm`` and ``sddmm``; of ``sddmm``, ``mm`` and ``mm_t``.

``x`` is ``(T, in_features)`` inside the ops (``block_sparse_linear`` flattens any leading
dims), ``w`` the kept blocks ``(nnz, bh, bw)``; ``*indices`` are the layout's ``rows, cols,
row_ptr, col_ptr, col_order`` on the tensors' device (``layout.Indices``).
"""

from __future__ import annotations

import torch

from ..compat import tf32_reader
from ..kernels import triton_launch
from ..kernels.block_sparse import native_autograd
from ..kernels.block_sparse.layout import BlockSparseLayout
from ..kernels.block_sparse.loader import BlockSparseLoader
from ..process import forgets

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

def _kernel(t: torch.Tensor):
    """The loader's best implementation for tensors on ``t``'s device (the loader keeps its
    choice for the process)."""
    return BlockSparseLoader().load(device=t.device.type).ops


# -- the custom ops --

@torch.library.custom_op("opforge::block_sparse_mm", mutates_args=())
def _mm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor, cols: torch.Tensor,
        row_ptr: torch.Tensor, col_ptr: torch.Tensor, col_order: torch.Tensor, out_features: int) -> torch.Tensor:
    return _kernel(x).forward(x.contiguous(), w.contiguous(), None if bias is None else bias.contiguous(), rows,
                              cols, row_ptr, out_features)


@_mm.register_fake
def _(x, w, bias, rows, cols, row_ptr, col_ptr, col_order, out_features):
    return x.new_empty(x.shape[0], out_features)


@torch.library.custom_op("opforge::block_sparse_mm_t", mutates_args=())
def _mm_t(dy: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, row_ptr: torch.Tensor,
          col_ptr: torch.Tensor, col_order: torch.Tensor, in_features: int) -> torch.Tensor:
    return _kernel(dy).grad_input(dy.contiguous(), w.contiguous(), rows, cols, col_ptr, col_order, in_features)


@_mm_t.register_fake
def _(dy, w, rows, cols, row_ptr, col_ptr, col_order, in_features):
    return dy.new_empty(dy.shape[0], in_features)


@torch.library.custom_op("opforge::block_sparse_sddmm", mutates_args=())
def _sddmm(dy: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, row_ptr: torch.Tensor,
           col_ptr: torch.Tensor, col_order: torch.Tensor, bh: int, bw: int) -> torch.Tensor:
    return _kernel(x).grad_weight(dy.contiguous(), x.contiguous(), rows, cols, row_ptr, bh, bw)


@_sddmm.register_fake
def _(dy, x, rows, cols, row_ptr, col_ptr, col_order, bh, bw):
    return x.new_empty(rows.shape[0], bh, bw)


@torch.library.custom_op("opforge::block_sparse_sddmm_bias", mutates_args=())
def _sddmm_bias(dy: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, row_ptr: torch.Tensor,
                col_ptr: torch.Tensor, col_order: torch.Tensor, bh: int, bw: int,
                with_bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sddmm, dy.sum(0))`` in one launch where the kernel has ``grad_weight_bias`` (the bias
    gradient empty without ``with_bias``). A first-order backward's helper (the C++ autograd node
    calls it for a launch not planned yet): it has no derivative of its own."""
    impl = _kernel(x)
    dy, x = dy.contiguous(), x.contiguous()
    if not with_bias:
        return impl.grad_weight(dy, x, rows, cols, row_ptr, bh, bw), dy.new_empty(0)
    if hasattr(impl, "grad_weight_bias"):
        return impl.grad_weight_bias(dy, x, rows, cols, row_ptr, bh, bw)
    return impl.grad_weight(dy, x, rows, cols, row_ptr, bh, bw), dy.sum(0)


@_sddmm_bias.register_fake
def _(dy, x, rows, cols, row_ptr, col_ptr, col_order, bh, bw, with_bias):
    return x.new_empty(rows.shape[0], bh, bw), dy.new_empty(dy.shape[1] if with_bias else 0)


# -- autograd: each op's derivatives are the other two --

def _setup_mm(ctx, inputs, output):
    x, w, bias, *idx, out_features = inputs
    ctx.save_for_backward(x, w, *idx)
    ctx.has_bias = bias is not None


def _backward_mm(ctx, dy):
    x, w, *idx = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = torch.ops.opforge.block_sparse_mm_t(dy, w, *idx, x.shape[1]) if need_x else None
    dw = torch.ops.opforge.block_sparse_sddmm(dy, x, *idx, w.shape[1], w.shape[2]) if need_w else None
    db = dy.sum(0) if need_b and ctx.has_bias else None
    return dx, dw, db, None, None, None, None, None, None


_mm.register_autograd(_backward_mm, setup_context=_setup_mm)


def _setup_mm_t(ctx, inputs, output):
    dy, w, *idx, in_features = inputs
    ctx.save_for_backward(dy, w, *idx)


def _backward_mm_t(ctx, g):
    dy, w, *idx = ctx.saved_tensors
    d_dy = torch.ops.opforge.block_sparse_mm(g, w, None, *idx, dy.shape[1]) if ctx.needs_input_grad[0] else None
    d_w = torch.ops.opforge.block_sparse_sddmm(dy, g, *idx, w.shape[1], w.shape[2]) if ctx.needs_input_grad[1] \
        else None
    return d_dy, d_w, None, None, None, None, None, None


_mm_t.register_autograd(_backward_mm_t, setup_context=_setup_mm_t)


def _setup_sddmm(ctx, inputs, output):
    dy, x, *idx, bh, bw = inputs
    ctx.save_for_backward(dy, x, *idx)


def _backward_sddmm(ctx, g):
    dy, x, *idx = ctx.saved_tensors
    d_dy = torch.ops.opforge.block_sparse_mm(x, g, None, *idx, dy.shape[1]) if ctx.needs_input_grad[0] else None
    d_x = torch.ops.opforge.block_sparse_mm_t(dy, g, *idx, x.shape[1]) if ctx.needs_input_grad[1] else None
    return d_dy, d_x, None, None, None, None, None, None, None


_sddmm.register_autograd(_backward_sddmm, setup_context=_setup_sddmm)


# -- the public function --

def check(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, layout: BlockSparseLayout) -> None:
    """Raise on bad arguments, saying what to do."""
    if not isinstance(layout, BlockSparseLayout):
        raise TypeError(f"layout must be a BlockSparseLayout, got {type(layout).__name__}")
    out_features, in_features = layout.shape
    bh, bw = layout.block_shape
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"block_sparse_linear: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype not in FLOATS:
            raise TypeError(f"block_sparse_linear: {name} must be float16, bfloat16, float32 or float64, got "
                            f"{t.dtype}: convert it first, e.g. {name}.float()")
    if x.ndim < 1 or x.shape[-1] != in_features:
        raise ValueError(f"block_sparse_linear: x must end in in_features = {in_features}, got shape "
                         f"{list(x.shape)}")
    if tuple(w.shape) != (layout.nnz, bh, bw):
        raise ValueError(f"block_sparse_linear: w must hold the layout's {layout.nnz} blocks of {(bh, bw)}, shape "
                         f"{[layout.nnz, bh, bw]}, got {list(w.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (out_features,):
            got = list(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"block_sparse_linear: bias must be None or of shape [{out_features}], got {got}")
    for name, t in (("w", w), ("bias", bias)):
        if t is None:
            continue
        if t.device != x.device:
            raise ValueError(f"block_sparse_linear: {name} is on {t.device} but x is on {x.device}: move them to "
                             f"one device (e.g. module.to(x.device))")
        if t.dtype != x.dtype:
            raise TypeError(f"block_sparse_linear: {name} is {t.dtype} but x is {x.dtype}: use one dtype (e.g. "
                            f"module.to(x.dtype), or x.to({t.dtype}))")


def block_sparse_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                        layout: BlockSparseLayout) -> torch.Tensor:
    """``x Wᵀ + bias`` for the block-sparse ``W`` whose kept blocks are ``w`` (``(nnz, bh, bw)``, in
    ``layout``'s order); ``x`` of any leading dims, ending in ``in_features``.

    >>> import torch
    >>> lay = BlockSparseLayout(torch.tensor([[True, False], [False, True]]), (1, 2))
    >>> block_sparse_linear(torch.ones(1, 4), torch.ones(2, 1, 2), None, lay)
    tensor([[2., 2.]])
    """
    if torch.compiler.is_compiling():
        # Traced: checked every time, and the op, with no process-wide state read. Dynamo guards on what a trace
        # reads, and a guard on _CHECKED, which this call fills, fails on the frame that made it (two layers alike,
        # first called inside torch.compile).
        check(x, w, bias, layout)
    else:
        table = _NATIVE[0]
        if table is not None and table.call is not None and type(x) is torch.Tensor and x.is_cuda:
            y = _replayed(table.call, x, w, bias, layout)
            if y is not None:
                return y
        try:
            seen = (type(x), x.dtype, x.device, x.shape[-1] if x.ndim else None, type(w), w.dtype, w.device, w.shape,
                    None if bias is None else (type(bias), bias.dtype, bias.device, bias.shape), layout.signature)
        except AttributeError:  # not a tensor, or not a layout: check says which
            seen = None
        if seen is None or seen not in _CHECKED:
            check(x, w, bias, layout)
            if seen is not None:
                if len(_CHECKED) > 4096:
                    _CHECKED.clear()
                _CHECKED.add(seen)
    out_features, in_features = layout.signature[0]  # layout.shape, without its two properties
    idx = layout.indices(x.device)
    x2 = x if x.ndim == 2 else x.reshape(-1, in_features)
    route = _route(x, w, bias)
    if route == _KERNEL:
        kernel = _kernel(x)
        y = kernel.forward(x2.contiguous(), w.contiguous(), None if bias is None else bias.contiguous(),
                           idx.rows, idx.cols, idx.row_ptr, out_features)
        if _NATIVE[0] is None and x.is_cuda:
            _NATIVE[0] = getattr(kernel, "NATIVE_FORWARD", None)
    elif route == _FUNCTION:
        kernel = _kernel(x)
        node = native_autograd.op() if x.device.type in native_autograd.DEVICES else None
        if node is not None:
            tables, ns = native_autograd.tables(kernel)
            y = node(x2.contiguous(), w.contiguous(), None if bias is None else bias.contiguous(), *idx, out_features,
                     x.dtype is torch.float32 and _TF32(), tables, ns)
        else:
            y = _Linear.apply(x2.contiguous(), w.contiguous(), None if bias is None else bias.contiguous(), idx,
                              out_features, kernel)
    else:
        y = torch.ops.opforge.block_sparse_mm(x2, w, bias, *idx, out_features)
    return y if x.ndim == 2 else y.view(*x.shape[:-1], out_features)


_CHECKED: set = set()
"""What ``check`` passed: (types, dtypes, devices, in_features, w's and bias's shapes, the layout's
signature). A call like one already checked is not checked again; anything else is."""

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_KERNEL, _FUNCTION, _OP = 0, 1, 2
_NATIVE: list = [None]
"""The CUDA kernel's table of forward launches replayed from C++ (``NATIVE_FORWARD``, a
``kernels.native_launch.NativeTable``), once a call has gone to that kernel."""
_TF32 = tf32_reader()
"""Reads ``torch.backends.cuda.matmul.allow_tf32`` (``compat.tf32_reader``)."""


@forgets
def _forget() -> None:
    """``opforge.reset()``: check calls again, and look the replay table up again."""
    _CHECKED.clear()
    _NATIVE[0] = None


def _replayed(call, x, w, bias, layout):
    """A no-grad forward of plain CUDA tensors as one native op call, or None (then the full path
    runs). Skipping ``check``, the route and ``.contiguous()`` is sound on a hit: a recipe is
    defined only by a call that passed them all, under the key of its inputs (every dtype,
    device, size, stride and alignment of x, w, bias and the layout's cols and row_ptr, with
    out_features), so a call that hits has the same types, shapes and strides; and
    ``x.shape[-1] == in_features`` is checked here, the one fact of ``check`` not in the key,
    and w's shape against the layout's, since a recipe may also come from a direct call of the
    kernel contract, which checks nothing."""
    if type(w) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN) or type(layout) is not BlockSparseLayout:
        return None
    (out_features, in_features), (bh, bw), nnz = layout.signature
    if not x.ndim or x.shape[-1] != in_features or w.shape != (nnz, bh, bw):  # (never traced: its caller's branch)
        return None
    if w.dtype != x.dtype or (bias is not None and (bias.shape != (out_features,) or bias.dtype != x.dtype)):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)):
        return None
    if not triton_launch.direct():
        return None
    idx = layout.indices(x.device)
    x2 = x if x.ndim == 2 else x.reshape(-1, in_features)
    got = call(x2, w, bias, idx.cols, idx.row_ptr, idx.rows, out_features,
               x.dtype is torch.float32 and _TF32())
    if not got:
        return None
    return got[0] if x.ndim == 2 else got[0].view(*x.shape[:-1], out_features)


def _route(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> int:
    """How a call runs. The custom op's Python dispatch and its registered autograd cost tens of
    microseconds a call, as much as a small matmul's kernel, so with plain tensors outside
    torch.compile a call goes straight to the kernel (no gradient to record: inference,
    ``torch.no_grad``) or through ``_Linear``, a lean ``autograd.Function`` over the same kernels.
    The op stays for fake and subclassed tensors and for tracing, where the op is what they see."""
    if type(x) not in _PLAIN or type(w) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN):
        return _OP
    if torch.compiler.is_compiling():
        return _OP
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)):
        return _FUNCTION
    return _KERNEL


class _Linear(torch.autograd.Function):
    """``block_sparse_mm`` with its gradients, for eager autograd without the custom op's
    dispatch: the backward calls the kernels' ``grad_input`` and ``grad_weight`` directly. A
    backward that is itself recorded (``create_graph=True``) runs the custom ops instead, whose
    derivatives are registered, so gradients of any order still work. The old-style ``forward(ctx,
    ...)`` on purpose: with ``setup_context``, every ``apply`` binds its arguments through
    ``inspect.signature`` (tens of µs a call on the H100 host). (torch.func transforms run
    neither this nor the custom op, whose registered autograd is an old-style Function too.)"""

    @staticmethod
    def forward(ctx, x, w, bias, idx, out_features, impl):
        ctx.save_for_backward(x, w)
        ctx.idx, ctx.impl, ctx.has_bias = idx, impl, bias is not None
        return impl.forward(x, w, bias, idx.rows, idx.cols, idx.row_ptr, out_features)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        idx = ctx.idx
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dy = dy.contiguous()
        dx = dw = None
        if torch.is_grad_enabled():  # create_graph: differentiable ops
            if need_x:
                dx = torch.ops.opforge.block_sparse_mm_t(dy, w, *idx, x.shape[1])
            if need_w:
                dw = torch.ops.opforge.block_sparse_sddmm(dy, x, *idx, w.shape[1], w.shape[2])
        else:
            if need_x:
                dx = ctx.impl.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, x.shape[1])
            if need_w and need_b and ctx.has_bias and hasattr(ctx.impl, "grad_weight_bias"):  # one launch
                dw, db = ctx.impl.grad_weight_bias(dy, x, idx.rows, idx.cols, idx.row_ptr, w.shape[1], w.shape[2])
                return dx, dw, db, None, None, None
            if need_w:
                dw = ctx.impl.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr, w.shape[1], w.shape[2])
        db = dy.sum(0) if need_b and ctx.has_bias else None
        return dx, dw, db, None, None, None


__all__ = ["block_sparse_linear", "check"]
