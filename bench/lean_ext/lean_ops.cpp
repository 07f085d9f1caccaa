// The "lean" benchmark extension: the same op as examples/demo_ext, registered with
// TORCH_LIBRARY and built from the two small headers it needs (no torch/extension.h,
// no pybind11), so that compiling it is cheap. Load it with is_python_module=False and
// call torch.ops.lean_ops.scaled_residual_relu(x, y, alpha).

#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace {

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "scaled_residual_relu: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "scaled_residual_relu: ", name,
              " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "scaled_residual_relu: ", name, " must be contiguous");
}

at::Tensor scaled_residual_relu(const at::Tensor& x, const at::Tensor& y, double alpha) {
  check_input(x, "x");
  check_input(y, "y");
  TORCH_CHECK(x.sizes() == y.sizes(), "scaled_residual_relu: x and y must have the same shape, got ",
              x.sizes(), " and ", y.sizes());
  at::Tensor out = x.new_empty(x.sizes());
  const float* xp = x.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float a = static_cast<float>(alpha);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const float v = xp[i] + a * yp[i];
    op[i] = v > 0.0f ? v : 0.0f;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(lean_ops, m) {
  m.def("scaled_residual_relu(Tensor x, Tensor y, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(lean_ops, CPU, m) {
  m.impl("scaled_residual_relu", &scaled_residual_relu);
}
