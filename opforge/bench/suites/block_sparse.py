"""Block-sparse linear: ``y = x Wᵀ`` with ``x`` of ``(T, in)`` and a ``(out, in)`` weight that
keeps a random ``density`` of its ``block x block`` blocks; forward (``fwd``) and forward +
backward (``fwd+bwd``: the gradients of ``x`` and of the weight).

Implementations: ``dense`` (the baseline: ``F.linear`` on the dense weight with the dropped
blocks zeroed, i.e. cuBLAS on a GPU, the CPU's BLAS otherwise; its fwd+bwd computes the whole
weight's gradient, as a dense layer does), ``torch BSR`` (fwd only: ``F.linear`` with the
weight as a ``torch.sparse_bsr`` tensor, torch's own block-sparse kernels) and ``opforge``
(``opforge.ops.block_sparse_linear``: the loader's variant for the device, the Triton kernels on
a GPU, the torch gather-and-bmm implementation on the CPU). Checked: y (fwd), or the
gradients of x and of the kept blocks (fwd+bwd), against dense's. The speedup over dense
against the density is the plot ``opforge bench --plot`` draws.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..model import OPFORGE, PEER, Case, Impl, Options
from .base import SHORT, TOLERANCE, Suite

#: (device type, quick) -> (tokens, in, out), dtypes, blocks, densities
SIZES = {
    ("cpu", True): ((256, 1024, 1024), (torch.float32,), (32,), (0.5, 0.25, 0.1)),
    ("cpu", False): ((1024, 2048, 2048), (torch.float32,), (32, 64), (0.5, 0.25, 0.1, 0.05)),
    ("cuda", True): ((4096, 4096, 4096), (torch.bfloat16,), (64,), (0.5, 0.25, 0.1)),
    ("cuda", False): ((8192, 4096, 4096), (torch.bfloat16, torch.float16), (32, 64, 128), (0.5, 0.25, 0.1, 0.05)),
}


def bsr(w_dense: torch.Tensor, block: int) -> torch.Tensor:
    with warnings.catch_warnings():  # "Sparse BSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return w_dense.to_sparse_bsr((block, block))


class BlockSparseSuite(Suite):
    kind = "block_sparse"

    def __init__(self, device: torch.device, options: Options):
        super().__init__(device, options)
        from ...kernels.block_sparse import BlockSparseLoader

        self.variant = BlockSparseLoader().load(device=device.type).name

    def cases(self) -> Iterator[Case]:
        (tokens, k_in, n_out), dtypes, blocks, densities = SIZES[(self.device.type, self.quick)]
        for dtype in dtypes:
            for block in blocks:
                for density in densities:
                    yield from self.density_cases(tokens, k_in, n_out, dtype, block, density)

    def density_cases(self, tokens, k_in, n_out, dtype, block, density) -> Iterator[Case]:
        from ...kernels.block_sparse.layout import BlockSparseLayout
        from ...ops import block_sparse_linear

        dev = self.device
        g = torch.Generator().manual_seed(0)
        layout = BlockSparseLayout.random(n_out, k_in, density, (block, block), generator=g)
        x = torch.randn(tokens, k_in, generator=g).to(dev, dtype)
        dy = torch.randn(tokens, n_out, generator=g).to(dev, dtype)
        w = (torch.randn(layout.nnz, block, block, generator=g) / k_in**0.5).to(dev, dtype)
        w_dense = layout.scatter(w)
        params = {"tokens": tokens, "in_features": k_in, "out_features": n_out, "dtype": SHORT[dtype],
                  "block": block, "density": round(layout.density, 4)}
        label = f"{tokens}x{k_in}x{n_out} {SHORT[dtype]} {block}x{block} d={layout.density:.2f}"
        dense_note = "cuBLAS" if dev.type == "cuda" else "CPU BLAS"
        w_bsr = bsr(w_dense, block)
        tol = TOLERANCE[dtype]
        yield Case("fwd", label, params, (
            Impl("dense", PEER, lambda: F.linear(x, w_dense), note=dense_note),
            Impl("torch BSR", PEER, functools.partial(F.linear, x, w_bsr)),
            Impl("opforge", OPFORGE, lambda: block_sparse_linear(x, w, None, layout)),
        ), "dense", tol)
        del w_bsr
        xg, wg, wdg = x.detach().requires_grad_(), w.detach().requires_grad_(), w_dense.detach().requires_grad_()

        def dense_step():
            xg.grad = wdg.grad = None
            F.linear(xg, wdg).backward(dy)

        def opforge_step():
            xg.grad = wg.grad = None
            block_sparse_linear(xg, wg, None, layout).backward(dy)

        yield Case("fwd+bwd", label, params, (
            Impl("dense", PEER, dense_step, output=lambda: (xg.grad, layout.gather(wdg.grad)), note=dense_note),
            Impl("opforge", OPFORGE, opforge_step, output=lambda: (xg.grad, wg.grad)),
        ), "dense", tol)
