// Live-range splitting for the SBUF allocator: which idle tensors to keep in HBM, and the kernel
// rewritten with the DMAs that move them (docs/architecture.md, "Spilling").
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "nikki/jit/allocate.hpp"

namespace nikki::jit {

inline constexpr int64_t kSbufAlignment = 4;

inline int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/** Bytes per partition an SBUF tensor takes once placed. */
inline int64_t sbuf_footprint(const Storage& s) { return align_up(s.partition_bytes(), kSbufAlignment); }

/** A kernel with spill and reload DMAs inserted, and what they move. */
struct SpilledKernel {
  Kernel kernel;
  std::vector<Spill> spills;
  size_t splits = 0;  // live ranges split, with or without DMAs
};

/**
 * Splits the live ranges of compiler-placed SBUF tensors where they are idle, so that the SBUF
 * tensors live at any instruction need at most `target` bytes per partition, and rewrites the
 * kernel accordingly: a save (SBUF -> private HBM) after the last use before each gap, a reload
 * (HBM -> a new SBUF storage) before the first use after it, and that storage in place of the
 * tensor from there on. A gap whose next use overwrites the whole tensor unread needs neither
 * (the value is dead); a save is left out when the HBM copy is still current.
 *
 * Victims, chosen at the first instruction where usage exceeds `target`: tensors that the
 * instruction does not touch, placed by the compiler, not live across a runtime loop; first those
 * whose value is dead, then the one that frees the most bytes x instructions until its next use.
 *
 * Returns nullopt when no choice fits `target`; the kernel unchanged (no spills) when it fits.
 */
std::optional<SpilledKernel> spill_to_fit(const Kernel& kernel, int64_t target);

}  // namespace nikki::jit
