// The per-instruction cost model (internal to runtime/): NKI's published formulas, in engine
// cycles for compute instructions and in bytes and buffers for DMA transfers.
#pragma once

#include <cstdint>

#include "nikki/ir.hpp"

namespace nikki::runtime {

/** @brief Engine cycles an instruction occupies its engine (compute and control instructions). */
double compute_cycles(const Kernel& kernel, const Instruction& inst);

/** @brief What a DMA transfer moves: bytes and contiguous DMA buffers (descriptor elements). */
struct DmaWork {
  int64_t bytes = 0;
  int64_t buffers = 0;
};
DmaWork dma_work(const Kernel& kernel, const Instruction& inst);

/** @brief Engine clock of a compute engine, in cycles per nanosecond. */
double clock_ghz(const TargetConfig& t, Engine e);

}  // namespace nikki::runtime
