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

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

import torch

from ..triton_compat import jit, tl, triton
from . import reference
from .layout import BLOCK_SIZES


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return "tf32"  # ignored for fp16/bf16


def _m_configs():
    return [triton.Config({"BLOCK_M": m, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=st)
            for m, k, w, st in ((128, 64, 8, 3), (128, 64, 4, 4), (128, 128, 8, 3), (256, 64, 8, 3), (64, 64, 4, 4),
                                (128, 32, 4, 4), (128, 16, 4, 4), (64, 16, 4, 5), (32, 64, 4, 4), (16, 64, 4, 4),
                                (16, 16, 4, 5))]


def _arg(name, named_args, kwargs):
    return named_args[name] if name in named_args else kwargs[name]


def _prune_for(k_side: str, n_side: str):
    def prune(configs, named_args, **kwargs):
        """Tiles no taller than the tokens (rounded up to 16), a K step that divides the block,
        stages that fit in shared memory."""
        tokens = _arg("T", named_args, kwargs)
        kb, nb = _arg(k_side, named_args, kwargs), _arg(n_side, named_args, kwargs)
        cap = max(16, triton.next_power_of_2(tokens))
        kept = [c for c in configs if c.kwargs["BLOCK_M"] <= cap and c.kwargs["BLOCK_K"] <= kb
                and (c.kwargs["BLOCK_M"] + nb) * c.kwargs["BLOCK_K"] * 2 * c.num_stages <= 200 * 1024]
        if not kept:  # no config fits: the smallest tile, its K step cut to the block
            small = min(configs, key=lambda c: (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]))
            kept = [triton.Config({**small.kwargs, "BLOCK_K": min(kb, small.kwargs["BLOCK_K"])},
                                  num_warps=small.num_warps, num_stages=small.num_stages)]
        return kept
    return prune


def _bucket(t: int) -> int:
    return min(8192, triton.next_power_of_2(max(1, t)))


@jit
def _tile(n_lines, T, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr):
    """(line, token tile) of this program: GROUP_M consecutive token tiles walk every line (a
    block-row or -column) together, so their tokens stay in L2 while each line's blocks are
    read once for the group rather than once per tile."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(T, BLOCK_M)
    per_group = GROUP_M * n_lines
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    line = (pid % per_group) // size_m
    return line, pid_m


@jit
def _fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, cols_ptr, row_ptr_ptr, T, K_IN, N_OUT, T_BUCKET, SPLIT,
                BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    r, pid_m = _tile(N_OUT // BH, T, BLOCK_M, GROUP_M)
    sp = tl.program_id(1)
    KSTEPS: tl.constexpr = BW // BLOCK_K
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < T
    start = tl.load(row_ptr_ptr + r)
    n = tl.load(row_ptr_ptr + r + 1) - start
    mine = tl.maximum(n - sp + SPLIT - 1, 0) // SPLIT  # this split's blocks: start + sp, + SPLIT, ...
    acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    for it in range(0, mine * KSTEPS):
        kb = start + sp + (it // KSTEPS) * SPLIT
        kk = (it % KSTEPS) * BLOCK_K
        c = tl.load(cols_ptr + kb)
        xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        # w[kb] is (BH, BW) row-major: its columns kk.. read as a (BLOCK_K, BH) tile of its transpose
        wt = tl.load(w_ptr + kb.to(tl.int64) * (BH * BW) + (kk + offs_k)[:, None] + offs_h[None, :] * BW)
        acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
    if PARTIAL:  # fp32 partial sums, (SPLIT, T, N_OUT); the caller adds them and the bias
        out = y_ptr + (sp.to(tl.int64) * T + offs_m.to(tl.int64))[:, None] * N_OUT + (r * BH + offs_h)[None, :]
        tl.store(out, acc, mask=m_ok[:, None])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + r * BH + offs_h).to(tl.float32)[None, :]
        out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + (r * BH + offs_h)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])


@jit
def _dx_kernel(dy_ptr, w_ptr, dx_ptr, rows_ptr, col_ptr_ptr, order_ptr, T, N_OUT, N_IN, T_BUCKET,
               BH: tl.constexpr, BW: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    c, pid_m = _tile(N_IN // BW, T, BLOCK_M, GROUP_M)
    KSTEPS: tl.constexpr = BH // BLOCK_K
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_w = tl.arange(0, BW)
    m_ok = offs_m < T
    start = tl.load(col_ptr_ptr + c)
    n = tl.load(col_ptr_ptr + c + 1) - start
    acc = tl.zeros((BLOCK_M, BW), dtype=tl.float32)
    dy_rows = dy_ptr + offs_m.to(tl.int64)[:, None] * N_OUT
    for it in range(0, n * KSTEPS):
        k = tl.load(order_ptr + start + it // KSTEPS)
        kk = (it % KSTEPS) * BLOCK_K
        r = tl.load(rows_ptr + k)
        g = tl.load(dy_rows + (r * BH + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        w = tl.load(w_ptr + k.to(tl.int64) * (BH * BW) + (kk + offs_k)[:, None] * BW + offs_w[None, :])
        acc = tl.dot(g, w, acc, input_precision=PRECISION)
    dx_ptrs = dx_ptr + offs_m.to(tl.int64)[:, None] * N_IN + (c * BW + offs_w)[None, :]
    tl.store(dx_ptrs, acc.to(dx_ptr.dtype.element_ty), mask=m_ok[:, None])


def _dw_configs():
    return [triton.Config({"BLOCK_T": t}, num_warps=w, num_stages=s)
            for t, w, s in ((32, 4, 3), (64, 4, 3), (64, 8, 3), (128, 8, 3), (64, 4, 4))]


def _dw_prune(configs, named_args, **kwargs):
    bh, bw, g = _arg("BH", named_args, kwargs), _arg("BW", named_args, kwargs), _arg("G", named_args, kwargs)
    kept = [c for c in configs if c.kwargs["BLOCK_T"] * (bh + g * bw) * 2 * c.num_stages <= 200 * 1024]
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_T"])]


@jit
def _dw_kernel(dy_ptr, x_ptr, out_ptr, cols_ptr, row_ptr_ptr, T, N_OUT, K_IN, NNZ, PER_SPLIT, T_BUCKET, SPLIT,
               GROUPS_PER_ROW, BH: tl.constexpr, BW: tl.constexpr, G: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """dw for up to G consecutive blocks of one block-row, over one slice of the tokens: the
    row's dy slice is read once for the G blocks, whose x columns are gathered side by side
    into one (BLOCK_T, G * BW) operand, so the MMA is G * BW wide."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    r = pid // GROUPS_PER_ROW
    k0 = tl.load(row_ptr_ptr + r) + (pid % GROUPS_PER_ROW) * G
    end = tl.load(row_ptr_ptr + r + 1)
    if k0 < end:
        offs_h = tl.arange(0, BH)
        offs_n = tl.arange(0, G * BW)
        offs_t = tl.arange(0, BLOCK_T)
        kj = k0 + offs_n // BW  # each column's block
        j_ok = kj < end
        within = offs_n % BW
        xcol = tl.load(cols_ptr + kj, mask=j_ok, other=0) * BW + within
        t_lo = s * PER_SPLIT
        t_hi = tl.minimum(T, t_lo + PER_SPLIT)
        acc = tl.zeros((BH, G * BW), dtype=tl.float32)
        for t0 in range(t_lo, t_hi, BLOCK_T):
            t = t0 + offs_t
            t_ok = t < t_hi
            t64 = t.to(tl.int64)
            gt = tl.load(dy_ptr + t64[None, :] * N_OUT + (r * BH + offs_h)[:, None], mask=t_ok[None, :], other=0.0)
            xt = tl.load(x_ptr + t64[:, None] * K_IN + xcol[None, :], mask=t_ok[:, None] & j_ok[None, :], other=0.0)
            acc = tl.dot(gt, xt, acc, input_precision=PRECISION)
        out = out_ptr + (s.to(tl.int64) * NNZ + kj)[None, :] * (BH * BW) + offs_h[:, None] * BW + within[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=j_ok[None, :])


_TUNED = {} if triton is None else {
    "fwd": triton.autotune(configs=_m_configs(), key=["T_BUCKET", "BH", "BW", "N_OUT", "SPLIT", "HAS_BIAS"],
                           prune_configs_by={"early_config_prune": _prune_for("BW", "BH")})(_fwd_kernel),
    "dx": triton.autotune(configs=_m_configs(), key=["T_BUCKET", "BH", "BW", "N_IN"],
                          prune_configs_by={"early_config_prune": _prune_for("BH", "BW")})(_dx_kernel),
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
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_split(tokens: int, out_features: int, grid_r: int, nnz: int, block_bytes: int, sms: int) -> int:
    """How many programs share a block-row's blocks in the forward. Few tokens (decode) leave
    one program per block-row, too few to stream the weight at HBM speed; splitting the blocks
    fills the GPU, at the cost of fp32 partial sums written and read back (2 x 4 bytes per
    output each). Split only while those stay under a tenth of the weight's bytes.

    >>> decode_split(1, 4096, 32, 512, 128 * 128 * 2, 132)
    16
    >>> decode_split(64, 4096, 128, 8192, 32 * 32 * 2, 132)
    1
    """
    if tokens > 64:
        return 1
    want = -(-4 * sms // grid_r)
    affordable = (nnz * block_bytes // 10) // max(1, 8 * tokens * out_features)
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
    split = decode_split(tokens, out_features, grid_r, nnz, bh * bw * x.element_size(), _sms(x.device))
    out = y if split == 1 else torch.empty(split, tokens, out_features, dtype=torch.float32, device=x.device)
    grid = lambda meta: (grid_r * triton.cdiv(tokens, meta["BLOCK_M"]), split)  # noqa: E731
    _launch("fwd", grid, x, w, bias if bias is not None else w, out, cols, row_ptr, tokens, in_features,
            out_features, _bucket(tokens), split, BH=bh, BW=bw, HAS_BIAS=bias is not None, PARTIAL=split > 1,
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
    _launch("dx", grid, dy, w, dx, rows, col_ptr, col_order, tokens, out_features, in_features, _bucket(tokens),
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
