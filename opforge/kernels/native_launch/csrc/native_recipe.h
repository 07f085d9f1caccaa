// native_launch's recipes: how one call shape's launch is described (Recipe, parsed from the
// define op's int lists by make_recipe) and how its parameters are packed for a call
// (pack_params). native_launch.cpp keeps them by key and launches them; its header comment has
// the encoding of the lists.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace opforge_native {

using torch::stable::Tensor;

// cuTensorMapEncodeTiled's C signature (cuda.h, CUDA 12.0+), enums as integers.
using EncodeFn = int (*)(void* map, int dtype, uint32_t rank, void* addr, const uint64_t* dims,
                         const uint64_t* strides, const uint32_t* box, const uint32_t* elem_strides,
                         int interleave, int swizzle, int l2_promotion, int oob_fill);
constexpr int kL2Promotion128B = 2, kInterleaveNone = 0, kOobFillNone = 0;  // triton's choices

enum Slot : int64_t { kPtr = 0, kInt = 1, kTma = 3, kMap = 4, kStruct = 5 };
constexpr int kInputs = 6, kMaxParams = 96, kParamBytes = 4096, kMapBytes = 128;

struct Param {
  int64_t kind, src = 0, width = 0, value = 0, rows = 0, swizzle = 0, elem_size = 0, elem_type = 0;
  bool member = false;  // a struct's field after its first: part of that kernel parameter, no entry of its own
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
  int64_t launch[7];  // function, grid x, y, z, warps, shared bytes, dependent (0/1)
  std::vector<Output> outputs;
  std::vector<Param> params;  // one per slot (a TMA slot's sizes and strides follow it; a struct's fields are slots)
  std::vector<Tensor> held;
  size_t bytes = 0;
  int n_params = 0;
};

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

inline Recipe make_recipe(const std::vector<int64_t>& launch, const std::vector<int64_t>& outputs,
                   const std::vector<int64_t>& program, const std::vector<Tensor>& held) {
  STD_TORCH_CHECK(launch.size() == 6 || launch.size() == 7,
                  "native_launch.define: launch must be [function, gx, gy, gz, warps, shared(, dependent)]");
  Recipe r;
  r.launch[6] = 0;
  std::memcpy(r.launch, launch.data(), launch.size() * sizeof(int64_t));
  STD_TORCH_CHECK(r.launch[6] == 0 || r.launch[6] == 1, "native_launch.define: dependent must be 0 or 1");
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
  int64_t fields_left = 0;  // of the struct being laid out, and its alignment
  size_t struct_align = 1;
  bool head = false;  // the next slot is a struct's first field
  auto add = [&](Param p, size_t size, size_t align) {
    p.offset = off = align_up(off, align);
    off += size;
    p.member = fields_left > 0 && !head;
    head = false;
    r.params.push_back(std::move(p));
    if (fields_left > 0 && --fields_left == 0) off = align_up(off, struct_align);  // C's tail padding
  };
  auto check_src = [&](int64_t src) {
    bool ok = (src >= 0 && src < kInputs) || (src >= 16 && src < 16 + static_cast<int64_t>(r.outputs.size())) ||
              (src >= 32 && src < 32 + static_cast<int64_t>(held.size()));
    STD_TORCH_CHECK(ok, "native_launch.define: slot source ", src, " names no input, output or held tensor");
  };
  for (size_t i = 0; i < program.size();) {
    Param p;
    p.kind = program[i];
    if (p.kind == kStruct && i + 2 <= program.size() && fields_left == 0) {
      const int64_t n = program[i + 1];
      STD_TORCH_CHECK(n >= 1 && n <= kMaxParams, "native_launch.define: a struct of ", n, " fields");
      // laid out as C lays a struct out: its alignment its widest field's (looked up ahead), each field
      // at its own, the size a whole number of the alignment
      size_t align = 1, j = i + 2;
      for (int64_t f = 0; f < n; ++f) {
        const bool ptr = j + 2 <= program.size() && program[j] == kPtr;
        STD_TORCH_CHECK(ptr || (j + 3 <= program.size() && program[j] == kInt), "native_launch.define: field ", f,
                        " of the struct at ", i, " is not a pointer or an integer slot");
        align = std::max<size_t>(align, ptr ? 8 : static_cast<size_t>(std::clamp<int64_t>(program[j + 1], 1, 8)));
        j += ptr ? 2 : 3;
      }
      off = align_up(off, align);
      fields_left = n, struct_align = align, head = true;
      i += 2;
    } else if (p.kind == kPtr && i + 2 <= program.size()) {
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
    } else if ((p.kind == kTma || p.kind == kMap) && i + 7 <= program.size()) {
      // [kind, src, rows, swizzle, elem_size, elem_type, rank, box...]: the same fields for both
      p.src = program[i + 1];
      p.rows = program[i + 2];
      p.swizzle = program[i + 3];
      p.elem_size = program[i + 4];
      p.elem_type = program[i + 5];
      const int64_t nd = program[i + 6];
      STD_TORCH_CHECK(nd >= 1 && nd <= 5 && i + 7 + nd <= program.size() && (p.rows == 0 || nd == 2),
                      "native_launch.define: a ", p.kind == kTma ? "TMA slot" : "tensor map", " of rank ", nd);
      if (p.kind == kTma || p.src != -1) check_src(p.src);  // a map of -1: zeros (one the kernel doesn't read)
      for (int64_t d = 0; d < nd; ++d) p.box.push_back(static_cast<uint32_t>(program[i + 7 + d]));
      const bool tma = p.kind == kTma;
      add(std::move(p), kMapBytes, 128);
      if (tma) {  // triton's sizes and strides after it (a bare map has none)
        for (int64_t d = 0; d < nd; ++d) add(Param{kInt, 0, 4}, 4, 4);  // sizes: filled by the TMA slot
        for (int64_t d = 0; d < nd; ++d) add(Param{kInt, 0, 8}, 8, 8);  // strides
        r.params[r.params.size() - 2 * nd - 1].value = nd;
      }
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
inline void tma_dims(const Param& p, const Tensor& t, std::vector<uint64_t>& dims, std::vector<uint64_t>& strides) {
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

// Write the tensor map of slot ``p`` over ``t`` (read as ``dims`` and element ``strides``) at ``at``:
// encoded with ``encode``, or the same as the slot's last one when made from the same inputs; ``dry``:
// its encoding's inputs instead ([address, swizzle, elem_size, elem_type, dims..., byte strides...,
// box...] as uint64, innermost first as the driver takes them). Returns 0 or the encoder's error.
inline int encode_map(Param& p, const Tensor& t, const std::vector<uint64_t>& dims, const std::vector<uint64_t>& strides,
                      unsigned char* at, bool dry, EncodeFn encode) {
  size_t nd = dims.size();
  uint64_t in[4];
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
    return 0;
  }
  if (inputs != p.last_in) {
    int err = encode(p.last_map, static_cast<int>(p.elem_type), static_cast<uint32_t>(nd), reinterpret_cast<void*>(in[0]),
                     gdim, gstride, box, ones, kInterleaveNone, static_cast<int>(p.swizzle), kL2Promotion128B,
                     kOobFillNone);
    if (err != 0) return err;
    p.last_in = std::move(inputs);
  }
  std::memcpy(at, p.last_map, kMapBytes);
  return 0;
}

// Fill ``buf`` with the parameters of ``r`` for this call's tensors; ``dry``: TMA and map slots hold
// their encoding's inputs (encode_map) instead of a descriptor. Returns 0, or the CUDA error of a
// descriptor's encoding.
inline int pack_params(Recipe& r, const Tensor* const* src, unsigned char* buf, void** params, bool dry,
                       EncodeFn encode) {
  std::memset(buf, 0, r.bytes);  // the padding between parameters: zeros (pack's bytes are compared)
  int k = 0;  // the kernel parameter: a struct's fields share one
  for (int i = 0; i < r.n_params; ++i) {
    Param& p = r.params[i];
    unsigned char* at = buf + p.offset;
    if (!p.member) params[k++] = at;
    if (p.kind == kPtr) {
      uint64_t v = reinterpret_cast<uintptr_t>(src[p.src]->data_ptr());
      std::memcpy(at, &v, 8);
    } else if (p.kind == kInt) {
      std::memcpy(at, &p.value, static_cast<size_t>(p.width));  // little-endian: the low bytes
    } else if (p.kind == kMap && p.src < 0) {
      std::memset(at, 0, kMapBytes);
    } else {  // kTma (then its sizes and strides) or kMap
      const Tensor& t = *src[p.src];
      std::vector<uint64_t> dims, strides;
      tma_dims(p, t, dims, strides);
      int err = encode_map(p, t, dims, strides, at, dry, encode);
      if (err != 0) return err;
      if (p.kind == kMap) continue;
      size_t nd = dims.size();
      for (size_t d = 0; d < nd; ++d) {
        int32_t s32 = static_cast<int32_t>(dims[d]);
        std::memcpy(params[k++] = buf + r.params[i + 1 + d].offset, &s32, 4);
      }
      for (size_t d = 0; d < nd; ++d) {
        int64_t st = static_cast<int64_t>(strides[d]);
        std::memcpy(params[k++] = buf + r.params[i + 1 + nd + d].offset, &st, 8);
      }
      i += static_cast<int>(2 * nd);
    }
  }
  return 0;
}

}  // namespace opforge_native
