"""``opforge.reset()``: one call forgets every decision the process keeps (issue 22)."""

from __future__ import annotations

import torch

import opforge
from opforge import compat, extension, loader, platform, process
from opforge.kernel_loader import SelftestLoader
from opforge.kernels.bias_act import dispatch
from opforge.kernels.block_sparse import triton_impl
from opforge.ops import bias_act


def test_reset_forgets_every_choice_and_the_next_call_chooses_again(shared_cache, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(shared_cache))
    k = SelftestLoader().load()
    bias_act(torch.ones(2, 3), torch.ones(3))
    platform.current()
    compat.torch_facts()
    assert SelftestLoader._cache and extension._LOADED and platform._CURRENT and dispatch._BY_DEVICE
    assert compat.torch_facts.cache_info().currsize == 1

    opforge.reset()

    assert not SelftestLoader._cache and not platform._CURRENT
    assert extension._LOADED  # loaded kernels stay: their binaries can't be loaded twice
    assert not dispatch._BY_DEVICE and not dispatch._ADAPTED
    assert compat.torch_facts.cache_info().currsize == 0 and platform.detect_cpu.cache_info().currsize == 0
    assert not (triton_impl._FWD or triton_impl._DX or triton_impl._DW)
    again = SelftestLoader().load()  # chosen again; the library itself was never unloaded
    assert again.name == k.name and again.ops is k.ops
    x, y = torch.randn(17), torch.randn(17)
    torch.testing.assert_close(again.axpy(x, y, 2.0), 2 * x + y)
    torch.testing.assert_close(bias_act(torch.ones(2, 3), torch.ones(3), act="linear"), torch.full((2, 3), 2.0))


def test_every_registered_forgetter_runs(monkeypatch):
    ran = []
    monkeypatch.setattr(process, "_FORGETTERS", list(process._FORGETTERS))
    process.forgets(lambda: ran.append(1))
    f = process.forgets(lambda: ran.append(2))
    assert process.forgets(f) is f  # registered once
    opforge.reset()
    assert ran == [1, 2]
    assert loader.clear_cache in process._FORGETTERS and dispatch.forget in process._FORGETTERS
