// opforge bias_act for the CPU: y = clamp(act(x + b) * gain, -clamp, clamp), its first
// derivative (dx, and db reduced in fp32) and its second, on fp32 / fp16 / bf16 tensors
// with fp32 compute, vectorised (bias_act_vec.h) and split across OpenMP threads.
//
// Only LibTorch stable-ABI headers; compiled with -DTORCH_TARGET_VERSION (torch 2.10 API),
// -O3, -fopenmp and the ISA flags of one variant.
//
// The ops take tensors that share one dense layout (opforge/kernels/bias_act/compiled.py
// makes sure) and walk them as flat arrays of numel elements: element k has channel
// (k / inner) % channels. Ops (namespace -DOPFORGE_NS=<extension name>):
//   forward(Tensor x, Tensor? b, Tensor(a!) y, int channels, int inner, int act,
//           float alpha, float gain, float clamp) -> ()
//   backward(Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) dx, Tensor(b!)? db, int channels,
//            int inner, int act, int ref_kind, float alpha, float gain, float clamp,
//            float clamp_ref) -> ()
//   backward2(Tensor s, Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) out, Tensor(b!)? db,
//             ...the same scalars) -> ()
//   simd_width() -> int
// clamp < 0: no clamp. ref_kind 0/1/2: the derivative is computed from nothing / y / x + b
// (ref holds y or x). clamp_ref: the clamp as y's dtype holds it (|y| < clamp_ref: not
// clamped). db: fp32, `channels` elements, the sum of dx (out) per channel.
//
// This file unpacks each tensor into a plain Arg and registers the ops: the one translation
// unit with torch's headers, kept to that so that the variant's cold build stays short. The
// checks and the walk over blocks and threads are in bias_act_run.cpp, the activation loops
// and dtype conversions in bias_act_loops.cpp (see bias_act_cpu.h).

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "bias_act_ops.h"
#include "opforge_stable.h"

#include <cstdint>
#include <optional>
#include <string>

#include "bias_act_cpu.h"

namespace {

using namespace opforge_bias_act;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

Arg arg(const Tensor& t) {
  Arg a;
  a.present = true;
  a.cpu = t.is_cpu();
  a.device = a.cpu ? "cpu" : opforge_stable::device_name(t);
  const ScalarType st = t.scalar_type();
  a.dtype = st == ScalarType::Float      ? static_cast<int>(DType::F32)
            : st == ScalarType::BFloat16 ? static_cast<int>(DType::BF16)
            : st == ScalarType::Half     ? static_cast<int>(DType::F16)
                                         : -1;
  a.dtype_name = torch::headeronly::toString(st);
  a.numel = t.numel();
  a.contiguous = t.is_contiguous();
  a.data = a.cpu ? t.data_ptr() : nullptr;
  return a;
}

Arg arg(const std::optional<Tensor>& t) { return t ? arg(*t) : Arg{}; }

void raise_if(const std::string& error) { STD_TORCH_CHECK(error.empty(), error); }

void forward(Tensor x, std::optional<Tensor> b, Tensor y, int64_t channels, int64_t inner, int64_t act,
             double alpha, double gain, double clamp) {
  raise_if(OPFORGE_NS::forward_op(arg(x), arg(b), arg(y), channels, inner, act, alpha, gain, clamp));
}

void backward(Tensor dy, std::optional<Tensor> ref, std::optional<Tensor> b, Tensor dx, std::optional<Tensor> db,
              int64_t channels, int64_t inner, int64_t act, int64_t ref_kind, double alpha, double gain,
              double clamp, double clamp_ref) {
  raise_if(OPFORGE_NS::grad_op(1, Arg{}, arg(dy), arg(ref), arg(b), arg(dx), arg(db), channels, inner, act,
                               ref_kind, alpha, gain, clamp, clamp_ref));
}

void backward2(Tensor s, Tensor dy, std::optional<Tensor> ref, std::optional<Tensor> b, Tensor out,
               std::optional<Tensor> db, int64_t channels, int64_t inner, int64_t act, int64_t ref_kind,
               double alpha, double gain, double clamp, double clamp_ref) {
  raise_if(OPFORGE_NS::grad_op(2, arg(s), arg(dy), arg(ref), arg(b), arg(out), arg(db), channels, inner, act,
                               ref_kind, alpha, gain, clamp, clamp_ref));
}

int64_t simd_width() { return OPFORGE_NS::simd_width(); }

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  OPFORGE_BIAS_ACT_DEF(m);
  m.def("simd_width() -> int");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  OPFORGE_BIAS_ACT_IMPL(m);
  m.impl("simd_width", TORCH_BOX(&simd_width));
}
