"""The torch implementation of block-sparse matmul: the reference, and the path that always works.

Gather + batched matmul: each kept block's slice of the input is gathered, all blocks are
multiplied in one ``bmm``, and the products are summed into place with ``index_add_``. The
work is cut into chunks of tokens so the gathered copies stay under ``CHUNK_ELEMENTS``.

Every variant (Triton, CUDA) implements these three functions with the same arguments and
results. ``x`` is ``(T, in_features)``, ``dy`` ``(T, out_features)``, ``w`` the kept blocks
``(nnz, bh, bw)`` in the layout's order, the index tensors those of ``layout.Indices`` on the
tensors' device; all tensors contiguous, one dtype (``bias`` too):

* ``forward(x, w, bias, rows, cols, row_ptr, out_features) -> y``: ``y = x Wᵀ (+ bias)``;
* ``grad_input(dy, w, rows, cols, col_ptr, col_order, in_features) -> dx``: ``dx = dy W``;
* ``grad_weight(dy, x, rows, cols, row_ptr, bh, bw) -> dw``: ``dw[k] = dy[:, rows[k]]ᵀ x[:, cols[k]]``
  (block slices), the gradient of ``W`` on the kept blocks only (an SDDMM);
* optionally ``grad_weight_bias(dy, x, rows, cols, row_ptr, bh, bw) -> (dw, db)``: ``grad_weight``'s
  ``dw`` and the bias gradient ``db = dy.sum(0)`` (in ``dy``'s dtype), which a variant may sum as
  it reads ``dy`` for ``dw`` (the Triton one does); callers fall back to the two apart.

Compute: fp32 for fp16/bf16 (upcast, on the CPU and on a GPU), fp64 for fp64; outputs in the
inputs' dtype, rounded once. (A GPU ``bmm`` in bf16 accumulates a block's product in fp32 but
rounds it to bf16, and ``index_add_`` then sums the blocks in bf16: where they cancel, that was
off by an ulp of the addends, not of the result, which the GPU fuzz caught with 1x3 blocks.)
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 24
"""Gathered elements per chunk (64 MB in fp32)."""


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _chunks(tokens: int, per_token: int):
    step = max(1, CHUNK_ELEMENTS // max(1, per_token))
    for t0 in range(0, tokens, step):
        yield t0, min(tokens, t0 + step)


def _gather_mm_scatter(src, gather, scatter, mats, lines: int):
    """``out[:, scatter[k]] += src[:, gather[k]] @ mats[k]`` for every block ``k``, with ``src``
    ``(T, n * ks)`` seen as n slices of ``ks`` columns, ``mats`` ``(nnz, ks, ko)`` and ``out``
    ``(T, lines * ko)``, in the compute dtype; tokens in chunks."""
    nnz, ks, ko = mats.shape
    tokens = src.shape[0]
    out = torch.zeros(lines, tokens, ko, dtype=mats.dtype, device=src.device)
    sb = src.to(mats.dtype).view(tokens, src.shape[1] // ks, ks).transpose(0, 1)  # (n, T, ks)
    if nnz:
        for t0, t1 in _chunks(tokens, nnz * max(ks, ko)):
            out[:, t0:t1].index_add_(0, scatter, torch.bmm(sb[gather, t0:t1], mats))
    return out.transpose(0, 1).reshape(tokens, lines * ko)


def forward(x, w, bias, rows, cols, row_ptr, out_features: int):
    bh = w.shape[1]
    cd = _compute_dtype(x)
    y = _gather_mm_scatter(x, cols, rows, w.to(cd).transpose(1, 2), out_features // bh)
    if bias is not None:
        y += bias.to(cd)
    return y.to(x.dtype)


def grad_input(dy, w, rows, cols, col_ptr, col_order, in_features: int):
    bw = w.shape[2]
    return _gather_mm_scatter(dy, rows, cols, w.to(_compute_dtype(dy)), in_features // bw).to(dy.dtype)


def grad_weight(dy, x, rows, cols, row_ptr, bh: int, bw: int):
    tokens = x.shape[0]
    nnz = rows.numel()
    cd = _compute_dtype(x)
    dw = torch.empty(nnz, bh, bw, dtype=cd, device=x.device)
    gb = dy.to(cd).view(tokens, dy.shape[1] // bh, bh).transpose(0, 1)  # (R, T, bh)
    xb = x.to(cd).view(tokens, x.shape[1] // bw, bw).transpose(0, 1)  # (C, T, bw)
    step = max(1, CHUNK_ELEMENTS // max(1, tokens * max(bh, bw)))
    for k0 in range(0, nnz, step):
        k1 = min(nnz, k0 + step)
        dw[k0:k1] = torch.bmm(gb[rows[k0:k1]].transpose(1, 2), xb[cols[k0:k1]])
    return dw.to(x.dtype)


def grad_weight_bias(dy, x, rows, cols, row_ptr, bh: int, bw: int):
    return grad_weight(dy, x, rows, cols, row_ptr, bh, bw), dy.sum(0)


__all__ = ["forward", "grad_input", "grad_weight", "grad_weight_bias"]
