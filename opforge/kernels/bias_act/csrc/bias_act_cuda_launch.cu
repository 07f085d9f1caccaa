// bias_act's CUDA variant, host side of the kernels (bias_act_cuda.h): which walk, kernel and
// grid a call takes (plan), running it (launch), and the kernel that finishes db from the
// walks' partial sums. No torch header here.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "bias_act_cuda.h"

namespace opforge_bias_act_cuda {

namespace {

constexpr int kMaxDevices = 64;
// Below this, int32 index arithmetic: 2^31 less a margin that covers every "index + stride".
constexpr int64_t kInt32Limit = (int64_t{1} << 31) - (int64_t{1} << 26);
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t gcd(int64_t a, int64_t b) {
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}
int vec_of(int dtype) { return dtype == kF32 ? 4 : 8; }
int64_t elem_size(int dtype) { return dtype == kF32 ? 4 : 2; }

Kernel pick(int dtype, int walk, int mode, int act, bool wide) {
  switch (dtype) {
    case kF32: return kernel_f32(walk, mode, act, wide);
    case kF16: return kernel_f16(walk, mode, act, wide);
    case kBF16: return kernel_bf16(walk, mode, act, wide);
    default: return nullptr;
  }
}

// The SM count (cached per device) and the blocks of kThreads a kernel can keep resident on
// one SM: at least its launch bounds' min_blocks, which the planning counts on.
struct Resident {
  int sms;
  int blocks_per_sm;
  int64_t blocks() const { return int64_t{sms} * blocks_per_sm; }
};

cudaError_t resident(int walk, int mode, int act, int device, Resident* out) {
  static std::atomic<int> sm_cache[kMaxDevices];
  const bool cached = device >= 0 && device < kMaxDevices;
  int sms = cached ? sm_cache[device].load(std::memory_order_relaxed) : 0;
  if (sms <= 0) {
    const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    if (sms < 1) sms = 1;
    if (cached) sm_cache[device].store(sms, std::memory_order_relaxed);
  }
  *out = {sms, min_blocks(walk, mode, act)};
  return cudaSuccess;
}

unsigned grid_of(int64_t want, int64_t most) {
  return static_cast<unsigned>(want < 1 ? 1 : want < most ? want : most);
}

// rows: groups of G lanes (G ~ inner / V, at most a warp); runs are split in segments when
// there are fewer than half as many as resident groups (each segment >= 4 vectors a lane).
void plan_rows(int dtype, int64_t n, int64_t inner, const Resident& res, Plan* p) {
  const int64_t V = vec_of(dtype);
  const int64_t runs = n / inner;
  const int64_t per_lane = cdiv(inner, V);
  int glog = 0;
  while (glog < 5 && (int64_t{1} << glog) < per_lane) ++glog;
  const int64_t G = int64_t{1} << glog;
  const int64_t groups = res.blocks() * kThreads / G;
  int64_t segs = 1;
  if (runs * 2 < groups) {
    segs = cdiv(groups, runs);
    const int64_t most = inner / (G * V * 4);
    if (segs > most) segs = most;
    if (segs > 4096) segs = 4096;
    if (segs < 1) segs = 1;
  }
  int64_t seg_len = cdiv(cdiv(inner, segs), V) * V;
  segs = cdiv(inner, seg_len);
  p->glog = glog;
  p->units = runs * segs;
  p->segs = segs;
  p->seg_len = seg_len;
  // One-shot: a group for each unit. On the H100 a persistent grid (the resident blocks, each
  // group looping over units) was 4% (fp32) to 7% (fp16) slower (bench/cuda_probe/bias_act_fwd.cu).
  p->grid_x = grid_of(cdiv(p->units * G, kThreads), kMaxGridX);
  p->scratch = p->units;
}

// cols: width = a multiple of the period (channels * inner) and of V, >= 32 vectors (a warp's
// columns) where the tensor has that many elements; else the period itself (element by
// element). Row blocks: 4 times what is resident (on the H100, 1x was 4% slower in fp32, 16x
// 3-4% slower: bench/cuda_probe/bias_act_fwd.cu), but each row lane >= 4 rows where there are
// that many, so the partial sums stay under n / 32.
void plan_cols(int dtype, int64_t n, int64_t channels, int64_t inner, const Resident& res, Plan* p) {
  const int64_t V = vec_of(dtype);
  const int64_t period = channels * inner;
  const int64_t lcm = period / gcd(period, V) * V;
  int64_t width = period;
  if (lcm <= n) {
    int64_t m = cdiv(32 * V, lcm);
    if (lcm * m > n) m = n / lcm;
    width = lcm * m;
  }
  const int64_t rows = cdiv(n, width);
  const int64_t gx = cdiv(cdiv(width, V), 32);
  int64_t gy = 4 * res.blocks() / gx;
  const int64_t most = cdiv(cdiv(rows, kColRowLanes), 4);
  if (gy > most) gy = most;
  if (gy > kMaxGridY) gy = kMaxGridY;
  if (gy < 1) gy = 1;
  p->width = width;
  p->col_rows = rows;
  p->grid_x = static_cast<unsigned>(gx);
  p->grid_y = static_cast<unsigned>(gy);
  p->scratch = gy * width;
}

// db[c] = the sum of channel c's partial sums, in order: part[q * qstride + c * cstride + i]
// for q < M / ilen, i < ilen (m = q * ilen + i), by T = 32 or 256 lanes per channel, in db's
// dtype.
__global__ void __launch_bounds__(kThreads) finish_kernel(const float* part, void* db, int db_dtype, int64_t channels,
                                                          int64_t M, int64_t ilen, int64_t qstride, int64_t cstride,
                                                          int lanes) {
  __shared__ float warp_sums[kThreads / 32];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / lanes;
  const int lane = threadIdx.x % lanes;
  float acc = 0.0f;
  if (c < channels) {
    for (int64_t m = lane; m < M; m += lanes) {
      const int64_t q = m / ilen, i = m - q * ilen;
      acc += part[q * qstride + c * cstride + i];
    }
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lanes > 32) {  // a block per channel: its warps' sums, in order
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
    __syncthreads();
    acc = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) acc += warp_sums[w];
  }
  if (lane == 0 && c < channels) {
    switch (db_dtype) {
      case kF16: static_cast<__half*>(db)[c] = __float2half_rn(acc); break;
      case kBF16: static_cast<__nv_bfloat16*>(db)[c] = __float2bfloat16_rn(acc); break;
      default: static_cast<float*>(db)[c] = acc; break;
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t plan(int mode, int dtype, int act, int64_t n, int64_t channels, int64_t inner, bool with_db,
                 int device, Plan* out) {
  *out = Plan{};
  out->grid_x = out->grid_y = 1;
  if (n <= 0 || mode == kZero) return cudaSuccess;
  if (channels < 1 || inner < 1 || mode < 0 || mode >= kNumModes) return cudaErrorInvalidValue;
  const bool db = with_db && mode != kFwd;
  const int walk = !db ? kElementwise : inner >= kRowsMinInner ? kRows : kCols;
  out->walk = walk;
  const int64_t period = channels * inner;
  // The largest index a walk forms: elementwise, a second vector up to half the tensor past the
  // end (so 1.5 n); cols, a row of width past it; rows, n.
  const int64_t reach = walk == kElementwise ? 2 * n : walk == kCols ? n + 8 * period + 256 : n;
  out->wide = reach >= kInt32Limit;
  out->kernel = pick(dtype, walk, mode, act, out->wide);
  if (out->kernel == nullptr) return cudaErrorInvalidValue;
  Resident res{};
  const cudaError_t err = resident(walk, mode, act, device, &res);
  if (err != cudaSuccess) return err;
  if (walk == kRows) {
    plan_rows(dtype, n, inner, res, out);
  } else if (walk == kCols) {
    plan_cols(dtype, n, channels, inner, res, out);
  } else {  // one-shot: a thread for each two vectors (bias_act_cuda.cuh says why); a small
    // tensor, one vector a thread over up to a block per SM (its time is latency, not bandwidth)
    const int64_t nvec = n / vec_of(dtype);
    int64_t grid = cdiv(nvec, 2 * kThreads);
    if (grid < res.sms) grid = cdiv(nvec, kThreads) < res.sms ? cdiv(nvec, kThreads) : res.sms;
    out->grid_x = grid_of(grid, kMaxGridX);
  }
  return cudaSuccess;
}

cudaError_t launch(const Plan& plan, int mode, int dtype, const void* in0, const void* in1,
                   const void* in2, const void* b, int b_dtype, void* out, void* db, int db_dtype, float* scratch,
                   int64_t n, int64_t channels, int64_t inner, float alpha, float gain, float clamp,
                   float clamp_ref, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (mode == kZero) {
    cudaError_t err = cudaMemsetAsync(out, 0, static_cast<size_t>(n * elem_size(dtype)), stream);
    if (err == cudaSuccess && db != nullptr) {
      err = cudaMemsetAsync(db, 0, static_cast<size_t>(channels * elem_size(db_dtype)), stream);
    }
    return err;
  }
  if (plan.kernel == nullptr || (plan.walk != kElementwise && (db == nullptr || scratch == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const int64_t V = vec_of(dtype);
  Params p{};
  p.in[0] = in0;
  p.in[1] = in1;
  p.in[2] = in2;
  p.b = b;
  p.b_dtype = b_dtype;
  p.out = out;
  p.n = n;
  p.channels = channels;
  p.inner = inner;
  p.alpha = alpha;
  p.gain = gain;
  p.clamp = clamp;
  p.clamp_ref = clamp_ref;
  const int nin = mode == kBwd2Y || mode == kBwd2X ? 3 : mode == kBwdY || mode == kBwdX ? 2 : 1;
  const void* ins[3] = {in0, in1, in2};
  for (int t = 0; t < nin; ++t) p.aligned |= aligned16(ins[t]) ? 1 << t : 0;
  p.aligned |= aligned16(out) ? 8 : 0;
  p.bias_kind = b == nullptr ? kNoBias : channels == 1 ? kUniform : inner % V == 0 ? kPerVec : inner == 1 ? kInner1
                                                                                                         : kGeneric;
  const int64_t threads = int64_t{plan.grid_x} * kThreads;
  if (plan.walk == kElementwise) {  // the step from a thread's first vector to its second
    const int64_t stride = threads * V;
    p.step_r = stride % inner;
    p.step_c = (stride / inner) % channels;
  } else if (plan.walk == kRows) {
    p.glog = plan.glog;
    p.units = plan.units;
    p.segs = plan.segs;
    p.seg_len = plan.seg_len;
    p.step_c = (threads >> plan.glog) % channels;
    p.sums = scratch;
  } else {
    p.width = plan.width;
    p.col_rows = plan.col_rows;
    p.sums = scratch;
  }
  void* args[] = {&p};
  cudaError_t err = cudaLaunchKernel(reinterpret_cast<const void*>(plan.kernel), dim3(plan.grid_x, plan.grid_y),
                                     dim3(kThreads), args, 0, stream);
  if (err == cudaSuccess && plan.walk != kElementwise) {
    int64_t M, ilen, qstride, cstride;
    if (plan.walk == kRows) {  // unit (o * channels + c) * segs + s
      ilen = plan.segs;
      M = (n / inner / channels) * plan.segs;
      qstride = channels * plan.segs;
      cstride = plan.segs;
    } else {  // row block y, copy k of the period: sums[(y * copies + k) * period + c * inner + i]
      const int64_t period = channels * inner;
      ilen = inner;
      M = int64_t{plan.grid_y} * (plan.width / period) * inner;
      qstride = period;
      cstride = inner;
    }
    int lanes = channels >= 64 ? 32 : kThreads;
    const float* part = scratch;
    void* fargs[] = {&part, &db, &db_dtype, &channels, &M, &ilen, &qstride, &cstride, &lanes};
    err = cudaLaunchKernel(reinterpret_cast<const void*>(finish_kernel),
                           dim3(static_cast<unsigned>(cdiv(channels * lanes, kThreads))), dim3(kThreads), fargs, 0,
                           stream);
  }
  if (err != cudaSuccess) (void)cudaGetLastError();  // the caller raises it: leave no error behind for torch
  return err;
}

}  // namespace opforge_bias_act_cuda
