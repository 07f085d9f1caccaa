from ...loader import KernelLoader


class BlockSparseLoader(KernelLoader):
    """``BlockSparseLoader().load().forward(x, w, bias, rows, cols, row_ptr, out_features)``,
    ``.grad_input(...)`` and ``.grad_weight(...)``: see ``opforge.kernels.block_sparse.reference``
    for the contract."""

    kind = "block_sparse"
    uses = ("native_launch",)  # the Triton variant and the companions replay their launches from C++ through it
