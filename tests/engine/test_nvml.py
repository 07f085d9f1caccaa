"""opforge._nvml: which GPUs CUDA will see, asked of NVML without initialising CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from opforge._nvml import NvmlGpu, query, select

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


def test_missing_library_is_none():
    assert query(None, lib="libdoesnotexist.so") is None
    assert query("0", lib="/nonexistent/dir/libnvidia-ml.so.1") is None


def test_library_without_nvml_symbols_is_none():
    assert query(None, lib="libc.so.6") is None


# A stand-in libnvidia-ml with two GPUs, so the ctypes calls run without a driver.
# FAKE_NVML_FAIL names a call that returns an error; FAKE_NVML_MIXED makes GPU 1 an A100.
FAKE_NVML = textwrap.dedent(
    r"""
    #include <stdlib.h>
    #include <string.h>
    typedef struct { unsigned long long total, free, used; } mem_t;
    static int inited = 0;
    static int fail(const char* fn) { const char* f = getenv("FAKE_NVML_FAIL"); return f && !strcmp(f, fn) ? 999 : 0; }
    static int mixed(void) { return getenv("FAKE_NVML_MIXED") != NULL; }
    int nvmlInit_v2(void) { if (fail("init")) return 9; inited = 1; return 0; }
    int nvmlShutdown(void) { if (!inited) return 1; inited = 0; return 0; }
    int nvmlDeviceGetCount_v2(unsigned* n) { if (!inited) return 1; *n = 2; return fail("count"); }
    int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** h) {
        if (!inited || i >= 2) return 2; *h = (void*)(size_t)(0x1000 + i); return fail("handle"); }
    static long idx(void* h) { return (long)(size_t)h - 0x1000; }
    int nvmlDeviceGetName(void* h, char* buf, unsigned len) {
        const char* n = (mixed() && idx(h) == 1) ? "NVIDIA A100-SXM4-40GB" : "NVIDIA H100 80GB HBM3";
        if (len < strlen(n) + 1) return 7; strcpy(buf, n); return fail("name"); }
    int nvmlDeviceGetUUID(void* h, char* buf, unsigned len) {
        if (len < 41) return 7; strcpy(buf, idx(h) ? "GPU-bbbbbbbb-1111-2222-3333-444444444444"
                                                   : "GPU-aaaaaaaa-1111-2222-3333-444444444444");
        return fail("uuid"); }
    int nvmlDeviceGetCudaComputeCapability(void* h, int* major, int* minor) {
        *major = (mixed() && idx(h) == 1) ? 8 : 9; *minor = 0; return fail("capability"); }
    int nvmlDeviceGetMemoryInfo(void* h, mem_t* m) {
        m->total = (mixed() && idx(h) == 1) ? (40ULL << 30) : (80ULL << 30);
        m->free = m->total; m->used = 0; return fail("memory"); }
    """
)


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("fake_nvml")
    (d / "fake.c").write_text(FAKE_NVML)
    lib = d / "libfake-nvml.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(d / "fake.c")], check=True)
    return str(lib)


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
