"""Where a block-sparse call's host time goes: each layer of a ``BlockSparseLinear`` call timed
alone, launch-bound, beside one native launch and dense ``F.linear``.

Usage::

    python bench/block_sparse_layers.py [--tokens 16,128] [--features 1024] [--block 64] [--density 0.5]

Each row is the CPU's time per call of a loop of 200 calls with no sync inside (the GPU keeps
up at these sizes), the median of 7 loops. Layers, outermost first: the module; the kernel
contract's ``forward`` / ``grad_input`` / ``grad_weight`` (planning done: the key, the outputs'
allocation, the launch), each replayed from C++ (``kernels/native_launch``) and made from Python
("py"); the native op's call alone; fwd+bwd of the module, of dense ``F.linear`` and of one native op
(``x * 1.0``), each with ``backward(dy)``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

from opforge.bench.timing import loops


def host(fn, calls: int = 200) -> float:
    for _ in range(20):
        fn()
    out = loops(fn, calls, 7, before=torch.cuda.synchronize)
    torch.cuda.synchronize()
    return statistics.median(out) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--tokens", default="16,128")
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--density", type=float, default=0.5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/block_sparse_layers.py needs a CUDA GPU")
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from block_sparse_calls import python_launch

    from opforge.kernels.block_sparse import triton_impl as ti
    from opforge.nn import BlockSparseLinear

    n, bs = args.features, args.block
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, {n}->{n}, blocks {bs}, "
          f"density {args.density}; host µs per call")
    for tokens in (int(t) for t in args.tokens.split(",")):
        torch.manual_seed(0)
        m = BlockSparseLinear(n, n, density=args.density, block_shape=(bs, bs), device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        xg = x.clone().requires_grad_()
        dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        w, b, idx = m.weight_blocks.detach(), m.bias.detach(), m.layout.indices(x.device)
        wd, bd = m.to_dense().detach().clone().requires_grad_(), b.clone().requires_grad_()
        r = {}
        with torch.no_grad():
            r["torch.add"] = host(lambda: torch.add(x, 1))
            r["F.linear"] = host(lambda: F.linear(x, wd, bd))
            r["module"] = host(lambda: m(x))
            r["forward"] = host(lambda: ti.forward(x, w, b, idx.rows, idx.cols, idx.row_ptr, n))
            r["forward py"] = host(python_launch(lambda: ti.forward(x, w, b, idx.rows, idx.cols, idx.row_ptr, n)))
            call = ti._NATIVE_FWD.call
            if call is not None:
                r["native op"] = host(lambda: call(x, w, b, idx.cols, idx.row_ptr, n, False))
            r["grad_input"] = host(lambda: ti.grad_input(dy, w, idx.rows, idx.cols, idx.col_ptr, idx.col_order, n))
            r["grad_weight"] = host(lambda: ti.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr, bs, bs))
            r["grad_weight py"] = host(python_launch(lambda: ti.grad_weight(dy, x, idx.rows, idx.cols, idx.row_ptr,
                                                                            bs, bs)))
            r["dy.sum(0)"] = host(lambda: dy.sum(0))
        r["module fwd (grad)"] = host(lambda: m(xg))
        r["fwd+bwd dense"] = host(lambda: F.linear(xg, wd, bd).backward(dy))
        r["fwd+bwd module"] = host(lambda: m(xg).backward(dy))
        r["fwd+bwd module py"] = host(python_launch(lambda: m(xg).backward(dy)))
        r["fwd+bwd x*1.0"] = host(lambda: (xg * 1.0).backward(dy))
        print(f"T={tokens}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    main()
