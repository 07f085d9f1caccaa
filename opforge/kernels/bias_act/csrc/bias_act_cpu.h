// What the three translation units of bias_act's CPU variant share, and nothing heavier:
// the parameters of a call, the storage dtypes, and the entry points each TU defines.
//   bias_act.cpp        the host code: unpacks each tensor into an Arg, registers the ops
//   bias_act_run.cpp    the argument checks, the threads and the walk over blocks (OpenMP)
//   bias_act_loops.cpp  the activation loops per (activation, ref, order), the dtype loads
//                       and stores
// Only the host code includes torch's (stable-ABI) headers, and it is kept to that: its
// compile is the cold build's critical path, and ninja builds the other two beside it.
//
// The entry points are in a namespace named after the variant (-DOPFORGE_NS), so two ISA
// variants loaded in one process never share a symbol.

#pragma once

#include <cstdint>
#include <string>

#ifndef OPFORGE_NS
#define OPFORGE_NS opforge_bias_act_cpu
#endif

namespace opforge_bias_act {

struct Params {
  int act, ref;
  float alpha, gain, inv_gain, clamp, clamp_ref;
  bool clamped;
};

using FwdLoop = void (*)(float*, int64_t, const Params&);
using GradLoop = void (*)(float*, const float*, int64_t, const Params&);

// Storage dtypes; a load converts n elements at element k to fp32 (zero-padded to whole
// vectors), a store converts back (bf16: round to nearest even, NaN kept a NaN).
enum class DType { F32, BF16, F16 };
using LoadFn = void (*)(const void* base, int64_t k, int64_t n, float* buf);
using StoreFn = void (*)(void* base, int64_t k, int64_t n, const float* buf);

// One tensor argument as the checks see it.
struct Arg {
  bool present = false;        // false: an optional tensor that was not given
  bool cpu = false, contiguous = false;
  int dtype = -1;              // a DType, or -1: none of the three
  const char* dtype_name = "";
  std::string device;          // "cpu", "cuda", ...
  int64_t numel = 0;
  void* data = nullptr;
};

namespace OPFORGE_NS {
// bias_act_run.cpp: check an op's arguments, then run it. Returns "" or the error.
std::string forward_op(const Arg& x, const Arg& b, const Arg& y, int64_t channels, int64_t inner, int64_t act,
                       double alpha, double gain, double clamp);
// order 1: backward (s absent); order 2: backward2
std::string grad_op(int order, const Arg& s, const Arg& dy, const Arg& ref, const Arg& b, const Arg& out,
                    const Arg& db, int64_t channels, int64_t inner, int64_t act, int64_t ref_kind, double alpha,
                    double gain, double clamp, double clamp_ref);

// bias_act_loops.cpp
LoadFn load_for(DType d);
StoreFn store_for(DType d);
FwdLoop fwd_loop_for(int act);
GradLoop grad1_loop_for(int act, int ref);  // nullptr: none
GradLoop grad2_loop_for(int act, int ref);  // nullptr: none

// bias_act_run.cpp. Flat arrays of numel elements (numel > 0); element k has channel
// (k / inner) % channels; b and db (channels floats) may be null, as may s and ref in grad.
void forward(DType d, const void* x, const float* b, void* y, int64_t numel, int64_t channels, int64_t inner,
             const Params& p);
// out = [s *] dy * (derivative from ref), db[c] = the sum of out over channel c (fp64 sums)
void grad(DType d, const void* s, const void* dy, const void* ref, const float* b, void* out, float* db,
          int64_t numel, int64_t channels, int64_t inner, const Params& p, GradLoop loop);
int simd_width();  // fp32 lanes of this variant's vectors
}  // namespace OPFORGE_NS

}  // namespace opforge_bias_act
