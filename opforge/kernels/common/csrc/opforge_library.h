// The op-namespace macros of an opforge extension on torch's full C++ API (TORCH_LIBRARY: the
// autograd companions, which need torch's C++ autograd); opforge_stable.h has the stable-ABI ones.
#pragma once

#include <torch/library.h>

// TORCH_LIBRARY pastes its namespace with ##, which would not expand the -DOPFORGE_NS=<extension
// name> an extension is built with; one level of indirection does.
#define OPFORGE_LIBRARY_(ns, m) TORCH_LIBRARY(ns, m)
#define OPFORGE_LIBRARY(ns, m) OPFORGE_LIBRARY_(ns, m)
#define OPFORGE_LIBRARY_IMPL_(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)
#define OPFORGE_LIBRARY_IMPL(ns, k, m) OPFORGE_LIBRARY_IMPL_(ns, k, m)
