"""The block-sparse forwards at decode sizes (up to ``DECODE_MAX_TOKENS`` tokens, issue 35):
``_decode_kernel``, equal runs of the kept blocks per program whatever rows they fall in, and the
way it finishes the rows its runs cut; ``_decode_uncut_kernel``, which cuts no row across programs
(it deals out slices of rows along the outputs instead). ``triton_impl.py`` plans them, and routes
each size class to the faster of them and the pointer kernel of ``triton_kernels.py``.

On sm_90 and newer both are launched as programmatic dependents of the kernel before them on the
stream (``OVERLAP``; ``triton_sizing.decode_start``): they start while it ends, and wait for it
before they read or write anything but L2 prefetches (``_decode_start``)."""

from __future__ import annotations

from ..triton_compat import INTERPRETED, gdc_launch_dependents, gdc_wait, jit, tl


@jit
def _decode_kernel(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, count_ptr, cols_ptr, row_ptr_ptr, rows_ptr, T, K_IN, N_OUT,
                   NNZ, CHUNK,
                   BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_K: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_M: tl.constexpr, WAVES,
                   FLAT: tl.constexpr):
    """The forward at decode sizes (all T tokens in one tile of BLOCK_M rows): program ``p`` takes
    the kept blocks ``p * CHUNK`` to ``(p + 1) * CHUNK`` of the row-major list, whichever block-rows
    they belong to, so every program streams the same bytes of ``w`` however the rows' lengths vary
    (WAVES, tuned, is the programs per SM the host sized CHUNK for; the kernel doesn't read it).

    A program owns the block-rows its blocks belong to, and the empty ones that start inside its
    range (the last program: also those after the last block); it tells them from ``rows`` (each
    block's block-row) at the two ends of its range. A row wholly inside the range is stored at
    once (plus the bias). Only the first and the last row can be cut by the range:
    * the last (head), if it goes on past the range: the program sums its blocks of it first and
      stores the fp32 partial in slot ``p`` of ``part`` (int32 bits; empty slots hold
      ``SLOT_EMPTY``, a NaN no arithmetic makes);
    * the first, if it began before the range and ends inside it, is the program's to finish
      (owned): it sums its own blocks of the row last, then takes the earlier programs' slots of the
      row in program order, adds them in that order (deterministic) and the bias, stores the row
      and empties the slots.
    How the owner knows the slots are in (``COUNTED``, from the token tile):
    * a tile of 16 tokens: by the slots themselves. It reads each from L2, again (after a pause)
      while any element is still empty. One trip when they are in, no atomics, no fences, each
      4-byte element its own signal: at T=1, 0.9 us a layer faster than a count and then the
      partials (4096->14336 d=0.1, H100, ``bench/cuda_probe/decode_flat.py``'s ``count``);
    * larger tiles: a count, as before the slots. ``part`` is then fresh fp32 memory, and the head's
      program counts itself in ``count[row]`` (int32, zero between launches; release) once its
      partial is stored; the owner reads the count (acquire) until all are in, then the partials
      (``.cg``), and sets the count back to zero. The slots were 1-2 us a layer slower there (14336->4096
      T=64, H200: 26.2 against 24.2 at d=0.5), and a run walked flat is not offered.
    A program waits only on programs numbered below it, which start no later than it does (blocks
    are dispatched in order, as serial split-K relies on).

    ``FLAT`` (tuned): the run's blocks in one pipelined loop, last block first, the sum flushed where
    the block-row changes (``_decode_walk``); else a loop per row (head, owned, each whole row), each
    filling triton's pipeline anew and draining it at the row's end. Flat is faster where a run
    crosses rows (4096->14336 at T=1 on an H100: 7.2 against 8.5 us a layer at d=0.1), the loops
    per row where rows are long (14336->4096).

    ``EARLY``, ``OVERLAP``: how the program starts (``_decode_start``), and whether it lets the next
    launch start once its blocks are read. ``EARLY`` > 0 also means a CUDA device (PTX): an owner
    whose slots are not all in sleeps a little before it reads them again."""
    COUNTED: tl.constexpr = BLOCK_M > 16
    WALK: tl.constexpr = FLAT and BLOCK_M <= 16
    p = tl.program_id(0)
    lo = p * CHUNK
    hi = tl.minimum(lo + CHUNK, NNZ)
    n_rows = N_OUT // BH
    _decode_start(w_ptr, lo, hi, BH * BW, EARLY, OVERLAP, FLAT)
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
    q0 = tl.load(row_ptr_ptr + r_lo, mask=owned, other=0).to(tl.int32) // CHUNK  # the owned row's first program
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    m_ok = offs_m < T
    tile = offs_m.to(tl.int64)[:, None] * BH + offs_h[None, :]
    slot = part_ptr + p.to(tl.int64) * T * BH + tile
    if WALK:
        mine = _decode_walk(x_ptr, w_ptr, b_ptr, y_ptr, slot, cols_ptr, row_ptr_ptr, rows_ptr, lo, hi, first, end,
                            r_lo, r_hi, head, owned, T, K_IN, N_OUT, BH, BW, HAS_BIAS, PRECISION, BLOCK_K, BLOCK_M)
    else:
        if head:  # first, so the program that finishes the row has the partial as early as can be
            acc = _decode_run(x_ptr, w_ptr, cols_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32),
                              tl.maximum(tl.load(row_ptr_ptr + r_hi), lo), hi, T, K_IN, BH, BW, PRECISION, BLOCK_K,
                              BLOCK_M)
            tl.store(slot, acc if COUNTED else acc.to(tl.int32, bitcast=True), mask=m_ok[:, None])
        if COUNTED:
            if head:
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
    if owned and COUNTED:
        if not INTERPRETED:  # there the programs run in order: a count not in now never will be
            seen = tl.atomic_add(count_ptr + first, 0, sem="acquire")
            while seen < p - q0:  # they counted themselves early in their runs: rarely waits
                seen = tl.atomic_add(count_ptr + first, 0, sem="acquire")
        acc = _decode_parts(part_ptr, q0, p, tile, m_ok, T, BH, COUNTED, EARLY, BLOCK_M)
        _decode_store(y_ptr, b_ptr, acc + mine, first, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
        tl.atomic_xchg(count_ptr + first, 0)
    elif owned:
        acc = _decode_parts(part_ptr, q0, p, tile, m_ok, T, BH, COUNTED, EARLY, BLOCK_M)
        _decode_store(y_ptr, b_ptr, acc + mine, first, T, N_OUT, BH, HAS_BIAS, BLOCK_M)


@jit
def _decode_parts(part_ptr, q0, p, tile, m_ok, T, BH: tl.constexpr, COUNTED: tl.constexpr, EARLY: tl.constexpr,
                  BLOCK_M: tl.constexpr):
    """The sum of the partials of programs ``q0`` to ``p - 1`` (an owned row's earlier programs), added
    in program order (deterministic). Counted: fresh fp32 memory, all in (the count said so), read
    past L1. Slots: each read from L2, again after a pause while any element is still empty; then
    emptied.

    Slots are taken ``NQ`` at a time (4 tiles of 16 x 64, 2 of 16 x 128), their loads issued
    together: one trip to L2 for NQ partials, where a loop of one load each made a trip each. On an
    H100 that took 14336->4096 T=1 d=0.1 from 8.5 to 7.7 us a layer (loops per row; 7.4 flat) and
    4096->14336 d=0.1 from 8.4 to 8.2 (``bench/cuda_probe/decode_flat.py``, 2026-11-27). The
    counted partials (up to 64 x 128 fp32) are taken one at a time: two at once were no faster at
    T=64 (0.3-0.8 us slower at d=0.5, the same at d=0.1)."""
    NQ: tl.constexpr = 1 if COUNTED else 4 if BLOCK_M * BH <= 1024 else 2
    size = T * BH  # a partial's elements; slots * T * BH fits int32 (a few MB of partials)
    acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    for q in range(q0, p, NQ):
        at0 = part_ptr + q * size + tile
        ok0 = m_ok[:, None]
        if NQ > 1:
            ok1 = ok0 & (q + 1 < p)
        if NQ > 2:
            ok2 = ok0 & (q + 2 < p)
            ok3 = ok0 & (q + 3 < p)
        if COUNTED:  # one at a time (NQ is 1); masked: 0.0, which adds nothing
            g0 = tl.load(at0, mask=ok0, other=0.0, cache_modifier=".cg")
        else:
            g0 = tl.load(at0, mask=ok0, other=0, volatile=True)
            if NQ > 1:
                g1 = tl.load(at0 + size, mask=ok1, other=0, volatile=True)
            if NQ > 2:
                g2 = tl.load(at0 + 2 * size, mask=ok2, other=0, volatile=True)
                g3 = tl.load(at0 + 3 * size, mask=ok3, other=0, volatile=True)
            if not INTERPRETED:  # there the programs run in order: a slot empty now stays so (and reads as NaN)
                while _decode_empty(g0, g1 if NQ > 1 else g0, g2 if NQ > 2 else g0, g3 if NQ > 2 else g0) > 0:  # rare
                    if EARLY > 0:  # a pause between looks
                        tl.inline_asm_elementwise("nanosleep.u32 200; // $0 $1", "=r,r", [q],
                                                  dtype=tl.int32, is_pure=False, pack=1)
                    g0 = tl.load(at0, mask=ok0, other=0, volatile=True)
                    if NQ > 1:
                        g1 = tl.load(at0 + size, mask=ok1, other=0, volatile=True)
                    if NQ > 2:
                        g2 = tl.load(at0 + 2 * size, mask=ok2, other=0, volatile=True)
                        g3 = tl.load(at0 + 3 * size, mask=ok3, other=0, volatile=True)
            g0 = g0.to(tl.float32, bitcast=True)
            if NQ > 1:
                g1 = g1.to(tl.float32, bitcast=True)
            if NQ > 2:
                g2 = g2.to(tl.float32, bitcast=True)
                g3 = g3.to(tl.float32, bitcast=True)
            # every thread has its elements (the sum above went through them all): empty the slots
            gone = tl.full((BLOCK_M, BH), -1, tl.int32)
            tl.store(at0, gone, mask=ok0)
            if NQ > 1:
                tl.store(at0 + size, gone, mask=ok1)
            if NQ > 2:
                tl.store(at0 + 2 * size, gone, mask=ok2)
                tl.store(at0 + 3 * size, gone, mask=ok3)
        acc += g0
        if NQ > 1:
            acc += g1
        if NQ > 2:
            acc += g2
            acc += g3
    return acc


@jit
def _decode_empty(g0, g1, g2, g3):
    """How many elements of the four slots read are ``SLOT_EMPTY`` (-1 as int32)."""
    e = ((g0 == -1) | (g1 == -1) | (g2 == -1) | (g3 == -1)).to(tl.int32)
    return tl.sum(tl.sum(e, axis=1), axis=0)


@jit
def _decode_walk(x_ptr, w_ptr, b_ptr, y_ptr, slot, cols_ptr, row_ptr_ptr, rows_ptr, lo, hi, first, end, r_lo, r_hi,
                 head, owned, T, K_IN, N_OUT, BH: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """``_decode_kernel``'s run in one loop (``FLAT``): blocks ``hi - 1`` down to ``lo``, so the head
    row comes first; where the next block walked is in another row (``rows``), the row's sum is
    flushed: the head's to the program's ``slot``, a whole row's to y with its bias, the owned row's
    (the last walked) returned. Then the program's empty rows, if the walk met fewer rows than it
    owns. The flush is under a branch: as masked stores every block it cost a layout conversion a
    block (slower at T=64), and an atomic under it would stop the pipelining (no cp.async left)."""
    KSTEPS: tl.constexpr = BW // BLOCK_K
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BH)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < T
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K_IN
    acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    met = 0
    for it in range(0, (hi - lo) * KSTEPS):
        kb = hi - 1 - it // KSTEPS
        kk = (it % KSTEPS) * BLOCK_K
        wt = tl.load(w_ptr + kb.to(tl.int64) * (BH * BW) + (kk + offs_k)[:, None] + offs_h[None, :] * BW)
        c = tl.load(cols_ptr + kb)
        xt = tl.load(x_rows + (c * BW + kk + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
        r = tl.load(rows_ptr + kb).to(tl.int32)
        walked_next = tl.load(rows_ptr + kb - 1, mask=kb > lo, other=-1).to(tl.int32)
        if ((it % KSTEPS) == KSTEPS - 1) & (walked_next != r):  # the row's last block in this run
            is_owned = owned & (r == r_lo)
            if head & (r == r_hi):
                tl.store(slot, acc.to(tl.int32, bitcast=True), mask=m_ok[:, None])
            elif not is_owned:
                _decode_store(y_ptr, b_ptr, acc, r, T, N_OUT, BH, HAS_BIAS, BLOCK_M)
            met += 1
            if not is_owned:
                acc = tl.zeros((BLOCK_M, BH), dtype=tl.float32)
    if met < end - first:  # empty rows among the program's own (rare): the bias alone
        for r in range(first, end):
            if tl.load(row_ptr_ptr + r) == tl.load(row_ptr_ptr + r + 1):
                _decode_store(y_ptr, b_ptr, tl.zeros((BLOCK_M, BH), dtype=tl.float32), r, T, N_OUT, BH, HAS_BIAS,
                              BLOCK_M)
    return acc


@jit
def _decode_start(w_ptr, lo, hi, BLOCK: tl.constexpr, EARLY: tl.constexpr, OVERLAP: tl.constexpr,
                  FROM_END: tl.constexpr = False):
    """A decode program's first steps, before it reads the layout.

    ``EARLY`` > 0: the first ``EARLY`` 128-byte lines of the program's own blocks (from block ``lo``,
    short of block ``hi``; ``FROM_END``: the last lines, back from block ``hi``, for a program that
    walks its blocks last first) are asked into L2 at once (``prefetch.global.L2``, a line a thread), so
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
            if FROM_END:
                at = w_ptr + hi.to(tl.int64) * BLOCK - (lines + 1) * per_line
            else:
                at = w_ptr + lo.to(tl.int64) * BLOCK + lines * per_line
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [at], dtype=tl.int32, is_pure=False,
                                      pack=1)
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
