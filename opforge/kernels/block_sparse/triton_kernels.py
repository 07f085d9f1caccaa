"""The Triton kernels of ``triton_impl.py`` (which plans and launches them; ``triton_sizing.py``
sizes their work). See its docstring for what each computes.

* ``_fwd_kernel`` / ``_dx_kernel`` load through pointers; ``_fwd_tma_kernel`` /
  ``_dx_tma_kernel`` do the same work with the operands brought in by the copy engine (TMA,
  Hopper and newer), used where the operands allow it (``triton_sizing.tma_ready``).
* ``_fwd_pair_kernel``: the copy-engine forward with two neighbouring block-rows a program
  (``pairs.py``), where the tuning finds it faster.
* ``_decode_kernel`` and ``_decode_uncut_kernel`` (in ``triton_decode.py``): the forwards at decode sizes.
* ``_dw_kernel``: the weight gradient, on the kept blocks only.

Indices arrive as int64 and are narrowed to int32 where they address a TMA box (the caller
checks that coordinates fit).
"""

from __future__ import annotations

from ..triton_compat import jit, tl


@jit
def _tile(n_lines, T, L2_ROWS, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr):
    """(line, token tile) of this program: up to GROUP_M consecutive token tiles walk every line
    (a block-row or -column) together, so their tokens stay in L2 while each line's blocks are
    read once for the group rather than once per tile. A group holds no more than L2_ROWS
    tokens (the rows of the streamed operand that fit in half of L2)."""
    pid = tl.program_id(0)
    group = tl.maximum(1, tl.minimum(GROUP_M, L2_ROWS // BLOCK_M))
    n_m = tl.cdiv(T, BLOCK_M)
    per_group = group * n_lines
    first_m = (pid // per_group) * group
    size_m = tl.minimum(n_m - first_m, group)
    pid_m = first_m + (pid % per_group) % size_m
    line = (pid % per_group) // size_m
    return line, pid_m


@jit
def _fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, T, K_IN, N_OUT, T_BUCKET,
                L2_ROWS, DEPTH, BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                SPLIT):
    """SPLIT (tuned with the tile: ``triton_sizing.fwd_configs``) programs share a (block-row,
    token tile); PARTIAL when it is more than one. With PARTIAL each writes its fp32 partial
    sum to ``part`` (SPLIT, T, N_OUT) and counts itself in ``count`` (an int32 per tile, zero
    between calls); the last to arrive adds the partials in a fixed order (plus the bias),
    stores y, and sets the count back to zero. One launch, deterministic results."""
    r, pid_m = _tile(N_OUT // BH, T, L2_ROWS, BLOCK_M, GROUP_M)
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
    out_cols = (r * BH + offs_h)[None, :]
    if PARTIAL:
        rows = offs_m.to(tl.int64)[:, None]
        tl.store(part_ptr + (sp.to(tl.int64) * T + rows) * N_OUT + out_cols, acc, mask=m_ok[:, None])
        tl.debug_barrier()  # every thread's partial is stored before the count says so
        tile = count_ptr + r * tl.cdiv(T, BLOCK_M) + pid_m
        if tl.atomic_add(tile, 1, sem="acq_rel") == SPLIT - 1:  # the last one: add the partials
            acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
            for s in range(0, SPLIT):
                acc += tl.load(part_ptr + (s * T + rows) * N_OUT + out_cols, mask=m_ok[:, None], other=0.0,
                               cache_modifier=".cg")
            if HAS_BIAS:
                acc += tl.load(b_ptr + r * BH + offs_h).to(tl.float32)[None, :]
            out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + out_cols
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])
            tl.atomic_xchg(tile, 0)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + r * BH + offs_h).to(tl.float32)[None, :]
        out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + out_cols
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])


@jit
def _dx_kernel(dy_ptr, w_ptr, dx_ptr, rows_ptr, col_ptr_ptr, order_ptr, T, N_OUT, N_IN, T_BUCKET, L2_ROWS, DEPTH,
               BH: tl.constexpr, BW: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    c, pid_m = _tile(N_IN // BW, T, L2_ROWS, BLOCK_M, GROUP_M)
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


@jit
def _fwd_tma_kernel(x_desc, w_desc, b_ptr, y_ptr, cols_ptr, row_ptr_ptr, T, N_OUT, T_BUCKET, L2_ROWS, DEPTH,
                    BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """_fwd_kernel's work with the operands brought in by the copy engine (TMA): x through a
    (T, in) descriptor, w through a (nnz * BH, BW) one; rows past T read as zeros."""
    r, pid_m = _tile(N_OUT // BH, T, L2_ROWS, BLOCK_M, GROUP_M)
    KSTEPS: tl.constexpr = BW // BLOCK_K
    start = tl.load(row_ptr_ptr + r).to(tl.int32)
    n = tl.load(row_ptr_ptr + r + 1).to(tl.int32) - start
    m0 = pid_m * BLOCK_M
    acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    for it in range(0, n * KSTEPS):
        kb = start + it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        c = tl.load(cols_ptr + kb).to(tl.int32)
        xt = x_desc.load([m0, c * BW + kk])
        wt = w_desc.load([kb * BH, kk])  # (BH, BLOCK_K): K-major, as the MMA wants its B
        acc = tl.dot(xt, wt.T, acc, input_precision=PRECISION)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    if HAS_BIAS:
        acc += tl.load(b_ptr + r * BH + offs_h).to(tl.float32)[None, :]
    out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + (r * BH + offs_h)[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < T)[:, None])


@jit
def _fwd_pair_kernel(x_desc, w_desc, b_ptr, y_ptr, seg_ptr, pcol_ptr, pia_ptr, pib_ptr, T, N_OUT, T_BUCKET, L2_ROWS,
                     DEPTH, BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """_fwd_tma_kernel's work for block-rows 2p and 2p + 1 in one program (``pairs.py``): the x tile
    of a column both keep is read once for their two blocks. Three loops, no branch: the columns
    both keep, those only the first keeps, those only the second keeps. An odd last row's pair
    has no second row (its runs are empty, its tile not stored)."""
    n_rows = N_OUT // BH
    p, pid_m = _tile((n_rows + 1) // 2, T, L2_ROWS, BLOCK_M, GROUP_M)
    KSTEPS: tl.constexpr = BW // BLOCK_K
    m0 = pid_m * BLOCK_M
    s0 = tl.load(seg_ptr + 4 * p)
    s1 = tl.load(seg_ptr + 4 * p + 1)
    s2 = tl.load(seg_ptr + 4 * p + 2)
    s3 = tl.load(seg_ptr + 4 * p + 3)
    acc_a = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    for it in range(s0 * KSTEPS, s1 * KSTEPS):  # both rows' blocks: one x tile, two products
        e = it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        xt = x_desc.load([m0, tl.load(pcol_ptr + e) * BW + kk])
        wa = w_desc.load([tl.load(pia_ptr + e) * BH, kk])
        wb = w_desc.load([tl.load(pib_ptr + e) * BH, kk])
        acc_a = tl.dot(xt, wa.T, acc_a, input_precision=PRECISION)
        acc_b = tl.dot(xt, wb.T, acc_b, input_precision=PRECISION)
    acc_a = _pair_own(x_desc, w_desc, pcol_ptr, pia_ptr, acc_a, s1, s2, m0, BH, BW, PRECISION, BLOCK_K)
    acc_b = _pair_own(x_desc, w_desc, pcol_ptr, pib_ptr, acc_b, s2, s3, m0, BH, BW, PRECISION, BLOCK_K)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    ra, rb = 2 * p, 2 * p + 1
    if HAS_BIAS:
        acc_a += tl.load(b_ptr + ra * BH + offs_h).to(tl.float32)[None, :]
        acc_b += tl.load(b_ptr + rb * BH + offs_h, mask=rb < n_rows, other=0.0).to(tl.float32)[None, :]
    rows = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT
    m_ok = (offs_m < T)[:, None]
    tl.store(rows + (ra * BH + offs_h)[None, :], acc_a.to(y_ptr.dtype.element_ty), mask=m_ok)
    tl.store(rows + (rb * BH + offs_h)[None, :], acc_b.to(y_ptr.dtype.element_ty), mask=m_ok & (rb < n_rows))


@jit
def _pair_own(x_desc, w_desc, pcol_ptr, pi_ptr, acc, s, e, m0, BH: tl.constexpr, BW: tl.constexpr,
              PRECISION: tl.constexpr, BLOCK_K: tl.constexpr):
    """``_fwd_pair_kernel``'s run of one row's own columns (entries ``s`` to ``e`` of the pair lists,
    that row's block indices in ``pi``) added to ``acc``: the first row's, then the second's."""
    KSTEPS: tl.constexpr = BW // BLOCK_K
    for it in range(s * KSTEPS, e * KSTEPS):
        j = it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        xt = x_desc.load([m0, tl.load(pcol_ptr + j) * BW + kk])
        wt = w_desc.load([tl.load(pi_ptr + j) * BH, kk])
        acc = tl.dot(xt, wt.T, acc, input_precision=PRECISION)
    return acc


@jit
def _dx_tma_kernel(dy_desc, w_desc, dx_ptr, rows_ptr, col_ptr_ptr, order_ptr, T, N_IN, T_BUCKET, L2_ROWS, DEPTH,
                   BH: tl.constexpr, BW: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """_dx_kernel's work through TMA descriptors: dy (T, out) and w (nnz * BH, BW)."""
    c, pid_m = _tile(N_IN // BW, T, L2_ROWS, BLOCK_M, GROUP_M)
    KSTEPS: tl.constexpr = BH // BLOCK_K
    start = tl.load(col_ptr_ptr + c).to(tl.int32)
    n = tl.load(col_ptr_ptr + c + 1).to(tl.int32) - start
    m0 = pid_m * BLOCK_M
    acc = tl.zeros((BLOCK_M, BW), dtype=tl.float32)
    for it in range(0, n * KSTEPS):
        k = tl.load(order_ptr + start + it // KSTEPS).to(tl.int32)
        kk = (it % KSTEPS) * BLOCK_K
        r = tl.load(rows_ptr + k).to(tl.int32)
        g = dy_desc.load([m0, r * BH + kk])
        w = w_desc.load([k * BH + kk, 0])
        acc = tl.dot(g, w, acc, input_precision=PRECISION)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_w = tl.arange(0, BW)
    out = dx_ptr + offs_m.to(tl.int64)[:, None] * N_IN + (c * BW + offs_w)[None, :]
    tl.store(out, acc.to(dx_ptr.dtype.element_ty), mask=(offs_m < T)[:, None])


@jit
def _dw_kernel(dy_ptr, x_ptr, out_ptr, part_ptr, db_ptr, db_part_ptr, count_ptr, cols_ptr, row_ptr_ptr, T, N_OUT,
               K_IN, NNZ, PER_SPLIT, T_BUCKET, SPLIT, GROUPS_PER_ROW, BH: tl.constexpr, BW: tl.constexpr,
               G: tl.constexpr, HAS_DB: tl.constexpr, PARTIAL: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """dw for up to G consecutive blocks of one block-row, over one slice of the tokens: the
    row's dy slice is read once for the G blocks, whose x columns are gathered side by side
    into one (BLOCK_T, G * BW) operand, so the MMA is G * BW wide. With HAS_DB, the first
    N_OUT / BH programs each sum one block-row's dy slice into the bias gradient ``db``
    instead: short programs of their own, in the first wave (summing dy inside the MMA loop
    kept it out of the pipeline, and a second loop in a group's program lengthened the tail:
    a forward + backward at 8192 tokens took 1.1-1.3x as long either way).
    With PARTIAL, SPLIT programs share a group (one slice of the tokens each): each writes its
    fp32 partials to ``part`` (SPLIT, NNZ, BH, BW) or ``db_part`` (SPLIT, N_OUT) and counts
    itself in ``count`` (an int32 per program, zero between launches); the last to arrive adds
    the partials in a fixed order, stores them, and sets the count back to zero."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    t_lo = s * PER_SPLIT
    t_hi = tl.minimum(T, t_lo + PER_SPLIT)
    if HAS_DB:
        if pid < N_OUT // BH:
            _dw_bias(dy_ptr, db_ptr, db_part_ptr, count_ptr + pid, pid, s, t_lo, t_hi, N_OUT, SPLIT, BH, PARTIAL,
                     BLOCK_T)
        else:
            _dw_blocks(dy_ptr, x_ptr, out_ptr, part_ptr, count_ptr + pid, cols_ptr, row_ptr_ptr, pid - N_OUT // BH,
                       s, t_lo, t_hi, N_OUT, K_IN, NNZ, SPLIT, GROUPS_PER_ROW, BH, BW, G, PARTIAL, PRECISION,
                       BLOCK_T)
    else:
        _dw_blocks(dy_ptr, x_ptr, out_ptr, part_ptr, count_ptr + pid, cols_ptr, row_ptr_ptr, pid, s, t_lo, t_hi,
                   N_OUT, K_IN, NNZ, SPLIT, GROUPS_PER_ROW, BH, BW, G, PARTIAL, PRECISION, BLOCK_T)


@jit
def _dw_blocks(dy_ptr, x_ptr, out_ptr, part_ptr, count, cols_ptr, row_ptr_ptr, pid, s, t_lo, t_hi, N_OUT, K_IN, NNZ,
               SPLIT, GROUPS_PER_ROW, BH: tl.constexpr, BW: tl.constexpr, G: tl.constexpr, PARTIAL: tl.constexpr,
               PRECISION: tl.constexpr, BLOCK_T: tl.constexpr):
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
        acc = tl.zeros((BH, G * BW), dtype=tl.float32)
        for t0 in range(t_lo, t_hi, BLOCK_T):
            t = t0 + offs_t
            t_ok = t < t_hi
            t64 = t.to(tl.int64)
            gt = tl.load(dy_ptr + t64[None, :] * N_OUT + (r * BH + offs_h)[:, None], mask=t_ok[None, :], other=0.0)
            xt = tl.load(x_ptr + t64[:, None] * K_IN + xcol[None, :], mask=t_ok[:, None] & j_ok[None, :], other=0.0)
            acc = tl.dot(gt, xt, acc, input_precision=PRECISION)
        blocks = (kj[None, :] * (BH * BW) + offs_h[:, None] * BW + within[None, :]).to(tl.int64)
        if PARTIAL:
            tl.store(part_ptr + s.to(tl.int64) * NNZ * (BH * BW) + blocks, acc, mask=j_ok[None, :])
            tl.debug_barrier()  # every thread's partials are stored before the count says so
            if tl.atomic_add(count, 1, sem="acq_rel") == SPLIT - 1:  # the last one: add them up
                acc = tl.zeros((BH, G * BW), dtype=tl.float32)
                for p in range(0, SPLIT):
                    acc += tl.load(part_ptr + (p * NNZ).to(tl.int64) * (BH * BW) + blocks, mask=j_ok[None, :],
                                   other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + blocks, acc.to(out_ptr.dtype.element_ty), mask=j_ok[None, :])
                tl.atomic_xchg(count, 0)
        else:
            tl.store(out_ptr + blocks, acc.to(out_ptr.dtype.element_ty), mask=j_ok[None, :])


@jit
def _dw_bias(dy_ptr, db_ptr, db_part_ptr, count, r, s, t_lo, t_hi, N_OUT, SPLIT, BH: tl.constexpr,
             PARTIAL: tl.constexpr, BLOCK_T: tl.constexpr):
    """db[r * BH:(r + 1) * BH] = dy[t_lo:t_hi, those columns].sum(0), in fp32."""
    offs_h = tl.arange(0, BH)
    offs_t = tl.arange(0, BLOCK_T)
    db = tl.zeros((BH,), dtype=tl.float32)
    for t0 in range(t_lo, t_hi, BLOCK_T):
        t = t0 + offs_t
        tile = tl.load(dy_ptr + t.to(tl.int64)[:, None] * N_OUT + (r * BH + offs_h)[None, :],
                       mask=(t < t_hi)[:, None], other=0.0)
        db += tl.sum(tile.to(tl.float32), axis=0)
    cols = r * BH + offs_h
    if PARTIAL:
        tl.store(db_part_ptr + s.to(tl.int64) * N_OUT + cols, db)
        tl.debug_barrier()
        if tl.atomic_add(count, 1, sem="acq_rel") == SPLIT - 1:
            db = tl.zeros((BH,), dtype=tl.float32)
            for p in range(0, SPLIT):
                db += tl.load(db_part_ptr + p * N_OUT + cols, cache_modifier=".cg")
            tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty))
            tl.atomic_xchg(count, 0)
    else:
        tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty))
