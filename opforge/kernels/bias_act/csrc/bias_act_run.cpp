// bias_act's CPU ops on raw arrays, as bias_act.cpp hands them over: the argument checks
// (each failure a message that says what was expected), then the walk. Each OpenMP thread
// takes one contiguous range of elements and walks it in blocks of kBlock elements: load
// (converting to fp32) into stack buffers, add the bias run by run, apply one activation's
// loop (bias_act_loops.cpp, chosen per call, not per element), store, and for db add each
// run's sum into the thread's fp64 accumulators, summed over threads at the end in a fixed
// order. No torch headers (see bias_act_cpu.h).

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bias_act_cpu.h"
#include "bias_act_math.h"
#include "bias_act_vec.h"

namespace opforge_bias_act {
namespace {

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
// Checks: each returns "" or the message; the first failure wins.

// printf into a std::string: one call per message keeps this file quick to compile (the
// same messages as chains of std::string + cost a second of -O3 code generation here).
__attribute__((format(printf, 1, 2))) std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

using ll = long long;

std::string check_cpu(const char* op, const char* name, const Arg& t, int64_t numel) {
  if (!t.cpu) return fmt("%s: %s must be a CPU tensor, got %s", op, name, t.device.c_str());
  if (t.numel != numel) return fmt("%s: %s has %lld elements, expected %lld", op, name, ll(t.numel), ll(numel));
  return {};
}

std::string check_dtype(const char* op, const char* name, const Arg& t, const char* like, int dtype) {
  if (t.dtype < 0) return fmt("%s: %s must be float32, bfloat16 or float16, got %s", op, name, t.dtype_name);
  if (t.dtype != dtype) return fmt("%s: %s must have the dtype of %s", op, name, like);
  return {};
}

// b and db: `channels` contiguous float32 elements on the CPU, or absent.
std::string check_f32(const char* op, const char* name, const Arg& t, int64_t channels) {
  if (!t.present) return {};
  std::string e = check_cpu(op, name, t, channels);
  if (e.empty() && (t.dtype != static_cast<int>(DType::F32) || !t.contiguous))
    e = fmt("%s: %s must be a contiguous float32 tensor", op, name);
  return e;
}

std::string make_params(const char* op, int64_t channels, int64_t inner, int64_t act, int64_t ref, double alpha,
                        double gain, double clamp, double clamp_ref, Params& p) {
  if (channels < 1 || inner < 1)
    return fmt("%s: channels and inner must be >= 1, got %lld and %lld", op, ll(channels), ll(inner));
  if (act < 1 || act > kNumActs) return fmt("%s: unknown activation id %lld", op, ll(act));
  if (ref < 0 || ref > 2) return fmt("%s: ref must be 0 (none), 1 (y) or 2 (x), got %lld", op, ll(ref));
  if (!(std::fabs(alpha) <= FLT_MAX && (gain == 0.0 || (std::fabs(gain) >= FLT_MIN && std::fabs(gain) <= FLT_MAX))))
    return fmt("%s: alpha must be within float32's range and gain 0 or a normal float32 magnitude (the derivatives "
               "divide by it), got %g and %g", op, alpha, gain);
  const float g = static_cast<float>(gain);
  p = {static_cast<int>(act),    static_cast<int>(ref),       static_cast<float>(alpha), g,
       g != 0.0f ? 1.0f / g : 0.0f, static_cast<float>(clamp), static_cast<float>(clamp_ref), clamp >= 0};
  return {};
}

}  // namespace

// ---------------------------------------------------------------------------
// forward

void OPFORGE_NS::forward(DType d, const void* x, const float* b, void* y, int64_t numel, int64_t channels,
                         int64_t inner, const Params& p) {
  const Geometry g{channels, inner};
  const FwdLoop loop = fwd_loop_for(p.act);
  const LoadFn load = load_for(d);
  const StoreFn store = store_for(d);
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

// ---------------------------------------------------------------------------
// backward (first order: s null) and backward2: out = [s *] dy * ...

void OPFORGE_NS::grad(DType d, const void* s, const void* dy, const void* ref, const float* b, void* out,
                      float* db, int64_t numel, int64_t channels, int64_t inner, const Params& p, GradLoop loop) {
  const Geometry g{channels, inner};
  const int threads = threads_for(numel);
  const LoadFn load = load_for(d);
  const StoreFn store = store_for(d);
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

int OPFORGE_NS::simd_width() { return W; }

// ---------------------------------------------------------------------------
// The ops: checks, then the walk.

std::string OPFORGE_NS::forward_op(const Arg& x, const Arg& b, const Arg& y, int64_t channels, int64_t inner,
                                   int64_t act, double alpha, double gain, double clamp) {
  const char* op = "bias_act forward";
  Params p{};
  std::string e = make_params(op, channels, inner, act, 0, alpha, gain, clamp, -1.0, p);
  if (e.empty()) e = check_cpu(op, "x", x, x.numel);
  if (e.empty()) e = check_cpu(op, "y", y, x.numel);
  if (e.empty()) e = check_dtype(op, "x", x, "x", x.dtype);
  if (e.empty()) e = check_dtype(op, "y", y, "x", x.dtype);
  if (e.empty()) e = check_f32(op, "b", b, channels);
  if (!e.empty() || x.numel == 0) return e;
  forward(static_cast<DType>(x.dtype), x.data, b.present ? static_cast<const float*>(b.data) : nullptr, y.data,
          x.numel, channels, inner, p);
  return {};
}

std::string OPFORGE_NS::grad_op(int order, const Arg& s, const Arg& dy, const Arg& ref, const Arg& b,
                                const Arg& out, const Arg& db, int64_t channels, int64_t inner, int64_t act,
                                int64_t ref_kind, double alpha, double gain, double clamp, double clamp_ref) {
  const char* op = order == 1 ? "bias_act backward" : "bias_act backward2";
  Params p{};
  std::string e = make_params(op, channels, inner, act, ref_kind, alpha, gain, clamp, clamp_ref, p);
  if (!e.empty()) return e;
  const GradLoop loop = order == 1 ? grad1_loop_for(p.act, p.ref) : grad2_loop_for(p.act, p.ref);
  if (!loop)
    return fmt("%s: activation id %lld has no %s derivative kernel from ref %lld", op, ll(act),
               order == 1 ? "first" : "second", ll(ref_kind));
  const int64_t n = dy.numel;
  e = check_cpu(op, "dy", dy, n);
  if (e.empty()) e = check_cpu(op, "out", out, n);
  if (e.empty()) e = check_dtype(op, "dy", dy, "dy", dy.dtype);
  if (e.empty()) e = check_dtype(op, "out", out, "dy", dy.dtype);
  if (e.empty() && s.present) e = check_cpu(op, "s", s, n);
  if (e.empty() && s.present) e = check_dtype(op, "s", s, "dy", dy.dtype);
  if (e.empty() && ref.present != (p.ref != kRefNone))
    e = fmt("%s: ref must be given exactly when ref_kind is 1 or 2", op);
  if (e.empty() && ref.present) e = check_cpu(op, "ref", ref, n);
  if (e.empty() && ref.present) e = check_dtype(op, "ref", ref, "dy", dy.dtype);
  if (e.empty()) e = check_f32(op, "b", b, channels);
  if (e.empty()) e = check_f32(op, "db", db, channels);
  if (!e.empty()) return e;
  float* dbp = db.present ? static_cast<float*>(db.data) : nullptr;
  if (n == 0) {
    for (int64_t c = 0; dbp && c < channels; ++c) dbp[c] = 0.0f;
    return {};
  }
  grad(static_cast<DType>(dy.dtype), s.present ? s.data : nullptr, dy.data, ref.present ? ref.data : nullptr,
       b.present ? static_cast<const float*>(b.data) : nullptr, out.data, dbp, n, channels, inner, p, loop);
  return {};
}

}  // namespace opforge_bias_act
