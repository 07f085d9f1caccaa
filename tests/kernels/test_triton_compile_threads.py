"""A tuning's candidate configs compiled at once, on threads, before they are timed
(``kernels/compile_ahead.py``, ``TunedKernel._precompile``, through triton's async compile mode): the thread count, the fallback to
compiling in turn, the options each compile gets, and on a GPU, real compiles on the pool's threads
that the timing loop then finds done."""

from __future__ import annotations

import os
import threading
import types

import pytest
import torch

from opforge.kernels import compile_ahead
from opforge.kernels.compile_ahead import compile_threads
from opforge.kernels.triton_compat import jit, tl
from opforge.kernels.triton_launch import TunedKernel


@jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_threads_come_from_the_setting_else_the_cpus_at_most_16(monkeypatch):
    monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", "3")
    assert compile_threads(10) == 3 and compile_threads(2) == 2
    monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", "1")
    assert compile_threads(10) == 1
    for unset in ("", "0", "many"):
        monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", unset)
        assert compile_threads(100) == min(16, len(os.sched_getaffinity(0)))


class FakeJit:
    """A JITFunction's shape for ``_precompile``: ``warmup`` records each compile asked for and the thread."""

    arg_names = ["x", "OVERLAP", "BLOCK"]
    constexprs = [1, 2]
    cache_key = "fake-jit-v1"
    __name__ = "fake_jit"

    def __init__(self):
        self.warmups = []

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((args, grid, kwargs))


class FakeMode:
    """``AsyncCompileMode``'s shape: entered with the executor; records that it was."""

    entered: list = []

    def __init__(self, executor, ignore_errors=False):
        self.executor, self.ignore_errors = executor, ignore_errors

    def __enter__(self):
        FakeMode.entered.append((type(self.executor).__name__, self.ignore_errors))
        return self

    def __exit__(self, *exc):
        return False


def fake_kernel(monkeypatch, threads: str):
    monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", threads)
    monkeypatch.setattr(compile_ahead, "async_compile_mode", lambda: FakeMode)
    monkeypatch.setattr(compile_ahead, "triton", types.SimpleNamespace(runtime=types.SimpleNamespace(JITFunction=FakeJit)))
    fn = FakeJit()
    configs = [types.SimpleNamespace(kwargs={"BLOCK": b}, num_warps=w, num_stages=2) for b in (16, 32) for w in (4, 8)]
    return TunedKernel("fake", fn, configs, dependent="OVERLAP"), fn


def test_each_candidate_is_compiled_once_with_its_options_and_a_failing_trial_is_skipped(monkeypatch):
    FakeMode.entered.clear()
    k, fn = fake_kernel(monkeypatch, "4")
    x = torch.zeros(4)

    def trial(choice):
        if choice.num_warps == 8 and choice.kwargs["BLOCK"] == 32:
            raise RuntimeError("this candidate can't be sized")
        return (3,), (x, 1)

    k._compiled[(0, -1, k.spec((x, 1)))] = object()  # the first candidate is compiled already: not again
    k._precompile(k.choices, trial, -1)  # (torch.cuda.device(-1) selects no device)
    assert FakeMode.entered == [("ThreadPoolExecutor", True)]
    assert [w[2] for w in fn.warmups] == [
        {"BLOCK": 16, "num_warps": 8, "num_stages": 2, "launch_pdl": True},
        {"BLOCK": 32, "num_warps": 4, "num_stages": 2, "launch_pdl": True},
    ]
    assert all(w[0] == (x, 1) and w[1] == (3,) for w in fn.warmups)
    fn.warmups.clear()
    k._precompile(k.choices, lambda c: ((3,), (x, 0)), -1)  # not a dependent launch: no PDL
    assert len(fn.warmups) == 4 and not any("launch_pdl" in w[2] for w in fn.warmups)


def test_one_thread_or_no_async_mode_compiles_nothing_ahead(monkeypatch):
    k, fn = fake_kernel(monkeypatch, "1")
    k._precompile(k.choices, lambda c: ((1,), (torch.zeros(1), 0)), None)
    assert fn.warmups == []
    k, fn = fake_kernel(monkeypatch, "4")
    monkeypatch.setattr(compile_ahead, "async_compile_mode", lambda: None)
    k._precompile(k.choices, lambda c: ((1,), (torch.zeros(1), 0)), None)
    assert fn.warmups == []


@pytest.mark.cuda
def test_on_a_gpu_the_configs_compile_on_the_pools_threads_and_the_timing_compiles_none(monkeypatch, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    triton = pytest.importorskip("triton")
    from opforge.kernels.triton_compat import async_compile_mode

    if async_compile_mode() is None:
        pytest.skip("this triton has no async compile mode: configs compile in turn")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "opforge"))
    monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", "4")
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in (128, 256, 512, 1024) for w in (2, 4)]
    k = TunedKernel("compile_threads_test", double, configs)
    device = torch.cuda.current_device()
    double.device_caches[device]  # noqa: B018  (makes the binder, and with it ``double.compile``)
    compiled_on: list[str] = []
    real = double.compile

    def recording(*args, **kwargs):
        compiled_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(double, "compile", recording)
    x = torch.randn(10_000, device="cuda")
    y = torch.full_like(x, float("nan"))
    trial = lambda c: ((triton.cdiv(x.numel(), c.kwargs["BLOCK"]),), (x, y, x.numel()))  # noqa: E731
    k._precompile(k.choices, trial, device)
    assert len(compiled_on) == len(configs) and all(n.startswith("opforge-compile") for n in compiled_on)
    assert torch.isnan(y).all()  # compiled, not launched
    choice = k.choose(("n", x.numel()), device, trial, lambda c: True)
    assert len(compiled_on) == len(configs)  # the timing loop found every one compiled
    k.launch(choice, *trial(choice), device)
    torch.testing.assert_close(y, 2 * x)


class ScopeTuner(TunedKernel):
    """A FakeJit tuner whose facts, times and launches need no GPU."""

    def _facts(self, device):
        return "triton-x", "Fake GPU", (9, 0)

    def _time(self, fn):
        fn()
        return {16: 2.0, 32: 1.0}[self._last]

    def launch(self, choice, grid, args, device):
        self._last = choice.kwargs["BLOCK"]


def test_inside_compiling_ahead_a_choice_starts_compiles_and_tunes_nothing(monkeypatch, tmp_path):
    """``decode_route``'s first pass: each kernel's untuned candidates go to one pool, its first candidate comes
    back untimed and unremembered; the pass after the scope tunes, and nothing is left to compile."""
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "auto")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # CPU torch has no CUDA
    FakeMode.entered.clear()
    _, fn = fake_kernel(monkeypatch, "4")
    configs = [types.SimpleNamespace(kwargs={"BLOCK": b}, num_warps=4, num_stages=2) for b in (16, 32)]
    k = ScopeTuner("fake_scope", fn, configs)
    other = ScopeTuner("fake_scope_other", FakeJit(), configs)
    trial = lambda c: ((1,), (torch.zeros(1), 0))  # noqa: E731
    assert compile_ahead.can_compile_ahead()
    with compile_ahead.compiling_ahead(-1):
        with compile_ahead.compiling_ahead(-1):  # nested: the outer scope stays the one
            assert k.choose(("a",), -1, trial, lambda c: True).kwargs["BLOCK"] == 16  # untimed
        assert other.choose(("a",), -1, trial, lambda c: True).kwargs["BLOCK"] == 16
    assert FakeMode.entered == [("ThreadPoolExecutor", True)]  # one pool for both kernels
    assert len(fn.warmups) == 2 and len(other.fn.warmups) == 2 and k.tuning_runs == other.tuning_runs == 0
    assert k.choose(("a",), -1, trial, lambda c: True).kwargs["BLOCK"] == 32  # after it: tuned
    assert k.tuning_runs == 1
    monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", "1")
    assert not compile_ahead.can_compile_ahead()
    monkeypatch.setenv("OPFORGE_TRITON_COMPILE_THREADS", "4")
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "off")
    assert not compile_ahead.can_compile_ahead()  # nothing would be compiled ahead: no first pass
