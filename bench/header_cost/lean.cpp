// The same op with torch's lean C++ headers: ATen/core/Tensor.h + torch/library.h.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

at::Tensor twice(const at::Tensor& x) {
  at::Tensor out = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) dst[i] = 2.0f * src[i];
  return out;
}

TORCH_LIBRARY(header_cost_lean, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(header_cost_lean, CPU, m) { m.impl("twice", &twice); }
