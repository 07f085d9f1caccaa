"""``kernels/triton_tma.py`` without a GPU: the raw launcher found in a wrapper laid out as
triton 3.5-3.6's NVIDIA driver lays it out, its arguments, and the descriptor memo's key
(address, shape, strides, dtype, box). The real launcher is exercised on the GPU
(``tests/kernels/block_sparse/test_block_sparse_calls_cuda.py``)."""

from __future__ import annotations

import pytest
import torch

from opforge.kernels.triton_tma import Described, RawLauncher

META = {"swizzle": 3, "elem_size": 2, "elem_type": 5, "block_size": [64, 32], "fp4_padded": False}


class FakeLauncher:
    """The shape of triton's ``CudaLauncher``: ``launch`` wraps the C launcher in a closure that
    holds ``launcher`` and ``tensordesc_meta``."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, calls, metas):
        def raw(*args):
            calls.append(args)

        launcher, tensordesc_meta = raw, metas

        def inner(*args):  # as triton's wrap_handle_tensordesc
            return launcher(*args, tensordesc_meta)

        self.launch = inner


class FakeCompiled:
    function, packed_metadata = 0xF00, ("packed",)

    def __init__(self, calls, metas):
        self.run = FakeLauncher(calls, metas)


def _raw(metas=(META,)):
    calls, encoded = [], []

    def encode(ptr, swizzle, elem_size, elem_type, block, shape, strides, padding):
        encoded.append((ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides), padding))
        return f"tmap{len(encoded)}"

    x = torch.zeros(128, 64, dtype=torch.float16)
    prefix = (Described(x, (64, 32)), x, 7)
    raw = RawLauncher.of(FakeCompiled(calls, list(metas)), prefix, encode, {5: 50})
    return raw, calls, encoded, x


def test_found_in_the_wrapper_and_called_with_encoded_descriptors():
    raw, calls, encoded, x = _raw()
    assert raw is not None
    y = torch.empty(128, 32, dtype=torch.float16)
    raw((4, 2, 1), 99, (Described(x, (64, 32)), y, 7), ("tail", 1))
    (args,) = calls
    assert args[:13] == (4, 2, 1, 99, 0xF00, False, True, None, None, ("packed",), None, None, None)
    assert args[13:] == ("tmap1", 128, 64, 64, 1, y, 7, "tail", 1)
    assert encoded == [(x.data_ptr(), 3, 2, 50, (64, 32), (128, 64), (64, 1), 0)]


def test_memo_keys_on_address_shape_strides_and_box():
    raw, calls, encoded, x = _raw()
    raw((1, 1, 1), 0, (Described(x, (64, 32)),), ())
    raw((1, 1, 1), 0, (Described(x.view(128, 64), (64, 32)),), ())  # same bytes: a hit
    assert len(encoded) == 1
    raw((1, 1, 1), 0, (Described(x[:64], (64, 32)),), ())  # another shape
    raw((1, 1, 1), 0, (Described(x.clone(), (64, 32)),), ())  # another address
    assert len(encoded) == 3
    assert [c[13] for c in calls] == ["tmap1", "tmap1", "tmap2", "tmap3"]


def test_the_compiled_box_is_encoded_and_a_misaligned_operand_refused():
    """triton may compile a narrower box than the operand's (a box wider than the swizzle is
    copied in parts): the descriptor gets the compiled one, as triton's own launcher encodes it."""
    raw, _, encoded, x = _raw()
    raw((1, 1, 1), 0, (Described(x, (64, 64)),), ())
    assert encoded[-1][4] == (64, 32)
    with pytest.raises(ValueError, match="16-byte"):
        raw((1, 1, 1), 0, (Described(x.view(-1)[1:65].view(1, 64), (1, 64)),), ())


def test_a_3d_weight_read_as_rows_without_a_view():
    """``Described(w, box, rows)``: the (nnz, bh, bw) blocks as an (nnz * bh, bw) matrix, what
    ``w.view(-1, bw)`` would give, for the C launcher and for triton's own descriptor."""
    from opforge.kernels.triton_compat import TensorDescriptor
    from opforge.kernels.triton_tma import descriptor

    raw, calls, encoded, _ = _raw()
    w = torch.zeros(6, 64, 32, dtype=torch.float16)
    raw((1, 1, 1), 0, (Described(w, (64, 32), 6 * 64),), ())
    assert encoded[-1][5:7] == ((384, 32), (32, 1))
    assert calls[-1][13:] == ("tmap1", 384, 32, 32, 1)
    if TensorDescriptor is not None:  # triton installed (the GPU machines)
        d = descriptor(Described(w, (64, 32), 6 * 64))
        assert list(d.shape) == [384, 32] and list(d.strides) == [32, 1] and d.base is w


@pytest.mark.parametrize("compiled", [object(), FakeCompiled([], [])])
def test_other_layouts_fall_back_to_tritons_launcher(compiled):
    x = torch.zeros(128, 64, dtype=torch.float16)
    assert RawLauncher.of(compiled, (Described(x, (64, 32)),), lambda *a: None, {}) is None


def test_no_described_operand_needs_no_raw_launcher():
    assert RawLauncher.of(FakeCompiled([], [META]), (torch.zeros(4),), lambda *a: None, {}) is None


def test_scratch_or_fp4_falls_back():
    x = torch.zeros(128, 64, dtype=torch.float16)
    fp4 = dict(META, fp4_padded=True)
    assert RawLauncher.of(FakeCompiled([], [fp4]), (Described(x, (64, 32)),), lambda *a: None, {5: 5}) is None
    scratchy = FakeCompiled([], [META])
    scratchy.run.global_scratch_size = 64
    assert RawLauncher.of(scratchy, (Described(x, (64, 32)),), lambda *a: None, {5: 5}) is None
