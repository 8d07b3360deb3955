// Placement of SBUF and PSUM tensors from their live ranges.
#pragma once

#include "nikki/ir.hpp"

namespace nikki::jit {

/**
 * @brief Gives every on-chip storage an address (partition, byte offset).
 *
 * Tensors the user placed (address=) keep their address; the others are placed at partition 0 by
 * live range: each allocation site rotates through two buffers (double buffering), other tensors
 * go next-fit after the previous placement (first-fit once memory is full), SBUF at 4-byte
 * alignment and PSUM in whole banks (so a matmul output never straddles a bank). Throws KernelError when live tensors exceed a memory, naming the peak
 * usage, the capacity and the largest tensors live at that point; also when manually placed
 * tensors overlap live tensors.
 */
void allocate(Kernel& kernel);

}  // namespace nikki::jit
