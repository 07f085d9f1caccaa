"""opforge.nvml: which GPUs CUDA will see, asked of NVML without initialising CUDA."""

from __future__ import annotations

import os

import pytest

from opforge.nvml import NvmlGpu, arrange, listed, select

GPUS = [
    NvmlGpu(0, "NVIDIA H100 80GB HBM3", "GPU-0a1b2c3d-0000-0000-0000-000000000000", (9, 0), 80 << 30),
    NvmlGpu(1, "NVIDIA H100 80GB HBM3", "GPU-0a1b9999-0000-0000-0000-000000000000", (9, 0), 80 << 30),
    NvmlGpu(2, "NVIDIA A100-SXM4-40GB", "GPU-77777777-0000-0000-0000-000000000000", (8, 0), 40 << 30),
]


def picked(visible):
    """(CUDA index, NVML index) of each GPU that ``select`` keeps."""
    return [(g.index, GPUS.index(next(h for h in GPUS if h.uuid == g.uuid))) for g in select(visible, GPUS)]


@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, [(0, 0), (1, 1), (2, 2)]),
        ("", []),
        ("0", [(0, 0)]),
        ("2,0", [(0, 2), (1, 0)]),
        (" 1 , 2", [(0, 1), (1, 2)]),  # blanks around entries are ignored
        ("1gpu,2", [(0, 1), (1, 2)]),  # read like strtoul: leading digits
        ("+2", [(0, 2)]),
        ("0,3,1", [(0, 0)]),  # unknown index stops parsing
        ("0,-1,1", [(0, 0)]),  # negative index stops parsing
        ("0,,1", [(0, 0)]),  # empty entry stops parsing
        ("1,x,0", [(0, 1)]),  # junk stops parsing
        ("x", []),
        ("0,1,0", []),  # a device named twice: CUDA shows none
        ("GPU-0a1b2c3d-0000-0000-0000-000000000000", [(0, 0)]),  # full UUID
        ("GPU-7,GPU-0a1b9", [(0, 2), (1, 1)]),  # unique prefixes
        ("GPU-0a1b,1", []),  # ambiguous prefix stops parsing
        ("2,GPU-0a1b2", [(0, 2), (1, 0)]),  # indices and UUIDs mixed
        ("GPU-0a1b2,0", []),  # the same device by UUID and by index
        ("GPU-ffff,0", []),  # unknown UUID stops parsing
        ("MIG-a1b2c3,1", [(1, 1)]),  # MIG entries are skipped but keep their CUDA index
    ],
)
def test_select(visible, expected):
    assert picked(visible) == expected


def test_select_keeps_properties_and_leaves_input_alone():
    (gpu,) = select("2", GPUS)
    assert (gpu.name, gpu.capability, gpu.memory_bytes) == ("NVIDIA A100-SXM4-40GB", (8, 0), 40 << 30)
    assert [g.index for g in GPUS] == [0, 1, 2]
    assert select(None, []) == [] and select("0", []) == []


def query(visible, lib=None, device_order=None):
    """What CUDA will see, from NVML's list (None: NVML unusable, or the numbering unknown)."""
    gpus = listed(lib)
    return None if gpus is None else arrange(visible, gpus, device_order)


def test_missing_library_is_none():
    assert query(None, lib="libdoesnotexist.so") is None
    assert query("0", lib="/nonexistent/dir/libnvidia-ml.so.1") is None


def test_library_without_nvml_symbols_is_none():
    assert query(None, lib="libc.so.6") is None


def test_query_through_ctypes(fake_nvml, monkeypatch):
    monkeypatch.delenv("FAKE_NVML_FAIL", raising=False)
    monkeypatch.delenv("FAKE_NVML_MIXED", raising=False)
    h100 = ("NVIDIA H100 80GB HBM3", (9, 0), 80 << 30)
    a, b = "GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-444444444444"
    assert query(None, lib=fake_nvml) == [NvmlGpu(0, h100[0], a, *h100[1:]), NvmlGpu(1, h100[0], b, *h100[1:])]
    assert [(g.index, g.uuid) for g in query("1", lib=fake_nvml)] == [(0, b)]
    assert [(g.index, g.uuid) for g in query("GPU-b,GPU-a", lib=fake_nvml)] == [(0, b), (1, a)]
    assert query("", lib=fake_nvml) == []
    assert query(None, lib=fake_nvml) is not None  # nvmlShutdown ran: init works again


@pytest.mark.parametrize("call", ["init", "count", "handle", "name", "uuid", "capability", "memory"])
def test_any_failed_call_is_none(fake_nvml, monkeypatch, call):
    monkeypatch.setenv("FAKE_NVML_FAIL", call)
    assert query(None, lib=fake_nvml) is None
    monkeypatch.delenv("FAKE_NVML_FAIL")
    assert query(None, lib=fake_nvml) is not None  # a failure after init still shut NVML down


def test_mixed_gpus_need_pci_bus_order(fake_nvml, monkeypatch):
    monkeypatch.delenv("FAKE_NVML_FAIL", raising=False)
    monkeypatch.setenv("FAKE_NVML_MIXED", "1")
    assert query(None, lib=fake_nvml) is None  # FASTEST_FIRST may renumber them
    assert query(None, lib=fake_nvml, device_order="FASTEST_FIRST") is None
    gpus = query(None, lib=fake_nvml, device_order="PCI_BUS_ID")
    assert [g.capability for g in gpus] == [(9, 0), (8, 0)]


@pytest.mark.cuda
def test_matches_torch():
    import torch

    gpus = query(os.environ.get("CUDA_VISIBLE_DEVICES"), device_order=os.environ.get("CUDA_DEVICE_ORDER"))
    assert gpus is not None, "NVML unusable on a machine where torch sees a GPU"
    assert len(gpus) == torch.cuda.device_count()
    for i, gpu in enumerate(gpus):
        props = torch.cuda.get_device_properties(i)
        assert gpu.index == i
        assert gpu.capability == torch.cuda.get_device_capability(i)
        assert gpu.name == torch.cuda.get_device_name(i)
        assert gpu.uuid.startswith("GPU-")
        if hasattr(props, "uuid"):
            assert gpu.uuid == f"GPU-{props.uuid}"
        assert abs(gpu.memory_bytes - props.total_memory) <= 0.05 * gpu.memory_bytes
