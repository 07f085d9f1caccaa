// bias_act's CUDA variant: what its three parts share (no torch header, no device code).
//
// * bias_act_cuda.cpp: the ops on the LibTorch stable ABI; checks the tensors, then plan()
//   and launch() with raw pointers and the current stream.
// * bias_act_cuda_launch.cu: plan() and launch(): which walk, kernel and grid a call takes,
//   and the kernel that finishes db.
// * bias_act_cuda_{f32,f16,bf16}.cu: the kernels of one dtype (bias_act_cuda.cuh), built in
//   parallel; each exports its kernel table, kernel_f32() and so on.
//
// Every tensor of a call is walked as one flat array of n elements (they share one dense
// layout); element k's channel is (k / inner) % channels. Three walks:
//
// * elementwise (the forward, and a backward without db): vectors of V elements (16 bytes),
//   two a thread, half the tensor apart (a one-shot grid).
// * rows (a backward with db, runs of >= kRowsMinInner elements): groups of G lanes take whole
//   runs of one channel (or segments of one, when there are too few runs to fill the GPU), a
//   group for each, and sum them; sums[unit] is each unit's sum.
// * cols (a backward with db, shorter runs): the array as a matrix of `width` columns, a
//   multiple of channels * inner, so each column lies in one channel; 8 row lanes x 32 column
//   lanes a block, each column's sum over its block's rows in sums[blockIdx.y * width + col].
//
// Sums are fp32 and in a fixed order (no atomics): db is deterministic. A small kernel then
// adds each channel's partial sums, in order, into db (in b's dtype).

#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bias_act_math.h"

#if defined(__CUDACC__)
#define OPFORGE_BIAS_ACT_HD __host__ __device__
#else
#define OPFORGE_BIAS_ACT_HD
#endif

namespace opforge_bias_act_cuda {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
// kZero: every output zeroed (a zero gain, or a second derivative that is zero).
enum Mode : int { kFwd = 0, kBwdNone = 1, kBwdY = 2, kBwdX = 3, kBwd2Y = 4, kBwd2X = 5, kZero = 6 };
enum Walk : int { kElementwise = 0, kRows = 1, kCols = 2 };
constexpr int kNumModes = 6;

constexpr int kThreads = 256;
constexpr int kColRowLanes = kThreads / 32;  // the cols walk's block: 8 row lanes x 32 column lanes
constexpr int64_t kRowsMinInner = 256;       // shorter runs take the cols walk

// How a vector's V biases are found (a uniform branch in the elementwise walk).
enum BiasKind : int { kNoBias = 0, kUniform = 1, kPerVec = 2, kInner1 = 3, kGeneric = 4 };

struct Params {
  const void* in[3];  // by mode: fwd x; bwd dy, (y | x); bwd2 s, dy, (y | x)
  const void* b;      // `channels` elements of b_dtype; null: no bias
  void* out;
  float* sums;        // rows and cols walks: the fp32 partial sums
  int64_t n, channels, inner;
  float alpha, gain, clamp, clamp_ref;  // clamp, clamp_ref < 0: none
  int b_dtype, bias_kind;
  int aligned;  // bit t: in[t] is 16-byte aligned; bit 3: out is
  // elementwise: S = the grid's threads * V elements (a thread's first vector to its second)
  // as (S % inner, (S / inner) % channels)
  int64_t step_r, step_c;
  // rows: lanes per group 1 << glog; units = runs * segs, each seg_len elements (the last of a
  // run shorter); step_c = groups % channels, to follow the channel of a group's run
  int64_t units, segs, seg_len;
  int glog;
  // cols: `width` columns, col_rows rows of them (the last one may be short)
  int64_t width, col_rows;
};

using Kernel = void (*)(Params);

// The kernel of one dtype for (walk, mode, act), int64 indexing if `wide`; null if none.
Kernel kernel_f32(int walk, int mode, int act, bool wide);
Kernel kernel_f16(int walk, int mode, int act, bool wide);
Kernel kernel_bf16(int walk, int mode, int act, bool wide);

// Blocks of kThreads a kernel's registers must leave room for on one SM (its launch bounds;
// the planning counts on them). More blocks, more vectors in flight: on the H100 the forward
// at 6 (at most 40 registers) runs as fast as a device-to-device copy, at 4 (64 registers)
// 14% slower, at 8 (32 registers, spilling) 50% slower (bench/cuda_probe/bias_act_fwd.cu).
// So 6 where 40 registers hold a kernel without spills (nvcc 13.0, -Xptxas -v): the forward
// and the elementwise backward from nothing or y; 5 for the forward of gelu and softplus
// (their erfc and log1p need more); 4 (64) for the rest, which read two or three tensors, but
// 3 (85) for the cols walk's backward from x and second derivatives (its V column sums besides).
// What still spills is the int64 kernels' few bytes (tensors of over 2^30 elements).
OPFORGE_BIAS_ACT_HD constexpr int min_blocks(int walk, int mode, int act) {
  if (walk == kCols) return mode == kBwdNone || mode == kBwdY ? 4 : 3;
  if (walk == kRows) return 4;
  if (mode == kBwdNone || mode == kBwdY) return 6;
  if (mode == kFwd) return act == opforge_bias_act::kGelu || act == opforge_bias_act::kSoftplus ? 5 : 6;
  return 4;
}

// What a call runs: plan() decides, launch() runs it.
struct Plan {
  int walk;
  bool wide;
  Kernel kernel;
  unsigned grid_x, grid_y;
  int64_t scratch;  // fp32 elements of scratch the walk needs for its partial sums (0: none)
  int glog;
  int64_t units, segs, seg_len;  // rows
  int64_t width, col_rows;       // cols
};

// The plan for `mode` of activation `act` over n elements on `device` (with_db: a backward
// that also sums db).
cudaError_t plan(int mode, int dtype, int act, int64_t n, int64_t channels, int64_t inner, bool with_db,
                 int device, Plan* out);

// Runs `mode` by `plan` on `stream` (of the current device). Inputs by mode: fwd x; bwd dy, and
// y (ref y) or x (ref x); bwd2 s, dy, and y or x. b: `channels` elements of b_dtype, or null.
// db (when not null): `channels` elements of db_dtype, the per-channel sums of the outputs;
// scratch: plan.scratch fp32 elements. kZero: out (and db) zeroed.
cudaError_t launch(const Plan& plan, int mode, int dtype, const void* in0, const void* in1,
                   const void* in2, const void* b, int b_dtype, void* out, void* db, int db_dtype, float* scratch,
                   int64_t n, int64_t channels, int64_t inner, float alpha, float gain, float clamp,
                   float clamp_ref, cudaStream_t stream);

}  // namespace opforge_bias_act_cuda
