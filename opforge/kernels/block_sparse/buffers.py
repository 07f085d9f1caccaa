"""The block-sparse kernels' buffers that outlive a call: one a (device, stream), kept and shared by every
launch on that stream, since launches on one stream run in order and each leaves its buffer as it found
it. The arrival counts of the kernels that add partial sums, the Triton decode kernel's partial slots,
and the CUDA decode kernel's partial sums when its launch is replayed from C++ (``cuda_decode.recipe``).
Made outside torch.compile's CUDA graph pools (``outside_pools``).

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

import threading

import torch

from ..triton_compat import triton
from .triton_sizing import SLOT_EMPTY

_COUNTS: dict = {}
_SLOTS: dict = {}
_PARTIALS: dict = {}
_OLD_BUFFERS: list = []


def split_counts(device: int, needed: int) -> torch.Tensor:
    """The arrival counts of the kernels that add partial sums (the split ``_fwd_kernel``,
    ``_dw_kernel``, the CUDA decode kernel): int32 zeros, one buffer per (device, stream), since
    launches on one stream run in order and each leaves its counts at zero. A buffer outgrown is
    kept, not freed: a captured CUDA graph may still use it.

    Buffers are made outside any CUDA graph pool (``_filled_outside_pools``). A capture finds the
    device's buffer made before it (by the warm-up calls a capture needs) and uses it: the graph is
    replayed in order with the work of the stream that made it (a stream of its own if a capture
    comes first: then the graph's pool holds it)."""
    return _stream_buffer(_COUNTS, device, needed, 0)


def split_slots(device: int, needed: int) -> torch.Tensor:
    """``_decode_kernel``'s partial slots: int32 (fp32 bits) filled with ``SLOT_EMPTY``, kept and
    shared as ``split_counts``'s counts are, since each launch leaves every slot it filled empty again
    (the program that reads a slot empties it)."""
    return _stream_buffer(_SLOTS, device, needed, SLOT_EMPTY)


def split_partials(device: int, needed: int) -> torch.Tensor:
    """The CUDA decode kernel's partial sums, when its launch is replayed from C++ (``cuda_decode.recipe``):
    a slot a (CTA, strip), written and read within one launch (the counts say when a slot is full), so
    kept and shared as ``split_counts``'s counts are, not allocated each call. int32 elements (fp32 bits
    to the kernel). A launch as a programmatic dependent touches no slot before the launch before it
    on the stream is done (``griddepcontrol.wait``)."""
    return _stream_buffer(_PARTIALS, device, needed, 0)


def _stream_buffer(store: dict, device: int, needed: int, fill: int) -> torch.Tensor:
    stream = triton.runtime.driver.active.get_current_stream(device)
    buf = store.get((device, stream))
    if buf is not None and buf.numel() >= needed:
        return buf
    if torch.cuda.is_current_stream_capturing():
        found = [b for (d, _), b in store.items() if d == device and b.numel() >= needed]
        if found:
            store[(device, stream)] = found[0]
            return found[0]
    if buf is not None:
        _OLD_BUFFERS.append(buf)
    buf = store[(device, stream)] = _filled_outside_pools(max(4096, 2 * needed), fill, torch.device("cuda", device))
    return buf


def _filled_outside_pools(n: int, fill: int, device: torch.device) -> torch.Tensor:
    """int32 ``fill``s that outlive the call (``outside_pools``); under a capture they are made here,
    on the capturing stream (the graph's pool holds them)."""
    if torch.cuda.is_current_stream_capturing():
        return torch.full((n,), fill, dtype=torch.int32, device=device)
    return outside_pools(lambda: torch.full((n,), fill, dtype=torch.int32, device=device), device)


def outside_pools(make, device: torch.device):
    """``make()``'s tensors, made by another thread for tensors that outlive the call: torch.compile's
    CUDA graph trees send this thread's allocations to their pool while they warm up and record, and
    the pool must hold no tensor they don't track ("Detected 1 tensor(s) in the cudagraph pool not
    tracked as outputs"). That thread waits for its work, so it is done before any later launch.
    Not under a capture (another thread's work can't run then)."""
    made: list = []

    def work() -> None:
        try:
            with torch.cuda.device(device):
                made.append(make())
                torch.cuda.current_stream(device).synchronize()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            made.append(exc)

    worker = threading.Thread(target=work, name="opforge-outside-pools")
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


__all__ = ["outside_pools", "split_counts", "split_partials", "split_slots"]
