// block_sparse's CUDA decode forward: what its parts share (no torch header, no device code).
//
// * decode_cuda.cpp: the ops on the LibTorch stable ABI; checks the tensors, then grid_of() and
//   launch() with raw pointers and the current stream.
// * decode_cuda_launch.cu: grid_of() and launch(): the variant a call takes, and its grid.
// * decode_cuda_{bf16,f16}.cu: the kernels of one dtype (decode_cuda_kernel.cuh), built in
//   parallel; each exports its kernel table.
//
// y = x Wᵀ (+ b) for 1 <= T <= kMaxTokens tokens (below), W's kept blocks stored (nnz, bh, bw) in block-row order
// (row_ptr, cols: int64). sm_90 and newer only (the copy engine's cp.async.bulk and mbarriers):
// elsewhere grid_of() offers nothing and the Triton kernels take the call.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the driver's encoder is found at run time)
#include <cuda_runtime_api.h>

#include <cstdint>

namespace opforge_block_sparse_decode {

// The variants compiled: bh and bw of 32, 64 or 128, 8-token tiles 1, 2 or 4 through mma.sync; built with
// -DOPFORGE_DECODE_WGMMA (and for sm_90a), also tiles of 1, 2, 4 and 8 (the 64-token tile) through wgmma for
// 64 x 64 and 128 x 64 blocks. The package's build sets OPFORGE_ARCH_SPECIFIC (engine/flags.py): a compute
// capability 9.0 GPU then runs this binary's sm_90a code, or PTX older than compute_90, which grid_of()
// refuses; so the wgmma tiles are in.
#if defined(OPFORGE_ARCH_SPECIFIC) && !defined(OPFORGE_DECODE_WGMMA)
#define OPFORGE_DECODE_WGMMA 1
#endif
#ifdef OPFORGE_DECODE_WGMMA
constexpr int kMaxTokens = 64;
#else
constexpr int kMaxTokens = 32;
#endif

// The launch arguments: the tensors' data and the geometry.
struct Args {
  const void* x;  // (tokens, k_in)
  const void* w;  // (nnz, bh, bw)
  const void* b;  // (n_out) or nullptr
  void* y;        // (tokens, n_out)
  const int64_t* cols;
  const int64_t* row_ptr;
  float* part;  // a slot a (CTA, 16-row strip): NT * 32 float4
  int* counts;  // one a (block-row, 16-row strip): zeros, left at zero
  int tokens, k_in, n_out, bh, rows, nnz, chunk;  // chunk: blocks a CTA
};

// A launch: the variant (8-token tiles, bw / 32, bh / 16, and wg: 1 for wgmma's tile, 0 for mma.sync's) and its
// config (blocks in flight a CTA, CTAs an SM, and overlap: 1 to launch as a programmatic dependent of the kernel
// before it on the stream, which starts while that one ends: see decode_cuda_kernel.cuh).
struct Config {
  int nt, kq, mt, wg, stages, ctas, overlap;
};

// (the args, the ring's slots, x's tensor map: a (bw, T) box of x, unused by mma.sync's tiles at T = 1, in the
// 128-byte swizzle for wgmma's; W's: a (bw, bh) box of W as (nnz * bh, bw) in the 128-byte swizzle, read by the
// wgmma tiles only)
using Kernel = void (*)(Args, int, CUtensorMap, CUtensorMap);

// The kernel of a variant (nullptr: not compiled). One table a dtype (decode_cuda_{bf16,f16}.cu).
Kernel kernel_bf16(int nt, int kq, int mt, bool wg);
Kernel kernel_f16(int nt, int kq, int mt, bool wg);

int threads_of(const Config& c);
int smem_of(const Config& c, int elem_bytes);

// The grid (CTAs) the config launches on `device`: `ctas` an SM, or as many as fit at once; 0 when
// the variant isn't compiled, the device is older than sm_90, it fits nowhere, or the driver has
// no tensor-map encoder (cuTensorMapEncodeTiled, CUDA 12.0+).
cudaError_t grid_of(bool bf16, const Config& c, int device, int* grid);

// Launch over `grid` CTAs; a.chunk blocks each.
cudaError_t launch(bool bf16, const Config& c, int grid, const Args& a, cudaStream_t stream);

// The variant's driver function (a CUfunction) in the current device's context, for a launch from
// packed parameters (native_launch's recipes), whose shared memory attribute grid_of() has set.
cudaError_t function_of(bool bf16, const Config& c, void** fn);

}  // namespace opforge_block_sparse_decode
