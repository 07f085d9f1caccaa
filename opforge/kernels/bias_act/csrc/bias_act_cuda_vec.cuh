// bias_act's CUDA kernels, device side, per element and per vector: the math policy, the
// dtypes, the value each mode computes, and the loads and stores of 16-byte vectors. The
// walks over a tensor are in bias_act_cuda.cuh.
//
// Vectors are V elements (16 bytes: 4 fp32, 8 fp16/bf16) at flat indices that are multiples of
// V; a tensor whose data pointer is 16-byte aligned is read and written with one 16-byte access
// per vector, another element by element (tensors of one call may differ, e.g. x[1:]).

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "bias_act_cuda.h"
#include "bias_act_math.h"

namespace opforge_bias_act_cuda {

namespace ba = opforge_bias_act;

struct CudaMath {
  static __host__ __device__ __forceinline__ float exp(float v) { return expf(v); }
  static __host__ __device__ __forceinline__ float expm1(float v) { return expm1f(v); }
  static __host__ __device__ __forceinline__ float log1p(float v) { return log1pf(v); }
  static __host__ __device__ __forceinline__ float tanh(float v) { return tanhf(v); }
  static __host__ __device__ __forceinline__ float erfc(float v) { return erfcf(v); }
  static __host__ __device__ __forceinline__ float sel(bool c, float a, float b) { return c ? a : b; }
  static __host__ __device__ __forceinline__ float zero() { return 0.0f; }
  static __host__ __device__ __forceinline__ float one() { return 1.0f; }
};

// Storage type S and its conversions (explicit: torch builds with __CUDA_NO_HALF_CONVERSIONS__).
struct F32 {
  using S = float;
  static __device__ __forceinline__ float load(S s) { return s; }
  static __device__ __forceinline__ S store(float f) { return f; }
};
struct F16 {
  using S = unsigned short;
  static __device__ __forceinline__ float load(S s) { return __half2float(__ushort_as_half(s)); }
  static __device__ __forceinline__ S store(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
struct BF16 {
  using S = unsigned short;
  static __device__ __forceinline__ float load(S s) { return __bfloat162float(__ushort_as_bfloat16(s)); }
  static __device__ __forceinline__ S store(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};

template <class D>
constexpr int kVec = 16 / static_cast<int>(sizeof(typename D::S));

__host__ __device__ constexpr int num_inputs(int mode) {
  return mode == kBwd2Y || mode == kBwd2X ? 3 : mode == kBwdY || mode == kBwdX ? 2 : 1;
}
__host__ __device__ constexpr bool uses_bias(int mode) { return mode == kFwd || mode == kBwdX || mode == kBwd2X; }

// Which activations a mode has a kernel for (bias_act_math.h's pairs).
__host__ __device__ constexpr bool act_ok(int mode, int a) {
  switch (mode) {
    case kFwd: return a >= 1 && a <= ba::kNumActs;
    case kBwdNone: return a == ba::kLinear;  // d = dy * gain whatever the activation
    case kBwdY: return ba::has_d_from_value(a);
    case kBwdX: return ba::has_d_from_pre(a);
    case kBwd2Y: return ba::has_d2_from_value(a);
    case kBwd2X: return ba::has_d2_from_pre(a);
    default: return false;
  }
}

// b[c] in fp32, whatever b's dtype.
template <class I>
__device__ __forceinline__ float bias_at(const Params& p, I c) {
  switch (p.b_dtype) {
    case kF16: return __half2float(static_cast<const __half*>(p.b)[c]);
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p.b)[c]);
    default: return static_cast<const float*>(p.b)[c];
  }
}

// ---------------------------------------------------------------------------------------
// One element: the value the mode writes, from its inputs (i0, i1, i2) and the bias.

template <int Mode, int A>
__device__ __forceinline__ float compute(float i0, float i1, float i2, float bias, const Params& p) {
  using M = CudaMath;
  if constexpr (Mode == kFwd) {
    float u = ba::value<A, M>(i0 + bias, p.alpha) * p.gain;
    if (p.clamp >= 0.0f) u = u > p.clamp ? p.clamp : (u < -p.clamp ? -p.clamp : u);  // NaN stays NaN
    return u;
  } else if constexpr (Mode == kBwdNone) {
    return i0 * p.gain;
  } else if constexpr (Mode == kBwdY || Mode == kBwd2Y) {
    // y = i1 (bwd) or i2 (bwd2); its activation value a = y / gain.
    const float y = Mode == kBwdY ? i1 : i2;
    const float a = y / p.gain;
    float d;
    if constexpr (Mode == kBwdY) {
      d = i0 * (p.gain * ba::d_from_value<A, M>(a, p.alpha));
    } else {
      d = (i0 * i1) * ba::d2_from_value<A, M>(a);  // gain cancels (reference.backward2)
    }
    return p.clamp_ref >= 0.0f && !(fabsf(y) < p.clamp_ref) ? 0.0f : d;
  } else {
    static_assert(Mode == kBwdX || Mode == kBwd2X, "unknown mode");
    const float v = (Mode == kBwdX ? i1 : i2) + bias;
    float d;
    if constexpr (Mode == kBwdX) {
      d = i0 * (p.gain * ba::d_from_pre<A, M>(v, p.alpha));
    } else {
      d = (i0 * i1) * (p.gain * ba::d2_from_pre<A, M>(v, p.alpha));
    }
    if (p.clamp >= 0.0f && !(fabsf(ba::value<A, M>(v, p.alpha) * p.gain) < p.clamp)) d = 0.0f;
    return d;
  }
}

// ---------------------------------------------------------------------------------------
// fetch() loads a vector's inputs (raw), finish() computes its values and stores them.

template <class D, int Mode>
struct Fetched {
  static constexpr int V = kVec<D>;
  union Word {
    uint4 u;
    typename D::S s[V];
  } w[num_inputs(Mode)];
};

template <class D, int Mode, class I>
__device__ __forceinline__ void fetch(const Params& p, I k, Fetched<D, Mode>& f) {
  using S = typename D::S;
  constexpr int V = kVec<D>;
#pragma unroll
  for (int t = 0; t < num_inputs(Mode); ++t) {
    const S* src = static_cast<const S*>(p.in[t]) + k;
    if ((p.aligned >> t) & 1) {
      f.w[t].u = *reinterpret_cast<const uint4*>(src);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) f.w[t].s[j] = src[j];
    }
  }
}

template <class D, int Mode, int A, class I>
__device__ __forceinline__ void finish(const Params& p, I k, const Fetched<D, Mode>& f, const float (&bias)[kVec<D>],
                                       float (&vals)[kVec<D>]) {
  using S = typename D::S;
  constexpr int V = kVec<D>;
  constexpr int NIN = num_inputs(Mode);
  typename Fetched<D, Mode>::Word o;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    vals[j] = compute<Mode, A>(D::load(f.w[0].s[j]), NIN > 1 ? D::load(f.w[NIN > 1 ? 1 : 0].s[j]) : 0.0f,
                               NIN > 2 ? D::load(f.w[NIN > 2 ? 2 : 0].s[j]) : 0.0f, bias[j], p);
    o.s[j] = D::store(vals[j]);
  }
  S* dst = static_cast<S*>(p.out) + k;
  if ((p.aligned >> 3) & 1) {
    *reinterpret_cast<uint4*>(dst) = o.u;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) dst[j] = o.s[j];
  }
}

// Vectors k0 and (if two) k1: both fetched, then both finished; returns the sum of their values.
template <class D, int Mode, int A, class I>
__device__ __forceinline__ float do_two(const Params& p, I k0, I k1, bool two, const float (&b0)[kVec<D>],
                                        const float (&b1)[kVec<D>], float (&v0)[kVec<D>], float (&v1)[kVec<D>]) {
  constexpr int V = kVec<D>;
  Fetched<D, Mode> f0, f1;
  fetch<D, Mode>(p, k0, f0);
  if (two) fetch<D, Mode>(p, k1, f1);
  finish<D, Mode, A>(p, k0, f0, b0, v0);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) sum += v0[j];
  if (two) {
    finish<D, Mode, A>(p, k1, f1, b1, v1);
#pragma unroll
    for (int j = 0; j < V; ++j) sum += v1[j];
  }
  return sum;
}

// One element k, any alignment; returns its value.
template <class D, int Mode, int A, class I>
__device__ __forceinline__ float do_one(const Params& p, I k, float bias) {
  using S = typename D::S;
  constexpr int NIN = num_inputs(Mode);
  const float i0 = D::load(static_cast<const S*>(p.in[0])[k]);
  const float i1 = NIN > 1 ? D::load(static_cast<const S*>(p.in[NIN > 1 ? 1 : 0])[k]) : 0.0f;
  const float i2 = NIN > 2 ? D::load(static_cast<const S*>(p.in[NIN > 2 ? 2 : 0])[k]) : 0.0f;
  const float y = compute<Mode, A>(i0, i1, i2, bias, p);
  static_cast<S*>(p.out)[k] = D::store(y);
  return y;
}

}  // namespace opforge_bias_act_cuda
