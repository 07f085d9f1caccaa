// bias_act's CUDA kernels, device side: the three walks of bias_act_cuda.h over one dtype D,
// for every mode and activation. Included by bias_act_cuda_{f32,f16,bf16}.cu, each of which
// instantiates kernel_table<D>() for its dtype. The per-element math and the 16-byte vector
// accesses are bias_act_cuda_vec.cuh's (formulas from bias_act_math.h, with float and CUDA's
// own expf/expm1f/log1pf/tanhf/erfcf, no fast-math). Each thread keeps two vectors in flight:
// both are loaded before either is computed.
//
// Each (walk, mode, activation) is its own kernel (see the end of this file).

#pragma once

#include <cstdint>
#include <utility>

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

// Thread t of T (the grid's threads) takes the vectors t and t + T, then every 2T further. The
// launch gives T about half the tensor's vectors (a one-shot grid): each thread's two vectors
// are then half the tensor apart, which keeps the forward within 0.5% of a device-to-device
// copy on the H100, where a persistent grid (a few blocks per SM, looping) was 6-12% slower
// and blocks of consecutive vectors 10-11% (bench/cuda_probe/bias_act_fwd.cu).
// p.step_r, p.step_c: T * V elements (a thread's first vector to its second) as
// (S % inner, (S / inner) % channels).
template <class D, int Mode, int A, class I>
__device__ __forceinline__ void elementwise(const Params& p) {
  constexpr int V = kVec<D>;
  const I n = static_cast<I>(p.n);
  const I nvec = n / V;
  const I tid = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x;
  const I nthreads = static_cast<I>(gridDim.x) * blockDim.x;
  const int kind = uses_bias(Mode) ? p.bias_kind : kNoBias;
  const I inner = static_cast<I>(p.inner), C = static_cast<I>(p.channels);
  const I step_r = static_cast<I>(p.step_r), step_c = static_cast<I>(p.step_c);
  for (I v = tid; v < nvec; v += 2 * nthreads) {
    const I v1 = v + nthreads;
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
  // The last n % V elements, one per thread.
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
// The kernels: one per (walk, mode, activation), each with its own register allocation (one
// kernel switching on the activation is allocated for its hungriest case), and one dtype's
// table of them.

template <class D, int Mode, int A, class I>
__global__ void __launch_bounds__(kThreads, min_blocks(kElementwise, Mode, A))
    elementwise_kernel(const Params p) {
  elementwise<D, Mode, A, I>(p);
}

template <class D, int Mode, int A, class I>
__global__ void __launch_bounds__(kThreads, min_blocks(kRows, Mode, A)) rows_kernel(const Params p) {
  rows<D, Mode, A, I>(p);
}

template <class D, int Mode, int A, class I>
__global__ void __launch_bounds__(kThreads, min_blocks(kCols, Mode, A)) cols_kernel(const Params p) {
  cols<D, Mode, A, I>(p);
}

template <class D, class I, int Walk, int Mode, int A>
Kernel entry() {
  if constexpr (!act_ok(Mode, A) || (Walk != kElementwise && Mode == kFwd)) {
    return nullptr;
  } else if constexpr (Walk == kElementwise) {
    return elementwise_kernel<D, Mode, A, I>;
  } else if constexpr (Walk == kRows) {
    return rows_kernel<D, Mode, A, I>;
  } else {
    return cols_kernel<D, Mode, A, I>;
  }
}

template <class D, class I, int Walk, int Mode, int... As>
Kernel by_act(int act, std::integer_sequence<int, As...>) {
  Kernel found = nullptr;
  ((act == As + 1 ? (found = entry<D, I, Walk, Mode, As + 1>(), 0) : 0), ...);
  return found;
}

template <class D, class I, int Walk>
Kernel by_mode(int mode, int act) {
  using Acts = std::make_integer_sequence<int, ba::kNumActs>;
  switch (mode) {
    case kFwd: return by_act<D, I, Walk, kFwd>(act, Acts{});
    case kBwdNone: return entry<D, I, Walk, kBwdNone, ba::kLinear>();  // dy * gain, whatever the activation
    case kBwdY: return by_act<D, I, Walk, kBwdY>(act, Acts{});
    case kBwdX: return by_act<D, I, Walk, kBwdX>(act, Acts{});
    case kBwd2Y: return by_act<D, I, Walk, kBwd2Y>(act, Acts{});
    case kBwd2X: return by_act<D, I, Walk, kBwd2X>(act, Acts{});
    default: return nullptr;
  }
}

template <class D, class I>
Kernel kernel_typed(int walk, int mode, int act) {
  switch (walk) {
    case kElementwise: return by_mode<D, I, kElementwise>(mode, act);
    case kRows: return by_mode<D, I, kRows>(mode, act);
    case kCols: return by_mode<D, I, kCols>(mode, act);
    default: return nullptr;
  }
}

template <class D>
Kernel kernel_table(int walk, int mode, int act, bool wide) {
  return wide ? kernel_typed<D, int64_t>(walk, mode, act) : kernel_typed<D, int32_t>(walk, mode, act);
}

}  // namespace opforge_bias_act_cuda
