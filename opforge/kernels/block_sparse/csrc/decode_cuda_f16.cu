// block_sparse's CUDA decode kernels for f16 tensors (decode_cuda_kernel.cuh): one translation unit
// a dtype, so that the two build in parallel.
#include "decode_cuda_kernel.cuh"

namespace opforge_block_sparse_decode {

Kernel kernel_f16(int nt, int kq, int mt, bool wg) { return kernel_table<false>(nt, kq, mt, wg); }

}  // namespace opforge_block_sparse_decode
