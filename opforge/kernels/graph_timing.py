"""Timing a memory-bound launch the way a model runs it: back to back under CUDA graph replay, each
call reading its weight from HBM (``rotated``, ``per_call_ms``).

``triton.testing.do_bench`` (``TunedKernel._time``) flushes L2 with a 256 MB write before every run
and times that run alone. For a kernel that reads a weight once, at decode sizes, that misses two
things a model's step has: the next layer's kernel starting while this one drains (the decode
kernels' programmatic overlap), and L2 holding clean lines rather than dirty ones. Two candidates
within a microsecond of each other under do_bench can swap places under replay (issue 35: the
decode route's pick cost 2 µs at 14336->4096, T=1, d=0.1). Here a candidate runs as the issue's
benchmark runs it: many calls in one CUDA graph, each on its own stand-in for the weight, the
stand-ins together well past L2, so every call reads HBM.

The stand-ins are views of one scratch buffer of at most ``SCRATCH_BYTES`` (the size of do_bench's
own flush buffer, which this replaces), left uninitialised: the kernels' time does not depend on
the weights' values, and nothing reads their results. Where the weight is too large for enough
of them (past ``SCRATCH_BYTES`` / 2), or the capture fails, the caller times as before.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

SCRATCH_BYTES = 256 << 20
"""The most scratch memory the stand-ins take: do_bench's flush buffer's size."""
MIN_LAUNCHES = 16
"""The fewest launches in one graph (the stand-ins taken in turn), so the graph's own start is a
small part of what is timed."""
MAX_VIEWS = 256
REPLAYS = 10


def rotated(t: torch.Tensor, l2_bytes: int) -> list[torch.Tensor] | None:
    """Stand-ins for ``t`` (same shape, dtype, device and 16-byte alignment; uninitialised), enough
    that between two uses of one of them the others' bytes pass twice L2: each call reads HBM. None
    when ``SCRATCH_BYTES`` can't hold two of them past that, when that takes more than ``MAX_VIEWS``
    (a weight of under 2 L2 / 255 bytes: it stays in L2 in a model too, and do_bench times it), or
    the memory isn't there."""
    size = t.numel() * t.element_size()
    if size == 0 or not t.is_contiguous():
        return None
    views = max(2, -(-2 * l2_bytes // size) + 1)
    if views > MAX_VIEWS or views * size > SCRATCH_BYTES:
        return None
    step = -(-size // 256) * 256  # each view starts on 256 bytes, as a fresh tensor does
    try:
        scratch = torch.empty(views * step, dtype=torch.uint8, device=t.device)
    except torch.cuda.OutOfMemoryError:
        return None
    return [scratch[i * step:i * step + size].view(t.dtype).view(t.shape) for i in range(views)]


class StandIns:
    """Stand-ins for one tensor (``rotated``), made when first asked for and shared by every timing
    of one call shape (a route's candidates and their configs); freed with this object."""

    def __init__(self, t: torch.Tensor, l2_bytes: int):
        self.t, self.l2_bytes, self._views = t, l2_bytes, False

    def views(self) -> list[torch.Tensor] | None:
        if self._views is False:
            self._views = rotated(self.t, self.l2_bytes)
        return self._views

    def per_call_ms(self, launch: Callable[[tuple], None], args: tuple, device: int) -> float | None:
        """Milliseconds per call of ``launch(args)`` (compiled already), each call with a stand-in in
        the place of the tensor in ``args``, under graph replay. None where there are no stand-ins,
        the tensor isn't one of ``args``, or the capture fails."""
        views = self.views()
        if views is None or not any(a is self.t for a in args):
            return None
        turns = [tuple(v if a is self.t else a for a in args) for v in views]
        count = launches(len(views))
        return per_call_ms(lambda: [launch(turns[i % len(turns)]) for i in range(count)], count, device)


def launches(views: int) -> int:
    """How many launches one graph holds for ``views`` stand-ins (each taken in turn)."""
    return max(MIN_LAUNCHES, views)


def per_call_ms(calls: Callable[[], None], count: int, device: int) -> float | None:
    """Milliseconds per launch of ``calls`` (which makes ``count`` launches, compiled already),
    captured once in a CUDA graph and replayed (the median of ``REPLAYS``). None if the capture
    fails (the caller times another way)."""
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                calls()
        except RuntimeError:
            torch.cuda.synchronize()
            return None
        graph.replay()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
        stream = torch.cuda.current_stream()
        for start, end in pairs:
            start.record(stream)
            graph.replay()
            end.record(stream)
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in pairs]
        del graph
    return statistics.median(times) / count


__all__ = ["MIN_LAUNCHES", "SCRATCH_BYTES", "StandIns", "launches", "per_call_ms", "rotated"]
