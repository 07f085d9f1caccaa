// block_sparse's CUDA decode forward (decode_cuda.h), the kernel: one ring of weight blocks a CTA.
//
// A memory-bound kernel, so its one job is to keep HBM busy from the first cycle to the last.
//
// * CTA c takes the blocks [c * chunk, (c + 1) * chunk) in storage order: an equal share of the
//   bytes whatever the rows' lengths, so no SM waits on a long row. (Shares of whole rows, the rows
//   starting in each, took 1.1-3.1x as long on issue 35's layers at every T: the CTAs stream at about the
//   same rate a block, so the CTA with the longest row sets the layer's time; docs/benchmarks.md, issue 35,
//   twenty-sixth session.)
// * A producer warp copies the share's blocks into a ring of `stages` slots in shared memory with
//   the copy engine (cp.async.bulk; an mbarrier for a slot full, one for it empty): the bytes in
//   flight are bounded by shared memory, not registers. bh / 16 consumer warps each take a 16-row
//   strip of every block, so a block is read from HBM once.
// * A slot holds its block and x's slices at the block's column: one copy of the (bw, T) box of x
//   through a tensor map (launch() makes it each call), where a copy a token cost the producer warp
//   a copy engine request each (docs/benchmarks.md, issue 35, twenty-second session). The blocks'
//   columns come to the producer 32 at a time across its lanes, the next 32 on their way. So a
//   consumer loads nothing from global memory in its loop: it waits for its slot and multiplies.
//   Under a saturated HBM one trip to memory costs microseconds, the whole kernel's budget; with x
//   loaded by the consumers, three blocks ahead in registers, the kernel ran 0.2-1.3 µs a layer
//   slower on the H100 at d <= 0.25 (docs/benchmarks.md, issue 35, twenty-first session).
// * The block's row is found once a CTA (consumer warp 0, shared through shared memory), and a row's
//   owner loads the earlier CTAs' partial sums four slots at a time.
// * The CTA walks its share backwards, from its last block to its first. A row cut at the share's
//   end (it goes on into the next CTA) comes first: its fp32 partial sums go to the CTA's slot,
//   counted in with a release add, long before the CTA holding the row's last block, which walks
//   that part last, needs them. That CTA sums the slots (lower CTAs first, in order: the same
//   result whoever finished first) and its own registers: one trip to memory at the end of its
//   walk, not a chain. It waits only on CTAs of lower index, which never wait on it: no deadlock.
//   Each (row, strip) count goes back to zero for the next launch. Handing the sums on otherwise was slower on
//   the H200: between a cluster's two CTAs through distributed shared memory (0.2-1.4 us a layer), or through a
//   courier warp of its own, off the consumers' path (0.6-10.8 us: one warp sums in series what the owner's
//   consumer warps sum in parallel); docs/benchmarks.md, issue 35, twenty-eighth session.
// * Empty block-rows (no blocks, so in no share) get the bias, or zeros, from every warp at the end.
// * Launched as a programmatic dependent (Config::overlap), a CTA starts while the kernel before it
//   on the stream ends, and asks for its first `stages` blocks into L2 (a prefetch: no data read)
//   before it waits for that kernel (griddepcontrol.wait) and reads anything, weights included:
//   the kernel before may be the one that wrote them. Each CTA lets the next kernel start once its
//   last copy is issued.
//
// On the H100 it reads the weight at up to ~2.9 TB/s (docs/benchmarks.md, issue 35).
//
// Diagnostics only (wrong results; bench/cuda_probe/decode_cuda_ablate.py builds them apart): OPFORGE_DECODE_ABLATE_
// PARTIALS stores every cut row as it is, _MATH skips the products, _X copies no x. The cut rows' partial sums were
// the largest part of the time over the floor, 0.7-2.5 us a layer (H200; docs/benchmarks.md, issue 35,
// twenty-seventh session).
#pragma once

#include "decode_cuda_device.cuh"

namespace opforge_block_sparse_decode {

// The dynamic shared memory: the full and empty mbarriers, the CTA's row search (a Found), then the ring.
// A wgmma tile's ring (wgmma's 128-byte swizzle) starts on a 1024-byte boundary, which the kernel finds
// at run time within kWgSlack more bytes.
__host__ __device__ constexpr int found_offset(int stages) { return 2 * stages * 8; }
__host__ __device__ constexpr int ring_offset(int stages) { return (found_offset(stages) + 16 + 127) / 128 * 128; }
constexpr int kWgSlack = 1024;

// The wgmma tiles (WG): W and x both in the 128-byte swizzle (decode_cuda_device.cuh), 64-wide blocks (a row of
// a block is a swizzle's 128 bytes) of 64 or 128 rows (one warpgroup a 64), 8, 16, 32 or 64 tokens (NT 1, 2, 4,
// 8). The 64-token tile is wgmma's only; the others are mma.sync's too, for the blocks wgmma's don't take and
// GPUs other than compute capability 9.0. Where both run, wgmma's was as fast or faster on every row of issue 35
// (docs/benchmarks.md, twenty-sixth session), and the op takes it (decode_cuda.cpp's pick).
template <int NT, int KQ, int MT, bool WG>
__host__ __device__ constexpr bool compiled_variant() {
#ifdef OPFORGE_DECODE_WGMMA
  return WG ? KQ == 2 && (MT == 4 || MT == 8) : NT < 8;
#else
  return !WG && NT < 8;
#endif
}

// A slot of the ring: a block, then x's slice at its column, a row of bw a token (NT * 8 rows; the
// first T filled).
template <bool BF16, int NT, int KQ, int MT>
__host__ __device__ constexpr int slot_bytes() {
  return (16 * MT + 8 * NT) * 32 * KQ * static_cast<int>(sizeof(typename Elem<BF16>::T));
}

// Consumer warp `m` (rows 16 m .. 16 m + 15 of each block) over the CTA's blocks [lo, hi), backwards.
template <bool BF16, int NT, int KQ, int MT, bool WG>
__device__ __forceinline__ void consume(const Args& a, int lo, int hi, int c, int m, int stages, uint64_t* full,
                                       uint64_t* empty, const unsigned char* ring, Found* shared_found) {
  using T = typename Elem<BF16>::T;
  constexpr int BW = 32 * KQ;
  constexpr int BLOCK = 16 * MT * BW * static_cast<int>(sizeof(T));
  constexpr int SLOT = slot_bytes<BF16, NT, KQ, MT>();
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int steps = hi - lo;
  // the row of block hi - 1 (blocks [rs, re)), and the first block of the row before it
  // One search a CTA (consumer warp 0's), shared with the others through shared memory: every
  // consumer warp needs the same row, and each search reads all of row_ptr.
  if (m == 0) {
    const Found mine = find_row(a.row_ptr, a.rows, hi - 1, lane);
    if (lane == 0) *shared_found = mine;
  }
  asm volatile("bar.sync 1, %0;" ::"r"(MT * 32) : "memory");  // the consumer warps only
  const Found f = *shared_found;
  int r = f.r, rs = f.rs, re = f.rs + f.n;
  int before = r > 0 ? static_cast<int>(__ldg(a.row_ptr + r - 1)) : 0;

  float acc[NT][4] = {};
  int slot = 0, parity = 0;
  for (int k = 0; k < steps; ++k) {
    const int kb = hi - 1 - k;
    const bool flush = kb == rs || k == steps - 1;  // walking backwards: the row's part in this share ends here
    bar_wait(full + slot, parity);
#ifdef OPFORGE_DECODE_ABLATE_MATH
    if constexpr (true) {
    } else if constexpr (WG) {
#else
    if constexpr (WG) {
#endif
      // the warpgroup's 64 rows of the block against every token: four k16 steps of 32 bytes in the
      // swizzled rows. x's rows past T hold whatever the slot held: they reach only y's columns past
      // T, which nothing stores (store_strip) or adds to a stored column. The products are waited for
      // at once: waiting only once the next slot is in (a wait under a branch) made ptxas serialize the
      // wgmmas (C7518), 0.1-0.5 us a layer slower (docs/benchmarks.md, issue 35, twenty-fifth session).
      const unsigned char* sw = ring + slot * SLOT + (m >> 2) * 64 * BW * static_cast<int>(sizeof(T));
      const unsigned char* sx = ring + slot * SLOT + BLOCK;
      wg_pin(acc);
      wg_fence();
#pragma unroll
      for (int s = 0; s < 2 * KQ; ++s) wg_mma<BF16, NT>(acc, sw128_desc(sw + 32 * s), sw128_desc(sx + 32 * s));
      wg_commit();
      wg_wait();
      wg_pin(acc);
    } else {
      const unsigned char* sw = ring + slot * SLOT + ((m * 16 + g) * BW + 8 * t) * static_cast<int>(sizeof(T));
      const unsigned char* sx = ring + slot * SLOT + BLOCK + (g * BW + 8 * t) * static_cast<int>(sizeof(T));
#pragma unroll
      for (int q = 0; q < KQ; ++q) {
        const uint4 lo4 = lds128(sw + (32 * q) * static_cast<int>(sizeof(T)));
        const uint4 hi4 = lds128(sw + (8 * BW + 32 * q) * static_cast<int>(sizeof(T)));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {  // x's token nt * 8 + g, from the slot (zeros past T)
          const uint4 xq = nt * 8 + g < a.tokens
                               ? lds128(sx + (nt * 8 * BW + 32 * q) * static_cast<int>(sizeof(T)))
                               : make_uint4(0, 0, 0, 0);
          mma<BF16>(acc[nt], lo4.x, hi4.x, lo4.y, hi4.y, xq.x, xq.y);
          mma<BF16>(acc[nt], lo4.z, hi4.z, lo4.w, hi4.w, xq.z, xq.w);
        }
      }
    }
    __syncwarp();
    if (lane == 0) bar_arrive(empty + slot);
    if (flush) {
      const int unit = r * MT + m;
#ifdef OPFORGE_DECODE_ABLATE_PARTIALS
      if (true) {
#else
      if (rs >= lo && re <= hi) {  // the whole row
#endif
        store_strip<BF16, NT>(a, acc, r, m, g, t);
      } else if (re > hi) {  // the row goes on past this share: its last block is another CTA's
        put_partial<NT>(a, acc, c * MT + m, lane);
        arrive(a, unit, lane);
      } else {  // rs < lo, re <= hi: the row's last block is here; the CTAs before came in earlier
        const int c0 = rs / a.chunk;
        wait_count(a, unit, c - c0, lane);
        // the slots of CTAs c0 .. c - 1, G loads in flight at a time, added in CTA order: four, or two of
        // the 64-token tile's (157 registers a thread, 2 CTAs an SM; four: 220 and one CTA, 2-9 us a layer
        // slower at d >= 0.25; one: 127 and three, 0-0.8 us slower: docs/benchmarks.md, issue 35,
        // twenty-fifth session)
        constexpr int G = NT >= 8 ? 2 : 4;
        float sum[NT][4] = {};
        for (int w0 = c0; w0 < c; w0 += G) {
          float4 p[G][NT];
#pragma unroll
          for (int j = 0; j < G; ++j)
            if (w0 + j < c) {
              const float4* part = slot_of<NT>(a, (w0 + j) * MT + m);
#pragma unroll
              for (int i = 0; i < NT; ++i) p[j][i] = __ldcg(part + i * 32 + lane);
            }
#pragma unroll
          for (int j = 0; j < G; ++j)
            if (w0 + j < c)
#pragma unroll
              for (int i = 0; i < NT; ++i) {
                sum[i][0] += p[j][i].x;
                sum[i][1] += p[j][i].y;
                sum[i][2] += p[j][i].z;
                sum[i][3] += p[j][i].w;
              }
        }
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[i][e] += acc[i][e];
        store_strip<BF16, NT>(a, sum, r, m, g, t);
        if (lane == 0) a.counts[unit] = 0;
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
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

// A block into its slot: a plain bulk copy, or for wgmma (WG) through W's tensor map, which lays it out
// in the 128-byte swizzle: W as (nnz * bh, bw), the block's rows from `row`. Both L2 evict-first. (Asking the
// block 4 or 8 steps on into L2 with each copy, so that more of the share is on its way than the ring holds, was
// up to 3.7 us a layer slower at d >= 0.25, and within 0.3 us at d = 0.1: docs/benchmarks.md, issue 35,
// twenty-sixth session; bench/cuda_probe/decode_cuda_stream.py at commit 546a3cb builds both.)
template <bool WG>
__device__ __forceinline__ void copy_block(void* dst, const void* src, int bytes, const CUtensorMap* wmap, int row,
                                           uint64_t* bar) {
  if constexpr (WG)
    tensor_copy_2d_once(dst, wmap, 0, row, bar);
  else
    bulk_copy_once(dst, src, bytes, bar);
}

// MT = bh / 16 consumer warps and a producer warp.
template <bool BF16, int NT, int KQ, int MT, bool WG>
__global__ void __launch_bounds__(32 * (MT + 1))
    decode_kernel(const Args a, int stages, const __grid_constant__ CUtensorMap xmap,
                  const __grid_constant__ CUtensorMap wmap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the copy engine's bulk copies (grid_of offers sm_90+ only)
  using T = typename Elem<BF16>::T;
  constexpr int BLOCK = 16 * MT * 32 * KQ * static_cast<int>(sizeof(T));
  constexpr int SLOT = slot_bytes<BF16, NT, KQ, MT>();
  constexpr int XROW = 32 * KQ * static_cast<int>(sizeof(T));  // a token's slice of x at a block's column
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + stages;
  unsigned char* ring = smem + ring_offset(stages);
  if constexpr (WG) ring += (1024 - (smem_u32(ring) & 1023)) & 1023;  // the swizzle's 1024-byte boundary
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const int c = blockIdx.x;
  const int lo = c * a.chunk;
  const int hi = min(lo + a.chunk, a.nnz);
  const unsigned char* w = static_cast<const unsigned char*>(a.w);
  auto block = [&](int k) { return w + static_cast<int64_t>(hi - 1 - k) * BLOCK; };  // step k's block
  if (threadIdx.x == 0) {
    for (int k = 0; k < min(stages, hi - lo); ++k) prefetch_l2(block(k), BLOCK);
    for (int i = 0; i < stages; ++i) {
      bar_init(full + i, 1);
      bar_init(empty + i, MT);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  wait_for_prior_grids();
  __syncthreads();
  if (lo < hi) {
    if (wi == MT) {
      // The copy engine fills each slot with its block and the x slices of the block's column (one
      // copy of x's (bw, T) box through its tensor map; a plain copy for one token), both counted on
      // the slot's full barrier, both issued by lane 0. The first `stages` blocks need no layout, so
      // they go first; then each slot's x once its column is in, and the later blocks as slots come
      // free.
      const int steps = hi - lo, first = min(stages, steps);
#ifdef OPFORGE_DECODE_ABLATE_X
      const int expect = BLOCK;
#else
      const int expect = BLOCK + a.tokens * XROW;
#endif
      if (lane == 0)
        for (int k = 0; k < first; ++k) {
          bar_expect(full + k, expect);
          copy_block<WG>(ring + k * SLOT, block(k), BLOCK, &wmap, (hi - 1 - k) * 16 * MT, full + k);
        }
      // step k's column is lane k % 32's of chunk k / 32; the next chunk on its way
      auto col_rev = [&](int k) { return k < steps ? static_cast<int>(__ldg(a.cols + hi - 1 - k)) : 0; };
      int colv = col_rev(lane), colv_ahead = col_rev(32 + lane);
      const unsigned char* x = static_cast<const unsigned char*>(a.x);
      int slot = 0, round = 0;
      for (int k = 0; k < steps; ++k) {
        if (k >= first && lane == 0) {
          bar_wait(empty + slot, (round - 1) & 1);
          bar_expect(full + slot, expect);
          copy_block<WG>(ring + slot * SLOT, block(k), BLOCK, &wmap, (hi - 1 - k) * 16 * MT, full + slot);
        }
        if ((k & 31) == 0 && k > 0) {
          colv = colv_ahead;
          colv_ahead = col_rev(k + 32 + lane);
        }
        const int col = __shfl_sync(0xffffffffu, colv, k & 31);  // after lane 0's expect: the warp meets here
#ifdef OPFORGE_DECODE_ABLATE_X
        if (false) {
#else
        if (lane == 0) {
#endif
          if (!WG && a.tokens == 1)  // (wgmma's tiles read x's rows in the swizzle: through the map)
            bulk_copy(ring + slot * SLOT + BLOCK, x + static_cast<int64_t>(col) * (32 * KQ) * static_cast<int>(sizeof(T)),
                      XROW, full + slot);
          else  // every token's slice in one copy: the (bw, T) box of x at the column
            tensor_copy_2d(ring + slot * SLOT + BLOCK, &xmap, col * (32 * KQ), 0, full + slot);
        }
        if (++slot == stages) {
          slot = 0;
          ++round;
        }
      }
      let_dependents_start();
    } else {
      consume<BF16, NT, KQ, MT, WG>(a, lo, hi, c, wi, stages, full, empty, ring,
                                reinterpret_cast<Found*>(smem + found_offset(stages)));
    }
  }
  empty_rows<BF16>(a, c * (MT + 1) + wi, gridDim.x * (MT + 1), lane);
#endif
}

// The variants of a dtype: nt (8-token tiles) 1, 2, 4 (8: wgmma's only); kq = bw / 32 and mt = bh / 16 of 1, 2, 4
// and 2, 4, 8; wg: through wgmma (compiled_variant).
template <bool BF16, int NT, int KQ, int MT>
Kernel variant(bool wg) {
  if constexpr (compiled_variant<NT, KQ, MT, true>())
    if (wg) return decode_kernel<BF16, NT, KQ, MT, true>;
  if constexpr (compiled_variant<NT, KQ, MT, false>())
    if (!wg) return decode_kernel<BF16, NT, KQ, MT, false>;
  return nullptr;
}

template <bool BF16, int NT, int KQ>
Kernel pick_mt(int mt, bool wg) {
  switch (mt) {
    case 2: return variant<BF16, NT, KQ, 2>(wg);
    case 4: return variant<BF16, NT, KQ, 4>(wg);
    case 8: return variant<BF16, NT, KQ, 8>(wg);
    default: return nullptr;
  }
}

template <bool BF16, int NT>
Kernel pick_kq(int kq, int mt, bool wg) {
  switch (kq) {
    case 1: return pick_mt<BF16, NT, 1>(mt, wg);
    case 2: return pick_mt<BF16, NT, 2>(mt, wg);
    case 4: return pick_mt<BF16, NT, 4>(mt, wg);
    default: return nullptr;
  }
}

template <bool BF16>
Kernel kernel_table(int nt, int kq, int mt, bool wg) {
  switch (nt) {
    case 1: return pick_kq<BF16, 1>(kq, mt, wg);
    case 2: return pick_kq<BF16, 2>(kq, mt, wg);
    case 4: return pick_kq<BF16, 4>(kq, mt, wg);
#ifdef OPFORGE_DECODE_WGMMA
    case 8: return pick_kq<BF16, 8>(kq, mt, wg);
#endif
    default: return nullptr;
  }
}

}  // namespace opforge_block_sparse_decode
