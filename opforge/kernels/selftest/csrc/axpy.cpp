// opforge self-test kernel: out = alpha * x + y, on CPU float32 tensors.
//
// A deliberately tiny op that opforge's `doctor`/`build` commands and its AOT
// tests compile once per ISA (AVX-512, AVX2+FMA, NEON, scalar) to prove that a
// per-ISA, LibTorch *stable ABI* build works end to end: compile, link, load,
// register ops, dispatch, compute, and report errors as Python exceptions.
//
// Only stable-ABI headers are used (no ATen, no pybind11, no Python.h), and the
// file is meant to be compiled with -DTORCH_TARGET_VERSION=0x020a000000000000,
// so one binary loads on torch 2.10 and every later 2.x release.
//
// Ops, registered under the namespace given by -DOPFORGE_NS=<name>:
//   axpy(Tensor x, Tensor y, float alpha) -> Tensor
//   simd_width() -> int    floats per vector of the ISA this TU was built for
//
// The vector path is picked by the compiler's predefined ISA macros, so the
// same source yields each variant from its -m flags.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "opforge_stable.h"

#include <cstdint>
#include <string>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__ARM_NEON) || defined(__aarch64__)
#include <arm_neon.h>
#endif

#ifndef OPFORGE_NS
#define OPFORGE_NS opforge_selftest
#endif

namespace {

using opforge_stable::device_name;
using opforge_stable::shape_str;

using torch::stable::Tensor;

#if defined(__AVX512F__)
constexpr int64_t kSimdWidth = 16;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kSimdWidth = 8;
#elif defined(__ARM_NEON) || defined(__aarch64__)
constexpr int64_t kSimdWidth = 4;
#else
constexpr int64_t kSimdWidth = 1;
#endif

// out[i] = a * x[i] + y[i] for i in [0, n). out may not alias x or y.
void axpy_kernel(const float* x, const float* y, float* out, int64_t n, float a) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 va = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i),
                                              _mm512_loadu_ps(y + i)));
  }
  if (i < n) {  // masked tail: 1..15 elements, no out-of-bounds access
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 vx = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 vy = _mm512_maskz_loadu_ps(m, y + i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_fmadd_ps(va, vx, vy));
  }
  return;
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
                                              _mm256_loadu_ps(y + i)));
  }
#elif defined(__ARM_NEON) || defined(__aarch64__)
  const float32x4_t va = vdupq_n_f32(a);
  for (; i + 4 <= n; i += 4) {
    vst1q_f32(out + i, vfmaq_f32(vld1q_f32(y + i), va, vld1q_f32(x + i)));
  }
#endif
  for (; i < n; ++i) {  // scalar tail (or the whole loop in the scalar build)
    out[i] = a * x[i] + y[i];
  }
}

void check_input(const Tensor& t, const char* name) {
  STD_TORCH_CHECK(t.is_cpu(), "axpy: ", name, " must be a CPU tensor, got ",
                  device_name(t));
  STD_TORCH_CHECK(t.layout() == torch::headeronly::Layout::Strided, "axpy: ",
                  name, " must be a dense (strided) tensor");
  STD_TORCH_CHECK(t.scalar_type() == torch::headeronly::ScalarType::Float,
                  "axpy: ", name, " must be float32, got ",
                  torch::headeronly::toString(t.scalar_type()));
}

Tensor axpy(Tensor x, Tensor y, double alpha) {
  check_input(x, "x");
  check_input(y, "y");
  const auto xs = x.sizes();
  const auto ys = y.sizes();
  bool same = xs.size() == ys.size();
  for (size_t d = 0; same && d < xs.size(); ++d) same = xs[d] == ys[d];
  STD_TORCH_CHECK(same, "axpy: x and y must have the same shape, got x ",
                  shape_str(xs), " and y ", shape_str(ys));

  const Tensor xc = torch::stable::contiguous(x);
  const Tensor yc = torch::stable::contiguous(y);
  Tensor out = torch::stable::empty_like(xc);  // contiguous, like xc
  axpy_kernel(xc.const_data_ptr<float>(), yc.const_data_ptr<float>(),
              out.mutable_data_ptr<float>(), xc.numel(),
              static_cast<float>(alpha));
  return out;
}

int64_t simd_width() {
  return kSimdWidth;
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("axpy(Tensor x, Tensor y, float alpha) -> Tensor");
  m.def("simd_width() -> int");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  m.impl("axpy", TORCH_BOX(&axpy));
  m.impl("simd_width", TORCH_BOX(&simd_width));
}
