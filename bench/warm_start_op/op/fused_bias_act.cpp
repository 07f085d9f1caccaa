// fused_bias_act(x, bias) = leaky_relu(x + bias, 0.2) * sqrt(2), bias along dim 1: on the CPU here, and on
// the GPU through fused_bias_act_kernel.cu when built with -DOP_CUDA.
#include <torch/extension.h>

#include <cmath>

#ifdef OP_CUDA
torch::Tensor fused_bias_act_cuda(const torch::Tensor& x, const torch::Tensor& bias);
#endif

torch::Tensor fused_bias_act(const torch::Tensor& x, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 2 && bias.dim() == 1 && bias.size(0) == x.size(1),
              "fused_bias_act: bias must be 1-D with x.size(1) elements");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && bias.scalar_type() == torch::kFloat, "fused_bias_act: float32 only");
#ifdef OP_CUDA
  if (x.is_cuda()) return fused_bias_act_cuda(x.contiguous(), bias.contiguous());
#endif
  TORCH_CHECK(x.device().is_cpu(), "fused_bias_act: this build runs on the CPU only");
  auto xc = x.contiguous();
  auto bc = bias.contiguous();
  auto out = torch::empty_like(xc);
  const int64_t c = xc.size(1);
  int64_t inner = 1;
  for (int64_t d = 2; d < xc.dim(); ++d) inner *= xc.size(d);
  const float* xp = xc.data_ptr<float>();
  const float* bp = bc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float gain = std::sqrt(2.0f);
  const int64_t n = xc.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i] + bp[(i / inner) % c];
    op[i] = (v > 0.f ? v : 0.2f * v) * gain;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fused_bias_act", &fused_bias_act, "leaky_relu(x + bias) * sqrt(2)"); }
