"""The block-sparse Triton kernels in triton's interpreter (``TRITON_INTERPRET=1``), on CPU tensors,
for test_block_sparse_interpreted.py, which runs this file in a process of its own (triton decides
at decoration time whether a kernel compiles or interprets). Prints one JSON line.

    python interpreted.py op SEED CASES SMS [TOKENS]   the whole path of triton_impl.py
                                                      (TOKENS: every call has TOKENS to TOKENS + 276)
    python interpreted.py decode SEED LAYOUTS          _decode_kernel with every run length (``shares``)
    python interpreted.py uncut SEED LAYOUTS           _decode_uncut_kernel with every share a program (``shares``)

``op``: random calls of ``forward``, ``grad_input`` and ``grad_weight(_bias)`` (block sides of the
kernels, grids of 1-4 blocks, empty rows and columns, 0-400 tokens, now and then 1024-1300, x aligned
or one element in, bias or not; fp16, bf16 and fp32) against the masked dense fp64 reference, with the
GPU tests' tolerances.
Each call plans afresh with a config drawn at random from those its sizing keeps, and a random
route where there are two, so every plan kind runs: the pointer forward whole and split, the
decode forward, the copy-engine (TMA) forward and input gradient, the paired forward, the weight
gradient. What stands in for the GPU: its facts (``SMS`` SMs, 50 MB of L2, TMA), CPU tensors taken
as the kernels' (``supported``, ``tma_ready``), one buffer of arrival counts, checked back at zero
before every launch that uses it and at the end, and one of the decode kernel's partial slots,
checked empty before every launch that uses it.

``decode``: ``_decode_kernel`` on random tiny layouts (empty ones, empty and full rows) with every
blocks-per-program from 1 to past the longest row, the whole list and past it (``shares``), both walks (one loop, a loop per row), with a
bias or not: up to 16 tokens the partial slots empty again after each launch; past that fresh
partials filled with NaN (a slot read before it is written shows) and the counts back at zero.

``uncut``: ``_decode_uncut_kernel`` on the same kind of layouts, with units of a whole block-row and of
a half or a quarter of one, every share a program from one slice to past the longest row, the whole
list and past it (``shares``), y filled
with NaN (an output no program stores shows).

The interpreter runs a launch's programs one after another, in order: this checks the kernels'
index arithmetic and their protocols' logic, not their concurrency or timing (the GPU tests do).
Its ``tl.dot`` multiplies bf16's raw bits, so ``_bf16_dots`` widens bf16 operands to fp32 first.
"""

from __future__ import annotations

import json
import os
import random
import sys

import torch

EPS = {torch.float16: 2**-11, torch.bfloat16: 2**-8, torch.float32: 2**-24}


def _stand_in_gpu(sms: int, rng: random.Random):
    """Point triton_impl at CPU tensors as if on a GPU with ``sms`` SMs, and choose configs and
    routes at random; returns the counts buffer."""
    torch.cuda.current_device = lambda: None  # a CPU tensor's device.index
    torch.cuda.is_current_stream_capturing = lambda: False
    from opforge.kernels import route, triton_launch
    from opforge.kernels.block_sparse import triton_impl, triton_plans, triton_sizing
    from opforge.kernels.block_sparse.layout import BLOCK_SIZES

    triton_sizing._DEVICES[None] = (sms, 50 * 2**20, True)
    triton_impl.supported = lambda t, bh, bw: (t.dtype in triton_sizing.KERNEL_DTYPES and bh in BLOCK_SIZES
                                               and bw in BLOCK_SIZES)

    def tma_ready(tokens, *tensors):
        return tokens > triton_sizing.TMA_MIN_TOKENS and all(
            t.is_contiguous() and t.numel() > 0 and t.data_ptr() % 16 == 0 for t in tensors)

    triton_impl.tma_ready = tma_ready
    counts = torch.zeros(1 << 16, dtype=torch.int32)

    def split_counts(device, needed):
        if counts.any():
            raise AssertionError("a launch left arrival counts non-zero")
        return counts

    slots = [torch.full((1 << 16,), triton_sizing.SLOT_EMPTY, dtype=torch.int32)]

    def split_slots(device, needed):
        if slots[0].ne(triton_sizing.SLOT_EMPTY).any():
            raise AssertionError("a launch left partial slots filled")
        if slots[0].numel() < needed:
            slots[0] = torch.full((needed,), triton_sizing.SLOT_EMPTY, dtype=torch.int32)
        return slots[0]

    triton_impl.split_counts = triton_plans.split_counts = split_counts
    triton_plans.split_slots = split_slots
    triton_plans.outside_pools = lambda make, device: make()
    triton_launch.TunedKernel.choose = lambda self, key, device, trial, keep, prefer=None, stand_ins=None: rng.choice(
        [c for c in self.choices if keep(c)] or [self.choices[0]])
    route.Route.choose = lambda self, key, device, runs, timer=None: rng.choice([n for n in self.names if n in runs])
    return counts


def _bf16_dots() -> None:
    """Teach the interpreter's ``tl.dot`` bf16 (it keeps bf16 as raw uint16 and multiplies those):
    both operands to fp32 first, exact, as the tensor cores take them. Everything else it does with
    bf16 (loads, stores, casts to and from fp32) it already does right."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def wide(h):
            if h.dtype.scalar != tl.bfloat16:
                return h
            data = interpreter._convert_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)

        return dot(self, wide(a), wide(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


def _misfits(got, ref, k: int, dtype) -> float | None:
    """How far ``got`` is past the GPU tests' tolerance (None: within it)."""
    if got.shape != ref.shape:
        return float("inf")
    if not ref.numel():
        return None
    eps = EPS[dtype]
    atol = (eps + max(1, k) * 2**-22) * max(1.0, ref.abs().max().item())
    over = ((got.double() - ref).abs() - atol - (2 * eps + 1e-5) * ref.abs()).max().item()
    return None if over <= 0 else over


def op(seed: int, cases: int, sms: int, tokens_from: int = 0) -> dict:
    from opforge.kernels.block_sparse import triton_impl
    from opforge.kernels.block_sparse.layout import BLOCK_SIZES, BlockSparseLayout

    rng = random.Random(seed)
    counts = _stand_in_gpu(sms, rng)
    _bf16_dots()
    bad, cover = [], {}
    for i in range(cases):
        bh, bw = rng.choice(BLOCK_SIZES), rng.choice(BLOCK_SIZES)
        grid = (rng.randint(1, 4), rng.randint(1, 4))
        tokens = rng.choice([rng.randint(0, 20), rng.randint(21, 64), rng.randint(65, 400)])
        if tokens_from or rng.random() < 0.05:  # enough for the weight gradient to split the tokens
            tokens = rng.randint(tokens_from or 1024, (tokens_from or 1024) + 276)
        dtype = rng.choice(list(EPS))
        has_bias, offset = rng.random() < 0.5, rng.random() < 0.25
        g = torch.Generator().manual_seed(rng.randint(0, 2**16))
        lay = BlockSparseLayout(torch.rand(grid, generator=g) < rng.uniform(0.0, 1.0), (bh, bw))
        idx = lay.indices()
        out_f, in_f = lay.shape
        x = torch.randn(tokens, in_f, generator=g).to(dtype)
        if offset:  # one element into its storage: not 16-byte aligned, no TMA
            buf = torch.empty(tokens * in_f + 1, dtype=dtype)
            buf[1:] = x.reshape(-1)
            x = buf[1:].view(tokens, in_f)
        w = torch.randn(lay.nnz, bh, bw, generator=g).to(dtype)
        b = torch.randn(out_f, generator=g).to(dtype) if has_bias else None
        dy = torch.randn(tokens, out_f, generator=g).to(dtype)
        triton_impl.forget_plans()
        y = triton_impl.forward(x, w, b, idx.rows, idx.cols, idx.row_ptr, out_f)
        dx = triton_impl.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, in_f)
        if has_bias:
            dw, db = triton_impl.grad_weight_bias(dy, x, idx.rows, idx.cols, idx.row_ptr, bh, bw)
        else:
            dw, db = triton_impl.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr, bh, bw), None
        dense = lay.scatter(w.double())
        ref_dw = dy.double().t() @ x.double()
        ref_dw = ref_dw.view(grid[0], bh, grid[1], bw).permute(0, 2, 1, 3)[idx.rows, idx.cols]
        refs = {"y": (y, x.double() @ dense.t() + (b.double() if has_bias else 0), in_f),
                "dx": (dx, dy.double() @ dense, out_f), "dw": (dw, ref_dw, tokens)}
        if has_bias:
            refs["db"] = (db, dy.double().sum(0), tokens)
        misfit = {name: m for name, (got, ref, k) in refs.items() if (m := _misfits(got, ref, k, dtype)) is not None}
        kinds = plan_kinds(triton_impl)
        for kind in kinds:
            cover[kind] = cover.get(kind, 0) + 1
        if misfit:
            bad.append({"case": i, "block": [bh, bw], "grid": list(grid), "nnz": lay.nnz, "tokens": tokens,
                        "dtype": str(dtype), "bias": has_bias, "offset": offset, "plans": kinds, "over": misfit})
    if counts.any():
        bad.append({"counts": "left non-zero at the end"})
    return {"cases": cases, "bad": bad, "cover": cover}


def plan_kinds(triton_impl, keys=None) -> list[str]:
    """What each plan ``triton_impl`` holds launches ("fwd:decode", "dx:tma", "dw:split", ...); only the
    plans not among ``keys`` (``plan_keys()`` taken earlier) when given."""
    return [f"{what}:{_kind(plan)}" for what, plans in _tables(triton_impl)
            for key, plan in plans.items() if keys is None or (what, key) not in keys]


def plan_keys(triton_impl) -> set:
    return {(what, key) for what, plans in _tables(triton_impl) for key in plans}


def _tables(triton_impl) -> tuple:
    """``triton_impl``'s plans by call shape: the forward's, the input gradient's, the weight gradient's."""
    return ("fwd", triton_impl._FWD), ("dx", triton_impl._DX), ("dw", triton_impl._DW)


def _kind(plan) -> str:
    if isinstance(plan, str):
        return plan  # the torch path
    facts = plan.facts if isinstance(plan.facts, tuple) else (plan.facts,)
    if isinstance(facts[0], int):  # the weight gradient's (token slices, groups)
        return "whole" if facts[0] == 1 else "split"
    return str(facts[0])


def _tiny(rng: random.Random, blocks: list):
    """A tiny random layout (1-6 x 1-5 blocks of a side of ``blocks``, any density: empty ones, empty
    and full rows), its tokens (1, 2, 5 or 17), x, the kept blocks and a bias, fp32."""
    from opforge.kernels.block_sparse.layout import BlockSparseLayout

    bh, bw = rng.choice(blocks)
    grid = (rng.randint(1, 6), rng.randint(1, 5))
    g = torch.Generator().manual_seed(rng.randint(0, 2**16))
    lay = BlockSparseLayout(torch.rand(grid, generator=g) < rng.random(), (bh, bw))
    tokens = rng.choice([1, 2, 5, 17])
    x = torch.randn(tokens, lay.shape[1], generator=g)
    return lay, tokens, x, torch.randn(lay.nnz, bh, bw, generator=g), torch.randn(lay.shape[0], generator=g)


def shares(longest: int, total: int) -> list[int]:
    """The shares a program (``CHUNK``) to launch with, for a list of ``total`` blocks (units) whose longest
    row has ``longest``: every share from one to one past the longest row (a row cut by every number of
    programs it can be, each bound of a program at every place in the list), then the whole list and one
    past it (one program). The shares between cut no row more than once, as the longest row's share
    already does, and put bounds where those smaller than them do; they cost the most (each launch runs
    the whole list).

    >>> shares(3, 12), shares(5, 5), shares(0, 0)
    ([1, 2, 3, 4, 12, 13], [1, 2, 3, 4, 5, 6], [1])
    """
    return sorted({*range(1, min(longest + 1, total) + 1), total, total + 1} - {0})


def decode(seed: int, layouts: int) -> dict:
    from opforge.kernels.block_sparse import triton_sizing
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.kernels.block_sparse.triton_decode import _decode_kernel

    rng = random.Random(seed)
    bad, launches = [], 0
    cases = [_tiny(rng, [(16, 16), (32, 16), (16, 64)]) for _ in range(layouts)]
    # tall blocks: owners take slots 2 at a time (a 16 x 128 tile; the tiny ones above: 4 at a time), and
    # counted partials of 64 x 64 one at a time: rows of 1 to 7 blocks, the last one empty
    for (bh, tokens), g in zip(((128, 5), (64, 33)), (torch.Generator().manual_seed(seed + j) for j in (1, 2))):
        lay = BlockSparseLayout(torch.arange(8)[None, :] < torch.tensor([7, 1, 4, 0])[:, None], (bh, 16))
        cases.append((lay, tokens, torch.randn(tokens, lay.shape[1], generator=g),
                      torch.randn(lay.nnz, bh, 16, generator=g), torch.randn(lay.shape[0], generator=g)))
    for i, (lay, tokens, x, w, b) in enumerate(cases):
        idx, (out_f, in_f), (bh, bw) = lay.indices(), lay.shape, lay.block_shape
        has_bias = rng.random() < 0.5
        ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0)
        counts = torch.zeros(lay.grid[0], dtype=torch.int32)
        slots = tokens <= triton_sizing.DECODE_SLOT_TOKENS  # else fresh fp32 partials (NaN until written), counted
        for chunk in shares(int(lay.mask.sum(1).max()) if lay.nnz else 0, lay.nnz):
            programs = max(1, -(-lay.nnz // chunk))
            for flat in (True, False):
                y = torch.full((tokens, out_f), float("nan"))
                part = (torch.full((programs, tokens, bh), triton_sizing.SLOT_EMPTY, dtype=torch.int32) if slots
                        else torch.full((programs, tokens, bh), float("nan")))
                _decode_kernel[(programs,)](x, w, b, y, part, counts, idx.cols, idx.row_ptr, idx.rows, tokens, in_f, out_f,
                                            lay.nnz, chunk, BH=bh, BW=bw, HAS_BIAS=has_bias, PRECISION="ieee",
                                            BLOCK_K=triton_sizing.decode_block_k(bw), EARLY=0, OVERLAP=False,
                                            BLOCK_M=max(16, triton_sizing.pow2(tokens)), WAVES=1, FLAT=flat)
                launches += 1
                err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
                left = part.ne(triton_sizing.SLOT_EMPTY).sum().item() if slots else 0
                if not err <= 1e-4 * max(1.0, ref.abs().max().item()) or left or counts.any():
                    bad.append({"layout": i, "mask": lay.mask.int().tolist(), "block": [bh, bw], "tokens": tokens,
                                "chunk": chunk, "flat": flat, "err": err, "slots left": left,
                                "counts": counts.tolist()})
                    counts.zero_()
    return {"launches": launches, "bad": bad}


def uncut(seed: int, layouts: int) -> dict:
    from opforge.kernels.block_sparse import triton_sizing
    from opforge.kernels.block_sparse.triton_decode import _decode_uncut_kernel

    rng = random.Random(seed)
    bad, launches = [], 0
    for i in range(layouts):
        lay, tokens, x, w, b = _tiny(rng, [(16, 16), (32, 16), (64, 16), (16, 64)])
        idx, (out_f, in_f), (bh, bw), grid = lay.indices(), lay.shape, lay.block_shape, lay.grid
        sub = rng.choice([s for s in (16, 32, 64) if s <= bh])
        has_bias = rng.random() < 0.5
        ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if has_bias else 0)
        total = bh // sub * lay.nnz
        for chunk in shares(bh // sub * int(lay.mask.sum(1).max()) if lay.nnz else 0, total):
            programs = max(1, -(-total // chunk))
            y = torch.full((tokens, out_f), float("nan"))
            _decode_uncut_kernel[(programs,)](x, w, b, y, idx.cols, idx.row_ptr, tokens, in_f, out_f, total, chunk,
                                              BH=bh, BW=bw, SUB=sub, HAS_BIAS=has_bias, PRECISION="ieee",
                                              BLOCK_K=triton_sizing.decode_block_k(bw),
                                              SEARCH=triton_sizing.decode_search(grid[0]), OVERLAP=False,
                                              BLOCK_M=max(16, triton_sizing.pow2(tokens)), WAVES=1)
            launches += 1
            err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
            if not err <= 1e-4 * max(1.0, ref.abs().max().item()):
                bad.append({"layout": i, "mask": lay.mask.int().tolist(), "block": [bh, bw], "sub": sub,
                            "tokens": tokens, "chunk": chunk, "err": err})
    return {"launches": launches, "bad": bad}


if __name__ == "__main__":  # set before opforge's kernels (and triton) are imported; not at import (doctests)
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["OPFORGE_TRITON_DIRECT"] = "0"  # launches through triton's JIT, which interprets them
    what, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    print(json.dumps({"op": op, "decode": decode, "uncut": uncut}[what](*args)))
