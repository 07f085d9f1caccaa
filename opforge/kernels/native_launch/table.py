"""``NativeTable``: one launch family's recipes in the native_launch ops, for the Python code that
plans its launches (``kernels/block_sparse/triton_impl.py``).

    table = NativeTable("block_sparse.fwd")
    got = table.call(x, w, bias, cols, row_ptr, out_features, flag) if table.call else None
    if got: return got[0]                   # launched from C++
    ... plan and launch in Python ...
    table.define(recipe_of(plan.compiled, plan.grid, args, inputs, outputs), inputs, scalars)

``call`` is None until a recipe has been defined, and stays None where the C++ variant can't be
had (no compiler, ``OPFORGE_NATIVE_LAUNCH=0``, a failed build): ``reason`` says why, ``wanted``
turns False, and the family keeps launching from Python. A caller defines a recipe after each
call the table missed (a new shape, stream or alignment), so misses don't repeat. It is the op's own boxed entry point bound to the table's
id, so a call costs one op dispatch.
"""

from __future__ import annotations

import functools
import itertools
import threading

from ... import settings
from .recipe import Recipe

_IDS = itertools.count(1)
_LOCK = threading.Lock()
_OPS: list = []  # [ops or None, reason]


def native_ops():
    """The C++ variant's ops, or None (and why not)."""
    if _OPS:  # decided: no lock (callers ask on every training step)
        return _OPS[0], _OPS[1]
    with _LOCK:
        if not _OPS:
            _OPS.extend(_load())
    return _OPS[0], _OPS[1]


def native_namespace() -> str:
    """The ``torch.ops`` namespace of the C++ variant's ops (what C++ callers name them by), or ""."""
    ops, _ = native_ops()
    return getattr(ops, "name", "") if ops is not None else ""


def _load() -> tuple:
    if not settings.current().native_launch:
        return None, "OPFORGE_NATIVE_LAUNCH=0"
    from .loader import NativeLaunchLoader

    try:
        kernel = NativeLaunchLoader().load()
    except Exception as exc:  # noqa: BLE001 - no native launch: the Python path launches
        return None, f"the native_launch ops could not be loaded: {exc}"
    if kernel.backend != "cpp":
        return None, f"the loader chose {kernel.name}, which launches nothing"
    return kernel.ops, ""


def _boxed(overload):
    """The op's C++ entry point (``OpOverload._op``: no Python frame per call); the overload itself
    if that private attribute is gone."""
    return getattr(overload, "_op", overload)


class NativeTable:
    __slots__ = ("call", "defined", "id", "name", "reason", "wanted")

    def __init__(self, name: str):
        self.name, self.id = name, next(_IDS)
        self.call = None
        self.reason = "no recipe defined yet"
        self.defined = 0
        self.wanted = True  # False once the C++ variant turned out not to be had: stop asking

    def define(self, recipe: Recipe | str, inputs: tuple, scalars: tuple) -> bool:
        """Define ``recipe`` (``recipe_of`` or ``recipe_of_function`` of a launch just made; a string:
        why it has none) under the key of ``inputs`` (six tensors or None) and ``scalars`` (two
        ints); True if it was."""
        ops, why = native_ops()
        if ops is None:
            self.reason, self.wanted = why, False
            return False
        if isinstance(recipe, str):
            self.reason = recipe
            return False
        ops.define(self.id, *inputs, *scalars, recipe.launch, recipe.outputs, recipe.program, recipe.held)
        self.defined += 1
        if self.call is None:
            self.call = functools.partial(_boxed(ops.call.default), self.id)
        return True

    def forget(self) -> None:
        """Launch from Python again until the next ``define`` (every table's recipes are dropped:
        they share the ops' one map)."""
        self.call = None
        self.reason = "no recipe defined yet"
        self.defined = 0
        ops, _ = native_ops() if _OPS else (None, "")
        if ops is not None:
            ops.forget()

    def pack(self, inputs: tuple, scalars: tuple) -> list:
        """A dry run of ``call`` (tests)."""
        ops, why = native_ops()
        if ops is None:
            raise RuntimeError(why)
        return ops.pack(self.id, *inputs, *scalars)
