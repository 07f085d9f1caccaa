// block_sparse's CUDA decode forward, the device pieces the kernel (decode_cuda_kernel.cuh) is made
// of: the element types, the tensor-core step, the copy engine and its barriers, finding a block's
// row, and the stores of y and the loads and stores of the partial sums.
//
// The arithmetic: mma.sync m16n8k16 (fp32 accumulate) with W's rows as A (a 16-row strip of a
// block) and x's tokens as B (NT tiles of 8). A mma's k order is free as long as A and B agree, so
// lane (g = lane / 4, t = lane % 4) reads 8 consecutive elements of a row at column 32 q + 8 t with
// one 16-byte load for both operands (W rows g and g + 8 and x token g, all from the ring's slot in
// shared memory) and uses elements 0-3 in one k16 step and 4-7 in the next.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_cuda.h"

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

// wgmma (sm_90a: the kernel TUs built with -gencode=arch=compute_90a,code=sm_90a and
// -DOPFORGE_DECODE_WGMMA): the wgmma tiles' arithmetic (decode_cuda_kernel.cuh's consume, WG). W's
// rows as A and x's tokens as B, both read by the tensor cores from the ring's slot, where the copy
// engine put them in the 128-byte swizzle: rows of 64 elements (128 bytes), 8-row groups 1024 bytes
// apart. A warpgroup's four warps issue one m64nNk16 (N = 8 NT tokens) together; warp w of it holds rows
// 16 w + g and + 8 of the 64, tokens 8 i + 2 t and + 1 in d[4 i ..], the same places as mma.sync's acc[i][..]
// (store_strip, put_partial and the owners' sums take either).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM90A)
#define OPFORGE_WGMMA_DEVICE 1
#endif

// A shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t sw128_desc(const void* p) {
  const uint64_t addr = static_cast<uint64_t>(__cvta_generic_to_shared(p));
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wg_fence() {
#ifdef OPFORGE_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_commit() {
#ifdef OPFORGE_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_wait() {
#ifdef OPFORGE_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}

// Pins the accumulators in their registers at this point of the program (no code), so that no access to them
// is moved across a wgmma's issue or its wait.
template <int NT>
__device__ __forceinline__ void wg_pin(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// d += A B for a 64 x 16 slice of A (descriptor a) and a 16 x 8 NT slice of B (descriptor b): m64nNk16 with
// N = 8 NT tokens (NT of 1, 2, 4 or 8), 4 NT accumulators a thread.
#define OPFORGE_WG_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
template <bool BF16, int NT>
__device__ __forceinline__ void wg_mma(float (&d)[NT][4], uint64_t a, uint64_t b) {
#ifdef OPFORGE_WGMMA_DEVICE
#define OPFORGE_WG_R4 "%0,%1,%2,%3"
#define OPFORGE_WG_R8 OPFORGE_WG_R4 ",%4,%5,%6,%7"
#define OPFORGE_WG_R16 OPFORGE_WG_R8 ",%8,%9,%10,%11,%12,%13,%14,%15"
#define OPFORGE_WG_R32 OPFORGE_WG_R16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define OPFORGE_WG_CALL(N, TY, REGS, A, B, P, ...)                                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TY "." TY " {" REGS "}, %" A ", %" B               \
               ", p, 1, 1, 0, 0;\n}\n"                                                                             \
               : __VA_ARGS__                                                                                       \
               : "l"(a), "l"(b), "r"(1))
  static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8, "wgmma tiles of 8, 16, 32 or 64 tokens");
  if constexpr (NT == 1) {
    if constexpr (BF16)
      OPFORGE_WG_CALL("8", "bf16", OPFORGE_WG_R4, "4", "5", "6", OPFORGE_WG_D(0));
    else
      OPFORGE_WG_CALL("8", "f16", OPFORGE_WG_R4, "4", "5", "6", OPFORGE_WG_D(0));
  } else if constexpr (NT == 2) {
    if constexpr (BF16)
      OPFORGE_WG_CALL("16", "bf16", OPFORGE_WG_R8, "8", "9", "10", OPFORGE_WG_D(0), OPFORGE_WG_D(1));
    else
      OPFORGE_WG_CALL("16", "f16", OPFORGE_WG_R8, "8", "9", "10", OPFORGE_WG_D(0), OPFORGE_WG_D(1));
  } else if constexpr (NT == 4) {
    if constexpr (BF16)
      OPFORGE_WG_CALL("32", "bf16", OPFORGE_WG_R16, "16", "17", "18", OPFORGE_WG_D(0), OPFORGE_WG_D(1), OPFORGE_WG_D(2),
                      OPFORGE_WG_D(3));
    else
      OPFORGE_WG_CALL("32", "f16", OPFORGE_WG_R16, "16", "17", "18", OPFORGE_WG_D(0), OPFORGE_WG_D(1), OPFORGE_WG_D(2),
                      OPFORGE_WG_D(3));
  } else {
    if constexpr (BF16)
      OPFORGE_WG_CALL("64", "bf16", OPFORGE_WG_R32, "32", "33", "34", OPFORGE_WG_D(0), OPFORGE_WG_D(1), OPFORGE_WG_D(2),
                      OPFORGE_WG_D(3), OPFORGE_WG_D(4), OPFORGE_WG_D(5), OPFORGE_WG_D(6), OPFORGE_WG_D(7));
    else
      OPFORGE_WG_CALL("64", "f16", OPFORGE_WG_R32, "32", "33", "34", OPFORGE_WG_D(0), OPFORGE_WG_D(1), OPFORGE_WG_D(2),
                      OPFORGE_WG_D(3), OPFORGE_WG_D(4), OPFORGE_WG_D(5), OPFORGE_WG_D(6), OPFORGE_WG_D(7));
  }
#undef OPFORGE_WG_CALL
#undef OPFORGE_WG_R32
#undef OPFORGE_WG_R16
#undef OPFORGE_WG_R8
#undef OPFORGE_WG_R4
#endif
}
#undef OPFORGE_WG_D

// The block-row holding block `at`: the last r with row_ptr[r] <= at, its first block and its
// block count. The warp's lanes test 256 entries a round, all loads issued at once (one trip to
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
        if (k < 32) {  // the row is entry count - 1: lane k - 1 of this round, or the last one before
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

__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
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

// One lane: `bytes` more for `bar`'s phase to wait for, and this lane's arrival.
__device__ __forceinline__ void bar_expect(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// One lane: the copy of `bytes` from global `src` into shared `dst`, counted on `bar` (already expecting them).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// One lane: the (box) tile of a 2-D tensor map's tensor at element (c0, c1), innermost first, into
// shared `dst` (128-byte aligned), counted on `bar` (already expecting the box's bytes). `map` is a
// __grid_constant__ kernel parameter.
__device__ __forceinline__ void tensor_copy_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// The weight's blocks are copied with an L2 evict-first policy: each is read once, where x's slices are read by
// every row that keeps their column, and the partial sums by their row's owner. Faster on 10 of issue 35's 12 rows
// at T = 1 and 64, by up to 1.0 us a layer, and 0.2 us slower on one (H200; docs/benchmarks.md, issue 35,
// twenty-sixth session; the probe, bench/cuda_probe/decode_cuda_stream.py, is at commit 546a3cb).
__device__ __forceinline__ uint64_t evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void bulk_copy_once(void* dst, const void* src, int bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(evict_first())
      : "memory");
}

__device__ __forceinline__ void tensor_copy_2d_once(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], "
      "[%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "l"(evict_first())
      : "memory");
}

// One lane: `bytes` from global `src` on their way into L2 (no barrier, no data: harmless even
// where a kernel still running writes `src`, since L2 is where its writes land).
__device__ __forceinline__ void prefetch_l2(const void* src, int bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Programmatic dependent launch: wait until the kernels this one may overlap have finished and their
// writes are visible (at once when it wasn't launched as a dependent), and let the next kernel on
// the stream start its own prologue.
__device__ __forceinline__ void wait_for_prior_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void let_dependents_start() { asm volatile("griddepcontrol.launch_dependents;" :::); }

__device__ __forceinline__ uint4 lds128(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(smem_u32(p)));
  return v;
}

// Rows r * bh + 16 m + g and + 8 of y from a strip's fp32 sums (plus the bias).
template <bool BF16, int NT>
__device__ __forceinline__ void store_strip(const Args& a, const float (&acc)[NT][4], int r, int m, int g, int t) {
  using E = Elem<BF16>;
  using T = typename E::T;
  const T* bias = static_cast<const T*>(a.b);
  T* y = static_cast<T*>(a.y);
  const int f0 = r * a.bh + m * 16 + g;
  const float b0 = bias ? E::in(bias[f0]) : 0.0f, b1 = bias ? E::in(bias[f0 + 8]) : 0.0f;
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int tok = i * 8 + 2 * t;
    if (tok < a.tokens) {
      y[static_cast<int64_t>(tok) * a.n_out + f0] = E::out(acc[i][0] + b0);
      y[static_cast<int64_t>(tok) * a.n_out + f0 + 8] = E::out(acc[i][2] + b1);
    }
    if (tok + 1 < a.tokens) {
      y[static_cast<int64_t>(tok + 1) * a.n_out + f0] = E::out(acc[i][1] + b0);
      y[static_cast<int64_t>(tok + 1) * a.n_out + f0 + 8] = E::out(acc[i][3] + b1);
    }
  }
}

// A strip's partial sums: slot `slot` of a.part (each lane its own float4s).
template <int NT>
__device__ __forceinline__ float4* slot_of(const Args& a, int slot) {
  return reinterpret_cast<float4*>(a.part) + static_cast<int64_t>(slot) * (NT * 32);
}

template <int NT>
__device__ __forceinline__ void put_partial(const Args& a, const float (&acc)[NT][4], int slot, int lane) {
  float4* mine = slot_of<NT>(a, slot);
#pragma unroll
  for (int i = 0; i < NT; ++i) mine[i * 32 + lane] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
}

// Counts the warp's partial sums in (release order: they are visible before the count is). Slots that signal
// themselves instead (SLOT_EMPTY until stored, as the Triton decode kernel's: no count, no fence, one trip at the
// owner) were within -0.5/+0.4 us a layer on the short rows at T <= 16, 0.2-1.0 us slower on the long ones and up to
// 7.4 us slower at T = 64 (H200; docs/benchmarks.md, issue 35, twenty-seventh session; commit 64040c3).
__device__ __forceinline__ void arrive(const Args& a, int unit, int lane) {
  __syncwarp();
  if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.counts + unit) : "memory");
}

// Lane 0 waits, with acquire order, until `unit`'s count reaches `expected`; the warp then reads the slots.
__device__ __forceinline__ void wait_count(const Args& a, int unit, int expected, int lane) {
  if (lane == 0) {
    int seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(a.counts + unit) : "memory");
    } while (seen != expected);
  }
  __syncwarp();
}

// The empty block-rows (no blocks, so no CTA's share holds them): the bias, or zeros. Warp `first`
// of `count` takes rows first, first + count, ...
template <bool BF16>
__device__ __forceinline__ void empty_rows(const Args& a, int first, int count, int lane) {
  using E = Elem<BF16>;
  using T = typename E::T;
  const T* bias = static_cast<const T*>(a.b);
  for (int r = first; r < a.rows; r += count) {
    if (__ldg(a.row_ptr + r + 1) != __ldg(a.row_ptr + r)) continue;
    for (int e = lane; e < a.tokens * a.bh; e += 32) {
      const int tok = e / a.bh, f = r * a.bh + (e - tok * a.bh);
      static_cast<T*>(a.y)[static_cast<int64_t>(tok) * a.n_out + f] = E::out(bias ? E::in(bias[f]) : 0.0f);
    }
  }
}

}  // namespace opforge_block_sparse_decode
