"""TMA operands of a Triton launch, encoded once per (address, shape, strides, box).

A kernel that reads a tensor through the copy engine (TMA) takes a host-side
``TensorDescriptor``; triton's launcher then encodes it (``cuTensorMapEncodeTiled``) on every
call, in Python around its C launcher (``wrap_handle_tensordesc`` in triton's NVIDIA driver).
With two descriptors that cost a forward 10-17 µs of host time on the H100 (issue 21).

Here a caller names such an operand ``Described(tensor, box)``. ``RawLauncher`` takes a compiled
kernel's own C launcher (the one triton's wrapper calls) and hands it the encoded descriptors
itself, memoized: an encoded descriptor is a pure function of the tensor's address, shape,
strides and dtype and of the box and the kernel's swizzle, so the memo's key is exactly those,
and a hit gives the bytes a fresh encoding would. No stale descriptor can come of it: a tensor
freed and another allocated at the same address with the same shape and strides encodes to the
same descriptor, and anything else is another key.

``RawLauncher.of`` reads the C launcher and the kernel's descriptor metadata out of triton's
wrapper (triton 3.5-3.6's layout); where that layout isn't found (another triton, a kernel that
needs scratch memory) it returns None and launches take triton's own launcher, which builds the
``TensorDescriptor`` (``descriptor``) and encodes it per call: the same results.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .triton_compat import TensorDescriptor, triton


class Described(NamedTuple):
    """A tensor a kernel reads through a TMA descriptor with the given box (one side per dim).
    ``rows``: read the (contiguous) tensor as a 2-D ``(rows, numel // rows)`` matrix, as
    ``tensor.view(rows, -1)`` would, without making the view (a call's µs)."""

    tensor: torch.Tensor
    box: tuple
    rows: int = 0


def _dims(d: Described) -> tuple:
    t = d.tensor
    if d.rows:
        cols = t.numel() // d.rows
        return (d.rows, cols), (cols, 1)
    return tuple(t.shape), t.stride()


def descriptor(d: Described):
    """triton's host-side descriptor of ``d`` (triton's own launch path encodes it per call)."""
    shape, strides = _dims(d)
    return TensorDescriptor(d.tensor, list(shape), list(strides), list(d.box))


def described(args: tuple) -> tuple:
    """``args`` with each ``Described`` made a ``TensorDescriptor`` (for triton's launch path)."""
    return tuple(descriptor(a) if type(a) is Described else a for a in args)


_MEMO_MAX = 256


class RawLauncher:
    """A compiled kernel's C launcher, called with encoded descriptors (see the module's doc).
    ``launcher(grid, stream, prefix, tail)``: ``prefix`` may hold ``Described`` operands, in the
    positions of the kernel's descriptor parameters."""

    __slots__ = ("coop", "encode", "function", "memo", "metas", "packed", "pdl", "raw", "to_host")

    def __init__(self, raw, function, packed, coop, pdl, metas, encode, to_host):
        self.raw, self.function, self.packed, self.coop, self.pdl = raw, function, packed, coop, pdl
        self.metas, self.encode, self.to_host = metas, encode, to_host
        self.memo: dict = {}

    @classmethod
    def of(cls, compiled, prefix: tuple, encode=None, to_host=None) -> RawLauncher | None:
        """The raw launcher of ``compiled`` for launches shaped like ``prefix``, or None where
        triton's wrapper isn't laid out as this module expects. ``encode`` / ``to_host``:
        triton's ``fill_tma_descriptor`` and its dtype map unless given (tests)."""
        n = sum(1 for a in prefix if type(a) is Described)
        if n == 0 or (encode is None and triton is None):
            return None
        try:
            launcher = compiled.run
            if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
                return None  # the launcher would allocate scratch per call
            wrapper = launcher.launch
            env = dict(zip(wrapper.__code__.co_freevars, (c.cell_contents for c in wrapper.__closure__ or ())))
            raw, metas = env.get("launcher"), env.get("tensordesc_meta")
            if not callable(raw) or not isinstance(metas, (list, tuple)) or len(metas) != n:
                return None
            keys = ("swizzle", "elem_size", "elem_type", "block_size", "fp4_padded")
            if not all(isinstance(m, dict) and all(k in m for k in keys) and not m["fp4_padded"] for m in metas):
                return None
            if encode is None:
                from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as to_host

                encode = triton.runtime.driver.active.utils.fill_tma_descriptor
            return cls(raw, compiled.function, compiled.packed_metadata, launcher.launch_cooperative_grid,
                       launcher.launch_pdl, tuple(metas), encode, to_host)
        except Exception:  # noqa: BLE001 - any other layout: triton's own launcher
            return None

    def __call__(self, grid: tuple, stream: int, prefix: tuple, tail: tuple) -> None:
        args = []
        i = 0
        for a in prefix:
            if type(a) is Described:
                args.extend(self.encoded(a, i))
                i += 1
            else:
                args.append(a)
        self.raw(grid[0], grid[1], grid[2], stream, self.function, self.coop, self.pdl, None, None, self.packed,
                 None, None, None, *args, *tail)

    def encoded(self, d: Described, i: int) -> tuple:
        """(descriptor, *shape, *strides): what the C launcher takes for descriptor parameter ``i``."""
        t = d.tensor
        key = (t.data_ptr(), t.shape, t.stride(), t.dtype, d.box, d.rows, i)
        hit = self.memo.get(key)
        if hit is None:
            if len(self.memo) >= _MEMO_MAX:
                self.memo.clear()
            hit = self.memo[key] = self._encode(d, self.metas[i])
        return hit

    def _encode(self, d: Described, meta: dict) -> tuple:
        t = d.tensor
        shape, strides = (list(v) for v in _dims(d))
        if strides[-1] != 1 or t.data_ptr() % 16 or (d.rows and not t.is_contiguous()):
            raise ValueError(f"TMA operand of shape {shape}, strides {strides}: a descriptor needs a 16-byte "
                             f"aligned tensor with a contiguous last dim (the caller's plan should not have taken "
                             f"the TMA path)")
        # the box the kernel was compiled for may be narrower than the operand's (``box``): triton
        # splits a box wider than the swizzle into several copies, as its own launcher encodes it
        tmap = self.encode(t.data_ptr(), meta["swizzle"], meta["elem_size"], self.to_host[meta["elem_type"]],
                           meta["block_size"], shape, strides, 0)  # padding 0: zeros, TensorDescriptor's default
        return (tmap, *shape, *strides)


__all__ = ["Described", "RawLauncher", "described", "descriptor"]
