"""Tuned configs in the cache (kernels/tuning.py) and the tuner's bookkeeping
(kernels/triton_launch.py), without a GPU: a stand-in kernel records its launches, and a stand-in
timer gives each config a fixed time. On a GPU, test_block_sparse_calls_cuda.py counts the real
tuning runs of a second process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from opforge.engine import inventory
from opforge.kernels import route, triton_launch
from opforge.kernels.triton_launch import TunedKernel, spec
from opforge.kernels.tuned_op import OpPlan, TunedOp
from opforge.kernels.tuning import TuningStore, fingerprint


class Config:  # triton.Config's shape: kwargs, num_warps, num_stages
    def __init__(self, kwargs, num_warps=4, num_stages=3):
        self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages


class FakeKernel:
    """A JITFunction's shape: arg_names, fn[grid](*args, **meta) -> a compiled kernel."""

    arg_names = ["x", "n", "BH", "BLOCK", "WARPS_HINT"]
    constexprs = [2, 3, 4]
    cache_key = "fake-source-v1"
    __name__ = "fake"

    def __init__(self):
        self.jit_launches = []
        self.direct_launches = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.jit_launches.append((grid, args, kw))
            return Compiled(self)
        return run


class Compiled:
    def __init__(self, kernel):
        self.kernel, self.function, self.packed_metadata = kernel, object(), object()

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
        self.kernel.direct_launches.append(((g0, g1, g2), args))


class Tuner(TunedKernel):
    """Times from a table (ms per BLOCK), facts without a GPU."""

    times = {16: 3.0, 32: 1.0, 64: 2.0}

    def _facts(self, device):
        return "triton-x", "Fake GPU", (9, 0)

    def _time(self, fn):
        fn()
        return self.times[self._last_block]

    def launch(self, choice, grid, args, device):
        self._last_block = choice.kwargs["BLOCK"]
        self.fn[grid](*args, **choice.kwargs)


CONFIGS = [Config({"BLOCK": b, "WARPS_HINT": 1}) for b in (16, 32, 64)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "auto")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # CPU torch has no CUDA
    return tmp_path


def test_a_key_is_tuned_once_then_read_from_the_cache(cache):
    trial = lambda c: ((1,), (torch.zeros(4), 4, 32))  # noqa: E731
    first = Tuner("fake_family", FakeKernel(), CONFIGS)
    got = first.choose(("k", 1), 0, trial, keep=lambda c: True)
    assert got.kwargs["BLOCK"] == 32 and first.tuning_runs == 1 and first.store_hits == 0
    assert first.choose(("k", 1), 0, trial, keep=lambda c: True) is got  # remembered: no second tuning
    assert first.tuning_runs == 1
    # a new process (a new tuner over the same cache) reads the winner: zero tuning runs
    second = Tuner("fake_family", FakeKernel(), CONFIGS)
    assert second.choose(("k", 1), 0, trial, keep=lambda c: True).kwargs["BLOCK"] == 32
    assert second.tuning_runs == 0 and second.store_hits == 1 and not second.fn.jit_launches
    # keep() limits the candidates
    third = Tuner("fake_family", FakeKernel(), CONFIGS)
    assert third.choose(("k", 2), 0, trial, keep=lambda c: c.kwargs["BLOCK"] != 32).kwargs["BLOCK"] == 64
    files = list((cache / ".tuning" / "fake_family").rglob("*.json"))
    assert len(files) == 2
    data = json.loads(files[0].read_text())
    assert data["format"] == 1 and data["fingerprint"] and "ms" in data


def test_another_source_configs_or_device_is_tuned_anew(cache):
    trial = lambda c: ((1,), (torch.zeros(4), 4, 32))  # noqa: E731
    Tuner("fam", FakeKernel(), CONFIGS).choose(("k",), 0, trial, keep=lambda c: True)
    edited = FakeKernel()
    edited.cache_key = "fake-source-v2"
    t = Tuner("fam", edited, CONFIGS)
    t.choose(("k",), 0, trial, keep=lambda c: True)
    assert t.tuning_runs == 1
    fewer = Tuner("fam", FakeKernel(), CONFIGS[:2])
    fewer.choose(("k",), 0, trial, keep=lambda c: True)
    assert fewer.tuning_runs == 1


def test_unreadable_or_foreign_winners_are_ignored(tmp_path):
    store = TuningStore(str(tmp_path), "fam", fingerprint("a"))
    os.makedirs(store.dir)
    with open(store.path(("k",)), "w") as f:
        f.write("{not json")
    assert store.get(("k",)) is None
    other = TuningStore(str(tmp_path), "fam", fingerprint("a"))
    other.put(("k",), 2, {})
    assert other.get(("k",)) == 2
    with open(store.path(("k",))) as f:
        data = json.load(f)
    data["key"] = "('other',)"  # a hash collision, or a hand edit: not this key's winner
    with open(store.path(("k",)), "w") as f:
        json.dump(data, f)
    assert store.get(("k",)) is None


def test_an_unwritable_cache_costs_a_tuning_run_not_an_error(tmp_path):
    root = tmp_path / "a-file"  # a file where the cache dir should be (root ignores permissions)
    root.write_text("")
    store = TuningStore(str(root), "fam", fingerprint("a"))
    store.put(("k",), 1, {})
    assert store.get(("k",)) is None


def test_the_launch_after_the_first_skips_the_jit(cache, monkeypatch):
    """The first launch of a (config, specialization) goes through fn[grid]; later ones call the
    compiled kernel's launcher with the meta-parameters appended; a new specialization (an int
    that becomes 1 or a multiple of 16, another dtype, another value of a constexpr) goes through
    the JIT again."""
    monkeypatch.setattr(triton_launch, "direct", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kernel = FakeKernel()
    t = TunedKernel("fam", kernel, CONFIGS)
    monkeypatch.setattr(triton_launch, "_STREAM", [lambda device: 7])
    c = t.choices[1]
    x = torch.zeros(4)
    t.launch(c, (3,), (x, 5, 32), 0)
    t.launch(c, (3,), (x, 7, 32), 0)
    assert len(kernel.jit_launches) == 1 and kernel.direct_launches == [((3, 1, 1), (x, 7, 32, 32, 1))]
    for n in (1, 32):
        t.launch(c, (3,), (x, n, 32), 0)
    t.launch(c, (3,), (x.double(), 5, 32), 0)
    t.launch(c, (3,), (x, 5, 64), 0)  # a constexpr is compiled in: 64 is another kernel than 32
    assert len(kernel.jit_launches) == 5
    t.launch(c, (3,), (x, 7, 64), 0)
    assert len(kernel.jit_launches) == 5 and kernel.direct_launches[-1] == ((3, 1, 1), (x, 7, 64, 32, 1))


def test_a_dependent_launch_compiles_with_launch_pdl_where_its_constexpr_says_so(cache, monkeypatch):
    """``TunedKernel(dependent=NAME)``: a launch whose NAME argument is true compiles with triton's
    ``launch_pdl`` (the kernel then waits for the one before it, griddepcontrol.wait); false, or a
    kernel without ``dependent``, compiles without it. Each is its own compiled kernel (a constexpr)."""
    monkeypatch.setattr(triton_launch, "direct", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(triton_launch, "_STREAM", [lambda device: 7])
    kernel = FakeKernel()
    t = TunedKernel("fam", kernel, CONFIGS, dependent="BH")
    x = torch.zeros(4)
    for bh in (True, False, True):
        t.launch(t.choices[0], (2,), (x, 5, bh), 0)
    assert [kw.get("launch_pdl") for _, _, kw in kernel.jit_launches] == [True, None]
    plain = FakeKernel()
    TunedKernel("fam", plain, CONFIGS).launch(t.choices[0], (2,), (x, 5, True), 0)
    assert "launch_pdl" not in plain.jit_launches[0][2]
    with pytest.raises(ValueError):
        TunedKernel("fam", FakeKernel(), CONFIGS, dependent="NOT_A_PARAMETER")


def test_spec_is_as_fine_as_tritons():
    x = torch.zeros(8)
    assert spec((x, 5)) != spec((x, 1)) != spec((x, 16))
    assert spec((x, 5)) == spec((x, 7))
    assert spec((x, 2**31)) != spec((x, 2**31 - 2))
    assert spec((x[1:], 5)) != spec((x, 5))  # 4 bytes in: not 16-byte aligned
    assert spec((x.half(), 5)) != spec((x, 5))
    assert spec((True,)) != spec((False,)) and spec((None,)) != spec(("ieee",))


def test_meta_parameters_must_be_the_kernels_last():
    with pytest.raises(ValueError, match="last parameters"):
        TunedKernel("fam", FakeKernel(), [Config({"WARPS_HINT": 1, "BLOCK": 16})])


def test_during_a_graph_capture_nothing_is_timed_or_remembered(cache, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    t = Tuner("fam", FakeKernel(), CONFIGS)
    trial = lambda c: ((1,), (torch.zeros(4), 4, 32))  # noqa: E731
    assert t.choose(("k",), 0, trial, keep=lambda c: c.kwargs["BLOCK"] > 16).kwargs["BLOCK"] == 32
    assert t.tuning_runs == 0 and not t._chosen and not (cache / ".tuning").exists()


def test_cache_list_and_clean_show_and_remove_tuned_configs(cache):
    store = TuningStore(str(cache), "block_sparse_triton", fingerprint("a"))
    store.put(("k",), 1, {})
    rows = inventory.leftovers(str(cache))
    assert [(r.name, r.what) for r in rows] == [("block_sparse_triton", "tuned configs")]
    assert inventory.known(str(cache), "block_sparse_triton")
    done = inventory.clean(str(cache), "block_sparse_triton")
    assert store.dir in done.removed and not os.path.exists(store.dir)


def test_tuning_off_takes_the_first_fitting_config_untimed(cache, monkeypatch):
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "off")
    t = Tuner("fam", FakeKernel(), CONFIGS)
    trial = lambda c: ((1,), (torch.zeros(4), 4, 32))  # noqa: E731
    assert t.choose(("k",), 0, trial, keep=lambda c: c.kwargs["BLOCK"] > 16).kwargs["BLOCK"] == 32
    assert t.tuning_runs == 0 and not t.fn.jit_launches and not (cache / ".tuning").exists()


def test_prefer_orders_the_untimed_pick_and_tuning_still_times_them_all(cache, monkeypatch):
    """``prefer`` (the decode split's preferred value first) decides what runs untimed (tuning
    off, capture); with tuning on the fastest still wins, whatever the order."""
    trial = lambda c: ((1,), (torch.zeros(4), 4, 32))  # noqa: E731
    prefer = lambda c: abs(c.kwargs["BLOCK"] - 64)  # noqa: E731
    timed = Tuner("fam", FakeKernel(), CONFIGS)
    assert timed.choose(("k",), 0, trial, keep=lambda c: True, prefer=prefer).kwargs["BLOCK"] == 32
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "off")
    untimed = Tuner("fam", FakeKernel(), CONFIGS)
    assert untimed.choose(("k2",), 0, trial, keep=lambda c: True, prefer=prefer).kwargs["BLOCK"] == 64
    assert untimed.choose(("k3",), 0, trial, keep=lambda c: c.kwargs["BLOCK"] < 64, prefer=prefer) \
        .kwargs["BLOCK"] == 32


def test_decode_split_candidates_follow_the_measured_rule():
    """triton_sizing's decode split: the preferred split gives about 3 programs per SM for
    64-wide blocks, twice as many for 32-wide, half for 128-wide; the most is bounded by the
    row's blocks and by L2; none past SPLIT_MAX_TOKENS (the rule alone: no triton needed)."""
    from opforge.kernels.block_sparse.triton_sizing import SPLIT_MAX_TOKENS, SPLITS, decode_split

    l2 = 50 * 2**20
    assert decode_split(16, 4096, 64, 2048, 64, 132, l2)[0] == 6  # 4096->4096, 64-blocks: 384 programs
    assert decode_split(16, 4096, 128, 8192, 32, 132, l2)[0] == 6  # 32-blocks: twice the programs
    assert decode_split(16, 4096, 32, 512, 128, 132, l2)[0] == 6  # 128-blocks: half
    assert decode_split(32, 4096, 64, 2048, 64, 132, l2)[0] == 3  # two 16-token tiles a row
    assert decode_split(16, 4096, 64, 128, 64, 132, l2) == (2, 2)  # 2 blocks a row: at most 2
    assert decode_split(SPLIT_MAX_TOKENS + 1, 4096, 64, 2048, 64, 132, l2) == (1, 1)
    preferred, most = decode_split(1, 4096, 64, 2048, 64, 132, 2**20)  # a small L2 bounds the partials
    assert most == 16 and preferred == 6
    assert SPLITS[0] == 1 and max(SPLITS) == 16


def test_the_setting_turns_the_direct_launch_off(tmp_path):
    code = textwrap.dedent("""
        from opforge.kernels import triton_launch
        print(triton_launch.settings.current().triton_direct)
    """)
    env = dict(os.environ, OPFORGE_TRITON_DIRECT="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class TimedRoute(route.Route):
    """A route whose candidates take the times of a table (ms per name)."""

    times = {"a": 2.0, "b": 1.0}

    def _time(self, fn):
        fn()
        return self.times[fn.__name__]


def route_runs(launched: list) -> dict:
    def a():
        launched.append("a")

    def b():
        launched.append("b")

    return {"a": a, "b": b}


def test_a_route_times_its_kernels_once_keeps_the_faster_and_a_new_process_reads_it(cache):
    kernels = (Tuner("fam", FakeKernel(), CONFIGS), Tuner("fam", FakeKernel(), CONFIGS))
    route, launched = TimedRoute("fam", "r", ("a", "b"), kernels), []
    assert route.choose(("k", 1), 0, route_runs(launched)) == "b"
    assert launched == ["a", "a", "b", "b"] and route.tuning_runs == 1  # each compiled, then timed
    assert route.choose(("k", 1), 0, route_runs(launched)) == "b" and len(launched) == 4  # remembered
    again = TimedRoute("fam", "r", ("a", "b"), kernels)  # a new process: read from the cache
    assert again.choose(("k", 1), 0, route_runs(launched)) == "b"
    assert again.tuning_runs == 0 and again.store_hits == 1 and len(launched) == 4
    other = TimedRoute("fam", "r", ("a", "b"), (Tuner("fam", FakeKernel(), CONFIGS[:2]),) + kernels[1:])
    assert other.choose(("k", 1), 0, route_runs(launched)) == "b" and other.tuning_runs == 1  # other configs


def test_a_route_runs_its_first_kernel_untimed_with_tuning_off_or_under_a_capture(cache, monkeypatch):
    kernels = (Tuner("fam", FakeKernel(), CONFIGS),)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    route, launched = TimedRoute("fam", "r", ("a", "b"), kernels), []
    assert route.choose(("k",), 0, route_runs(launched)) == "a" and launched == [] and route.tuning_runs == 0
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert route.choose(("k",), 0, route_runs(launched)) == "b"  # not kept from the capture: timed now
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "off")
    fresh = TimedRoute("fam", "r2", ("a", "b"), kernels)
    assert fresh.choose(("k",), 0, route_runs(launched)) == "a" and fresh.tuning_runs == 0


def test_a_route_times_only_the_candidates_offered_and_keys_them_apart(cache):
    """A candidate that can't take a call (the CUDA decode kernel on an older GPU, past 32 tokens, or
    not built) is left out of ``runs``: the others are timed, the winner kept under a key naming the
    ones offered, so the day it is offered the size class is timed again with it."""
    kernels = (Tuner("fam", FakeKernel(), CONFIGS),)
    route, launched = TimedRoute("fam", "r3", ("a", "b", "c"), kernels), []
    runs = route_runs(launched)
    assert route.choose(("k",), 0, runs) == "b" and launched == ["a", "a", "b", "b"]

    def c():
        launched.append("c")

    route.times = {"a": 2.0, "b": 1.0, "c": 0.5}
    assert route.choose(("k",), 0, {**runs, "c": c}) == "c" and route.tuning_runs == 2  # timed anew, with c
    assert route.choose(("k",), 0, runs) == "b"  # the subset's choice is still its own
    again = TimedRoute("fam", "r3", ("a", "b", "c"), kernels)  # a new process reads both
    assert again.choose(("k",), 0, runs) == "b" and again.choose(("k",), 0, {**runs, "c": c}) == "c"
    assert again.tuning_runs == 0 and again.store_hits == 2
    with pytest.raises(ValueError, match="none of"):
        route.choose(("k",), 0, {"z": c})


def test_a_route_with_tuning_off_runs_its_first_offered_candidate(cache, monkeypatch):
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "off")
    route, launched = TimedRoute("fam", "r4", ("c", "a", "b"), (Tuner("fam", FakeKernel(), CONFIGS),)), []
    assert route.choose(("k",), 0, route_runs(launched)) == "a" and launched == []


class TimedOp(TunedOp):
    """A TunedOp with times from a table (ms per stages) and facts without a GPU."""

    times = {2: 3.0, 3: 1.0, 4: 2.0}

    def _facts(self, device):
        return "Fake GPU", (9, 0), "13.0"

    def _time(self, fn):
        fn()
        return self.times[self._last[-2]]


def test_an_op_tunes_its_configs_once_and_a_new_process_reads_the_winner(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # CPU torch has no CUDA
    source = tmp_path / "kernel.cu"
    source.write_text("// v1")
    calls = []

    def make():
        op = TimedOp("fam", "op", lambda: record, [{"stages": s, "ctas": 2} for s in (2, 3, 4)],
                     lambda: [str(source)])

        def record(*args):
            op._last = args
            calls.append(args)
        return op

    op = make()
    choice = op.choose(("k",), 0, lambda c: (None, ("x", 0)), lambda c: c.kwargs["stages"] != 4)
    assert choice.kwargs == {"stages": 3, "ctas": 2} and op.tuning_runs == 1
    assert {a[-2] for a in calls} == {2, 3}  # the config that doesn't fit was never launched
    assert all(a[:2] == ("x", 0) and a[-1] == 2 for a in calls)  # the prefix, then the config's values
    again = make()
    assert again.choose(("k",), 0, lambda c: (None, ("x", 0)), lambda c: True).kwargs["stages"] == 3
    assert again.tuning_runs == 0 and again.store_hits == 1
    plan = OpPlan(again, again.choose(("k",), 0, None, None), ("cuda",))
    before = len(calls)
    plan(("y", 1), 0)
    assert calls[before:] == [("y", 1, 3, 2)] and plan.native  # a NativeTable can't replay an op
    source.write_text("// v2: an edited kernel is tuned again")
    edited = make()
    edited.choose(("k",), 0, lambda c: (None, ("x", 0)), lambda c: True)
    assert edited.tuning_runs == 1


def test_an_ops_configs_must_name_the_same_values():
    with pytest.raises(ValueError, match="every config must set"):
        TunedOp("fam", "op", lambda: None, [{"stages": 2, "ctas": 1}, {"ctas": 1, "stages": 2}], lambda: [])


def test_a_route_with_a_timer_goes_by_its_times_and_keeps_its_picks_apart_from_do_bench(cache):
    """The decode route times its candidates under graph replay (``timer``): its times decide, and a
    route timed another way is keyed apart (its ``timing`` is in the fingerprint). A timer that can't
    time one candidate has them all timed as configs are, never a mix of the two."""
    kernels = (Tuner("fam", FakeKernel(), CONFIGS),)
    route, launched = TimedRoute("fam", "r4", ("a", "b"), kernels, timing="replay"), []
    assert route.choose(("k",), 0, route_runs(launched), {"a": 0.5, "b": 1.0}.get) == "a"
    assert launched == ["a", "b"]  # each compiled once; the timer did the timing
    other = TimedRoute("fam", "r4", ("a", "b"), kernels)  # the same route, do_bench: not its pick
    assert other.choose(("k",), 0, route_runs(launched)) == "b" and other.tuning_runs == 1
    again = TimedRoute("fam", "r4", ("a", "b"), kernels, timing="replay")
    assert again.choose(("k",), 0, route_runs(launched)) == "a" and again.store_hits == 1
    mixed = TimedRoute("fam", "r5", ("a", "b"), kernels, timing="replay")
    assert mixed.choose(("k",), 0, route_runs(launched), {"a": 0.5}.get) == "b"  # b untimed: do_bench's times
