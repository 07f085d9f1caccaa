"""Probe: a hand-written CUDA decode kernel for sm_90 in two designs, each streaming the weight in
storage order with the copy engine (``decode_cuda/``): a ring of shared memory a warp, an equal share
of blocks a warp (``block_sparse_decode.cuh``); or, with ``--warps 0``, a ring a CTA whose warps
consume each block together, the CTA's share walked backwards (``block_sparse_decode_cta.cuh``). On
the rows of issue 35, every config of a grid, against the routed Triton forward (``BlockSparseLinear``), dense
``F.linear`` and cuBLAS on the same bytes (the floor), graph-replayed over 16 rotated layers.
Built here with ``opforge.load`` (a stable-ABI op, ``torch.ops.opforge_probe_bsd.forward``); not a
part of the package (``docs/benchmarks.md``, issue 35, twelfth session, says why).

Checks every config's output against fp64 on a layout with empty rows, a full row and a bias (T = 1,
2, 17; T > 32 is not compiled), and against the module's output on each row, and that two runs are
bitwise equal. ``--ablate`` adds the same timings with parts of the kernel switched off (wrong
results; ``OPFORGE_BSD_ABLATE``, the ring-a-warp design): 1 no x and no arithmetic (the stream alone),
2 cut rows stored as if whole (no partial sums, no atomics), 4 no empty-row pass, 7 all three.

Usage::

    python bench/cuda_probe/decode_cuda.py [--shapes ...] [--tokens 1,16] [--densities ...]
        [--stages 2,3,4] [--warps 0,2,4,8] [--ctas 1,2] [--ablate 1,2,4,7] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_floor import graph_us, issue_rows, probe_args  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "opforge_probe_bsd"


def build():
    """The kernel's op, built (or found in opforge's cache) with ``opforge.load``."""
    import opforge
    from opforge.compat import stable_abi_macro

    src = os.path.join(HERE, "decode_cuda")
    common = os.path.join(HERE, "..", "..", "opforge", "kernels", "common", "csrc")
    opforge.load(NAME, [os.path.join(src, "block_sparse_decode.cpp"), os.path.join(src, "block_sparse_decode.cu")],
                 extra_cflags=["-O2", stable_abi_macro("2.10"), f"-DOPFORGE_NS={NAME}"],
                 extra_cuda_cflags=["-O3"], extra_include_paths=[src, os.path.abspath(common)],
                 is_python_module=False, with_cuda=True)
    return getattr(torch.ops, NAME).forward


def main() -> None:
    ap = probe_args(argparse.ArgumentParser())
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--warps", default="0,2,4,8")  # 0: the ring-a-CTA design
    ap.add_argument("--ctas", default="1,2")
    ap.add_argument("--ablate", default="")
    ap.add_argument("--json")
    args = ap.parse_args()
    from opforge.kernels.block_sparse.layout import BlockSparseLayout
    from opforge.kernels.block_sparse.triton_sizing import split_counts
    from opforge.nn import BlockSparseLinear

    t0 = time.perf_counter()
    op = build()
    print(f"built and loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    counts = split_counts(0, 1 << 16)
    grid = list(itertools.product(*(list(map(int, getattr(args, a).split(","))) for a in ("stages", "warps", "ctas"))))

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        return op(x, m.weight_blocks, m.bias, idx.cols, idx.row_ptr, counts, m.out_features, *cfg)

    # correctness on odd layouts first: empty rows, a full row, a bias, T = 1, 2, 17, 64
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(32, 16, generator=g) < 0.3
    mask[3] = False
    mask[5] = True
    mask[-1] = False
    lay = BlockSparseLayout(mask, (64, 64))
    m = BlockSparseLinear(1024, 2048, bias=True, device=dev, dtype=dt, layout=lay).requires_grad_(False)
    worst = 0.0
    for t in (1, 2, 17):
        x = torch.randn(t, 1024, device=dev, dtype=dt)
        ref = (x.double() @ m.to_dense().double().t() + m.bias.double())
        for cfg in grid:
            try:
                got = run(m, x, cfg)
            except RuntimeError as exc:
                print(f"cfg {cfg}: {str(exc).splitlines()[0]}")
                continue
            err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err)
            again = run(m, x, cfg)
            assert torch.equal(got, again), f"not deterministic at {cfg}"
    print(f"odd layout: worst rel error {worst:.2e} over {len(grid)} configs", flush=True)
    assert worst < 1e-2

    out = []
    for row in issue_rows(args, dev, dt):
        x, dense, same, mods = row["x"], row["dense_us"], row["same_bytes_us"], row["mods"]
        row.pop("weights")
        with torch.no_grad():
            ours = graph_us(lambda: [m(x) for m in mods], dev, n)  # noqa: B023
            ref = mods[0](x)
        timings = {}
        for cfg in grid:
            try:
                got = run(mods[0], x, cfg)
            except RuntimeError:
                continue
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err < 2e-2, (cfg, err)
            timings[cfg] = graph_us(lambda: [run(m, x, cfg) for m in mods], dev, n)  # noqa: B023
        best = min(timings, key=timings.get)
        ablated = {}
        for ab in filter(None, args.ablate.split(",")):
            os.environ["OPFORGE_BSD_ABLATE"] = ab
            ablated[ab] = min((graph_us(lambda: [run(m, x, cfg) for m in mods], dev, n)  # noqa: B023
                               for cfg in timings if cfg[1] != 0), default=float("nan"))  # the ring-a-warp design
            os.environ.pop("OPFORGE_BSD_ABLATE")
        top = sorted(timings.items(), key=lambda kv: kv[1])[:4]
        print(f"{row['in']}->{row['out']} T={row['tokens']} d={row['density']}: dense {dense:.1f} floor {same:.1f} "
              f"({dense / same:.2f}x) | triton {ours:.1f} ({dense / ours:.2f}x) | cuda best {timings[best]:.1f} "
              f"({dense / timings[best]:.2f}x, {100 * same / timings[best]:.0f}% of floor) "
              f"top {[(c, round(v, 1)) for c, v in top]}"
              + (f" | ablated (best config) {({k: round(v, 1) for k, v in ablated.items()})}" if ablated else ""),
              flush=True)
        out.append({k: row[k] for k in ("in", "out", "tokens", "density", "dense_us", "same_bytes_us")} |
                   {"triton_us": ours, "cuda": {",".join(map(str, c)): v for c, v in timings.items()},
                    "ablated_us": ablated})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
