"""``BlockSparseLinear``: a drop-in for ``nn.Linear`` whose weight is block-sparse, and
``sparsify``, which swaps a model's ``nn.Linear`` layers for it.

The module keeps the kept blocks (``weight_blocks``, ``(nnz, bh, bw)``) as its parameter, the
block mask (``layout_mask``, ``(out/bh, in/bw)`` bool) as a buffer of its state_dict, and
rebuilds the layout from the mask when a state_dict with another mask is loaded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import nn

from ..kernels.block_sparse.layout import BlockSparseLayout, check_block_shape, check_density, check_divisible
from ..ops.block_sparse import block_sparse_linear


class BlockSparseLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` of shape ``(out_features, in_features)`` block-sparse.

    ``density``: the fraction of ``block_shape`` blocks kept, chosen at random (at least one);
    or give ``layout`` (a ``BlockSparseLayout``) to choose them. Initialised as ``nn.Linear``
    would be for the fan-in a row actually has (its kept blocks' columns).

    >>> import torch
    >>> m = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16))
    >>> m(torch.randn(3, 5, 64)).shape
    torch.Size([3, 5, 32])
    >>> m.layout.nnz, m.weight_blocks.shape
    (4, torch.Size([4, 16, 16]))
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, density: float = 0.5,
                 block_shape=(32, 32), layout: BlockSparseLayout | None = None, device=None, dtype=None,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        if layout is None:
            layout = BlockSparseLayout.random(self.out_features, self.in_features, density, block_shape, generator)
        elif not isinstance(layout, BlockSparseLayout):
            raise TypeError(f"layout must be a BlockSparseLayout or None, got {type(layout).__name__}")
        elif layout.shape != (self.out_features, self.in_features):
            raise ValueError(f"the layout is for a {layout.shape} weight, this layer's is "
                             f"{(self.out_features, self.in_features)} (out_features, in_features): build the "
                             f"layout for that shape")
        self._layout = layout
        kw = {"device": device, "dtype": dtype}
        self.register_buffer("layout_mask", layout.mask.to(device=device))
        self.weight_blocks = nn.Parameter(torch.empty(layout.nnz, *layout.block_shape, **kw))
        self.bias = nn.Parameter(torch.empty(self.out_features, **kw)) if bias else None
        self.reset_parameters(generator)
        layout.indices(self.weight_blocks.device)

    @property
    def layout(self) -> BlockSparseLayout:
        return self._layout

    @property
    def block_shape(self) -> tuple[int, int]:
        return self._layout.block_shape

    def fan_in(self) -> float:
        """The mean number of inputs an output row reads (kept blocks per block-row × bw)."""
        return max(1.0, self._layout.nnz * self.block_shape[1] / max(1, self._layout.grid[0]))

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        bound = 1.0 / math.sqrt(self.fan_in())  # nn.Linear's kaiming_uniform(a=sqrt(5)) and bias bound
        with torch.no_grad():
            self.weight_blocks.uniform_(-bound, bound, generator=generator)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return block_sparse_linear(x, self.weight_blocks, self.bias, self._layout)

    def _apply(self, fn, *args, **kwargs):
        """``.to()``, ``.cuda()``, ...: the layout's indices are built on the new device now, not in
        the first call (which may be traced by torch.compile)."""
        out = super()._apply(fn, *args, **kwargs)
        self._layout.indices(self.weight_blocks.device)
        return out

    # -- conversions --

    @classmethod
    def from_dense(cls, linear: nn.Linear, density: float = 0.5, block_shape=(32, 32),
                   method: str = "magnitude") -> BlockSparseLinear:
        """The blocks of ``linear.weight`` with the largest norm (``method="magnitude"``), their
        values kept as they are: at ``density=1.0`` the layer computes what ``linear`` does."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_dense takes an nn.Linear, got {type(linear).__name__}")
        if method != "magnitude":
            raise ValueError(f"method must be 'magnitude' (keep the blocks of largest norm), got {method!r}")
        w = linear.weight.detach()
        layout = BlockSparseLayout.by_magnitude(w, density, block_shape)
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, layout=layout,
                device=w.device, dtype=w.dtype)
        with torch.no_grad():
            m.weight_blocks.copy_(layout.gather(w))
            if linear.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def to_dense(self) -> torch.Tensor:
        """The dense ``(out_features, in_features)`` weight (zeros outside the kept blocks); it
        carries the gradient back to ``weight_blocks``."""
        return self._layout.scatter(self.weight_blocks)

    # -- state_dict: the mask travels with the weights --

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        mask = state_dict.get(prefix + "layout_mask")
        if mask is not None and not torch.equal(mask.cpu().bool(), self._layout.mask):
            if tuple(mask.shape) != self._layout.grid:
                error_msgs.append(f"{prefix}layout_mask has shape {list(mask.shape)}, this layer's block grid is "
                                  f"{list(self._layout.grid)}: the state_dict is from a layer of another shape or "
                                  f"block_shape")
                return
            self._layout = BlockSparseLayout(mask, self.block_shape)
            self._layout.indices(self.weight_blocks.device)
            self.layout_mask = self._layout.mask.to(self.layout_mask.device)
            self.weight_blocks = nn.Parameter(self.weight_blocks.new_empty(self._layout.nnz, *self.block_shape),
                                              requires_grad=self.weight_blocks.requires_grad)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"block_shape={self.block_shape}, density={self._layout.density:.3f}")


# -- sparsify --

@dataclass(frozen=True)
class Change:
    name: str
    in_features: int
    out_features: int
    density: float
    """Kept blocks / all blocks (the asked density, rounded to whole blocks)."""
    replaced: bool
    reason: str = ""


class SparsifyReport(list):
    """What ``sparsify`` did, one ``Change`` per matching ``nn.Linear``."""

    def __str__(self) -> str:
        if not self:
            return "sparsify: no nn.Linear matched"
        lines = []
        for c in self:
            what = f"density {c.density:.3f}" if c.replaced else f"kept dense: {c.reason}"
            lines.append(f"  {c.name}: {c.in_features} -> {c.out_features}, {what}")
        done = sum(c.replaced for c in self)
        return f"sparsify: {done} of {len(self)} matching layers replaced\n" + "\n".join(lines)


def sparsify(model: nn.Module, patterns: dict[str, float], block_shape=(32, 32),
             method: str = "magnitude") -> SparsifyReport:
    """Replace, in place, each ``nn.Linear`` of ``model`` whose qualified name matches a pattern
    (``re.search``; the first pattern that matches wins) by ``BlockSparseLinear.from_dense`` at
    that pattern's density. A layer whose shape doesn't split into ``block_shape`` stays dense
    and the report says why. Returns the report (print it).

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    >>> print(sparsify(net, {r"^0$": 0.25}, block_shape=(16, 16)))
    sparsify: 1 of 1 matching layers replaced
      0: 64 -> 64, density 0.250
    """
    bs = check_block_shape(block_shape)
    compiled = []
    for pat, density in patterns.items():
        try:
            compiled.append((re.compile(pat), check_density(density)))
        except re.error as exc:
            raise ValueError(f"sparsify: pattern {pat!r} is not a regular expression: {exc}") from None
    report = SparsifyReport()
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear:
            continue
        density = next((d for rx, d in compiled if rx.search(name)), None)
        if density is None:
            continue
        try:
            check_divisible(module.out_features, module.in_features, bs)
        except ValueError as exc:
            report.append(Change(name, module.in_features, module.out_features, 1.0, False, str(exc)))
            continue
        if not name:
            report.append(Change(name, module.in_features, module.out_features, 1.0, False,
                                 "the model itself is the nn.Linear: use BlockSparseLinear.from_dense(model)"))
            continue
        new = BlockSparseLinear.from_dense(module, density, bs, method)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
        report.append(Change(name, module.in_features, module.out_features, new.layout.density, True))
    return report


__all__ = ["BlockSparseLinear", "Change", "SparsifyReport", "sparsify"]
