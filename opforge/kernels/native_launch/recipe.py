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
    held: list = []
    program: list = []

    def src(t) -> int:
        for k, a in enumerate(inputs):
            if a is t:
                return k
        for j, (o, _) in enumerate(outputs):
            if o is t:
                return reference.OUT0 + j
        for h, a in enumerate(held):
            if a is t:
                return reference.HELD0 + h
        held.append(t)
        return reference.HELD0 + len(held) - 1

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
    if len(held) > 16:
        return f"{len(held)} held tensors; at most 16"
    outs = []
    for o, returned in outputs:
        outs += [reference.dtype_code(o.dtype), int(bool(returned)), o.dim(), *o.shape]
    g = (*grid, 1, 1)[:3]
    dependent = int(bool(getattr(launcher, "launch_pdl", False)))  # a programmatic dependent (launch_pdl)
    return Recipe([function, *g, int(meta.num_warps), int(meta.shared), dependent], outs, program, held)
