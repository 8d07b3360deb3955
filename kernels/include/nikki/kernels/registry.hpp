// The registry of library kernels: the one list C++, Python, PyTorch, the tests, the docs and the
// benchmarks look kernels up in. Each kernel's registration (its KernelInfo) lives beside the
// kernel in its family's folder; kernels/src/registry.cpp lists them, and is the only file that
// includes every kernel. docs/adding-a-kernel.md walks through adding one.
#pragma once

#include <string>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels {

/** @brief Every library kernel, forward and backward, in a stable order. */
const std::vector<KernelInfo>& registry();

/** @brief The kernel named `name`; KernelError listing the available names when there is none. */
const KernelInfo& find_kernel(const std::string& name);

}  // namespace nikki::kernels
