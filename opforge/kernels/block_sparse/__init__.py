"""``block_sparse``: ``Y = X Wᵀ`` with ``W`` block-sparse (a block mask, ``layout.py``), its
gradient wrt ``X`` and its gradient wrt ``W`` on the kept blocks only.

Variants, best first: so far the pure-torch reference (``reference.py``: gather + batched
matmul, which also states the kernel contract). The ops and their autograd live in
``opforge.ops.block_sparse``, the module in ``opforge.nn.BlockSparseLinear``.
"""

from . import extensions  # noqa: F401  (registers the variants)
from .layout import BlockSparseLayout
from .loader import BlockSparseLoader

__all__ = ["BlockSparseLayout", "BlockSparseLoader"]
