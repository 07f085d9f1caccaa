// opforge CPU Adam/AdamW (ZeRO-Offload style): one fused, in-place step over a
// parameter, its gradient and its fp32 optimizer states.
//
// Only LibTorch stable-ABI headers are used; the file is meant to be compiled
// with -DTORCH_TARGET_VERSION=0x020a000000000000 (torch 2.10 API), -O3,
// -fopenmp and the ISA flags of one variant. The numbers are computed by
// adam_core.h; this file checks the inputs, works out the bias corrections and
// splits the elements across OpenMP threads.
//
// Ops, registered under the namespace given by -DOPFORGE_NS=<name>:
//   adam_step_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg,
//              Tensor(c!) exp_avg_sq, Tensor(d!)? max_exp_avg_sq,
//              Tensor(e!)? param_copy, float lr, float beta1, float beta2,
//              float eps, float weight_decay, int step, bool adamw,
//              bool bias_correction, bool maximize, float grad_scale,
//              bool check_finite, int num_threads) -> bool
//     amsgrad is on when max_exp_avg_sq is given. Returns false, touching
//     nothing, when check_finite is set and a grad element is inf or NaN.
//   simd_width() -> int    floats per vector of the ISA this TU was built for

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "opforge_stable.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "adam_core.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS opforge_cpu_adam
#endif

namespace {

using opforge_stable::device_name;
using opforge_stable::shape_str;

using opforge_adam::DType;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Elements per thread below which more threads cost more than they give.
constexpr int64_t kMinPerThread = 32768;
// Chunk boundaries are multiples of this (whole cache lines for every dtype).
constexpr int64_t kAlign = 64;

const char* layout_name(torch::headeronly::Layout l) {
  using torch::headeronly::Layout;
  switch (l) {
    case Layout::Strided: return "strided";
    case Layout::Sparse: return "sparse_coo";
    case Layout::SparseCsr: return "sparse_csr";
    case Layout::SparseCsc: return "sparse_csc";
    case Layout::SparseBsr: return "sparse_bsr";
    case Layout::SparseBsc: return "sparse_bsc";
    default: return "a non-strided layout";
  }
}

const char* dtype_name(ScalarType t) {
  return torch::headeronly::toString(t);
}

// CPU, dense, and (when want_contiguous) contiguous. Says what it got.
void check_tensor(const Tensor& t, const char* name, bool want_contiguous = true) {
  STD_TORCH_CHECK(t.is_cpu(), "adam_step_: ", name, " must be a CPU tensor, got ",
                  device_name(t));
  STD_TORCH_CHECK(t.layout() == torch::headeronly::Layout::Strided, "adam_step_: ", name,
                  " must be a dense (strided) tensor, got ", layout_name(t.layout()));
  if (want_contiguous) {
    STD_TORCH_CHECK(t.is_contiguous(), "adam_step_: ", name,
                    " must be contiguous; call .contiguous() on it first (the update is in place)");
  }
}

// The core's dtype for a float32/bfloat16/float16 tensor; an error otherwise.
DType core_dtype(const Tensor& t, const char* name) {
  const ScalarType s = t.scalar_type();
  switch (s) {
    case ScalarType::Float: return DType::F32;
    case ScalarType::BFloat16: return DType::BF16;
    case ScalarType::Half: return DType::F16;
    default: break;
  }
  STD_TORCH_CHECK(false, "adam_step_: ", name,
                  " must be float32, bfloat16 or float16, got ", dtype_name(s));
  return DType::F32;  // unreachable
}

void check_state(const Tensor& t, const char* name, int64_t numel) {
  check_tensor(t, name);
  STD_TORCH_CHECK(t.scalar_type() == ScalarType::Float, "adam_step_: ", name,
                  " must be float32 (optimizer states are kept in fp32), got ",
                  dtype_name(t.scalar_type()));
  STD_TORCH_CHECK(t.numel() == numel, "adam_step_: ", name, " must have as many elements as param (",
                  numel, "), got ", t.numel());
}

// Byte range [begin, end) of a contiguous tensor's data.
struct Span {
  const char* name;
  uintptr_t begin, end;
};

Span span_of(const Tensor& t, const char* name) {
  const auto b = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {name, b, b + static_cast<uintptr_t>(t.numel()) * t.element_size()};
}

// The step's buffers are read and written chunk by chunk: none may overlap another.
void check_no_overlap(const Span* s, int count) {
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      const bool overlap = s[i].begin < s[j].end && s[j].begin < s[i].end;
      STD_TORCH_CHECK(!overlap, "adam_step_: ", s[i].name, " and ", s[j].name,
                      " share memory; each must be its own tensor");
    }
  }
}

// Runs fn(begin, end) over [0, n) split in kAlign-aligned chunks, one per thread.
template <class Fn>
void parallel_chunks(int64_t n, int64_t num_threads, Fn fn) {
  const int64_t want = (n + kMinPerThread - 1) / kMinPerThread;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min(num_threads, want)));
#ifdef _OPENMP
  if (nt > 1) {
#pragma omp parallel num_threads(nt)
    {
      const int64_t got = omp_get_num_threads();
      const int64_t tid = omp_get_thread_num();
      int64_t chunk = (n + got - 1) / got;
      chunk = (chunk + kAlign - 1) / kAlign * kAlign;
      const int64_t b = tid * chunk, e = std::min(n, b + chunk);
      if (b < e) fn(b, e);
    }
    return;
  }
#endif
  fn(0, n);
}

bool grads_finite(int64_t n, const void* grad, DType gd, int64_t num_threads) {
  const int esize = gd == DType::F32 ? 4 : 2;
  const char* base = static_cast<const char*>(grad);
  int bad = 0;
  const int64_t want = (n + kMinPerThread - 1) / kMinPerThread;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min(num_threads, want)));
  const int64_t chunk = ((n + nt - 1) / nt + kAlign - 1) / kAlign * kAlign;
  const int64_t nchunks = (n + chunk - 1) / chunk;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) reduction(| : bad) schedule(static) if (nt > 1)
#endif
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t b = c * chunk, e = std::min(n, b + chunk);
    bad |= !opforge_adam::all_finite(e - b, base + b * esize, gd);
  }
  return bad == 0;
}

bool adam_step_(Tensor param, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                std::optional<Tensor> max_exp_avg_sq, std::optional<Tensor> param_copy,
                double lr, double beta1, double beta2, double eps, double weight_decay,
                int64_t step, bool adamw, bool bias_correction, bool maximize,
                double grad_scale, bool check_finite, int64_t num_threads) {
  // --- scalars
  STD_TORCH_CHECK(step >= 1, "adam_step_: step must be >= 1 (the first step is 1), got ", step);
  STD_TORCH_CHECK(lr >= 0.0, "adam_step_: lr must be >= 0, got ", lr);
  STD_TORCH_CHECK(eps >= 0.0, "adam_step_: eps must be >= 0, got ", eps);
  STD_TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, "adam_step_: beta1 must be in [0, 1), got ", beta1);
  STD_TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, "adam_step_: beta2 must be in [0, 1), got ", beta2);
  STD_TORCH_CHECK(weight_decay >= 0.0, "adam_step_: weight_decay must be >= 0, got ", weight_decay);
  STD_TORCH_CHECK(grad_scale > 0.0 && std::isfinite(grad_scale),
                  "adam_step_: grad_scale must be a finite number > 0 (1 for none), got ", grad_scale);
  STD_TORCH_CHECK(num_threads >= 1, "adam_step_: num_threads must be >= 1, got ", num_threads);

  // --- tensors
  check_tensor(param, "param");
  const DType pd = core_dtype(param, "param");
  check_tensor(grad, "grad");
  const DType gd = core_dtype(grad, "grad");
  const auto ps = param.sizes(), gs = grad.sizes();
  bool same = ps.size() == gs.size();
  for (size_t d = 0; same && d < ps.size(); ++d) same = ps[d] == gs[d];
  STD_TORCH_CHECK(same, "adam_step_: grad must have the same shape as param, got param ",
                  shape_str(ps), " and grad ", shape_str(gs));
  const int64_t n = param.numel();
  check_state(exp_avg, "exp_avg", n);
  check_state(exp_avg_sq, "exp_avg_sq", n);
  const bool amsgrad = max_exp_avg_sq.has_value();
  if (amsgrad) check_state(*max_exp_avg_sq, "max_exp_avg_sq", n);
  DType cd = DType::F32;
  if (param_copy.has_value()) {
    check_tensor(*param_copy, "param_copy");
    cd = core_dtype(*param_copy, "param_copy");
    STD_TORCH_CHECK(param_copy->numel() == n, "adam_step_: param_copy must have as many elements as param (",
                    n, "), got ", param_copy->numel());
  }
  if (n == 0) return true;

  Span spans[6] = {span_of(param, "param"), span_of(grad, "grad"), span_of(exp_avg, "exp_avg"),
                   span_of(exp_avg_sq, "exp_avg_sq")};
  int nspans = 4;
  if (amsgrad) spans[nspans++] = span_of(*max_exp_avg_sq, "max_exp_avg_sq");
  if (param_copy.has_value()) spans[nspans++] = span_of(*param_copy, "param_copy");
  check_no_overlap(spans, nspans);

  const void* g = grad.const_data_ptr();
  if (check_finite && !grads_finite(n, g, gd, num_threads)) return false;

  // --- hyper-parameters: bias corrections in double, then float
  opforge_adam::Hyper h{};
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(beta1);
  h.beta2 = static_cast<float>(beta2);
  h.eps = static_cast<float>(eps);
  h.weight_decay = static_cast<float>(weight_decay);
  h.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  double step_size = lr, bc2_sqrt_inv = 1.0;
  if (bias_correction) {
    const double t = static_cast<double>(step);
    step_size = lr / (1.0 - std::pow(beta1, t));
    bc2_sqrt_inv = 1.0 / std::sqrt(1.0 - std::pow(beta2, t));
  }
  h.step_size = static_cast<float>(step_size);
  h.bc2_sqrt_inv = static_cast<float>(bc2_sqrt_inv);
  h.grad_mul = static_cast<float>(1.0 / grad_scale);
  h.adamw = adamw;
  h.maximize = maximize;
  h.amsgrad = amsgrad;

  char* p = static_cast<char*>(param.mutable_data_ptr());
  float* m = static_cast<float*>(exp_avg.mutable_data_ptr());
  float* v = static_cast<float*>(exp_avg_sq.mutable_data_ptr());
  float* vmax = amsgrad ? static_cast<float*>(max_exp_avg_sq->mutable_data_ptr()) : nullptr;
  char* copy = param_copy.has_value() ? static_cast<char*>(param_copy->mutable_data_ptr()) : nullptr;
  const int psz = pd == DType::F32 ? 4 : 2, gsz = gd == DType::F32 ? 4 : 2,
            csz = cd == DType::F32 ? 4 : 2;
  const char* gc = static_cast<const char*>(g);

  parallel_chunks(n, num_threads, [&](int64_t b, int64_t e) {
    opforge_adam::adam_update(e - b, p + b * psz, pd, gc + b * gsz, gd, m + b, v + b,
                              vmax ? vmax + b : nullptr, copy ? copy + b * csz : nullptr, cd, h);
  });
  return true;
}

int64_t simd_width() {
  return opforge_adam::kSimdWidth;
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def(
      "adam_step_(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, "
      "Tensor(d!)? max_exp_avg_sq, Tensor(e!)? param_copy, float lr, float beta1, float beta2, "
      "float eps, float weight_decay, int step, bool adamw, bool bias_correction, bool maximize, "
      "float grad_scale, bool check_finite, int num_threads) -> bool");
  m.def("simd_width() -> int");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  m.impl("adam_step_", TORCH_BOX(&adam_step_));
  m.impl("simd_width", TORCH_BOX(&simd_width));
}
