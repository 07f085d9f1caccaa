"""block_sparse's autograd node in C++ (``csrc/block_sparse_autograd.cpp``), for eager training.

A training step's host time is mostly Python around the launches: ``_Linear``'s call (an
``autograd.Function``), and in the backward a trip from the autograd engine's thread into the
interpreter. The C++ node does the same work with no Python between the op call and the
launches: each launch is replayed from C++ (``kernels/native_launch``, the triton kernel's
tables), and a launch not planned yet goes through the custom ops (``opforge::block_sparse_mm``
and friends, Python), which plan it for next time. A backward that builds a graph
(``create_graph``) calls the differentiable custom ops, so every order of gradient still works.

It needs torch's C++ autograd API, which has no stable ABI: an extension of its own (lean
headers, keyed by the torch version), built on first use, or prebuilt by ``OPFORGE_BUILD=block_sparse`` (a
companion of the kind: ``KernelLoader.register_companion``). Used for tensors on ``DEVICES``
(CUDA; tests add ``cpu``, where the custom ops run the torch reference), and anything else, or a
failed build (a warning, once), takes ``_Linear``, which computes the same.
"""

from __future__ import annotations

import threading

from ...notices import warn_once
from ...process import forgets
from ..native_launch.table import native_namespace
from .extensions import BlockSparseAutograd

DEVICES: tuple[str, ...] = ("cuda",)
"""The tensors' devices the node takes (tests add ``cpu``)."""

_OP: list = []  # [op] once loaded, [None] once it failed
_LOCK = threading.Lock()


def op():
    """``torch.ops.block_sparse_autograd.linear``'s overload, built and loaded on first use; None if
    that failed."""
    if not _OP:
        with _LOCK:
            if not _OP:
                try:
                    packet = BlockSparseAutograd().load().ops.linear
                    _OP.append(getattr(packet, "default", packet))
                except Exception as exc:  # noqa: BLE001 - any failure: the Python path is always there
                    warn_once(f"block_sparse: the C++ autograd node could not be built ({exc}); the backward "
                              f"stays in Python (the same results, more host time per step)")
                    _OP.append(None)
    return _OP[0]


def tables(kernel) -> tuple[list, str]:
    """The native_launch tables of ``kernel`` (the loaded implementation's ops) and the native ops'
    namespace, for the node's ``tables`` and ``native``: ``[0, 0, 0]`` and ``""`` where there are
    none (the torch reference; no native_launch ops), so every launch goes through the custom ops.
    Worked out once per kernel."""
    found = _TABLES.get(kernel)
    if found is None:
        fwd = getattr(kernel, "NATIVE_FORWARD", None)
        ns = native_namespace() if fwd is not None else ""
        found = ([fwd.id, kernel.NATIVE_INPUT_GRAD.id, kernel.NATIVE_WEIGHT_GRAD.id], ns) if ns else ([0, 0, 0], "")
        _TABLES[kernel] = found
    return found


_TABLES: dict = {}
forgets(_TABLES.clear)


__all__ = ["DEVICES", "BlockSparseAutograd", "op", "tables"]
