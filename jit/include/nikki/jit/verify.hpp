// The verifier: every rule NKI documents for the instructions nikki supports, checked once on the
// IR, so C++ and Python kernels get the same errors.
#pragma once

#include "nikki/ir.hpp"

namespace nikki::jit {

/**
 * @brief Checks a kernel against the language rules and the hardware limits of its target.
 *
 * Throws KernelError for the first violation, naming the user's source line, the instruction,
 * the limit that was broken and how to fix it. Manual addresses (bank boundaries, alignment) are
 * checked here too; capacity and overlaps with automatically placed tensors are checked by
 * allocate().
 */
void verify(const Kernel& kernel);

}  // namespace nikki::jit
