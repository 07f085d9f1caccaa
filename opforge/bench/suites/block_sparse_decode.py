"""Block-sparse decode as a model runs it: a stack of Llama-shaped MLP blocks (gate and up
``hidden -> inter``, down ``inter -> hidden``, SwiGLU, a residual add), every linear layer a
``BlockSparseLinear`` at one density or dense ``nn.Linear``, run over ``T`` tokens (a decode
step), eager and replayed from a CUDA graph. Enough layers that the weights come from HBM, as
in a model: each layer's weights are read once per step.

Implementations: ``dense`` (``nn.Linear``, no bias, as Llama's; the baseline: its weights are the
sparse stack's with the dropped blocks zeroed, so outputs compare) and ``opforge``
(``BlockSparseLinear``), eager (``decode step``) and as a graph replay (``decode step (graph)``:
the step captured once, ``replay()`` timed). A "call" is one step of the whole stack; tokens per second is ``T`` over its
time. ``bench/block_sparse_decode.py`` runs the full study (each layer alone, the peers, the
bandwidth reached).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..model import OPFORGE, PEER, Case, Impl
from .base import SHORT, TOLERANCE, Suite

LLAMA = (4096, 14336)
"""Llama-3-8B's MLP: hidden 4096, intermediate 14336."""

#: quick -> (layers, (hidden, inter), tokens, densities, block)
SIZES = {
    True: (4, (1024, 3584), (1, 16), (0.25,), 64),
    False: (16, LLAMA, (1, 16, 64), (0.5, 0.25, 0.1), 64),
}


class SwiGLU(nn.Module):
    """Llama's MLP: ``down(silu(gate(x)) * up(x))``; ``make(in, out)`` makes each linear layer."""

    def __init__(self, hidden: int, inter: int, make: Callable[[int, int], nn.Module]):
        super().__init__()
        self.gate, self.up, self.down = make(hidden, inter), make(hidden, inter), make(inter, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def mlp_stack(layers: int, hidden: int, inter: int, density: float | None, block: int, device, dtype,
              seed: int = 0) -> nn.ModuleList:
    """``layers`` SwiGLU blocks: ``BlockSparseLinear`` at ``density`` (random layouts, one per
    layer, seeded; the weights from torch's generator), or ``nn.Linear`` with ``density=None``."""
    from ...kernels.block_sparse.layout import BlockSparseLayout
    from ...nn import BlockSparseLinear

    g = torch.Generator().manual_seed(seed)

    def make(i: int, o: int) -> nn.Module:
        if density is None:
            return nn.Linear(i, o, bias=False, device=device, dtype=dtype)
        layout = BlockSparseLayout.random(o, i, density, (block, block), generator=g)
        return BlockSparseLinear(i, o, bias=False, layout=layout, device=device, dtype=dtype)

    with torch.no_grad():
        return nn.ModuleList(SwiGLU(hidden, inter, make) for _ in range(layers)).requires_grad_(False)


def dense_twin(stack: nn.ModuleList) -> nn.ModuleList:
    """``stack`` with each ``BlockSparseLinear`` as an ``nn.Linear`` holding its dense weight."""
    def twin(m: nn.Module) -> nn.Module:
        w = m.to_dense()
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        lin.weight.data.copy_(w)
        return lin

    with torch.no_grad():
        return nn.ModuleList(_twin_block(b, twin) for b in stack).requires_grad_(False)


def _twin_block(block: SwiGLU, twin) -> SwiGLU:
    out = SwiGLU(1, 1, lambda i, o: nn.Identity())
    out.gate, out.up, out.down = twin(block.gate), twin(block.up), twin(block.down)
    return out


def run_stack(stack: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """One decode step through the stack: ``h = h + mlp(h)`` per block."""
    h = x
    for block in stack:
        h = h + block(h)
    return h


def weight_bytes(stack: nn.ModuleList) -> int:
    """The bytes of weights one step reads (each parameter once)."""
    return sum(p.numel() * p.element_size() for p in stack.parameters())


class Captured:
    """``fn()`` captured once in a CUDA graph (after two warm-up calls on a side stream: tuning,
    allocations); calling it replays the graph, ``out`` holds the captured output."""

    def __init__(self, fn: Callable[[], torch.Tensor], device: torch.device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()

    def __call__(self) -> None:
        self.graph.replay()


class BlockSparseDecodeSuite(Suite):
    kind = "block_sparse_decode"
    devices = ("cuda",)

    def __init__(self, device: torch.device, options):
        super().__init__(device, options)
        from ...kernels.block_sparse import BlockSparseLoader

        self.variant = BlockSparseLoader().load(device=device.type).name

    def cases(self) -> Iterator[Case]:
        layers, (hidden, inter), tokens, densities, block = SIZES[self.quick]
        dtype = torch.bfloat16
        for density in densities:
            sparse = mlp_stack(layers, hidden, inter, density, block, self.device, dtype)
            dense = dense_twin(sparse)
            for t in tokens:
                x = torch.randn(t, hidden, device=self.device, dtype=dtype)
                yield from self.case(layers, hidden, inter, block, density, t, x, dense, sparse)
            del sparse, dense

    def case(self, layers, hidden, inter, block, density, t, x, dense, sparse) -> Iterator[Case]:
        params = {"layers": layers, "hidden": hidden, "inter": inter, "tokens": t, "block": block,
                  "density": density, "dtype": SHORT[torch.bfloat16], "weight_bytes": weight_bytes(sparse),
                  "dense_weight_bytes": weight_bytes(dense)}
        label = f"{layers}x SwiGLU {hidden}->{inter} T={t} {block}x{block} d={density:.2f}"
        tol = 2 * TOLERANCE[torch.bfloat16]
        yield Case("decode step", label, params, (
            Impl("dense", PEER, lambda: run_stack(dense, x), note="nn.Linear (cuBLAS)"),
            Impl("opforge", OPFORGE, lambda: run_stack(sparse, x)),
        ), "dense", tol)
        d_graph = Captured(lambda: run_stack(dense, x), self.device)
        s_graph = Captured(lambda: run_stack(sparse, x), self.device)
        yield Case("decode step (graph)", label, {**params, "graph": True}, (
            Impl("dense", PEER, d_graph, output=lambda: d_graph.out, note="nn.Linear, CUDA graph replay"),
            Impl("opforge", OPFORGE, s_graph, output=lambda: s_graph.out, note="CUDA graph replay"),
        ), "dense", tol)


__all__ = ["LLAMA", "BlockSparseDecodeSuite", "Captured", "SwiGLU", "dense_twin", "mlp_stack", "run_stack",
           "weight_bytes"]
