"""How ``opforge bench`` times a call: warm-up, batches sized to a target duration, several
rounds in a rotating order, the median and the spread.

The implementations of one case are timed together: each gets ``warmup`` untimed calls, then
a trial call sets its batch size ``k`` (calls per sample) so that a batch lasts about
``target_s``; then ``repeats`` rounds, each timing one batch of every implementation, the
order rotated by one each round, so a noisy neighbour or a clock change hits all of them
alike. A sample is the batch's time / ``k``; the result is the median of the samples, with
their min, max and quartiles.

On a GPU, the batch is timed with CUDA events on the current stream, after a synchronize
and, unless ``flush`` is off, after the L2 cache was overwritten (a buffer of twice its
size zeroed), so every implementation starts from the same cache state. The host's time to
issue the batch (``time.perf_counter`` around the calls, no sync inside) is kept beside it:
the host µs per call, which bounds a loop of small calls however fast the GPU is. On the CPU,
the host's monotonic clock (``time.perf_counter``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

MAX_CALLS = 10_000
"""The most calls in one batch (a call of a microsecond would otherwise ask for millions)."""


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one implementation: the samples and their summary."""

    samples: tuple[float, ...]
    calls: int
    """Calls per sample (the batch size)."""
    host_samples: tuple[float, ...] = ()
    """GPU: the host's seconds per call to issue each batch (no sync inside); empty on the CPU."""

    @property
    def host_median(self) -> float | None:
        return statistics.median(self.host_samples) if self.host_samples else None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def spread(self) -> float:
        """(max - min) / median: how much the samples disagree (0.05: within 5%)."""
        return (self.max - self.min) / self.median if self.median > 0 else 0.0

    def to_json(self) -> dict:
        q1, q3 = self.quartiles
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max, "q1_s": q1, "q3_s": q3,
                "spread": self.spread, "repeats": len(self.samples), "calls": self.calls,
                "samples_s": list(self.samples), "host_median_s": self.host_median}


@dataclass(frozen=True)
class Plan:
    """How much to time: calls before timing, rounds, and the target length of one batch."""

    warmup: int = 3
    repeats: int = 10
    target_s: float = 0.01
    flush: bool = True
    """GPU: overwrite the L2 cache before each batch."""

    def __post_init__(self):
        if self.warmup < 0 or self.repeats < 1 or not self.target_s > 0:
            raise ValueError(f"Plan: warmup >= 0, repeats >= 1 and target_s > 0 (got {self.warmup}, "
                             f"{self.repeats}, {self.target_s})")


@dataclass
class Clock:
    """Times a batch of calls on one device."""

    device: torch.device
    flush: bool = True
    _scratch: torch.Tensor | None = field(default=None, repr=False)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        """Wait for the device's queued work (nothing to wait for on the CPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def batch(self, fn: Callable, k: int, start: int | None = None) -> tuple[float, float | None]:
        """Seconds for ``k`` calls of ``fn``, and on a GPU the host's seconds to issue them.
        With ``start``, the calls are ``fn(start)`` ... ``fn(start + k - 1)`` (a rotating input set).

        >>> Clock(torch.device("cpu")).batch(lambda i: i, 3, start=5)[1] is None
        True
        """
        calls = range(start, start + k) if start is not None else None
        if not self.cuda:
            return host_loop(fn, k, calls=calls) * k, None
        torch.cuda.synchronize(self.device)
        if self.flush:
            self._flush()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        host = host_loop(fn, k, calls=calls) * k
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3, host

    def graph(self, fn: Callable[[], object], calls: int = 20, replays: int = 7) -> float:
        """GPU: seconds per call of ``fn`` captured ``calls`` times in one CUDA graph, the median of
        ``replays`` replays (the GPU's time alone, as a graph-replaying decoder sees it)."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm up outside the capture (allocations, autotuning)
            for _ in range(2):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        times = []
        for _ in range(replays):
            seconds, _ = self.batch(graph.replay, 1)
            times.append(seconds / calls)
        return statistics.median(times)

    def _flush(self) -> None:
        if self._scratch is None:
            l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or (64 << 20)
            self._scratch = torch.empty(2 * l2, dtype=torch.uint8, device=self.device)
        self._scratch.zero_()


def host_loop(fn: Callable, k: int, before: Callable[[], object] | None = None,
              after: Callable[[], object] | None = None, calls: range | None = None) -> float:
    """The host's seconds per call of ``k`` calls of ``fn`` back to back (``time.perf_counter``
    around the loop): ``before()`` runs first, off the clock (a ``torch.cuda.synchronize``);
    ``after()`` runs on the clock, before it stops (a sync: the calls' whole time, not only their
    issue). With ``calls``, the calls are ``fn(i) for i in calls``. Every host-side timing of
    ``opforge bench`` and the ``bench/`` scripts is this loop.

    >>> host_loop(lambda: None, 100) >= 0, host_loop(lambda i: i, 2, calls=range(7, 9)) >= 0
    (True, True)
    """
    if k < 1:
        raise ValueError(f"host_loop: k must be >= 1 (got {k})")
    if before is not None:
        before()
    t0 = time.perf_counter()
    if calls is None:
        for _ in range(k):
            fn()
    else:
        for i in calls:
            fn(i)
    if after is not None:
        after()
    return (time.perf_counter() - t0) / k


def loops(fn: Callable[[], object], k: int, n: int, before: Callable[[], object] | None = None,
          after: Callable[[], object] | None = None) -> list[float]:
    """``n`` :func:`host_loop` samples of ``k`` calls each (seconds per call)."""
    return [host_loop(fn, k, before, after) for _ in range(n)]


def summary(samples: list[float]) -> dict:
    """The median, min and max of per-call samples, and the samples: the ``bench/`` scripts' JSON shape.

    >>> summary([3.0, 1.0, 2.0])
    {'median_s': 2.0, 'min_s': 1.0, 'max_s': 3.0, 'runs': [3.0, 1.0, 2.0]}
    """
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
            "runs": list(samples)}


def measure(fns: dict[str, Callable[[], object]], device: torch.device, plan: Plan) -> dict[str, Timing]:
    """Times each of ``fns`` (one call each) by the plan; see the module's docstring.

    >>> t = measure({"noop": lambda: None}, torch.device("cpu"), Plan(warmup=1, repeats=3, target_s=1e-4))
    >>> len(t["noop"].samples), t["noop"].median >= 0
    (3, True)
    """
    clock = Clock(device, plan.flush)
    sizes = {}
    for name, fn in fns.items():
        for _ in range(plan.warmup):
            fn()
        trial, _ = clock.batch(fn, 1)
        sizes[name] = max(1, min(MAX_CALLS, int(plan.target_s / max(trial, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    hosts: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(plan.repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t, host = clock.batch(fns[name], sizes[name])
            samples[name].append(t / sizes[name])
            if host is not None:
                hosts[name].append(host / sizes[name])
    return {name: Timing(tuple(samples[name]), sizes[name], tuple(hosts[name])) for name in names}


def format_seconds(s: float | None) -> str:
    """``1.23 ms``, ``45.6 µs``, ``2.00 s``; ``-`` for None.

    >>> format_seconds(0.00123), format_seconds(4.56e-5), format_seconds(2.0), format_seconds(None)
    ('1.23 ms', '45.6 µs', '2.00 s', '-')
    """
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def fresh_process(code: str, *args: str, env: dict | None = None, timeout: float = 1800) -> dict:
    """Run ``code`` in a new interpreter (``python -c code args...``) and return the JSON object its
    last line prints; exit with its stderr when it fails. For timings taken inside a fresh process
    (a cold build, a warm load, an import), where the process itself is the unit."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    if out.returncode != 0:
        sys.exit(f"the child process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
