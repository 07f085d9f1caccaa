// block_sparse's CUDA decode forward, the ops: their input checks, the device guard, the current
// stream and the partial-sum slots; the kernel (no torch header there) is reached through
// grid_of() and launch() of decode_cuda.h. LibTorch stable-ABI headers only (as bias_act_cuda.cpp).
//
// Ops, registered under the namespace given by -DOPFORGE_NS=<name> (cuda_decode.py calls them):
//   forward(Tensor x, Tensor w, Tensor? b, Tensor(a!) y, Tensor cols, Tensor row_ptr,
//           Tensor(b!) counts, int chunk, int stages, int ctas, int overlap, int wgmma=-1) -> ()
//     y = x Wᵀ (+ b): x (T, in) with 1 <= T <= 64 (33-64: 64-wide blocks on sm_90a only) and w (nnz, bh, bw)
//     contiguous, float16 or bfloat16, 16-byte aligned, bh and bw of 32, 64 or 128; b (out) of x's dtype,
//     contiguous; y (T, out) of x's dtype, contiguous; cols (nnz) and row_ptr (out / bh + 1) int64, the
//     layout's; counts int32 zeros of at least (out / bh) * (bh / 16) elements, left at zero (one buffer a
//     stream). chunk: blocks a CTA (0: an equal share of the grid's; tests cut the rows every way
//     with it); stages: blocks in flight a CTA; ctas: CTAs an SM (as many as fit, if fewer);
//     overlap: 1 to launch as a programmatic dependent of the kernel before it on the stream
//     (decode_cuda_kernel.cuh), 0 not; wgmma: 1 for a tile through wgmma (64-wide blocks 64 or 128 high,
//     compute capability 9.0), 0 for mma.sync's (1 to 32 tokens), -1 (the default) for wgmma's where it runs,
//     mma.sync's elsewhere.
//   grid(Tensor x, int bh, int bw, int stages, int ctas, int wgmma=-1) -> int
//     the CTAs forward launches for x's tokens, dtype and device with that config: 0 when no
//     variant takes it (not compiled, older than sm_90, or too large for shared memory).
//   describe(Tensor x, Tensor w, int chunk, int stages, int ctas, int wgmma=-1) -> int[]
//     how forward launches for x and w (their shapes, dtype and device; the same checks): [the
//     kernel's CUfunction in the current device's context, grid, threads, shared bytes, blocks a CTA,
//     the fp32 elements of its partial-sum slots, 1 if it multiplies through wgmma], for a launch from
//     packed parameters (native_launch's recipes: cuda_decode.py), whose parameters are Args's fields, the
//     ring's slots, x's tensor map (a (bw, T) box; unread at T = 1 by mma.sync's tile; in the 128-byte swizzle
//     for wgmma's) and W's (wgmma's only).

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

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "decode_cuda.h"
#include "opforge_stable.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS block_sparse_decode_cuda
#endif

namespace {

namespace k = opforge_block_sparse_decode;
using opforge_stable::device_name;
using opforge_stable::shape_str;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "block_sparse decode (CUDA) forward";

void check_on(const Tensor& t, const char* name, int32_t device) {
  STD_TORCH_CHECK(t.is_cuda(), kOp, ": ", name, " must be a CUDA tensor, got ", device_name(t));
  STD_TORCH_CHECK(t.get_device_index() == device, kOp, ": ", name, " is on cuda:", t.get_device_index(),
                  " but x is on cuda:", device, "; every tensor of a call must be on one device");
  STD_TORCH_CHECK(t.is_contiguous(), kOp, ": ", name, " must be contiguous (call .contiguous())");
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The variant of T tokens and bh x bw blocks (nt 0: none takes T), through wgmma or mma.sync (past 32 tokens,
// wgmma: the 64-token tile is wgmma's only).
k::Config config_of(int64_t tokens, int64_t bh, int64_t bw, int64_t stages, int64_t ctas, bool overlap, bool wgmma) {
  const int64_t tiles = (tokens + 7) / 8;
  const int nt = tiles <= 2 ? static_cast<int>(tiles) : (tiles <= 4 ? 4 : (tiles <= 8 && k::kMaxTokens >= 64 ? 8 : 0));
  return k::Config{nt, static_cast<int>(bw / 32), static_cast<int>(bh / 16), wgmma || nt == 8 ? 1 : 0,
                   static_cast<int>(std::clamp<int64_t>(stages, 0, 64)), static_cast<int>(std::clamp<int64_t>(ctas, 0, 64)),
                   overlap ? 1 : 0};
}

bool shape_compiled(int64_t bh, int64_t bw) {
  return (bh == 32 || bh == 64 || bh == 128) && (bw == 32 || bw == 64 || bw == 128);
}

// The variant a call takes and its grid (0: none). wgmma -1 takes wgmma's tile where one runs (compute
// capability 9.0, 64-wide blocks 64 or 128 high), mma.sync's elsewhere: on issue 35's layers wgmma's was as fast
// or faster at every token count, 0-0.2 us a layer at 1 token, 0.8-1.8 at 32 (H200; docs/benchmarks.md, issue
// 35, twenty-sixth session).
struct Pick {
  k::Config c;
  int grid;
};

Pick pick(const Tensor& x, int64_t bh, int64_t bw, int64_t stages, int64_t ctas, bool overlap, int64_t wgmma) {
  const int64_t tokens = x.size(0);
  const ScalarType dt = x.scalar_type();
  if (tokens < 1 || tokens > k::kMaxTokens || !shape_compiled(bh, bw) ||
      (dt != ScalarType::BFloat16 && dt != ScalarType::Half))
    return {config_of(tokens, bh, bw, stages, ctas, overlap, false), 0};
  auto try_one = [&](bool wg) {
    Pick p{config_of(tokens, bh, bw, stages, ctas, overlap, wg), 0};
    const cudaError_t err = k::grid_of(dt == ScalarType::BFloat16, p.c, x.get_device_index(), &p.grid);
    STD_TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA error: ", cudaGetErrorString(err));
    return p;
  };
  if (wgmma != -1) return try_one(wgmma == 1);
  const Pick wg = try_one(true);
  return wg.grid > 0 ? wg : try_one(false);
}

int64_t grid(Tensor x, int64_t bh, int64_t bw, int64_t stages, int64_t ctas, int64_t wgmma) {
  STD_TORCH_CHECK(x.is_cuda() && x.dim() == 2, kOp, ": grid takes x, a (T, in) CUDA tensor, got ", device_name(x), " ",
                  shape_str(x.sizes()));
  STD_TORCH_CHECK(wgmma >= -1 && wgmma <= 1, kOp, ": wgmma must be -1, 0 or 1, got ", wgmma);
  return pick(x, bh, bw, stages, ctas, false, wgmma).grid;
}

// A launch's variant, grid, blocks a CTA and partial-sum slots (fp32 elements: a slot a (CTA, strip) for the
// row cut at the CTA's end), for forward's checked arguments.
struct Geometry {
  k::Config c;
  int grid, share;
  int64_t part;
};

Geometry geometry(const Tensor& x, int64_t nnz, int64_t bh, int64_t bw, int64_t chunk, int64_t stages, int64_t ctas,
                  bool overlap, int64_t wgmma) {
  const int64_t tokens = x.size(0);
  const Pick p = pick(x, bh, bw, stages, ctas, overlap, wgmma);
  int grid = p.grid;
  STD_TORCH_CHECK(grid > 0, kOp, ": no variant for ", tokens, " tokens and ", bh, " x ", bw, " blocks with ", stages,
                  " stages and ", ctas, " CTAs an SM", wgmma == 1 ? " through wgmma" : "", " on cuda:",
                  x.get_device_index(), " (it needs sm_90 or newer, wgmma compute capability 9.0 and blocks 64 wide, ",
                  "and the ring must fit shared memory)");
  int share = static_cast<int>(std::max<int64_t>(1, (nnz + grid - 1) / grid));
  if (chunk > 0) {
    share = static_cast<int>(std::min<int64_t>(chunk, std::max<int64_t>(nnz, 1)));
    grid = static_cast<int>(std::max<int64_t>(1, (nnz + share - 1) / share));  // lower CTAs start first: no deadlock
  }
  return {p.c, grid, share, int64_t{grid} * (bh / 16) * p.c.nt * 32 * 4};
}

void forward(Tensor x, Tensor w, std::optional<Tensor> b, Tensor y, Tensor cols, Tensor row_ptr, Tensor counts,
             int64_t chunk, int64_t stages, int64_t ctas, int64_t overlap, int64_t wgmma) {
  STD_TORCH_CHECK(x.is_cuda(), kOp, ": x must be a CUDA tensor, got ", device_name(x));
  const int32_t device = x.get_device_index();
  check_on(x, "x", device);
  check_on(w, "w", device);
  check_on(y, "y", device);
  check_on(cols, "cols", device);
  check_on(row_ptr, "row_ptr", device);
  check_on(counts, "counts", device);
  const ScalarType dt = x.scalar_type();
  STD_TORCH_CHECK(dt == ScalarType::BFloat16 || dt == ScalarType::Half, kOp,
                  ": x must be bfloat16 or float16 (the Triton kernels take float32), got ",
                  torch::headeronly::toString(dt));
  STD_TORCH_CHECK(w.scalar_type() == dt && y.scalar_type() == dt, kOp, ": w and y must have x's dtype");
  STD_TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && y.dim() == 2, kOp, ": x must be (T, in), w (nnz, bh, bw) and y (T, out), got ",
                  shape_str(x.sizes()), ", ", shape_str(w.sizes()), " and ", shape_str(y.sizes()));
  const int64_t tokens = x.size(0), k_in = x.size(1), nnz = w.size(0), bh = w.size(1), bw = w.size(2);
  const int64_t out_features = y.size(1);
  STD_TORCH_CHECK(tokens >= 1 && tokens <= k::kMaxTokens && y.size(0) == tokens, kOp, ": takes 1 to ", k::kMaxTokens,
                  " tokens (y with x's), got x ", shape_str(x.sizes()), " and y ", shape_str(y.sizes()));
  STD_TORCH_CHECK(shape_compiled(bh, bw), kOp, ": blocks must be 32, 64 or 128 on each side, got ", bh, " x ", bw);
  STD_TORCH_CHECK(k_in % bw == 0 && out_features % bh == 0 && out_features > 0 && k_in > 0, kOp, ": in_features ",
                  k_in, " and out_features ", out_features, " must be whole blocks of ", bh, " x ", bw);
  const int64_t rows = out_features / bh, units = rows * (bh / 16);
  STD_TORCH_CHECK(cols.scalar_type() == ScalarType::Long && row_ptr.scalar_type() == ScalarType::Long, kOp,
                  ": cols and row_ptr must be int64");
  STD_TORCH_CHECK(cols.numel() == nnz && row_ptr.numel() == rows + 1, kOp, ": cols must have nnz = ", nnz,
                  " elements and row_ptr out_features / bh + 1 = ", rows + 1, ", got ", cols.numel(), " and ",
                  row_ptr.numel());
  STD_TORCH_CHECK(counts.scalar_type() == ScalarType::Int && counts.numel() >= units, kOp,
                  ": counts must be int32 zeros of at least ", units, " elements");
  STD_TORCH_CHECK(aligned16(x) && aligned16(w), kOp, ": x and w must be 16-byte aligned (call .clone())");
  STD_TORCH_CHECK(nnz < (int64_t{1} << 30) && units < (int64_t{1} << 30) && tokens * k_in < (int64_t{1} << 40), kOp,
                  ": the layout is too large for this kernel (", nnz, " blocks)");
  STD_TORCH_CHECK(chunk >= 0, kOp, ": chunk must be >= 0 (0: an equal share), got ", chunk);
  STD_TORCH_CHECK(overlap == 0 || overlap == 1, kOp, ": overlap must be 0 or 1, got ", overlap);
  STD_TORCH_CHECK(wgmma >= -1 && wgmma <= 1, kOp, ": wgmma must be -1, 0 or 1, got ", wgmma);
  const void* bp = nullptr;
  if (b) {
    check_on(*b, "b", device);
    STD_TORCH_CHECK(b->scalar_type() == dt && b->numel() == out_features, kOp, ": b must have x's dtype and ",
                    out_features, " elements");
    bp = b->data_ptr();
  }

  const torch::stable::accelerator::DeviceGuard guard(device);
  const Geometry g = geometry(x, nnz, bh, bw, chunk, stages, ctas, overlap == 1, wgmma);
  const k::Config c = g.c;
  const int grid = g.grid, share = g.share;
  Tensor part = torch::stable::new_empty(x, {g.part}, ScalarType::Float);
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS, kOp,
                  ": could not get the current CUDA stream of cuda:", device);
  const k::Args a{x.data_ptr(), w.data_ptr(), bp, y.data_ptr(),
                  static_cast<const int64_t*>(cols.data_ptr()), static_cast<const int64_t*>(row_ptr.data_ptr()),
                  static_cast<float*>(part.data_ptr()), static_cast<int*>(counts.data_ptr()),
                  static_cast<int>(tokens), static_cast<int>(k_in), static_cast<int>(out_features), static_cast<int>(bh),
                  static_cast<int>(rows), static_cast<int>(nnz), share};
  const cudaError_t err = k::launch(dt == ScalarType::BFloat16, c, grid, a, static_cast<cudaStream_t>(stream));
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA error: ", cudaGetErrorString(err));
}

std::vector<int64_t> describe(Tensor x, Tensor w, int64_t chunk, int64_t stages, int64_t ctas, int64_t wgmma) {
  STD_TORCH_CHECK(x.is_cuda() && x.dim() == 2 && w.dim() == 3, kOp, ": describe takes x (T, in) and w (nnz, bh, bw) of "
                  "a call, got ", device_name(x), " ", shape_str(x.sizes()), " and ", shape_str(w.sizes()));
  STD_TORCH_CHECK(chunk >= 0, kOp, ": chunk must be >= 0 (0: an equal share), got ", chunk);
  const int64_t nnz = w.size(0), bh = w.size(1), bw = w.size(2);
  const torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  STD_TORCH_CHECK(wgmma >= -1 && wgmma <= 1, kOp, ": wgmma must be -1, 0 or 1, got ", wgmma);
  const Geometry g = geometry(x, nnz, bh, bw, chunk, stages, ctas, false, wgmma);
  const k::Config c = g.c;
  void* fn = nullptr;
  const cudaError_t err = k::function_of(x.scalar_type() == ScalarType::BFloat16, c, &fn);
  STD_TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA error: ", cudaGetErrorString(err));
  return {static_cast<int64_t>(reinterpret_cast<uintptr_t>(fn)), g.grid, k::threads_of(c), k::smem_of(c, 2), g.share,
          g.part, c.wg};
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("forward(Tensor x, Tensor w, Tensor? b, Tensor(a!) y, Tensor cols, Tensor row_ptr, Tensor(b!) counts, "
        "int chunk, int stages, int ctas, int overlap, int wgmma=-1) -> ()");
  m.def("grid(Tensor x, int bh, int bw, int stages, int ctas, int wgmma=-1) -> int");
  m.def("describe(Tensor x, Tensor w, int chunk, int stages, int ctas, int wgmma=-1) -> int[]");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  m.impl("forward", TORCH_BOX(&forward));
  m.impl("grid", TORCH_BOX(&grid));
  m.impl("describe", TORCH_BOX(&describe));
}
