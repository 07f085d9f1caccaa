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
from collections.abc import Iterator


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
    def building(self, name: str, n_sources: int) -> Iterator[_Progress]:
        title = f"building {name} ({n_sources} source{'s' if n_sources != 1 else ''})"
        progress = _Progress(title, self)
        if self.tty:
            from rich.console import Console

            console = Console(stderr=True)
            with console.status(progress):  # re-rendered ~12 times a second: the clock keeps moving
                yield progress
        else:
            self.info(f"{title}…")
            yield progress
        took = time.monotonic() - progress.start
        if self.verbose or self.tty:
            print(f"opforge: built {name} in {took:.1f} s", file=sys.stderr, flush=True)


class _Progress:
    """The status line: title, ninja's last step, elapsed seconds (a rich renderable)."""

    def __init__(self, title: str, reporter: Reporter):
        self.title = title
        self.reporter = reporter
        self.start = time.monotonic()
        self._step = ""

    def step(self, text: str) -> None:
        self._step = text

    def __rich__(self) -> str:
        step = f": {self._step}" if self._step else ""
        return f"{self.title}{step}… {time.monotonic() - self.start:.1f} s"

    def line(self, text: str) -> None:
        """A line of compiler output (shown when verbose)."""
        if self.reporter.verbose:
            print(text, file=sys.stderr, flush=True)
