"""Block-sparse matmul in Triton: the three functions of the contract (``reference.py``).

* ``forward``: a program per (block-row ``r``, tile of ``BLOCK_M`` tokens) accumulates, over the
  block-row's kept blocks (CSR: ``row_ptr``, ``cols``), ``x[tile, cols[k]] @ w[k]ᵀ`` in fp32 on
  the tensor cores, adds the bias and stores its ``(BLOCK_M, bh)`` tile of ``y`` once.
* ``grad_input``: the same over block-columns (CSC: ``col_ptr``, ``col_order``),
  ``dy[tile, rows[k]] @ w[k]`` into a ``(BLOCK_M, bw)`` tile of ``dx``.
* ``grad_weight``: a program per (up to ``G = 128 / bw`` consecutive kept blocks of one
  block-row, slice of the tokens) computes ``dy[slice, r]ᵀ @ x[slice, cols of those blocks]``
  as one ``(bh, G bw)`` product, reading the row's ``dy`` slice once for all of them; with
  several slices (when there are too few blocks to fill the GPU) the fp32 partial sums are
  added in a fixed order, so the result is deterministic.

Programs are ordered in groups (``_tile``): 8 consecutive tiles of tokens walk every block-row
(column) together, so their tokens stay in L2 and each block of ``w`` is read once per group.
Empty block-rows (columns) store zeros (plus the bias). fp16 and bf16 take the tensor cores
with fp32 accumulation; fp32 follows ``torch.backends.cuda.matmul.allow_tf32`` as torch's
own matmul does (IEEE fp32 by default). Each kernel is autotuned per (block shape, dtype,
size class). Other dtypes, block sides and devices run the torch path (``supported``).

On Hopper and newer, the forward and the input gradient bring their operands in with the copy
engine (TMA, triton's host descriptors) when the operands are contiguous and start on 16 bytes
(``tma_ready``) and there are more than ``TMA_MIN_TOKENS`` tokens, else through pointer loads
(same results). The kernels live in
``triton_kernels.py``; this module holds the configs, the dispatch and the layout of the work.

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

import functools

import torch

from ..triton_compat import TensorDescriptor, triton
from . import reference
from .layout import BLOCK_SIZES
from .triton_kernels import _dw_kernel, _dx_kernel, _dx_tma_kernel, _fwd_kernel, _fwd_tma_kernel


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return "tf32"  # ignored for fp16/bf16


# (BLOCK_M, BLOCK_K, warps, stages), from sweeps on an H100 (docs/kernels.md). The index load in
# the loop takes a stage of its own, so `stages` s buffers max(2, (s + 1) // 2) tiles of each operand.
_M_TILES = ((256, 64, 8, 7), (128, 64, 4, 5), (128, 64, 4, 7), (128, 64, 4, 9), (128, 64, 8, 7), (256, 32, 8, 7),
            (128, 32, 4, 7), (128, 32, 4, 5), (64, 32, 4, 7), (128, 16, 4, 7), (64, 64, 4, 5), (32, 64, 4, 4),
            (16, 64, 4, 4), (16, 16, 4, 5))


def _buffers(stages: int) -> int:
    return max(2, (stages + 1) // 2)


def _m_configs(pre_hook=None):
    return [triton.Config({"BLOCK_M": m, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=st, pre_hook=pre_hook)
            for m, k, w, st in _M_TILES]


def _boxes(a: str, b: str, b_is_transposed: bool):
    """Config pre-hook: the TMA boxes of the two operands' descriptors for this config's tile."""
    def hook(nargs):
        m, k = nargs["BLOCK_M"], nargs["BLOCK_K"]
        nargs[a].block_shape = [m, k]
        nargs[b].block_shape = [nargs["BH"], k] if b_is_transposed else [k, nargs["BW"]]
    return hook


def _arg(name, named_args, kwargs):
    return named_args[name] if name in named_args else kwargs[name]


def _prune_for(k_side: str, n_side: str, out: str):
    def prune(configs, named_args, **kwargs):
        """Tiles no taller than the tokens (rounded up to 16), a K step that divides the block,
        buffers that fit in shared memory."""
        tokens = _arg("T", named_args, kwargs)
        kb, nb = _arg(k_side, named_args, kwargs), _arg(n_side, named_args, kwargs)
        size = _arg(out, named_args, kwargs).element_size()
        cap = max(16, triton.next_power_of_2(tokens))
        kept = [c for c in configs if c.kwargs["BLOCK_M"] <= cap and c.kwargs["BLOCK_K"] <= kb
                and (c.kwargs["BLOCK_M"] + nb) * c.kwargs["BLOCK_K"] * size * _buffers(c.num_stages) <= 200 * 1024]
        if not kept:  # no config fits: the smallest tile, its K step cut to the block
            small = min(configs, key=lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]))
            kept = [triton.Config({**small.kwargs, "BLOCK_K": min(kb, small.kwargs["BLOCK_K"])},
                                  num_warps=small.num_warps, num_stages=small.num_stages, pre_hook=small.pre_hook)]
        return kept
    return prune


def _bucket(t: int) -> int:
    return min(65536, triton.next_power_of_2(max(1, t)))


def _l2_bytes(device: torch.device) -> int:
    return _properties(device.index if device.index is not None else torch.cuda.current_device()).L2_cache_size


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    """The device's properties, read once (every call needs two of them; a lookup costs µs)."""
    return torch.cuda.get_device_properties(index)


def _l2_rows(device: torch.device, row_bytes: int) -> int:
    """Rows of the streamed operand (x in the forward, dy in grad_input) that fit in half of L2:
    a group of token tiles holds no more (``_tile``), so it stays in L2 while it walks every line."""
    return max(1, _l2_bytes(device) // 2 // max(1, row_bytes))


def _depth(nnz: int, lines: int) -> int:
    """Blocks per line, as a power of two: part of the autotuning key (short lines want other tiles)."""
    return triton.next_power_of_2(max(1, nnz // max(1, lines)))


def _dw_configs():
    return [triton.Config({"BLOCK_T": t}, num_warps=w, num_stages=s)
            for t, w, s in ((32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 8, 3), (64, 4, 4), (64, 8, 5), (128, 4, 3))]


def _dw_prune(configs, named_args, **kwargs):
    bh, bw, g = _arg("BH", named_args, kwargs), _arg("BW", named_args, kwargs), _arg("G", named_args, kwargs)
    size = _arg("x_ptr", named_args, kwargs).element_size()
    kept = [c for c in configs if c.kwargs["BLOCK_T"] * (bh + g * bw) * size * c.num_stages <= 200 * 1024]
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_T"])]


_TUNED = {} if triton is None else {
    "fwd": triton.autotune(configs=_m_configs(), key=["T_BUCKET", "BH", "BW", "N_OUT", "L2_ROWS", "DEPTH", "SPLIT",
                                                      "HAS_BIAS"],
                           prune_configs_by={"early_config_prune": _prune_for("BW", "BH", "y_ptr")})(_fwd_kernel),
    "dx": triton.autotune(configs=_m_configs(), key=["T_BUCKET", "BH", "BW", "N_IN", "L2_ROWS", "DEPTH"],
                          prune_configs_by={"early_config_prune": _prune_for("BH", "BW", "dx_ptr")})(_dx_kernel),
    "fwd_tma": triton.autotune(configs=_m_configs(_boxes("x_desc", "w_desc", True)),
                               key=["T_BUCKET", "BH", "BW", "N_OUT", "L2_ROWS", "DEPTH", "HAS_BIAS"],
                               prune_configs_by={"early_config_prune": _prune_for("BW", "BH", "y_ptr")})(_fwd_tma_kernel),
    "dx_tma": triton.autotune(configs=_m_configs(_boxes("dy_desc", "w_desc", False)),
                              key=["T_BUCKET", "BH", "BW", "N_IN", "L2_ROWS", "DEPTH"],
                              prune_configs_by={"early_config_prune": _prune_for("BH", "BW", "dx_ptr")})(_dx_tma_kernel),
    "dw": triton.autotune(configs=_dw_configs(), key=["T_BUCKET", "BH", "BW", "G", "SPLIT"],
                          prune_configs_by={"early_config_prune": _dw_prune})(_dw_kernel),
}


def _launch(which: str, grid, *args, **kw):
    return _TUNED[which][grid](*args, **kw)


KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supported(t: torch.Tensor, bh: int, bw: int) -> bool:
    """What the kernels take: CUDA tensors of a kernel dtype, block sides of 16, 32, 64 or 128
    (tl.dot needs 16 or more, tl.arange powers of two). Anything else runs ``reference.py``."""
    return t.is_cuda and t.dtype in KERNEL_DTYPES and bh in BLOCK_SIZES and bw in BLOCK_SIZES


def _sms(device: torch.device) -> int:
    return _properties(device.index if device.index is not None else torch.cuda.current_device()).multi_processor_count


@functools.lru_cache(maxsize=None)
def _has_tma(device_index: int) -> bool:
    return TensorDescriptor is not None and torch.cuda.get_device_capability(device_index)[0] >= 9


# Up to this many tokens the pointer kernels run as fast (measured on an H100, decode sizes) and
# skip the descriptors' host cost (~35 µs a call there). Only the pointer forward splits its
# block-rows (decode_split), which it does up to SPLIT_MAX_TOKENS.
TMA_MIN_TOKENS = 64
SPLIT_MAX_TOKENS = 32
assert TMA_MIN_TOKENS >= SPLIT_MAX_TOKENS


def tma_ready(tokens: int, *tensors: torch.Tensor) -> bool:
    """Whether the copy engine (TMA, Hopper and newer, through triton's host descriptors) should
    bring these 2-D operands in: more than TMA_MIN_TOKENS tokens, each operand contiguous,
    non-empty, starting on 16 bytes, with int32 coordinates. Otherwise the kernels load through
    pointers (the same results)."""
    if tokens <= TMA_MIN_TOKENS or not tensors[0].is_cuda or not _has_tma(tensors[0].device.index):
        return False
    return all(t.is_contiguous() and t.numel() > 0 and t.data_ptr() % 16 == 0 and max(t.shape) < 2**31
               for t in tensors)


def _descriptor(t: torch.Tensor):
    return TensorDescriptor.from_tensor(t, [16, 16])  # boxes: set per config (_boxes)


def _streamed(a: torch.Tensor, w: torch.Tensor, lines: int):
    """What fwd and grad_input share: the blocks as one (nnz * bh, bw) matrix (the TMA view), the
    autotuning key's size class of the streamed operand ``a`` (x or dy): its token bucket, the
    rows of it that fit in half of L2, the blocks per line; and whether TMA takes them."""
    w2 = w.reshape(-1, w.shape[2])
    key = (_bucket(a.shape[0]), _l2_rows(a.device, a.shape[1] * a.element_size()), _depth(w.shape[0], lines))
    return w2, key, tma_ready(a.shape[0], a, w2)


def decode_split(tokens: int, out_features: int, grid_r: int, nnz: int, sms: int, l2_bytes: int) -> int:
    """How many programs share a block-row's blocks in the forward. Few tokens (decode) leave
    one program per block-row, too few to stream the weight at HBM speed; splitting the blocks
    fills the GPU (4 programs per SM), at the cost of fp32 partial sums written and read back.
    Those stay in L2 while they take at most a quarter of it, so that is the bound. Past 32
    tokens one program per block-row streams as fast (measured on an H100: at 64 tokens a
    split of 3 ran at 52% of a copy's bandwidth, no split at 70%).

    >>> decode_split(1, 4096, 32, 512, 132, 50 * 2**20)       # 16 blocks a row: all split
    16
    >>> decode_split(32, 14336, 112, 1792, 132, 50 * 2**20)   # 5 programs a row fill the GPU
    5
    >>> decode_split(32, 57344, 448, 7168, 132, 50 * 2**20)   # partials over a quarter of L2
    1
    >>> decode_split(64, 14336, 112, 1792, 132, 50 * 2**20)
    1
    """
    if tokens > SPLIT_MAX_TOKENS:
        return 1
    want = -(-4 * sms // grid_r)
    affordable = (l2_bytes // 4) // max(1, 4 * tokens * out_features)
    return max(1, min(want, -(-nnz // grid_r), affordable))


def forward(x, w, bias, rows, cols, row_ptr, out_features: int):
    nnz, bh, bw = w.shape
    if not supported(x, bh, bw):
        return reference.forward(x, w, bias, rows, cols, row_ptr, out_features)
    tokens, in_features = x.shape
    y = torch.empty(tokens, out_features, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return y
    grid_r = out_features // bh
    w2, key, tma = _streamed(x, w, grid_r)
    if tma:  # more tokens than a decode split takes (TMA_MIN_TOKENS)
        grid = lambda meta: (grid_r * triton.cdiv(tokens, meta["BLOCK_M"]),)  # noqa: E731
        _launch("fwd_tma", grid, _descriptor(x), _descriptor(w2), bias if bias is not None else w, y, cols, row_ptr,
                tokens, out_features, *key, BH=bh, BW=bw, HAS_BIAS=bias is not None, PRECISION=_precision(x.dtype))
        return y
    split = decode_split(tokens, out_features, grid_r, nnz, _sms(x.device), _l2_bytes(x.device))
    out = y if split == 1 else torch.empty(split, tokens, out_features, dtype=torch.float32, device=x.device)
    grid = lambda meta: (grid_r * triton.cdiv(tokens, meta["BLOCK_M"]), split)  # noqa: E731
    _launch("fwd", grid, x, w, bias if bias is not None else w, out, cols, row_ptr, tokens, in_features,
            out_features, *key, split, BH=bh, BW=bw, HAS_BIAS=bias is not None, PARTIAL=split > 1,
            PRECISION=_precision(x.dtype))
    if split > 1:
        total = out.sum(0)
        if bias is not None:
            total += bias.float()
        y.copy_(total)
    return y


def grad_input(dy, w, rows, cols, col_ptr, col_order, in_features: int):
    nnz, bh, bw = w.shape
    if not supported(dy, bh, bw):
        return reference.grad_input(dy, w, rows, cols, col_ptr, col_order, in_features)
    tokens, out_features = dy.shape
    dx = torch.empty(tokens, in_features, dtype=dy.dtype, device=dy.device)
    if tokens == 0:
        return dx
    grid = lambda meta: (in_features // bw * triton.cdiv(tokens, meta["BLOCK_M"]),)  # noqa: E731
    w2, key, tma = _streamed(dy, w, in_features // bw)
    if tma:
        _launch("dx_tma", grid, _descriptor(dy), _descriptor(w2), dx, rows, col_ptr, col_order, tokens, in_features,
                *key, BH=bh, BW=bw, PRECISION=_precision(dy.dtype))
        return dx
    _launch("dx", grid, dy, w, dx, rows, col_ptr, col_order, tokens, out_features, in_features, *key,
            BH=bh, BW=bw, PRECISION=_precision(dy.dtype))
    return dx


def grad_weight(dy, x, rows, cols, row_ptr, bh: int, bw: int):
    if not supported(x, bh, bw):
        return reference.grad_weight(dy, x, rows, cols, row_ptr, bh, bw)
    tokens, in_features = x.shape
    out_features = dy.shape[1]
    nnz = rows.numel()
    if nnz == 0 or tokens == 0:
        return torch.zeros(nnz, bh, bw, dtype=x.dtype, device=x.device)
    g = max(1, 128 // bw)  # blocks of a row per program: a 128-wide MMA
    groups_per_row = triton.cdiv(in_features // bw, g)  # an upper bound: programs past a row's end exit
    # Enough working programs to fill the GPU twice over, each with at least 512 tokens.
    split = max(1, min(triton.cdiv(2 * _sms(x.device), triton.cdiv(nnz, g)), tokens // 512))
    per = triton.cdiv(triton.cdiv(tokens, split), 128) * 128
    split = triton.cdiv(tokens, per)
    out = torch.empty(split, nnz, bh, bw, dtype=torch.float32 if split > 1 else x.dtype, device=x.device)
    grid = ((out_features // bh) * groups_per_row, split)
    _launch("dw", grid, dy, x, out, cols, row_ptr, tokens, out_features, in_features, nnz, per, _bucket(tokens),
            split, groups_per_row, BH=bh, BW=bw, G=g, PRECISION=_precision(x.dtype))
    return out[0] if split == 1 else out.sum(0).to(x.dtype)


__all__ = ["forward", "grad_input", "grad_weight"]
