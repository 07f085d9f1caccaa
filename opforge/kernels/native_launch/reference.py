"""The native_launch contract, in Python: what ``csrc/native_launch.cpp`` does, except launch.

A *recipe* launches one call shape (the C++ file's header has the encoding):

* ``define(table, t0, t1, t2, t3, t4, t5, s0, s1, launch, outputs, program, held)`` keeps a recipe
  under the key of these inputs (``key_of``);
* ``call(table, t0, ..., t5, s0, s1) -> list[Tensor]``: the recipe's returned outputs, after
  its launch; ``[]`` when no recipe has this key (here: always, as this variant launches
  nothing, so the caller's Python path takes every call);
* ``pack(...) -> [params, launch, *outputs]``: a dry run, the parameter bytes the launch would
  pass (each at its alignment; a TMA or map slot holds its encoding's inputs), the launch's
  ``[function, gx, gy, gz, warps, shared]`` and the allocated outputs; ``[]`` on a miss;
* ``forget()`` drops every recipe; ``stats() -> [recipes, hits, misses]``.

The tests check the C++ variant's ``pack`` against this one byte for byte.
"""

from __future__ import annotations

import struct

import torch

PTR, INT, TMA, MAP, STRUCT = 0, 1, 3, 4, 5
INPUTS, OUT0, HELD0 = 6, 16, 32
MAP_BYTES, MAX_RECIPES = 128, 4096
_CODES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
          torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15}
DTYPES = {code: dtype for dtype, code in _CODES.items()}


def dtype_code(dtype: torch.dtype) -> int:
    """``dtype``'s ``c10::ScalarType`` value (what ``outputs`` name a dtype by)."""
    return _CODES[dtype]


def key_of(table: int, inputs, s0: int, s1: int) -> tuple:
    """What a recipe is keyed on (the C++ variant's ``key_of``, as a tuple)."""
    k = [table, s0, s1]
    for t in inputs:
        if t is None:
            k.append(-1)
            continue
        k += [_CODES.get(t.dtype, -2), int(t.is_cuda), t.device.index if t.device.index is not None else -1, t.dim()]
        for size, stride in zip(t.shape, t.stride()):
            k += [size, stride]
        k.append(t.data_ptr() % 16)
    if inputs[0].is_cuda:
        dev = torch.cuda.current_device()
        k += [dev if dev == inputs[0].device.index else -2 - dev, torch.cuda.current_stream(dev).cuda_stream]
    return tuple(k)


class _Recipe:
    def __init__(self, launch, outputs, program, held):
        if len(launch) not in (6, 7):
            raise RuntimeError("native_launch.define: launch must be [function, gx, gy, gz, warps, shared(, dependent)]")
        self.launch, self.held = [*launch, 0][:7], list(held)
        if self.launch[6] not in (0, 1):
            raise RuntimeError("native_launch.define: dependent must be 0 or 1")
        self.outputs = []
        i = 0
        while i < len(outputs):
            nd = outputs[i + 2]
            self.outputs.append((DTYPES[outputs[i]], bool(outputs[i + 1]), tuple(outputs[i + 3:i + 3 + nd])))
            i += 3 + nd
        self.slots = []
        i = 0
        while i < len(program):
            kind = program[i]
            if kind == PTR:
                self.slots.append((PTR, program[i + 1]))
                i += 2
            elif kind == INT:
                self.slots.append((INT, program[i + 1], program[i + 2]))
                i += 3
            elif kind == TMA:
                nd = program[i + 6]
                self.slots.append((TMA, *program[i + 1:i + 6], tuple(program[i + 7:i + 7 + nd])))
                i += 7 + nd
            elif kind == STRUCT:  # (STRUCT, fields, alignment: its widest field's)
                n, j, align = program[i + 1], i + 2, 1
                for f in range(n):
                    if j >= len(program) or program[j] not in (PTR, INT):
                        raise RuntimeError(f"native_launch.define: field {f} of the struct at {i} is not a pointer "
                                           f"or an integer slot")
                    align = max(align, 8 if program[j] == PTR else program[j + 1])
                    j += 2 if program[j] == PTR else 3
                self.slots.append((STRUCT, n, align))
                i += 2
            elif kind == MAP:
                nd = program[i + 6]
                if not (1 <= nd <= 5 and (program[i + 2] == 0 or nd == 2)):
                    raise RuntimeError(f"native_launch.define: a tensor map of rank {nd}")
                self.slots.append((MAP, *program[i + 1:i + 6], tuple(program[i + 7:i + 7 + nd])))
                i += 7 + nd
            else:
                raise RuntimeError(f"native_launch.define: a bad slot (kind {kind}) at {i}")


_RECIPES: dict = {}
_STATS = [0, 0]


def define(table, t0, t1, t2, t3, t4, t5, s0, s1, launch, outputs, program, held) -> None:
    if len(_RECIPES) >= MAX_RECIPES:
        _RECIPES.clear()
    _RECIPES[key_of(table, (t0, t1, t2, t3, t4, t5), s0, s1)] = _Recipe(launch, outputs, program, held)


def call(table, t0, t1, t2, t3, t4, t5, s0, s1) -> list:
    _STATS[1] += 1
    return []


def pack(table, t0, t1, t2, t3, t4, t5, s0, s1) -> list:
    r = _RECIPES.get(key_of(table, (t0, t1, t2, t3, t4, t5), s0, s1))
    if r is None:
        _STATS[1] += 1
        return []
    _STATS[0] += 1
    outs = [t0.new_empty(sizes, dtype=dtype) for dtype, _, sizes in r.outputs]
    src = dict(enumerate((t0, t1, t2, t3, t4, t5)))
    src.update({OUT0 + j: o for j, o in enumerate(outs)})
    src.update({HELD0 + h: t for h, t in enumerate(r.held)})
    buf = bytearray()

    def put(data: bytes, align: int):
        buf.extend(b"\0" * (-len(buf) % align))
        buf.extend(data)

    fields = [0, 1]  # of the struct being packed: (fields left, its alignment)
    for slot in r.slots:
        if slot[0] == STRUCT:
            put(b"", slot[2])
            fields[:] = slot[1], slot[2]
            continue
        if slot[0] == PTR:
            put(struct.pack("<Q", src[slot[1]].data_ptr()), 8)
        elif slot[0] == INT:
            width, value = slot[1], slot[2]
            put((value & ((1 << (8 * width)) - 1)).to_bytes(width, "little"), width)
        elif slot[0] == MAP:
            _, s, rows, swizzle, elem_size, elem_type, box = slot
            if s < 0:  # a map the kernel doesn't read: zeros
                put(bytes(MAP_BYTES), 128)
            else:
                put(_map(src[s], rows, swizzle, elem_size, elem_type, box), 128)
        else:
            _, s, rows, swizzle, elem_size, elem_type, box = slot
            put(_map(src[s], rows, swizzle, elem_size, elem_type, box), 128)
            dims, strides = tma_dims(src[s], rows, len(box))
            for d in dims:
                put(struct.pack("<i", d), 4)
            for st in strides:
                put(struct.pack("<q", st), 8)
        if fields[0]:
            fields[0] -= 1
            if not fields[0]:
                put(b"", fields[1])  # C's tail padding
    params = torch.tensor(list(buf), dtype=torch.uint8, device=t0.device)
    return [params, torch.tensor(r.launch, dtype=torch.int64, device=t0.device), *outs]


def _map(t: torch.Tensor, rows: int, swizzle, elem_size, elem_type, box) -> bytes:
    """A TMA or map slot's bytes in a dry run: its encoding's inputs."""
    dims, strides = tma_dims(t, rows, len(box))
    return struct.pack(f"<{MAP_BYTES // 8}Q", *_padded(encoding_inputs(t.data_ptr(), swizzle, elem_size, elem_type,
                                                                       dims, strides, box)))


def tma_dims(t: torch.Tensor, rows: int, nd: int) -> tuple[list, list]:
    """The dims (outermost first) and element strides a TMA slot reads ``t`` as: ``(rows, numel //
    rows)`` when ``rows``, else its own."""
    if rows:
        return [rows, t.numel() // rows], [t.numel() // rows, 1]
    if t.dim() != nd:
        raise RuntimeError(f"native_launch: a TMA slot of rank {nd} over a tensor of rank {t.dim()}")
    return list(t.shape), list(t.stride())


def encoding_inputs(address, swizzle, elem_size, elem_type, dims, strides, box) -> list:
    """What ``cuTensorMapEncodeTiled`` gets, as triton's ``fill_tma_descriptor`` computes it:
    [address, swizzle, elem_size, elem_type, dims..., byte strides..., box...], innermost first;
    the byte strides' last entry as triton fills it (the driver reads rank - 1 of them)."""
    nd = len(dims)
    gdim = dims[::-1]
    gstride = []
    for d in range(nd):
        gstride.append(strides[nd - 2 - d] * elem_size if d + 1 < nd
                       else gdim[d] * (elem_size if nd == 1 else gstride[d - 1]))
    return [address, swizzle, elem_size, elem_type, *gdim, *gstride, *box[::-1]]


def _padded(values: list) -> list:
    return (values + [0] * (MAP_BYTES // 8))[:MAP_BYTES // 8]


def forget() -> None:
    _RECIPES.clear()


def stats() -> list:
    return [len(_RECIPES), *_STATS]
