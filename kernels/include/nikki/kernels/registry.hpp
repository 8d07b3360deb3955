// The registry of library kernels: the one list C++, Python and PyTorch look kernels up in.
// Adding a kernel: write its header with a `<name>_info()` function, include it here and append it
// to the list below; tests and bindings pick it up from the registry.
#pragma once

#include <string>
#include <vector>

#include "nikki/kernels/flash_attention.hpp"
#include "nikki/kernels/layernorm.hpp"
#include "nikki/kernels/library.hpp"
#include "nikki/kernels/matmul.hpp"
#include "nikki/kernels/rmsnorm.hpp"
#include "nikki/kernels/softmax.hpp"

namespace nikki::kernels {

/** @brief Every library kernel, forward and backward, in a stable order. */
inline const std::vector<KernelInfo>& registry() {
  static const std::vector<KernelInfo> kernels = [] {
    return std::vector<KernelInfo>{
        matmul_info(),
        softmax_info(),
        softmax_bwd_info(),
        flash_attention_info(),
        flash_attention_bwd_info(),
        layernorm_info(),
        layernorm_bwd_info(),
        rmsnorm_info(),
        rmsnorm_bwd_info(),
    };
  }();
  return kernels;
}

/** @brief The kernel named `name`; KernelError listing the available names when there is none. */
inline const KernelInfo& find_kernel(const std::string& name) {
  std::string names;
  for (const KernelInfo& k : registry()) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : ", ") + k.name;
  }
  throw KernelError("no library kernel named '" + name + "'", SourceLocation{}, {}, {},
                    "available kernels: " + names);
}

}  // namespace nikki::kernels
