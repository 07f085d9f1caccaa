// opforge CPU Adam: the checks of the ops' tensors, for cpu_adam.cpp (its only includer).
// Every message starts with the op's name and names the tensor ("adam_step_multi_:
// exp_avgs[3] must be float32 ..."); each tensor's dtype, size and data pointer are read
// once (through the stable ABI every query is a call into libtorch); no buffer the step
// writes may share memory with another.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "adam_core.h"
#include "opforge_stable.h"

namespace opforge_adam_checks {

using opforge_adam::DType;
using opforge_adam::elem_size;
using opforge_stable::device_name;
using opforge_stable::shape_str;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

inline const char* layout_name(torch::headeronly::Layout l) {
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

inline const char* dtype_name(ScalarType t) {
  return torch::headeronly::toString(t);
}

// ---------------------------------------------------------------------------
// Names in messages: "adam_step_: exp_avg ..." or "adam_step_multi_: exp_avgs[3] ...".

enum Role { kParam, kGrad, kExpAvg, kExpAvgSq, kMaxExpAvgSq, kParamCopy, kStep };

struct Name {
  Role role;
  int64_t index;  // the entry of adam_step_multi_'s lists; -1 for adam_step_
};

inline std::ostream& operator<<(std::ostream& os, const Name& n) {
  static const char* const single[] = {"param", "grad", "exp_avg", "exp_avg_sq",
                                       "max_exp_avg_sq", "param_copy", "step"};
  static const char* const list[] = {"params", "grads", "exp_avgs", "exp_avg_sqs",
                                     "max_exp_avg_sqs", "param_copies", "steps"};
  if (n.index < 0) return os << single[n.role];
  return os << list[n.role] << '[' << n.index << ']';
}

// The op doing the checking (every message starts with its name) and the param it checks.
struct Where {
  const char* op;
  int64_t index;  // -1: adam_step_'s single param
  Name operator()(Role r) const { return {r, index}; }
};

// ---------------------------------------------------------------------------
// Per-tensor checks. Each tensor's dtype, size and data pointer are read once:
// through the stable ABI every query is a call into libtorch.

// A checked tensor's data.
struct Buf {
  char* data;
  int64_t numel;
  DType dtype;
  uintptr_t begin() const { return reinterpret_cast<uintptr_t>(data); }
  uintptr_t end() const { return begin() + static_cast<uintptr_t>(numel) * elem_size(dtype); }
};

// CPU, dense, and (when want_contiguous) contiguous. Says what it got.
inline void check_tensor(const Tensor& t, Where w, Role r, bool want_contiguous = true) {
  STD_TORCH_CHECK(t.is_cpu(), w.op, ": ", w(r), " must be a CPU tensor, got ", device_name(t));
  STD_TORCH_CHECK(t.layout() == torch::headeronly::Layout::Strided, w.op, ": ", w(r),
                  " must be a dense (strided) tensor, got ", layout_name(t.layout()));
  if (want_contiguous) {
    STD_TORCH_CHECK(t.is_contiguous(), w.op, ": ", w(r),
                    " must be contiguous; call .contiguous() on it first (the update is in place)");
  }
}

// The core's dtype for float32/bfloat16/float16; an error otherwise.
inline DType core_dtype(ScalarType s, Where w, Role r) {
  switch (s) {
    case ScalarType::Float: return DType::F32;
    case ScalarType::BFloat16: return DType::BF16;
    case ScalarType::Half: return DType::F16;
    default: break;
  }
  STD_TORCH_CHECK(false, w.op, ": ", w(r), " must be float32, bfloat16 or float16, got ",
                  dtype_name(s));
  return DType::F32;  // unreachable
}

inline void check_numel(const Buf& b, Where w, Role r, int64_t numel) {
  STD_TORCH_CHECK(b.numel == numel, w.op, ": ", w(r), " must have as many elements as ",
                  w(kParam), " (", numel, "), got ", b.numel);
}

// A param, grad or param copy: float32, bfloat16 or float16.
inline Buf value_buf(const Tensor& t, Where w, Role r) {
  check_tensor(t, w, r);
  const DType d = core_dtype(t.scalar_type(), w, r);
  return {static_cast<char*>(t.data_ptr()), t.numel(), d};
}

// An optimizer state: float32, one element per param element.
inline Buf state_buf(const Tensor& t, Where w, Role r, int64_t numel) {
  check_tensor(t, w, r);
  const ScalarType s = t.scalar_type();
  STD_TORCH_CHECK(s == ScalarType::Float, w.op, ": ", w(r),
                  " must be float32 (optimizer states are kept in fp32), got ", dtype_name(s));
  const Buf b{static_cast<char*>(t.data_ptr()), t.numel(), DType::F32};
  check_numel(b, w, r, numel);
  return b;
}

inline void check_same_shape(const Tensor& param, const Tensor& grad, Where w) {
  const auto ps = param.sizes(), gs = grad.sizes();
  bool same = ps.size() == gs.size();
  for (size_t d = 0; same && d < ps.size(); ++d) same = ps[d] == gs[d];
  STD_TORCH_CHECK(same, w.op, ": ", w(kGrad), " must have the same shape as ", w(kParam), ", got ",
                  w(kParam), " ", shape_str(ps), " and ", w(kGrad), " ", shape_str(gs));
}

// ---------------------------------------------------------------------------
// No buffer the step writes may share memory with another buffer of the call
// (grads may share with grads: they are only read).

struct Span {
  Name name;
  int order;  // when it was added: a message names two clashing spans in the op's order
  bool written;
  uintptr_t begin, end;
};

inline void add_span(std::vector<Span>& s, const Buf& b, Name name, bool written) {
  if (b.numel > 0) s.push_back({name, static_cast<int>(s.size()), written, b.begin(), b.end()});
}

// Sorted by address, a span clashes with an earlier one iff it starts before the
// end of the furthest-reaching earlier span it may not share with: any span if it
// is written, the written ones if it is only read.
inline void check_no_overlap(const char* op, std::vector<Span>& s) {
  std::sort(s.begin(), s.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span *reach = nullptr, *wreach = nullptr;
  for (const Span& x : s) {
    const Span* y = x.written ? reach : wreach;
    if (y && x.begin < y->end) {
      const bool y_first = y->order < x.order;
      STD_TORCH_CHECK(false, op, ": ", (y_first ? y : &x)->name, " and ", (y_first ? &x : y)->name,
                      " share memory; each must be its own tensor");
    }
    if (!reach || x.end > reach->end) reach = &x;
    if (x.written && (!wreach || x.end > wreach->end)) wreach = &x;
  }
}

}  // namespace opforge_adam_checks
