// STREAM triad for bench/cpu_adam.py: a[i] = b[i] + s * c[i] over float32 CPU tensors.
//
// Built by opforge's engine on the LibTorch stable ABI (-DTORCH_TARGET_VERSION, added by
// the engine), with -O3 -fopenmp and the ISA flags the bench script picks for this CPU.
// The elements are split in 64-element-aligned chunks, one per OpenMP thread, as the
// cpu_adam kernel splits its work, so both see the same thread-to-memory layout.
//
// Ops, registered under the namespace given by -DOPFORGE_NS=<name>:
//   triad(Tensor(a!) a, Tensor b, Tensor c, float s, int num_threads, bool streaming) -> ()
//     streaming: non-temporal stores to a (AVX-512/AVX2 builds; a must be 64-byte
//     aligned), which skip the write-allocate read of a.
//   adam_traffic(Tensor(a!) p, Tensor g, Tensor(b!) m, Tensor(c!) v, int num_threads) -> ()
//     p += g, m += g, v += g: Adam's memory traffic (read p, g, m, v; write p, m, v:
//     28 B/element) with next to no arithmetic, split over threads as cpu_adam splits
//     its work. Its GB/s is the ceiling an Adam step on this machine can reach.
//   simd_width() -> int    floats per vector of the ISA this TU was built for

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "opforge_stable.h"

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#ifndef OPFORGE_NS
#define OPFORGE_NS bench_triad
#endif

namespace {

using torch::stable::Tensor;

#if defined(__AVX512F__)
constexpr int64_t kSimdWidth = 16;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kSimdWidth = 8;
#else
constexpr int64_t kSimdWidth = 1;
#endif

// a[i] = b[i] + s * c[i] for i in [0, n).
void triad_chunk(float* a, const float* b, const float* c, int64_t n, float s, bool streaming) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(s);
  if (streaming) {
    for (; i + 16 <= n; i += 16)
      _mm512_stream_ps(a + i, _mm512_fmadd_ps(vs, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
    _mm_sfence();
  } else {
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(a + i, _mm512_fmadd_ps(vs, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 vs = _mm256_set1_ps(s);
  if (streaming) {
    for (; i + 8 <= n; i += 8)
      _mm256_stream_ps(a + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
    _mm_sfence();
  } else {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(a + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
  }
#else
  (void)streaming;
#endif
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

// p += g, m += g, v += g for i in [0, n).
void traffic_chunk(float* p, const float* g, float* m, float* v, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 vg = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), vg));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), vg));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), vg));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) {
    const __m256 vg = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), vg));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), vg));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), vg));
  }
#endif
  for (; i < n; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

// Runs fn(begin, end) over [0, n) in 64-element-aligned chunks, one per thread.
template <class Fn>
void split(int64_t n, int64_t num_threads, Fn fn) {
#ifdef _OPENMP
#pragma omp parallel num_threads(static_cast<int>(num_threads))
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t chunk = ((n + nt - 1) / nt + 63) / 64 * 64;  // keeps each chunk 64-byte aligned
    const int64_t b = std::min(n, tid * chunk), e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
  }
#else
  (void)num_threads;
  fn(0, n);
#endif
}

void check(const Tensor& t, const char* name, int64_t n) {
  STD_TORCH_CHECK(t.is_cpu() && t.is_contiguous(), "bench_triad: ", name, " must be a contiguous CPU tensor");
  STD_TORCH_CHECK(t.scalar_type() == torch::headeronly::ScalarType::Float, "bench_triad: ", name,
                  " must be float32");
  STD_TORCH_CHECK(t.numel() == n, "bench_triad: ", name, " must have ", n, " elements, got ", t.numel());
}

void triad(Tensor a, Tensor b, Tensor c, double s, int64_t num_threads, bool streaming) {
  const int64_t n = a.numel();
  check(a, "a", n);
  check(b, "b", n);
  check(c, "c", n);
  STD_TORCH_CHECK(num_threads >= 1, "triad: num_threads must be >= 1, got ", num_threads);
  float* pa = static_cast<float*>(a.mutable_data_ptr());
  const float* pb = static_cast<const float*>(b.const_data_ptr());
  const float* pc = static_cast<const float*>(c.const_data_ptr());
  STD_TORCH_CHECK(!streaming || reinterpret_cast<uintptr_t>(pa) % 64 == 0,
                  "triad: streaming stores need a 64-byte aligned a");
  const float fs = static_cast<float>(s);
  split(n, num_threads, [&](int64_t b, int64_t e) { triad_chunk(pa + b, pb + b, pc + b, e - b, fs, streaming); });
}

void adam_traffic(Tensor p, Tensor g, Tensor m, Tensor v, int64_t num_threads) {
  const int64_t n = p.numel();
  check(p, "p", n);
  check(g, "g", n);
  check(m, "m", n);
  check(v, "v", n);
  STD_TORCH_CHECK(num_threads >= 1, "adam_traffic: num_threads must be >= 1, got ", num_threads);
  float* pp = static_cast<float*>(p.mutable_data_ptr());
  const float* pg = static_cast<const float*>(g.const_data_ptr());
  float* pm = static_cast<float*>(m.mutable_data_ptr());
  float* pv = static_cast<float*>(v.mutable_data_ptr());
  split(n, num_threads, [&](int64_t b, int64_t e) { traffic_chunk(pp + b, pg + b, pm + b, pv + b, e - b); });
}

int64_t simd_width() { return kSimdWidth; }

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("triad(Tensor(a!) a, Tensor b, Tensor c, float s, int num_threads, bool streaming) -> ()");
  m.def("adam_traffic(Tensor(a!) p, Tensor g, Tensor(b!) m, Tensor(c!) v, int num_threads) -> ()");
  m.def("simd_width() -> int");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  m.impl("triad", TORCH_BOX(&triad));
  m.impl("adam_traffic", TORCH_BOX(&adam_traffic));
  m.impl("simd_width", TORCH_BOX(&simd_width));
}
