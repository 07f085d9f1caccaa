// A torch-free check of adam_core.h, for the ISAs that cannot be tested here
// through torch (NEON under qemu-aarch64), and for any other build of the core.
//
//   aarch64-linux-gnu-g++ -O3 -std=c++17 -I ../../common/csrc neon_harness.cpp -o harness
//   qemu-aarch64 -L /usr/aarch64-linux-gnu ./harness
//
// 1. The vector conversions (bf16 / fp16, both ways) against the scalar ones,
//    bit for bit, on random bit patterns, rounding ties and special values.
// 2. adam_update against a double-precision reference (param rounded to its
//    dtype after each step), for several sizes, dtypes and settings.
// Prints one line per group and PASS or FAIL at the end (exit status 0 / 1).

#include "adam_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace opforge_adam;

namespace {

int g_failures = 0;

const char* isa_name() {
#if defined(OPFORGE_SIMD_AVX512)
  return "AVX-512";
#elif defined(OPFORGE_SIMD_AVX2)
  return "AVX2";
#elif defined(OPFORGE_SIMD_NEON)
  return "NEON";
#else
  return "scalar";
#endif
}

bool is_nan_bf16(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu); }
bool is_nan_f16(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu); }

// --- 1. conversions -------------------------------------------------------

std::vector<uint32_t> conversion_inputs() {
  std::mt19937 rng(7);
  std::vector<uint32_t> v;
  for (int i = 0; i < 200000; ++i) v.push_back(rng());
  for (int i = 0; i < 20000; ++i) {  // bf16 ties and neighbours
    const uint32_t hi = rng() & 0xFFFF0000u;
    for (uint32_t lo : {0x8000u, 0x7FFFu, 0x8001u, 0u}) v.push_back(hi | lo);
  }
  for (uint32_t h = 0; h < 0x7C00u; ++h) {  // every positive finite half: value, ties, neighbours
    const float a = f16_to_f32_soft(static_cast<uint16_t>(h));
    const float b = f16_to_f32_soft(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact in fp32
    for (float f : {a, mid, std::nextafter(mid, 1e9f), std::nextafter(mid, -1e9f)}) {
      v.push_back(f32_bits(f));
      v.push_back(f32_bits(-f));
    }
  }
  for (uint32_t s : {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u,
                     0xFFFFFFFFu, 0x00000001u, 0x007FFFFFu, 0x7F7FFFFFu, 0x7F7F8000u,
                     0x477FF000u, 0x477FEFFFu, 0x33000000u, 0x33000001u})
    v.push_back(s);
  while (v.size() % W) v.push_back(0);
  return v;
}

void check_conversions() {
  const std::vector<uint32_t> in = conversion_inputs();
  size_t bad_bf = 0, bad_h = 0, bad_bf_back = 0, bad_h_back = 0;
  for (size_t i = 0; i < in.size(); i += W) {
    float f[W];
    uint16_t bf[W], h[W];
    for (int j = 0; j < W; ++j) f[j] = bits_f32(in[i + j]);
    const V x = load<DType::F32>(f, 0, Full{});
    store<DType::BF16>(bf, 0, x, Full{});
    store<DType::F16>(h, 0, x, Full{});
    float fb[W], fh[W];
    store<DType::F32>(fb, 0, load<DType::BF16>(bf, 0, Full{}), Full{});
    store<DType::F32>(fh, 0, load<DType::F16>(h, 0, Full{}), Full{});
    for (int j = 0; j < W; ++j) {
      const uint16_t wb = f32_to_bf16(f[j]), wh = f32_to_f16_soft(f[j]);
      bad_bf += is_nan_bf16(wb) ? !is_nan_bf16(bf[j]) : bf[j] != wb;
      bad_h += is_nan_f16(wh) ? !is_nan_f16(h[j]) : h[j] != wh;
      const float rb = bf16_to_f32(bf[j]), rh = f16_to_f32_soft(h[j]);
      bad_bf_back += std::isnan(rb) ? !std::isnan(fb[j]) : f32_bits(fb[j]) != f32_bits(rb);
      bad_h_back += std::isnan(rh) ? !std::isnan(fh[j]) : f32_bits(fh[j]) != f32_bits(rh);
    }
  }
  std::printf("conversions: %zu values; mismatches f32->bf16 %zu, f32->f16 %zu, bf16->f32 %zu, f16->f32 %zu\n",
              in.size(), bad_bf, bad_h, bad_bf_back, bad_h_back);
  // The scalar fp16 conversion against exact arithmetic on a few known values.
  struct { float f; uint16_t h; } known[] = {
      {65504.f, 0x7BFF}, {65519.f, 0x7BFF}, {65520.f, 0x7C00}, {5.9604644775390625e-8f, 0x0001},
      {2.98023223876953125e-8f, 0x0000}, {2.9802326e-8f, 0x0001}, {8.940696716308594e-8f, 0x0002},
      {6.103515625e-5f, 0x0400}, {-0.f, 0x8000}, {1.0009765625f, 0x3C01}, {1.00048828125f, 0x3C00},
      {1.00146484375f, 0x3C02}};
  int bad_known = 0;
  for (auto k : known) bad_known += f32_to_f16_soft(k.f) != k.h;
  std::printf("scalar fp16 known values: %d mismatches\n", bad_known);
  g_failures += (bad_bf + bad_h + bad_bf_back + bad_h_back) != 0 || bad_known != 0;
}

// --- 2. the update ----------------------------------------------------------

float round_to_dtype(double x, DType d) {
  const float f = static_cast<float>(x);
  if (d == DType::BF16) return bf16_to_f32(f32_to_bf16(f));
  if (d == DType::F16) return f16_to_f32_soft(f32_to_f16_soft(f));
  return f;
}

void put(std::vector<uint16_t>& raw16, std::vector<float>& raw32, DType d, size_t i, float x) {
  if (d == DType::F32) raw32[i] = x;
  else raw16[i] = d == DType::BF16 ? f32_to_bf16(x) : f32_to_f16_soft(x);
}

float get(const std::vector<uint16_t>& raw16, const std::vector<float>& raw32, DType d, size_t i) {
  if (d == DType::F32) return raw32[i];
  return d == DType::BF16 ? bf16_to_f32(raw16[i]) : f16_to_f32_soft(raw16[i]);
}

double ulp_of(double x, DType d) {
  const int bits = d == DType::F32 ? 23 : d == DType::BF16 ? 7 : 10;
  const double a = std::max(std::fabs(x), 1e-30);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - bits);
}

struct Config {
  const char* name;
  bool adamw, amsgrad, maximize, bias_correction;
  double wd, grad_scale;
};

const char* dname(DType d) { return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : "f16"; }

// Returns the worst param error (ulps of the largest magnitude reached) and state error.
void run_case(int64_t n, DType pd, DType gd, DType cd, bool with_copy, const Config& c,
              double& worst_p, double& worst_s, std::mt19937& rng) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> p32(n), g32(n), c32(n), m(n, 0.f), v(n, 0.f), vmax(n, 0.f);
  std::vector<uint16_t> p16(n), g16(n), c16(n);
  std::vector<double> rp(n), rm(n, 0.0), rv(n, 0.0), rvmax(n, 0.0), amax(n), rma(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    put(p16, p32, pd, i, normal(rng));
    rp[i] = get(p16, p32, pd, i);
    amax[i] = std::fabs(rp[i]);
  }
  for (int t = 1; t <= 5; ++t) {
    for (int64_t i = 0; i < n; ++i) put(g16, g32, gd, i, static_cast<float>(normal(rng) * c.grad_scale));
    Hyper h{};
    h.lr = static_cast<float>(lr);
    h.beta1 = static_cast<float>(b1);
    h.beta2 = static_cast<float>(b2);
    h.eps = static_cast<float>(eps);
    h.weight_decay = static_cast<float>(c.wd);
    h.step_size = static_cast<float>(c.bias_correction ? lr / (1 - std::pow(b1, t)) : lr);
    h.bc2_sqrt_inv = static_cast<float>(c.bias_correction ? 1 / std::sqrt(1 - std::pow(b2, t)) : 1.0);
    h.grad_mul = static_cast<float>(1 / c.grad_scale);
    h.adamw = c.adamw;
    h.maximize = c.maximize;
    h.amsgrad = c.amsgrad;
    h.one_minus_beta1 = static_cast<float>(1 - b1);
    h.one_minus_beta2 = static_cast<float>(1 - b2);
    void* pp = pd == DType::F32 ? static_cast<void*>(p32.data()) : static_cast<void*>(p16.data());
    const void* gp = gd == DType::F32 ? static_cast<const void*>(g32.data()) : static_cast<const void*>(g16.data());
    void* cp = !with_copy ? nullptr : cd == DType::F32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
    adam_update(n, pp, pd, gp, gd, m.data(), v.data(), c.amsgrad ? vmax.data() : nullptr, cp, cd, h);

    for (int64_t i = 0; i < n; ++i) {  // the reference, in double
      double g = static_cast<double>(get(g16, g32, gd, i)) * h.grad_mul;
      if (c.maximize) g = -g;
      if (!c.adamw && c.wd != 0) g += c.wd * rp[i];
      if (c.adamw) rp[i] *= 1 - lr * c.wd;
      rm[i] = b1 * rm[i] + (1 - b1) * g;
      rma[i] = b1 * rma[i] + (1 - b1) * std::fabs(g);  // the scale of m without cancellation
      rv[i] = b2 * rv[i] + (1 - b2) * g * g;
      double d = rv[i];
      if (c.amsgrad) d = rvmax[i] = std::max(rvmax[i], rv[i]);
      const double bc1 = c.bias_correction ? 1 - std::pow(b1, t) : 1.0;
      const double bc2 = c.bias_correction ? std::sqrt(1 - std::pow(b2, t)) : 1.0;
      rp[i] = round_to_dtype(rp[i] - lr / bc1 * rm[i] / (std::sqrt(d) / bc2 + eps), pd);
      amax[i] = std::max(amax[i], std::fabs(rp[i]));
      if (with_copy) {  // the copy is the stored param, converted
        const float want = round_to_dtype(get(p16, p32, pd, i), cd);
        const float got = get(c16, c32, cd, i);
        if (f32_bits(want) != f32_bits(got)) worst_p = std::max(worst_p, 1e9);  // flags a copy bug
      }
    }
  }
  double es = 0;  // state errors relative to their scale, per element
  for (int64_t i = 0; i < n; ++i) {
    const double ep = std::fabs(get(p16, p32, pd, i) - rp[i]) / ulp_of(amax[i], pd);
    worst_p = std::max(worst_p, ep);
    es = std::max(es, std::fabs(m[i] - rm[i]) / rma[i]);
    es = std::max(es, std::fabs(v[i] - rv[i]) / rv[i]);
  }
  const bool l2 = !c.adamw && c.wd != 0;
  if (!(l2 && pd != DType::F32))  // with L2 decay the states follow the (rounded) param
    worst_s = std::max(worst_s, es);
}

void check_updates() {
  const Config configs[] = {
      {"adam", false, false, false, true, 0.0, 1.0},
      {"adam_l2", false, false, false, true, 0.1, 1.0},
      {"adamw", true, false, false, true, 0.1, 1.0},
      {"amsgrad", true, true, false, true, 0.1, 1.0},
      {"maximize", false, true, true, true, 0.1, 1.0},
      {"no_bias_correction", true, false, false, false, 0.1, 1.0},
      {"grad_scale_1024", true, false, false, true, 0.1, 1024.0},
  };
  const int64_t sizes[] = {1, 3, 4, 5, 7, 15, 16, 17, 64, 1000, 4099};
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  std::mt19937 rng(11);
  for (DType pd : dts) {
    for (DType gd : dts) {
      double wp = 0, ws = 0;
      int cases = 0;
      for (const Config& c : configs) {
        for (int64_t n : sizes) {
          for (int copy = 0; copy < 4; ++copy) {  // none, f32, bf16, f16
            const DType cd = copy == 0 ? DType::F32 : dts[copy - 1];
            run_case(n, pd, gd, cd, copy != 0, c, wp, ws, rng);
            ++cases;
          }
        }
      }
      const double plim = pd == DType::F32 ? 64.0 : 3.0;
      const bool ok = wp <= plim && ws <= 1e-5;
      std::printf("update param=%-4s grad=%-4s: %3d cases, max param err %.3g ulp, max state err %.3g (relative) %s\n",
                  dname(pd), dname(gd), cases, wp, ws, ok ? "ok" : "FAIL");
      g_failures += !ok;
    }
  }
}

void check_all_finite() {
  int bad = 0;
  std::vector<float> f(1000, 1.f);
  std::vector<uint16_t> b(1000, 0x3F80), h(1000, 0x3C00);
  bad += !all_finite(1000, f.data(), DType::F32) || !all_finite(1000, b.data(), DType::BF16) ||
         !all_finite(1000, h.data(), DType::F16);
  for (int pos : {0, 517, 999}) {
    f[pos] = INFINITY; b[pos] = 0xFFC0; h[pos] = 0x7C00;
    bad += all_finite(1000, f.data(), DType::F32) || all_finite(1000, b.data(), DType::BF16) ||
           all_finite(1000, h.data(), DType::F16);
    f[pos] = 1.f; b[pos] = 0x3F80; h[pos] = 0x3C00;
  }
  f[3] = 3.4e38f; b[3] = 0x7F7F; h[3] = 0x7BFF;  // largest finite values
  bad += !all_finite(1000, f.data(), DType::F32) || !all_finite(1000, b.data(), DType::BF16) ||
         !all_finite(1000, h.data(), DType::F16);
  std::printf("all_finite: %d wrong answers\n", bad);
  g_failures += bad != 0;
}

}  // namespace

int main() {
  std::printf("adam_core harness: %s path, %d lanes\n", isa_name(), kSimdWidth);
  check_conversions();
  check_all_finite();
  check_updates();
  std::printf("%s\n", g_failures ? "FAIL" : "PASS");
  return g_failures ? 1 : 0;
}
