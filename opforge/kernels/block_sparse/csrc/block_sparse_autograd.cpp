// block_sparse's autograd node in C++, for the eager training path: y = x Wᵀ + bias and its
// first backward with no Python between the op call and the kernels' launches (a Python
// autograd.Function costs its call and, in the backward, a trip from the autograd engine's
// thread into the interpreter: tens of µs a step on the H100 host, issue 21).
//
// The op, in the namespace -DOPFORGE_NS=<extension name>:
//   linear(Tensor x, Tensor w, Tensor? bias, Tensor rows, Tensor cols, Tensor row_ptr,
//          Tensor col_ptr, Tensor col_order, int out_features, int tf32, int[] tables,
//          str native) -> Tensor
// x (T, in) and w (nnz, bh, bw) contiguous, the layout's indices on their device (see
// opforge/ops/block_sparse.py). Each launch is first asked of the native_launch op `<native>::call`
// with the table of its kind (tables: forward, input gradient, weight gradient;
// opforge/kernels/native_launch), which replays a recipe planned before; on a miss (a new shape:
// the call returns no tensors), or with a table of 0, the differentiable custom ops opforge::
// block_sparse_mm / _mm_t / _sddmm_bias run it, in Python, and plan it for next time. The keys
// and scalars passed to `call` are the ones opforge/kernels/block_sparse/triton_impl.py uses.
//
// When the backward's graph is wanted (create_graph: a second derivative will follow), it
// calls the differentiable custom ops opforge::block_sparse_mm_t and _sddmm, whose registered
// autograd gives every higher order. Not on the stable ABI (autograd has no stable API): an
// extension of its own, keyed by the torch version.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/sum.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "opforge_library.h"

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// <full name>'s handle, found once per process.
const c10::OperatorHandle& op(const std::string& full) {
  static std::mutex mu;
  static std::unordered_map<std::string, c10::OperatorHandle> found;
  std::lock_guard<std::mutex> lock(mu);
  auto it = found.find(full);
  if (it == found.end()) it = found.emplace(full, c10::Dispatcher::singleton().findSchemaOrThrow(full.c_str(), "")).first;
  return it->second;
}

std::optional<Tensor> some(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

// The native_launch replay of one launch: its outputs, or none on a miss (or without a table).
std::vector<Tensor> replay(const std::string& ns, int64_t table, std::optional<Tensor> t0, std::optional<Tensor> t1,
                           std::optional<Tensor> t2, std::optional<Tensor> t3, std::optional<Tensor> t4,
                           std::optional<Tensor> t5, int64_t s0, int64_t s1) {
  if (table == 0 || ns.empty()) return {};
  torch::jit::Stack s{table, t0, t1, t2, t3, t4, t5, s0, s1};
  op(ns + "::call").callBoxed(&s);
  return s[0].toTensorVector();
}

struct Saved {
  int64_t out_features, tf32;
  std::vector<int64_t> tables;
  std::string ns;
  bool has_bias;
};

Tensor run_forward(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, const Tensor& rows,
                   const Tensor& cols, const Tensor& row_ptr, const Tensor& col_ptr, const Tensor& col_order,
                   int64_t out_features, int64_t tf32, const std::vector<int64_t>& tables, const std::string& ns) {
  TORCH_CHECK(tables.size() == 3, "block_sparse_autograd.linear: tables must be [forward, input grad, weight grad]");
  std::vector<Tensor> got = replay(ns, tables[0], x, w, bias, cols, row_ptr, rows, out_features, tf32);
  if (!got.empty()) return got[0];
  torch::jit::Stack s{x, w, bias, rows, cols, row_ptr, col_ptr, col_order, out_features};
  op("opforge::block_sparse_mm").callBoxed(&s);
  return s[0].toTensor();
}

struct LinearFn : public torch::autograd::Function<LinearFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias,
                        const Tensor& rows, const Tensor& cols, const Tensor& row_ptr, const Tensor& col_ptr,
                        const Tensor& col_order, int64_t out_features, int64_t tf32, std::vector<int64_t> tables,
                        std::string ns) {
    Tensor y = run_forward(x, w, bias, rows, cols, row_ptr, col_ptr, col_order, out_features, tf32, tables, ns);
    ctx->save_for_backward({x, w, rows, cols, row_ptr, col_ptr, col_order});
    ctx->saved_data["args"] = c10::IValue(c10::make_intrusive<c10::ivalue::Tuple>(std::vector<c10::IValue>{
        out_features, tf32, c10::IValue(tables), ns, bias.has_value()}));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1], &rows = saved[2], &cols = saved[3], &row_ptr = saved[4],
                 &col_ptr = saved[5], &col_order = saved[6];
    const auto& e = ctx->saved_data["args"].toTupleRef().elements();
    const Saved a{e[0].toInt(), e[1].toInt(), e[2].toIntVector(), e[3].toStringRef(), e[4].toBool()};
    variable_list out(12);  // one per forward argument
    if (!grads[0].defined()) return out;
    const Tensor dy = grads[0].contiguous();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1),
               need_b = a.has_bias && ctx->needs_input_grad(2);
    const int64_t in_features = x.size(1), bh = w.size(1), bw = w.size(2);
    Tensor dx, dw, db;
    if (at::GradMode::is_enabled()) {  // create_graph: the differentiable ops
      if (need_x) {
        torch::jit::Stack s{dy, w, rows, cols, row_ptr, col_ptr, col_order, in_features};
        op("opforge::block_sparse_mm_t").callBoxed(&s);
        dx = s[0].toTensor();
      }
      if (need_w) {
        torch::jit::Stack s{dy, x, rows, cols, row_ptr, col_ptr, col_order, bh, bw};
        op("opforge::block_sparse_sddmm").callBoxed(&s);
        dw = s[0].toTensor();
      }
      if (need_b) db = dy.sum(0);
    } else {
      if (need_x) {
        std::vector<Tensor> got = replay(a.ns, a.tables[1], dy, w, rows, col_ptr, col_order, std::nullopt, in_features,
                                         a.tf32);
        if (!got.empty()) {
          dx = got[0];
        } else {
          torch::jit::Stack s{dy, w, rows, cols, row_ptr, col_ptr, col_order, in_features};
          op("opforge::block_sparse_mm_t").callBoxed(&s);
          dx = s[0].toTensor();
        }
      }
      if (need_w) {
        std::vector<Tensor> got = replay(a.ns, a.tables[2], dy, x, cols, row_ptr, rows, std::nullopt, bh << 16 | bw,
                                         2 * static_cast<int64_t>(need_b) + a.tf32);
        if (!got.empty()) {
          dw = got[0];
          if (need_b) db = got[1];
        } else {
          torch::jit::Stack s{dy, x, rows, cols, row_ptr, col_ptr, col_order, bh, bw, need_b};
          op("opforge::block_sparse_sddmm_bias").callBoxed(&s);
          dw = s[0].toTensor();
          if (need_b) db = s[1].toTensor();
        }
      } else if (need_b) {
        db = dy.sum(0);
      }
    }
    if (need_x) out[0] = dx;
    if (need_w) out[1] = dw;
    if (need_b) out[2] = db;
    return out;
  }
};

Tensor linear_autograd(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, const Tensor& rows,
                       const Tensor& cols, const Tensor& row_ptr, const Tensor& col_ptr, const Tensor& col_order,
                       int64_t out_features, int64_t tf32, c10::IntArrayRef tables, c10::string_view ns) {
  return LinearFn::apply(x, w, bias, rows, cols, row_ptr, col_ptr, col_order, out_features, tf32, tables.vec(),
                         std::string(ns));
}

// Without autograd (inference mode, or below it): the forward alone.
Tensor linear_forward(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias, const Tensor& rows,
                      const Tensor& cols, const Tensor& row_ptr, const Tensor& col_ptr, const Tensor& col_order,
                      int64_t out_features, int64_t tf32, c10::IntArrayRef tables, c10::string_view ns) {
  return run_forward(x, w, bias, rows, cols, row_ptr, col_ptr, col_order, out_features, tf32, tables.vec(),
                     std::string(ns));
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("linear(Tensor x, Tensor w, Tensor? bias, Tensor rows, Tensor cols, Tensor row_ptr, Tensor col_ptr, "
        "Tensor col_order, int out_features, int tf32, int[] tables, str native) -> Tensor");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, Autograd, m) { m.impl("linear", &linear_autograd); }

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) { m.impl("linear", &linear_forward); }
