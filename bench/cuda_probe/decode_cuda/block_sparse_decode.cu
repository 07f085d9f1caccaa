// The probe's CUDA decode kernel, its variants and launches (block_sparse_decode.h).
#include "block_sparse_decode.cuh"
#include "block_sparse_decode_cta.cuh"
#include "block_sparse_decode.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace opforge_block_sparse_decode {
namespace {

using Fn = void (*)(Args, int);

// The variants compiled: 8-token tiles 1, 2, 4, 8 (T <= 64) by bh / 16 (the rows of a block in
// tiles of 16) by bw / 32; a shape not compiled isn't offered (the Triton kernels take it).
template <bool BF16, int NT, int KQ>
Fn pick_mt(int mt) {
  if constexpr (NT * KQ <= 8) {
    if (mt == 4) return decode_kernel<BF16, NT, KQ, 4>;
  }
  return nullptr;
}

template <bool BF16>
Fn pick(const Config& c) {
  if (c.kq != 2) return nullptr;
  switch (c.nt) {
    case 1: return pick_mt<BF16, 1, 2>(c.mt);
    case 2: return pick_mt<BF16, 2, 2>(c.mt);
    case 4: return pick_mt<BF16, 4, 2>(c.mt);
    default: return nullptr;
  }
}

// warps == 0: the CTA kernel (block_sparse_decode_cta.cuh), bh / 16 consumer warps and a producer
template <bool BF16>
Fn pick_cta(const Config& c) {
  if (c.kq != 2 || c.mt != 4) return nullptr;
  switch (c.nt) {
    case 1: return cta_kernel<BF16, 1, 2, 4>;
    case 2: return cta_kernel<BF16, 2, 2, 4>;
    case 4: return cta_kernel<BF16, 4, 2, 4>;
    default: return nullptr;
  }
}

Fn pick(bool bf16, const Config& c) {
  if (c.warps == 0) return bf16 ? pick_cta<true>(c) : pick_cta<false>(c);
  return bf16 ? pick<true>(c) : pick<false>(c);
}

int threads_of(const Config& c) { return 32 * (c.warps == 0 ? c.mt + 1 : c.warps); }

int smem_of(const Config& c) {
  const int block = 16 * c.mt * 32 * c.kq * 2;
  return c.warps == 0 ? cta_smem_bytes(c.stages, block) : smem_bytes(c.warps, c.stages, block);
}

}  // namespace

cudaError_t grid_of(bool bf16, const Config& c, int device, int* grid, int* warps_total) {
  *grid = *warps_total = 0;
  const Fn fn = pick(bf16, c);
  if (fn == nullptr || c.warps < 0 || c.warps > 8 || c.ctas < 1 || c.stages < 1) return cudaSuccess;
  const int smem = smem_of(c);
  static std::mutex lock;
  static std::map<std::tuple<int, Fn, int, int>, std::pair<int, int>> seen;  // (device, fn, warps, smem) -> (SMs, CTAs an SM)
  std::lock_guard<std::mutex> hold(lock);
  auto it = seen.find({device, fn, c.warps, smem});
  if (it == seen.end()) {
    int sms = 0, fit = 0, most = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess && smem <= most)
      err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
    if (err == cudaSuccess && smem <= most)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, fn, threads_of(c), smem);
    if (err != cudaSuccess) return err;
    it = seen.emplace(std::make_tuple(device, fn, c.warps, smem), std::make_pair(sms, fit)).first;
  }
  const int per_sm = std::min(c.ctas, it->second.second);
  *grid = it->second.first * per_sm;
  *warps_total = c.warps == 0 ? *grid : *grid * c.warps;  // the CTA kernel shares blocks out by CTA
  return cudaSuccess;
}

cudaError_t launch(bool bf16, const Config& c, int grid, const Args& a, cudaStream_t stream) {
  const Fn fn = pick(bf16, c);
  if (fn == nullptr) return cudaErrorInvalidConfiguration;
  fn<<<grid, threads_of(c), smem_of(c), stream>>>(a, c.stages);
  return cudaGetLastError();
}

}  // namespace opforge_block_sparse_decode
