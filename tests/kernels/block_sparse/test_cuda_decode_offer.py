"""When the block-sparse CUDA decode kernel (``cuda_decode.py``) is offered to the decode route, and
what happens when it can't be had, without a GPU: nothing is built for CPU tensors or when it is
switched off, and a failed build warns once and leaves the route to the Triton kernels. On a GPU,
test_block_sparse_decode_cuda.py checks the kernel itself."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import types
import warnings

import pytest
import torch

import opforge
from opforge.kernels.block_sparse import cuda_decode, triton_plans
from opforge.notices import KernelFallbackWarning


@pytest.fixture
def fresh(monkeypatch):
    """No op loaded or refused yet in this process."""
    monkeypatch.setattr(cuda_decode, "_OPS", [])
    return cuda_decode


def refuse_builds(monkeypatch, error: Exception):
    calls = []

    def load(self):
        calls.append(self)
        raise error
    monkeypatch.setattr(cuda_decode.BlockSparseDecodeCuda, "load", load)
    return calls


def test_switched_off_nothing_is_built(fresh, monkeypatch):
    monkeypatch.setenv("OPFORGE_BLOCK_SPARSE_CUDA", "0")
    calls = refuse_builds(monkeypatch, AssertionError("built although switched off"))
    assert fresh.ops() is None and calls == []


def test_a_failed_build_warns_once_and_is_tried_again_after_a_reset(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("OPFORGE_BLOCK_SPARSE_CUDA", "1")
    calls = refuse_builds(monkeypatch, RuntimeError(f"nvcc: not found ({tmp_path.name})"))
    with pytest.warns(KernelFallbackWarning, match="CUDA decode kernel could not be built.*nvcc: not found"):
        assert fresh.ops() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.ops() is None  # remembered: no second build, no second warning
    assert len(calls) == 1
    opforge.reset()  # the environment may have changed: a failure is not kept
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fresh.ops() is None
    assert len(calls) == 2


def test_cpu_tensors_are_never_offered_and_build_nothing(fresh, monkeypatch):
    monkeypatch.setattr(fresh, "ops", lambda: pytest.fail("asked for the op for CPU tensors"))
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    w = torch.randn(6, 64, 64, dtype=torch.bfloat16)
    assert not fresh.offered(x, w, None)
    assert not fresh.offered(x.float(), w.float(), None)


def test_the_extension_needs_sm90_and_names_all_its_sources():
    ext = cuda_decode.BlockSparseDecodeCuda
    assert ext.min_capability == (9, 0) and ext.stable_abi == "2.10"
    assert all(os.path.isfile(p) for p in ext.source_paths())
    older = types.SimpleNamespace(cuda_capabilities=[(8, 0)], gpu_probe="nvml")
    verdict = ext().is_available(older)
    assert not verdict and "compute capability >= 9.0" in verdict.reason
    assert ext().is_available(types.SimpleNamespace(cuda_capabilities=[(9, 0)], gpu_probe="nvml"))
    # what the tuned configs depend on: every kernel file (a .cu, .cuh, .h or .cpp edited: tuned again)
    sources = cuda_decode._sources()
    names = {os.path.basename(p) for p in sources}
    assert {"decode_cuda_kernel.cuh", "decode_cuda_device.cuh", "decode_cuda_launch.cu", "decode_cuda.cpp",
            "decode_cuda.h", "decode_cuda_bf16.cu", "decode_cuda_f16.cu", "opforge_stable.h"} <= names
    assert all(os.path.isfile(p) for p in sources)


def test_the_configs_are_valid_for_the_op():
    assert all(set(c) == {"stages", "ctas", "overlap"} for c in cuda_decode.CONFIGS)
    assert all(c["overlap"] in (0, 1) and 1 <= c["stages"] <= 8 and c["ctas"] >= 1 for c in cuda_decode.CONFIGS)
    assert len({tuple(c.values()) for c in cuda_decode.CONFIGS}) == len(cuda_decode.CONFIGS)


def op_schema() -> list[str]:
    """The argument names of ``forward`` as ``csrc/decode_cuda.cpp`` registers it, those with a default last,
    marked ``=``."""
    src = open(os.path.join(os.path.dirname(cuda_decode.__file__), "csrc", "decode_cuda.cpp"), encoding="utf-8").read()
    call = src[src.index('m.def("forward('):]
    text = "".join(re.findall(r'"([^"]*)"', call[:call.index(");")]))  # the adjacent C++ literals, joined
    return [arg.split()[-1].split("=")[0] + "=" * ("=" in arg) for arg in text[text.index("(") + 1:text.index(") ->")].split(",")]


def test_the_plan_calls_the_op_as_the_cpp_side_registers_it(fresh, monkeypatch):
    """Without a GPU: the plan's launch (the route's prefix, then the chosen config) lines up with the
    op's schema, argument by argument, so a change on either side shows here first."""
    names = [n for n in op_schema() if not n.endswith("=")]  # the plan leaves the defaults (wgmma: where it runs)
    assert op_schema()[len(names):] == ["wgmma="]
    assert names[-len(cuda_decode.CONFIGS[0]):] == list(cuda_decode.CONFIGS[0])  # the configs' values, in order
    calls = []
    fake = types.SimpleNamespace(forward=types.SimpleNamespace(default=lambda *a: calls.append(a)),
                                 grid=types.SimpleNamespace(default=lambda x, bh, bw, stages, ctas: 264))
    monkeypatch.setattr(cuda_decode, "_OPS", [fake])
    monkeypatch.setattr(cuda_decode.KERNEL, "_resolved", None)
    monkeypatch.setenv("OPFORGE_TRITON_TUNING", "off")  # the first config, untimed
    counts = torch.zeros(4096, dtype=torch.int32)
    monkeypatch.setattr(cuda_decode, "split_counts", lambda device, n: counts)
    monkeypatch.setattr(triton_plans, "split_counts", lambda device, n: counts)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # CPU tensors: device index None
    x, w = torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(5, 64, 64, dtype=torch.bfloat16)
    y, cols, row_ptr = torch.empty(3, 384, dtype=torch.bfloat16), torch.zeros(5, dtype=torch.long), torch.zeros(7, dtype=torch.long)
    try:
        plan = cuda_decode.plan(x, w, None, y, cols, row_ptr, 384, triton_plans._CUDA)
        assert plan.facts == (triton_plans._CUDA, False, 6 * 4) and not plan.native  # its launch has a recipe
        plan(triton_plans._fwd_prefix(plan.facts, x, w, w, y, cols, row_ptr), None)  # w stands in for no bias
    finally:
        cuda_decode.KERNEL.forget()
    got = dict(zip(names, calls[-1], strict=True))
    assert got["x"] is x and got["w"] is w and got["b"] is None and got["y"] is y
    assert got["cols"] is cols and got["row_ptr"] is row_ptr and got["counts"] is counts and got["chunk"] == 0
    assert {k: got[k] for k in cuda_decode.CONFIGS[0]} == cuda_decode.CONFIGS[0]


@pytest.mark.parametrize("capability, env, want", [((9, 0), None, True), ((10, 0), "1", True), ((8, 0), None, False),
                                                   ((9, 0), "0", False), ((9, 0), "off", False)])
def test_the_triton_decode_kernels_overlap_where_the_gpu_and_the_setting_allow(capability, env, want, monkeypatch):
    """``triton_sizing.decode_start``: the early L2 lines on any CUDA device; the launch as a programmatic
    dependent only from sm_90 on (griddepcontrol) and with ``OPFORGE_BLOCK_SPARSE_OVERLAP`` not off;
    neither on CPU tensors (triton's interpreter has no inline PTX) nor on a ROCm torch's GPUs."""
    from opforge.kernels.block_sparse import triton_sizing

    if triton_sizing.gdc_wait is None:
        pytest.skip("no triton with griddepcontrol here")
    monkeypatch.setattr(triton_sizing, "_OVERLAP", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capability)
    if env is None:
        monkeypatch.delenv("OPFORGE_BLOCK_SPARSE_OVERLAP", raising=False)
    else:
        monkeypatch.setenv("OPFORGE_BLOCK_SPARSE_OVERLAP", env)
    opforge.reset()
    try:
        assert triton_sizing.decode_start(torch.device("cuda", 0)) == (triton_sizing.DECODE_EARLY_LINES, want)
        assert triton_sizing.decode_start(torch.device("cpu")) == (0, False)
        monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)  # a ROCm torch's GPUs: no PTX
        assert triton_sizing.decode_start(torch.device("cuda", 0)) == (0, False)
    finally:
        monkeypatch.undo()
        opforge.reset()


def args_fields() -> list[str]:
    """``Args``'s fields, in order, as ``csrc/decode_cuda.h`` declares them."""
    src = open(os.path.join(os.path.dirname(cuda_decode.__file__), "csrc", "decode_cuda.h"), encoding="utf-8").read()
    body = src[src.index("struct Args {") + len("struct Args {"):]
    body = re.sub(r"//[^\n]*", "", body[:body.index("};")])
    names = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        first, *rest = decl.split(",")
        names += [first.split()[-1].lstrip("*"), *(n.strip() for n in rest)]
    return names


def test_the_recipe_packs_the_parameters_as_the_kernel_declares_them(fresh, monkeypatch):
    """Without a GPU: ``cuda_decode.recipe`` (the launch replayed from C++) gives the kernel ``Args``'s
    fields in the header's order (a struct by value: 8 pointers and 7 ints, 96 bytes), then the ring's
    slots, x's tensor map and W's (128 zero bytes: read by the 64-token tile only), packed (the Python
    contract of native_launch) at the offsets the kernel reads them from; the partial slots (a kept buffer
    of describe's size) and the counts held."""
    from opforge.kernels.native_launch import reference
    from opforge.kernels.native_launch.recipe import MAP_TYPES

    assert args_fields() == ["x", "w", "b", "y", "cols", "row_ptr", "part", "counts", "tokens", "k_in", "n_out", "bh",
                             "rows", "nnz", "chunk"]
    described = []
    fake = types.SimpleNamespace(describe=types.SimpleNamespace(
        default=lambda *a: described.append(a) or [0xF00, 264, 160, 50000, 2, 264 * 4 * 1 * 128, 0]))
    monkeypatch.setattr(cuda_decode, "_OPS", [fake])
    counts, part = torch.zeros(4096, dtype=torch.int32), torch.zeros(264 * 4 * 128, dtype=torch.int32)
    sized = []
    monkeypatch.setattr(cuda_decode, "split_partials", lambda device, n: sized.append(n) or part)
    x, w = torch.randn(3, 256, dtype=torch.bfloat16), torch.randn(5, 64, 64, dtype=torch.bfloat16)
    y, cols, row_ptr = torch.empty(3, 384, dtype=torch.bfloat16), torch.zeros(5, dtype=torch.long), torch.zeros(7, dtype=torch.long)
    b = torch.randn(384, dtype=torch.bfloat16)
    inputs = (x, w, b, cols, row_ptr, None)
    choice = types.SimpleNamespace(values=(4, 3, 1))
    for tokens, bias in ((3, b), (1, None)):
        xt, yt = x[:tokens], y[:tokens]
        ins = (xt, *inputs[1:])
        r = cuda_decode.recipe(choice, (xt, w, bias, yt, cols, row_ptr, counts, 0), ins, [(yt, True)])
        assert described[-1] == (xt, w, 0, 4, 3)
        assert r.launch == [0xF00, 264, 1, 1, 5, 50000, 1]
        assert r.outputs == [15, 1, 2, tokens, 384] and sized[-1] == 264 * 4 * 128  # y, then held slots of that size
        assert r.held == [part, counts]
        reference.define(31, *ins, 384, 0, r.launch, r.outputs, r.program, r.held)
        params, _, y_out = reference.pack(31, *ins, 384, 0)
        raw = bytes(params.tolist())
        assert len(raw) == 384
        ptrs = struct.unpack_from("<8Q", raw, 0)
        assert ptrs == (xt.data_ptr(), w.data_ptr(), 0 if bias is None else b.data_ptr(), y_out.data_ptr(),
                        cols.data_ptr(), row_ptr.data_ptr(), part.data_ptr(), counts.data_ptr())
        assert struct.unpack_from("<7i4x", raw, 64) == (tokens, 256, 384, 64, 6, 5, 2)  # chunk: describe's share
        assert struct.unpack_from("<i", raw, 96) == (4,)  # stages
        tmap = struct.unpack_from("<10Q", raw, 128)
        if tokens == 1:
            assert tmap == (0,) * 10  # unread at one token
        else:  # x (3, 256) by its sizes, box (64, 3) innermost first
            assert tmap == (xt.data_ptr(), 0, 2, MAP_TYPES[torch.bfloat16], 256, 3, 512, 1536, 64, 3)
        assert struct.unpack_from("<16Q", raw, 256) == (0,) * 16  # W's map: unread by these variants
        reference.forget()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_wgmma_tiles_compile_for_sm90a_without_serialized_wgmmas(tmp_path):
    """The wgmma tiles as the package builds them (its extension's nvcc flags, for sm_90a), here with no GPU:
    nvcc compiles the bf16 kernels, and ptxas must not serialize their wgmmas (C7518, what a wait under a
    branch caused: docs/benchmarks.md, issue 35, twenty-fifth session). Every tile is in: 8, 16, 32 and 64 tokens
    (twenty-sixth session), and the weight's copies carry their L2 evict-first policy."""
    ext = cuda_decode.BlockSparseDecodeCuda
    csrc = os.path.join(ext.source_dir(), "csrc")
    done = subprocess.run(["nvcc", "-std=c++17", "-O3", *ext.cuda_cflags, "-gencode=arch=compute_90a,code=sm_90a",
                           "-I", csrc, "-c", os.path.join(csrc, "decode_cuda_bf16.cu"), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "C7518" not in done.stdout + done.stderr, done.stdout + done.stderr
    ptx = tmp_path / "k.ptx"  # and the tile is in: the package's flags compile it
    done = subprocess.run(["nvcc", "-std=c++17", *ext.cuda_cflags, "-gencode=arch=compute_90a,code=compute_90a", "-I",
                           csrc, "-ptx", os.path.join(csrc, "decode_cuda_bf16.cu"), "-o", str(ptx)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    text = ptx.read_text()
    for n in (8, 16, 32, 64):  # each tile, for blocks of 64 and 128 rows, four k16 steps each
        assert text.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16") >= 8, n
    assert "createpolicy.fractional.L2::evict_first" in text and ".L2::cache_hint" in text


def test_a_wgmma_tiles_recipe_reads_x_and_w_in_the_128_byte_swizzle(fresh, monkeypatch):
    """For a tile through wgmma (``describe`` says which: past 32 tokens always, from 9 where one runs), x's
    map is in the 128-byte swizzle, one token included, and W's reads the blocks (nnz, bh, bw) as (nnz * bh,
    bw) rows, a block a box, in it too; for mma.sync's, x's map is plain and W's 128 zero bytes: as
    ``csrc/decode_cuda_launch.cu``'s ``x_map`` and ``w_map`` encode them for a launch through the op."""
    from opforge.kernels.native_launch import reference
    from opforge.kernels.native_launch.recipe import MAP_TYPES

    wg = []
    fake = types.SimpleNamespace(describe=types.SimpleNamespace(default=lambda *a: [0xF00, 264, 160, 99000, 2, 4096,
                                                                                    wg[-1]]))
    monkeypatch.setattr(cuda_decode, "_OPS", [fake])
    monkeypatch.setattr(cuda_decode, "split_partials", lambda device, n: torch.zeros(n, dtype=torch.int32))
    counts = torch.zeros(4096, dtype=torch.int32)
    bf16 = MAP_TYPES[torch.bfloat16]
    w, cols, row_ptr = torch.randn(5, 128, 64, dtype=torch.bfloat16), torch.zeros(5, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    for n, (tokens, wgmma) in enumerate(((40, 1), (16, 1), (1, 1), (16, 0))):
        wg.append(wgmma)
        x, y = torch.randn(tokens, 256, dtype=torch.bfloat16), torch.empty(tokens, 384, dtype=torch.bfloat16)
        ins = (x, w, None, cols, row_ptr, None)
        r = cuda_decode.recipe(types.SimpleNamespace(values=(4, 2, 1)), (x, w, None, y, cols, row_ptr, counts, 0), ins,
                               [(y, True)])
        reference.define(40 + n, *ins, 384, 0, r.launch, r.outputs, r.program, r.held)
        raw = bytes(reference.pack(40 + n, *ins, 384, 0)[0].tolist())
        assert struct.unpack_from("<10Q", raw, 128) == (x.data_ptr(), 3 * wgmma, 2, bf16, 256, tokens, 512, 512 * tokens,
                                                         64, tokens)
        if wgmma:
            assert struct.unpack_from("<10Q", raw, 256) == (w.data_ptr(), 3, 2, bf16, 64, 640, 128, 81920, 64, 128)
        else:
            assert raw[256:384] == bytes(128)
    none = torch.empty(0, 128, 64, dtype=torch.bfloat16)  # a layout of no blocks copies none: no W map
    x, y = torch.randn(40, 256, dtype=torch.bfloat16), torch.empty(40, 384, dtype=torch.bfloat16)
    ins = (x, none, None, cols[:0], row_ptr, None)
    wg.append(1)
    r = cuda_decode.recipe(types.SimpleNamespace(values=(4, 2, 1)), (x, none, None, y, cols[:0], row_ptr, counts, 0),
                           ins, [(y, True)])
    reference.define(33, *ins, 384, 0, r.launch, r.outputs, r.program, r.held)
    raw = bytes(reference.pack(33, *ins, 384, 0)[0].tolist())
    assert raw[256:384] == bytes(128)
    reference.forget()
