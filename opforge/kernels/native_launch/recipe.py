"""A launch's recipe for the native_launch ops, worked out from a launch made in Python.

``recipe_of(compiled, grid, args, inputs, outputs)`` reads a Triton ``CompiledKernel`` (its
function, warps, shared memory, parameter types and TMA metadata) and the arguments of one of
its launches (``args``: every parameter in order, ``Described`` for TMA operands) and says how
to make the same launch from the C++ ops: which input, output or held tensor each pointer
parameter is, each integer's width and value, each TMA operand's encoding. The parameter list
is the one triton's own launcher passes (``make_launcher`` in triton's NVIDIA driver, 3.5-3.6):
constexprs dropped, a TMA operand expanded to its descriptor, its int32 sizes and int64 strides,
then the global and profile scratch pointers, null since the kernel needs none. A kernel compiled
with ``launch_pdl`` is launched as triton's launcher does it, as a programmatic dependent. A kernel
or launch this doesn't cover (scratch memory, clusters, cooperative grids, float arguments, another
triton) gets the reason instead, and stays on the Python path.

``recipe_of_function(function, grid, threads, shared, dependent, params, inputs, outputs)`` does the
same for a CUDA C++ kernel, whose extension knows its function and launch (the block-sparse CUDA
decode kernel's ``describe`` op): ``params`` lists its parameters, a tensor for its data pointer,
None for a null pointer, ``Int`` for an integer, ``Struct`` for a struct passed by value and
``Map`` for a ``__grid_constant__ CUtensorMap``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..triton_tma import Described
from . import reference

INT_WIDTH = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u1": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8}


class Recipe(NamedTuple):
    launch: list
    outputs: list
    program: list
    held: list


class Int(NamedTuple):
    """An integer parameter of ``width`` bytes."""

    value: int
    width: int = 4


class Struct(NamedTuple):
    """A struct parameter passed by value: its fields in order, tensors (pointers), None (null) or
    ``Int``, laid out as C lays them out."""

    fields: tuple


class Map(NamedTuple):
    """A ``CUtensorMap`` parameter: ``tensor`` (float16, bfloat16 or float32) by its sizes and strides, or
    as ``(rows, numel // rows)`` when ``rows`` (contiguous; box of rank 2), read in boxes of ``box``
    (outermost first) in ``swizzle`` (``CUtensorMapSwizzle``: 0 none, 3 the 128-byte one); None: 128 zero
    bytes (unread)."""

    tensor: torch.Tensor | None
    box: tuple
    rows: int = 0
    swizzle: int = 0


MAP_TYPES = {torch.float16: 6, torch.float32: 7, torch.bfloat16: 9}
"""``CUtensorMapDataType``'s values (cuda.h)."""


class _Sources:
    """Where a recipe's pointer slots take their tensors from: the op's inputs (t0..t5), its outputs
    (``(tensor, returned)``, allocated per call), or else tensors the recipe holds."""

    def __init__(self, inputs: tuple, outputs: list):
        self.inputs, self.outputs, self.held = inputs, outputs, []

    def __call__(self, t) -> int:
        for k, a in enumerate(self.inputs):
            if a is t:
                return k
        for j, (o, _) in enumerate(self.outputs):
            if o is t:
                return reference.OUT0 + j
        for h, a in enumerate(self.held):
            if a is t:
                return reference.HELD0 + h
        self.held.append(t)
        return reference.HELD0 + len(self.held) - 1

    def finish(self, launch: list, program: list) -> Recipe | str:
        if len(self.held) > 16:
            return f"{len(self.held)} held tensors; at most 16"
        outs = []
        for o, returned in self.outputs:
            outs += [reference.dtype_code(o.dtype), int(bool(returned)), o.dim(), *o.shape]
        return Recipe(launch, outs, program, self.held)


def recipe_of_function(function: int, grid: tuple, threads: int, shared: int, dependent: bool, params,
                       inputs: tuple, outputs: list) -> Recipe | str:
    """The recipe of launching a CUDA C++ kernel (``function``: its ``CUfunction``) over ``grid`` with
    ``threads`` a block (a whole number of warps) and ``shared`` dynamic bytes, as a programmatic
    dependent or not, with ``params``; its tensors among ``inputs`` and ``outputs`` as ``recipe_of``'s,
    or else held. Or why there is none."""
    if not function or threads <= 0 or threads % 32:
        return f"no function ({function}) or {threads} threads, not whole warps"
    src = _Sources(inputs, outputs)

    def scalar(a) -> list | str:
        if isinstance(a, torch.Tensor):
            return [reference.PTR, src(a)]
        if a is None:
            return [reference.INT, 8, 0]
        if type(a) is Int and a.width in (1, 2, 4, 8):
            return [reference.INT, a.width, int(a.value)]
        return f"a parameter given {type(a).__name__}"

    program: list = []
    for a in params:
        if type(a) is Struct:
            fields = [scalar(f) for f in a.fields]
            bad = next((f for f in fields if isinstance(f, str)), None)
            if bad or not fields:
                return f"a struct's field: {bad or 'none'}"
            program += [reference.STRUCT, len(fields)] + [v for f in fields for v in f]
        elif type(a) is Map:
            if a.tensor is not None and a.tensor.dtype not in MAP_TYPES:
                return f"a tensor map of {a.tensor.dtype}"
            t = a.tensor
            program += [reference.MAP, -1 if t is None else src(t), a.rows, a.swizzle,
                        0 if t is None else t.element_size(), 0 if t is None else MAP_TYPES[t.dtype], len(a.box), *a.box]
        else:
            got = scalar(a)
            if isinstance(got, str):
                return got
            program += got
    g = (*grid, 1, 1)[:3]
    return src.finish([int(function), *g, threads // 32, int(shared), int(bool(dependent))], program)


def recipe_of(compiled, grid: tuple, args: tuple, inputs: tuple, outputs: list, to_host=None) -> Recipe | str:
    """The recipe of launching ``compiled`` over ``grid`` with ``args``, whose tensors are among
    ``inputs`` (the op's t0..t5), ``outputs`` (``(tensor, returned)``, allocated per call) or
    else held by the recipe; or why there is none. ``to_host``: triton's map from a TMA
    operand's device dtype to the driver's (``TMA_DTYPE_DEVICE_TO_HOST``) unless given (tests)."""
    try:
        meta, launcher = compiled.metadata, compiled.run
        signature = list(compiled.src.signature.values())
        function = int(compiled.function)
    except (AttributeError, TypeError) as exc:
        return f"not a compiled triton kernel of the known layout ({exc})"
    for attr, want in (("num_ctas", 1), ("global_scratch_size", 0), ("profile_scratch_size", 0),
                       ("launch_cooperative_grid", False)):
        got = getattr(meta if attr == "num_ctas" else launcher, attr, None)
        if got != want:
            return f"{attr} is {got!r}, the native launch handles {want!r} only"
    if len(signature) != len(args):
        return f"{len(signature)} parameters but {len(args)} arguments"
    descs = list(getattr(meta, "tensordesc_meta", None) or ())
    src = _Sources(inputs, outputs)
    program: list = []

    for ty, a in zip(signature, args):
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            if not isinstance(a, torch.Tensor):
                return f"a pointer parameter given {type(a).__name__}"
            program += [reference.PTR, src(a)]
        elif ty in INT_WIDTH:
            if type(a) not in (int, bool):
                return f"an {ty} parameter given {type(a).__name__}"
            program += [reference.INT, INT_WIDTH[ty], int(a)]
        elif ty.startswith("tensordesc"):
            if type(a) is not Described or not descs:
                return "a TMA parameter without its descriptor metadata"
            m = descs.pop(0)
            if m.get("fp4_padded"):
                return "an fp4 TMA operand"
            if to_host is None:
                from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as to_host
            box = list(m["block_size"])
            program += [reference.TMA, src(a.tensor), a.rows, m["swizzle"], m["elem_size"], to_host[m["elem_type"]],
                        len(box), *box]
        else:
            return f"a parameter of type {ty}"
    program += [reference.INT, 8, 0, reference.INT, 8, 0]  # the global and profile scratch: none
    g = (*grid, 1, 1)[:3]
    dependent = int(bool(getattr(launcher, "launch_pdl", False)))  # a programmatic dependent (launch_pdl)
    return src.finish([function, *g, int(meta.num_warps), int(meta.shared), dependent], program)
