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

    def batch(self, fn: Callable[[], object], k: int) -> tuple[float, float | None]:
        """Seconds for ``k`` calls of ``fn``, and on a GPU the host's seconds to issue them."""
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            return time.perf_counter() - t0, None
        torch.cuda.synchronize(self.device)
        if self.flush:
            self._flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, host

    def _flush(self) -> None:
        if self._scratch is None:
            l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or (64 << 20)
            self._scratch = torch.empty(2 * l2, dtype=torch.uint8, device=self.device)
        self._scratch.zero_()


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
