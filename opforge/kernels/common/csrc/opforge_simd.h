// The SIMD layer of opforge's CPU kernels: which vector ISA this translation unit
// is compiled for (from the compiler's own macros: the -m flags of the variant),
// a vector type V of kSimdWidth fp32 lanes with the few operations kernels need,
// and loads/stores of fp32, bf16 and fp16 storage as fp32 vectors.
//
// Plain C++17 plus intrinsics, no torch headers, so a harness can run it anywhere
// (qemu included).
//
// Low-precision storage: bf16 loads are `bits << 16`; bf16 stores round to
// nearest-even and keep NaN a (quiet) NaN. fp16 uses the hardware conversions
// (F16C, AVX-512F, NEON), and a software IEEE conversion (round to nearest even,
// subnormals, inf, NaN) where none exists.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define OPFORGE_SIMD_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define OPFORGE_SIMD_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define OPFORGE_SIMD_NEON 1
#include <arm_neon.h>
#endif

namespace opforge_simd {

enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };

#if defined(OPFORGE_SIMD_AVX512)
constexpr int kSimdWidth = 16;
#elif defined(OPFORGE_SIMD_AVX2)
constexpr int kSimdWidth = 8;
#elif defined(OPFORGE_SIMD_NEON)
constexpr int kSimdWidth = 4;
#else
constexpr int kSimdWidth = 1;
#endif

// ---------------------------------------------------------------------------
// Scalar conversions (also the reference for the vector ones).

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; a NaN keeps its sign and top payload bits, made quiet.
inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline float f16_to_f32_soft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (man << 13));  // inf, NaN
  if (exp != 0) return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  // zero or subnormal: man * 2^-24, exact in fp32
  return bits_f32(sign | f32_bits(static_cast<float>(man) * 5.9604644775390625e-8f));
}

// Round to nearest even, with subnormals, overflow to inf, and quiet NaNs.
inline uint16_t f32_to_f16_soft(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((ax >> 13) & 0x3FFu);
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (or inf): inf
  if (ax >= 0x38800000u) {                       // >= 2^-14: a normal half
    uint32_t r = ax - (112u << 23);              // rebias the exponent 127 -> 15
    r += 0xFFFu + ((r >> 13) & 1u);              // carries into the exponent
    return sign | static_cast<uint16_t>(r >> 13);
  }
  const uint32_t e = ax >> 23;
  if (e < 102) return sign;  // < 2^-25: rounds to zero
  // subnormal: count units of 2^-24; value = man * 2^(e - 150)
  const uint32_t man = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t r = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // may reach 0x400: the smallest normal
  return sign | static_cast<uint16_t>(r);
}

// ---------------------------------------------------------------------------
// Per-ISA vector type V with the few operations the update needs, and loads /
// stores of W lanes of each storage dtype. `Full` means all W lanes; on
// AVX-512, `Part` carries the lane mask of a tail.

struct Full {};

#if defined(OPFORGE_SIMD_AVX512)
constexpr int W = 16;
using V = __m512;
struct Part { __mmask16 k; };
inline V vset(float x) { return _mm512_set1_ps(x); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
inline V vsqrt(V a) { return _mm512_sqrt_ps(a); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }  // a > b ? a : b

inline V ld32(const float* p, Full) { return _mm512_loadu_ps(p); }
inline V ld32(const float* p, Part t) { return _mm512_maskz_loadu_ps(t.k, p); }
inline void st32(float* p, V x, Full) { _mm512_storeu_ps(p, x); }
inline void st32(float* p, V x, Part t) { _mm512_mask_storeu_ps(p, t.k, x); }
inline __m256i ld16(const uint16_t* p, Full) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i ld16(const uint16_t* p, Part t) { return _mm256_maskz_loadu_epi16(t.k, p); }
inline void st16(uint16_t* p, __m256i x, Full) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x); }
inline void st16(uint16_t* p, __m256i x, Part t) { _mm256_mask_storeu_epi16(p, t.k, x); }

inline V from_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m256i to_bf16(V f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
inline V from_f16(__m256i h) { return _mm512_cvtph_ps(h); }
inline __m256i to_f16(V f) { return _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#elif defined(OPFORGE_SIMD_AVX2)
constexpr int W = 8;
using V = __m256;
inline V vset(float x) { return _mm256_set1_ps(x); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vsqrt(V a) { return _mm256_sqrt_ps(a); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }

inline V ld32(const float* p, Full) { return _mm256_loadu_ps(p); }
inline void st32(float* p, V x, Full) { _mm256_storeu_ps(p, x); }
inline __m128i ld16(const uint16_t* p, Full) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void st16(uint16_t* p, __m128i x, Full) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x); }

inline V from_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m128i to_bf16(V f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i hi = _mm256_srli_epi32(x, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)),
                                        _mm256_set1_epi32(0x7FFF));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  const __m256i q = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // every lane is <= 0xFFFF, so the unsigned-saturating pack is exact
  return _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
}
#if defined(__F16C__)
inline V from_f16(__m128i h) { return _mm256_cvtph_ps(h); }
inline __m128i to_f16(V f) { return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
#else
inline V from_f16(__m128i h) {
  alignas(32) uint16_t in[8];
  alignas(32) float out[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(in), h);
  for (int j = 0; j < 8; ++j) out[j] = f16_to_f32_soft(in[j]);
  return _mm256_load_ps(out);
}
inline __m128i to_f16(V f) {
  alignas(32) float in[8];
  alignas(32) uint16_t out[8];
  _mm256_store_ps(in, f);
  for (int j = 0; j < 8; ++j) out[j] = f32_to_f16_soft(in[j]);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(out));
}
#endif

#elif defined(OPFORGE_SIMD_NEON)
constexpr int W = 4;
using V = float32x4_t;
inline V vset(float x) { return vdupq_n_f32(x); }
inline V vmul(V a, V b) { return vmulq_f32(a, b); }
inline V vdiv(V a, V b) { return vdivq_f32(a, b); }
inline V vfma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
inline V vsqrt(V a) { return vsqrtq_f32(a); }
inline V vmax(V a, V b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }  // a > b ? a : b, as x86

inline V ld32(const float* p, Full) { return vld1q_f32(p); }
inline void st32(float* p, V x, Full) { vst1q_f32(p, x); }
inline uint16x4_t ld16(const uint16_t* p, Full) { return vld1_u16(p); }
inline void st16(uint16_t* p, uint16x4_t x, Full) { vst1_u16(p, x); }

inline V from_bf16(uint16x4_t h) { return vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(h), 16)); }
inline uint16x4_t to_bf16(V f) {
  const uint32x4_t x = vreinterpretq_u32_f32(f);
  const uint32x4_t hi = vshrq_n_u32(x, 16);
  const uint32x4_t bias = vaddq_u32(vandq_u32(hi, vdupq_n_u32(1)), vdupq_n_u32(0x7FFF));
  const uint32x4_t r = vshrq_n_u32(vaddq_u32(x, bias), 16);
  const uint32x4_t num = vceqq_f32(f, f);  // all ones where not NaN
  return vmovn_u32(vbslq_u32(num, r, vorrq_u32(hi, vdupq_n_u32(0x40))));
}
inline V from_f16(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
inline uint16x4_t to_f16(V f) { return vreinterpret_u16_f16(vcvt_f16_f32(f)); }

#else
constexpr int W = 1;
using V = float;
inline V vset(float x) { return x; }
inline V vmul(V a, V b) { return a * b; }
inline V vdiv(V a, V b) { return a / b; }
inline V vfma(V a, V b, V c) { return a * b + c; }
inline V vsqrt(V a) { return std::sqrt(a); }
inline V vmax(V a, V b) { return a > b ? a : b; }

inline V ld32(const float* p, Full) { return *p; }
inline void st32(float* p, V x, Full) { *p = x; }
inline uint16_t ld16(const uint16_t* p, Full) { return *p; }
inline void st16(uint16_t* p, uint16_t x, Full) { *p = x; }

inline V from_bf16(uint16_t h) { return bf16_to_f32(h); }
inline uint16_t to_bf16(V f) { return f32_to_bf16(f); }
inline V from_f16(uint16_t h) { return f16_to_f32_soft(h); }
inline uint16_t to_f16(V f) { return f32_to_f16_soft(f); }
#endif

static_assert(W == kSimdWidth, "lane count mismatch");

// W lanes of dtype D at element i of base, as fp32.
template <DType D, class L>
inline V load(const void* base, int64_t i, L lanes) {
  if constexpr (D == DType::F32) {
    return ld32(static_cast<const float*>(base) + i, lanes);
  } else if constexpr (D == DType::BF16) {
    return from_bf16(ld16(static_cast<const uint16_t*>(base) + i, lanes));
  } else {
    return from_f16(ld16(static_cast<const uint16_t*>(base) + i, lanes));
  }
}

template <DType D, class L>
inline void store(void* base, int64_t i, V x, L lanes) {
  if constexpr (D == DType::F32) {
    st32(static_cast<float*>(base) + i, x, lanes);
  } else if constexpr (D == DType::BF16) {
    st16(static_cast<uint16_t*>(base) + i, to_bf16(x), lanes);
  } else {
    st16(static_cast<uint16_t*>(base) + i, to_f16(x), lanes);
  }
}

// The value a store of x as dtype D then a load would give.
template <DType D>
inline V round_to(V x) {
  if constexpr (D == DType::F32) return x;
  else if constexpr (D == DType::BF16) return from_bf16(to_bf16(x));
  else return from_f16(to_f16(x));
}

}  // namespace opforge_simd
