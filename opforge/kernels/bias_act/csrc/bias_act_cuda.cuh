// bias_act's CUDA kernels, device side: the three walks of bias_act_cuda.h over one dtype D,
// for every mode and activation. Included by bias_act_cuda_{f32,f16,bf16}.cu, each of which
// instantiates kernel_table<D>() for its dtype. The per-element math and the 16-byte vector
// accesses are bias_act_cuda_vec.cuh's (formulas from bias_act_math.h, with float and CUDA's
// own expf/expm1f/log1pf/tanhf/erfcf, no fast-math). Each thread keeps two vectors in flight:
// both are loaded before either is computed.
//
// The activation is a switch on its runtime id at the top of each kernel, each case a copy of
// the whole walk for that activation (a uniform branch, taken once per thread).

#pragma once

#include <cstdint>

#include "bias_act_cuda_vec.cuh"

namespace opforge_bias_act_cuda {

// c + add modulo C, for 0 <= c < C and 0 <= add <= C, without overflowing I.
template <class I>
__device__ __forceinline__ I add_mod(I c, I add, I C) {
  return c >= C - add ? c - (C - add) : c + add;
}

// ---------------------------------------------------------------------------------------
// The elementwise walk.

// The V biases of the vector at position r of its run, channel c (kind >= kPerVec), or b[0].
template <int V, class I>
__device__ __forceinline__ void biases(const Params& p, int kind, I r, I c, I inner, I C, float (&bias)[V]) {
  if (kind == kNoBias || kind == kUniform) {
    const float b0 = kind == kUniform ? bias_at(p, 0) : 0.0f;
#pragma unroll
    for (int j = 0; j < V; ++j) bias[j] = b0;
  } else if (kind == kPerVec) {
    const float bc = bias_at(p, c);
#pragma unroll
    for (int j = 0; j < V; ++j) bias[j] = bc;
  } else if (kind == kInner1) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      bias[j] = bias_at(p, c);
      c = c + 1 == C ? 0 : c + 1;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      bias[j] = bias_at(p, c);
      if (++r == inner) {
        r = 0;
        c = c + 1 == C ? 0 : c + 1;
      }
    }
  }
}

// Block g takes the 2 * blockDim vectors from 2 * blockDim * g: thread t the vectors t and
// t + blockDim of them (every gridDim blocks further if the grid does not cover the tensor).
// The launch gives each block its own piece (a one-shot grid): the blocks then move through
// memory in address order, which keeps within 0.5% of a device-to-device copy where a
// persistent grid-stride loop stays 5% under it (bench/cuda_probe/bias_act_fwd.cu, H100).
// p.step_r, p.step_c: blockDim * V elements as (S % inner, (S / inner) % channels).
template <class D, int Mode, int A, class I>
__device__ __forceinline__ void elementwise(const Params& p) {
  constexpr int V = kVec<D>;
  const I n = static_cast<I>(p.n);
  const I nvec = n / V;
  const int kind = uses_bias(Mode) ? p.bias_kind : kNoBias;
  const I inner = static_cast<I>(p.inner), C = static_cast<I>(p.channels);
  const I step_r = static_cast<I>(p.step_r), step_c = static_cast<I>(p.step_c);
  const I chunk = 2 * static_cast<I>(blockDim.x);
  for (I v = static_cast<I>(blockIdx.x) * chunk + threadIdx.x; v < nvec; v += static_cast<I>(gridDim.x) * chunk) {
    const I v1 = v + blockDim.x;
    const bool two = v1 < nvec;
    I r = 0, c = 0;  // the position of vector v in its run, and its channel
    if (kind >= kPerVec) {
      const I q = v * V / inner;
      r = v * V - q * inner;
      c = q % C;
    }
    float b0[V], b1[V], y0[V], y1[V];
    biases<V>(p, kind, r, c, inner, C, b0);
    if (two) {
      if (kind >= kPerVec) {  // to vector v1: step_q * inner + step_r elements further
        I carry = 0;
        if (r >= inner - step_r) {
          r -= inner - step_r;
          carry = 1;
        } else {
          r += step_r;
        }
        c = add_mod(c, step_c + carry, C);
      }
      biases<V>(p, kind, r, c, inner, C, b1);
    }
    do_two<D, Mode, A>(p, v * V, v1 * V, two, b0, b1, y0, y1);
  }
  // The last n % V elements, one per thread of the first block.
  const I tid = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid < n - nvec * V) {
    const I k = nvec * V + tid;
    float bias = 0.0f;
    if (kind == kUniform) bias = bias_at(p, 0);
    if (kind >= kPerVec) bias = bias_at(p, (k / inner) % C);
    do_one<D, Mode, A>(p, k, bias);
  }
}

// ---------------------------------------------------------------------------------------
// The rows walk (a backward with db, long runs): groups of G lanes, each unit a run of one
// channel or a segment of one; p.sums[unit] gets the fp32 sum of the unit's values.

template <class D, int Mode, int A, class I>
__device__ __forceinline__ void rows(const Params& p) {
  constexpr int V = kVec<D>;
  const int glog = p.glog;
  const int G = 1 << glog;
  const int lane = threadIdx.x & (G - 1);
  const int wl = threadIdx.x & 31;
  const unsigned mask = G >= 32 ? 0xffffffffu : ((1u << G) - 1u) << (wl & ~(G - 1));
  const I group = (static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x) >> glog;
  const I ngroups = (static_cast<I>(gridDim.x) * blockDim.x) >> glog;
  const I units = static_cast<I>(p.units), segs = static_cast<I>(p.segs);
  const I seg_len = static_cast<I>(p.seg_len), inner = static_cast<I>(p.inner);
  const I C = static_cast<I>(p.channels), step_c = static_cast<I>(p.step_c);
  const bool has_b = uses_bias(Mode) && p.b != nullptr;

  I c = group < units ? group % C : 0;  // the channel of run u when segs == 1
  for (I u = group; u < units; u += ngroups) {
    I row = u, seg = 0;
    if (segs > 1) {
      row = u / segs;
      seg = u - row * segs;
    }
    const I s = row * inner + seg * seg_len;
    const I rest = inner - seg * seg_len;
    const I e = s + (seg_len < rest ? seg_len : rest);
    const float bv = has_b ? bias_at(p, segs > 1 ? row % C : c) : 0.0f;
    float bias[V], y0[V], y1[V];
#pragma unroll
    for (int j = 0; j < V; ++j) bias[j] = bv;

    // [s, a): head, [a, z): whole vectors, [z, e): tail.
    const I mis = s % V;
    I a = mis ? s + (V - mis) : s;
    if (a > e) a = e;
    I z = e - e % V;
    if (z < a) z = a;
    float acc = 0.0f;
    for (I vv = a / V + lane; vv < z / V; vv += 2 * G) {
      const I v1 = vv + G;
      acc += do_two<D, Mode, A>(p, vv * V, v1 * V, v1 < z / V, bias, bias, y0, y1);
    }
    const I nh = a - s, ne = nh + (e - z);
    for (I i = lane; i < ne; i += G) acc += do_one<D, Mode, A>(p, i < nh ? s + i : z + (i - nh), bv);
    for (int off = G >> 1; off > 0; off >>= 1) acc += __shfl_xor_sync(mask, acc, off);
    if (lane == 0) p.sums[u] = acc;
    if (segs == 1) c = add_mod(c, step_c, C);
  }
}

// ---------------------------------------------------------------------------------------
// The cols walk (a backward with db, short runs): lane (ty, tx) of a block takes the V
// columns from col = (blockIdx.x * 32 + tx) * V and the rows blockIdx.y * 8 + ty, then every
// gridDim.y * 8 further; the 8 row lanes' sums are added in order (shared memory) into
// p.sums[blockIdx.y * width + col + j]. Column j's channel is (j % (channels * inner)) / inner.
// When width is a multiple of V, every row's vector starts at a multiple of V (16-byte
// accesses); otherwise (a tensor of fewer rows than that would need) element by element.

// The cols walk's shared memory: one array per kernel (a __shared__ declared in cols() itself
// would be one per activation case of the kernel's switch). + 1: no bank conflicts.
template <int V>
__device__ __forceinline__ float (*cols_shared())[32][V + 1] {
  __shared__ float part[kColRowLanes][32][V + 1];
  return part;
}

template <class D, int Mode, int A, class I>
__device__ __forceinline__ void cols(const Params& p) {
  constexpr int V = kVec<D>;
  float(*part)[32][V + 1] = cols_shared<V>();
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const I n = static_cast<I>(p.n), width = static_cast<I>(p.width), R = static_cast<I>(p.col_rows);
  const I col = (static_cast<I>(blockIdx.x) * 32 + tx) * V;
  const int ncols = col >= width ? 0 : width - col < V ? static_cast<int>(width - col) : V;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.0f;
  if (ncols > 0) {
    const I inner = static_cast<I>(p.inner), period = static_cast<I>(p.channels) * inner;
    const bool has_b = uses_bias(Mode) && p.b != nullptr;
    float bias[V], y0[V], y1[V];
#pragma unroll
    for (int j = 0; j < V; ++j) bias[j] = has_b && j < ncols ? bias_at(p, ((col + j) % period) / inner) : 0.0f;
    const bool vec = width % V == 0;
    const I rstep = static_cast<I>(gridDim.y) * kColRowLanes;
    for (I r = static_cast<I>(blockIdx.y) * kColRowLanes + ty; r < R; r += 2 * rstep) {
      const I e0 = r * width + col;
      const bool has1 = r + rstep < R;
      const I e1 = has1 ? (r + rstep) * width + col : e0;
      if (vec && e0 + V <= n && (!has1 || e1 + V <= n)) {
        do_two<D, Mode, A>(p, e0, e1, has1, bias, bias, y0, y1);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += has1 ? y0[j] + y1[j] : y0[j];
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (j < ncols && e0 + j < n) acc[j] += do_one<D, Mode, A>(p, e0 + j, bias[j]);
        }
        if (has1) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            if (j < ncols && e1 + j < n) acc[j] += do_one<D, Mode, A>(p, e1 + j, bias[j]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) part[ty][tx][j] = acc[j];
  __syncthreads();
  if (ty == 0) {
    for (int j = 0; j < ncols; ++j) {
      float s = 0.0f;
#pragma unroll
      for (int l = 0; l < kColRowLanes; ++l) s += part[l][tx][j];
      p.sums[static_cast<I>(blockIdx.y) * width + col + j] = s;
    }
  }
}

// ---------------------------------------------------------------------------------------
// The kernels, and one dtype's table of them.

#define OPFORGE_BIAS_ACT_SWITCH(BODY)                                        \
  switch (p.act) {                                                           \
    case 1: if constexpr (act_ok(Mode, 1)) BODY<D, Mode, 1, I>(p); break;    \
    case 2: if constexpr (act_ok(Mode, 2)) BODY<D, Mode, 2, I>(p); break;    \
    case 3: if constexpr (act_ok(Mode, 3)) BODY<D, Mode, 3, I>(p); break;    \
    case 4: if constexpr (act_ok(Mode, 4)) BODY<D, Mode, 4, I>(p); break;    \
    case 5: if constexpr (act_ok(Mode, 5)) BODY<D, Mode, 5, I>(p); break;    \
    case 6: if constexpr (act_ok(Mode, 6)) BODY<D, Mode, 6, I>(p); break;    \
    case 7: if constexpr (act_ok(Mode, 7)) BODY<D, Mode, 7, I>(p); break;    \
    case 8: if constexpr (act_ok(Mode, 8)) BODY<D, Mode, 8, I>(p); break;    \
    case 9: if constexpr (act_ok(Mode, 9)) BODY<D, Mode, 9, I>(p); break;    \
    case 10: if constexpr (act_ok(Mode, 10)) BODY<D, Mode, 10, I>(p); break; \
    case 11: if constexpr (act_ok(Mode, 11)) BODY<D, Mode, 11, I>(p); break; \
    default: break;                                                          \
  }

static_assert(ba::kNumActs == 11, "OPFORGE_BIAS_ACT_SWITCH lists the activations 1..11");

// kBwdNone is linear's d = dy * gain whatever the activation: one copy of the walk.
#define OPFORGE_BIAS_ACT_KERNEL(NAME, BODY)                                     \
  template <class D, int Mode, class I>                                         \
  __global__ void __launch_bounds__(kThreads) NAME(const Params p) {            \
    if constexpr (Mode == kBwdNone) {                                           \
      BODY<D, Mode, ba::kLinear, I>(p);                                         \
    } else {                                                                    \
      OPFORGE_BIAS_ACT_SWITCH(BODY)                                             \
    }                                                                           \
  }

OPFORGE_BIAS_ACT_KERNEL(elementwise_kernel, elementwise)
OPFORGE_BIAS_ACT_KERNEL(rows_kernel, rows)
OPFORGE_BIAS_ACT_KERNEL(cols_kernel, cols)

#undef OPFORGE_BIAS_ACT_KERNEL
#undef OPFORGE_BIAS_ACT_SWITCH

template <class D, class I>
Kernel kernel_typed(int walk, int mode) {
  switch (walk * 8 + mode) {
    case kElementwise * 8 + kFwd: return elementwise_kernel<D, kFwd, I>;
    case kElementwise * 8 + kBwdNone: return elementwise_kernel<D, kBwdNone, I>;
    case kElementwise * 8 + kBwdY: return elementwise_kernel<D, kBwdY, I>;
    case kElementwise * 8 + kBwdX: return elementwise_kernel<D, kBwdX, I>;
    case kElementwise * 8 + kBwd2Y: return elementwise_kernel<D, kBwd2Y, I>;
    case kElementwise * 8 + kBwd2X: return elementwise_kernel<D, kBwd2X, I>;
    case kRows * 8 + kBwdNone: return rows_kernel<D, kBwdNone, I>;
    case kRows * 8 + kBwdY: return rows_kernel<D, kBwdY, I>;
    case kRows * 8 + kBwdX: return rows_kernel<D, kBwdX, I>;
    case kRows * 8 + kBwd2Y: return rows_kernel<D, kBwd2Y, I>;
    case kRows * 8 + kBwd2X: return rows_kernel<D, kBwd2X, I>;
    case kCols * 8 + kBwdNone: return cols_kernel<D, kBwdNone, I>;
    case kCols * 8 + kBwdY: return cols_kernel<D, kBwdY, I>;
    case kCols * 8 + kBwdX: return cols_kernel<D, kBwdX, I>;
    case kCols * 8 + kBwd2Y: return cols_kernel<D, kBwd2Y, I>;
    case kCols * 8 + kBwd2X: return cols_kernel<D, kBwd2X, I>;
    default: return nullptr;
  }
}

template <class D>
Kernel kernel_table(int walk, int mode, bool wide) {
  return wide ? kernel_typed<D, int64_t>(walk, mode) : kernel_typed<D, int32_t>(walk, mode);
}

}  // namespace opforge_bias_act_cuda
