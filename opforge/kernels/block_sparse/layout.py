"""Which blocks of a weight are kept, and the indices the kernels walk them by.

A weight ``W`` of shape ``(out_features, in_features)`` is cut into blocks of ``block_shape =
(bh, bw)``: a grid of ``R = out_features / bh`` block-rows by ``C = in_features / bw``
block-columns. The layout is a boolean ``mask`` over that grid. The kept blocks are stored
compactly, in row-major order of the grid, as a ``(nnz, bh, bw)`` tensor; block ``k`` sits at
``(rows[k], cols[k])``.

The indices (all int64, built with torch ops, once per layout and device):

* ``rows``, ``cols``: the coordinates of each kept block (a coordinate list: the gradient
  wrt ``W`` is computed for exactly these blocks);
* ``row_ptr`` (``R + 1``): block-row ``r`` holds blocks ``row_ptr[r]:row_ptr[r + 1]`` (CSR:
  ``Y = X Wᵀ`` walks a block-row);
* ``col_ptr`` (``C + 1``) and ``col_order`` (``nnz``): block-column ``c`` holds blocks
  ``col_order[col_ptr[c]:col_ptr[c + 1]]`` (CSC, the transpose: ``dX = dY W`` walks a
  block-column).

>>> import torch
>>> lay = BlockSparseLayout(torch.tensor([[True, False], [True, True]]), (2, 3))
>>> lay.shape, lay.nnz, lay.density
((4, 6), 3, 0.75)
>>> idx = lay.indices()
>>> idx.rows.tolist(), idx.cols.tolist(), idx.row_ptr.tolist(), idx.col_ptr.tolist(), idx.col_order.tolist()
([0, 1, 1], [0, 0, 1], [0, 1, 3], [0, 2, 3], [0, 1, 2])
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import torch

BLOCK_SIZES = (16, 32, 64, 128)
"""The block sides the GPU kernels are tuned for; the torch path takes any."""


class Indices(NamedTuple):
    rows: torch.Tensor
    cols: torch.Tensor
    row_ptr: torch.Tensor
    col_ptr: torch.Tensor
    col_order: torch.Tensor


def check_block_shape(block_shape) -> tuple[int, int]:
    try:
        bh, bw = (int(v) for v in block_shape)
    except (TypeError, ValueError):
        raise ValueError(f"block_shape must be two positive ints (bh, bw), got {block_shape!r}") from None
    if bh < 1 or bw < 1:
        raise ValueError(f"block_shape must be two positive ints (bh, bw), got {block_shape!r}")
    return bh, bw


def check_divisible(out_features: int, in_features: int, block_shape: tuple[int, int]) -> None:
    bh, bw = block_shape
    if out_features % bh or in_features % bw:
        raise ValueError(f"a ({out_features}, {in_features}) weight does not split into blocks of {block_shape}: "
                         f"out_features must be a multiple of {bh} and in_features of {bw}; pick a block_shape "
                         f"that divides both (e.g. {_divisor_hint(out_features, in_features)})")


def _divisor_hint(out_features: int, in_features: int) -> str:
    g = math.gcd(out_features, in_features)
    sides = [s for s in (128, 64, 32, 16, 8) if g % s == 0]
    return f"({sides[0]}, {sides[0]})" if sides else f"({g}, {g})"


def check_density(density: float) -> float:
    d = float(density)
    if not 0.0 < d <= 1.0:  # also NaN
        raise ValueError(f"density must be in (0, 1] (the fraction of blocks kept), got {density!r}")
    return d


def blocks_for(density: float, grid: tuple[int, int]) -> int:
    """How many blocks ``density`` keeps of a grid: rounded, at least one."""
    return max(1, min(grid[0] * grid[1], round(density * grid[0] * grid[1])))


class BlockSparseLayout:
    """A block mask over a ``(out_features, in_features)`` weight, and its kernel indices."""

    def __init__(self, mask: torch.Tensor, block_shape: tuple[int, int]):
        if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
            raise ValueError(f"mask must be a 2-D tensor over the block grid (out_features/bh, in_features/bw), "
                             f"got {mask if not isinstance(mask, torch.Tensor) else list(mask.shape)}")
        self.block_shape = check_block_shape(block_shape)
        self.mask = mask.detach().to(device="cpu", dtype=torch.bool).contiguous()
        # Built now, on the CPU: under torch.compile, reading the mask's values would be data-dependent.
        cpu = self._build()
        self._nnz = int(cpu.rows.numel())
        self.signature = (self.shape, self.block_shape, self._nnz)
        """What a check of arguments against this layout depends on (``ops.block_sparse``)."""
        self._indices: dict[torch.device, Indices] = {torch.device("cpu"): cpu}
        self._lock = threading.Lock()

    # -- constructors --

    @classmethod
    def random(cls, out_features: int, in_features: int, density: float, block_shape=(32, 32),
               generator: torch.Generator | None = None) -> BlockSparseLayout:
        """``density`` of the blocks, chosen uniformly at random (at least one)."""
        bs = check_block_shape(block_shape)
        check_divisible(out_features, in_features, bs)
        grid = (out_features // bs[0], in_features // bs[1])
        keep = torch.randperm(grid[0] * grid[1], generator=generator)[:blocks_for(check_density(density), grid)]
        mask = torch.zeros(grid[0] * grid[1], dtype=torch.bool)
        mask[keep] = True
        return cls(mask.view(grid), bs)

    @classmethod
    def by_magnitude(cls, weight: torch.Tensor, density: float, block_shape=(32, 32)) -> BlockSparseLayout:
        """The ``density`` of blocks of ``weight`` with the largest Frobenius norm (ties: the
        first in row-major order)."""
        bs = check_block_shape(block_shape)
        if weight.ndim != 2:
            raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {list(weight.shape)}")
        check_divisible(weight.shape[0], weight.shape[1], bs)
        norms = block_view(weight.detach().to(torch.float64), bs).pow(2).sum(dim=(2, 3))
        grid = tuple(norms.shape)
        order = torch.sort(norms.flatten().cpu(), descending=True, stable=True).indices
        mask = torch.zeros(grid[0] * grid[1], dtype=torch.bool)
        mask[order[:blocks_for(check_density(density), grid)]] = True
        return cls(mask.view(grid), bs)

    # -- facts --

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.mask.shape)

    @property
    def shape(self) -> tuple[int, int]:
        """The dense weight's ``(out_features, in_features)``."""
        return self.grid[0] * self.block_shape[0], self.grid[1] * self.block_shape[1]

    @property
    def nnz(self) -> int:
        return self._nnz

    @property
    def density(self) -> float:
        return self.nnz / max(1, self.mask.numel())

    def __eq__(self, other) -> bool:
        return (isinstance(other, BlockSparseLayout) and self.block_shape == other.block_shape
                and torch.equal(self.mask, other.mask))

    __hash__ = None  # mutable tensors inside

    def __getstate__(self) -> dict:
        """Pickling and ``copy.deepcopy`` (``torch.save(model)``, an EMA copy of a model): all but
        the lock."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"BlockSparseLayout(shape={self.shape}, block_shape={self.block_shape}, nnz={self.nnz}/"
                f"{self.mask.numel()}, density={self.density:.3f})")

    # -- indices --

    def indices(self, device: torch.device | str = "cpu") -> Indices:
        """The kernels' indices on ``device``, built once per device."""
        if type(device) is torch.device:  # a tensor's .device (every call's path): no new device object
            found = self._indices.get(device)
            if found is not None:
                return found
        device = torch.device(device)
        found = self._indices.get(device)
        if found is None and torch.compiler.is_compiling():
            # traced (no lock there): a copy in the graph; BlockSparseLinear builds them when it moves
            return Indices(*(t.to(device) for t in self._indices[torch.device("cpu")]))
        if found is None:
            with self._lock:
                found = self._indices.get(device)
                if found is None:
                    cpu = self._indices[torch.device("cpu")]
                    found = self._indices[device] = Indices(*(t.to(device) for t in cpu))
        return found

    def _build(self) -> Indices:
        rows, cols = self.mask.nonzero(as_tuple=True)  # row-major order
        grid_r, grid_c = self.grid
        row_ptr = torch.zeros(grid_r + 1, dtype=torch.int64)
        row_ptr[1:] = torch.bincount(rows, minlength=grid_r).cumsum(0)
        col_order = torch.sort(cols, stable=True).indices  # by column, then row
        col_ptr = torch.zeros(grid_c + 1, dtype=torch.int64)
        col_ptr[1:] = torch.bincount(cols, minlength=grid_c).cumsum(0)
        return Indices(*(t.to(torch.int64).contiguous() for t in (rows, cols, row_ptr, col_ptr, col_order)))

    # -- dense views --

    def dense_mask(self) -> torch.Tensor:
        """The element mask of the dense weight, ``(out_features, in_features)``."""
        bh, bw = self.block_shape
        return self.mask.repeat_interleave(bh, 0).repeat_interleave(bw, 1)

    def gather(self, weight: torch.Tensor) -> torch.Tensor:
        """The kept blocks of a dense ``weight``, ``(nnz, bh, bw)``, in the layout's order."""
        if tuple(weight.shape) != self.shape:
            raise ValueError(f"weight has shape {list(weight.shape)}, the layout {list(self.shape)}")
        idx = self.indices(weight.device)
        return block_view(weight, self.block_shape)[idx.rows, idx.cols].contiguous()

    def scatter(self, blocks: torch.Tensor) -> torch.Tensor:
        """The dense ``(out_features, in_features)`` weight of ``blocks`` (zeros elsewhere)."""
        bh, bw = self.block_shape
        if tuple(blocks.shape) != (self.nnz, bh, bw):
            raise ValueError(f"blocks have shape {list(blocks.shape)}, the layout needs {[self.nnz, bh, bw]}")
        idx = self.indices(blocks.device)
        out = blocks.new_zeros(self.grid[0], self.grid[1], bh, bw)
        out[idx.rows, idx.cols] = blocks
        return out.permute(0, 2, 1, 3).reshape(self.shape)


def block_view(weight: torch.Tensor, block_shape: tuple[int, int]) -> torch.Tensor:
    """``weight`` (out, in) as ``(R, C, bh, bw)`` (a view when it can be)."""
    bh, bw = block_shape
    r, c = weight.shape[0] // bh, weight.shape[1] // bw
    return weight.reshape(r, bh, c, bw).permute(0, 2, 1, 3)


__all__ = ["BLOCK_SIZES", "BlockSparseLayout", "Indices", "block_view", "blocks_for", "check_block_shape",
           "check_density", "check_divisible"]
