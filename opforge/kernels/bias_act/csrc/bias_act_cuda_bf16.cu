// bias_act's CUDA kernels for BF16 tensors (bias_act_cuda.cuh): one translation unit per dtype,
// so that the three build in parallel.
#include "bias_act_cuda.cuh"

namespace opforge_bias_act_cuda {

Kernel kernel_bf16(int walk, int mode, int act, bool wide) { return kernel_table<BF16>(walk, mode, act, wide); }

}  // namespace opforge_bias_act_cuda
