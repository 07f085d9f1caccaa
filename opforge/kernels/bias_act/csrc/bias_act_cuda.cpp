// bias_act's CUDA variant, the ops: their input checks, the device guard, the current stream
// and the scratch memory; the kernels (no torch header there) are reached through plan() and
// launch() of bias_act_cuda.h.
//
// Only LibTorch stable-ABI headers are used (built with -DTORCH_TARGET_VERSION for torch
// 2.10): the device guard is torch::stable::accelerator::DeviceGuard (2.9+) and the current
// stream comes from the shim's aoti_torch_get_current_cuda_stream (declared under USE_CUDA,
// exported by libtorch_cuda; torch::stable::accelerator::Stream::nativeHandle() is 2.13+).
//
// Ops, registered under the namespace given by -DOPFORGE_NS=<name> (see compiled.py, which
// calls them): every tensor of a call shares one dense layout and is walked as a flat array
// of numel elements from its data pointer; element k's channel is (k / inner) % channels.
//   forward(Tensor x, Tensor? b, Tensor(a!) y, int channels, int inner, int act,
//           float alpha, float gain, float clamp) -> ()
//   backward(Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) dx, Tensor(b!)? db, int channels,
//            int inner, int act, int ref_kind, float alpha, float gain, float clamp,
//            float clamp_ref) -> ()
//   backward2(Tensor s, Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) out, Tensor(b!)? db,
//             <the same scalars>) -> ()
//   forward_fresh(Tensor x, Tensor? b, int dim, int act, float alpha, float gain, float clamp)
//             -> Tensor[]   forward into a new y, the geometry worked out here; [] for a call it
//             does not take (see the function)
// b: float32, float16 or bfloat16, contiguous, `channels` elements, or None. clamp < 0: none.
// act: Activation.index. ref_kind 0 / 1 / 2: the derivative is taken from nothing / y / x (+ b);
// ref is that tensor (given exactly when ref_kind is 1 or 2); b is read only with ref_kind 2.
// clamp_ref: the clamp as y's dtype holds it (ref y masks |y| < clamp_ref; ref x recomputes
// |gain * act(x + b)| < clamp in fp32). db (float32, float16 or bfloat16, contiguous,
// `channels` elements), when given, gets the per-channel sums of the output's fp32 values,
// summed in fp32 in a fixed order (bias_act_cuda.h). backward2 of a pair with no second
// derivative (or ref_kind 0), and every gradient with gain 0, is zero.

#ifndef USE_CUDA
#define USE_CUDA  // the shim's CUDA entry points (aoti_torch_get_current_cuda_stream)
#endif

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "bias_act_cuda.h"
#include "bias_act_math.h"
#include "bias_act_ops.h"
#include "opforge_stable.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS bias_act_cuda
#endif


namespace {

namespace ba = opforge_bias_act;
namespace k = opforge_bias_act_cuda;
using opforge_stable::device_name;
using opforge_stable::shape_str;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

const char* const kActNames[] = {"?",   "linear", "relu", "lrelu",    "tanh",  "sigmoid",
                                 "elu", "selu",   "softplus", "swish", "gelu", "gelu_tanh"};
const char* const kRefNames[] = {"nothing", "y", "x"};

int dtype_code(ScalarType s) {
  switch (s) {
    case ScalarType::Float: return k::kF32;
    case ScalarType::Half: return k::kF16;
    case ScalarType::BFloat16: return k::kBF16;
    default: return -1;
  }
}

// Dense: no two elements share memory and there are no gaps (any order of the dims).
bool is_dense(const Tensor& t) {
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return true;
    if (sizes[d] != 1) dims.emplace_back(strides[d], sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t expect = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expect) return false;
    expect *= size;
  }
  return true;
}

bool same(torch::headeronly::IntHeaderOnlyArrayRef a, torch::headeronly::IntHeaderOnlyArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); ++d) {
    if (a[d] != b[d]) return false;
  }
  return true;
}

// The checked facts of a call, from its output tensor.
struct Frame {
  const char* op;
  const char* out_name;
  int32_t device;
  int dtype;
  int64_t n;
  const Tensor* out;
};

void check_cuda(const Frame& f, const Tensor& t, const char* name) {
  STD_TORCH_CHECK(t.is_cuda(), f.op, ": ", name, " must be a CUDA tensor, got ", device_name(t));
  const int32_t dev = t.get_device_index();
  STD_TORCH_CHECK(dev == f.device, f.op, ": ", name, " is on cuda:", dev, " but ", f.out_name, " is on cuda:",
                  f.device, "; every tensor of a call must be on one device");
}

Frame check_out(const char* op, const Tensor& out, const char* name) {
  STD_TORCH_CHECK(out.is_cuda(), op, ": ", name, " must be a CUDA tensor, got ", device_name(out));
  STD_TORCH_CHECK(out.layout() == torch::headeronly::Layout::Strided, op, ": ", name,
                  " must be a dense (strided) tensor");
  const int code = dtype_code(out.scalar_type());
  STD_TORCH_CHECK(code >= 0, op, ": ", name, " must be float32, float16 or bfloat16, got ",
                  torch::headeronly::toString(out.scalar_type()));
  STD_TORCH_CHECK(is_dense(out), op, ": ", name, " must be dense (no gaps, no overlap; any order of the dims), "
                  "got shape ", shape_str(out.sizes()), " and strides ", shape_str(out.strides()));
  return {op, name, out.get_device_index(), code, out.numel(), &out};
}

// A data input: the output's device, dtype, shape and strides.
const void* check_input(const Frame& f, const Tensor& t, const char* name) {
  check_cuda(f, t, name);
  STD_TORCH_CHECK(dtype_code(t.scalar_type()) == f.dtype, f.op, ": ", name, " must have ", f.out_name,
                  "'s dtype (", torch::headeronly::toString(f.out->scalar_type()), "), got ",
                  torch::headeronly::toString(t.scalar_type()));
  STD_TORCH_CHECK(t.numel() == f.n, f.op, ": ", name, " has ", t.numel(), " elements, expected ", f.n, " (",
                  f.out_name, "'s)");
  STD_TORCH_CHECK(same(t.sizes(), f.out->sizes()) && same(t.strides(), f.out->strides()), f.op, ": ", name,
                  " must have ", f.out_name, "'s shape and strides (one dense layout for every tensor of a call), got ",
                  shape_str(t.sizes()), " / ", shape_str(t.strides()), " and ", shape_str(f.out->sizes()), " / ",
                  shape_str(f.out->strides()));
  return t.data_ptr();
}

// A per-channel vector (b, db) of `channels` elements, float32, float16 or bfloat16, contiguous;
// its data and dtype code, or nullptr when not given.
void* check_vec(const Frame& f, const std::optional<Tensor>& t, const char* name, int64_t channels, int* code) {
  if (!t) return nullptr;
  check_cuda(f, *t, name);
  *code = dtype_code(t->scalar_type());
  STD_TORCH_CHECK(*code >= 0, f.op, ": ", name, " must be float32, float16 or bfloat16, got ",
                  torch::headeronly::toString(t->scalar_type()));
  STD_TORCH_CHECK(t->is_contiguous(), f.op, ": ", name, " must be contiguous");
  STD_TORCH_CHECK(t->numel() == channels, f.op, ": ", name, " must have ", channels, " elements (one per channel), got ",
                  t->numel());
  return t->data_ptr();
}

void check_geometry(const Frame& f, int64_t channels, int64_t inner) {
  STD_TORCH_CHECK(channels >= 1 && inner >= 1, f.op, ": channels and inner must be >= 1, got ", channels, " and ",
                  inner);
  if (f.n == 0) return;
  STD_TORCH_CHECK(channels <= f.n && inner <= f.n && f.n % (channels * inner) == 0, f.op, ": ", f.n,
                  " elements are not whole runs of inner = ", inner, " elements for channels = ", channels);
}

void check_scalars(const Frame& f, int64_t act, double alpha, double gain, double clamp) {
  STD_TORCH_CHECK(act >= 1 && act <= ba::kNumActs, f.op, ": unknown activation id ", act, " (1..", ba::kNumActs,
                  ")");
  STD_TORCH_CHECK(std::isfinite(alpha) && std::isfinite(gain), f.op, ": alpha and gain must be finite, got ", alpha,
                  " and ", gain);
  // In float32, as the kernels use them: the derivatives from y divide by the gain.
  STD_TORCH_CHECK(std::fabs(alpha) <= FLT_MAX && (gain == 0.0 || (std::fabs(gain) >= FLT_MIN && std::fabs(gain) <= FLT_MAX)),
                  f.op, ": alpha must be within float32's range and gain 0 or a normal float32 magnitude, got ",
                  alpha, " and ", gain);
  STD_TORCH_CHECK(!std::isnan(clamp), f.op, ": clamp must be a number (< 0 for none), got NaN");
}

void check_cuda_error(const char* op, cudaError_t err) {
  STD_TORCH_CHECK(err == cudaSuccess, op, ": CUDA error: ", cudaGetErrorString(err));
}

cudaStream_t current_stream(const char* op, int32_t device) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS, op,
                  ": could not get the current CUDA stream of cuda:", device);
  return static_cast<cudaStream_t>(stream);
}

float as_float(double v) { return static_cast<float>(v); }

// ---------------------------------------------------------------------------------------
// The ops.

void forward(Tensor x, std::optional<Tensor> b, Tensor y, int64_t channels, int64_t inner, int64_t act,
             double alpha, double gain, double clamp) {
  const Frame f = check_out("bias_act_cuda forward", y, "y");
  const void* xp = check_input(f, x, "x");
  check_geometry(f, channels, inner);
  check_scalars(f, act, alpha, gain, clamp);
  int b_dtype = k::kF32;
  const void* bp = check_vec(f, b, "b", channels, &b_dtype);
  if (f.n == 0) return;
  const torch::stable::accelerator::DeviceGuard guard(f.device);
  k::Plan plan;
  check_cuda_error(f.op, k::plan(k::kFwd, f.dtype, static_cast<int>(act), f.n, channels, inner, false, f.device,
                                 &plan));
  check_cuda_error(f.op, k::launch(plan, k::kFwd, f.dtype, xp, nullptr, nullptr, bp, b_dtype,
                                   y.data_ptr(), nullptr, k::kF32, nullptr, f.n, channels, inner, as_float(alpha),
                                   as_float(gain), as_float(clamp), -1.0f, current_stream(f.op, f.device)));
}

// forward into a fresh y (empty_like(x): x's strides), the geometry worked out here: a whole
// call for a no-grad bias_act in one op call (ops/bias_act.py's fast path). [] for a call it
// does not take, which the Python path then checks (and raises on, or runs): x not a dense CUDA
// tensor of a kernel dtype, or empty; b not a contiguous 1-D kernel-dtype vector of x.shape[dim]
// elements on x's device; dim out of range.
std::vector<Tensor> forward_fresh(Tensor x, std::optional<Tensor> b, int64_t dim, int64_t act, double alpha,
                                  double gain, double clamp) {
  if (!x.is_cuda() || x.layout() != torch::headeronly::Layout::Strided || dtype_code(x.scalar_type()) < 0 ||
      x.numel() == 0 || !is_dense(x)) {
    return {};
  }
  int64_t channels = 1, inner = 1;
  if (b) {
    const Tensor& bt = *b;
    const int64_t nd = x.dim();
    if (nd == 0 || dim < -nd || dim >= nd) return {};
    if (dim < 0) dim += nd;
    if (!bt.is_cuda() || bt.get_device_index() != x.get_device_index() || bt.dim() != 1 ||
        bt.size(0) != x.size(dim) || dtype_code(bt.scalar_type()) < 0 || !bt.is_contiguous()) {
      return {};
    }
    if (x.size(dim) != 1) {
      channels = x.size(dim);
      inner = x.stride(dim);  // layout.py's geometry: a dense tensor's channel runs
    }
  }
  // empty_like(x) for a dense x is empty_strided of its sizes and strides; the shim's own call
  // skips the dispatcher's boxing of empty_like's five optional arguments (a few µs a call)
  int32_t dtype = 0, device_type = 0;
  AtenTensorHandle made = nullptr;
  const auto sizes = x.sizes();
  const auto strides = x.strides();
  STD_TORCH_CHECK(aoti_torch_get_dtype(x.get(), &dtype) == AOTI_TORCH_SUCCESS &&
                      aoti_torch_get_device_type(x.get(), &device_type) == AOTI_TORCH_SUCCESS &&
                      aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), dtype,
                                               device_type, x.get_device_index(), &made) == AOTI_TORCH_SUCCESS,
                  "bias_act_cuda forward_fresh: could not allocate y (", shape_str(sizes), ")");
  Tensor y(made);
  forward(x, b, y, channels, inner, act, alpha, gain, clamp);
  return {y};
}

// backward (order 1) and backward2 (order 2; s given).
void grad(const char* op, int order, const std::optional<Tensor>& s, const Tensor& dy,
          const std::optional<Tensor>& ref, const std::optional<Tensor>& b, const Tensor& out,
          const std::optional<Tensor>& db, int64_t channels, int64_t inner, int64_t act, int64_t ref_kind,
          double alpha, double gain, double clamp, double clamp_ref) {
  const Frame f = check_out(op, out, order == 1 ? "dx" : "out");
  const void* sp = s ? check_input(f, *s, "s") : nullptr;
  const void* dyp = check_input(f, dy, "dy");
  check_geometry(f, channels, inner);
  check_scalars(f, act, alpha, gain, clamp);
  STD_TORCH_CHECK(!std::isnan(clamp_ref), op, ": clamp_ref must be a number (< 0 for none), got NaN");
  STD_TORCH_CHECK(ref_kind >= 0 && ref_kind <= 2, op, ": ref_kind must be 0 (none), 1 (y) or 2 (x), got ", ref_kind);
  STD_TORCH_CHECK(ref.has_value() == (ref_kind != ba::kRefNone), op,
                  ": ref must be given exactly when ref_kind is 1 (y) or 2 (x); ref_kind is ", ref_kind);
  const int a = static_cast<int>(act);
  const bool first = ref_kind == ba::kRefNone || (ref_kind == ba::kRefY && ba::has_d_from_value(a)) ||
                     (ref_kind == ba::kRefX && ba::has_d_from_pre(a));
  STD_TORCH_CHECK(first, op, ": ", kActNames[a], " has no derivative kernel from ", kRefNames[ref_kind],
                  " (ref_kind ", ref_kind, "); see Activation.ref_for");
  const void* rp = ref ? check_input(f, *ref, ref_kind == ba::kRefY ? "ref (y)" : "ref (x)") : nullptr;
  int b_dtype = k::kF32, db_dtype = k::kF32;
  const void* bp = check_vec(f, b, "b", channels, &b_dtype);
  void* dbp = check_vec(f, db, "db", channels, &db_dtype);
  if (f.n == 0) return;

  int mode;
  const void *in0 = dyp, *in1 = nullptr, *in2 = nullptr;
  if (gain == 0.0) {
    mode = k::kZero;
  } else if (order == 1) {
    mode = ref_kind == ba::kRefNone ? k::kBwdNone : ref_kind == ba::kRefY ? k::kBwdY : k::kBwdX;
    in1 = rp;
  } else {
    const bool second = (ref_kind == ba::kRefY && ba::has_d2_from_value(a)) ||
                        (ref_kind == ba::kRefX && ba::has_d2_from_pre(a));
    mode = !second ? k::kZero : ref_kind == ba::kRefY ? k::kBwd2Y : k::kBwd2X;
    in0 = sp;
    in1 = dyp;
    in2 = rp;
  }
  const torch::stable::accelerator::DeviceGuard guard(f.device);
  const cudaStream_t stream = current_stream(op, f.device);
  k::Plan plan;
  check_cuda_error(op, k::plan(mode, f.dtype, a, f.n, channels, inner, dbp != nullptr, f.device, &plan));
  std::optional<Tensor> scratch;  // the walk's partial sums, freed (stream-ordered) on return
  if (plan.scratch > 0) scratch = torch::stable::new_empty(*db, {plan.scratch}, ScalarType::Float);
  check_cuda_error(op, k::launch(plan, mode, f.dtype, in0, in1, in2, ref_kind == ba::kRefX ? bp : nullptr, b_dtype,
                                 out.data_ptr(), dbp, db_dtype,
                                 scratch ? static_cast<float*>(scratch->data_ptr()) : nullptr, f.n, channels, inner,
                                 as_float(alpha), as_float(gain), as_float(clamp), as_float(clamp_ref), stream));
}

void backward(Tensor dy, std::optional<Tensor> ref, std::optional<Tensor> b, Tensor dx, std::optional<Tensor> db,
              int64_t channels, int64_t inner, int64_t act, int64_t ref_kind, double alpha, double gain,
              double clamp, double clamp_ref) {
  grad("bias_act_cuda backward", 1, std::nullopt, dy, ref, b, dx, db, channels, inner, act, ref_kind, alpha, gain,
       clamp, clamp_ref);
}

void backward2(Tensor s, Tensor dy, std::optional<Tensor> ref, std::optional<Tensor> b, Tensor out,
               std::optional<Tensor> db, int64_t channels, int64_t inner, int64_t act, int64_t ref_kind,
               double alpha, double gain, double clamp, double clamp_ref) {
  grad("bias_act_cuda backward2", 2, s, dy, ref, b, out, db, channels, inner, act, ref_kind, alpha, gain, clamp,
       clamp_ref);
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  OPFORGE_BIAS_ACT_DEF(m);
  m.def("forward_fresh(Tensor x, Tensor? b, int dim, int act, float alpha, float gain, float clamp) -> Tensor[]");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  OPFORGE_BIAS_ACT_IMPL(m);
  m.impl("forward_fresh", TORCH_BOX(&forward_fresh));
}
