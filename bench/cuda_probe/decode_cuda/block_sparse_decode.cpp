// The probe's CUDA decode kernel, its op (block_sparse_decode.cuh): the input checks, the device
// guard, the current stream and the partial-sum slots. LibTorch stable-ABI headers only (as
// opforge's bias_act_cuda.cpp).
//
//   forward(Tensor x, Tensor w, Tensor? b, Tensor cols, Tensor row_ptr, Tensor(a!) counts,
//           int out_features, int stages, int warps, int ctas) -> Tensor
// y = x Wᵀ (+ b) for 1 <= T <= 32 tokens: x (T, in) and w (nnz, bh, bw) contiguous, float16 or
// bfloat16, 16-byte aligned (the variants compiled: 64 x 64 blocks); b (out_features) of x's dtype;
// cols (nnz) and row_ptr (out_features / bh + 1) int64, the layout's; counts int32 zeros of at least
// out_features / 16 elements, left at zero (one buffer a stream). stages, warps, ctas: blocks in
// flight a warp, warps a CTA, CTAs an SM (as many as fit); warps 0: the CTA kernel
// (block_sparse_decode_cta.cuh; stages: blocks in flight a CTA). OPFORGE_BSD_ABLATE (the probe's
// ablations, wrong results): see block_sparse_decode.h.
#ifndef USE_CUDA
#define USE_CUDA  // the shim's CUDA entry points (aoti_torch_get_current_cuda_stream)
#endif

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <optional>

#include "block_sparse_decode.h"
#include "opforge_stable.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS block_sparse_decode
#endif

namespace {

namespace k = opforge_block_sparse_decode;
using opforge_stable::device_name;
using opforge_stable::shape_str;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "block_sparse_decode forward";
constexpr int64_t kMaxTokens = 32;  // the variants compiled: 8-token tiles 1, 2, 4

void check_on(const Tensor& t, const char* name, int32_t device) {
  STD_TORCH_CHECK(t.is_cuda(), kOp, ": ", name, " must be a CUDA tensor, got ", device_name(t));
  STD_TORCH_CHECK(t.get_device_index() == device, kOp, ": ", name, " is on cuda:", t.get_device_index(),
                  " but x is on cuda:", device, "; every tensor of a call must be on one device");
  STD_TORCH_CHECK(t.is_contiguous(), kOp, ": ", name, " must be contiguous (call .contiguous())");
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

Tensor forward(Tensor x, Tensor w, std::optional<Tensor> b, Tensor cols, Tensor row_ptr, Tensor counts,
               int64_t out_features, int64_t stages, int64_t warps, int64_t ctas) {
  STD_TORCH_CHECK(x.is_cuda(), kOp, ": x must be a CUDA tensor, got ", device_name(x));
  const int32_t device = x.get_device_index();
  check_on(x, "x", device);
  check_on(w, "w", device);
  check_on(cols, "cols", device);
  check_on(row_ptr, "row_ptr", device);
  check_on(counts, "counts", device);
  const ScalarType dt = x.scalar_type();
  STD_TORCH_CHECK(dt == ScalarType::BFloat16 || dt == ScalarType::Half, kOp,
                  ": x must be bfloat16 or float16 (the Triton kernels take float32), got ", torch::headeronly::toString(dt));
  STD_TORCH_CHECK(w.scalar_type() == dt, kOp, ": w must have x's dtype");
  STD_TORCH_CHECK(x.dim() == 2 && w.dim() == 3, kOp, ": x must be (T, in) and w (nnz, bh, bw), got ",
                  shape_str(x.sizes()), " and ", shape_str(w.sizes()));
  const int64_t tokens = x.size(0), k_in = x.size(1), nnz = w.size(0), bh = w.size(1), bw = w.size(2);
  STD_TORCH_CHECK(tokens >= 1 && tokens <= kMaxTokens, kOp, ": takes 1 to ", kMaxTokens, " tokens, got ", tokens);
  STD_TORCH_CHECK(bw == 32 || bw == 64 || bw == 128, kOp, ": block width must be 32, 64 or 128, got ", bw);
  STD_TORCH_CHECK(bh % 16 == 0, kOp, ": block height must be a multiple of 16, got ", bh);
  const int64_t mt = bh / 16;
  STD_TORCH_CHECK(k_in % bw == 0 && out_features % bh == 0 && out_features > 0, kOp, ": in_features ", k_in,
                  " and out_features ", out_features, " must be whole blocks of ", bh, " x ", bw);
  const int64_t rows = out_features / bh, units = rows * mt;  // the CTA kernel counts a 16-row strip
  STD_TORCH_CHECK(cols.scalar_type() == ScalarType::Long && row_ptr.scalar_type() == ScalarType::Long, kOp,
                  ": cols and row_ptr must be int64");
  STD_TORCH_CHECK(cols.numel() == nnz && row_ptr.numel() == rows + 1, kOp, ": cols must have nnz = ", nnz,
                  " elements and row_ptr out_features / bh + 1 = ", rows + 1, ", got ", cols.numel(), " and ",
                  row_ptr.numel());
  STD_TORCH_CHECK(counts.scalar_type() == ScalarType::Int && counts.numel() >= units, kOp,
                  ": counts must be int32 zeros of at least ", units, " elements");
  STD_TORCH_CHECK(aligned16(x) && aligned16(w), kOp, ": x and w must be 16-byte aligned (call .clone())");
  STD_TORCH_CHECK(nnz < (int64_t{1} << 30) && rows < (int64_t{1} << 30),
                  kOp, ": the layout is too large for this kernel (", nnz, " blocks)");
  const void* bp = nullptr;
  if (b) {
    check_on(*b, "b", device);
    STD_TORCH_CHECK(b->scalar_type() == dt && b->numel() == out_features, kOp, ": b must have x's dtype and ",
                    out_features, " elements");
    bp = b->data_ptr();
  }

  const torch::stable::accelerator::DeviceGuard guard(device);
  const bool bf16 = dt == ScalarType::BFloat16;
  const k::Config c{static_cast<int>((tokens + 7) / 8 <= 2 ? (tokens + 7) / 8 : ((tokens + 7) / 8 <= 4 ? 4 : 8)),
                    static_cast<int>(bw / 32), static_cast<int>(mt), static_cast<int>(stages), static_cast<int>(warps),
                    static_cast<int>(ctas)};
  int grid = 0, nw = 0;
  cudaError_t err = k::grid_of(bf16, c, device, &grid, &nw);
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA error: ", cudaGetErrorString(err));
  STD_TORCH_CHECK(grid > 0, kOp, ": no variant for ", tokens, " tokens and ", bh, " x ", bw, " blocks with ", stages,
                  " stages of ", warps, " warps (", ctas, " a SM): not compiled, or too large for shared memory");
  Tensor y = torch::stable::new_empty(x, {tokens, out_features});
  Tensor part = torch::stable::new_empty(x, {int64_t{2} * nw * mt * c.nt * 32 * 4}, ScalarType::Float);
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS, kOp,
                  ": could not get the current CUDA stream of cuda:", device);
  k::Args a{x.data_ptr(), w.data_ptr(), bp, y.data_ptr(),
            static_cast<const int64_t*>(cols.data_ptr()), static_cast<const int64_t*>(row_ptr.data_ptr()),
            static_cast<float*>(part.data_ptr()), static_cast<int*>(counts.data_ptr()),
            static_cast<int>(tokens), static_cast<int>(k_in), static_cast<int>(out_features), static_cast<int>(bh),
            static_cast<int>(rows), static_cast<int>(nnz), static_cast<int>(std::max<int64_t>(1, (nnz + nw - 1) / nw)),
            std::getenv("OPFORGE_BSD_ABLATE") ? std::atoi(std::getenv("OPFORGE_BSD_ABLATE")) : 0};
  err = k::launch(bf16, c, grid, a, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA error: ", cudaGetErrorString(err));
  return y;
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("forward(Tensor x, Tensor w, Tensor? b, Tensor cols, Tensor row_ptr, Tensor(a!) counts, int out_features, "
        "int stages, int warps, int ctas) -> Tensor");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) { m.impl("forward", TORCH_BOX(&forward)); }
