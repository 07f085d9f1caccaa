"""What a family's benchmark provides: the kernel it loaded, its cases, the peers it lacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch

from ..model import Case, Missing, Options

#: The largest relative error opforge's output may have against the reference's, by dtype:
#: a few units in the last place of the dtype, over a sum of many terms.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
SHORT = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class Suite:
    """One kernel family's benchmark on one device. The constructor loads opforge's kernel
    (raising when it can't) and sets ``variant``; ``cases()`` yields the cases one at a
    time, so a case's tensors are freed before the next is made."""

    kind: ClassVar[str]
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def __init__(self, device: torch.device, options: Options):
        self.device = device
        self.options = options
        self.variant: str | None = None

    @property
    def quick(self) -> bool:
        return self.options.quick

    def missing(self) -> list[Missing]:
        """The peers that could not be timed here, and why."""
        return []

    def cases(self) -> Iterator[Case]:
        raise NotImplementedError


def numel_label(shape: tuple[int, ...]) -> str:
    """``8x64x64x64``."""
    return "x".join(str(s) for s in shape)


def elements(n: int) -> str:
    """``1M``, ``256K``, ``2.5M`` (powers of ten, as the sizes are given).

    >>> elements(1_000_000), elements(256_000), elements(2_500_000), elements(999)
    ('1M', '256K', '2.5M', '999')
    """
    for unit, div in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= div:
            v = n / div
            return f"{v:g}{unit}"
    return str(n)
