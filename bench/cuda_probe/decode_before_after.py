"""Probe: the block-sparse forward at decode sizes with issue 35's decode kernel and without it
(the issue-21 kernels: the split pointer kernel up to 32 tokens, one program per block-row past
that), on the same GPU in one run: ``bench/block_sparse_decode.py``'s layer-alone rows, each
kernel tuned as in use.

Usage::

    python bench/cuda_probe/decode_before_after.py [bench/block_sparse_decode.py's arguments]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    import block_sparse_decode

    from opforge.kernels.block_sparse import triton_impl

    for label, limit in (("before (no decode kernel)", 0), ("after", triton_impl.DECODE_MAX_TOKENS)):
        print(f"== {label}", flush=True)
        triton_impl.DECODE_MAX_TOKENS = limit
        triton_impl.forget_plans()
        block_sparse_decode.main()


if __name__ == "__main__":
    main()
