"""How the block-sparse Triton kernels' work is sized (``triton_impl.py`` plans and launches it):
the candidate configs and which of them fit a call, the size classes of the tuning key, the
decode split (its kept buffers: ``buffers.py``), whether the copy engine (TMA) takes the operands,
and the device's facts, each read once.

Without triton installed this module still imports (``triton_compat.py``).
"""

from __future__ import annotations

import functools

import torch

from ... import settings
from ..triton_compat import TensorDescriptor, gdc_wait, triton
from .layout import BLOCK_SIZES


def precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return "tf32"  # ignored for fp16/bf16


# (BLOCK_M, BLOCK_K, warps, stages), from sweeps on an H100 (docs/kernels.md). The index load in
# the loop takes a stage of its own, so `stages` s buffers max(2, (s + 1) // 2) tiles of each operand.
M_TILES = ((256, 64, 8, 7), (128, 64, 4, 5), (128, 64, 4, 7), (128, 64, 4, 9), (128, 64, 8, 7), (256, 32, 8, 7),
            (128, 32, 4, 7), (128, 32, 4, 5), (64, 32, 4, 7), (128, 16, 4, 7), (64, 64, 4, 5), (32, 64, 4, 4),
            (16, 64, 4, 4), (16, 16, 4, 5))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    """The next power of two >= n (triton.next_power_of_2, without its constexpr wrapper's µs)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _buffers(stages: int) -> int:
    return max(2, (stages + 1) // 2)


def m_configs():
    return [triton.Config({"BLOCK_M": m, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=st)
            for m, k, w, st in M_TILES]


def m_fits(c, tokens: int, k_block: int, n_block: int, size: int) -> bool:
    """A tile no taller than the tokens (rounded up to 16), a K step that divides the block,
    buffers that fit in shared memory."""
    m, k = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]
    return (m <= max(16, pow2(tokens)) and k <= k_block
            and (m + n_block) * k * size * _buffers(c.num_stages) <= 200 * 1024)


PAIR_HEIGHTS = (32, 64)
"""Block heights the paired forward takes (``pairs.py``): two (BLOCK_M, bh) fp32 accumulators a
program; 128-high blocks already feed 128 outputs an x tile (1.53x dense at T=2048, d=0.5)."""
PAIR_MAX_ENTRIES = 1 << 22
"""The most entries of the pair lists (pairs x block-columns, three int32 each): larger layouts take
the one-row forward."""


def pairs_fit(bh: int, grid_r: int, grid_c: int) -> bool:
    """Whether the paired forward may run a layout of ``grid_r`` x ``grid_c`` blocks ``bh`` high."""
    return bh in PAIR_HEIGHTS and grid_r >= 2 and -(-grid_r // 2) * grid_c <= PAIR_MAX_ENTRIES


def pair_fits(c, tokens: int, k_block: int, n_block: int, size: int) -> bool:
    """``m_fits`` with the second block's buffers and accumulator: (BLOCK_M + 2 bh) x BLOCK_K a buffer,
    two accumulators of at most 128 fp32 registers a thread."""
    m, k = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_K"]
    return (m >= 64 and m <= max(16, pow2(tokens)) and k <= k_block
            and (m + 2 * n_block) * k * size * _buffers(c.num_stages) <= 200 * 1024
            and 2 * m * n_block <= 128 * 32 * c.num_warps)


def bucket(t: int) -> int:
    return min(65536, pow2(max(1, t)))


@functools.cache
def _properties(index: int):
    """The device's properties, read once (a lookup costs µs)."""
    return torch.cuda.get_device_properties(index)


def depth(nnz: int, lines: int) -> int:
    """Blocks per line, as a power of two: part of the tuning key (short lines want other tiles)."""
    return pow2(max(1, nnz // max(1, lines)))


def dw_configs():
    """The weight gradient's candidates, the one that runs untimed (under a capture, tuning off)
    first: (64, 4 warps, 3 stages) was the fastest or within 1% of it at 2048 and 8192 tokens,
    densities 0.5 to 0.1 (4096 to 4096, 64-blocks, H100, 2026-11-25)."""
    return [triton.Config({"BLOCK_T": t}, num_warps=w, num_stages=s)
            for t, w, s in ((64, 4, 3), (32, 4, 3), (64, 8, 3), (128, 8, 3), (64, 4, 4), (64, 8, 5), (128, 4, 3))]


def dw_fits(c, bh: int, bw: int, g: int, size: int) -> bool:
    return c.kwargs["BLOCK_T"] * (bh + g * bw) * size * c.num_stages <= 200 * 1024


SLOT_EMPTY = -1
"""What an empty partial slot of ``_decode_kernel`` holds, as int32: the bits 0xFFFFFFFF, a NaN that no
GPU arithmetic makes (a GPU's NaN results are 0x7FFFFFFF), so no partial sum can look empty."""


KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supported(t: torch.Tensor, bh: int, bw: int) -> bool:
    """What the kernels take: CUDA tensors of a kernel dtype, block sides of 16, 32, 64 or 128
    (tl.dot needs 16 or more, tl.arange powers of two). Anything else runs ``reference.py``."""
    return t.is_cuda and t.dtype in KERNEL_DTYPES and bh in BLOCK_SIZES and bw in BLOCK_SIZES


@functools.cache
def has_tma(device_index: int) -> bool:
    return TensorDescriptor is not None and torch.cuda.get_device_capability(device_index)[0] >= 9


# Up to this many tokens the pointer kernels run as fast (measured on an H100, decode sizes) and
# skip the descriptors' host cost (two built and encoded a call: ~35 µs there through triton.autotune,
# 10-17 µs through a plan, 2026-11-24). Only the pointer forward splits its
# block-rows (decode_split), which it does up to SPLIT_MAX_TOKENS.
TMA_MIN_TOKENS = 64
SPLIT_MAX_TOKENS = 32
assert TMA_MIN_TOKENS >= SPLIT_MAX_TOKENS


def tma_ready(tokens: int, *tensors: torch.Tensor) -> bool:
    """Whether the copy engine (TMA, Hopper and newer, through triton's host descriptors) should
    bring these 2-D operands in: more than TMA_MIN_TOKENS tokens, each operand contiguous,
    non-empty, starting on 16 bytes, with int32 coordinates. Otherwise the kernels load through
    pointers (the same results)."""
    if tokens <= TMA_MIN_TOKENS or not tensors[0].is_cuda or not has_tma(tensors[0].device.index):
        return False
    return all(t.is_contiguous() and t.numel() > 0 and t.data_ptr() % 16 == 0 and max(t.shape) < 2**31
               for t in tensors)


SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
"""The decode forward's candidate splits (programs per block-row), tuned with its configs."""


def fwd_configs():
    """The pointer forward's candidates: each tile of ``M_TILES`` with ``SPLIT`` 1, and the
    decode tiles (16 tokens) with every split of ``SPLITS`` (``decode_split`` orders them)."""
    return [triton.Config({"BLOCK_M": m, "BLOCK_K": k, "GROUP_M": 8, "SPLIT": sp}, num_warps=w, num_stages=st)
            for m, k, w, st in M_TILES for sp in SPLITS if sp == 1 or m == 16]


def decode_split(tokens: int, out_features: int, grid_r: int, nnz: int, bw: int, sms: int,
                 l2_bytes: int) -> tuple[int, int]:
    """(preferred, most): how many programs should share a block-row's blocks in the forward,
    and how many may. Few tokens (decode) leave one program per block-row, too few to stream
    the weight at HBM speed; splitting the blocks fills the GPU, at the cost of fp32 partial
    sums written and read back (and added by the last program to finish). Measured on an H100
    (``bench/cuda_probe/block_sparse_decode.py``, 2026-11-24, T = 1, 16, 32 over 4096x4096,
    4096x14336 and 14336x4096 at densities 0.5 and 0.1): the best split gives about 3 programs
    per SM with 64-wide blocks, twice as many with 32-wide, half as many with 128-wide (4096 to
    4096 in 64-blocks at T=16: split 4-6, 8.8-9.2 µs at density 0.5, where the old rule's 9 took
    9.7 µs and no split 16.1 µs). That is the preferred split; the tuner times the others of
    ``SPLITS`` up to ``most``: no more programs than a row has blocks, partials within a quarter
    of L2 (where they stay), and none past ``SPLIT_MAX_TOKENS`` tokens (one program per
    block-row streams as fast there: at 64 tokens a split of 3 ran at 52% of a copy's bandwidth,
    no split at 70%).

    >>> decode_split(1, 4096, 64, 2048, 64, 132, 50 * 2**20)      # 32 blocks a row
    (6, 32)
    >>> decode_split(16, 4096, 64, 410, 64, 132, 50 * 2**20)      # 6.4 blocks a row
    (6, 7)
    >>> decode_split(1, 4096, 32, 512, 128, 132, 50 * 2**20)      # 128-blocks: fewer programs
    (6, 16)
    >>> decode_split(1, 14336, 224, 3584, 64, 132, 50 * 2**20)    # 224 block-rows
    (2, 16)
    >>> decode_split(32, 57344, 448, 7168, 128, 132, 50 * 2**20)  # partials over a quarter of L2
    (1, 1)
    >>> decode_split(64, 14336, 112, 1792, 128, 132, 50 * 2**20)
    (1, 1)
    """
    if tokens > SPLIT_MAX_TOKENS:
        return 1, 1
    affordable = (l2_bytes // 4) // max(1, 4 * tokens * out_features)
    most = max(1, min(-(-nnz // grid_r), affordable))
    programs = 3 * sms * 64 // bw  # across the block-rows and the 16-token tiles
    preferred = max(1, min(most, round(programs / (grid_r * -(-tokens // 16)))))
    return preferred, most


DECODE_MAX_TOKENS = 64
"""Up to this many tokens the forward runs ``_decode_kernel``: all tokens in one tile, so each
kept block is read once, and equal runs of blocks per program."""

DECODE_WAVES = (3, 2, 4, 6, 1, 8)
"""The decode forward's candidate programs per SM (``WAVES``), the untimed choice first."""

DECODE_PIPES = ((4, 4), (4, 6), (8, 6), (4, 8), (2, 8))
"""The decode forward's (warps, stages) candidates, the untimed choice first. (2, 8): the fastest of
(2, 8), (4, 4) and (4, 8) for the kernel of cc0cde5 in all 6 rows at T=1 on an H100 and on an H200
(``bench/cuda_probe/decode_flat.py``, 2026-11-27)."""


def decode_configs():
    """The decode forward's candidates: a token tile of 16, 32 or 64 rows (the one that holds the
    call's tokens runs: ``decode_fits``) by each pipeline of ``DECODE_PIPES``, each count of
    programs per SM of ``DECODE_WAVES`` and each way of walking a run (``FLAT``: one loop, or a loop
    per row; ``_decode_kernel``)."""
    return [triton.Config({"BLOCK_M": m, "WAVES": waves, "FLAT": flat}, num_warps=w, num_stages=st)
            for m in (16, 32, 64) for flat in ((True, False) if m <= DECODE_SLOT_TOKENS else (False,))
            for w, st in DECODE_PIPES for waves in DECODE_WAVES]


DECODE_SLOT_TOKENS = 16
"""Up to this many tokens (a tile of 16) ``_decode_kernel`` hands partials on in kept slots that signal
themselves and may walk a run flat; past it, in fresh fp32 memory with a count, a loop per row."""


DECODE_UNCUT_WAVES = (4, 3, 1, 8)
"""``_decode_uncut_kernel``'s candidate programs per SM, the untimed choice first."""

DECODE_UNCUT_PIPES = ((2, 8), (4, 8), (4, 12))
"""``_decode_uncut_kernel``'s (warps, stages). Measured on an H100 with
``bench/cuda_probe/decode_units.py`` over (4, 4), (4, 8), (2, 8) and (4, 12) at whole-row units:
one of these three was the fastest in all 18 of issue 35's rows, (4, 4) in none; 16 and 24 stages
were 1.3-3 us slower (``docs/benchmarks.md``)."""


def decode_uncut_configs():
    """``_decode_uncut_kernel``'s candidates: the token tile (as ``decode_configs``) by each pipeline of
    ``DECODE_UNCUT_PIPES`` and each count of programs per SM of ``DECODE_UNCUT_WAVES``."""
    return [triton.Config({"BLOCK_M": m, "WAVES": waves}, num_warps=w, num_stages=st)
            for m in (16, 32, 64) for w, st in DECODE_UNCUT_PIPES for waves in DECODE_UNCUT_WAVES]


def decode_uncut_sub(bh: int) -> int:
    """The outputs of one unit of ``_decode_uncut_kernel``: a whole block-row up to 64 high (the
    probe's best at 64-blocks), half of a 128-high one."""
    return min(bh, 64)


def decode_uncut_fits(c, tokens: int, bh: int, bw: int, size: int) -> bool:
    """As ``decode_fits``, for a unit's tile of w (``decode_uncut_sub(bh)`` rows)."""
    return decode_fits(c, tokens, decode_uncut_sub(bh), bw, size)


def decode_block_k(bw: int) -> int:
    return min(bw, 64)


def decode_fits(c, tokens: int, bh: int, bw: int, size: int) -> bool:
    """The tile that holds all the tokens (rounded up to a power of two, 16 or more), and buffers
    that fit in shared memory."""
    k = decode_block_k(bw)
    return (c.kwargs["BLOCK_M"] == max(16, pow2(tokens))
            and (c.kwargs["BLOCK_M"] + bh) * k * size * _buffers(c.num_stages) <= 200 * 1024)


DECODE_EARLY_LINES = 128
"""How many 128-byte lines of its first blocks a decode program asks into L2 before it searches the
layout (``_decode_start``): 16 KB, two 64x64 bf16 blocks."""


def decode_start(device: torch.device) -> tuple[int, bool]:
    """(``EARLY``, ``OVERLAP``) of the decode kernels on ``device``: the early lines on a CUDA device;
    the overlap (a programmatic dependent launch) on sm_90 and newer, where triton has
    ``griddepcontrol`` and ``OPFORGE_BLOCK_SPARSE_OVERLAP`` is on. None of either on CPU tensors
    (triton's interpreter) or on a ROCm torch's GPUs (both are PTX)."""
    if device.type != "cuda" or torch.version.hip:
        return 0, False
    return DECODE_EARLY_LINES, overlap(device.index)


def overlap(device_index: int) -> bool:
    """The decode kernels on this device launch as programmatic dependents (``decode_start``)."""
    found = _OVERLAP.get(device_index)
    if found is None:
        found = _OVERLAP[device_index] = (gdc_wait is not None
                                          and torch.cuda.get_device_capability(device_index)[0] >= 9)
    return found and settings.current().block_sparse_overlap


_OVERLAP: dict = {}


def decode_chunk(nnz: int, waves: int, sms: int) -> tuple[int, int]:
    """(blocks per program, programs) of the decode forward for ``waves`` programs per SM: equal
    runs of the kept blocks, at least one program (an empty layout stores the bias).

    >>> decode_chunk(1434, 3, 132), decode_chunk(7168, 1, 132), decode_chunk(0, 3, 132), decode_chunk(5, 8, 132)
    ((4, 359), (55, 131), (1, 1), (1, 5))
    """
    chunk = max(1, cdiv(nnz, waves * sms))
    return chunk, max(1, cdiv(nnz, chunk))


def decode_search(rows: int) -> int:
    """How many of ``row_ptr``'s entries a decode program reads at once to find its rows."""
    return min(1024, max(16, pow2(rows)))


def device_facts(device: torch.device) -> tuple[int, int, bool]:
    """(SMs, L2 bytes, TMA) of a CUDA device, read once."""
    found = _DEVICES.get(device.index)
    if found is None:
        props = _properties(device.index)
        found = _DEVICES[device.index] = (props.multi_processor_count, props.L2_cache_size, has_tma(device.index))
    return found


_DEVICES: dict = {}


__all__ = ["DECODE_MAX_TOKENS", "DECODE_PIPES", "DECODE_SLOT_TOKENS", "DECODE_UNCUT_PIPES", "DECODE_UNCUT_WAVES", "DECODE_WAVES", "KERNEL_DTYPES", "M_TILES", "SPLITS", "SPLIT_MAX_TOKENS", "TMA_MIN_TOKENS", "bucket", "cdiv",
           "decode_block_k", "decode_chunk", "decode_configs", "decode_fits", "decode_search", "decode_split", "decode_start",
           "overlap",
           "decode_uncut_configs", "decode_uncut_fits", "decode_uncut_sub", "depth", "device_facts", "dw_configs", "dw_fits", "fwd_configs", "has_tma", "m_configs",
           "m_fits", "pow2", "precision", "SLOT_EMPTY", "supported", "tma_ready"]
