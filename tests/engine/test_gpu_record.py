"""CUDA facts without CUDA (issue 60, item 2): the build key's "visible GPUs" come from NVML, or the cache's
record of NVML's answer for this GPU set, never from ``torch.cuda.is_available()`` or
``get_device_capability`` (which initialise CUDA) while NVML answers. The CUDA runtime is the fallback only
where NVML can't tell, and that is said once.

NVML here is a stand-in library (conftest's ``fake_nvml``: two H100s, or an H100 and an A100 with
``FAKE_NVML_MIXED``), and ``/proc/driver/nvidia`` a directory the test writes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import opforge
from opforge import compat, nvml, settings
from opforge.engine import gpu_record, key, torch_record


@pytest.fixture
def no_cuda_runtime(monkeypatch):
    """torch.cuda's answers that initialise CUDA, made to fail the test if called."""
    calls = []

    def forbidden(name):
        def call(*a, **k):
            calls.append(name)
            raise AssertionError(f"torch.cuda.{name} was called: it initialises CUDA")
        return call

    for name in ("is_available", "device_count", "get_device_capability", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, forbidden(name))
    return calls


@pytest.fixture
def nvml_here(fake_nvml, monkeypatch, tmp_path):
    """NVML is the stand-in; the driver's /proc files describe two GPUs."""
    for var in ("FAKE_NVML_FAIL", "FAKE_NVML_MIXED", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(nvml, "LIBRARY", fake_nvml)
    proc = tmp_path / "proc-nvidia"
    (proc / "gpus" / "0000:01:00.0").mkdir(parents=True)
    (proc / "gpus" / "0000:02:00.0").mkdir()
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    for bus, uuid in (("0000:01:00.0", "aaaaaaaa"), ("0000:02:00.0", "bbbbbbbb")):
        (proc / "gpus" / bus / "information").write_text(f"Model: NVIDIA H100 80GB HBM3\nGPU UUID: GPU-{uuid}\n")
    monkeypatch.setattr(gpu_record, "PROC", str(proc))
    opforge.reset()
    yield proc
    opforge.reset()


def mixed(proc, monkeypatch) -> None:
    """The second GPU swapped for an A100, in NVML and in the driver's files."""
    monkeypatch.setenv("FAKE_NVML_MIXED", "1")
    (proc / "gpus" / "0000:02:00.0" / "information").write_text("Model: NVIDIA A100-SXM4-40GB\nGPU UUID: GPU-bbbbbbbb\n")


def arch_key(**env) -> str:
    return key.cuda_arch_key(dataclasses.replace(settings.current(), **env), ())


def test_the_key_asks_nvml_not_the_cuda_runtime(nvml_here, no_cuda_runtime, cache_dir, monkeypatch):
    assert arch_key() == "visible:9.0"
    opforge.reset()
    mixed(nvml_here, monkeypatch)
    assert arch_key() == "visible:8.0;9.0"  # every GPU visible: the set needs no numbering
    assert arch_key(cuda_visible_devices="GPU-bbbbbbbb") == "visible:8.0"
    assert arch_key(cuda_visible_devices="1", cuda_device_order="PCI_BUS_ID") == "visible:8.0"
    assert arch_key(cuda_visible_devices="") == "none"
    assert arch_key(cuda_arch_list="9.0") == "list:9.0"
    assert no_cuda_runtime == []


def test_a_warm_process_reads_the_record_not_nvml(nvml_here, no_cuda_runtime, cache_dir, monkeypatch):
    assert arch_key() == "visible:9.0"
    (record,) = (cache_dir / ".tools").glob("gpus-*.json")
    opforge.reset()
    monkeypatch.setenv("FAKE_NVML_FAIL", "init")  # NVML would fail now: the record answers
    assert arch_key() == "visible:9.0"
    assert arch_key(cuda_visible_devices="1") == "visible:9.0"

    opforge.reset()
    monkeypatch.delenv("FAKE_NVML_FAIL")
    mixed(nvml_here, monkeypatch)  # a GPU swapped: another identity
    assert arch_key() == "visible:8.0;9.0"  # asked of NVML again
    assert len(list((cache_dir / ".tools").glob("gpus-*.json"))) == 2 and record.exists()
    assert no_cuda_runtime == []


def test_without_the_drivers_proc_files_nvml_is_asked_each_process(nvml_here, no_cuda_runtime, cache_dir,
                                                                     monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_record, "PROC", str(tmp_path / "nowhere"))
    assert arch_key() == "visible:9.0"
    assert not list((cache_dir / ".tools").glob("gpus-*.json"))
    assert no_cuda_runtime == []


def test_where_nvml_cant_tell_the_runtime_answers_said_once(nvml_here, cache_dir, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(gpu_record, "runtime_capabilities", lambda: asked.append(1) or ((8, 0),))
    mixed(nvml_here, monkeypatch)
    assert arch_key(cuda_visible_devices="1") == "visible:8.0"  # an index into CUDA's FASTEST_FIRST numbering
    assert arch_key(cuda_visible_devices="MIG-1234") == "visible:8.0"  # NVML lists the parent, not the instance
    assert len(asked) == 2
    err = capsys.readouterr().err
    assert err.count("come from the CUDA runtime") == 1 and "TORCH_CUDA_ARCH_LIST" in err

    opforge.reset()
    monkeypatch.setattr(nvml, "LIBRARY", "libdoesnotexist.so")
    monkeypatch.setattr(gpu_record, "PROC", "/nonexistent")
    assert arch_key() == "visible:8.0"
    assert "NVML (the NVIDIA driver's libnvidia-ml.so.1) can't be used" in capsys.readouterr().err


@pytest.fixture
def cuda_torch(monkeypatch, cache_dir):
    """This (CPU) torch's facts as a CUDA 13.0 build's, for the key of a CUDA source."""
    facts = dataclasses.replace(compat.torch_facts(), cuda="13.0")
    monkeypatch.setattr(torch_record, "torch_facts", lambda cache_dir: facts)
    if opforge.engine.toolchain.find_nvcc(settings.current()) is None:
        pytest.skip("needs nvcc")
    return facts


def test_a_cuda_extensions_spec_and_a_loaders_status_leave_cuda_alone(nvml_here, no_cuda_runtime, cuda_torch,
                                                                       tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k() {}\n")
    spec = key.make_spec(settings.current(), "gpu_rec_k", [str(src)], None, None, None, None, None, True, False)
    assert spec.cuda_archs == "visible:9.0"

    class K(opforge.CudaExtension):
        name, kind, priority = "gpu_rec_status", "gpu_rec_status", 10
        sources = (str(src),)

    from opforge import platform, prebuilt

    status = K().status(platform.Platform(), prebuilt.Prebuilt("", {}))
    assert status.spec.cuda_archs == "visible:9.0"
    assert no_cuda_runtime == []
