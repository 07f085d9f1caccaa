"""``opforge build [KIND...] [--all] [--jobs N] [--json]``: warm the JIT cache for this machine.

For each kernel kind asked for (every kind with ``--all`` or no KIND; an extension's
name selects that extension alone), every implementation that is accepted here and is
compiled is built into the JIT cache, the same entry a later ``load()`` finds: those in
state ``needs build`` are compiled, those ``cached`` are checked and reported as such.
Prebuilt ones (in the package), rejected ones and Python backends are listed as skipped,
with the reason. Builds run in a thread pool (``--jobs``, default: the CPUs this process
may use); one failure does not stop the others, and the exit code is 1 if any failed.
An unknown KIND exits with 2, naming the valid kinds.

Each build is ``Extension.build_jit`` with a quiet reporter: the default one would give
each concurrent build its own live status line on a terminal, drawing over each other
and over the progress bar.

JSON: schema ``opforge.build/1``, the JSON Schema file ``build.schema.json`` beside this module
(``SCHEMA_FILE``), which describes every key; the tests validate the output against it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass

from .. import __version__
from .. import prebuilt as prebuilt_mod
from .. import settings as settings_mod
from ..engine.progress import Reporter
from ..errors import BuildError
from ..extension import CACHED, NEEDS_BUILD, PREBUILT
from ..extension import FAILED as FAILED_STATE
from ..selection import with_used
from . import user_modules
from .output import aligned

SCHEMA = "opforge.build/1"
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.schema.json")
BUILT, CACHED_RESULT, SKIPPED, FAILED = "built", "cached", "skipped", "failed"


@dataclass(frozen=True)
class Planned:
    kind: str
    extension: object
    state: str | None
    skip: str | None = None
    """Why it is not built; None when it is."""

    @property
    def name(self) -> str:
        return self.extension.name


@dataclass(frozen=True)
class Result:
    kind: str
    name: str
    backend: str
    result: str
    seconds: float | None = None
    detail: str = ""
    path: str | None = None
    log: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="compile the kernels that fit this machine into the JIT cache")
    p.add_argument("kinds", nargs="*", metavar="KIND",
                   help="kernel kinds (or extension names) to build; default: all")
    p.add_argument("--all", action="store_true", help="every kernel kind (the default when no KIND is given)")
    p.add_argument("--jobs", "-j", type=_positive, metavar="N",
                   help="builds to run at once (default: the CPUs this process may use)")
    p.add_argument("--json", action="store_true", help=f"print JSON (schema {SCHEMA}) instead of a table")
    user_modules.add_option(p)
    p.set_defaults(func=cmd_build)


def _positive(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


# -- planning and building (no printing) -----------------------------------------------------


def selection(tokens, use_all: bool, known: dict) -> tuple[dict[str, set[str] | None], str | None]:
    """Map each kind to build to None (all its extensions) or the names asked for; or an error."""
    if use_all or not tokens:
        return {kind: None for kind in known}, None
    chosen: dict[str, set[str] | None] = {}
    bad = []
    for token in tokens:
        if token in known:
            chosen.update({k: None for k in with_used(token, {k: cls.uses for k, cls in known.items()}) if k in known})
            continue
        from .. import registry  # the kernel families (torch code): imported when asked for, not by `--help`

        ext = registry.find_extension(token)
        if ext is None or ext.kind not in known:
            bad.append(token)
        elif chosen.get(ext.kind, set()) is not None:
            chosen.setdefault(ext.kind, set()).add(token)
    if bad:
        return {}, (f"unknown kernel kind{'s' if len(bad) > 1 else ''}: {', '.join(bad)}; "
                    f"the kinds are: {', '.join(sorted(known)) or '(none registered)'}")
    return chosen, None


def plan(chosen: dict[str, set[str] | None], known: dict, platform, prebuilt) -> list[Planned]:
    """Every candidate of the chosen kinds, and every companion (``KernelLoader.register_companion``),
    each either to build or skipped with the reason."""
    out = []
    for kind in sorted(chosen):
        names = chosen[kind]
        loader = known[kind]()
        for c in [*loader.candidates(platform, prebuilt), *loader.companion_candidates(platform, prebuilt)]:
            if names is not None and c.name not in names:
                continue
            ext = c.extension
            state = c.status.state if c.status is not None else None
            if not ext.needs_compiler:
                skip = f"nothing to build ({ext.backend} backend)"
            elif state == FAILED_STATE:
                skip = None  # a remembered failure: the loader skips it, an explicit build tries again
            elif not c.decision:
                skip = c.decision.reason
            elif state == PREBUILT:
                skip = "prebuilt in the package" + (f" ({c.decision.reason})" if c.decision.reason else "")
            elif state in (NEEDS_BUILD, CACHED):
                skip = None
            else:
                skip = f"state {state!r}"
            out.append(Planned(kind, ext, state, skip))
    return out


class _Quiet(Reporter):
    """No live status line (the build command draws its own); notices still go to stderr."""

    def __init__(self):
        super().__init__(verbose=False)
        self.tty = False


def build_one(p: Planned, settings: settings_mod.Settings) -> Result:
    """Build (or find in the cache) one planned extension; never raises."""
    ext = p.extension
    started = time.monotonic()
    try:
        path = ext.build_jit(settings=settings, reporter=_Quiet()).path
    except Exception as exc:  # noqa: BLE001 - any failure is this kernel's result, not the run's
        took = time.monotonic() - started
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        detail = lines[0]
        log = None
        if isinstance(exc, BuildError):
            first_error = next((ln.strip() for ln in (exc.excerpt or "").splitlines() if "error" in ln), "")
            detail = f"{detail} {first_error}".strip()
            log = exc.log_path
        return Result(p.kind, p.name, ext.backend, FAILED, round(took, 3), detail, None, log)
    took = time.monotonic() - started
    return Result(p.kind, p.name, ext.backend, CACHED_RESULT if p.state == CACHED else BUILT, round(took, 3), "", path)


def run(planned: list[Planned], settings: settings_mod.Settings, jobs: int, on_start=None, on_done=None) -> list[Result]:
    """Build the planned extensions in a thread pool; results in the planned order."""
    results: dict[int, Result] = {}
    todo = [(i, p) for i, p in enumerate(planned) if p.skip is None]
    for i, p in enumerate(planned):
        if p.skip is not None:
            results[i] = Result(p.kind, p.name, p.extension.backend, SKIPPED, None, p.skip)

    def work(p: Planned) -> Result:
        if on_start:
            on_start(p)
        return build_one(p, settings)

    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo))), thread_name_prefix="opforge-build") as pool:
            futures = {pool.submit(work, p): i for i, p in todo}
            for fut in as_completed(futures):
                r = fut.result()
                results[futures[fut]] = r
                if on_done:
                    on_done(r)
    return [results[i] for i in range(len(planned))]


def counts(results: list[Result]) -> dict[str, int]:
    return {k: sum(r.result == k for r in results) for k in (BUILT, CACHED_RESULT, SKIPPED, FAILED)}


# -- printing ---------------------------------------------------------------------------------


def _seconds(r: Result) -> str:
    return "-" if r.seconds is None else f"{r.seconds:.1f} s"


def _cells(r: Result) -> list[str]:
    detail = r.detail + (f" (log: {r.log})" if r.log else "")
    return [r.kind, r.name, r.result, _seconds(r), detail]


def summary(results: list[Result], wall: float, jobs: int) -> str:
    n = counts(results)
    return (f"{n[BUILT]} built, {n[CACHED_RESULT]} cached, {n[SKIPPED]} skipped, {n[FAILED]} failed "
            f"in {wall:.1f} s ({jobs} job{'s' if jobs != 1 else ''})")


def print_plain(results: list[Result], wall: float, jobs: int, out=None) -> None:
    out = out or sys.stdout
    rows = [["kind", "name", "result", "time", "detail"]] + [_cells(r) for r in results]
    for line in aligned(rows, indent=""):
        print(line, file=out)
    print(f"total: {summary(results, wall, jobs)}", file=out)


def print_rich(results: list[Result], wall: float, jobs: int, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    colour = {BUILT: "green", CACHED_RESULT: "cyan", SKIPPED: "dim", FAILED: "bold red"}
    table = Table(title="opforge build", title_justify="left")
    for col in ("kind", "name", "result", "time", "detail"):
        table.add_column(col, justify="right" if col == "time" else "left", overflow="fold",
                         no_wrap=col != "detail")
    for r in results:
        cells = [escape(x) for x in _cells(r)]
        cells[2] = f"[{colour[r.result]}]{r.result}[/]"
        table.add_row(*cells)
    console.print(table)
    console.print(f"total: {summary(results, wall, jobs)}")


def _run_with_progress(planned, settings, jobs, tty: bool, quiet: bool) -> list[Result]:
    n = sum(p.skip is None for p in planned)
    if quiet or n == 0:
        return run(planned, settings, jobs)
    if not tty:
        n_cached = sum(p.skip is None and p.state == CACHED for p in planned)
        what = f"{n - n_cached} to build, {n_cached} cached" if n_cached else f"{n} to build"
        print(f"{n} kernel{'s' if n != 1 else ''} ({what}) with {jobs} job{'s' if jobs != 1 else ''} "
              f"into {settings.cache_dir}", flush=True)
        done = [0]
        lock = threading.Lock()

        def on_done(r: Result) -> None:
            with lock:
                done[0] += 1
                what = f"{r.result} {r.name} in {r.seconds:.1f} s"
                print(f"[{done[0]}/{n}] {what}" + (f": {r.detail}" if r.detail else ""), flush=True)

        return run(planned, settings, jobs, on_done=on_done)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    running: list[str] = []
    lock = threading.Lock()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task("building", total=n)

        def describe() -> str:
            return "building " + (", ".join(running) if running else "…")

        def on_start(p: Planned) -> None:
            with lock:
                running.append(p.name)
                progress.update(task, description=describe())

        def on_done(r: Result) -> None:
            with lock:
                if r.name in running:
                    running.remove(r.name)
                progress.update(task, advance=1, description=describe())
                style = "green" if r.result != FAILED else "red"
                progress.console.print(f"[{style}]{r.result}[/] {r.name} in {r.seconds:.1f} s")

        return run(planned, settings, jobs, on_start=on_start, on_done=on_done)


def cmd_build(args) -> int:
    from .. import registry
    from ..platform import current

    error = user_modules.import_all(args.imports)
    if error:
        print(f"opforge build: {error}", file=sys.stderr)
        return 2
    known = registry.loaders()
    chosen, error = selection(args.kinds, args.all, known)
    if error:
        print(f"opforge build: {error}", file=sys.stderr)
        return 2
    s = settings_mod.current()
    platform = current(s)
    jobs = args.jobs or platform.cpu.cores
    planned = plan(chosen, known, platform, prebuilt_mod.read())
    tty = sys.stdout.isatty() and not args.json
    started = time.monotonic()
    results = _run_with_progress(planned, s, jobs, tty, quiet=args.json)
    wall = time.monotonic() - started
    n = counts(results)
    if args.json:
        json.dump({"schema": SCHEMA, "opforge": __version__, "cache_dir": s.cache_dir, "jobs": jobs,
                   "wall_seconds": round(wall, 3), "ok": n[FAILED] == 0, "counts": n,
                   "results": [r.to_json() for r in results]}, sys.stdout, indent=1)
        print()
    elif tty:
        from rich.console import Console

        print_rich(results, wall, jobs, Console())
    else:
        print_plain(results, wall, jobs)
    return 1 if n[FAILED] else 0
