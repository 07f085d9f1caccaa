// native_launch: launch a compiled GPU kernel (a Triton cubin's CUfunction) from C++, with
// the outputs allocated, the arguments packed and the TMA descriptors encoded here, so a call
// from Python is one op call and nothing else (issue 21; docs/architecture.md #15).
//
// A *recipe* says how to launch one call shape: the function, grid, warps and shared memory;
// the outputs to allocate; and the kernel's parameters in order (a "program" of slots, each a
// pointer to an input / output / held tensor, an integer, or a TMA descriptor of a tensor). The
// Python side works a recipe out once per call shape from the launch it made itself
// (native_launch/recipe.py) and defines it here under the key of that call's inputs; later
// calls with the same key run it here. The key holds everything the recipe depends on: each
// input's presence, dtype, device, sizes, strides and 16-byte alignment, the two ints of the
// call, and the current device and stream. Anything else misses, and a miss returns no outputs: the
// caller then takes its Python path (which plans, tunes, launches and defines the recipe).
//
// Ops, under -DOPFORGE_NS (default native_launch):
//   define(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, Tensor? t5, int s0,
//          int s1, int[] launch, int[] outputs, int[] program, Tensor[] held) -> ()
//   call(<table, t0..t5, s0, s1>) -> Tensor[]    the returned outputs; [] on a miss
//   pack(<the same>) -> Tensor[]   a dry run: [params (uint8, each at its alignment), launch
//                                   (int64: function, grid xyz, warps, shared, dependent), *outputs];
//                                   a TMA slot holds its encoding's inputs, not a descriptor
//   forget() -> ()                 drop every recipe
//   stats() -> int[]               [recipes, hits, misses]
// launch: [function, grid x, y, z, num_warps, shared bytes(, dependent)]; dependent 1: launched as a
// programmatic dependent of the kernel before it on the stream (cuLaunchKernelEx with programmatic
// stream serialization: triton's launch_pdl; the kernel waits with griddepcontrol.wait), where the
// driver has cuLaunchKernelEx (CUDA 12), else as a plain launch, which such a kernel also runs
// correctly. outputs: per output [dtype
// (c10::ScalarType's value), returned (0/1), ndim, sizes...], on t0's device. program, per
// kernel parameter: [0, src] a tensor's data pointer (src: 0-15 input, 16-31 output, 32+
// held); [1, width, value] an integer of 1, 2, 4 or 8 bytes; [3, src, rows, swizzle,
// elem_size, elem_type, ndim, box...] a TMA descriptor of src (read as (rows, numel / rows)
// when rows > 0, else by its sizes and strides), then its ndim int32 sizes and ndim int64
// strides, as triton's launcher passes them; [4, src, rows, swizzle, elem_size, elem_type, ndim, box...]
// a bare tensor map of src by its sizes and strides, or as (rows, numel / rows) when rows > 0 (a CUDA C++ kernel's __grid_constant__
// CUtensorMap), or 128 zero bytes when src is -1 (a map the kernel doesn't read at that shape);
// [5, n] the next n slots, pointers and integers, are the fields of one parameter, a struct passed
// by value (laid out as C does: aligned to its widest field, each field at its own alignment).
//
// The CUDA driver is reached through libcuda.so.1 and the current stream through
// libtorch_cuda's shim, both looked up at the first launch (dlopen/dlsym, as triton's own
// launcher does): the extension builds and loads on any machine, and `pack` runs without a GPU.

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "native_recipe.h"
#include "opforge_stable.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS native_launch
#endif

namespace {

using namespace opforge_native;  // Recipe, make_recipe, pack_params (native_recipe.h)
using OptT = std::optional<Tensor>;

// -- the CUDA driver's C ABI (cuda.h; stable since CUDA 4 and 12.0): the entry points used, with
// opaque handles and enums as integers (cuTensorMapEncodeTiled's type: native_recipe.h) --
using CuResult = int;
using LaunchFn = CuResult (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, void* stream, void** params, void** extra);
using ErrorFn = CuResult (*)(CuResult, const char**);
using StreamFn = int32_t (*)(int32_t device, void** stream);  // aoti_torch_get_current_cuda_stream
// cuLaunchKernelEx's config and one attribute (CUlaunchConfig, CUlaunchAttribute: CUDA 12.0+)
struct LaunchAttr {
  int32_t id;  // CUlaunchAttributeID
  char pad[4];
  union {
    char raw[64];
    int32_t i;
  } value;
};
struct LaunchConfig {
  unsigned gx, gy, gz, bx, by, bz, shared;
  void* stream;
  LaunchAttr* attrs;
  unsigned n_attrs;
};
static_assert(sizeof(LaunchAttr) == 72, "CUlaunchAttribute is 72 bytes");
constexpr int32_t kProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
using LaunchExFn = CuResult (*)(const LaunchConfig* config, void* f, void** params, void** extra);

struct Driver {
  LaunchFn launch = nullptr;
  LaunchExFn launch_ex = nullptr;
  EncodeFn encode = nullptr;
  ErrorFn error = nullptr;
  StreamFn stream = nullptr;
};

void* open_loaded(const char* name) {
  void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
  return h ? h : dlopen(name, RTLD_NOW);
}

const Driver& driver() {
  static Driver d = [] {
    Driver r;
    if (void* cuda = open_loaded("libcuda.so.1")) {
      r.launch = reinterpret_cast<LaunchFn>(dlsym(cuda, "cuLaunchKernel"));
      r.launch_ex = reinterpret_cast<LaunchExFn>(dlsym(cuda, "cuLaunchKernelEx"));
      r.encode = reinterpret_cast<EncodeFn>(dlsym(cuda, "cuTensorMapEncodeTiled"));
      r.error = reinterpret_cast<ErrorFn>(dlsym(cuda, "cuGetErrorString"));
    }
    if (void* tc = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD))
      r.stream = reinterpret_cast<StreamFn>(dlsym(tc, "aoti_torch_get_current_cuda_stream"));
    return r;
  }();
  STD_TORCH_CHECK(d.launch && d.encode && d.stream,
                  "native_launch: the CUDA driver (libcuda.so.1) or torch's CUDA library is not loaded: a "
                  "launch needs a CUDA build of torch and an NVIDIA driver");
  return d;
}

void check(CuResult r, const char* what) {
  if (r == 0) return;
  const char* s = nullptr;
  if (driver().error) driver().error(r, &s);
  STD_TORCH_CHECK(false, "native_launch: ", what, " failed: CUDA error ", r, " (", s ? s : "unknown", ")");
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

std::mutex g_mutex;
std::unordered_map<std::vector<int64_t>, Recipe, KeyHash> g_recipes;
int64_t g_hits = 0, g_misses = 0;
constexpr size_t kMaxRecipes = 4096;

// The key of a call: the table, the ints, each input's presence, dtype, device, sizes, strides
// and 16-byte alignment; and for CUDA inputs the current device and stream (a recipe may hold a
// buffer of one stream: the decode split's arrival counts). *stream: the stream to launch on.
std::vector<int64_t> key_of(int64_t table, const OptT* in, int64_t s0, int64_t s1, void** stream) {
  std::vector<int64_t> k{table, s0, s1};
  k.reserve(64);
  for (int i = 0; i < kInputs; ++i) {
    if (!in[i].has_value()) {
      k.push_back(-1);
      continue;
    }
    const Tensor& t = *in[i];
    auto sizes = t.sizes();
    auto strides = t.strides();
    k.push_back(static_cast<int64_t>(t.scalar_type()));
    k.push_back(t.is_cuda() ? 1 : 0);
    k.push_back(t.get_device_index());
    k.push_back(static_cast<int64_t>(sizes.size()));
    for (size_t d = 0; d < sizes.size(); ++d) {
      k.push_back(sizes[d]);
      k.push_back(strides[d]);
    }
    k.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16);
  }
  *stream = nullptr;
  if (in[0]->is_cuda()) {
    int32_t dev = torch::stable::accelerator::getCurrentDeviceIndex();
    STD_TORCH_CHECK(driver().stream(dev, stream) == 0, "native_launch: no current CUDA stream on device ", dev);
    // t0 on another device than the current one: a key no recipe has (they are defined with t0's
    // device current, as the function was loaded there)
    k.push_back(dev == in[0]->get_device_index() ? dev : -2 - dev);
    k.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(*stream)));
  }
  return k;
}

std::vector<Tensor> run(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, OptT t5, int64_t s0, int64_t s1,
                        bool dry) {
  const OptT in[kInputs] = {t0, t1, t2, t3, t4, t5};
  STD_TORCH_CHECK(t0.has_value(), "native_launch: t0 (whose device the outputs take) must be a tensor");
  void* stream = nullptr;
  std::vector<int64_t> key = key_of(table, in, s0, s1, &stream);
  alignas(128) unsigned char buf[kParamBytes];
  void* params[kMaxParams];
  std::vector<Tensor> outs;
  int64_t launch[7];
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_recipes.find(key);
    if (it == g_recipes.end()) {
      ++g_misses;
      return {};
    }
    ++g_hits;
    STD_TORCH_CHECK(dry || t0->is_cuda(), "native_launch.call: a recipe launches on CUDA tensors; t0 is on ",
                    opforge_stable::device_name(*t0), " (pack is the dry run)");
    Recipe& r = it->second;
    std::memcpy(launch, r.launch, sizeof(launch));
    const Tensor* src[32 + 16];
    size_t n_held = std::min<size_t>(r.held.size(), 16);
    for (int i = 0; i < kInputs; ++i) src[i] = in[i].has_value() ? &*in[i] : nullptr;
    outs.reserve(r.outputs.size());
    for (const Output& o : r.outputs)
      outs.push_back(torch::stable::new_empty(*t0, torch::headeronly::IntHeaderOnlyArrayRef(o.sizes), o.dtype));
    for (size_t j = 0; j < outs.size(); ++j) src[16 + j] = &outs[j];
    for (size_t h = 0; h < n_held; ++h) src[32 + h] = &r.held[h];
    int err = pack_params(r, src, buf, params, dry, dry ? nullptr : driver().encode);
    if (err != 0) check(err, "cuTensorMapEncodeTiled");
    if (dry) {
      Tensor bytes = torch::stable::new_empty(*t0, {static_cast<int64_t>(r.bytes)}, torch::headeronly::ScalarType::Byte);
      Tensor info = torch::stable::new_empty(*t0, {7}, torch::headeronly::ScalarType::Long);
      std::memcpy(bytes.mutable_data_ptr(), buf, r.bytes);
      std::memcpy(info.mutable_data_ptr(), launch, sizeof(launch));
      std::vector<Tensor> res{bytes, info};
      res.insert(res.end(), outs.begin(), outs.end());
      return res;
    }
    std::vector<Tensor> returned;
    for (size_t j = 0; j < outs.size(); ++j)
      if (r.outputs[j].returned) returned.push_back(outs[j]);
    outs.swap(returned);
  }
  const Driver& d = driver();
  if (launch[1] * launch[2] * launch[3] > 0 && launch[6] && d.launch_ex) {
    LaunchAttr dependent{};
    dependent.id = kProgrammaticStreamSerialization;
    dependent.value.i = 1;
    LaunchConfig c{static_cast<unsigned>(launch[1]), static_cast<unsigned>(launch[2]),
                   static_cast<unsigned>(launch[3]), static_cast<unsigned>(32 * launch[4]), 1, 1,
                   static_cast<unsigned>(launch[5]), stream, &dependent, 1};
    check(d.launch_ex(&c, reinterpret_cast<void*>(launch[0]), params, nullptr), "cuLaunchKernelEx");
  } else if (launch[1] * launch[2] * launch[3] > 0)
    check(d.launch(reinterpret_cast<void*>(launch[0]), static_cast<unsigned>(launch[1]),
                   static_cast<unsigned>(launch[2]), static_cast<unsigned>(launch[3]),
                   static_cast<unsigned>(32 * launch[4]), 1, 1, static_cast<unsigned>(launch[5]), stream, params,
                   nullptr),
          "cuLaunchKernel");
  return outs;
}

void define(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, OptT t5, int64_t s0, int64_t s1,
            std::vector<int64_t> launch, std::vector<int64_t> outputs, std::vector<int64_t> program,
            std::vector<Tensor> held) {
  const OptT in[kInputs] = {t0, t1, t2, t3, t4, t5};
  STD_TORCH_CHECK(t0.has_value(), "native_launch.define: t0 (whose device the outputs take) must be a tensor");
  Recipe r = make_recipe(launch, outputs, program, held);
  void* stream = nullptr;
  std::vector<int64_t> key = key_of(table, in, s0, s1, &stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recipes.size() >= kMaxRecipes) g_recipes.clear();
  g_recipes.insert_or_assign(std::move(key), std::move(r));
}

std::vector<Tensor> call(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, OptT t5, int64_t s0, int64_t s1) {
  return run(table, t0, t1, t2, t3, t4, t5, s0, s1, false);
}

std::vector<Tensor> pack(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, OptT t5, int64_t s0, int64_t s1) {
  return run(table, t0, t1, t2, t3, t4, t5, s0, s1, true);
}

void forget() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_recipes.clear();
}

std::vector<int64_t> stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {static_cast<int64_t>(g_recipes.size()), g_hits, g_misses};
}

}  // namespace

OPFORGE_LIBRARY(OPFORGE_NS, m) {
  m.def("define(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, Tensor? t5, int s0, int s1, "
        "int[] launch, int[] outputs, int[] program, Tensor[] held) -> ()");
  m.def("call(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, Tensor? t5, int s0, "
        "int s1) -> Tensor[]");
  m.def("pack(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, Tensor? t5, int s0, "
        "int s1) -> Tensor[]");
  m.def("forget() -> ()");
  m.def("stats() -> int[]");
}

OPFORGE_LIBRARY_IMPL(OPFORGE_NS, CompositeExplicitAutograd, m) {
  m.impl("define", TORCH_BOX(&define));
  m.impl("call", TORCH_BOX(&call));
  m.impl("pack", TORCH_BOX(&pack));
  m.impl("forget", TORCH_BOX(&forget));
  m.impl("stats", TORCH_BOX(&stats));
}
