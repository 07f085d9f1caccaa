// The CPU math of bias_act: a GCC vector of W fp32 lanes (VF) and the policy VecMath that
// bias_act_math.h's formulas are instantiated with. W follows the ISA flags of the variant
// (16 for AVX-512, 8 for AVX2, 4 otherwise: SSE2 on x86-64, NEON on aarch64), and the
// compiler emits that ISA's instructions for the generic vector code.
//
// exp, expm1, log1p, tanh and erfc are branch-free (every lane computes every path, a select
// keeps one), accurate to a few fp32 ulps, and keep NaN a NaN:
// * exp: Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on |r| <= ln2/2
//   (truncation < 6e-9 relative), the power of two built in the exponent bits;
// * expm1: a degree-8 Taylor polynomial below |x| < 1/2 (no cancellation), else exp - 1;
// * log1p(u), u >= 0: log(1 + u) scaled by u / ((1 + u) - 1), which cancels the rounding
//   of 1 + u; log by mantissa/exponent split and the atanh series on [sqrt(1/2), sqrt(2));
// * tanh: -expm1(-2|x|) / (expm1(-2|x|) + 2), sign restored (exact to within the expm1);
// * erfc: the Chebyshev fit of Numerical Recipes (erfcc: fractional error < 1.2e-7 for all
//   x), i.e. t exp(-z^2 + P(t)), t = 1 / (1 + z/2).
//
// Only GCC/Clang vector extensions: no intrinsics, no torch headers.

#pragma once

#include <cstdint>
#include <cstring>

namespace opforge_bias_act {

#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX2__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif

typedef float VF __attribute__((vector_size(4 * W)));
typedef int32_t VI __attribute__((vector_size(4 * W)));

template <class To, class From>
inline To bitcast(From f) {
  static_assert(sizeof(To) == sizeof(From), "size mismatch");
  To t;
  std::memcpy(&t, &f, sizeof(To));
  return t;
}

inline VF splat(float x) { return VF{} + x; }
inline VF vabs(VF x) { return bitcast<VF>(bitcast<VI>(x) & 0x7FFFFFFF); }

inline VF vexp(VF x) {
  const VF hi = splat(88.3762626647949f), lo = splat(-87.3365478515625f);  // keep 2^n normal
  const VF xc = x > hi ? hi : (x < lo ? lo : x);                             // NaN passes
  const VF t = xc * 1.44269504088896341f;
  const VI n = __builtin_convertvector(t + (t < 0.0f ? splat(-0.5f) : splat(0.5f)), VI);
  const VF nf = __builtin_convertvector(n, VF);
  const VF r = xc - nf * 0.693359375f + nf * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12e-4
  VF p = splat(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const VF y = p * bitcast<VF>((n + 127) << 23);
  const VF inf = splat(__builtin_inff());
  return x > hi ? inf : (x < lo ? VF{} : y);
}

inline VF vexpm1(VF x) {
  VF p = splat(1.0f / 40320);
  p = p * x + 1.0f / 5040;
  p = p * x + 1.0f / 720;
  p = p * x + 1.0f / 120;
  p = p * x + 1.0f / 24;
  p = p * x + 1.0f / 6;
  p = p * x + 0.5f;
  const VF small = (p * x) * x + x;
  return vabs(x) < 0.5f ? small : vexp(x) - 1.0f;
}

// log(w) for w >= 1 (finite) or +inf.
inline VF vlog_ge1(VF w) {
  const VI bits = bitcast<VI>(w);
  VI e = ((bits >> 23) & 0xFF) - 127;
  VF m = bitcast<VF>((bits & 0x7FFFFF) | 0x3F800000);  // [1, 2)
  const VI big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = e - big;  // big is -1 where set
  const VF s = (m - 1.0f) / (m + 1.0f);
  const VF z = s * s;
  VF p = splat(1.0f / 11);
  p = p * z + 1.0f / 9;
  p = p * z + 1.0f / 7;
  p = p * z + 1.0f / 5;
  p = p * z + 1.0f / 3;
  p = p * z + 1.0f;
  const VF ef = __builtin_convertvector(e, VF);
  const VF r = ef * 0.693359375f + ((s + s) * p - ef * 2.12194440e-4f);
  return w == __builtin_inff() ? w : r;
}

inline VF vlog1p(VF u) {  // u >= 0
  const VF w = u + 1.0f;
  const VF d = w - 1.0f;
  return d == 0.0f ? u : vlog_ge1(w) * (u / d);
}

inline VF vtanh(VF x) {
  const VF ax = vabs(x);
  const VF e = vexpm1((ax > 9.0f ? splat(9.0f) : ax) * -2.0f);
  const VF t = -e / (e + 2.0f);
  return bitcast<VF>(bitcast<VI>(t) | (bitcast<VI>(x) & static_cast<int32_t>(0x80000000u)));
}

inline VF verfc(VF x) {
  const VF z = vabs(x);
  const VF t = 1.0f / (z * 0.5f + 1.0f);
  VF p = splat(0.17087277f);
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const VF r = t * vexp(p - z * z);
  return x < 0.0f ? 2.0f - r : r;
}

struct VecMath {
  static VF exp(VF x) { return vexp(x); }
  static VF expm1(VF x) { return vexpm1(x); }
  static VF log1p(VF x) { return vlog1p(x); }
  static VF tanh(VF x) { return vtanh(x); }
  static VF erfc(VF x) { return verfc(x); }
  static VF sel(VI m, VF a, VF b) { return m ? a : b; }
  static VF zero() { return VF{}; }
  static VF one() { return splat(1.0f); }
};

}  // namespace opforge_bias_act
