"""List the visible NVIDIA GPUs through NVML, without initialising CUDA (a leaf: stdlib only, below the engine).

``torch.cuda.get_device_capability()`` (and ``device_count()`` where NVML is unusable)
initialises CUDA in the calling process; a process that has done so cannot use CUDA in
a child it forks afterwards. Asking NVML (the driver's management library, loaded
through ctypes: no pynvml dependency) leaves CUDA untouched, so picking build archs
stays fork-safe. The caller passes in ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``
(``opforge.settings`` reads the environment; this module does not).

Index caveat: NVML numbers GPUs in PCI bus order; CUDA does too only when
``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Under the default (FASTEST_FIRST) ``arrange`` answers
only when every GPU is the same model (same name, capability and memory), so that the
numbering cannot change what a caller learns; otherwise it returns None.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class NvmlGpu:
    index: int  # index as CUDA will number it (after CUDA_VISIBLE_DEVICES filtering)
    name: str
    uuid: str  # "GPU-xxxxxxxx-..."
    capability: tuple[int, int]  # (9, 0)
    memory_bytes: int


_INDEX = re.compile(r"\+?(\d+)")  # like CUDA's strtoul: "1gpu" reads as 1


def select(visible_devices: str | None, gpus_by_nvml_index: list[NvmlGpu]) -> list[NvmlGpu]:
    """The GPUs CUDA will see, in CUDA's order, each renumbered with its CUDA index.

    As CUDA: None shows all; entries are indices or ``GPU-`` UUIDs (or a unique prefix);
    the first empty, negative, unknown or ambiguous entry ends the list, and a device
    named twice leaves none. ``MIG-`` entries are skipped: they yield no NvmlGpu (a MIG
    instance is not a device NVML lists here) but keep their CUDA index.

    >>> gpus = [NvmlGpu(i, "H100", f"GPU-{c}{c}-0", (9, 0), 80 << 30) for i, c in enumerate("abc")]
    >>> [(g.index, g.uuid) for g in select("2,0", gpus)]
    [(0, 'GPU-cc-0'), (1, 'GPU-aa-0')]
    >>> [g.uuid for g in select(None, gpus)] == [g.uuid for g in gpus]
    True
    >>> select("", gpus), select("0,0", gpus)
    ([], [])
    >>> [g.uuid for g in select("GPU-b,2x,7,0", gpus)]  # "2x" reads as 2; 7 is unknown
    ['GPU-bb-0', 'GPU-cc-0']
    >>> [(g.index, g.uuid) for g in select("MIG-aa-1,2,-1,0", gpus)]
    [(1, 'GPU-cc-0')]
    """
    if visible_devices is None:
        return [replace(g, index=i) for i, g in enumerate(gpus_by_nvml_index)]
    chosen: list[NvmlGpu | None] = []
    for entry in visible_devices.split(","):
        entry = entry.strip()
        if entry.startswith("MIG-"):
            chosen.append(None)
            continue
        if entry.startswith("GPU-"):
            hits = [g for g in gpus_by_nvml_index if g.uuid.startswith(entry)]
            if len(hits) != 1:
                break
            gpu = hits[0]
        else:
            m = _INDEX.match(entry)
            if m is None or int(m.group(1)) >= len(gpus_by_nvml_index):
                break  # also "" and negative numbers
            gpu = gpus_by_nvml_index[int(m.group(1))]
        if gpu in chosen:
            return []
        chosen.append(gpu)
    return [replace(g, index=i) for i, g in enumerate(chosen) if g is not None]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


_BUF = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, >= NVML_DEVICE_UUID_V2_BUFFER_SIZE
_u, _i, _p = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {  # every NVML call returns an nvmlReturn_t; 0 is NVML_SUCCESS
    "nvmlInit_v2": [],
    "nvmlShutdown": [],
    "nvmlDeviceGetCount_v2": [ctypes.POINTER(_u)],
    "nvmlDeviceGetHandleByIndex_v2": [_u, ctypes.POINTER(_p)],
    "nvmlDeviceGetName": [_p, ctypes.c_char_p, _u],
    "nvmlDeviceGetUUID": [_p, ctypes.c_char_p, _u],
    "nvmlDeviceGetCudaComputeCapability": [_p, ctypes.POINTER(_i), ctypes.POINTER(_i)],
    "nvmlDeviceGetMemoryInfo": [_p, ctypes.POINTER(_Memory)],
}


class _Failed(Exception):
    """An NVML call returned an error code."""


_ERRORS = (OSError, AttributeError, ctypes.ArgumentError, _Failed)  # no library, old driver, bad call


def _load(lib: str):
    nvml = ctypes.CDLL(lib)
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(nvml, name)
        fn.argtypes, fn.restype = argtypes, _i
    return nvml


def _ok(rc: int) -> None:
    if rc != 0:
        raise _Failed(rc)


def _read(nvml, i: int) -> NvmlGpu:
    handle, name, uuid = _p(), ctypes.create_string_buffer(_BUF), ctypes.create_string_buffer(_BUF)
    major, minor, mem = _i(), _i(), _Memory()
    _ok(nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)))
    _ok(nvml.nvmlDeviceGetName(handle, name, _BUF))
    _ok(nvml.nvmlDeviceGetUUID(handle, uuid, _BUF))
    _ok(nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)))
    _ok(nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)))
    name_s, uuid_s = (b.value.decode("utf-8", "replace") for b in (name, uuid))
    return NvmlGpu(i, name_s, uuid_s, (major.value, minor.value), mem.total)


LIBRARY = "libnvidia-ml.so.1"
"""The NVML library ``listed`` opens by default (a test points this at a stand-in)."""


def listed(lib: str | None = None) -> list[NvmlGpu] | None:
    """Every GPU NVML lists, in its order (PCI bus order), before ``CUDA_VISIBLE_DEVICES``; None when NVML
    can't be used (no driver, no library, ``nvmlInit`` or a later call fails)."""
    try:
        nvml = _load(lib or LIBRARY)
        _ok(nvml.nvmlInit_v2())
    except _ERRORS:
        return None
    try:
        count = _u()
        _ok(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)))
        return [_read(nvml, i) for i in range(count.value)]
    except _ERRORS:
        return None
    finally:
        nvml.nvmlShutdown()


def arrange(visible_devices: str | None, gpus: list[NvmlGpu], device_order: str | None = None) -> list[NvmlGpu] | None:
    """The GPUs CUDA will see, numbered as CUDA numbers them, from NVML's list (pure); None when CUDA's
    numbering can't be known: mixed GPUs under ``CUDA_DEVICE_ORDER``'s default (FASTEST_FIRST).

    >>> a = NvmlGpu(0, "H100", "GPU-a", (9, 0), 80 << 30)
    >>> b = NvmlGpu(1, "A100", "GPU-b", (8, 0), 40 << 30)
    >>> [g.uuid for g in arrange("1", [a, b], "PCI_BUS_ID")], arrange("1", [a, b])
    (['GPU-b'], None)
    """
    if device_order != "PCI_BUS_ID" and len({(g.name, g.capability, g.memory_bytes) for g in gpus}) > 1:
        return None  # FASTEST_FIRST may number mixed GPUs differently from NVML
    return select(visible_devices, gpus)


def visible_capabilities(visible_devices: str | None, gpus: list[NvmlGpu],
                         device_order: str | None = None) -> tuple[tuple[int, int], ...] | None:
    """The distinct compute capabilities of the GPUs CUDA will see, sorted (pure): what a build for "the
    visible GPUs" targets. Their order doesn't matter, so mixed GPUs under FASTEST_FIRST are answered too
    when the set doesn't depend on the numbering (every GPU visible, or none named by an index). None when
    it can't be known: a MIG instance (NVML lists its parent, not it), or indices into a numbering NVML
    can't predict.

    >>> a = NvmlGpu(0, "H100", "GPU-a", (9, 0), 80 << 30)
    >>> b = NvmlGpu(1, "A100", "GPU-b", (8, 0), 40 << 30)
    >>> visible_capabilities(None, [a, b]), visible_capabilities("GPU-b", [a, b]), visible_capabilities("1", [a, b])
    (((8, 0), (9, 0)), ((8, 0),), None)
    >>> visible_capabilities("MIG-1234", [a]), visible_capabilities("", [a, b]), visible_capabilities(None, [])
    (None, (), ())
    """
    entries = [e.strip() for e in visible_devices.split(",")] if visible_devices is not None else []
    if any(e.startswith("MIG-") for e in entries):
        return None
    chosen = arrange(visible_devices, gpus, device_order)
    if chosen is None and not any(_INDEX.match(e) for e in entries):  # no index: CUDA's numbering doesn't matter
        chosen = select(visible_devices, gpus)
    if chosen is None:
        return None
    return tuple(sorted({g.capability for g in chosen}))
