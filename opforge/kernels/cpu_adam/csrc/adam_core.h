// opforge CPU Adam/AdamW: the numeric core.
//
// Plain C++17 plus intrinsics, no torch headers, so a tiny harness can build
// and run it anywhere (qemu included). The op in cpu_adam.cpp checks inputs,
// splits [0, n) into chunks across OpenMP threads and calls adam_update() on
// each chunk; this file allocates nothing and starts no threads.
//
// Per element, in fp32, exactly as torch.optim.Adam / AdamW (single tensor):
//   g = grad * grad_mul; if maximize: g = -g
//   if !adamw and weight_decay != 0: g += weight_decay * p
//   if adamw: p *= 1 - lr * weight_decay
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   d = amsgrad ? (vmax = max(vmax, v)) : v
//   p = p - step_size * m / (sqrt(d) * bc2_sqrt_inv + eps)
//
// The vector path is picked by the compiler's predefined ISA macros:
//   AVX-512 F+BW+VL  16 lanes, masked tails
//   AVX2 + FMA        8 lanes (+F16C for fp16 when present)
//   aarch64 NEON      4 lanes
//   otherwise         scalar (the compiler may auto-vectorise)
// Partial vectors (AVX2, NEON) go through the same vector code on a small
// stack buffer, so every element of a tensor is rounded the same way.
//
// Low-precision storage: bf16 loads are `bits << 16`; bf16 stores round to
// nearest-even and keep NaN a (quiet) NaN. fp16 uses the hardware conversions
// (F16C, AVX-512F, NEON), and a software IEEE conversion (round to nearest
// even, subnormals, inf, NaN) where none exists.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define OPFORGE_ADAM_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define OPFORGE_ADAM_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define OPFORGE_ADAM_NEON 1
#include <arm_neon.h>
#endif

namespace opforge_adam {

enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };

struct Hyper {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;     // lr / (1 - beta1^t)   (lr when bias correction is off)
  float bc2_sqrt_inv;  // 1 / sqrt(1 - beta2^t) (1 when off)
  float grad_mul;      // 1 / grad_scale (1 when none); applied to the grad first
  bool adamw, maximize, amsgrad;
  // Optional, after the fields above so that aggregate initialisation without
  // them still works: 1 - beta1 and 1 - beta2 worked out in double by the
  // caller, then rounded, as torch does for fp32 states. 0 means "use 1 - beta
  // in fp32", which is off by up to ~1e-5 relative for beta2 = 0.999 because
  // float(0.999) is not 0.999.
  float one_minus_beta1 = 0.0f, one_minus_beta2 = 0.0f;
};

#if defined(OPFORGE_ADAM_AVX512)
constexpr int kSimdWidth = 16;
#elif defined(OPFORGE_ADAM_AVX2)
constexpr int kSimdWidth = 8;
#elif defined(OPFORGE_ADAM_NEON)
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

#if defined(OPFORGE_ADAM_AVX512)
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

#elif defined(OPFORGE_ADAM_AVX2)
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

#elif defined(OPFORGE_ADAM_NEON)
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

// ---------------------------------------------------------------------------
// The update.

struct Consts {
  V gmul, wd, decay, b1, omb1, b2, omb2, neg_step, bc2, eps;
  bool l2, adamw, amsgrad;
  explicit Consts(const Hyper& h)
      : gmul(vset(h.maximize ? -h.grad_mul : h.grad_mul)),
        wd(vset(h.weight_decay)),
        decay(vset(static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay))),
        b1(vset(h.beta1)),
        omb1(vset(h.one_minus_beta1 > 0.0f ? h.one_minus_beta1 : 1.0f - h.beta1)),
        b2(vset(h.beta2)),
        omb2(vset(h.one_minus_beta2 > 0.0f ? h.one_minus_beta2 : 1.0f - h.beta2)),
        neg_step(vset(-h.step_size)),
        bc2(vset(h.bc2_sqrt_inv)),
        eps(vset(h.eps)),
        l2(!h.adamw && h.weight_decay != 0.0f),
        adamw(h.adamw),
        amsgrad(h.amsgrad) {}
};

struct Ptrs {
  void* param;
  const void* grad;
  float* m;
  float* v;
  float* vmax;  // null unless amsgrad
  void* copy;   // may be null
  DType copy_dtype;
};

// Updates W lanes at element i (the lanes selected by `lanes`).
template <DType PD, DType GD, class L>
inline void step_block(const Consts& k, const Ptrs& a, int64_t i, L lanes) {
  V p = load<PD>(a.param, i, lanes);
  V g = vmul(load<GD>(a.grad, i, lanes), k.gmul);
  if (k.l2) g = vfma(k.wd, p, g);
  if (k.adamw) p = vmul(p, k.decay);
  const V m = vfma(k.b1, ld32(a.m + i, lanes), vmul(k.omb1, g));
  const V v = vfma(k.b2, ld32(a.v + i, lanes), vmul(vmul(k.omb2, g), g));
  st32(a.m + i, m, lanes);
  st32(a.v + i, v, lanes);
  V d = v;
  if (k.amsgrad) {
    d = vmax(ld32(a.vmax + i, lanes), v);
    st32(a.vmax + i, d, lanes);
  }
  p = vfma(k.neg_step, vdiv(m, vfma(vsqrt(d), k.bc2, k.eps)), p);
  store<PD>(a.param, i, p, lanes);
  if (a.copy) {
    // The copy is the param as stored (rounded to its dtype), then converted.
    const V c = (a.copy_dtype == PD) ? p : round_to<PD>(p);
    switch (a.copy_dtype) {
      case DType::F32: store<DType::F32>(a.copy, i, c, lanes); break;
      case DType::BF16: store<DType::BF16>(a.copy, i, c, lanes); break;
      case DType::F16: store<DType::F16>(a.copy, i, c, lanes); break;
    }
  }
}

inline int elem_size(DType d) { return d == DType::F32 ? 4 : 2; }

template <DType PD, DType GD>
void update_impl(int64_t n, const Ptrs& a, const Hyper& h) {
  const Consts k(h);
  int64_t i = 0;
  for (; i + W <= n; i += W) step_block<PD, GD>(k, a, i, Full{});
  if (i == n) return;
  const int r = static_cast<int>(n - i);
#if defined(OPFORGE_ADAM_AVX512)
  step_block<PD, GD>(k, a, i, Part{static_cast<__mmask16>((1u << r) - 1u)});
#else
  // Tail of r < W elements: run the same vector code on zero-padded copies.
  alignas(64) unsigned char pb[4 * W] = {}, gb[4 * W] = {}, cb[4 * W] = {};
  alignas(64) float mb[W] = {}, vb[W] = {}, xb[W] = {};
  const int ps = elem_size(PD), gs = elem_size(GD), cs = elem_size(a.copy_dtype);
  std::memcpy(pb, static_cast<const unsigned char*>(a.param) + i * ps, r * ps);
  std::memcpy(gb, static_cast<const unsigned char*>(a.grad) + i * gs, r * gs);
  std::memcpy(mb, a.m + i, r * 4);
  std::memcpy(vb, a.v + i, r * 4);
  if (a.vmax) std::memcpy(xb, a.vmax + i, r * 4);
  const Ptrs t{pb, gb, mb, vb, a.vmax ? xb : nullptr, a.copy ? cb : nullptr, a.copy_dtype};
  step_block<PD, GD>(k, t, 0, Full{});
  std::memcpy(static_cast<unsigned char*>(a.param) + i * ps, pb, r * ps);
  std::memcpy(a.m + i, mb, r * 4);
  std::memcpy(a.v + i, vb, r * 4);
  if (a.vmax) std::memcpy(a.vmax + i, xb, r * 4);
  if (a.copy) std::memcpy(static_cast<unsigned char*>(a.copy) + i * cs, cb, r * cs);
#endif
}

template <DType PD>
void update_param(int64_t n, const Ptrs& a, DType grad_dtype, const Hyper& h) {
  switch (grad_dtype) {
    case DType::F32: return update_impl<PD, DType::F32>(n, a, h);
    case DType::BF16: return update_impl<PD, DType::BF16>(n, a, h);
    case DType::F16: return update_impl<PD, DType::F16>(n, a, h);
  }
}

// Updates elements [0, n) in place. param: F32/BF16/F16; grad: F32/BF16/F16;
// exp_avg, exp_avg_sq (and max_exp_avg_sq when amsgrad) are fp32.
// copy: nullable; if not null, the updated param is also written there in copy_dtype.
inline void adam_update(int64_t n, void* param, DType param_dtype, const void* grad,
                        DType grad_dtype, float* exp_avg, float* exp_avg_sq,
                        float* max_exp_avg_sq, void* copy, DType copy_dtype, const Hyper& h) {
  if (n <= 0) return;
  const Ptrs a{param, grad, exp_avg, exp_avg_sq, h.amsgrad ? max_exp_avg_sq : nullptr,
               copy, copy_dtype};
  Hyper hh = h;
  hh.amsgrad = h.amsgrad && max_exp_avg_sq != nullptr;
  switch (param_dtype) {
    case DType::F32: return update_param<DType::F32>(n, a, grad_dtype, hh);
    case DType::BF16: return update_param<DType::BF16>(n, a, grad_dtype, hh);
    case DType::F16: return update_param<DType::F16>(n, a, grad_dtype, hh);
  }
}

// True when no element of x[0, n) is inf or NaN. Branch-free inner blocks, so
// the compiler vectorises them; stops after the first block that has one.
// fp32 is tested as x - x != 0 (NaN exactly for inf and NaN), which reads the
// floats as floats; bf16 / fp16 test for an all-ones exponent.
template <class T, class Bad>
inline bool none_bad(const T* x, int64_t n, Bad bad_one) {
  constexpr int64_t kBlock = 2048;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t e = (n - i < kBlock) ? n : i + kBlock;
    int bad = 0;
    for (int64_t j = i; j < e; ++j) bad |= bad_one(x[j]);
    if (bad) return false;
  }
  return true;
}

// True when every grad element is finite (GradScaler's found-inf: the step is then skipped).
inline bool all_finite(int64_t n, const void* grad, DType grad_dtype) {
  switch (grad_dtype) {
    case DType::F32:
      return none_bad(static_cast<const float*>(grad), n, [](float x) { return int((x - x) != 0.0f); });
    case DType::BF16:
      return none_bad(static_cast<const uint16_t*>(grad), n,
                      [](uint16_t h) { return int((h & 0x7F80u) == 0x7F80u); });
    case DType::F16:
      return none_bad(static_cast<const uint16_t*>(grad), n,
                      [](uint16_t h) { return int((h & 0x7C00u) == 0x7C00u); });
  }
  return false;
}

}  // namespace opforge_adam
