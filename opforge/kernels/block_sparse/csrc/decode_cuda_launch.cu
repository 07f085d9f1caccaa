// block_sparse's CUDA decode forward: the variant a call takes and its grid (decode_cuda.h).
#include "decode_cuda.h"
#include "decode_cuda_kernel.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace opforge_block_sparse_decode {

int threads_of(const Config& c) { return 32 * (c.mt + 1); }

// the ring: a slot a stage, each a block and x's slice at its column (decode_cuda_kernel.cuh's slot_bytes)
int smem_of(const Config& c, int elem_bytes) {
  return ring_offset(c.stages) + c.stages * (16 * c.mt + 8 * c.nt) * 32 * c.kq * elem_bytes;
}

cudaError_t grid_of(bool bf16, const Config& c, int device, int* grid) {
  *grid = 0;
  const Kernel fn = bf16 ? kernel_bf16(c.nt, c.kq, c.mt) : kernel_f16(c.nt, c.kq, c.mt);
  if (fn == nullptr || c.ctas < 1 || c.stages < 1 || c.stages > 64) return cudaSuccess;
  const int smem = smem_of(c, 2);
  // (device, kernel, smem) -> (SMs, CTAs that fit an SM; 0 before sm_90 or in a binary without it), found once
  static std::mutex lock;
  static std::map<std::tuple<int, Kernel, int>, std::pair<int, int>> seen;
  std::lock_guard<std::mutex> hold(lock);
  auto it = seen.find({device, fn, smem});
  if (it == seen.end()) {
    int sms = 0, major = 0, most = 0, fit = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess && major >= 9 && smem <= most) {
      int current = 0;  // cudaFuncSetAttribute and the occupancy query act on the current device
      err = cudaGetDevice(&current);
      if (err == cudaSuccess && current != device) err = cudaSetDevice(device);
      // The PTX the kernel was compiled from. A binary built for no sm_90 (TORCH_CUDA_ARCH_LIST="8.0+PTX",
      // say) runs here from older PTX, JIT-compiled, where the kernel's body is empty (it is sm_90+ only):
      // it would return without writing y. Such a binary offers nothing (fit 0), and the Triton kernels
      // take the call.
      cudaFuncAttributes attr{};
      if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, fn);
      const bool built_for_here = err == cudaSuccess && attr.ptxVersion >= 90;
      // the most a CTA may take, whatever this config's (one attribute a kernel, shared by every config)
      if (built_for_here) err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
      if (built_for_here && err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, fn, threads_of(c), smem);
      if (current != device) {
        const cudaError_t back = cudaSetDevice(current);
        if (err == cudaSuccess) err = back;
      }
    }
    if (err != cudaSuccess) return err;
    it = seen.emplace(std::make_tuple(device, fn, smem), std::make_pair(sms, fit)).first;
  }
  *grid = it->second.first * std::min(c.ctas, it->second.second);
  return cudaSuccess;
}

cudaError_t launch(bool bf16, const Config& c, int grid, const Args& a, cudaStream_t stream) {
  const Kernel fn = bf16 ? kernel_bf16(c.nt, c.kq, c.mt) : kernel_f16(c.nt, c.kq, c.mt);
  if (fn == nullptr || grid < 1) return cudaErrorInvalidConfiguration;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(grid);
  launch.blockDim = dim3(threads_of(c));
  launch.dynamicSmemBytes = smem_of(c, 2);
  launch.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  launch.attrs = overlap;
  launch.numAttrs = c.overlap ? 1 : 0;
  return cudaLaunchKernelEx(&launch, fn, a, c.stages);
}

}  // namespace opforge_block_sparse_decode
