"""``opforge bench [KIND...] [--quick] [--json FILE] [--plot FILE.png]``: each kernel family
timed against its peers on this machine (``opforge.bench``; docs/bench.md).

Prints a table per family and device: the median time of each implementation (± half its
min-max range), and opforge's speedup over each peer. Exits 1 when one of opforge's kernels
failed to load, raised, or computed a wrong result (each named), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..bench import KINDS  # the suites themselves are torch code: imported by a run, not by --help


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time opforge's kernels against torch (and DeepSpeed) on this machine",
                       description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("kinds", nargs="*", metavar="KIND", help=f"only these families ({', '.join(KINDS)}; "
                   "default: all)")
    p.add_argument("--quick", action="store_true", help="a few small sizes, under a minute on 2 cores (a check, "
                   "not a measurement to quote)")
    p.add_argument("--device", action="append", choices=("cpu", "cuda"), metavar="{cpu,cuda}",
                   help="run on this device (repeatable; default: the CPU, and the GPU when torch sees one)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="time torch.compile as a peer (default: yes, except with --quick, where its first "
                        "compile would take most of the minute)")
    p.add_argument("--repeats", type=int, metavar="N", help="samples per implementation (default 15, --quick 5)")
    p.add_argument("--json", metavar="FILE", help="write the results (schema opforge.bench/1) to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="draw the results to FILE.png (needs matplotlib: "
                   "pip install 'opforge[plot]')")
    p.set_defaults(func=cmd_bench)


def _output_error(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{flag} {path}: the directory {parent} does not exist; create it or write elsewhere"
    if not os.access(parent, os.W_OK):
        return f"{flag} {path}: the directory {parent} is not writable; write elsewhere"
    return None


def argument_error(args) -> str | None:
    """What is wrong with the arguments (checked before anything runs), or None."""
    from .report_cmd import unknown_kinds

    bad = unknown_kinds(args.kinds, KINDS)
    if bad:
        return bad
    if args.repeats is not None and args.repeats < 1:
        return f"--repeats {args.repeats}: give at least 1"
    if args.plot is not None:
        if not args.plot.lower().endswith(".png"):
            return f"--plot {args.plot}: the plot is a PNG; give a file name ending in .png"
        from ..bench.plot import INSTALL_HINT

        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return f"--plot: {INSTALL_HINT}"
    return _output_error(args.json, "--json") or _output_error(args.plot, "--plot")


def cmd_bench(args) -> int:
    why = argument_error(args)
    if why:
        print(f"opforge bench: {why}", file=sys.stderr)
        return 2
    from rich.console import Console

    from ..bench import report as report_mod
    from ..bench import table
    from ..bench.model import Options

    options = Options(quick=args.quick, compile=(not args.quick) if args.compile is None else args.compile)
    err = Console(stderr=True)
    try:
        with err.status("opforge bench: starting") as status:
            def on_case(text: str) -> None:
                if err.is_terminal:
                    status.update(f"opforge bench: {text}")
                else:
                    print(f"opforge bench: {text}", file=sys.stderr, flush=True)

            result = report_mod.run(args.kinds, args.device or (), options, args.repeats, on_case)
    except ValueError as exc:  # --device cuda without a GPU
        print(f"opforge bench: {exc}", file=sys.stderr)
        return 2
    table.show(list(result.families))
    if args.json:
        result.write_json(args.json)
        print(f"wrote {args.json}")
    if args.plot:
        from ..bench.plot import draw

        draw(result.to_json(), args.plot)
        print(f"wrote {args.plot}")
    print(f"{len(result.families)} famil{'y' if len(result.families) == 1 else 'ies'} in {result.wall_s:.1f} s")
    if result.failures:
        print("opforge's kernels failed:", file=sys.stderr)
        for f in result.failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0
