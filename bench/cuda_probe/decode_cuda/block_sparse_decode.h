// The probe's CUDA decode kernel, its host side (no torch header): the variants compiled, the grid a launch
// gets, and the launch. See block_sparse_decode.cuh for the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace opforge_block_sparse_decode {

// The launch arguments: the tensors' data, the geometry, and the host's share of the steps.
struct Args {
  const void* x;   // (tokens, k_in)
  const void* w;   // (nnz, bh, bw)
  const void* b;   // (n_out) or nullptr
  void* y;         // (tokens, n_out)
  const int64_t* cols;
  const int64_t* row_ptr;
  float* part;     // 2 slots a warp, MT * NT * 32 float4 each
  int* counts;     // one a block-row (the CTA kernel: a 16-row strip), zeros, left at zero
  int tokens, k_in, n_out, bh, rows, nnz, chunk;  // chunk: blocks a warp
  int ablate;  // the probe's ablations (0: none): 1 no x and no arithmetic, 2 cut rows stored as whole
               // (wrong sums), 4 no empty-row pass
};

// A launch: the variant (8-token tiles, bw / 32, bh / 16) and its config (blocks in flight a warp,
// warps a CTA, CTAs an SM; warps 0: the CTA kernel, blocks in flight a CTA).
struct Config {
  int nt, kq, mt, stages, warps, ctas;
};

// The grid (CTAs) the config launches on `device`: ctas an SM, or as many as fit at once; 0 when
// the variant isn't compiled (or fits nowhere). Sets *warps_total to the grid's warps.
cudaError_t grid_of(bool bf16, const Config& c, int device, int* grid, int* warps_total);

cudaError_t launch(bool bf16, const Config& c, int grid, const Args& a, cudaStream_t stream);

}  // namespace opforge_block_sparse_decode
