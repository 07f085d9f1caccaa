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
// The vector layer (ISA detection, the fp32 vector type, bf16/fp16 loads and
// stores) is ../../common/csrc/opforge_simd.h. Partial vectors (AVX2, NEON) go
// through the same vector code on a small stack buffer, so every element of a
// tensor is rounded the same way; AVX-512 uses masked tails.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "opforge_simd.h"

namespace opforge_adam {

using namespace opforge_simd;  // DType, V, kSimdWidth, load/store

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
#if defined(OPFORGE_SIMD_AVX512)
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
