"""Probe: where the CUDA decode kernel's time over the floor goes (issue 35, twenty-seventh session).

The H200's floors (``decode_mma_floor.py``: the kept blocks' bare read, and a perfectly balanced block-by-block
kernel with x's traffic and the products) put the package 0.5-0.7 µs over "x each block" at T=1, 1.2-1.6 µs at
T=16 and 1.6-2.8 µs at T=64. This probe builds the package's kernel with parts of its work taken out, each a
define its sources take (``csrc/decode_cuda_kernel.cuh``), and times each on issue 35's rows:

* ``nopart`` (``-DOPFORGE_DECODE_ABLATE_PARTIALS``): every cut row stored as it is, no partial sums out, no
  count, no wait, no sums back (wrong results where a row is cut: a diagnostic);
* ``nomath`` (``-DOPFORGE_DECODE_ABLATE_MATH``): no products (the slots waited for and given back);
* ``nox`` (``-DOPFORGE_DECODE_ABLATE_X``): no x slices copied into the slots;
* ``stream``: all three: the ring's stream of the weight and the row bookkeeping;
* ``base`` (with ``--base DIR``): the kernel of another commit, its sources as ``git archive COMMIT opforge/kernels
  | tar -x -C DIR`` writes them, given a buffer of ``--base-fill`` (0: arrival counts, as the package's op takes;
  -1: the slots that signal themselves of commit 64040c3, measured and refused in the twenty-seventh session).

Each variant is the package's extension built apart (its own name), each (ring slots, CTAs an SM) timed, the best
kept: 16 rotated layers, graph-replayed, GPU µs per layer. The package's and the base's are checked against the
layer first.

Usage::

    python bench/cuda_probe/decode_cuda_ablate.py [--shapes ...] [--tokens 1,16,64] [--densities ...]
        [--variants package,nopart,nomath,nox,stream] [--base DIR --base-fill 0] [--check] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_floor as floor  # noqa: E402
from block_sparse_decode import graph_us  # noqa: E402

VARIANTS = {"package": (), "nopart": ("-DOPFORGE_DECODE_ABLATE_PARTIALS",), "nomath": ("-DOPFORGE_DECODE_ABLATE_MATH",),
            "nox": ("-DOPFORGE_DECODE_ABLATE_X",),
            "stream": ("-DOPFORGE_DECODE_ABLATE_PARTIALS", "-DOPFORGE_DECODE_ABLATE_MATH", "-DOPFORGE_DECODE_ABLATE_X")}


def variant_ops(name: str, base: str | None = None):
    """The decode ops of ``name`` (``VARIANTS``): the package's own, its sources built with those defines, or
    (``base``) another commit's sources under that directory."""
    from opforge.kernels.block_sparse import cuda_decode
    from opforge.kernels.block_sparse.extensions import BlockSparseDecodeCuda

    if name == "package":
        return cuda_decode.ops()

    tag, defines = "block_sparse_decode_ablate_" + name, VARIANTS.get(name, ())
    where = os.path.join(os.path.abspath(base), "opforge", "kernels", "block_sparse") if name == "base" else None

    class Ablated(BlockSparseDecodeCuda):
        name = tag
        cuda_cflags = (*BlockSparseDecodeCuda.cuda_cflags, *defines)

        @classmethod
        def source_dir(cls) -> str:
            return where or BlockSparseDecodeCuda.source_dir()

    return Ablated().load().ops


def main() -> None:
    from opforge.kernels.block_sparse import cuda_decode
    from opforge.kernels.block_sparse.buffers import split_counts

    ap = floor.probe_args(argparse.ArgumentParser(), tokens="1,16,64", variants=",".join(VARIANTS))
    ap.add_argument("--base", help="another commit's opforge/kernels, extracted under this directory")
    ap.add_argument("--base-fill", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="the package's kernel on odd layouts against fp64 first")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    names = args.variants.split(",") + (["base"] if args.base else [])
    ops = {name: variant_ops(name, args.base) for name in names}
    # each variant's own counts (a variant that left them non-zero would hang another's owners), the package's its
    # stream's buffer, the base's what its op takes
    bufs = {name: torch.zeros(1 << 16, dtype=torch.int32, device=dev) for name in names}
    bufs["package"] = split_counts(0, 1 << 16)
    bufs["base"] = torch.full((1 << 22,), args.base_fill, dtype=torch.int32, device=dev)
    checked = ("package", "base")  # the exact ones
    if args.check and "package" in ops:  # (the base's op may take another buffer: not checked here)
        from decode_wgmma import check

        n_ok = check(ops["package"].forward, bufs["package"], tokens_checked=(1, 17, 33, 64))
        print(f"check package: {n_ok} launches against fp64, all within 1e-2, counts left at zero", flush=True)

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        y = torch.empty(x.shape[0], m.out_features, device=dev, dtype=x.dtype)
        name, stages, ctas = cfg
        ops[name].forward(x, m.weight_blocks, m.bias, y, idx.cols, idx.row_ptr, bufs[name], 0,
                          stages, ctas, 1)
        return y

    print(f"{torch.cuda.get_device_name()}, bf16, 64-blocks, {n} layers rotated, graph-replayed, µs per layer",
          flush=True)
    out = []
    for row in floor.issue_rows(args, dev, dt, seed=1):
        x, mods = row.pop("x"), row.pop("mods")
        row.pop("weights")
        routed, ref = floor.routed_and_reference(mods, x, dev, n)
        with torch.no_grad():
            offered = [(name, s, c) for name in names for s, c in cuda_decode.PAIRS
                       if ops[name].grid(x, 64, 64, s, c) > 0]
            timings = floor.checked_timings([c for c in offered if c[0] in checked], run, mods, x, ref, dev, n)
            for cfg in offered:
                if cfg[0] not in checked:
                    timings[cfg] = graph_us(lambda: [run(m, x, cfg) for m in mods], dev, n)  # noqa: B023
        best = {name: min((c for c in timings if c[0] == name), key=timings.get) for name in names}
        line = " | ".join(f"{name} {timings[c]:.1f} {c[1:]}" for name, c in best.items())
        print(f"{floor.head(row)} | route {routed:.1f} | {line}", flush=True)
        out.append(floor.record(row, route_us=routed, cuda=floor.keyed(timings)))
    floor.write_rows(args.json, out)


if __name__ == "__main__":
    main()
