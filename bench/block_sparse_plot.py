"""The plot of ``bench/block_sparse.py --json``: opforge's speedup over dense cuBLAS against the
density, one line per block size and op, beside the ideal (1 / density).

    python bench/block_sparse_plot.py RESULTS.json OUT.png [--dtype bfloat16] [--shape 8192x4096x4096]
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shape")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(args.results))
    rows = [r for r in data["rows"] if r["impl"] == "opforge" and r["dtype"] == args.dtype and r["vs_dense"]]
    shapes = sorted({r["shape"] for r in rows}) if not args.shape else [args.shape]
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        sub = [r for r in rows if r["shape"] == shape]
        dens = sorted({r["density"] for r in sub})
        ax.plot(dens, [1 / d for d in dens], "k--", label="ideal (1 / density)")
        ax.axhline(1.0, color="grey", lw=0.8)
        for block in sorted({r["block"] for r in sub}):
            for op, style in (("fwd", "-o"), ("dgrad", "-s"), ("wgrad", "-^")):
                pts = sorted((r["density"], r["vs_dense"]) for r in sub if r["block"] == block and r["op"] == op)
                if pts:
                    ax.plot(*zip(*pts), style, label=f"{block}x{block} {op}", alpha=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density (kept blocks)")
        ax.set_ylabel("speedup over dense cuBLAS")
        ax.set_title(f"{args.dtype} {shape} (T x in x out)")
        ax.legend(fontsize=7, ncol=2)
    info = data.get("info", {})
    fig.suptitle(f"opforge block-sparse on {info.get('gpu', '?')}, {info.get('date', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
