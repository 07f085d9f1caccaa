"""Platform facts: detected here, built by hand in other tests; JSON; tool versions memoised."""

from __future__ import annotations

import json
import os

import torch
from conftest import run_python

from opforge import platform as platform_mod
from opforge import settings
from opforge.compat import TorchFacts
from opforge.platform import Platform, ToolInfo


def test_detects_this_machine(cache_dir):
    p = platform_mod.detect(settings.current())
    assert p.machine == os.uname().machine
    assert p.cpu.microarch and p.cpu.cores >= 1
    if p.is_x86:
        assert p.cpu.has("sse2")
    assert p.torch_version == torch.__version__ and p.torch_cuda == torch.version.cuda
    assert p.torch.python_tag.startswith("cpython-")
    if not torch.cuda.is_available():
        assert p.gpus == () and p.gpu_probe
    assert p.ninja is not None and p.ninja.version


def test_gpus_are_listed_without_initialising_cuda(cache_dir):
    """In a fresh process: another test in this one may have initialised CUDA already."""
    out = run_python("import torch; from opforge import platform as p; gpus = p.current().gpus; "
                     "print(len(gpus), torch.cuda.is_initialized())")
    assert out.returncode == 0, out.stderr
    count, initialised = out.stdout.split()
    assert initialised == "False"
    assert int(count) == torch.cuda.device_count()


def test_no_compiler_is_a_fact_not_an_error(cache_dir, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert platform_mod.detect(settings.current()).cxx is None


def test_tool_versions_are_memoised_by_identity(cache_dir, counting_cxx):
    first = platform_mod.detect(settings.current()).cxx
    assert first.version and first.version_tuple[0] >= 5
    assert len(counting_cxx.probes()) == 1
    again = platform_mod.detect(settings.current()).cxx
    assert again == first and len(counting_cxx.probes()) == 1  # read from the memo: no subprocess


def test_current_is_detected_once(cache_dir):
    s = settings.current()
    assert platform_mod.current(s) is platform_mod.current(s)


def test_to_json_round_trips_through_json(cache_dir):
    data = json.loads(json.dumps(platform_mod.current().to_json()))
    assert set(data) >= {"os", "machine", "cpu", "gpus", "cxx", "nvcc", "ninja", "torch_version", "torch_cuda"}
    assert isinstance(data["cpu"]["features"], list)


def test_hand_built_platforms_need_only_what_matters():
    p = Platform(torch=TorchFacts("2.9.1"), nvcc=ToolInfo("/n", "Cuda compilation tools, release 12.8, V12.8.93"))
    assert p.torch_minor == (2, 9) and p.nvcc.version_tuple == (12, 8)
    assert not p.has_cuda_gpu and p.cxx is None
