// A plain pybind11 binding of opforge's bias_act CUDA kernels: the peer that the issue names
// as the floor of a call's host cost (bench/bias_act.py, bench/bias_act_overhead.py).
//
// The same plan() and launch() as the bias_act_cuda variant (bias_act_cuda.h), reached the way
// most of the field reaches a kernel: torch/extension.h, at::Tensor, pybind11, no op registry,
// no autograd, and only the checks a launch needs to be safe. x (and dy, y) contiguous, b 1-D
// of x.size(dim) elements; the output allocated here, as an op would.
#include <torch/extension.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <tuple>

#include "bias_act_cuda.h"
#include "bias_act_math.h"

namespace k = opforge_bias_act_cuda;

namespace {

int code(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return k::kF32;
    case at::kHalf: return k::kF16;
    case at::kBFloat16: return k::kBF16;
    default: TORCH_CHECK(false, "bias_act_pybind: float32, float16 or bfloat16 only, got ", s);
  }
  return -1;
}

void geometry(const at::Tensor& x, const at::Tensor& b, int64_t dim, int64_t* channels, int64_t* inner) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "bias_act_pybind: x must be a contiguous CUDA tensor");
  TORCH_CHECK(dim >= 0 && dim < x.dim(), "bias_act_pybind: dim out of range");
  TORCH_CHECK(b.dim() == 1 && b.size(0) == x.size(dim) && b.is_contiguous() && b.device() == x.device(),
              "bias_act_pybind: b must be contiguous, 1-D, of x.size(dim) elements, on x's device");
  *channels = x.size(dim);
  *inner = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) *inner *= x.size(d);
}

at::Tensor forward(const at::Tensor& x, const at::Tensor& b, int64_t dim, int64_t act, double alpha, double gain,
                   double clamp) {
  int64_t channels, inner;
  geometry(x, b, dim, &channels, &inner);
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  const c10::cuda::CUDAGuard guard(x.device());
  k::Plan plan;
  C10_CUDA_CHECK(k::plan(k::kFwd, code(x.scalar_type()), static_cast<int>(act), x.numel(), channels, inner, false,
                         x.get_device(), &plan));
  C10_CUDA_CHECK(k::launch(plan, k::kFwd, code(x.scalar_type()), x.data_ptr(), nullptr, nullptr, b.data_ptr(),
                           code(b.scalar_type()), y.data_ptr(), nullptr, k::kF32, nullptr, x.numel(), channels, inner,
                           static_cast<float>(alpha), static_cast<float>(gain), static_cast<float>(clamp), -1.0f,
                           c10::cuda::getCurrentCUDAStream()));
  return y;
}

// dx and db from dy and the saved y (ref_kind 1) or x (ref_kind 2, b read too).
std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& dy, const at::Tensor& ref, const at::Tensor& b,
                                            int64_t dim, int64_t act, int64_t ref_kind, double alpha, double gain,
                                            double clamp, double clamp_ref) {
  int64_t channels, inner;
  geometry(dy, b, dim, &channels, &inner);
  TORCH_CHECK(ref.sizes() == dy.sizes() && ref.is_contiguous() && ref.scalar_type() == dy.scalar_type(),
              "bias_act_pybind: ref must be like dy");
  TORCH_CHECK(ref_kind == 1 || ref_kind == 2, "bias_act_pybind: ref_kind 1 (y) or 2 (x)");
  at::Tensor dx = at::empty_like(dy);
  at::Tensor db = at::empty_like(b);
  if (dy.numel() == 0) return {dx, db.zero_()};
  const c10::cuda::CUDAGuard guard(dy.device());
  const int mode = ref_kind == 1 ? k::kBwdY : k::kBwdX;
  k::Plan plan;
  C10_CUDA_CHECK(k::plan(mode, code(dy.scalar_type()), static_cast<int>(act), dy.numel(), channels, inner, true,
                         dy.get_device(), &plan));
  at::Tensor scratch;
  if (plan.scratch > 0) scratch = at::empty({plan.scratch}, dy.options().dtype(at::kFloat));
  C10_CUDA_CHECK(k::launch(plan, mode, code(dy.scalar_type()), dy.data_ptr(), ref.data_ptr(), nullptr,
                           ref_kind == 2 ? b.data_ptr() : nullptr, code(b.scalar_type()), dx.data_ptr(),
                           db.data_ptr(), code(db.scalar_type()),
                           plan.scratch > 0 ? scratch.data_ptr<float>() : nullptr, dy.numel(), channels, inner,
                           static_cast<float>(alpha), static_cast<float>(gain), static_cast<float>(clamp),
                           static_cast<float>(clamp_ref), c10::cuda::getCurrentCUDAStream()));
  return {dx, db};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "y = clamp(act(x + b) * gain)");
  m.def("backward", &backward, "(dx, db) from dy and y or x");
}
