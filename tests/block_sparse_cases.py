"""Cases the block-sparse GPU tests share: a layout's weights, input and bias, and the masked dense
fp64 result they are checked against."""

from __future__ import annotations

import torch

from opforge.kernels.block_sparse.layout import BlockSparseLayout

TOL = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-4}


def case(mask, block, tokens, dtype, bias=True, seed=0):
    """(layout, w, x, bias, the masked dense fp64 result) on the GPU, seeded."""
    bh, bw = block
    lay = BlockSparseLayout(mask, (bh, bw))
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(lay.nnz, bh, bw, generator=g).to("cuda", dtype)
    x = torch.randn(tokens, lay.shape[1], generator=g).to("cuda", dtype)
    b = torch.randn(lay.shape[0], generator=g).to("cuda", dtype) if bias else None
    ref = x.double() @ lay.scatter(w.double()).t() + (b.double() if bias else 0)
    return lay, w, x, b, ref


def close(got, ref, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * max(1.0, ref.abs().max().item()))
