"""myops: one op, ``scale_add(x, y, alpha) = alpha * x + y``, on the best implementation opforge
finds for this machine: prebuilt C++, else built just in time, else pure torch."""

from __future__ import annotations

from .kernels import ScaleAddLoader


def scale_add(x, y, alpha: float = 1.0):
    """``alpha * x + y`` for float32 CPU tensors of one shape."""
    return ScaleAddLoader().load(device=x.device.type).scale_add(x, y, float(alpha))


__all__ = ["ScaleAddLoader", "scale_add"]
