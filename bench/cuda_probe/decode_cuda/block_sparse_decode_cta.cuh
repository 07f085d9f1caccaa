// The probe's second design: one ring a CTA, its warps consuming each block together.
//
// The per-warp kernel (block_sparse_decode.cuh) gives every warp ~7 blocks, so nearly every row is
// cut between three warps or more and summed at the end of the ranges, after the last weight byte
// (1.6-4.1 µs on the H100). Here the unit of work is the CTA: its share (~27 blocks at d=0.25 on
// 132 SMs) is what gets cut, at most at its two ends.
//
// * A producer warp (lane 0) copies the CTA's blocks into a ring of STAGES slots (cp.async.bulk, an
//   mbarrier for full and one for empty a slot); bh / 16 consumer warps each take a 16-row strip of
//   every block (W rows as mma's A, as in the per-warp kernel), so a block is read from HBM once.
// * The CTA walks its share backwards, from its last block to its first. A row cut at the CTA's
//   end (it goes on into the next CTA) comes first: its partial sums are in their slot, counted in
//   with a release add, long before the CTA that holds the row's last block, which walks that part
//   last, needs them. That CTA sums the slots (lower CTAs, in order) and its own registers at the
//   end of its walk: one trip to memory, not a chain. A CTA wholly inside a row adds its part at its
//   end. A CTA waits only on CTAs of lower index: no deadlock, whatever fits the GPU at once.
#pragma once

#include "block_sparse_decode.cuh"

namespace opforge_block_sparse_decode {

// The dynamic shared memory: the full and empty mbarriers, then the ring.
__host__ __device__ constexpr int cta_ring_offset(int stages) { return (2 * stages * 8 + 127) / 128 * 128; }
__host__ __device__ constexpr int cta_smem_bytes(int stages, int block_bytes) {
  return cta_ring_offset(stages) + stages * block_bytes;
}

__device__ __forceinline__ void bar_init_count(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Consumer warp `m` (rows 16 m .. 16 m + 15 of each block) over the CTA's blocks [lo, hi), backwards.
template <bool BF16, int NT, int KQ, int MT>
__device__ __forceinline__ void cta_consume(const Args& a, int lo, int hi, int c, int m, int stages, uint64_t* full,
                                            uint64_t* empty, const unsigned char* ring) {
  using T = typename Elem<BF16>::T;
  constexpr int BW = 32 * KQ;
  constexpr int BLOCK = 16 * MT * BW * static_cast<int>(sizeof(T));
  constexpr int XB = NT <= 2 ? 3 : 1;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = hi - lo;
  // step k is block hi - 1 - k; lane i holds the columns of steps 32 c + i (chunk c) and the next chunk
  auto col_rev = [&](int k) { return k < steps ? static_cast<int>(__ldg(a.cols + hi - 1 - k)) : 0; };
  int colv = col_rev(lane), colv_ahead = col_rev(32 + lane);
  auto col_of = [&](int k, int k0) {
    const int c0 = __shfl_sync(0xffffffffu, colv, k & 31), c1 = __shfl_sync(0xffffffffu, colv_ahead, k & 31);
    return (k >> 5) == (k0 >> 5) ? c0 : c1;
  };
  // the row of block hi - 1, and the start of the one before it
  const Found f = find_row(a.row_ptr, a.rows, hi - 1, lane);
  int r = f.r, rs = f.rs, re = f.rs + f.n;
  int before = r > 0 ? static_cast<int>(__ldg(a.row_ptr + r - 1)) : 0;

  uint4 xb[XB][NT][KQ];
#pragma unroll
  for (int b = 0; b < XB; ++b)
    if (b < steps) load_x<BF16, NT, KQ>(a, xb[b], col_of(b, 0), g, t);
  float acc[1][NT][4] = {};
  int slot = 0, parity = 0;
  for (int k0 = 0; k0 < steps; k0 += XB) {
#pragma unroll
    for (int b = 0; b < XB; ++b) {
      const int k = k0 + b;
      if (k >= steps) break;
      if ((k & 31) == 0 && k > 0) {
        colv = colv_ahead;
        colv_ahead = col_rev(k + 32 + lane);
      }
      bar_wait(full + slot, parity);
      const unsigned char* sw = ring + slot * BLOCK + ((m * 16 + g) * BW + 8 * t) * static_cast<int>(sizeof(T));
#pragma unroll
      for (int q = 0; q < KQ; ++q) {
        const uint4 lo4 = lds128(sw + (32 * q) * static_cast<int>(sizeof(T)));
        const uint4 hi4 = lds128(sw + (8 * BW + 32 * q) * static_cast<int>(sizeof(T)));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 xq = xb[b][nt][q];
          mma<BF16>(acc[0][nt], lo4.x, hi4.x, lo4.y, hi4.y, xq.x, xq.y);
          mma<BF16>(acc[0][nt], lo4.z, hi4.z, lo4.w, hi4.w, xq.z, xq.w);
        }
      }
      __syncwarp();
      if (lane == 0) bar_arrive(empty + slot);
      if (k + XB < steps) load_x<BF16, NT, KQ>(a, xb[b], col_of(k + XB, k), g, t);
      const int kb = hi - 1 - k;
      if (kb == rs || k == steps - 1) {  // walking backwards: the row's part in this CTA ends here
        const int u = r * MT + m;
        if (rs >= lo && re <= hi) {
          store_row<BF16, NT, 1>(a, acc, r, g, t, m);
        } else if (re > hi) {  // the row goes on past this CTA, which doesn't hold its last block
          put_partial<NT, 1>(a, acc, c * MT + m, lane);
          arrive(a, u, lane);
        } else {  // rs < lo, re <= hi: the row's last block is here; the other parts came in earlier
          const int c0 = rs / a.chunk;
          if (lane == 0) {
            int seen = 0;
            do {
              asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(a.counts + u) : "memory");
            } while (seen != c - c0);
          }
          __syncwarp();
          float sum[1][NT][4] = {};
          for (int w = c0; w < c; ++w) {
            const float4* part = slot_of<NT, 1>(a, w * MT + m);
#pragma unroll
            for (int i = 0; i < NT; ++i) {
              const float4 p = __ldcg(part + i * 32 + lane);
              sum[0][i][0] += p.x;
              sum[0][i][1] += p.y;
              sum[0][i][2] += p.z;
              sum[0][i][3] += p.w;
            }
          }
#pragma unroll
          for (int i = 0; i < NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) sum[0][i][e] += acc[0][i][e];
          store_row<BF16, NT, 1>(a, sum, r, g, t, m);
          if (lane == 0) a.counts[u] = 0;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.0f;
        if (kb == rs && k < steps - 1) {  // back to the previous non-empty row
          --r;
          re = rs;
          rs = before;
          while (rs == re) rs = static_cast<int>(__ldg(a.row_ptr + (--r)));  // empty rows: rare
          before = r > 0 ? static_cast<int>(__ldg(a.row_ptr + r - 1)) : 0;
        }
      }
      if (++slot == stages) {
        slot = 0;
        parity ^= 1;
      }
    }
  }
}

// MT = bh / 16 consumer warps and a producer warp.
template <bool BF16, int NT, int KQ, int MT>
__global__ void __launch_bounds__(32 * (MT + 1)) cta_kernel(const Args a, int stages) {
  using E = Elem<BF16>;
  using T = typename E::T;
  constexpr int BLOCK = 16 * MT * 32 * KQ * static_cast<int>(sizeof(T));
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + stages;
  unsigned char* ring = smem + cta_ring_offset(stages);
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const int c = blockIdx.x;
  const int lo = c * a.chunk;
  const int hi = min(lo + a.chunk, a.nnz);
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      bar_init_count(full + i, 1);
      bar_init_count(empty + i, MT);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (lo < hi) {
    if (wi == MT) {
      if (lane == 0) {
        const unsigned char* w = static_cast<const unsigned char*>(a.w);
        int slot = 0, round = 0;
        for (int k = 0; k < hi - lo; ++k) {
          if (round > 0) bar_wait(empty + slot, (round - 1) & 1);
          bulk_load(ring + slot * BLOCK, w + static_cast<int64_t>(hi - 1 - k) * BLOCK, BLOCK, full + slot);
          if (++slot == stages) {
            slot = 0;
            ++round;
          }
        }
      }
    } else {
      cta_consume<BF16, NT, KQ, MT>(a, lo, hi, c, wi, stages, full, empty, ring);
    }
  }
  empty_rows<BF16>(a, c * (MT + 1) + wi, gridDim.x * (MT + 1), lane);
}

}  // namespace opforge_block_sparse_decode
