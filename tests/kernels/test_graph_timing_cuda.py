"""Timing as a model runs (``kernels/graph_timing.py``, issue 35): the stand-ins for a weight keep
each call reading HBM, the graph timer tells that from an L2-resident read, the decode route is
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


def test_the_graph_timer_tells_hbm_from_l2():
    """A read of 8 MB, rotated over stand-ins past L2, against the same 8 MB read each time (L2
    holds it): the first must be the slower, or the stand-ins don't do their job."""
    w = torch.empty(8 << 20, dtype=torch.uint8, device="cuda").view(torch.float16)
    views = graph_timing.rotated(w, L2)
    count = graph_timing.launches(len(views))

    def reads(ws):
        return lambda: [ws[i % len(ws)].sum(dtype=torch.float32) for i in range(count)]
    for ws in (views, [w]):
        reads(ws)()
    rotated = graph_timing.per_call_ms(reads(views), count, 0)
    resident = graph_timing.per_call_ms(reads([w]), count, 0)
    assert rotated > 1.3 * resident, (rotated, resident)
    assert rotated * 1e-3 > w.numel() * 2 / 10e12  # below 10 TB/s: no GPU's HBM is faster


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
