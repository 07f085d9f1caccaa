"""``opforge``: the command line. Subcommands each live in their own module."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from . import bench_cmd, build_cmd, cache_cmd, doctor_cmd, report_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opforge", description="Build, cache and load PyTorch kernels.")
    parser.add_argument("--version", action="version", version=f"opforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    report_cmd.add_parser(sub)
    doctor_cmd.add_parser(sub)
    build_cmd.add_parser(sub)
    cache_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
