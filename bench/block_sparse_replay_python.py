"""The Python an eager no-grad ``BlockSparseLinear`` call runs around its replayed native launch, on the CPU
(no GPU needed): ``ops.block_sparse._replayed`` with a stand-in for the native call, for fp32 and bf16,
and the pieces it reads each call (``layout.indices``, the TF32 flag). µs per call, the median of 11 loops.

    .venv/bin/python bench/block_sparse_replay_python.py
"""

from __future__ import annotations

import statistics
import time

import torch

from opforge.kernels import triton_launch
from opforge.nn import BlockSparseLinear
from opforge.ops import block_sparse as ops


def per_call_us(fn, calls: int = 20000, loops: int = 11) -> float:
    got = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        got.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(got)


def main() -> None:
    triton_launch._DIRECT[:] = [True]  # as on a GPU with no profiler hook: the checks _replayed makes there
    triton_launch._hooks_active = lambda: False
    print("µs per call (CPU, stand-in native call)")
    for dtype in (torch.float32, torch.bfloat16):
        m = BlockSparseLinear(4096, 14336, bias=False, density=0.1, block_shape=(64, 64), dtype=dtype)
        m.requires_grad_(False)
        x = torch.randn(1, 4096, dtype=dtype)
        out = (torch.empty(1, 14336, dtype=dtype),)
        with torch.no_grad():
            t = per_call_us(lambda: ops._replayed(lambda *a: out, x, m.weight_blocks, None, m.layout))  # noqa: B023
        print(f"  _replayed, {str(dtype)[6:]}: {t:.2f}")
    print(f"  layout.indices(x.device): {per_call_us(lambda: m.layout.indices(x.device)):.3f}")
    if hasattr(ops, "_TF32"):  # (an older checkout, for a before/after, has none)
        print(f"  the TF32 flag, compat.tf32_reader: {per_call_us(ops._TF32):.3f}")
    print(f"  the TF32 flag, torch.backends.cuda.matmul.allow_tf32: "
          f"{per_call_us(lambda: torch.backends.cuda.matmul.allow_tf32):.3f}")


if __name__ == "__main__":
    main()
