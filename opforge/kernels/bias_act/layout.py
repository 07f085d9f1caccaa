"""How bias_act's compiled and Triton kernels see a tensor: its storage as one flat array.

A kernel reads and writes every tensor of a call through the same flat index ``k`` (from the
data pointer, ``numel`` elements), so the tensors of a call must share strides and be dense
(non-overlapping, no gaps). The channel of element ``k`` is ``(k // inner) % channels``:
in a dense tensor, ``inner`` is the stride of ``dim`` (the elements between two neighbouring
channels in storage order), whatever the layout (contiguous, channels_last, any permutation).

``conform`` brings the tensors of a call to one layout, copying only the ones that differ;
the output is always ``torch.empty_like`` of its source, as the fake implementations say.

>>> x = torch.zeros(2, 5, 3, 4).contiguous(memory_format=torch.channels_last)
>>> geometry(x, 1, True)
Geometry(numel=120, channels=5, inner=1)
>>> geometry(x.contiguous(), 1, True)
Geometry(numel=120, channels=5, inner=12)
>>> geometry(x, 1, False)
Geometry(numel=120, channels=1, inner=1)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch


class Geometry(NamedTuple):
    """A tuple, not a frozen dataclass: it is made on every call, and a tuple costs a fraction."""

    numel: int
    channels: int
    """The bias's length; 1 without a bias (or when ``x.shape[dim]`` is 1)."""
    inner: int
    """Storage elements per run of one channel: element ``k``'s channel is ``(k // inner) % channels``."""

    @property
    def rows(self) -> int:
        """Runs of one channel (``numel // inner``); run ``r`` has channel ``r % channels``."""
        return self.numel // self.inner if self.inner else 0


def geometry(t: torch.Tensor, dim: int, has_b: bool) -> Geometry:
    """The flat view of ``t`` (dense, see ``conform``) for a bias along ``dim``."""
    n = t.numel()
    if not has_b or n == 0 or t.shape[dim] == 1:
        return Geometry(n, 1, 1)
    return Geometry(n, t.shape[dim], t.stride(dim))


def conform(t: torch.Tensor, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` with ``like``'s strides (``like`` is dense: a ``torch.empty_like``) and ``dtype``
    (default ``like``'s); ``t`` itself when it already is, else a copy."""
    dtype = dtype or like.dtype
    if t.stride() == like.stride() and t.dtype == dtype and t.storage_offset() >= 0:
        return t
    return torch.empty_like(like, dtype=dtype).copy_(t)


def flat(t: torch.Tensor) -> torch.Tensor:
    """The storage of a dense ``t`` as a 1-D view, in storage order."""
    return t.as_strided((t.numel(),), (1,))


def bias32(b: torch.Tensor | None) -> torch.Tensor | None:
    """The bias as the kernels read it: fp32, contiguous."""
    if b is None or (b.dtype == torch.float32 and b.is_contiguous()):
        return b
    return b.to(torch.float32).contiguous()


@functools.lru_cache(maxsize=256)
def clamp_as_stored(clamp: float | None, dtype: torch.dtype) -> float:
    """The clamp as a value of ``dtype`` (what a clamped ``y`` holds), as a float; -1 for none.
    The backward from ``y`` compares ``|y|`` with it to find the clamped elements."""
    if clamp is None:
        return -1.0
    return float(torch.tensor(clamp, dtype=torch.float64).to(dtype).to(torch.float64))


__all__ = ["Geometry", "bias32", "clamp_as_stored", "conform", "flat", "geometry"]
