// A small fused CPU op, built the usual way: torch/extension.h + pybind11.
//
//   scaled_residual_relu(x, y, alpha) = relu(x + alpha * y)
//
// One pass over memory instead of the three (mul, add, relu) that eager PyTorch does.
// Used by examples/demo.py and bench/load_times.py; torch/extension.h dominates its
// compile time, as it does for most real extensions.

#include <torch/extension.h>

namespace {

void check_input(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "scaled_residual_relu: ", name,
              " must be a CPU tensor, got one on ", t.device());
  TORCH_CHECK(t.scalar_type() == torch::kFloat, "scaled_residual_relu: ", name,
              " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "scaled_residual_relu: ", name,
              " must be contiguous; call .contiguous() on it first");
}

}  // namespace

torch::Tensor scaled_residual_relu(const torch::Tensor& x, const torch::Tensor& y, double alpha) {
  check_input(x, "x");
  check_input(y, "y");
  TORCH_CHECK(x.sizes() == y.sizes(), "scaled_residual_relu: x and y must have the same shape, got ",
              x.sizes(), " and ", y.sizes());

  torch::Tensor out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float a = static_cast<float>(alpha);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i] + a * yp[i];
    op[i] = v > 0.0f ? v : 0.0f;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "opforge demo extension: a fused scaled residual + ReLU";
  m.def("scaled_residual_relu", &scaled_residual_relu, "relu(x + alpha * y) for contiguous float32 CPU tensors",
        pybind11::arg("x"), pybind11::arg("y"), pybind11::arg("alpha") = 1.0);
}
