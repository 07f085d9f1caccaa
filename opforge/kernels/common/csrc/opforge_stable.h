// What every opforge kernel on the LibTorch stable ABI shares: the op-namespace macros
// and the pieces of its input-check messages the stable headers don't provide.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Layout.h>

#include <cstdint>
#include <string>

// STABLE_TORCH_LIBRARY pastes its namespace with ##, which would not expand the
// -DOPFORGE_NS=<extension name> a variant is built with; one level of indirection does.
#define OPFORGE_LIBRARY_(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define OPFORGE_LIBRARY(ns, m) OPFORGE_LIBRARY_(ns, m)
#define OPFORGE_LIBRARY_IMPL_(ns, k, m) STABLE_TORCH_LIBRARY_IMPL(ns, k, m)
#define OPFORGE_LIBRARY_IMPL(ns, k, m) OPFORGE_LIBRARY_IMPL_(ns, k, m)

namespace opforge_stable {

// The tensor's device type by name. From the raw shim code: Tensor::device()
// throws on device types it doesn't know.
inline std::string device_name(const torch::stable::Tensor& t) {
  int32_t dt = -1;
  aoti_torch_get_device_type(t.get(), &dt);
  if (dt == aoti_torch_device_type_cpu()) return "cpu";
  if (dt == aoti_torch_device_type_cuda()) return "cuda";
  if (dt == aoti_torch_device_type_meta()) return "meta";
  if (dt == aoti_torch_device_type_xpu()) return "xpu";
  if (dt == aoti_torch_device_type_mps()) return "mps";
  return "device type " + std::to_string(dt);
}

// "[2, 3]": the stable headers have no operator<< for sizes.
inline std::string shape_str(torch::headeronly::IntHeaderOnlyArrayRef s) {
  std::string r = "[";
  for (size_t d = 0; d < s.size(); ++d) r += (d ? ", " : "") + std::to_string(s[d]);
  return r + "]";
}

}  // namespace opforge_stable
