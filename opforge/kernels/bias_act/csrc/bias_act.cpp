// opforge bias_act for the CPU: y = clamp(act(x + b) * gain, -clamp, clamp), its first
// derivative (dx, and db reduced in fp32) and its second, on fp32 / fp16 / bf16 tensors
// with fp32 compute, vectorised (bias_act_vec.h) and split across OpenMP threads.
//
// Only LibTorch stable-ABI headers; compiled with -DTORCH_TARGET_VERSION (torch 2.10 API),
// -O3, -fopenmp and the ISA flags of one variant.
//
// The ops take tensors that share one dense layout (opforge/kernels/bias_act/compiled.py
// makes sure) and walk them as flat arrays of numel elements: element k has channel
// (k / inner) % channels. Ops (namespace -DOPFORGE_NS=<extension name>):
//   forward(Tensor x, Tensor? b, Tensor(a!) y, int channels, int inner, int act,
//           float alpha, float gain, float clamp) -> ()
//   backward(Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) dx, Tensor(b!)? db, int channels,
//            int inner, int act, int ref_kind, float alpha, float gain, float clamp,
//            float clamp_ref) -> ()
//   backward2(Tensor s, Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) out, Tensor(b!)? db,
//             ...the same scalars) -> ()
//   simd_width() -> int
// clamp < 0: no clamp. ref_kind 0/1/2: the derivative is computed from nothing / y / x + b
// (ref holds y or x). clamp_ref: the clamp as y's dtype holds it (|y| < clamp_ref: not
// clamped). db: fp32, `channels` elements, the sum of dx (out) per channel.
//
// The activation loops and the dtype conversions are in bias_act_{fwd,grad1,grad2}.cpp (see
// bias_act_loops.h); this file is the checks, the threads and the walk over blocks.
//
// Work: each thread takes one contiguous range of elements and walks it in blocks of
// kBlock elements: load (converting to fp32) into stack buffers, add the bias run by run,
// apply one activation's loop (a switch per block, not per element), store, and for db
// add each run's sum into the thread's fp64 accumulators, summed over threads at the end.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "bias_act_ops.h"
#include "opforge_stable.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bias_act_loops.h"

namespace {

using namespace opforge_bias_act;
using opforge_stable::device_name;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr int64_t kBlock = 1024;          // elements per block: 4 KB per fp32 buffer
constexpr int64_t kMinPerThread = 65536;  // below this, more threads cost more than they give
constexpr int64_t kAlign = 64;            // thread ranges start on whole cache lines


// ---------------------------------------------------------------------------
// Runs of one channel. For elements [k, k + n): calls run(i, len, c) for each run of `len`
// elements from block offset i that all have channel c (inner > 1), or cols(i, len, c) for
// `len` elements with channels c, c + 1, ... (inner == 1: the channel is the fastest dim).

struct Geometry {
  int64_t channels, inner;
};

template <class Run, class Cols>
inline void for_channels(const Geometry& g, int64_t k, int64_t n, Run run, Cols cols) {
  if (g.channels == 1) {
    run(0, n, 0);
  } else if (g.inner == 1) {
    int64_t c = k % g.channels;
    for (int64_t i = 0; i < n; c = 0) {
      const int64_t len = std::min(n - i, g.channels - c);
      cols(i, len, c);
      i += len;
    }
  } else {
    const int64_t q = k / g.inner;
    int64_t c = q % g.channels, r = k - q * g.inner;
    for (int64_t i = 0; i < n; r = 0, c = c + 1 == g.channels ? 0 : c + 1) {
      const int64_t len = std::min(n - i, g.inner - r);
      run(i, len, c);
      i += len;
    }
  }
}

inline void add_bias(const Geometry& g, int64_t k, int64_t n, const float* __restrict__ b, float* __restrict__ buf) {
  for_channels(
      g, k, n,
      [&](int64_t i, int64_t len, int64_t c) {
        const float bc = b[c];
        for (int64_t j = 0; j < len; ++j) buf[i + j] += bc;
      },
      [&](int64_t i, int64_t len, int64_t c) {
        for (int64_t j = 0; j < len; ++j) buf[i + j] += b[c + j];
      });
}

inline void add_sums(const Geometry& g, int64_t k, int64_t n, const float* __restrict__ d, double* __restrict__ acc) {
  for_channels(
      g, k, n,
      [&](int64_t i, int64_t len, int64_t c) {
        float s = 0.0f;  // <= kBlock terms in fp32, then fp64 across blocks and threads
        for (int64_t j = 0; j < len; ++j) s += d[i + j];
        acc[c] += s;
      },
      [&](int64_t i, int64_t len, int64_t c) {
        for (int64_t j = 0; j < len; ++j) acc[c + j] += d[i + j];
      });
}

// ---------------------------------------------------------------------------
// Threads: one contiguous, cache-line aligned range of elements each.

int threads_for(int64_t numel) {
  int t = 1;
#ifdef _OPENMP
  t = omp_get_max_threads();
#endif
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(t, numel / kMinPerThread)));
}

template <class Body>
void parallel(int64_t numel, int threads, Body body) {
  const int64_t per = (numel + threads - 1) / threads;
  const int64_t chunk = (per + kAlign - 1) / kAlign * kAlign;
  auto one = [&](int t) {
    const int64_t lo = std::min(numel, t * chunk), hi = std::min(numel, lo + chunk);
    if (lo < hi) body(t, lo, hi);
  };
  if (threads == 1) {
    one(0);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  one(omp_get_thread_num());
#else
  for (int t = 0; t < threads; ++t) one(t);
#endif
}

// ---------------------------------------------------------------------------
// Checks.

DType dtype_of(const Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return DType::F32;
    case ScalarType::BFloat16: return DType::BF16;
    case ScalarType::Half: return DType::F16;
    default: break;
  }
  STD_TORCH_CHECK(false, op, ": ", name, " must be float32, bfloat16 or float16, got ",
                  torch::headeronly::toString(t.scalar_type()));
  return DType::F32;
}

void check_cpu(const Tensor& t, const char* op, const char* name, int64_t numel) {
  STD_TORCH_CHECK(t.is_cpu(), op, ": ", name, " must be a CPU tensor, got ", device_name(t));
  STD_TORCH_CHECK(t.numel() == numel, op, ": ", name, " has ", t.numel(), " elements, expected ", numel);
}

const float* check_f32(const std::optional<Tensor>& t, const char* op, const char* name, int64_t n) {
  if (!t) return nullptr;
  check_cpu(*t, op, name, n);
  STD_TORCH_CHECK(t->scalar_type() == ScalarType::Float && t->is_contiguous(), op, ": ", name,
                  " must be a contiguous float32 tensor");
  return static_cast<const float*>(t->data_ptr());
}

Params params(const char* op, int64_t channels, int64_t inner, int64_t act, int64_t ref, double alpha,
              double gain, double clamp, double clamp_ref) {
  STD_TORCH_CHECK(channels >= 1 && inner >= 1, op, ": channels and inner must be >= 1, got ", channels,
                  " and ", inner);
  STD_TORCH_CHECK(act >= 1 && act <= kNumActs, op, ": unknown activation id ", act);
  STD_TORCH_CHECK(ref >= 0 && ref <= 2, op, ": ref must be 0 (none), 1 (y) or 2 (x), got ", ref);
  const float g = static_cast<float>(gain);
  return {static_cast<int>(act), static_cast<int>(ref), static_cast<float>(alpha), g,
          g != 0.0f ? 1.0f / g : 0.0f, static_cast<float>(clamp), static_cast<float>(clamp_ref), clamp >= 0};
}

// ---------------------------------------------------------------------------
// forward

void forward_impl(DType d, const void* x, const float* b, void* y, int64_t numel, Geometry g, const Params& p) {
  const FwdLoop loop = OPFORGE_NS::fwd_loop_for(p.act);
  const LoadFn load = OPFORGE_NS::load_for(d);
  const StoreFn store = OPFORGE_NS::store_for(d);
  parallel(numel, threads_for(numel), [&](int, int64_t lo, int64_t hi) {
    alignas(64) float buf[kBlock];
    for (int64_t k = lo; k < hi; k += kBlock) {
      const int64_t n = std::min(kBlock, hi - k);
      load(x, k, n, buf);
      if (b) add_bias(g, k, n, b, buf);
      loop(buf, (n + W - 1) / W, p);
      store(y, k, n, buf);
    }
  });
}

void forward(Tensor x, std::optional<Tensor> b, Tensor y, int64_t channels, int64_t inner, int64_t act,
             double alpha, double gain, double clamp) {
  const char* op = "bias_act forward";
  const Params p = params(op, channels, inner, act, 0, alpha, gain, clamp, -1.0);
  const int64_t n = x.numel();
  check_cpu(x, op, "x", n);
  check_cpu(y, op, "y", n);
  const DType d = dtype_of(x, op, "x");
  STD_TORCH_CHECK(dtype_of(y, op, "y") == d, op, ": x and y must have the same dtype");
  const float* bp = check_f32(b, op, "b", channels);
  const Geometry g{channels, inner};
  if (n == 0) return;
  forward_impl(d, x.data_ptr(), bp, y.data_ptr(), n, g, p);
}

// ---------------------------------------------------------------------------
// backward (ORDER 1) and backward2 (ORDER 2): out = s * dy * ..., s only for ORDER 2.

void grad_impl(DType dt, const void* s, const void* dy, const void* ref, const float* b, void* out, float* db,
               int64_t numel, Geometry g, const Params& p, GradLoop loop) {
  const int threads = threads_for(numel);
  const LoadFn load = OPFORGE_NS::load_for(dt);
  const StoreFn store = OPFORGE_NS::store_for(dt);
  std::vector<double> acc(db ? static_cast<size_t>(threads) * g.channels : 0, 0.0);
  parallel(numel, threads, [&](int t, int64_t lo, int64_t hi) {
    alignas(64) float gb[kBlock], rb[kBlock], sb[kBlock];
    double* mine = db ? acc.data() + static_cast<size_t>(t) * g.channels : nullptr;
    for (int64_t k = lo; k < hi; k += kBlock) {
      const int64_t n = std::min(kBlock, hi - k), nv = (n + W - 1) / W;
      load(dy, k, n, gb);
      if (s) {
        load(s, k, n, sb);
        for (int64_t i = 0; i < nv * W; ++i) gb[i] *= sb[i];
      }
      if (ref) {
        load(ref, k, n, rb);
        if (p.ref == kRefX && b) add_bias(g, k, n, b, rb);
      }
      loop(gb, rb, nv, p);
      store(out, k, n, gb);
      if (mine) add_sums(g, k, n, gb, mine);
    }
  });
  if (db) {
    for (int64_t c = 0; c < g.channels; ++c) {
      double sum = 0.0;
      for (int t = 0; t < threads; ++t) sum += acc[static_cast<size_t>(t) * g.channels + c];
      db[c] = static_cast<float>(sum);
    }
  }
}

template <int ORDER>
void grad(const char* op, const std::optional<Tensor>& s, const Tensor& dy, const std::optional<Tensor>& ref,
          const std::optional<Tensor>& b, const Tensor& out, const std::optional<Tensor>& db, int64_t channels,
          int64_t inner, int64_t act, int64_t ref_kind, double alpha, double gain, double clamp,
          double clamp_ref) {
  const Params p = params(op, channels, inner, act, ref_kind, alpha, gain, clamp, clamp_ref);
  const GradLoop loop = ORDER == 1 ? OPFORGE_NS::grad1_loop_for(p.act, p.ref) : OPFORGE_NS::grad2_loop_for(p.act, p.ref);
  STD_TORCH_CHECK(loop != nullptr, op, ": activation id ", act, " has no ", ORDER == 1 ? "first" : "second",
                  " derivative kernel from ref ", ref_kind);
  const int64_t n = dy.numel();
  check_cpu(dy, op, "dy", n);
  check_cpu(out, op, "out", n);
  const DType d = dtype_of(dy, op, "dy");
  STD_TORCH_CHECK(dtype_of(out, op, "out") == d, op, ": dy and the output must have the same dtype");
  if (s) {
    check_cpu(*s, op, "s", n);
    STD_TORCH_CHECK(dtype_of(*s, op, "s") == d, op, ": s and dy must have the same dtype");
  }
  STD_TORCH_CHECK(ref.has_value() == (p.ref != kRefNone), op, ": ref must be given exactly when ref_kind is 1 or 2");
  if (ref) {
    check_cpu(*ref, op, "ref", n);
    STD_TORCH_CHECK(dtype_of(*ref, op, "ref") == d, op, ": ref and dy must have the same dtype");
  }
  const float* bp = check_f32(b, op, "b", channels);
  float* dbp = const_cast<float*>(check_f32(db, op, "db", channels));
  const Geometry g{channels, inner};
  if (n == 0) {
    for (int64_t c = 0; dbp && c < channels; ++c) dbp[c] = 0.0f;
    return;
  }
  const void* sp = s ? s->data_ptr() : nullptr;
  const void* rp = ref ? ref->data_ptr() : nullptr;
  grad_impl(d, sp, dy.data_ptr(), rp, bp, out.data_ptr(), dbp, n, g, p, loop);
}

void backward(Tensor dy, std::optional<Tensor> ref, std::optional<Tensor> b, Tensor dx, std::optional<Tensor> db,
              int64_t channels, int64_t inner, int64_t act, int64_t ref_kind, double alpha, double gain,
              double clamp, double clamp_ref) {
  grad<1>("bias_act backward", std::nullopt, dy, ref, b, dx, db, channels, inner, act, ref_kind, alpha, gain,
          clamp, clamp_ref);
}

void backward2(Tensor s, Tensor dy, std::optional<Tensor> ref, std::optional<Tensor> b, Tensor out,
               std::optional<Tensor> db, int64_t channels, int64_t inner, int64_t act, int64_t ref_kind,
               double alpha, double gain, double clamp, double clamp_ref) {
  grad<2>("bias_act backward2", s, dy, ref, b, out, db, channels, inner, act, ref_kind, alpha, gain, clamp,
          clamp_ref);
}

int64_t simd_width() { return W; }

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  OPFORGE_BIAS_ACT_DEF(m);
  m.def("simd_width() -> int");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  OPFORGE_BIAS_ACT_IMPL(m);
  m.impl("simd_width", TORCH_BOX(&simd_width));
}
