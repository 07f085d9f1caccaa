// The tests' CUDA variant of the example kind: out = alpha * x + y on float32 CUDA tensors,
// with torch's lean headers (ATen/core/Tensor.h + torch/library.h), on the current stream.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#define OPF_LIB(ns, m) TORCH_LIBRARY(ns, m)
#define OPF_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

__global__ void axpy_kernel(const float* x, const float* y, float alpha, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = alpha * x[i] + y[i];
}

at::Tensor axpy(const at::Tensor& x, const at::Tensor& y, double alpha) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "axpy: x and y must be CUDA tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat, "axpy: x and y must be float32");
  TORCH_CHECK(x.sizes() == y.sizes(), "axpy: x and y must have the same shape");
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor xc = x.contiguous(), yc = y.contiguous(), out = at::empty_like(xc);
  int64_t n = xc.numel();
  if (n > 0) {
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 65535);
    axpy_kernel<<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), yc.data_ptr<float>(), (float)alpha, out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

int64_t simd_width() { return 32; }  // a warp

OPF_LIB(OPFORGE_NS, m) {
  m.def("axpy(Tensor x, Tensor y, float alpha) -> Tensor");
  m.def("simd_width() -> int");
}
OPF_IMPL(OPFORGE_NS, CUDA, m) { m.impl("axpy", &axpy); }
OPF_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) { m.impl("simd_width", &simd_width); }
