// block_sparse's CUDA decode forward: the variant a call takes and its grid (decode_cuda.h).
#include "decode_cuda.h"
#include "decode_cuda_kernel.cuh"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace opforge_block_sparse_decode {

int threads_of(const Config& c) { return 32 * (c.mt + 1); }

namespace {

using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                            const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled (12.0's ABI), found once through the runtime: no link to libcuda.
Encode encoder() {
  static const Encode found = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &status);
#endif
    return err == cudaSuccess && status == cudaDriverEntryPointSuccess ? reinterpret_cast<Encode>(fn) : nullptr;
  }();
  return found;
}

// x (tokens, k_in) as a 2-D tensor, its box a block's column slice of every token: (bw, tokens),
// rows bw * elem bytes apart in shared memory, as the ring's slot holds them (in the 128-byte swizzle for the
// wgmma tiles). Not for mma.sync's tiles at one token, whose x slice is a plain copy.
// Encoded as native_launch's map slots encode (128-byte L2 promotion), so a launch from a recipe
// (cuda_decode.py) passes the same map.
// A 2-D map of `rows` rows of `cols` elements, read in (box_cols, box_rows) boxes.
cudaError_t map_2d(bool bf16, const void* base, int64_t cols, int64_t rows, int box_cols, int box_rows, bool swizzle,
                   CUtensorMap* map) {
  const Encode encode = encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                            const_cast<void*>(base), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

bool wgmma_variant(const Config& c) { return c.wg != 0; }

cudaError_t x_map(bool bf16, const Config& c, const Args& a, CUtensorMap* map) {
  return map_2d(bf16, a.x, a.k_in, a.tokens, 32 * c.kq, a.tokens, wgmma_variant(c), map);
}

// W (nnz, bh, bw) as (nnz * bh, bw), a block a box, in the 128-byte swizzle: the wgmma tiles'.
cudaError_t w_map(bool bf16, const Config& c, const Args& a, CUtensorMap* map) {
  return map_2d(bf16, a.w, 32 * c.kq, int64_t{a.nnz} * a.bh, 32 * c.kq, a.bh, true, map);
}

}  // namespace

// the ring: a slot a stage, each a block and x's slice at its column (decode_cuda_kernel.cuh's slot_bytes)
int smem_of(const Config& c, int elem_bytes) {
  return ring_offset(c.stages) + (wgmma_variant(c) ? kWgSlack : 0) +
         c.stages * (16 * c.mt + 8 * c.nt) * 32 * c.kq * elem_bytes;
}

cudaError_t grid_of(bool bf16, const Config& c, int device, int* grid) {
  *grid = 0;
  const Kernel fn = bf16 ? kernel_bf16(c.nt, c.kq, c.mt, c.wg != 0) : kernel_f16(c.nt, c.kq, c.mt, c.wg != 0);
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
    int minor = 0;
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    // the wgmma tiles are sm_90a code: they run on compute capability 9.0 only
    const bool arch_ok = wgmma_variant(c) ? major == 9 && minor == 0 : major >= 9;
    if (err == cudaSuccess && arch_ok && smem <= most && encoder() != nullptr) {
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

cudaError_t function_of(bool bf16, const Config& c, void** fn) {
  *fn = nullptr;
  const Kernel k = bf16 ? kernel_bf16(c.nt, c.kq, c.mt, c.wg != 0) : kernel_f16(c.nt, c.kq, c.mt, c.wg != 0);
  if (k == nullptr) return cudaErrorInvalidConfiguration;
  cudaFunction_t found = nullptr;
  const cudaError_t err = cudaGetFuncBySymbol(&found, reinterpret_cast<const void*>(k));
  *fn = reinterpret_cast<void*>(found);
  return err;
}

cudaError_t launch(bool bf16, const Config& c, int grid, const Args& a, cudaStream_t stream) {
  const Kernel fn = bf16 ? kernel_bf16(c.nt, c.kq, c.mt, c.wg != 0) : kernel_f16(c.nt, c.kq, c.mt, c.wg != 0);
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
  CUtensorMap map{}, wmap{};
  if (a.tokens > 1 || wgmma_variant(c)) {
    const cudaError_t err = x_map(bf16, c, a, &map);
    if (err != cudaSuccess) return err;
  }
  if (wgmma_variant(c) && a.nnz > 0) {  // no blocks: no copies, and a map of no rows is no map
    const cudaError_t err = w_map(bf16, c, a, &wmap);
    if (err != cudaSuccess) return err;
  }
  return cudaLaunchKernelEx(&launch, fn, a, c.stages, map, wmap);
}

}  // namespace opforge_block_sparse_decode
