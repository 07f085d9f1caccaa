// upsample2x(x): each pixel of an NCHW tensor repeated 2x2 (the up step of upfirdn2d): on the CPU here, and on
// the GPU through upfirdn2d_kernel.cu when built with -DOP_CUDA.
#include <torch/extension.h>

#ifdef OP_CUDA
torch::Tensor upsample2x_cuda(const torch::Tensor& x);
#endif

torch::Tensor upsample2x(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4, "upsample2x: x must be NCHW");
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "upsample2x: float32 only");
#ifdef OP_CUDA
  if (x.is_cuda()) return upsample2x_cuda(x.contiguous());
#endif
  TORCH_CHECK(x.device().is_cpu(), "upsample2x: this build runs on the CPU only");
  auto xc = x.contiguous();
  const int64_t planes = xc.size(0) * xc.size(1), h = xc.size(2), w = xc.size(3);
  auto out = torch::empty({xc.size(0), xc.size(1), 2 * h, 2 * w}, xc.options());
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < 2 * h; ++i)
      for (int64_t j = 0; j < 2 * w; ++j) op[(p * 2 * h + i) * 2 * w + j] = xp[(p * h + i / 2) * w + j / 2];
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("upsample2x", &upsample2x, "2x nearest upsampling of NCHW"); }
