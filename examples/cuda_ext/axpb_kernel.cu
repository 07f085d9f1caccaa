#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include "kernel.cuh"

__global__ void axpb_kernel(const float* __restrict__ x, float* __restrict__ y, float b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    y[i] = AXPB_SCALE * x[i] + b;
  }
}

torch::Tensor axpb_cuda(torch::Tensor x, double b) {
  TORCH_CHECK(x.is_cuda(), "axpb: x must be a CUDA tensor");
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "axpb: x must be float32");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const int64_t n = xc.numel();
  if (n == 0) return y;
  const int threads = 256;
  const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
  axpb_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), (float)b, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
