"""The block-sparse forwards at decode sizes (up to ``DECODE_MAX_TOKENS`` tokens, issue 35):
``_decode_kernel``, equal runs of the kept blocks per program whatever rows they fall in, and the
way it finishes the rows its runs cut; ``_decode_uncut_kernel``, which cuts no row across programs
(it deals out slices of rows along the outputs instead). ``triton_impl.py`` plans them, and routes
each size class to the faster of them and the pointer kernel of ``triton_kernels.py``.

On sm_90 and newer both are launched as programmatic dependents of the kernel before them on the
stream (``OVERLAP``; ``triton_sizing.decode_start``): they start while it ends, and wait for it
before they read or write anything but L2 prefetches (``_decode_start``)."""

from __future__ import annotations

from ..triton_compat import gdc_launch_dependents, gdc_wait, jit, tl


@jit
def _decode_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, rows_ptr, T, K_IN, N_OUT, NNZ,
                   CHUNK, BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_K: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_M: tl.constexpr, WAVES):
    """The forward at decode sizes (all T tokens in one tile of BLOCK_M rows): program ``p`` takes
    the kept blocks ``p * CHUNK`` to ``(p + 1) * CHUNK`` of the row-major list, whichever block-rows
    they belong to, so every program streams the same bytes of ``w`` however the rows' lengths vary
    (WAVES, tuned, is the programs per SM the host sized CHUNK for; the kernel doesn't read it).

    A program owns the block-rows its blocks belong to, and the empty ones that start inside its
    range (the last program: also those after the last block); it tells them from ``rows`` (each
    block's block-row) at the two ends of its range. A row wholly inside the range is
    stored at once (plus the bias). Only the first and the last row can be cut by the range:
    * the last, if it goes on past the range: the program sums its blocks of it first, stores the
      fp32 partial in ``part`` slot ``p`` and counts itself in ``count[row]`` (int32, zero between
      launches) without waiting for the count (first: the later program waits for it at its end;
      0.1-0.6 us a layer faster than second on an H100, ``bench/cuda_probe/decode_trace.py``);
    * the first, if it began before the range and ends inside it, is the program's to finish: it
      sums its own blocks of the row next and keeps the sum;
    * the rows in between; then, for the first row, the program waits until the row's earlier
      programs have all counted themselves, adds their partials in program order (deterministic)
      and the bias, stores the row and sets the count back to zero.
    No round trip in the middle of a run, and the one wait is at the end, when the programs that
    started with it are done. A program waits only on programs numbered below it, which start no
    later than it does (blocks are dispatched in order, as serial split-K relies on).

    ``EARLY``, ``OVERLAP``: how the program starts (``_decode_start``), and whether it lets the next
    launch start once its blocks are read."""
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.minimum(lo + CHUNK, NNZ)
    n_rows = N_OUT // BH
    _decode_start(w_ptr, lo, hi, BH * BW, EARLY, OVERLAP)
    # the rows owned, from the block-rows of the blocks at the run's two ends (``rows``): two lines
    # of the program's own, O(1), where a search had every program read all of row_ptr, O(rows) (on
    # the layers, as fast: docs/benchmarks.md, issue 35, fifteenth session)
    has = hi > lo  # False only in a layout with no blocks: one program, which owns every row
    before = tl.load(rows_ptr + lo - 1, mask=has & (lo > 0), other=-1).to(tl.int32)  # block lo - 1's row
    r_lo = tl.load(rows_ptr + lo, mask=has, other=-1).to(tl.int32)
    r_hi = tl.load(rows_ptr + hi - 1, mask=has, other=-1).to(tl.int32)
    after = tl.load(rows_ptr + hi, mask=has & (hi < NNZ), other=-1).to(tl.int32)  # block hi's row
    began = has & (before == r_lo)  # the first row began before the run
    head = has & (after == r_hi)  # the last row goes on past the run
    first = tl.where(began, r_lo, before + 1)  # empty rows between two programs' blocks: the later one's
    end = tl.where(hi >= NNZ, n_rows, r_hi + 1)
    owned = began & ~(head & (r_hi == r_lo))  # the first row began before the run and ends in it
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    m_ok = offs_m < T
    tile = offs_m.to(tl.int64)[:, None] * BH + offs_h[None, :]
    if head:  # first, so the program that finishes the row has the partial as early as can be
        acc = _decode_run(x_ptr, w_ptr, cols_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32),
                          tl.maximum(tl.load(row_ptr_ptr + r_hi), lo), hi, T, K_IN, BH, BW, PRECISION, BLOCK_K,
                          BLOCK_M)
        tl.store(part_ptr + p.to(tl.int64) * T * BH + tile, acc, mask=m_ok[:, None])
        tl.debug_barrier()  # every thread's partial is stored before the count says so
        tl.atomic_add(count_ptr + r_hi, 1, sem="release")
    mine = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    if owned:
        mine = _decode_run(x_ptr, w_ptr, cols_ptr, mine, lo, tl.load(row_ptr_ptr + r_lo + 1), T, K_IN, BH, BW,
                           PRECISION, BLOCK_K, BLOCK_M)
    for r in range(first + owned.to(tl.int32), end - head.to(tl.int32)):
        acc = _decode_run(x_ptr, w_ptr, cols_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32),
                          tl.load(row_ptr_ptr + r), tl.load(row_ptr_ptr + r + 1), T, K_IN, BH, BW, PRECISION,
                          BLOCK_K, BLOCK_M)
        _decode_store(y_ptr, b_ptr, acc, r, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
    if OVERLAP:
        gdc_launch_dependents()  # this program's blocks are read: the next launch may start its own
    if owned:
        q0 = tl.load(row_ptr_ptr + r_lo) // CHUNK
        seen = tl.atomic_add(count_ptr + first, 0, sem="acquire")
        while seen < p - q0:  # they counted themselves early in their runs: rarely waits
            seen = tl.atomic_add(count_ptr + first, 0, sem="acquire")
        acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
        for q in range(q0, p):
            acc += tl.load(part_ptr + q * T * BH + tile, mask=m_ok[:, None], other=0.0,
                           cache_modifier=".cg")  # slots * T * BH fits int32 (a few MB of partials)
        _decode_store(y_ptr, b_ptr, acc + mine, first, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
        tl.atomic_xchg(count_ptr + first, 0)


@jit
def _decode_start(w_ptr, lo, hi, BLOCK: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr):
    """A decode program's first steps, before it reads the layout.

    ``EARLY`` > 0: the first ``EARLY`` 128-byte lines of the program's own blocks (from block ``lo``,
    short of block ``hi``) are asked into L2 at once (``prefetch.global.L2``, a line a thread), so
    the weight stream starts while the layout is searched instead of after it. A prefetch reads no
    data into the program: an in-place write by the kernel before this one still lands in L2 first
    (L2 is where the GPU's writes meet), so it is safe before the wait below too.

    ``OVERLAP``: the program was launched as a programmatic dependent (``launch_pdl``): the kernel
    before it on the stream may still be running, so the program waits for it to finish
    (``griddepcontrol.wait``, which also makes its writes visible) before it reads anything else
    or writes at all."""
    if EARLY > 0:
        if hi > lo:
            per_line: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth  # elements a line
            lines = tl.minimum(tl.arange(0, EARLY), (hi - lo) * (BLOCK // per_line) - 1)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l",
                                      [w_ptr + lo.to(tl.int64) * BLOCK + lines * per_line], dtype=tl.int32,
                                      is_pure=False, pack=1)
    if OVERLAP:
        gdc_wait()


@jit
def _decode_run(x_ptr, w_ptr, cols_ptr, acc, s, e, T, K_IN, BH: tl.constexpr, BW: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """``acc`` plus the products of blocks ``s`` to ``e`` of the list (one block-row's) with x."""
    KSTEPS: tl.constexpr = BW // BLOCK_K
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    for it in range(0, (e - s) * KSTEPS):
        kb = s + it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        # w first: its address needs no index, so its bytes are on the way while cols[kb] comes in
        wt = tl.load(w_ptr + kb.to(tl.int64) * (BH * BW) + (kk + offs_k)[:, None] + offs_h[None, :] * BW)
        c = tl.load(cols_ptr + kb)
        xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=(offs_m < T)[:, None], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
    return acc


@jit
def _decode_store(y_ptr, b_ptr, acc, r, T, N_OUT, BH: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Block-row ``r`` of y: ``acc`` plus the bias."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    if HAS_BIAS:
        acc += tl.load(b_ptr + r * BH + offs_h).to(tl.float32)[None, :]
    out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + (r * BH + offs_h)[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < T)[:, None])


@jit
def _decode_uncut_kernel(x_ptr, w_ptr, b_ptr, y_ptr, cols_ptr, row_ptr_ptr, T, K_IN, N_OUT, TOTAL, CHUNK,
                         BH: tl.constexpr, BW: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
                         PRECISION: tl.constexpr, BLOCK_K: tl.constexpr, SEARCH: tl.constexpr,
                         OVERLAP: tl.constexpr, BLOCK_M: tl.constexpr, WAVES):
    """The forward at decode sizes with no row cut across programs, so no partial sums, no counts
    and no waiting. A block-row of ``BH`` outputs is ``BH // SUB`` *units* of ``SUB`` outputs; a
    unit reads its ``SUB`` rows of each of the row's blocks (contiguous: a block is stored
    row-major) and sums them whole. Units are dealt out in order: unit ``j`` of block-row ``r``
    starts at slice ``S * row_ptr[r] + j * n_r`` of the ``TOTAL = S * NNZ`` (``S = BH // SUB``, ``n_r``
    the row's blocks), and program ``p`` takes the units that start in ``[p * CHUNK, (p + 1) *
    CHUNK)`` (the last program: all that start later too, the empty rows at the end). So every
    program streams its share of ``w`` to within one unit, and an empty row's units, which start
    where the next row's do, store the bias (WAVES, tuned, is the programs per SM the host sized
    CHUNK for; the kernel doesn't read it).

    Against ``_decode_kernel`` (``docs/benchmarks.md``, issue 35): faster where rows are many and
    short (4096->14336: no program waits on another), slower where they are few and long
    (14336->4096: a unit is a large share of a program's), hence the route.

    ``OVERLAP``: as ``_decode_kernel``'s. It asks no blocks into L2 early: its first blocks are known
    only once the layout is searched (a unit's slices are strided), and asking for the blocks its
    share starts near, as ``_decode_kernel`` does for its own, was no faster in half the rows of the
    H100 (``docs/benchmarks.md``, issue 35, fourteenth session)."""
    S: tl.constexpr = BH // SUB
    KSTEPS: tl.constexpr = BW // BLOCK_K
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.where(p == tl.num_programs(0) - 1, TOTAL + 1, lo + CHUNK)
    n_rows = N_OUT // BH
    if OVERLAP:
        gdc_wait()  # launched as a programmatic dependent: the kernel before it may still run
    # the units owned: those that start below hi less those that start below lo (the starts rise
    # in unit order); a row's units that start below a bound: ceil((bound - start) / n_r), or all
    # of an empty row's when it starts below the bound
    u_lo = 0
    u_hi = 0
    for r0 in range(0, n_rows, SEARCH):
        rr = r0 + tl.arange(0, SEARCH)
        ok = rr < n_rows
        s = tl.load(row_ptr_ptr + rr, mask=ok, other=0).to(tl.int32)  # int64 indices: the counts stay int32
        n = tl.load(row_ptr_ptr + rr + 1, mask=ok, other=0).to(tl.int32) - s
        base = s * S
        step = tl.maximum(n, 1)
        u_lo += tl.sum(tl.where(ok, tl.where(n == 0, tl.where(base < lo, S, 0),
                                             tl.where(lo > base, tl.minimum((lo - base + step - 1) // step, S), 0)),
                                0), axis=0)
        u_hi += tl.sum(tl.where(ok, tl.where(n == 0, tl.where(base < hi, S, 0),
                                             tl.where(hi > base, tl.minimum((hi - base + step - 1) // step, S), 0)),
                                0), axis=0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, SUB)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < T
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    for u in range(u_lo, u_hi):
        r = u // S
        j = u % S
        s = tl.load(row_ptr_ptr + r)
        e = tl.load(row_ptr_ptr + r + 1)
        acc = tl.zeros((BLOCK_M, SUB), dtype=tl.float32)
        w_unit = w_ptr + (j * SUB + offs_h)[None, :] * BW + offs_k[:, None]
        for it in range(0, (e - s) * KSTEPS):
            kb = s + it // KSTEPS
            kk = (it % KSTEPS) * BLOCK_K
            wt = tl.load(w_unit + kb.to(tl.int64) * (BH * BW) + kk)
            c = tl.load(cols_ptr + kb)
            xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
            acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
        h = r * BH + j * SUB + offs_h
        if HAS_BIAS:
            acc += tl.load(b_ptr + h).to(tl.float32)[None, :]
        out = y_ptr + offs_m.to(tl.int64)[:, None] * N_OUT + h[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None])
    if OVERLAP:
        gdc_launch_dependents()
