// bias_act's CPU activation loops: over fp32 stack buffers of nv vectors, one instantiation
// per (activation, ref, order), each chosen once per call through a function pointer; and
// the loads and stores that convert a block of each storage dtype to and from fp32. No torch
// headers (see bias_act_cpu.h).

#include <cstdint>
#include <cstring>

#include "bias_act_cpu.h"
#include "bias_act_math.h"
#include "bias_act_vec.h"

namespace opforge_bias_act {
namespace {

// ---------------------------------------------------------------------------
// Loads and stores of n elements of dtype D as fp32, padded with zeros to whole vectors.

inline float bf16_to_f32(uint16_t h) { return bitcast<float>(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays a (quiet) NaN
  const uint32_t x = bitcast<uint32_t>(f);
  const uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? (x >> 16) | 0x40u : r);
}

template <DType D>
void load(const void* base, int64_t k, int64_t n, float* __restrict__ buf) {
  if constexpr (D == DType::F32) {
    const float* p = static_cast<const float*>(base) + k;
    for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  } else if constexpr (D == DType::BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(base) + k;
    for (int64_t i = 0; i < n; ++i) buf[i] = bf16_to_f32(p[i]);
  } else {
    const _Float16* p = static_cast<const _Float16*>(base) + k;
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(p[i]);
  }
  for (int64_t i = n; i < (n + W - 1) / W * W; ++i) buf[i] = 0.0f;
}

template <DType D>
void store(void* base, int64_t k, int64_t n, const float* __restrict__ buf) {
  if constexpr (D == DType::F32) {
    float* p = static_cast<float*>(base) + k;
    for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
  } else if constexpr (D == DType::BF16) {
    uint16_t* p = static_cast<uint16_t*>(base) + k;
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(buf[i]);
  } else {
    _Float16* p = static_cast<_Float16*>(base) + k;
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<_Float16>(buf[i]);
  }
}

// ---------------------------------------------------------------------------
// The per-block activation loops over fp32 buffers of nv vectors.

inline VF ld(const float* p) { VF v; std::memcpy(&v, p, sizeof v); return v; }
inline void st(float* p, VF v) { std::memcpy(p, &v, sizeof v); }

inline VF clamp_to(VF u, float c) {  // NaN passes
  return u > c ? splat(c) : (u < -c ? splat(-c) : u);
}

template <int A>
void fwd_loop(float* __restrict__ buf, int64_t nv, const Params& p) {
  for (int64_t i = 0; i < nv; ++i) {
    VF u = value<A, VecMath>(ld(buf + i * W), p.alpha) * p.gain;
    if (p.clamped) u = clamp_to(u, p.clamp);
    st(buf + i * W, u);
  }
}

// ORDER 1: g := g * d y / d v. ORDER 2: g := g * d/dref (d y / d v). r holds y or x + b.
template <int A, int R, int ORDER>
void grad_loop(float* __restrict__ g, const float* __restrict__ r, int64_t nv, const Params& p) {
  for (int64_t i = 0; i < nv; ++i) {
    const VF gi = ld(g + i * W);
    VF d;
    if constexpr (R == kRefNone) {
      d = gi * p.gain;
    } else if constexpr (R == kRefY) {
      const VF y = ld(r + i * W);
      const VF a = y * p.inv_gain;
      if constexpr (ORDER == 1) d = gi * (d_from_value<A, VecMath>(a, p.alpha) * p.gain);
      else d = gi * d2_from_value<A, VecMath>(a);
      if (p.clamped) d = vabs(y) < p.clamp_ref ? d : VF{};
    } else {
      const VF v = ld(r + i * W);
      if constexpr (ORDER == 1) d = gi * (d_from_pre<A, VecMath>(v, p.alpha) * p.gain);
      else d = gi * (d2_from_pre<A, VecMath>(v, p.alpha) * p.gain);
      if (p.clamped) d = vabs(value<A, VecMath>(v, p.alpha) * p.gain) < p.clamp ? d : VF{};
    }
    st(g + i * W, d);
  }
}

template <int A, int ORDER>
constexpr GradLoop grad_fn(int ref) {
  if constexpr (ORDER == 1) {
    if (ref == kRefNone) return &grad_loop<A, kRefNone, 1>;
    if constexpr (has_d_from_value(A)) {
      if (ref == kRefY) return &grad_loop<A, kRefY, 1>;
    }
    if constexpr (has_d_from_pre(A)) {
      if (ref == kRefX) return &grad_loop<A, kRefX, 1>;
    }
  } else {
    if constexpr (has_d2_from_value(A)) {
      if (ref == kRefY) return &grad_loop<A, kRefY, 2>;
    }
    if constexpr (has_d2_from_pre(A)) {
      if (ref == kRefX) return &grad_loop<A, kRefX, 2>;
    }
  }
  return nullptr;
}

template <int... As>
struct Table {
  static FwdLoop fwd(int act) {
    FwdLoop f = nullptr;
    ((act == As ? (f = &fwd_loop<As>, 0) : 0), ...);
    return f;
  }
  template <int ORDER>
  static GradLoop grad(int act, int ref) {
    GradLoop f = nullptr;
    ((act == As ? (f = grad_fn<As, ORDER>(ref), 0) : 0), ...);
    return f;
  }
};
using Acts = Table<kLinear, kRelu, kLrelu, kTanh, kSigmoid, kElu, kSelu, kSoftplus, kSwish, kGelu, kGeluTanh>;

}  // namespace

FwdLoop OPFORGE_NS::fwd_loop_for(int act) { return Acts::fwd(act); }
GradLoop OPFORGE_NS::grad1_loop_for(int act, int ref) { return Acts::grad<1>(act, ref); }
GradLoop OPFORGE_NS::grad2_loop_for(int act, int ref) { return Acts::grad<2>(act, ref); }

LoadFn OPFORGE_NS::load_for(DType d) {
  return d == DType::F32 ? &load<DType::F32> : d == DType::BF16 ? &load<DType::BF16> : &load<DType::F16>;
}

StoreFn OPFORGE_NS::store_for(DType d) {
  return d == DType::F32 ? &store<DType::F32> : d == DType::BF16 ? &store<DType::BF16> : &store<DType::F16>;
}

}  // namespace opforge_bias_act
