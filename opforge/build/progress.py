"""What a load says while it works.

* On a terminal: one ``rich`` status line, "building X (n sources)… 3.1 s", updated as
  ninja reports each step; it disappears when the build ends.
* Not a terminal: silent, unless verbose, then plain lines.
* Notices (a lock wait, a corrupt entry being rebuilt) are always written to stderr.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator


class Reporter:
    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.tty = sys.stderr.isatty()
        self._said: set[str] = set()

    def notice(self, msg: str) -> None:
        """Always shown (once per message per load)."""
        if msg not in self._said:
            self._said.add(msg)
            print(f"opforge: {msg}", file=sys.stderr, flush=True)

    def info(self, msg: str) -> None:
        if self.verbose:
            print(f"opforge: {msg}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def building(self, name: str, n_sources: int) -> Iterator["_Progress"]:
        title = f"building {name} ({n_sources} source{'s' if n_sources != 1 else ''})"
        progress = _Progress(title, self)
        if self.tty:
            from rich.console import Console

            console = Console(stderr=True)
            with console.status(f"{title}…") as status:
                progress._status = status
                yield progress
        else:
            self.info(f"{title}…")
            yield progress
        took = time.monotonic() - progress.start
        if self.verbose or self.tty:
            print(f"opforge: built {name} in {took:.1f} s", file=sys.stderr, flush=True)


class _Progress:
    def __init__(self, title: str, reporter: Reporter):
        self.title = title
        self.reporter = reporter
        self.start = time.monotonic()
        self._status = None

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self.start
        if self._status is not None:
            self._status.update(f"{self.title}: {text}… {elapsed:.1f} s")

    def line(self, text: str) -> None:
        """A line of compiler output (shown when verbose)."""
        if self.reporter.verbose:
            print(text, file=sys.stderr, flush=True)
