// One tiny op (x * 2) on the LibTorch stable ABI: the header set opforge's own kernels use.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

using torch::stable::Tensor;

Tensor twice(Tensor x) {
  Tensor out = torch::stable::empty_like(x);
  const float* src = static_cast<const float*>(x.data_ptr());
  float* dst = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) dst[i] = 2.0f * src[i];
  return out;
}

STABLE_TORCH_LIBRARY(header_cost_stable, m) { m.def("twice(Tensor x) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(header_cost_stable, CPU, m) { m.impl("twice", TORCH_BOX(&twice)); }
