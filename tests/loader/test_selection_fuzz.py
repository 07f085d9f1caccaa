"""Selection over random ``Platform`` facts (hypothesis), for every kernel kind opforge ships.

* ``select`` (pure): the chosen candidate is the first of the priority order that is Accepted;
  every one before it is Rejected with a reason; whatever is Accepted really fits the facts
  (its ISA's features, an NVIDIA GPU of its capability and a CUDA torch, triton, a compiler
  when it must be built); the pure-torch implementation is always there for CPU tensors.
* ``KernelLoader.load`` on such a platform, with builds that fail at random: it returns an
  implementation whose Decision is Accepted (the first that loads), or raises a clear error
  (strict: the first failure itself; otherwise every reason, one line each).

Nothing is built: each extension's state (prebuilt / cached / needs build) is drawn, and its
``load`` is replaced by one that succeeds or fails as drawn.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

import opforge
from opforge import isa
from opforge.compat import TorchFacts
from opforge.errors import BuildError, OpforgeError
from opforge.extension import (
    CACHED,
    NEEDS_BUILD,
    PREBUILT,
    READY,
    CompiledExtension,
    CudaExtension,
    Extension,
    LoadedKernel,
    PythonExtension,
    Status,
)
from opforge.loader import KernelLoader
from opforge.platform import Cpu, Gpu, Platform, ToolInfo
from opforge.registry import loaders
from opforge.selection import select

KINDS = loaders()  # every kernel kind opforge ships, selftest too
FEATURES = sorted({f for i in isa.ALL.values() for f in i.features} | {"sse4_2", "avx", "sve"})


def tools(name: str, versions: list[str]):
    return st.one_of(st.none(), st.builds(ToolInfo, st.just(f"/usr/bin/{name}"), st.sampled_from(versions)))


nvidia = st.builds(Gpu, index=st.integers(0, 7), name=st.sampled_from(["H100", "A100", "V100", "K80", "RTX 4090"]),
                   vendor=st.just("nvidia"), capability=st.tuples(st.integers(3, 12), st.integers(0, 9)),
                   arch=st.sampled_from(["", "sm_90", "sm_80"]))
amd = st.builds(Gpu, index=st.integers(0, 7), name=st.sampled_from(["MI300X", "MI250"]), vendor=st.just("amd"),
                capability=st.none(), arch=st.sampled_from(["gfx942", "gfx90a"]))
gpus = st.lists(st.one_of(nvidia, amd), max_size=3)

platforms = st.builds(
    Platform,
    machine=st.sampled_from(["x86_64", "AMD64", "aarch64", "arm64", "ppc64le", "riscv64"]),
    cpu=st.builds(Cpu, family=st.sampled_from(["x86_64", "aarch64", "ppc64le"]),
                  microarch=st.sampled_from(["icelake", "haswell", "zen4", "neoverse_v2", "power9", "x86_64"]),
                  features=st.frozensets(st.sampled_from(FEATURES)), cores=st.integers(1, 256)),
    gpus=gpus.map(tuple),
    gpu_probe=st.sampled_from(["nvml", "torch", "none", "CUDA_VISIBLE_DEVICES is empty"]),
    cxx=tools("g++", ["g++ (Debian 12.2.0-14) 12.2.0", "clang version 17.0.6", ""]),
    nvcc=tools("nvcc", ["Build cuda_13.0.r13.0/compiler.36260728_0", "Cuda compilation tools, release 12.4, V12.4.131",
                        ""]),
    ninja=tools("ninja", ["1.11.1", ""]),
    torch=st.builds(TorchFacts,
                    version=st.sampled_from(["2.13.0", "2.11.0", "2.9.1", "2.4.0", "2.14.0.dev20261120",
                                             "2.10.0a0+git1234"]),
                    cuda=st.sampled_from([None, "13.0", "12.4", "11.8"]),
                    hip=st.sampled_from([None, "6.2"])),
    triton=st.sampled_from([None, "3.5.0", "3.1.0"]),
)
DEVICES = st.sampled_from([None, "cpu", "cuda", "meta"])


def statuses_for(exts):
    """A state for each extension that could be in one: compiled ones prebuilt, cached or not;
    Python ones always ready."""
    compiled = [e.name for e in exts if isinstance(e, CompiledExtension)]
    return st.fixed_dictionaries({n: st.sampled_from([PREBUILT, CACHED, NEEDS_BUILD]).map(Status) for n in compiled})


def check_fits(ext: Extension, p: Platform, status: Status | None, device: str | None) -> None:
    """What an Accepted decision promises, restated from the facts (not from the checks)."""
    if device is not None:
        assert not ext.devices or device in ext.devices, (ext.name, device)
    if ext.backend == "cpp":
        target = ext.isa
        assert not target.machines or p.machine in target.machines, (ext.name, p.machine)
        assert set(target.features) <= p.cpu.features, (ext.name, p.cpu.features)
    if isinstance(ext, CudaExtension):
        assert any(g.vendor == "nvidia" and g.capability >= ext.min_capability for g in p.gpus), (ext.name, p.gpus)
        assert p.torch_cuda is not None
    if ext.backend == "triton":
        assert p.gpus and p.triton is not None, ext.name
    if isinstance(ext, CompiledExtension) and ext.stable_abi:
        from opforge.compat import version_tuple

        assert version_tuple(p.torch_version) >= version_tuple(ext.stable_abi), (ext.name, p.torch_version)
    if isinstance(ext, CompiledExtension) and status.state == NEEDS_BUILD:
        assert p.cxx is not None and p.ninja is not None and ext.support_jit, ext.name
        if ext.backend == "cuda":
            assert p.nvcc is not None, ext.name


@pytest.mark.parametrize("kind", sorted(KINDS))
@given(data=st.data())
def test_fuzz_select_chooses_the_first_accepted_and_it_fits(kind, data):
    exts = KINDS[kind]().extensions()
    p = data.draw(platforms, label="platform")
    statuses = data.draw(statuses_for(exts), label="states")
    device = data.draw(DEVICES, label="device")
    cands = select(exts, p, statuses, device)
    assert [c.name for c in cands] == [e.name for e in sorted(exts, key=lambda e: (-e.priority, e.name))]
    chosen = [c for c in cands if c.chosen]
    assert len(chosen) <= 1
    for c in cands:
        if c.decision:
            check_fits(c.extension, p, c.status or statuses.get(c.name, Status(READY)), device)
        else:
            assert c.decision.reason.strip(), c.name  # every rejection says why
    first = next((c for c in cands if c.decision), None)
    assert (chosen[0] if chosen else None) is first
    if device in (None, "cpu"):  # the pure-torch implementation serves any CPU tensor, on any platform
        assert first is not None and any(c.decision and c.extension.backend == "torch" for c in cands)
    if device == "meta":  # nothing of opforge's takes meta tensors, except what takes any device
        assert all(not c.decision or not c.extension.devices for c in cands)


@pytest.fixture
def fake_world(monkeypatch):
    """Platform facts, states and build outcomes as drawn: ``world(platform, states, broken)``."""
    world = {}
    monkeypatch.setattr("opforge.platform.current", lambda *a, **k: world["platform"])

    def status(self, platform, prebuilt, settings=None):
        return world["states"][self.name]

    def load(self, platform=None, status=None, verbose=False):
        world["tried"].append(self.name)
        if self.name in world["broken"]:
            raise BuildError(f"building {self.name} failed: error: the compiler crashed (drawn)")
        return LoadedKernel(self.name, self.kind, self.backend, "fake", "", None)

    monkeypatch.setattr(CompiledExtension, "status", status)
    monkeypatch.setattr(PythonExtension, "status", lambda self, *a, **k: Status(READY))
    monkeypatch.setattr(Extension, "load", load)

    def set_world(platform, states, broken):
        world.update(platform=platform, states=states, broken=broken, tried=[])
        opforge.reset()
        return world

    yield set_world
    opforge.reset()


@pytest.mark.parametrize("kind", sorted(KINDS))
@given(data=st.data())
def test_fuzz_load_returns_an_accepted_extension_or_a_clear_error(kind, data, fake_world):
    loader: KernelLoader = KINDS[kind]()
    exts = loader.extensions()
    p = data.draw(platforms, label="platform")
    states = data.draw(statuses_for(exts), label="states")
    broken = data.draw(st.frozensets(st.sampled_from([e.name for e in exts])), label="builds that fail")
    device = data.draw(DEVICES, label="device")
    strict = data.draw(st.booleans(), label="strict")
    ext_name = data.draw(st.one_of(st.none(), st.sampled_from([e.name for e in exts])), label="ext_name")
    world = fake_world(p, states, broken)
    cands = select(exts, p, states, device)
    accepted = [c.name for c in cands if c.decision]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warnings (their text is tested in test_loader)
        try:
            got = loader.load(ext_name=ext_name, strict=strict, device=device)
        except OpforgeError as exc:
            message = str(exc)
            if ext_name is not None:
                c = next(c for c in cands if c.name == ext_name)
                assert (not c.decision and f"{ext_name} can't be used here: {c.decision.reason}" in message) \
                    or (c.decision and ext_name in broken and "failed" in message), message
            elif strict and accepted:  # the first accepted one failed: its own error, unwrapped
                assert isinstance(exc, BuildError) and world["tried"] == [accepted[0]], message
            else:
                assert set(accepted) <= broken, (accepted, broken)
                assert message.startswith(f"no {kind} implementation can be loaded here:")
                for c in cands:  # one line per implementation: why it was rejected, or how it failed
                    assert c.name in message
                    if not c.decision:
                        assert c.decision.reason in message
                assert world["tried"] == accepted
            return
    assert got.name in accepted  # never a rejected one
    assert got.name not in broken
    if ext_name is not None:
        assert got.name == ext_name
    else:  # the first that loads, after trying every one above it, in order
        assert world["tried"] == accepted[: accepted.index(got.name) + 1]
        if strict:
            assert got.name == accepted[0]
