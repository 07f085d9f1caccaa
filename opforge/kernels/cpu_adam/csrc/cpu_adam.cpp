// opforge CPU Adam/AdamW (ZeRO-Offload style): one fused, in-place step over
// parameters, their gradients and their fp32 optimizer states.
//
// Only LibTorch stable-ABI headers are used; the file is meant to be compiled
// with -DTORCH_TARGET_VERSION=0x020a000000000000 (torch 2.10 API), -O3,
// -fopenmp and the ISA flags of one variant. The numbers are computed by
// adam_core.h and the inputs are checked by adam_checks.h; this file works out the
// bias corrections, splits the elements across OpenMP threads and registers the ops.
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
//   adam_step_multi_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs,
//              Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs,
//              Tensor(e!)[] param_copies, Tensor(f!)[] steps, float lr,
//              float beta1, float beta2, float eps, float weight_decay,
//              bool adamw, bool bias_correction, bool maximize,
//              float grad_scale, bool check_finite, int num_threads) -> bool
//     adam_step_ on every param of the lists, in one parallel region.
//     max_exp_avg_sqs and param_copies are empty (none) or one per param.
//     steps[i] is param i's torch.optim.Adam state["step"] (a one-element fp32
//     tensor): it is incremented, and its new value is that param's step.
//     Everything is checked before anything is written; with check_finite, an
//     inf/NaN in any grad returns false and touches nothing (steps included).
//   simd_width() -> int    floats per vector of the ISA this TU was built for

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "opforge_stable.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "adam_core.h"
#include "adam_checks.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS opforge_cpu_adam
#endif

namespace {

using namespace opforge_adam_checks;  // NOLINT: the checks (and their names for DType, Tensor, ...)

// Elements per thread below which more threads cost more than they give.
constexpr int64_t kMinPerThread = 32768;
// Chunk boundaries are multiples of this (whole cache lines for every dtype).
constexpr int64_t kAlign = 64;

// ---------------------------------------------------------------------------
// The scalars, and one param's step.

struct Scalars {
  double lr, beta1, beta2, eps, weight_decay;
  bool adamw, bias_correction, maximize;
  double grad_scale;
};

void check_scalars(const char* op, const Scalars& s, int64_t num_threads) {
  STD_TORCH_CHECK(s.lr >= 0.0, op, ": lr must be >= 0, got ", s.lr);
  STD_TORCH_CHECK(s.eps >= 0.0, op, ": eps must be >= 0, got ", s.eps);
  STD_TORCH_CHECK(s.beta1 >= 0.0 && s.beta1 < 1.0, op, ": beta1 must be in [0, 1), got ", s.beta1);
  STD_TORCH_CHECK(s.beta2 >= 0.0 && s.beta2 < 1.0, op, ": beta2 must be in [0, 1), got ", s.beta2);
  STD_TORCH_CHECK(s.weight_decay >= 0.0, op, ": weight_decay must be >= 0, got ", s.weight_decay);
  STD_TORCH_CHECK(s.grad_scale > 0.0 && std::isfinite(s.grad_scale), op,
                  ": grad_scale must be a finite number > 0 (1 for none), got ", s.grad_scale);
  STD_TORCH_CHECK(num_threads >= 1, op, ": num_threads must be >= 1, got ", num_threads);
}

// The hyper-parameters of a param at step t: bias corrections in double, then float.
opforge_adam::Hyper make_hyper(const Scalars& s, double t, bool amsgrad) {
  opforge_adam::Hyper h{};
  h.lr = static_cast<float>(s.lr);
  h.beta1 = static_cast<float>(s.beta1);
  h.beta2 = static_cast<float>(s.beta2);
  h.eps = static_cast<float>(s.eps);
  h.weight_decay = static_cast<float>(s.weight_decay);
  h.one_minus_beta1 = static_cast<float>(1.0 - s.beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - s.beta2);
  double step_size = s.lr, bc2_sqrt_inv = 1.0;
  if (s.bias_correction) {
    step_size = s.lr / (1.0 - std::pow(s.beta1, t));
    bc2_sqrt_inv = 1.0 / std::sqrt(1.0 - std::pow(s.beta2, t));
  }
  h.step_size = static_cast<float>(step_size);
  h.bc2_sqrt_inv = static_cast<float>(bc2_sqrt_inv);
  h.grad_mul = static_cast<float>(1.0 / s.grad_scale);
  h.adamw = s.adamw;
  h.maximize = s.maximize;
  h.amsgrad = amsgrad;
  return h;
}

// One param's step: its buffers, checked, and its hyper-parameters (set once its step is known).
struct Job {
  Buf p, g, m, v, vmax, copy;  // vmax, copy: data null when not given
  opforge_adam::Hyper h;
};

// Checks one param's tensors; their spans go to `spans`, for check_no_overlap.
Job check_job(Where w, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
              const Tensor& exp_avg_sq, const Tensor* max_exp_avg_sq, const Tensor* param_copy,
              std::vector<Span>& spans) {
  Job j{};
  j.p = value_buf(param, w, kParam);
  j.g = value_buf(grad, w, kGrad);
  check_same_shape(param, grad, w);
  const int64_t n = j.p.numel;
  j.m = state_buf(exp_avg, w, kExpAvg, n);
  j.v = state_buf(exp_avg_sq, w, kExpAvgSq, n);
  if (max_exp_avg_sq) j.vmax = state_buf(*max_exp_avg_sq, w, kMaxExpAvgSq, n);
  if (param_copy) {
    j.copy = value_buf(*param_copy, w, kParamCopy);
    check_numel(j.copy, w, kParamCopy, n);
  }
  add_span(spans, j.p, w(kParam), true);
  add_span(spans, j.g, w(kGrad), false);
  add_span(spans, j.m, w(kExpAvg), true);
  add_span(spans, j.v, w(kExpAvgSq), true);
  if (max_exp_avg_sq) add_span(spans, j.vmax, w(kMaxExpAvgSq), true);
  if (param_copy) add_span(spans, j.copy, w(kParamCopy), true);
  return j;
}

// ---------------------------------------------------------------------------
// The work split.

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

int64_t round_up(int64_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The params of a step laid end to end in one index space, each starting on a
// kAlign boundary: param i is [off[i], off[i] + n_i). A chunk boundary is then
// aligned within its tensor too, and each tensor weighs at least kAlign elements
// (a piece has a cost of its own).
struct Plan {
  std::vector<Job> jobs;
  std::vector<int64_t> off;  // jobs.size() + 1 entries

  explicit Plan(std::vector<Job> js) : jobs(std::move(js)), off(jobs.size() + 1, 0) {
    for (size_t i = 0; i < jobs.size(); ++i) off[i + 1] = off[i] + round_up(jobs[i].p.numel);
  }

  // fn(job, begin, end) on each param's part of [b, e) (begin, end: elements of that param).
  template <class Fn>
  void pieces(int64_t b, int64_t e, Fn& fn) const {
    size_t i = std::upper_bound(off.begin(), off.end(), b) - off.begin() - 1;
    for (; i < jobs.size() && off[i] < e; ++i) {
      const int64_t lb = std::max(b, off[i]) - off[i], le = std::min(e - off[i], jobs[i].p.numel);
      if (lb < le) fn(jobs[i], lb, le);
    }
  }

  // fn(job, begin, end) over every element of every param, in one parallel region.
  template <class Fn>
  void parallel(int64_t num_threads, Fn fn) const {
    parallel_chunks(off.back(), num_threads, [&](int64_t b, int64_t e) { pieces(b, e, fn); });
  }
};

bool grads_finite(const Plan& plan, int64_t num_threads) {
  std::atomic<bool> bad{false};
  plan.parallel(num_threads, [&](const Job& j, int64_t b, int64_t e) {
    const Buf& g = j.g;
    if (!bad.load(std::memory_order_relaxed) &&
        !opforge_adam::all_finite(e - b, g.data + b * elem_size(g.dtype), g.dtype)) {
      bad.store(true, std::memory_order_relaxed);
    }
  });
  return !bad.load();
}

void update(const Plan& plan, int64_t num_threads) {
  plan.parallel(num_threads, [](const Job& j, int64_t b, int64_t e) {
    const auto at = [b](const Buf& x) { return x.data ? x.data + b * elem_size(x.dtype) : nullptr; };
    opforge_adam::adam_update(e - b, at(j.p), j.p.dtype, at(j.g), j.g.dtype,
                              reinterpret_cast<float*>(at(j.m)), reinterpret_cast<float*>(at(j.v)),
                              reinterpret_cast<float*>(at(j.vmax)), at(j.copy), j.copy.dtype, j.h);
  });
}

// ---------------------------------------------------------------------------
// The ops.

bool adam_step_(Tensor param, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                std::optional<Tensor> max_exp_avg_sq, std::optional<Tensor> param_copy,
                double lr, double beta1, double beta2, double eps, double weight_decay,
                int64_t step, bool adamw, bool bias_correction, bool maximize,
                double grad_scale, bool check_finite, int64_t num_threads) {
  const char* op = "adam_step_";
  const Scalars s{lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, maximize, grad_scale};
  STD_TORCH_CHECK(step >= 1, op, ": step must be >= 1 (the first step is 1), got ", step);
  check_scalars(op, s, num_threads);
  const Tensor* vmax = max_exp_avg_sq ? &*max_exp_avg_sq : nullptr;
  const Tensor* copy = param_copy ? &*param_copy : nullptr;
  std::vector<Span> spans;
  Job job = check_job({op, -1}, param, grad, exp_avg, exp_avg_sq, vmax, copy, spans);
  check_no_overlap(op, spans);
  job.h = make_hyper(s, static_cast<double>(step), vmax != nullptr);
  const Plan plan({job});
  if (check_finite && !grads_finite(plan, num_threads)) return false;
  update(plan, num_threads);
  return true;
}

void check_lengths(const char* op, size_t n, const std::vector<std::pair<const char*, size_t>>& needed,
                   const std::vector<std::pair<const char*, size_t>>& optional) {
  for (const auto& [name, got] : needed) {
    STD_TORCH_CHECK(got == n, op, ": ", name, " must have one tensor per param (", n,
                    " params), got ", got);
  }
  for (const auto& [name, got] : optional) {
    STD_TORCH_CHECK(got == 0 || got == n, op, ": ", name,
                    " must be empty or have one tensor per param (", n, " params), got ", got);
  }
}

// torch.optim.Adam's state["step"]: a one-element fp32 CPU tensor, the steps taken so far.
float* check_step(const Tensor& t, Where w, std::vector<Span>& spans) {
  check_tensor(t, w, kStep, false);
  const ScalarType s = t.scalar_type();
  const int64_t n = t.numel();
  STD_TORCH_CHECK(s == ScalarType::Float && n == 1, w.op, ": ", w(kStep),
                  " must be a one-element float32 tensor (torch.optim.Adam's state[\"step\"]), got ",
                  dtype_name(s), " with ", n, " elements");
  const Buf b{static_cast<char*>(t.data_ptr()), 1, DType::F32};
  const float taken = *reinterpret_cast<float*>(b.data);
  STD_TORCH_CHECK(taken >= 0.0f, w.op, ": ", w(kStep),
                  " must hold the number of steps taken so far (>= 0), got ", taken);
  add_span(spans, b, w(kStep), true);
  return reinterpret_cast<float*>(b.data);
}

bool adam_step_multi_(std::vector<Tensor> params, std::vector<Tensor> grads,
                      std::vector<Tensor> exp_avgs, std::vector<Tensor> exp_avg_sqs,
                      std::vector<Tensor> max_exp_avg_sqs, std::vector<Tensor> param_copies,
                      std::vector<Tensor> steps, double lr, double beta1, double beta2, double eps,
                      double weight_decay, bool adamw, bool bias_correction, bool maximize,
                      double grad_scale, bool check_finite, int64_t num_threads) {
  const char* op = "adam_step_multi_";
  const Scalars s{lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, maximize, grad_scale};
  check_scalars(op, s, num_threads);
  const size_t n = params.size();
  check_lengths(op, n,
                {{"grads", grads.size()}, {"exp_avgs", exp_avgs.size()},
                 {"exp_avg_sqs", exp_avg_sqs.size()}, {"steps", steps.size()}},
                {{"max_exp_avg_sqs", max_exp_avg_sqs.size()}, {"param_copies", param_copies.size()}});
  const bool amsgrad = !max_exp_avg_sqs.empty();
  std::vector<Span> spans;
  spans.reserve(7 * n);
  std::vector<Job> jobs(n);
  std::vector<float*> taken(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{op, static_cast<int64_t>(i)};
    jobs[i] = check_job(w, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i],
                        amsgrad ? &max_exp_avg_sqs[i] : nullptr,
                        param_copies.empty() ? nullptr : &param_copies[i], spans);
    taken[i] = check_step(steps[i], w, spans);
  }
  check_no_overlap(op, spans);
  for (size_t i = 0; i < n; ++i) {  // the step is the count after this one, as torch's `step += 1`
    const bool as_before = i > 0 && *taken[i] == *taken[i - 1];
    jobs[i].h = as_before ? jobs[i - 1].h : make_hyper(s, static_cast<double>(*taken[i] + 1.0f), amsgrad);
  }
  const Plan plan(std::move(jobs));
  if (check_finite && !grads_finite(plan, num_threads)) return false;
  for (float* t : taken) *t += 1.0f;
  update(plan, num_threads);
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
  m.def(
      "adam_step_multi_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] param_copies, "
      "Tensor(f!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
      "bool adamw, bool bias_correction, bool maximize, float grad_scale, bool check_finite, "
      "int num_threads) -> bool");
  m.def("simd_width() -> int");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  m.impl("adam_step_", TORCH_BOX(&adam_step_));
  m.impl("adam_step_multi_", TORCH_BOX(&adam_step_multi_));
  m.impl("simd_width", TORCH_BOX(&simd_width));
}
