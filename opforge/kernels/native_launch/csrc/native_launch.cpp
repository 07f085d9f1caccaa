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
//   define(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, int s0,
//          int s1, int[] launch, int[] outputs, int[] program, Tensor[] held) -> ()
//   call(<table, t0..t4, s0, s1>) -> Tensor[]    the returned outputs; [] on a miss
//   pack(<the same>) -> Tensor[]   a dry run: [params (uint8, each at its alignment), launch
//                                   (int64: function, grid xyz, warps, shared), *outputs];
//                                   a TMA slot holds its encoding's inputs, not a descriptor
//   forget() -> ()                 drop every recipe
//   stats() -> int[]               [recipes, hits, misses]
// launch: [function, grid x, y, z, num_warps, shared bytes]. outputs: per output [dtype
// (c10::ScalarType's value), returned (0/1), ndim, sizes...], on t0's device. program, per
// kernel parameter: [0, src] a tensor's data pointer (src: 0-15 input, 16-31 output, 32+
// held); [1, width, value] an integer of 1, 2, 4 or 8 bytes; [3, src, rows, swizzle,
// elem_size, elem_type, ndim, box...] a TMA descriptor of src (read as (rows, numel / rows)
// when rows > 0, else by its sizes and strides), then its ndim int32 sizes and ndim int64
// strides, as triton's launcher passes them.
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

#include "opforge_stable.h"

#ifndef OPFORGE_NS
#define OPFORGE_NS native_launch
#endif

namespace {

using torch::stable::Tensor;
using OptT = std::optional<Tensor>;

// -- the CUDA driver's C ABI (cuda.h; stable since CUDA 4 and 12.0): the three entry points
// used, with opaque handles and enums as integers --
using CuResult = int;
using LaunchFn = CuResult (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, void* stream, void** params, void** extra);
using EncodeFn = CuResult (*)(void* map, int dtype, uint32_t rank, void* addr, const uint64_t* dims,
                              const uint64_t* strides, const uint32_t* box, const uint32_t* elem_strides,
                              int interleave, int swizzle, int l2_promotion, int oob_fill);
using ErrorFn = CuResult (*)(CuResult, const char**);
using StreamFn = int32_t (*)(int32_t device, void** stream);  // aoti_torch_get_current_cuda_stream
constexpr int kL2Promotion128B = 2, kInterleaveNone = 0, kOobFillNone = 0;  // triton's choices

struct Driver {
  LaunchFn launch = nullptr;
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

// -- recipes --

enum Slot : int64_t { kPtr = 0, kInt = 1, kTma = 3 };
constexpr int kInputs = 5, kMaxParams = 96, kParamBytes = 4096, kMapBytes = 128;

struct Param {
  int64_t kind, src = 0, width = 0, value = 0, rows = 0, swizzle = 0, elem_size = 0, elem_type = 0;
  std::vector<uint32_t> box;
  size_t offset = 0;
  // the last encoding of this TMA slot and what it was encoded from (a pure function of them)
  std::vector<uint64_t> last_in;
  alignas(128) unsigned char last_map[kMapBytes];
};

struct Output {
  torch::headeronly::ScalarType dtype;
  bool returned;
  std::vector<int64_t> sizes;
};

struct Recipe {
  int64_t launch[6];
  std::vector<Output> outputs;
  std::vector<Param> params;  // one per kernel parameter slot (a TMA slot's sizes and strides follow it)
  std::vector<Tensor> held;
  size_t bytes = 0;
  int n_params = 0;
};

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

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

Recipe make_recipe(const std::vector<int64_t>& launch, const std::vector<int64_t>& outputs,
                   const std::vector<int64_t>& program, const std::vector<Tensor>& held) {
  STD_TORCH_CHECK(launch.size() == 6, "native_launch.define: launch must be [function, gx, gy, gz, warps, shared]");
  Recipe r;
  std::memcpy(r.launch, launch.data(), sizeof(r.launch));
  for (size_t i = 0; i < outputs.size();) {
    STD_TORCH_CHECK(i + 3 <= outputs.size(), "native_launch.define: a truncated output");
    Output o{static_cast<torch::headeronly::ScalarType>(outputs[i]), outputs[i + 1] != 0, {}};
    int64_t nd = outputs[i + 2];
    STD_TORCH_CHECK(nd >= 0 && i + 3 + nd <= outputs.size(), "native_launch.define: a truncated output");
    o.sizes.assign(outputs.begin() + i + 3, outputs.begin() + i + 3 + nd);
    r.outputs.push_back(std::move(o));
    i += 3 + nd;
  }
  STD_TORCH_CHECK(r.outputs.size() <= 16, "native_launch.define: at most 16 outputs");
  r.held = held;
  size_t off = 0;
  auto add = [&](Param p, size_t size, size_t align) {
    p.offset = off = align_up(off, align);
    off += size;
    r.params.push_back(std::move(p));
  };
  auto check_src = [&](int64_t src) {
    bool ok = (src >= 0 && src < kInputs) || (src >= 16 && src < 16 + static_cast<int64_t>(r.outputs.size())) ||
              (src >= 32 && src < 32 + static_cast<int64_t>(held.size()));
    STD_TORCH_CHECK(ok, "native_launch.define: slot source ", src, " names no input, output or held tensor");
  };
  for (size_t i = 0; i < program.size();) {
    Param p;
    p.kind = program[i];
    if (p.kind == kPtr && i + 2 <= program.size()) {
      p.src = program[i + 1];
      check_src(p.src);
      add(std::move(p), 8, 8);
      i += 2;
    } else if (p.kind == kInt && i + 3 <= program.size()) {
      p.width = program[i + 1];
      p.value = program[i + 2];
      STD_TORCH_CHECK(p.width == 1 || p.width == 2 || p.width == 4 || p.width == 8,
                      "native_launch.define: an integer of ", p.width, " bytes");
      size_t w = static_cast<size_t>(p.width);
      add(std::move(p), w, w);
      i += 3;
    } else if (p.kind == kTma && i + 7 <= program.size()) {
      p.src = program[i + 1];
      p.rows = program[i + 2];
      p.swizzle = program[i + 3];
      p.elem_size = program[i + 4];
      p.elem_type = program[i + 5];
      int64_t nd = program[i + 6];
      STD_TORCH_CHECK(nd >= 1 && nd <= 5 && i + 7 + nd <= program.size() && (p.rows == 0 || nd == 2),
                      "native_launch.define: a TMA slot of rank ", nd);
      check_src(p.src);
      for (int64_t d = 0; d < nd; ++d) p.box.push_back(static_cast<uint32_t>(program[i + 7 + d]));
      add(std::move(p), kMapBytes, 128);
      for (int64_t d = 0; d < nd; ++d) add(Param{kInt, 0, 4}, 4, 4);  // sizes: filled by the TMA slot
      for (int64_t d = 0; d < nd; ++d) add(Param{kInt, 0, 8}, 8, 8);  // strides
      r.params[r.params.size() - 2 * nd - 1].value = nd;
      i += 7 + nd;
    } else {
      STD_TORCH_CHECK(false, "native_launch.define: a bad slot (kind ", p.kind, ") at ", i);
    }
  }
  STD_TORCH_CHECK(r.params.size() <= kMaxParams && off <= kParamBytes, "native_launch.define: ",
                  r.params.size(), " parameters of ", off, " bytes; at most ", kMaxParams, " and ", kParamBytes);
  r.bytes = off;
  r.n_params = static_cast<int>(r.params.size());
  return r;
}

// The dims (outermost first) and element strides a TMA slot reads ``t`` as.
void tma_dims(const Param& p, const Tensor& t, std::vector<uint64_t>& dims, std::vector<uint64_t>& strides) {
  size_t nd = p.box.size();
  if (p.rows > 0) {
    dims = {static_cast<uint64_t>(p.rows), static_cast<uint64_t>(t.numel() / p.rows)};
    strides = {dims[1], 1};
    return;
  }
  auto s = t.sizes();
  auto st = t.strides();
  STD_TORCH_CHECK(s.size() == nd, "native_launch: a TMA slot of rank ", nd, " over a tensor of rank ", s.size());
  dims.assign(s.begin(), s.end());
  strides.assign(st.begin(), st.end());
}

// Fill ``buf`` with the parameters of ``r`` for this call's tensors; ``dry``: TMA slots hold
// their encoding's inputs ([address, swizzle, elem_size, elem_type, rank, dims..., byte
// strides..., box...] as uint64, innermost first as the driver takes them) instead of a descriptor.
void pack_params(Recipe& r, const Tensor* const* src, unsigned char* buf, void** params, bool dry) {
  std::memset(buf, 0, r.bytes);  // the padding between parameters: zeros (pack's bytes are compared)
  for (int i = 0; i < r.n_params; ++i) {
    Param& p = r.params[i];
    unsigned char* at = buf + p.offset;
    params[i] = at;
    if (p.kind == kPtr) {
      uint64_t v = reinterpret_cast<uintptr_t>(src[p.src]->data_ptr());
      std::memcpy(at, &v, 8);
    } else if (p.kind == kInt) {
      std::memcpy(at, &p.value, static_cast<size_t>(p.width));  // little-endian: the low bytes
    } else {  // kTma, then its sizes and strides
      const Tensor& t = *src[p.src];
      std::vector<uint64_t> dims, strides;
      tma_dims(p, t, dims, strides);
      size_t nd = dims.size();
      uint64_t in[4 + 3 * 5];
      in[0] = reinterpret_cast<uintptr_t>(t.data_ptr());
      in[1] = p.swizzle, in[2] = p.elem_size, in[3] = p.elem_type;
      uint64_t gdim[5], gstride[5];
      uint32_t box[5], ones[5] = {1, 1, 1, 1, 1};
      for (size_t d = 0; d < nd; ++d) {
        gdim[d] = dims[nd - 1 - d];
        box[d] = p.box[nd - 1 - d];
        // byte strides of dims 1.., innermost first; the last entry as triton fills it (unread)
        gstride[d] = d + 1 < nd ? strides[nd - 2 - d] * p.elem_size : gdim[d] * (nd == 1 ? p.elem_size : gstride[d - 1]);
      }
      std::vector<uint64_t> inputs(in, in + 4);
      inputs.insert(inputs.end(), gdim, gdim + nd);
      inputs.insert(inputs.end(), gstride, gstride + nd);
      inputs.insert(inputs.end(), box, box + nd);
      if (dry) {
        std::memset(at, 0, kMapBytes);
        std::memcpy(at, inputs.data(), std::min<size_t>(kMapBytes, inputs.size() * 8));
      } else if (inputs == p.last_in) {
        std::memcpy(at, p.last_map, kMapBytes);
      } else {
        check(driver().encode(p.last_map, static_cast<int>(p.elem_type), static_cast<uint32_t>(nd),
                              reinterpret_cast<void*>(in[0]), gdim, gstride, box, ones, kInterleaveNone,
                              static_cast<int>(p.swizzle), kL2Promotion128B, kOobFillNone),
              "cuTensorMapEncodeTiled");
        p.last_in = std::move(inputs);
        std::memcpy(at, p.last_map, kMapBytes);
      }
      for (size_t d = 0; d < nd; ++d) {
        int32_t s32 = static_cast<int32_t>(dims[d]);
        int64_t st = static_cast<int64_t>(strides[d]);
        std::memcpy(buf + r.params[i + 1 + d].offset, &s32, 4);
        std::memcpy(buf + r.params[i + 1 + nd + d].offset, &st, 8);
        params[i + 1 + d] = buf + r.params[i + 1 + d].offset;
        params[i + 1 + nd + d] = buf + r.params[i + 1 + nd + d].offset;
      }
      i += static_cast<int>(2 * nd);
    }
  }
}

std::vector<Tensor> run(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, int64_t s0, int64_t s1,
                        bool dry) {
  const OptT in[kInputs] = {t0, t1, t2, t3, t4};
  STD_TORCH_CHECK(t0.has_value(), "native_launch: t0 (whose device the outputs take) must be a tensor");
  void* stream = nullptr;
  std::vector<int64_t> key = key_of(table, in, s0, s1, &stream);
  alignas(128) unsigned char buf[kParamBytes];
  void* params[kMaxParams];
  std::vector<Tensor> outs;
  int64_t launch[6];
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_recipes.find(key);
    if (it == g_recipes.end()) {
      ++g_misses;
      return {};
    }
    ++g_hits;
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
    pack_params(r, src, buf, params, dry);
    if (dry) {
      Tensor bytes = torch::stable::new_empty(*t0, {static_cast<int64_t>(r.bytes)}, torch::headeronly::ScalarType::Byte);
      Tensor info = torch::stable::new_empty(*t0, {6}, torch::headeronly::ScalarType::Long);
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
  STD_TORCH_CHECK(t0->is_cuda(), "native_launch.call: a recipe launches on CUDA tensors; t0 is on ",
                  opforge_stable::device_name(*t0), " (pack is the dry run)");
  const Driver& d = driver();
  if (launch[1] * launch[2] * launch[3] > 0)
    check(d.launch(reinterpret_cast<void*>(launch[0]), static_cast<unsigned>(launch[1]),
                   static_cast<unsigned>(launch[2]), static_cast<unsigned>(launch[3]),
                   static_cast<unsigned>(32 * launch[4]), 1, 1, static_cast<unsigned>(launch[5]), stream, params,
                   nullptr),
          "cuLaunchKernel");
  return outs;
}

void define(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, int64_t s0, int64_t s1,
            std::vector<int64_t> launch, std::vector<int64_t> outputs, std::vector<int64_t> program,
            std::vector<Tensor> held) {
  const OptT in[kInputs] = {t0, t1, t2, t3, t4};
  STD_TORCH_CHECK(t0.has_value(), "native_launch.define: t0 (whose device the outputs take) must be a tensor");
  Recipe r = make_recipe(launch, outputs, program, held);
  void* stream = nullptr;
  std::vector<int64_t> key = key_of(table, in, s0, s1, &stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recipes.size() >= kMaxRecipes) g_recipes.clear();
  g_recipes.insert_or_assign(std::move(key), std::move(r));
}

std::vector<Tensor> call(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, int64_t s0, int64_t s1) {
  return run(table, t0, t1, t2, t3, t4, s0, s1, false);
}

std::vector<Tensor> pack(int64_t table, OptT t0, OptT t1, OptT t2, OptT t3, OptT t4, int64_t s0, int64_t s1) {
  return run(table, t0, t1, t2, t3, t4, s0, s1, true);
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
  m.def("define(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, int s0, int s1, "
        "int[] launch, int[] outputs, int[] program, Tensor[] held) -> ()");
  m.def("call(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, int s0, int s1) -> Tensor[]");
  m.def("pack(int table, Tensor? t0, Tensor? t1, Tensor? t2, Tensor? t3, Tensor? t4, int s0, int s1) -> Tensor[]");
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
