"""The NVIDIA GPUs of this machine, for the build key, without initialising CUDA.

A CUDA extension built with ``TORCH_CUDA_ARCH_LIST`` unset is built for the GPUs the process sees, so its
key holds their compute capabilities. ``torch.cuda.is_available()`` and ``get_device_capability`` answer
that by initialising CUDA (184 ms of a 200 ms warm load on the H200 host, by the issue's profile, and a process that has done so
can't use CUDA in a child it forks). NVML answers it without CUDA (``opforge/nvml.py``), and its answer is
recorded in the cache under the GPU set's identity, so that a warm load doesn't pay NVML's own start:

* the identity is the driver's version line and, for each GPU the driver has attached, its bus id and its
  ``information`` (model and UUID), read from ``/proc/driver/nvidia``: a few small reads. A GPU swapped,
  added or removed, or another driver, is another identity, asked of NVML again. Where the driver has no
  such files (another OS, some containers), NVML is asked each time;
* the record holds NVML's whole list, in NVML's order, before ``CUDA_VISIBLE_DEVICES`` and
  ``CUDA_DEVICE_ORDER``, which are applied to it afresh by each process (``nvml.visible_capabilities``);
* where NVML can't be used (no driver library) or can't tell (a MIG instance, indices into a numbering
  only CUDA knows), the CUDA runtime answers, as torch does, and that is said once per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading

from .. import nvml
from ..process import forgets
from . import torch_record

PROC = "/proc/driver/nvidia"
"""Where the NVIDIA driver describes itself and the GPUs it has attached."""

_SEEN: dict[str, list[nvml.NvmlGpu] | None] = {}
"""Cache dir -> the GPUs listed there by this process (None: NVML could not be used)."""
_SAID: list[bool] = [False]
_LOCK = threading.Lock()


@forgets
def _forget() -> None:
    with _LOCK:
        _SEEN.clear()
        _SAID[0] = False


def identity(proc: str | None = None) -> str | None:
    """The GPU set's identity (see the module), or None when the driver doesn't describe it."""
    proc = proc or PROC
    try:
        with open(os.path.join(proc, "version"), encoding="utf-8", errors="replace") as f:
            parts = [f.readline().strip()]
        for bus in sorted(os.listdir(os.path.join(proc, "gpus"))):
            with open(os.path.join(proc, "gpus", bus, "information"), encoding="utf-8", errors="replace") as f:
                parts.append(bus + "\n" + f.read())
    except OSError:
        return None
    return "\n".join(parts)


def record_path(cache_dir: str, ident: str) -> str:
    return os.path.join(cache_dir, ".tools", "gpus-" + hashlib.sha256(ident.encode()).hexdigest()[:24] + ".json")


def _read(path: str) -> list[nvml.NvmlGpu] | None:
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)
        return [nvml.NvmlGpu(int(r["index"]), str(r["name"]), str(r["uuid"]),
                             (int(r["capability"][0]), int(r["capability"][1])), int(r["memory_bytes"])) for r in rows]
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return None


def listed(cache_dir: str) -> list[nvml.NvmlGpu] | None:
    """NVML's list of this machine's GPUs (``nvml.listed``): from the cache's record of this GPU set where
    there is one, else asked of NVML and recorded. None when NVML can't be used."""
    with _LOCK:
        if cache_dir in _SEEN:
            return _SEEN[cache_dir]
    ident = identity()
    path = record_path(cache_dir, ident) if ident is not None else None
    gpus = _read(path) if path else None
    if gpus is None:
        gpus = nvml.listed()
        if gpus is not None and path:
            torch_record.write_record(path, [dataclasses.asdict(g) for g in gpus])
    with _LOCK:
        _SEEN[cache_dir] = gpus
    return gpus


def visible_capabilities(cache_dir: str, visible_devices: str | None,
                         device_order: str | None) -> tuple[tuple[int, int], ...]:
    """The distinct compute capabilities of the GPUs this process's CUDA will see, sorted: from NVML (or the
    record of it), else from the CUDA runtime, which initialises CUDA here (said once)."""
    gpus = listed(cache_dir)
    caps = nvml.visible_capabilities(visible_devices, gpus, device_order) if gpus is not None else None
    if caps is not None:
        return caps
    why = "NVML (the NVIDIA driver's libnvidia-ml.so.1) can't be used" if gpus is None else (
        "NVML can't tell which GPUs CUDA_VISIBLE_DEVICES names (a MIG instance, or indices of mixed GPUs under "
        "CUDA_DEVICE_ORDER=FASTEST_FIRST)")
    with _LOCK:
        say, _SAID[0] = not _SAID[0], True
    if say:
        print(f"opforge: {why}, so the GPUs a CUDA build targets come from the CUDA runtime, which initialises CUDA "
              "in this process (a process forked after it can't use CUDA); set TORCH_CUDA_ARCH_LIST (e.g. 9.0) to "
              "name them", file=sys.stderr, flush=True)
    return runtime_capabilities()


def runtime_capabilities() -> tuple[tuple[int, int], ...]:
    """The visible GPUs' capabilities from the CUDA runtime (initialises CUDA): the fallback."""
    import torch

    if not torch.cuda.is_available():
        return ()
    return tuple(sorted({tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())}))


__all__ = ["PROC", "identity", "listed", "record_path", "runtime_capabilities", "visible_capabilities"]
