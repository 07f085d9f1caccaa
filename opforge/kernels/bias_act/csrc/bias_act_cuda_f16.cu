// bias_act's CUDA kernels for F16 tensors (bias_act_cuda.cuh): one translation unit per dtype,
// so that the three build in parallel.
#include "bias_act_cuda.cuh"

namespace opforge_bias_act_cuda {

Kernel kernel_f16(int walk, int mode, int act, bool wide) { return kernel_table<F16>(walk, mode, act, wide); }

}  // namespace opforge_bias_act_cuda
