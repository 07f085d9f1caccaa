// The block-sparse forward at decode sizes (T <= 64 tokens) in CUDA, for sm_90: y = x Wᵀ (+ b),
// W's kept blocks stored (nnz, bh, bw) row-major in block-row order (row_ptr, cols: int64).
//
// A memory-bound kernel, so its one job is to keep HBM busy from the first cycle to the last:
//
// * The weight is streamed in storage order. Warp v (of NW, every warp of the grid) takes the
//   blocks [v * CHUNK, (v + 1) * CHUNK): an equal share of the bytes whatever the rows' lengths.
//   Its first copies need no index, so they leave at once.
// * The copy engine brings each block into shared memory (cp.async.bulk, issued by lane 0 of the
//   warp; an mbarrier a slot), STAGES blocks ahead of the tensor cores: the bytes in flight are
//   bounded by shared memory, not registers.
// * Nothing the warp needs later is fetched when it is needed: the blocks' columns come 32 at a
//   time across the lanes (a step's column is a shuffle) with the next 32 on their way; x comes XB
//   blocks ahead; the rows' ends one row ahead. Under a saturated HBM a trip to memory costs
//   microseconds, which is the whole kernel's budget.
// * A block-row whole in a warp's range is summed in registers and stored. One cut between warps
//   leaves fp32 partial sums in a slot of each of its warps; the warp holding its last block sums
//   them at the end of its range, once the others have counted themselves in (finish_cut): the
//   others never wait, and nothing at a warp's end is a chain of trips to memory. Empty block-rows
//   get the bias, or zeros.
//
// The arithmetic: mma.sync m16n8k16 (fp32 accumulate) with W's rows as A (MT = bh / 16 tiles of 16)
// and x's tokens as B (NT tiles of 8). A mma's k order is free as long as A and B agree, so lane
// (g = lane / 4, t = lane % 4) reads 8 consecutive elements of a row at column 32 q + 8 t with one
// 16-byte load for both operands (W rows g and g + 8 from shared memory; x token g from global,
// through L1) and uses elements 0-3 in one k16 step and 4-7 in the next.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_sparse_decode.h"

namespace opforge_block_sparse_decode {

template <bool BF16>
struct Elem;
template <>
struct Elem<true> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ float in(T v) { return __bfloat162float(v); }
  static __device__ __forceinline__ T out(float v) { return __float2bfloat16(v); }
};
template <>
struct Elem<false> {
  using T = __half;
  static __device__ __forceinline__ float in(T v) { return __half2float(v); }
  static __device__ __forceinline__ T out(float v) { return __float2half(v); }
};

template <bool BF16>
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  if constexpr (BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The block-row holding block `at`: the last r with row_ptr[r] <= at, and its first block and
// block count. A warp's lanes test 256 rows a round, all loads issued at once (a single trip to
// memory for up to 255 rows).
struct Found {
  int r, rs, n;
};

__device__ __forceinline__ Found find_row(const int64_t* row_ptr, int rows, int at, int lane) {
  constexpr int kLoads = 8;
  int count = 0;
  for (int base = 0; base <= rows; base += 32 * kLoads) {
    int val[kLoads];
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const int i = base + c * 32 + lane;
      val[c] = i <= rows ? static_cast<int>(__ldg(row_ptr + i)) : 0x7fffffff;
    }
    bool done = false;
    int last = 0, next = 0;
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const bool le = val[c] != 0x7fffffff && val[c] <= at;
      const unsigned m = __ballot_sync(0xffffffffu, le);
      if (!done) {
        const int k = __popc(m);
        count += k;
        if (k < 32) {
          // the row found is entry count - 1: lane k - 1 of this chunk, or the last lane of the chunk before
          last = k > 0 ? __shfl_sync(0xffffffffu, val[c], k - 1) : last;
          next = __shfl_sync(0xffffffffu, val[c], k);
          done = true;
        } else {
          last = __shfl_sync(0xffffffffu, val[c], 31);
        }
      }
    }
    if (done) return {count - 1, last, next - last};
  }
  return {count - 1, 0, 0};  // not reached: row_ptr[rows] = nnz > at
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void bar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// Lane 0: the copy of `bytes` from global `src` into shared `dst`, completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

__device__ __forceinline__ uint4 lds128(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_u32(p)));
  return v;
}


// Rows [r * bh + 16 * tile0, + 16 * MT) of y from fp32 sums (plus the bias).
template <bool BF16, int NT, int MT>
__device__ __forceinline__ void store_row(const Args& a, const float (&acc)[MT][NT][4], int r, int g, int t,
                                          int tile0 = 0) {
  using E = Elem<BF16>;
  using T = typename E::T;
  const T* bias = static_cast<const T*>(a.b);
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int f0 = r * a.bh + (tile0 + m) * 16 + g;
    const float b0 = bias ? E::in(bias[f0]) : 0.0f, b1 = bias ? E::in(bias[f0 + 8]) : 0.0f;
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int tok = i * 8 + 2 * t;
      if (tok < a.tokens) {
        y[static_cast<int64_t>(tok) * a.n_out + f0] = E::out(acc[m][i][0] + b0);
        y[static_cast<int64_t>(tok) * a.n_out + f0 + 8] = E::out(acc[m][i][2] + b1);
      }
      if (tok + 1 < a.tokens) {
        y[static_cast<int64_t>(tok + 1) * a.n_out + f0] = E::out(acc[m][i][1] + b0);
        y[static_cast<int64_t>(tok + 1) * a.n_out + f0 + 8] = E::out(acc[m][i][3] + b1);
      }
    }
  }
}

template <int NT, int MT>
__device__ __forceinline__ float4* slot_of(const Args& a, int slot) {
  return reinterpret_cast<float4*>(a.part) + static_cast<int64_t>(slot) * (MT * NT * 32);
}

// A cut row's partial sums into slot `slot` (the per-warp kernel: 2v for the row that began before the
// warp's range, 2v + 1 for the other).
template <int NT, int MT>
__device__ __forceinline__ void put_partial(const Args& a, const float (&acc)[MT][NT][4], int slot, int lane) {
  float4* mine = slot_of<NT, MT>(a, slot);
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < NT; ++i)
      mine[(m * NT + i) * 32 + lane] = make_float4(acc[m][i][0], acc[m][i][1], acc[m][i][2], acc[m][i][3]);
}

// A cut row (blocks [rs, re)): its warps v0 .. v1 each put their partial sums in a slot; every
// warp but v1 (which holds the row's last block) then adds one to the row's count, with release
// order and nothing to wait for; v1, at the end of its range, waits for the count to reach v1 - v0
// (the others end when it does: equal shares), sums the slots in warp order (the same result
// whoever came last) and stores, and puts the count back to zero. It waits only on warps of lower
// index, which were started no later than it and wait on nobody: no deadlock, even when the
// grid doesn't fit the GPU at once.
__device__ __forceinline__ void arrive(const Args& a, int r, int lane) {
  __syncwarp();
  if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.counts + r) : "memory");
}

template <bool BF16, int NT, int MT>
__device__ __forceinline__ void finish_cut(const Args& a, int r, int rs, int re, int lane) {
  const int v0 = rs / a.chunk, v1 = (re - 1) / a.chunk;
  if (lane == 0) {
    int seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(a.counts + r) : "memory");
    } while (seen != v1 - v0);
  }
  __syncwarp();
  float sum[MT][NT][4] = {};
  for (int w = v0; w <= v1; ++w) {
    const float4* slot = slot_of<NT, MT>(a, w == v0 ? 2 * w + 1 : 2 * w);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        const float4 p = __ldcg(slot + (m * NT + i) * 32 + lane);
        sum[m][i][0] += p.x;
        sum[m][i][1] += p.y;
        sum[m][i][2] += p.z;
        sum[m][i][3] += p.w;
      }
  }
  store_row<BF16, NT, MT>(a, sum, r, lane >> 2, lane & 3);
  if (lane == 0) a.counts[r] = 0;
}

__device__ __forceinline__ int col_at(const Args& a, int at, int end) {
  return at < end ? static_cast<int>(__ldg(a.cols + at)) : 0;
}

template <bool BF16, int NT, int KQ>
__device__ __forceinline__ void load_x(const Args& a, uint4 (&xo)[NT][KQ], int column, int g, int t) {
  using T = typename Elem<BF16>::T;
  const T* xc = static_cast<const T*>(a.x) + static_cast<int64_t>(column) * (32 * KQ) + 8 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int tok = nt * 8 + g;
#pragma unroll
    for (int q = 0; q < KQ; ++q)
      xo[nt][q] = tok < a.tokens ? __ldg(reinterpret_cast<const uint4*>(xc + static_cast<int64_t>(tok) * a.k_in + 32 * q))
                                 : make_uint4(0, 0, 0, 0);
  }
}

// The dynamic shared memory a CTA of `warps` warps takes: an mbarrier a slot, then the rings.
__host__ __device__ constexpr int ring_offset(int warps, int stages) { return (warps * stages * 8 + 127) / 128 * 128; }
__host__ __device__ constexpr int smem_bytes(int warps, int stages, int block_bytes) {
  return ring_offset(warps, stages) + warps * stages * block_bytes;
}

// The empty block-rows (no blocks, so no warp's share holds them): the bias, or zeros. Warp `first`
// of `count` takes rows first, first + count, ...
template <bool BF16>
__device__ __forceinline__ void empty_rows(const Args& a, int first, int count, int lane) {
  using E = Elem<BF16>;
  using T = typename E::T;
  const T* bias = static_cast<const T*>(a.b);
  for (int r = first; r < a.rows && !(a.ablate & 4); r += count) {
    if (__ldg(a.row_ptr + r + 1) != __ldg(a.row_ptr + r)) continue;
    for (int e = lane; e < a.tokens * a.bh; e += 32) {
      const int tok = e / a.bh, f = r * a.bh + (e - tok * a.bh);
      static_cast<T*>(a.y)[static_cast<int64_t>(tok) * a.n_out + f] = E::out(bias ? E::in(bias[f]) : 0.0f);
    }
  }
}

// One warp's blocks [lo, hi).
template <bool BF16, int NT, int KQ, int MT>
__device__ __forceinline__ void stream_blocks(const Args& a, int lo, int hi, int v, int stages, uint64_t* bars,
                                              unsigned char* ring) {
  using T = typename Elem<BF16>::T;
  constexpr int BW = 32 * KQ;
  constexpr int BLOCK = 16 * MT * BW * static_cast<int>(sizeof(T));
  constexpr int XB = NT <= 2 ? 3 : 1;  // x buffers (registers: NT <= 2 has room for three)
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = hi - lo;
  if (lane == 0) {
    for (int i = 0; i < stages; ++i) bar_init(bars + i);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  const unsigned char* w = static_cast<const unsigned char*>(a.w) + static_cast<int64_t>(lo) * BLOCK;
  const int ahead = min(stages, steps);
  if (lane == 0)
    for (int k = 0; k < ahead; ++k) bulk_load(ring + k * BLOCK, w + static_cast<int64_t>(k) * BLOCK, BLOCK, bars + k);

  // the columns: lane i holds those of blocks lo + 32 c + i (chunk c) and lo + 32 (c + 1) + i
  int colv = col_at(a, lo + lane, hi), colv_ahead = col_at(a, lo + 32 + lane, hi);
  // the block-row of lo: r, blocks [rs, re), and the next row's end
  const Found f = find_row(a.row_ptr, a.rows, lo, lane);
  int r = f.r, rs = f.rs, re = f.rs + f.n;
  int next_end = r + 2 <= a.rows ? static_cast<int>(__ldg(a.row_ptr + r + 2)) : re;

  // step k's column: k is within the two chunks held (the first is chunk k0 >> 5)
  auto col_of = [&](int k, int k0) {
    const int c0 = __shfl_sync(0xffffffffu, colv, k & 31), c1 = __shfl_sync(0xffffffffu, colv_ahead, k & 31);
    return (k >> 5) == (k0 >> 5) ? c0 : c1;
  };
  uint4 xb[XB][NT][KQ];
#pragma unroll
  for (int b = 0; b < XB; ++b)
    if (b < steps) load_x<BF16, NT, KQ>(a, xb[b], col_of(b, 0), g, t);

  float acc[MT][NT][4] = {};
  int slot = 0, parity = 0;
  bool finisher = false;  // the first row began before lo and ends here: this warp sums it at the end
  int fin_r = 0, fin_rs = 0, fin_re = 0;
  for (int k0 = 0; k0 < steps; k0 += XB) {
#pragma unroll
    for (int b = 0; b < XB; ++b) {
      const int k = k0 + b;
      if (k >= steps) break;
      if ((k & 31) == 0 && k > 0) {  // into the next chunk of columns; the one after that on its way
        colv = colv_ahead;
        colv_ahead = col_at(a, lo + k + 32 + lane, hi);
      }
      bar_wait(bars + slot, parity);
      if (!(a.ablate & 1)) {
      const unsigned char* sw = ring + slot * BLOCK + (g * BW + 8 * t) * static_cast<int>(sizeof(T));
#pragma unroll
      for (int q = 0; q < KQ; ++q)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint4 lo4 = lds128(sw + ((m * 16) * BW + 32 * q) * static_cast<int>(sizeof(T)));
          const uint4 hi4 = lds128(sw + ((m * 16 + 8) * BW + 32 * q) * static_cast<int>(sizeof(T)));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint4 xq = xb[b][nt][q];
            mma<BF16>(acc[m][nt], lo4.x, hi4.x, lo4.y, hi4.y, xq.x, xq.y);
            mma<BF16>(acc[m][nt], lo4.z, hi4.z, lo4.w, hi4.w, xq.z, xq.w);
          }
        }
      }
      __syncwarp();
      if (k + stages < steps && lane == 0)
        bulk_load(ring + slot * BLOCK, w + static_cast<int64_t>(k + stages) * BLOCK, BLOCK, bars + slot);
      if (k + XB < steps && !(a.ablate & 1)) load_x<BF16, NT, KQ>(a, xb[b], col_of(k + XB, k), g, t);
      const int kb = lo + k;
      if (kb + 1 == re || k == steps - 1) {  // the row ends here, or the range does
        if ((rs >= lo && re <= hi) || (a.ablate & 2)) {
          store_row<BF16, NT, MT>(a, acc, r, g, t);
        } else {
          put_partial<NT, MT>(a, acc, rs < lo ? 2 * v : 2 * v + 1, lane);
          if (re <= hi) {  // the row's last block is here: this warp sums it, at the end
            finisher = true;
            fin_r = r, fin_rs = rs, fin_re = re;
          } else {
            arrive(a, r, lane);
          }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.0f;
        if (kb + 1 == re && k < steps - 1) {  // on to the next non-empty row
          ++r;
          rs = re;
          re = next_end;
          while (re == rs) re = static_cast<int>(__ldg(a.row_ptr + (++r) + 1));  // empty rows: rare
          next_end = r + 2 <= a.rows ? static_cast<int>(__ldg(a.row_ptr + r + 2)) : re;
        }
      }
      if (++slot == stages) {
        slot = 0;
        parity ^= 1;
      }
    }
  }
  if (finisher) {  // (its own slot: each lane reads back what it wrote)
    finish_cut<BF16, NT, MT>(a, fin_r, fin_rs, fin_re, lane);
  }
}

template <bool BF16, int NT, int KQ, int MT>
__global__ void __launch_bounds__(256) decode_kernel(const Args a, int stages) {
  using E = Elem<BF16>;
  using T = typename E::T;
  constexpr int BLOCK = 16 * MT * 32 * KQ * static_cast<int>(sizeof(T));
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int per_cta = blockDim.x >> 5, wi = threadIdx.x >> 5;
  const int nw = gridDim.x * per_cta;
  const int v = blockIdx.x * per_cta + wi;
  const int lo = v * a.chunk;
  const int hi = min(lo + a.chunk, a.nnz);
  if (lo < hi)
    stream_blocks<BF16, NT, KQ, MT>(a, lo, hi, v, stages, reinterpret_cast<uint64_t*>(smem) + wi * stages,
                                    smem + ring_offset(per_cta, stages) + wi * stages * BLOCK);
  empty_rows<BF16>(a, v, nw, lane);
}

}  // namespace opforge_block_sparse_decode
