"""The pictures of an ``opforge bench`` run (its JSON, schema ``opforge.bench/1``), with matplotlib.

* For each family on each device, bars of the median time per implementation, grouped by
  case, on a log scale, the quartiles as whiskers, and opforge's speedup over the baseline
  written over its bar.
* For block-sparse, opforge's speedup over dense against the density kept, a line per op,
  block size and dtype, beside the ideal (1 / density) and break-even (1).

``draw(doc, path)`` takes the JSON dict, so a saved run can be drawn again
(``python -m opforge.bench.plot RUN.json OUT.png``). matplotlib is an optional dependency:
``pip install 'opforge[plot]'``.
"""

from __future__ import annotations

import math
import sys

INSTALL_HINT = "matplotlib is not installed; pip install 'opforge[plot]' (or matplotlib) to draw plots"


def need_matplotlib() -> None:
    """Raises ImportError naming the fix when matplotlib is missing (checked before a run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc


def panels(doc: dict) -> list[tuple[str, dict]]:
    """What to draw: ("bars", family) for each family that ran except block-sparse, whose
    cases are many sizes of one matmul: ("density", family). Pure, for tests.

    >>> fam = lambda k: {"kind": k, "device": "cpu", "status": "ok", "cases": [{}]}
    >>> [(p, f["kind"]) for p, f in panels({"families": [fam("cpu_adam"), fam("block_sparse")]})]
    [('bars', 'cpu_adam'), ('density', 'block_sparse')]
    """
    out = []
    for fam in doc["families"]:
        if fam["status"] != "ok" or not fam["cases"]:
            continue
        out.append(("density" if fam["kind"] == "block_sparse" else "bars", fam))
    return out


def _median(result: dict) -> float | None:
    return result["time"]["median_s"] if result.get("time") else None


def draw_bars(ax, fam: dict) -> None:
    impls: list[str] = []
    for case in fam["cases"]:
        for r in case["results"]:
            if r["impl"] not in impls:
                impls.append(r["impl"])
    n_cases, width = len(fam["cases"]), 0.8 / max(1, len(impls))
    colors = {impl: f"C{i}" for i, impl in enumerate(impls)}
    for j, impl in enumerate(impls):
        xs, ys, lo, hi, rows = [], [], [], [], []
        for i, case in enumerate(fam["cases"]):
            r = next((r for r in case["results"] if r["impl"] == impl), None)
            if r is None or not _median(r):
                continue
            t = r["time"]
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(t["median_s"] * 1e3)
            lo.append((t["median_s"] - t["q1_s"]) * 1e3)
            hi.append((t["q3_s"] - t["median_s"]) * 1e3)
            rows.append(r)
        if not xs:
            continue
        ours = rows[0]["role"] == "opforge"
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=impl, color=colors[impl],
               edgecolor="black" if ours else "none", linewidth=1.0 if ours else 0)
        for x, y, r in zip(xs, ys, rows):
            if r["role"] == "opforge" and r.get("speedup"):
                ax.annotate(f"{r['speedup']:.2f}x", (x, y), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7, fontweight="bold")
    ax.set_yscale("log")
    ax.set_xticks(range(n_cases))
    ax.set_xticklabels([f"{c['op']}\n{c['label']}" for c in fam["cases"]], fontsize=7,
                       rotation=30 if n_cases > 4 else 0, ha="right" if n_cases > 4 else "center")
    ax.set_xlim(-0.6, n_cases - 0.4)
    ax.set_ylabel("time per call, ms (median; whiskers: quartiles)")
    base = fam["cases"][0]["baseline"]
    ax.set_title(f"{fam['kind']} on {fam['device']} ({fam['variant']}); labels: speedup over {base}", fontsize=9)
    ax.legend(fontsize=7)
    ax.margins(y=0.15)


def draw_density(ax, fam: dict) -> None:
    lines: dict[tuple, list[tuple[float, float]]] = {}
    for case in fam["cases"]:
        r = next((r for r in case["results"] if r["role"] == "opforge"), None)
        if r is None or not r.get("speedup"):
            continue
        p = case["params"]
        lines.setdefault((case["op"], p["block"], p["dtype"]), []).append((p["density"], r["speedup"]))
    dens = sorted({d for pts in lines.values() for d, _ in pts})
    if dens:
        ax.plot(dens, [1 / d for d in dens], "k--", lw=1, label="ideal (1 / density)")
    ax.axhline(1.0, color="grey", lw=0.8, label="break-even with dense")
    markers = {"fwd": "o", "fwd+bwd": "s"}
    for (op, block, dtype), pts in sorted(lines.items()):
        pts.sort()
        ax.plot([d for d, _ in pts], [s for _, s in pts], marker=markers.get(op, "^"),
                linestyle="-" if op == "fwd" else ":", label=f"{op} {block}x{block} {dtype}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if dens:  # ticks at the densities asked for (a block grid keeps the nearest it can: 0.0498 for 0.05)
        from matplotlib.ticker import FixedLocator, NullLocator

        ticks = sorted({float(f"{d:.2g}") for d in dens})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{d:g}" for d in ticks])
    ax.set_xlabel("density (fraction of blocks kept)")
    ax.set_ylabel("speedup over dense (x)")
    shape = next(iter(fam["cases"]), {}).get("params", {})
    ax.set_title(f"block_sparse on {fam['device']} ({fam['variant']}): T={shape.get('tokens')}, "
                 f"{shape.get('in_features')} -> {shape.get('out_features')}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.2)


def machine_line(doc: dict) -> str:
    p = doc["platform"]
    cpu = f"{p['cpu'].get('vendor', '')} {p['cpu']['microarch']}, {doc['options']['threads']} threads"
    gpus = [g["name"] for g in p.get("gpus", [])]
    where = cpu + (f"; {gpus[0]}" if gpus else "")
    return f"opforge bench{' --quick' if doc['options']['quick'] else ''}: {where}; torch " \
           f"{p['torch_version']}; {doc['created'][:16].replace('T', ' ')}"


def draw(doc: dict, path: str) -> list[str]:
    """Writes the PNG; returns what it drew (panel kinds and families)."""
    need_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    todo = panels(doc)
    if not todo:
        raise ValueError("nothing to plot: no family ran (see the run's table or JSON for why)")
    cols = min(2, len(todo))
    rows = math.ceil(len(todo) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 5 * rows), squeeze=False)
    drawn = []
    for ax, (kind, fam) in zip(axes.flat, todo):
        (draw_density if kind == "density" else draw_bars)(ax, fam)
        drawn.append(f"{kind}: {fam['kind']} on {fam['device']}")
    for ax in list(axes.flat)[len(todo):]:
        ax.set_visible(False)
    fig.suptitle(machine_line(doc), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m opforge.bench.plot RUN.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        doc = json.load(f)
    for line in draw(doc, argv[1]):
        print(line)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
