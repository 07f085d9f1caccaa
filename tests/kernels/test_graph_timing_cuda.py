"""Timing as a model runs (``kernels/graph_timing.py``, issue 35): the stand-ins for a weight keep
each call reading HBM, each replayed call takes the next one, the decode route is
timed with it on a fresh cache, and the route's first timing inside torch.compile's
reduce-overhead warm-up leaves results equal to eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from block_sparse_cases import case, close

from opforge.kernels import graph_timing

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

L2 = torch.cuda.get_device_properties(0).L2_cache_size


def test_the_stand_ins_are_like_the_weight_distinct_and_past_l2():
    w = torch.empty(300, 64, 64, dtype=torch.bfloat16, device="cuda")  # 2.4 MB
    views = graph_timing.rotated(w, L2)
    assert views is not None and len(views) >= 3
    size = w.numel() * w.element_size()
    assert all(v.shape == w.shape and v.dtype == w.dtype and v.is_contiguous() for v in views)
    assert all(v.data_ptr() % 256 == 0 for v in views)
    starts = sorted(v.data_ptr() for v in views)
    assert all(b - a >= size for a, b in zip(starts, starts[1:]))  # no two overlap
    assert (len(views) - 1) * size >= 2 * L2  # between two uses of one: twice L2 of the others
    big = torch.empty(graph_timing.SCRATCH_BYTES // 2 + 2, dtype=torch.uint8, device="cuda")
    assert graph_timing.rotated(big, L2) is None  # two of them don't fit the scratch
    assert graph_timing.rotated(w[:, :, ::2], L2) is None  # not contiguous: no like stand-in


def test_each_replayed_call_takes_the_next_stand_in():
    """The graph holds at least MIN_LAUNCHES calls, each on the next stand-in in turn (so none is
    read again before the others' bytes have passed twice L2); the other arguments stay as given.
    A tensor that isn't among the arguments, or a weight too large for two stand-ins, is not timed."""
    w = torch.randn(512, 1024, dtype=torch.float16, device="cuda")  # 1 MB
    other = torch.ones(1024, dtype=torch.float16, device="cuda")
    stand_ins = graph_timing.StandIns(w, L2)
    seen = []

    def launch(args):
        seen.append((args[0].data_ptr(), args[1] is other))
        torch.mv(args[0], args[1])
    launch((w, other))  # warmed up before it is timed, as the tuner's candidates are (cuBLAS's handle)
    seen.clear()
    ms = stand_ins.per_call_ms(launch, (w, other), 0)
    views = [v.data_ptr() for v in stand_ins.views()]
    count = graph_timing.launches(len(views))
    assert count >= graph_timing.MIN_LAUNCHES and len(seen) == count  # captured once, replayed
    assert [p for p, _ in seen] == [views[i % len(views)] for i in range(count)] and all(k for _, k in seen)
    assert w.data_ptr() not in views and ms is not None and ms > 0
    assert stand_ins.per_call_ms(launch, (other, other), 0) is None
    big = torch.empty(graph_timing.SCRATCH_BYTES // 2 + 2, dtype=torch.uint8, device="cuda")
    assert graph_timing.StandIns(big, L2).per_call_ms(launch, (big,), 0) is None


def test_a_fresh_decode_route_is_timed_under_graph_replay(cache_dir, monkeypatch):
    from opforge.kernels.block_sparse import triton_impl
    from opforge.ops import block_sparse_linear

    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "auto")
    timed = []
    real = graph_timing.per_call_ms
    monkeypatch.setattr(graph_timing, "per_call_ms", lambda *a: timed.append(a[1]) or real(*a))
    triton_impl.forget_plans()
    for k in triton_impl.KERNELS.values():
        k.forget()
    try:
        mask = torch.rand(48, 32, generator=torch.Generator().manual_seed(0)) < 0.5
        lay, w, x, b, ref = case(mask, (64, 64), 3, torch.bfloat16)
        close(block_sparse_linear(x, w, b, lay), ref, torch.bfloat16)
        tried = len(timed)  # each config of decode, uncut, pointer (and the CUDA kernel on sm_90+), then each
        assert tried > 4 and set(timed) == {graph_timing.launches(len(graph_timing.rotated(w, L2)))}
        assert triton_impl.DECODE_ROUTE.tuning_runs == 1
        for name in ("decode", "decode_uncut", "fwd"):  # their keys say how they were timed
            assert [k for _, k in triton_impl.KERNELS[name]._chosen] and \
                all(k[-1] == "replayed" for _, k in triton_impl.KERNELS[name]._chosen), name
        close(block_sparse_linear(x, w, b, lay), ref, torch.bfloat16)  # the route's pick, planned once
        assert len(timed) == tried
    finally:
        triton_impl.forget_plans()
        for k in triton_impl.KERNELS.values():
            k.forget()


COMPILED = textwrap.dedent("""
    import json, torch
    from opforge.kernels.block_sparse import triton_impl
    from opforge.nn import BlockSparseLinear
    torch.manual_seed(0)
    m = BlockSparseLinear(1024, 2048, density=0.5, block_shape=(64, 64)).cuda().to(torch.bfloat16)
    compiled = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    errs = []
    with torch.no_grad():
        for seed in range(4):  # the first runs tune the route inside cudagraph trees' warm-up
            x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16,
                            generator=torch.Generator("cuda").manual_seed(seed))
            ref = m(x).float()
            errs.append((compiled(x).clone().float() - ref).abs().max().item() / ref.abs().max().item())
    print(json.dumps({"errs": errs, "route": triton_impl.DECODE_ROUTE.tuning_runs}))
""")


def test_a_route_first_timed_inside_reduce_overhead_warm_up_equals_eager(tmp_path):
    env = dict(os.environ, OPFORGE_CACHE_DIR=str(tmp_path / "cache"), OPFORGE_TRITON_TUNING="auto")
    out = subprocess.run([sys.executable, "-c", COMPILED], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["route"] == 1 and max(got["errs"]) < 1e-2, got
