"""native_launch without a GPU: the recipe worked out from a launch (``recipe.py``), the C++
variant's packing checked byte for byte against the Python contract (``reference.py``), the
key (what misses), the checks of ``define``, and ``NativeTable``'s fallbacks. The launches
themselves run in tests/kernels/block_sparse/test_block_sparse_calls_cuda.py."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
import torch
from conftest import has_cxx, in_cache
from hypothesis import given
from hypothesis import strategies as st

from opforge.kernels.native_launch import NativeLaunchLoader, NativeTable, reference, table
from opforge.kernels.native_launch.recipe import Int, Map, Struct, recipe_of, recipe_of_function
from opforge.kernels.triton_tma import Described

pytestmark = pytest.mark.skipif(not has_cxx(), reason="needs a C++ compiler")


@pytest.fixture(scope="module")
def ops(shared_cache):
    kernel = in_cache(shared_cache, lambda: NativeLaunchLoader().load(ext_name="native_launch_cpp"))
    assert kernel.backend == "cpp"
    yield kernel.ops
    kernel.ops.forget()


@pytest.fixture(autouse=True)
def _clean():
    reference.forget()
    yield
    reference.forget()


def _masked(params: torch.Tensor, outs) -> bytes:
    """The packed bytes with each output's address (fresh per call) replaced by a marker."""
    b = bytes(params.tolist())
    for j, o in enumerate(outs):
        b = b.replace(struct.pack("<Q", o.data_ptr()), b"OUT%05d" % j)
    return b


def _both(ops, args):
    """Define ``args`` in both variants and pack a call of the same inputs in each."""
    ops.define(*args)
    reference.define(*args)
    call = args[:9]
    return ops.pack(*call), reference.pack(*call)


# -- the packing: C++ against the contract --

def test_pack_matches_the_contract_for_every_kind_of_slot(ops):
    x = torch.randn(4, 8)
    w = torch.randn(3, 2, 4)
    counts = torch.zeros(5, dtype=torch.int32)
    program = [reference.PTR, 0, reference.PTR, 1, reference.PTR, 32, reference.INT, 4, 7, reference.INT, 8, -5,
               reference.INT, 1, 1, reference.INT, 2, 300, reference.PTR, 16,
               reference.TMA, 0, 0, 3, 4, 7, 2, 2, 8,  # x by its own sizes, box (2, 8)
               reference.TMA, 1, 6, 3, 4, 7, 2, 2, 4,  # w as (6, 4) rows
               reference.PTR, 17]
    outputs = [6, 1, 2, 4, 8, 3, 0, 1, 7]
    args = (11, x, w, None, None, None, None, 8, 1, [123, 2, 3, 1, 4, 1024], outputs, program, [counts])
    got, want = _both(ops, args)
    assert len(got) == len(want) == 4
    assert got[1].tolist() == want[1].tolist() == [123, 2, 3, 1, 4, 1024, 0]  # no 7th entry: not a dependent
    assert [(o.shape, o.dtype) for o in got[2:]] == [((4, 8), torch.float32), ((7,), torch.int32)]
    assert _masked(got[0], got[2:]) == _masked(want[0], want[2:])
    raw = bytes(got[0].tolist())
    assert struct.unpack_from("<QQQ", raw, 0) == (x.data_ptr(), w.data_ptr(), counts.data_ptr())
    assert struct.unpack_from("<i", raw, 24) == (7,) and struct.unpack_from("<q", raw, 32) == (-5,)
    # the TMA slot of x (128-aligned, after the last pointer at 48): its encoding's inputs,
    # innermost first (dims 8, 4; byte strides 32, 4 * 32; box 8, 2), then sizes and strides
    tma = struct.unpack_from("<12Q", raw, 128)
    assert tma == (x.data_ptr(), 3, 4, 7, 8, 4, 32, 128, 8, 2, 0, 0)
    assert struct.unpack_from("<iiqq", raw, 256) == (4, 8, 8, 1)


def test_a_struct_and_a_bare_map_are_packed_as_a_cuda_kernel_takes_them(ops):
    """A CUDA C++ kernel's parameters (the block-sparse decode kernel's: a struct by value, an int,
    ``__grid_constant__ CUtensorMap``s): the struct's fields at C's offsets and its tail padded to its
    alignment, a map 128-aligned with no sizes or strides after it, a map of -1 all zeros, and a map of a
    rank-3 tensor read as rows in the 128-byte swizzle."""
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(3, 2, 4)
    counts = torch.zeros(5, dtype=torch.int32)
    program = [reference.STRUCT, 5, reference.PTR, 0, reference.INT, 4, 7, reference.PTR, 32, reference.INT, 4, -3,
               reference.INT, 8, 0,  # 0: 8, 8: int at 8, 16: held, 24: int, 32: a null pointer -> 40 bytes
               reference.INT, 4, 6,  # at 40
               reference.MAP, 0, 0, 0, 2, 9, 2, 4, 8,  # x by its sizes, box (4, 8): at 128
               reference.MAP, -1, 0, 0, 2, 9, 1, 8,  # zeros: at 256
               reference.MAP, 1, 6, 3, 4, 7, 2, 2, 4,  # w (3, 2, 4) as 6 rows, swizzled, box (2, 4): at 384
               reference.STRUCT, 2, reference.INT, 2, 5, reference.INT, 1, 1,  # 2 bytes aligned: at 512, 4 bytes
               reference.PTR, 1]  # at 520
    args = (23, x, w, None, None, None, None, 0, 0, [7, 2, 1, 1, 4, 0], [], program, [counts])
    got, want = _both(ops, args)
    raw = bytes(got[0].tolist())
    assert raw == bytes(want[0].tolist()) and len(raw) == 528
    assert struct.unpack_from("<QiiQiiQ", raw, 0) == (x.data_ptr(), 7, 0, counts.data_ptr(), -3, 0, 0)
    assert struct.unpack_from("<i", raw, 40) == (6,)
    assert struct.unpack_from("<10Q", raw, 128) == (x.data_ptr(), 0, 2, 9, 8, 4, 16, 64, 8, 4)
    assert raw[208:256] == bytes(48) and raw[256:384] == bytes(128)
    assert struct.unpack_from("<10Q", raw, 384) == (w.data_ptr(), 3, 4, 7, 4, 6, 16, 96, 4, 2)
    assert struct.unpack_from("<hb5xQ", raw, 512) == (5, 1, w.data_ptr())
    for define in (ops.define, reference.define):
        with pytest.raises(RuntimeError, match="not a pointer or an integer"):
            define(24, x, None, None, None, None, None, 0, 0, [7, 1, 1, 1, 1, 0], [],
                   [reference.STRUCT, 2, reference.PTR, 0, reference.MAP, 0, 0, 0, 2, 9, 1, 8], [])
        with pytest.raises(RuntimeError, match="tensor map of rank 3"):  # rows read a tensor as rank 2 only
            define(24, x, None, None, None, None, None, 0, 0, [7, 1, 1, 1, 1, 0], [],
                   [reference.MAP, 1, 6, 0, 4, 7, 3, 1, 2, 4], [])


def test_a_cuda_kernels_recipe_lists_its_parameters():
    """``recipe_of_function``: the launch from what the extension said, each parameter's slot."""
    x, w, b = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(3, 2, 8, dtype=torch.bfloat16), None
    y = torch.zeros(4, 6, dtype=torch.bfloat16)
    part, counts = torch.empty(12, device="meta"), torch.zeros(5, dtype=torch.int32)
    params = (Struct((x, w, b, y, part, counts, Int(4), Int(7, 8))), Int(3), Map(x, (4, 8)), Map(None, (1, 8)),
              Map(w, (2, 8), rows=6, swizzle=3))
    r = recipe_of_function(0xABC, (66,), 160, 4096, True, params, (x, w, None, None, None, None),
                           [(y, True), (part, False)])
    assert r.launch == [0xABC, 66, 1, 1, 5, 4096, 1]
    assert r.outputs == [15, 1, 2, 4, 6, 6, 0, 1, 12]
    assert r.held == [counts]
    assert r.program == [reference.STRUCT, 8, reference.PTR, 0, reference.PTR, 1, reference.INT, 8, 0,
                         reference.PTR, 16, reference.PTR, 17, reference.PTR, 32, reference.INT, 4, 4,
                         reference.INT, 8, 7, reference.INT, 4, 3, reference.MAP, 0, 0, 0, 2, 9, 2, 4, 8,
                         reference.MAP, -1, 0, 0, 0, 0, 2, 1, 8, reference.MAP, 1, 6, 3, 2, 9, 2, 2, 8]
    assert "whole warps" in recipe_of_function(0xABC, (1,), 48, 0, False, (), (x,) * 6, [])
    assert "given float" in recipe_of_function(0xABC, (1,), 32, 0, False, (1.5,), (x,) * 6, [])
    assert "struct's field" in recipe_of_function(0xABC, (1,), 32, 0, False, (Struct((2,)),), (x,) * 6, [])
    assert "tensor map of torch.int32" in recipe_of_function(0xABC, (1,), 32, 0, False, (Map(counts, (1,)),),
                                                             (x,) * 6, [])


@given(st.lists(st.one_of(
    st.tuples(st.just("ptr"), st.sampled_from([0, 1, 16, 32])),
    st.tuples(st.just("int"), st.sampled_from([1, 2, 4, 8]), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just("tma"), st.sampled_from([0, 1]), st.sampled_from([0, 4]), st.sampled_from([0, 1, 2, 3]),
              st.sampled_from([1, 2, 4]), st.sampled_from([(1, 1), (2, 4), (4, 2)])),
    st.tuples(st.just("map"), st.sampled_from([-1, 0, 1]), st.sampled_from([0, 3]), st.sampled_from([1, 2, 4]),
              st.sampled_from([(1, 1), (2, 4)])),
    st.tuples(st.just("struct"), st.lists(st.one_of(
        st.tuples(st.just("ptr"), st.sampled_from([0, 1, 16, 32])),
        st.tuples(st.just("int"), st.sampled_from([1, 2, 4, 8]), st.integers(-(2**31), 2**31 - 1))),
        min_size=1, max_size=5))), min_size=0, max_size=12),
       st.integers(1, 16), st.booleans())
def test_pack_matches_the_contract_on_any_program(ops, slots, rows, offset):
    base = torch.randn(64)
    x = base[1:33].view(4, 8) if offset else base[:32].view(4, 8)  # x 4 bytes past 16 or not
    w = torch.randn(rows, 2, 2)
    program = []

    def scalar(s):
        return [reference.PTR, s[1]] if s[0] == "ptr" else [reference.INT, s[1], s[2]]

    for s in slots:
        if s[0] in ("ptr", "int"):
            program += scalar(s)
        elif s[0] == "map":  # a bare map of x by its sizes (rank 2), of w (rank 3) as rows, or zeros
            program += [reference.MAP, s[1], rows * 2 if s[1] == 1 else 0, s[2], s[3], 7, 2, *s[4]]
        elif s[0] == "struct":
            program += [reference.STRUCT, len(s[1])] + [v for f in s[1] for v in scalar(f)]
        else:
            src, rows_flag, swizzle, size, box = s[1:]
            r = (w.numel() // 2) if (src == 1 and rows_flag) else 0
            if src == 1 and not r:
                r = rows * 2  # w has rank 3: read it as rows
            program += [reference.TMA, src, r, swizzle, size, 7, 2, *box]
    args = (12, x, w, None, None, None, None, rows, int(offset), [1, 1, 1, 1, 1, 0], [6, 1, 1, 3],
            program, [torch.zeros(2)])
    got, want = _both(ops, args)
    assert _masked(got[0], got[2:]) == _masked(want[0], want[2:])


# -- the key: what misses --

def test_a_call_unlike_the_defined_one_misses(ops):
    x = torch.randn(4, 8)
    w = torch.randn(3, 2, 4)
    ops.define(13, x, w, None, None, None, None, 8, 0, [1, 1, 1, 1, 1, 0], [6, 1, 1, 3], [reference.PTR, 0], [])
    hit = ops.pack(13, x, w, None, None, None, None, 8, 0)
    assert len(hit) == 3
    misses = [
        (14, x, w, None, None, None, None, 8, 0),  # another table
        (13, x, w, None, None, None, None, 9, 0),  # another int
        (13, x, w, None, None, None, None, 8, 1),
        (13, torch.randn(5, 8), w, None, None, None, None, 8, 0),  # another shape
        (13, torch.randn(8, 4).t(), w, None, None, None, None, 8, 0),  # the same shape, other strides
        (13, x.double(), w, None, None, None, None, 8, 0),  # another dtype
        (13, torch.randn(33)[1:].view(4, 8), w, None, None, None, None, 8, 0),  # not 16-byte aligned
        (13, x, w, x, None, None, None, 8, 0),  # an input given that wasn't
        (13, x, None, None, None, None, None, 8, 0),  # an input missing
        (13, x, w, None, None, None, x, 8, 0),  # the sixth input given
    ]
    before = ops.stats()
    for m in misses:
        assert ops.pack(*m) == [] and ops.call(*m) == []
    after = ops.stats()
    assert after[2] - before[2] == 2 * len(misses) and after[1] == before[1]
    # another tensor of the defined shape, dtype and alignment hits: the key is not the address
    assert len(ops.pack(13, torch.randn(4, 8), torch.randn(3, 2, 4), None, None, None, None, 8, 0)) == 3


def test_a_recipe_on_cpu_tensors_says_it_needs_cuda_to_launch(ops):
    x = torch.randn(2, 2)
    ops.define(15, x, None, None, None, None, None, 0, 0, [1, 1, 1, 1, 1, 0], [], [reference.PTR, 0], [])
    with pytest.raises(RuntimeError, match="CUDA tensors; t0 is on cpu"):
        ops.call(15, x, None, None, None, None, None, 0, 0)


def test_forget_drops_every_recipe(ops):
    x = torch.randn(2, 2)
    ops.define(16, x, None, None, None, None, None, 0, 0, [1, 1, 1, 1, 1, 0], [], [], [])
    assert ops.stats()[0] >= 1
    ops.forget()
    assert ops.stats()[0] == 0 and ops.pack(16, x, None, None, None, None, None, 0, 0) == []


@pytest.mark.parametrize("launch, outputs, program, match", [
    ([1, 1, 1], [], [], "launch must be"),
    ([1, 1, 1, 1, 1, 0], [6, 1], [], "truncated output"),
    ([1, 1, 1, 1, 1, 0], [6, 1, 3, 4], [], "truncated output"),
    ([1, 1, 1, 1, 1, 0], [], [reference.PTR, 16], "names no input, output or held"),
    ([1, 1, 1, 1, 1, 0], [], [reference.PTR, 33], "names no input, output or held"),
    ([1, 1, 1, 1, 1, 0], [], [reference.INT, 3, 1], "an integer of 3 bytes"),
    ([1, 1, 1, 1, 1, 0], [], [reference.TMA, 0, 0, 0, 2, 7, 6, 1, 1, 1, 1, 1, 1], "TMA slot of rank 6"),
    ([1, 1, 1, 1, 1, 0], [], [reference.TMA, 0, 4, 0, 2, 7, 1, 1], "TMA slot of rank 1"),
    ([1, 1, 1, 1, 1, 0], [], [9, 0], "bad slot"),
    ([1, 1, 1, 1, 1, 0], [], [reference.INT, 8, 1] * 100, "at most 96"),
])
def test_define_refuses_a_malformed_recipe(ops, launch, outputs, program, match):
    with pytest.raises(RuntimeError, match=match):
        ops.define(17, torch.zeros(1), None, None, None, None, None, 0, 0, launch, outputs, program, [])


def test_define_needs_t0(ops):
    with pytest.raises(RuntimeError, match="t0"):
        ops.define(18, None, None, None, None, None, None, 0, 0, [1, 1, 1, 1, 1, 0], [], [], [])


# -- the recipe of a launch --

def _compiled(signature: dict, descs=None, **launcher):
    run = SimpleNamespace(global_scratch_size=0, profile_scratch_size=0, launch_cooperative_grid=False,
                          launch_pdl=False)
    run.__dict__.update(launcher)
    meta = SimpleNamespace(num_ctas=1, num_warps=8, shared=4096, tensordesc_meta=descs)
    return SimpleNamespace(function=0xABC, metadata=meta, run=run, src=SimpleNamespace(signature=signature))


def test_a_recipe_maps_each_parameter_to_its_source():
    x, w, y, part, counts = torch.zeros(4, 8), torch.zeros(2, 2, 8), torch.zeros(4, 4), torch.zeros(3), \
        torch.zeros(2, dtype=torch.int32)
    sig = {"x": "tensordesc<bf16[64, 32]>", "w": "*bf16", "y": "*bf16", "part": "*fp32", "counts": "*i32",
           "tokens": "i32", "big": "i64", "ONE": "constexpr", "flag": "i1", "BLOCK": "constexpr"}
    descs = [{"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [64, 16], "fp4_padded": False}]
    args = (Described(x, (64, 32)), w, y, part, counts, 4, 2**40, 1, True, 64)
    r = recipe_of(_compiled(sig, descs), (5, 2), args, (x, w, None, None, None, None), [(y, True), (part, False)],
                  to_host={10: 9})
    assert r.launch == [0xABC, 5, 2, 1, 8, 4096, 0]
    assert r.outputs == [6, 1, 2, 4, 4, 6, 0, 1, 3]
    assert r.held == [counts]
    assert r.program == [reference.TMA, 0, 0, 3, 2, 9, 2, 64, 16,  # the compiled box, not the operand's
                         reference.PTR, 1, reference.PTR, 16, reference.PTR, 17, reference.PTR, 32,
                         reference.INT, 4, 4, reference.INT, 8, 2**40, reference.INT, 1, 1,
                         reference.INT, 8, 0, reference.INT, 8, 0]  # the two scratch pointers


@pytest.mark.parametrize("change, reason", [
    ({"global_scratch_size": 64}, "global_scratch_size"),
    ({"launch_cooperative_grid": True}, "launch_cooperative_grid"),
])
def test_a_launch_the_recipe_cannot_make_stays_in_python(change, reason):
    r = recipe_of(_compiled({"x": "*fp32"}, **change), (1,), (torch.zeros(1),), (None,) * 6, [])
    assert isinstance(r, str) and reason in r


def test_a_kernel_compiled_as_a_programmatic_dependent_launches_as_one(ops):
    """triton's ``launch_pdl``: the recipe says so (its 7th launch entry), the C++ side keeps it (its
    launch is then cuLaunchKernelEx with programmatic stream serialization, on the GPU), and a
    launch entry other than 0 or 1 is refused by both sides."""
    x = torch.zeros(4)
    r = recipe_of(_compiled({"x": "*fp32"}, launch_pdl=True), (3,), (x,), (x, None, None, None, None, None), [])
    assert r.launch == [0xABC, 3, 1, 1, 8, 4096, 1]
    got, want = _both(ops, (21, x, None, None, None, None, None, 0, 0, r.launch, r.outputs, r.program, r.held))
    assert got[1].tolist() == want[1].tolist() == r.launch
    for define in (ops.define, reference.define):
        with pytest.raises(RuntimeError, match="dependent must be 0 or 1"):
            define(22, x, None, None, None, None, None, 0, 0, [*r.launch[:6], 2], [], [], [])


def test_a_recipe_names_what_it_cannot_encode():
    t = torch.zeros(1)
    assert "parameter of type fp32" in recipe_of(_compiled({"a": "fp32"}), (1,), (1.0,), (t,) * 6, [])
    assert "1 parameters but 2" in recipe_of(_compiled({"a": "*fp32"}), (1,), (t, t), (t,) * 6, [])
    assert "given int" in recipe_of(_compiled({"a": "*fp32"}), (1,), (3,), (t,) * 6, [])
    assert "descriptor metadata" in recipe_of(_compiled({"a": "tensordesc<fp32[2]>"}), (1,), (Described(t, (1,)),),
                                              (t,) * 6, [])
    many = {f"a{i}": "*fp32" for i in range(17)}
    assert "17 held" in recipe_of(_compiled(many), (1,), tuple(torch.zeros(1) for _ in range(17)), (None,) * 6, [])
    meta = _compiled({"a": "*fp32"})
    meta.metadata.num_ctas = 2
    assert "num_ctas" in recipe_of(meta, (1,), (t,), (t,) * 6, [])
    assert "not a compiled triton kernel" in recipe_of(object(), (1,), (t,), (t,) * 6, [])


# -- NativeTable: when it stays in Python --

def test_the_table_stays_in_python_when_native_launch_is_off(monkeypatch):
    monkeypatch.setenv("OPFORGE_NATIVE_LAUNCH", "0")
    monkeypatch.setattr(table, "_OPS", [])
    t = NativeTable("test.off")
    assert t.define("not asked", (torch.zeros(1),) * 6, (0, 0)) is False
    assert t.call is None and "OPFORGE_NATIVE_LAUNCH=0" in t.reason


def test_the_table_stays_in_python_when_the_loader_settles_for_the_python_variant(monkeypatch):
    monkeypatch.setattr(table, "_OPS", [])
    monkeypatch.setattr(NativeLaunchLoader, "load", lambda self, *a, **k: SimpleNamespace(
        backend="torch", name="native_launch_python", ops=reference))
    t = NativeTable("test.python")
    assert t.define("not asked", (torch.zeros(1),) * 6, (0, 0)) is False
    assert t.call is None and "launches nothing" in t.reason


def test_the_table_binds_call_once_a_recipe_is_defined(ops, monkeypatch):
    monkeypatch.setattr(table, "_OPS", [ops, ""])
    t = NativeTable("test.bound")
    x, y = torch.zeros(2, 2), torch.zeros(2, 2)
    inputs = (x, None, None, None, None, None)
    assert t.define(recipe_of(_compiled({"x": "*fp32", "y": "*fp32"}), (1,), (x, y), inputs, [(y, True)]), inputs,
                    (3, 0)) is True
    assert t.call is not None and t.defined == 1
    packed = t.pack((x, None, None, None, None, None), (3, 0))
    assert struct.unpack_from("<Q", bytes(packed[0].tolist()), 0) == (x.data_ptr(),)
    assert t.call(torch.zeros(2, 3), None, None, None, None, None, 3, 0) == []  # another shape: a miss
    t.forget()
    assert t.call is None


def test_the_python_variant_launches_nothing():
    x = torch.zeros(2)
    reference.define(1, x, None, None, None, None, None, 0, 0, [1, 1, 1, 1, 1, 0], [], [reference.PTR, 0], [])
    assert reference.call(1, x, None, None, None, None, None, 0, 0) == []
    assert len(reference.pack(1, x, None, None, None, None, None, 0, 0)) == 2
