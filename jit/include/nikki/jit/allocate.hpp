// Placement of SBUF and PSUM tensors from their live ranges, spilling idle SBUF tensors to HBM
// when the live ones do not fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nikki/ir.hpp"

namespace nikki::jit {

/** @brief Options of the allocation pass. */
struct AllocateOptions {
  /** SBUF bytes per partition the allocator may use; 0 means all the target's usable SBUF. A
   * testing hook: a smaller budget makes a kernel that fits spill, so tests can compare the
   * spilled program with the unspilled one bit for bit. */
  int64_t sbuf_budget = 0;
};

/**
 * @brief A compiler-allocated SBUF tensor the allocator moved to HBM while it was idle.
 *
 * The tensor keeps its storage until its first save; each reload brings it back into a new SBUF
 * storage (same name with a `.reload<n>` suffix, same shape, dtype and source line) that the
 * instructions after the reload use instead.
 */
struct Spill {
  StorageId tensor = 0;           // the tensor as the kernel created it
  StorageId home = 0;             // its private HBM copy (`<name>.spill`)
  std::vector<uint32_t> saves;    // the SBUF -> HBM dma_copy instructions
  std::vector<uint32_t> reloads;  // the HBM -> SBUF dma_copy instructions
  friend bool operator==(const Spill&, const Spill&) = default;
};

/**
 * @brief Gives every on-chip storage an address (partition, byte offset); returns the spills it
 * had to insert (none when the kernel fits, which leaves its instructions untouched).
 *
 * Tensors the user placed (address=) keep their address; the others are placed at partition 0 by
 * live range: each allocation site rotates through two buffers (double buffering), other tensors
 * go next-fit after the previous placement (first-fit once memory is full), SBUF at 4-byte
 * alignment and PSUM in whole banks (so a matmul output never straddles a bank).
 *
 * When the SBUF tensors do not fit, idle compiler-placed tensors are spilled (docs/architecture.md,
 * "Spilling"): dma_copy instructions save them to a private HBM copy after a use and reload them
 * before the next, which keeps the program-order meaning and every result bit for bit. Throws
 * KernelError when spilling cannot help (the operands of one instruction, tensors placed with
 * address= and tensors live across runtime loops do not fit; PSUM never spills), naming the peak
 * usage, the capacity and the largest tensors live at that point; also when manually placed
 * tensors overlap live tensors.
 */
std::vector<Spill> allocate(Kernel& kernel, const AllocateOptions& options = {});

/** @brief Bytes the spill and reload DMAs of `spills` move in one run of the kernel. */
int64_t spilled_bytes(const Kernel& kernel, const std::vector<Spill>& spills);

/**
 * @brief The warning for a kernel that spilled: which tensors, where the kernel allocated them,
 * how many bytes the spill DMAs move, and how to avoid it. Empty when nothing spilled.
 */
std::string spill_warning(const Kernel& kernel, const std::vector<Spill>& spills);

}  // namespace nikki::jit
