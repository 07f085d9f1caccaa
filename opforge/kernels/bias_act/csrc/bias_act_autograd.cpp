// bias_act's autograd node in C++, for small tensors on the GPU: the eager path's forward and
// first backward without Python in between (a Python autograd.Function costs its call and,
// in the backward, a trip from the autograd engine's thread into the interpreter).
//
// The op, in the namespace -DOPFORGE_NS=<extension name>:
//   bias_act(Tensor x, Tensor? b, int dim, int act, int ref, float alpha, float gain,
//            float clamp, float clamp_ref, str act_name, str variant) -> Tensor
// calls the kernel variant `variant` (its ops <variant>::forward and ::backward, see
// opforge/kernels/bias_act/compiled.py for their contract) through the dispatcher. Scalars are
// those of the contract: act is Activation.index, ref 0/1/2 (nothing, y, x saved), clamp < 0
// for none, clamp_ref the clamp as y's dtype holds it. dim is non-negative.
//
// The backward is the first derivative on the variant's kernel. When the graph of the backward
// is wanted (create_graph: a second derivative will follow), it calls the differentiable
// custom op opforge::bias_act_backward (opforge/ops/bias_act.py) instead, whose registered
// autograd gives the second order.
//
// Only for what the Python side (opforge/kernels/bias_act/native_autograd.py) sends: x of
// fp32/fp16/bf16 with at least one element, b none or of a dtype the variant reads as it is,
// gain != 0. Not on the stable ABI (autograd has no stable API), so this is an extension of its
// own, keyed by the torch version; the kernels stay on the stable ABI.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "opforge_library.h"

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kRefY = 1, kRefX = 2;

// <ns>::<name>'s handle, found once per process.
const c10::OperatorHandle& op(const std::string& ns, const char* name) {
  static std::mutex mu;
  static std::unordered_map<std::string, c10::OperatorHandle> found;
  const std::string full = ns + "::" + name;
  std::lock_guard<std::mutex> lock(mu);
  auto it = found.find(full);
  if (it == found.end()) {
    it = found.emplace(full, c10::Dispatcher::singleton().findSchemaOrThrow(full.c_str(), "")).first;
  }
  return it->second;
}

// t with like's strides: t itself when it has them, else a copy.
Tensor conform(const Tensor& t, const Tensor& like) {
  return t.strides() == like.strides() ? t : at::empty_like(like).copy_(t);
}

// The flat walk's geometry of a dense t (layout.py's geometry()): channels and inner.
std::pair<int64_t, int64_t> geometry(const Tensor& t, int64_t dim, bool has_b) {
  if (!has_b || t.numel() == 0 || t.size(dim) == 1) return {1, 1};
  return {t.size(dim), t.stride(dim)};
}

std::optional<Tensor> some(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

struct Args {
  int64_t dim, act, ref;
  double alpha, gain, clamp, clamp_ref;
  std::string act_name, variant;
};

Tensor run_forward(const Tensor& x, const std::optional<Tensor>& b, const Args& a) {
  Tensor y = at::empty_like(x);
  const auto [channels, inner] = geometry(y, a.dim, b.has_value());
  torch::jit::Stack s{conform(x, y), b, y, channels, inner, a.act, a.alpha, a.gain, a.clamp};
  op(a.variant, "forward").callBoxed(&s);
  return y;
}

struct BiasActFn : public torch::autograd::Function<BiasActFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& b, int64_t dim,
                        int64_t act, int64_t ref, double alpha, double gain, double clamp, double clamp_ref,
                        std::string act_name, std::string variant) {
    Args a{dim, act, ref, alpha, gain, clamp, clamp_ref, std::move(act_name), std::move(variant)};
    Tensor y = run_forward(x, b, a);
    ctx->save_for_backward({ref == kRefX ? x : Tensor(), b ? *b : Tensor(), ref == kRefY ? y : Tensor()});
    ctx->saved_data["args"] = c10::IValue(c10::make_intrusive<c10::ivalue::Tuple>(
        std::vector<c10::IValue>{a.dim, a.act, a.ref, a.alpha, a.gain, a.clamp, a.clamp_ref, a.act_name, a.variant}));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &b = saved[1], &y = saved[2];
    const auto& e = ctx->saved_data["args"].toTupleRef().elements();
    const Args a{e[0].toInt(),    e[1].toInt(),    e[2].toInt(),       e[3].toDouble(), e[4].toDouble(),
                 e[5].toDouble(), e[6].toDouble(), e[7].toStringRef(), e[8].toStringRef()};
    variable_list out(11);  // one per forward argument
    const Tensor& dy = grads[0];
    const bool need_dx = ctx->needs_input_grad(0), need_db = b.defined() && ctx->needs_input_grad(1);
    if (!dy.defined() || !(need_dx || need_db)) return out;
    Tensor dx, db;
    if (at::GradMode::is_enabled()) {  // create_graph: the differentiable op
      torch::jit::Stack s{dy,  some(x), some(b), some(y), a.dim, a.act_name, a.alpha, a.gain,
                          a.clamp < 0 ? std::optional<double>() : std::optional<double>(a.clamp), need_db};
      op("opforge", "bias_act_backward").callBoxed(&s);
      dx = s[0].toTensor();
      db = s[1].toTensor();
    } else {
      dx = at::empty_like(dy);
      const auto [channels, inner] = geometry(dx, a.dim, b.defined());
      if (need_db) db = at::empty({channels}, b.options());
      const Tensor& src = a.ref == kRefY ? y : a.ref == kRefX ? x : Tensor();
      torch::jit::Stack s{conform(dy, dx), src.defined() ? some(conform(src, dx)) : std::nullopt,
                          a.ref == kRefX ? some(b) : std::nullopt, dx, some(db), channels, inner, a.act, a.ref,
                          a.alpha, a.gain, a.clamp, a.clamp_ref};
      op(a.variant, "backward").callBoxed(&s);
    }
    if (need_dx) out[0] = dx;
    if (need_db) out[1] = db;
    return out;
  }
};

Tensor bias_act_autograd(const Tensor& x, const std::optional<Tensor>& b, int64_t dim, int64_t act, int64_t ref,
                         double alpha, double gain, double clamp, double clamp_ref, c10::string_view act_name,
                         c10::string_view variant) {
  return BiasActFn::apply(x, b, dim, act, ref, alpha, gain, clamp, clamp_ref, std::string(act_name),
                          std::string(variant));
}

// Without autograd (no input needs a gradient, or grad mode is off): the forward alone.
Tensor bias_act_forward(const Tensor& x, const std::optional<Tensor>& b, int64_t dim, int64_t act, int64_t ref,
                        double alpha, double gain, double clamp, double clamp_ref, c10::string_view act_name,
                        c10::string_view variant) {
  return run_forward(x, b, Args{dim, act, ref, alpha, gain, clamp, clamp_ref, std::string(act_name),
                                std::string(variant)});
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("bias_act(Tensor x, Tensor? b, int dim, int act, int ref, float alpha, float gain, float clamp, "
        "float clamp_ref, str act_name, str variant) -> Tensor");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, Autograd, m) { m.impl("bias_act", &bias_act_autograd); }

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) { m.impl("bias_act", &bias_act_forward); }
