// myops::scale_add: out = alpha * x + y on float32 CPU tensors of one shape.
// Stable-ABI headers only, so one binary runs on torch 2.10 and every later 2.x.
// opforge passes -DOPFORGE_NS=<extension name>: the ops' torch.ops namespace.

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>

// STABLE_TORCH_LIBRARY pastes its namespace with ##: one level of indirection expands the macro.
#define MYOPS_LIBRARY_(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define MYOPS_LIBRARY(ns, m) MYOPS_LIBRARY_(ns, m)
#define MYOPS_LIBRARY_IMPL_(ns, k, m) STABLE_TORCH_LIBRARY_IMPL(ns, k, m)
#define MYOPS_LIBRARY_IMPL(ns, k, m) MYOPS_LIBRARY_IMPL_(ns, k, m)

namespace {

using torch::stable::Tensor;

void check(const Tensor& t, const char* name) {
  STD_TORCH_CHECK(t.is_cpu(), "scale_add: ", name, " must be a CPU tensor");
  STD_TORCH_CHECK(t.scalar_type() == torch::headeronly::ScalarType::Float, "scale_add: ", name,
                  " must be float32, got ", torch::headeronly::toString(t.scalar_type()), ": convert it with .float()");
}

Tensor scale_add(Tensor x, Tensor y, double alpha) {
  check(x, "x");
  check(y, "y");
  const auto xs = x.sizes(), ys = y.sizes();
  bool same = xs.size() == ys.size();
  for (size_t d = 0; same && d < xs.size(); ++d) same = xs[d] == ys[d];
  STD_TORCH_CHECK(same, "scale_add: x and y must have the same shape");
  const Tensor xc = torch::stable::contiguous(x), yc = torch::stable::contiguous(y);
  Tensor out = torch::stable::empty_like(xc);
  const float* a = xc.const_data_ptr<float>();
  const float* b = yc.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  const float s = static_cast<float>(alpha);
  for (int64_t i = 0, n = xc.numel(); i < n; ++i) o[i] = s * a[i] + b[i];
  return out;
}

}  // namespace

MYOPS_LIBRARY(OPFORGE_NS, m) { m.def("scale_add(Tensor x, Tensor y, float alpha) -> Tensor"); }

MYOPS_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) { m.impl("scale_add", TORCH_BOX(&scale_add)); }
