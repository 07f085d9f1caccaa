// bias_act's activations and their derivatives, written once for every compiled variant.
//
// The formulas are templates over a number type F and a math policy M that supplies the
// transcendental functions and a select:
//   * the C++ CPU variant instantiates them with a GCC vector of fp32 lanes (bias_act_vec.h),
//   * the CUDA variant with float and CUDA's own expf/erfcf/... (bias_act_cuda.cu).
// M provides: static F exp(F), expm1(F), log1p(F), tanh(F), erfc(F); F sel(mask, F a, F b)
// (mask: what F's comparison operators give; a where it is set); F zero(), F one().
//
// They follow opforge/kernels/bias_act/reference.py (the torch reference) term by term:
// v is the pre-activation x + b, a the activation's value (y / gain). Activation ids are
// Activation.index in activations.py: never renumber.

#pragma once

#if defined(__CUDACC__)
#define BIAS_ACT_FN __host__ __device__ __forceinline__
#define BIAS_ACT_CX __host__ __device__ constexpr
#else
#define BIAS_ACT_FN inline __attribute__((always_inline))
#define BIAS_ACT_CX constexpr
#endif

namespace opforge_bias_act {

enum Act : int {
  kLinear = 1, kRelu = 2, kLrelu = 3, kTanh = 4, kSigmoid = 5, kElu = 6,
  kSelu = 7, kSoftplus = 8, kSwish = 9, kGelu = 10, kGeluTanh = 11,
};
constexpr int kNumActs = 11;

// What the first derivative is computed from (Activation.ref_for): nothing, y, or x (+ b).
enum Ref : int { kRefNone = 0, kRefY = 1, kRefX = 2 };

constexpr float kSeluAlpha = 1.6732632423543772f;
constexpr float kSeluScale = 1.0507009873554805f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kSqrtHalf = 0.7071067811865476f;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;
constexpr float kSoftplusThreshold = 20.0f;    // torch's: above it softplus(v) is v

template <class M, class F>
BIAS_ACT_FN F sigmoid(F v) {
  return M::one() / (M::one() + M::exp(-v));
}

// gelu_tanh's (1 + tanh(u)) / 2 = sigmoid(2u), u = K (v + C v^3): no cancellation where
// tanh(u) nears -1 (v < 0), which costs 1 + tanh(u) its relative accuracy.
template <class M, class F>
BIAS_ACT_FN F gelu_tanh_s(F v) {
  return sigmoid<M>((v + v * v * v * kGeluC) * (2.0f * kGeluK));
}

// act(v). NaN propagates as in torch (relu(NaN) is NaN).
template <int A, class M, class F>
BIAS_ACT_FN F value(F v, float alpha) {
  if constexpr (A == kLinear) {
    return v;
  } else if constexpr (A == kRelu) {
    return M::sel(v < 0.0f, M::zero(), v);
  } else if constexpr (A == kLrelu) {
    return M::sel(v < 0.0f, v * alpha, v);
  } else if constexpr (A == kTanh) {
    return M::tanh(v);
  } else if constexpr (A == kSigmoid) {
    return sigmoid<M>(v);
  } else if constexpr (A == kElu) {
    return M::sel(v > 0.0f, v, M::expm1(v) * alpha);
  } else if constexpr (A == kSelu) {
    return M::sel(v > 0.0f, v, M::expm1(v) * kSeluAlpha) * kSeluScale;
  } else if constexpr (A == kSoftplus) {
    return M::sel(v > kSoftplusThreshold, v, M::log1p(M::exp(v)));
  } else if constexpr (A == kSwish) {
    return v * sigmoid<M>(v);
  } else if constexpr (A == kGelu) {
    return v * M::erfc(v * -kSqrtHalf) * 0.5f;  // 1 + erf(z) = erfc(-z)
  } else {
    static_assert(A == kGeluTanh, "unknown activation");
    return v * gelu_tanh_s<M>(v);
  }
}

// d act / d v as a function of the value a = act(v) (the activations whose ref is y).
template <int A, class M, class F>
BIAS_ACT_FN F d_from_value(F a, float alpha) {
  if constexpr (A == kLinear) {
    return M::one();
  } else if constexpr (A == kRelu) {
    return M::sel(a > 0.0f, M::one(), M::zero());
  } else if constexpr (A == kLrelu) {
    return M::sel(a > 0.0f, M::one(), M::zero() + alpha);
  } else if constexpr (A == kTanh) {
    return M::one() - a * a;
  } else if constexpr (A == kSigmoid) {
    return a * (M::one() - a);
  } else if constexpr (A == kElu) {
    return M::sel(a > 0.0f, M::one(), a + alpha);
  } else if constexpr (A == kSelu) {
    return M::sel(a > 0.0f, M::zero() + kSeluScale, a + kSeluScale * kSeluAlpha);
  } else {
    static_assert(A == kSoftplus, "no derivative from the value");
    return -M::expm1(-a);
  }
}

// d/da of d_from_value (the activations with a second derivative and ref y).
template <int A, class M, class F>
BIAS_ACT_FN F d2_from_value(F a) {
  if constexpr (A == kTanh) {
    return a * -2.0f;
  } else if constexpr (A == kSigmoid) {
    return M::one() - a * 2.0f;
  } else if constexpr (A == kElu || A == kSelu) {
    return M::sel(a > 0.0f, M::zero(), M::one());
  } else {
    static_assert(A == kSoftplus, "no second derivative from the value");
    return M::exp(-a);
  }
}

// d act / d v as a function of v (the activations whose ref is x).
template <int A, class M, class F>
BIAS_ACT_FN F d_from_pre(F v, float alpha) {
  if constexpr (A == kLinear) {
    return M::one();
  } else if constexpr (A == kLrelu) {
    return M::sel(v > 0.0f, M::one(), M::zero() + alpha);
  } else if constexpr (A == kElu) {
    return M::sel(v > 0.0f, M::one(), M::exp(v) * alpha);
  } else if constexpr (A == kSwish) {
    const F s = sigmoid<M>(v);
    return s * (M::one() + v * (M::one() - s));
  } else if constexpr (A == kGelu) {
    return M::erfc(v * -kSqrtHalf) * 0.5f + v * M::exp(v * v * -0.5f) * kInvSqrt2Pi;
  } else {
    static_assert(A == kGeluTanh, "no derivative from the pre-activation");
    const F s = gelu_tanh_s<M>(v);  // (1 + t) / 2, t = tanh(u); 1 - t^2 = 4 s (1 - s)
    const F du = (M::one() + v * v * (3.0f * kGeluC)) * kGeluK;
    return s + v * s * (M::one() - s) * du * 2.0f;
  }
}

// d/dv of d_from_pre (the activations with a second derivative and ref x).
template <int A, class M, class F>
BIAS_ACT_FN F d2_from_pre(F v, float alpha) {
  if constexpr (A == kElu) {
    return M::sel(v > 0.0f, M::zero(), M::exp(v) * alpha);
  } else if constexpr (A == kSwish) {
    const F s = sigmoid<M>(v);
    return s * (M::one() - s) * (v * (M::one() - s * 2.0f) + 2.0f);
  } else if constexpr (A == kGelu) {
    return M::exp(v * v * -0.5f) * (2.0f - v * v) * kInvSqrt2Pi;
  } else {
    static_assert(A == kGeluTanh, "no second derivative from the pre-activation");
    const F s = gelu_tanh_s<M>(v);
    const F t = s * 2.0f - 1.0f;
    const F du = (M::one() + v * v * (3.0f * kGeluC)) * kGeluK;
    const F d2u = v * (6.0f * kGeluK * kGeluC);
    return s * (M::one() - s) * 4.0f * (du + v * (d2u - t * du * du * 2.0f) * 0.5f);
  }
}

// Which (activation, ref) pairs have a first / second derivative kernel: the rest never reach one.
BIAS_ACT_CX bool has_d_from_value(int a) {
  return a == kLinear || a == kRelu || a == kLrelu || a == kTanh || a == kSigmoid || a == kElu ||
         a == kSelu || a == kSoftplus;
}
BIAS_ACT_CX bool has_d_from_pre(int a) {
  return a == kLinear || a == kLrelu || a == kElu || a == kSwish || a == kGelu || a == kGeluTanh;
}
BIAS_ACT_CX bool has_d2_from_value(int a) {
  return a == kTanh || a == kSigmoid || a == kElu || a == kSelu || a == kSoftplus;
}
BIAS_ACT_CX bool has_d2_from_pre(int a) {
  return a == kElu || a == kSwish || a == kGelu || a == kGeluTanh;
}

}  // namespace opforge_bias_act
