"""Probe: the CUDA decode kernel's weight stream, built two ways more (issue 35, twenty-sixth session).

The kernel's ring holds a CTA's blocks in flight in shared memory, 2-6 slots of 8 KB; at T=1 its best configs read
the weight at 3.1-3.2 TB/s on the H200, where dense cuBLAS reads 3.5 and the Triton decode kernel 3.3. Two ways to
feed it more, each a define the package's sources take (``csrc/decode_cuda_kernel.cuh``, ``decode_cuda_device.cuh``):

* ``-DOPFORGE_DECODE_PREFETCH=P``: with each block's copy the producer asks the block P steps on into L2
  (``cp.async.bulk.prefetch.L2``), so more of the share is on its way than the ring holds;
* ``-DOPFORGE_DECODE_L2_HINT``: the blocks are copied with an L2 evict-first policy, since each is read once
  while x's slices are read by every row that keeps their column.

Each variant is the package's extension built apart (its own name and op namespace, so the package's build and
cache entry are untouched). Each (ring slots, CTAs an SM) of each is checked against the layer's output, then timed
on issue 35's rows: 16 rotated layers, graph-replayed, GPU µs per layer.

Usage::

    python bench/cuda_probe/decode_cuda_stream.py [--shapes ...] [--tokens 1,16,64] [--densities ...]
        [--variants package,hint,prefetch4,...] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_floor as floor  # noqa: E402

VARIANTS = {"package": (), "hint": ("-DOPFORGE_DECODE_L2_HINT",), "prefetch4": ("-DOPFORGE_DECODE_PREFETCH=4",),
            "prefetch8": ("-DOPFORGE_DECODE_PREFETCH=8",),
            "hint+prefetch8": ("-DOPFORGE_DECODE_L2_HINT", "-DOPFORGE_DECODE_PREFETCH=8")}


def variant_ops(name: str):
    """The decode ops of ``name`` (``VARIANTS``): the package's own, or its sources built with those defines."""
    from opforge.kernels.block_sparse import cuda_decode
    from opforge.kernels.block_sparse.extensions import BlockSparseDecodeCuda

    if not VARIANTS[name]:
        return cuda_decode.ops()

    tag, defines = "block_sparse_decode_stream_" + name.replace("+", "_"), VARIANTS[name]

    class StreamProbe(BlockSparseDecodeCuda):
        name = tag
        cuda_cflags = (*BlockSparseDecodeCuda.cuda_cflags, *defines)

        @classmethod
        def source_dir(cls) -> str:
            return BlockSparseDecodeCuda.source_dir()

    return StreamProbe().load().ops


def main() -> None:
    from opforge.kernels.block_sparse import cuda_decode
    from opforge.kernels.block_sparse.buffers import split_counts

    ap = floor.probe_args(argparse.ArgumentParser())
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json")
    ap.set_defaults(tokens="1,16,64")
    args = ap.parse_args()
    dev, dt, n = torch.device("cuda"), torch.bfloat16, args.layers
    names = args.variants.split(",")
    ops = {name: variant_ops(name) for name in names}
    counts = split_counts(0, 1 << 16)

    def run(m, x, cfg):
        idx = m.layout.indices(dev)
        y = torch.empty(x.shape[0], m.out_features, device=dev, dtype=x.dtype)
        name, stages, ctas = cfg
        ops[name].forward(x, m.weight_blocks, m.bias, y, idx.cols, idx.row_ptr, counts, 0, stages, ctas, 1)
        return y

    print(f"{torch.cuda.get_device_name()}, bf16, 64-blocks, {n} layers rotated, graph-replayed, µs per layer",
          flush=True)
    out = []
    for row in floor.issue_rows(args, dev, dt, seed=1):
        x, dense, mods = row.pop("x"), row["dense_us"], row.pop("mods")
        row.pop("weights")
        routed, ref = floor.routed_and_reference(mods, x, dev, n)
        with torch.no_grad():
            offered = [(name, s, c) for name in names for s, c in cuda_decode.PAIRS
                       if ops[name].grid(x, 64, 64, s, c) > 0]
            timings = floor.checked_timings(offered, run, mods, x, ref, dev, n)
        best = {name: min((c for c in timings if c[0] == name), key=timings.get) for name in names}
        line = " | ".join(f"{name} {timings[c]:.1f} {c[1:]}" for name, c in best.items())
        print(f"{floor.head(row)} | route {routed:.1f} ({dense / routed:.2f}x) | {line}", flush=True)
        out.append(floor.record(row, route_us=routed, cuda=floor.keyed(timings)))
    floor.write_rows(args.json, out)


if __name__ == "__main__":
    main()
