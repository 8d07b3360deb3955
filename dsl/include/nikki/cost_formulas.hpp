// The published per-instruction cost formulas that two places evaluate: the timing model
// (runtime/src/cost_model.cpp, timing.cpp), which estimates a compiled kernel, and the library
// kernels' trace-time scheduling (kernels/include/nikki/kernels/task_scheduler.hpp, matmul.hpp),
// which orders instructions by their expected durations. One definition keeps the order the
// kernels choose consistent with the model that then estimates them. docs/performance-model.md
// gives the sources.
#pragma once

#include <algorithm>
#include <cstdint>

#include "nikki/target.hpp"

namespace nikki::cost {

/**
 * @brief Tensor-engine cycles of one nc_matmul: the stationary tile's load (at most
 * matmul_init_cycles, overlapped) or the moving tile's columns, whichever is longer; fp32
 * operands take matmul_fp32_slowdown times as long.
 */
inline double matmul_cycles(const TargetConfig& t, int64_t stationary_free, int64_t moving_free, bool fp32) {
  const int64_t cycles = std::max(std::min<int64_t>(t.matmul_init_cycles, stationary_free), moving_free);
  return (fp32 ? double(t.matmul_fp32_slowdown) : 1.0) * double(cycles);
}

/** @brief Tensor-engine cycles of a PE-array transpose of `partitions` x `free` elements. */
inline double pe_transpose_cycles(const TargetConfig& t, int64_t partitions, int64_t free) {
  return double(std::max(partitions, std::min<int64_t>(t.matmul_init_cycles, free)));
}

/**
 * @brief Nanoseconds a DMA transfer holds the core's shared DMA bandwidth: its bytes plus a fixed
 * overhead per DMA buffer (a contiguous run on both sides), over all DMA engines' bandwidth. The
 * fixed latency before the data moves (dma_fixed_latency_ns) is not included.
 */
inline double dma_data_ns(const TargetConfig& t, int64_t bytes, int64_t buffers) {
  return (double(bytes) + double(buffers) * double(t.dma_buffer_overhead_bytes)) /
         (double(t.dma_engines) * t.dma_bytes_per_ns_per_engine);
}

}  // namespace nikki::cost
