// bias_act's three ops as every compiled variant declares them (the CPU variants in
// bias_act.cpp, the CUDA one in bias_act_cuda.cpp; compiled.py calls either): the schemas,
// and the registration of the variant's forward, backward and backward2 functions.
#pragma once

#define OPFORGE_BIAS_ACT_DEF(m)                                                                            \
  m.def("forward(Tensor x, Tensor? b, Tensor(a!) y, int channels, int inner, int act, float alpha, "       \
        "float gain, float clamp) -> ()");                                                                 \
  m.def("backward(Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) dx, Tensor(b!)? db, int channels, "        \
        "int inner, int act, int ref_kind, float alpha, float gain, float clamp, float clamp_ref) -> ()"); \
  m.def("backward2(Tensor s, Tensor dy, Tensor? ref, Tensor? b, Tensor(a!) out, Tensor(b!)? db, "          \
        "int channels, int inner, int act, int ref_kind, float alpha, float gain, float clamp, "           \
        "float clamp_ref) -> ()")

#define OPFORGE_BIAS_ACT_IMPL(m)                  \
  m.impl("forward", TORCH_BOX(&forward));         \
  m.impl("backward", TORCH_BOX(&backward));       \
  m.impl("backward2", TORCH_BOX(&backward2))
