"""bias_act's autograd node in C++ (``csrc/bias_act_autograd.cpp``), for the eager path.

A small call's forward + backward is mostly host time, and most of that is Python: the
autograd.Function's call, and in the backward a trip from the autograd engine's thread into
the interpreter and through the adapter (``compiled.py``). The C++ node does the same work
(the forward kernel, then dx and db in one backward kernel) without Python after the op call;
a backward that builds a graph (``create_graph``) goes through the differentiable custom op
``opforge::bias_act_backward``, so second derivatives still work.

It needs torch's C++ autograd API, which has no stable ABI: it is an extension of its own
(lean headers, keyed by the torch version), built on first use beside the kernel variant, or prebuilt
by ``OPFORGE_BUILD=bias_act`` (a companion of the kind). It
is used for the variants in ``DEVICES`` (CUDA: its build is seconds next to the CUDA variant's;
a CPU build would add ~15 s to a cold start that is otherwise ~3 s), and only for calls it
covers (``covers``); anything else, or a failed build (a warning, once), takes the Python
autograd.Function, which computes the same.
"""

from __future__ import annotations

import threading

import torch

from ...notices import warn_once
from .activations import Activation
from .compiled import INDEX, KERNEL_DTYPES, REF_CODE, Compiled
from .extensions import BiasActAutograd
from .layout import clamp_as_stored

DEVICES: tuple[str, ...] = ("cuda",)
"""The variants' backends the node drives (``Compiled.kernel.backend``); tests add ``cpp``."""

_OP: list = []  # [op] once loaded, [None] once it failed
_LOCK = threading.Lock()


def op():
    """``torch.ops.bias_act_autograd.bias_act``, built and loaded on first use; None if that failed."""
    if not _OP:
        with _LOCK:
            if not _OP:
                try:
                    _OP.append(BiasActAutograd().load().ops.bias_act)
                except Exception as exc:  # noqa: BLE001 - any failure: the Python path is always there
                    warn_once(f"bias_act: the C++ autograd node could not be built ({exc}); bias_act's "
                              f"backward stays in Python (the same results, more host time per call)")
                    _OP.append(None)
    return _OP[0]


def covers(impl, x: torch.Tensor, b: torch.Tensor | None, gain: float) -> bool:
    """Whether the node takes this call: a compiled variant it drives, x of a kernel dtype with
    elements, b none or read by the kernel as it is (the C++ variants read fp32 only), gain != 0
    (the contract sends a zero gain to the reference)."""
    if type(impl) is not Compiled or impl.kernel.backend not in DEVICES:
        return False
    if x.dtype not in KERNEL_DTYPES or x.numel() == 0 or gain == 0:
        return False
    if b is None:
        return True
    return b.is_contiguous() and (b.dtype in KERNEL_DTYPES if impl.any_bias_dtype else b.dtype == torch.float32)


def call(node, impl, x: torch.Tensor, b: torch.Tensor | None, dim: int, spec: Activation, alpha: float,
         gain: float, clamp: float | None) -> torch.Tensor:
    ref = spec.ref_for(alpha, clamp)
    clamp_ref = clamp_as_stored(clamp, x.dtype) if ref == "y" else -1.0
    return node(x, b, dim, INDEX[spec.name], REF_CODE[ref], alpha, gain, -1.0 if clamp is None else clamp,
                clamp_ref, spec.name, impl.name)


__all__ = ["DEVICES", "BiasActAutograd", "call", "covers", "op"]
