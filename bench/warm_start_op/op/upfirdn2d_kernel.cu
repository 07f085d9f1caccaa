#include <torch/types.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

__global__ void upsample2x_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t planes, int64_t h,
                                  int64_t w) {
  const int64_t n = planes * 4 * h * w;
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < n; o += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = o % (2 * w), i = (o / (2 * w)) % (2 * h), p = o / (4 * h * w);
    y[o] = x[(p * h + i / 2) * w + j / 2];
  }
}

torch::Tensor upsample2x_cuda(const torch::Tensor& x) {
  auto y = torch::empty({x.size(0), x.size(1), 2 * x.size(2), 2 * x.size(3)}, x.options());
  const int64_t n = y.numel();
  if (n == 0) return y;
  const int threads = 256;
  const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
  upsample2x_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), x.size(0) * x.size(1), x.size(2), x.size(3));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
