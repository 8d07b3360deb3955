// The cycle-approximate timing model and its profile: an ESTIMATE of how long a device program
// takes on the modelled NeuronCore, per engine and per instruction. Never a measurement.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nikki/jit/streams.hpp"

namespace nikki::runtime {

/** @brief What decided when an instruction started (or, for a DMA, when its data moved). */
enum class WaitCause : uint8_t {
  none,           // started at time 0
  queue,          // its queue's previous instruction (in-order engine)
  semaphore,      // an instruction of another queue it waits for
  barrier,        // a loop barrier: every queue drained
  meeting,        // core_barrier / sendrecv: the other program instances of the launch
  port,           // NeuronCore-v2's shared SBUF/PSUM port, held by another engine
};

/** @brief Name of a wait cause ("semaphore", ...). */
const char* wait_cause_name(WaitCause c);

/** @brief When one instruction ran in the estimate. */
struct InstructionTiming {
  uint32_t ir_index = 0;
  uint16_t queue = 0;       // index into DeviceProgram::streams
  double start_ns = 0;
  double end_ns = 0;
  double cycles = 0;        // engine cycles charged (0 for DMA)
  int64_t bytes = 0;        // DMA: bytes moved
  WaitCause cause = WaitCause::none;  // what decided the start
  int32_t blocker = -1;     // index in Profile::instructions of the instruction `cause` waited for
  int32_t data_blocker = -1;  // DMA: the earlier transfer whose data phase its own data waited behind
};

/** @brief Busy time of one queue. */
struct QueueUsage {
  std::string name;  // qTensor, qVector, ..., qDMA3
  double busy_ns = 0;
  int64_t instructions = 0;
};

/** @brief The estimated profile of one run of a device program. */
struct Profile {
  std::string kernel;
  std::string target;  // e.g. "trn2 (NeuronCore-v3)"
  double total_ns = 0;
  std::vector<InstructionTiming> instructions;  // in start order
  std::vector<QueueUsage> queues;               // one per stream, same order as the program
  int64_t dma_bytes = 0;
  double dma_active_ns = 0;    // time during which at least one transfer moved data
  double dma_peak_bytes_per_ns = 0;
  int64_t matmul_flops = 0;    // 2 * K * M * N summed over nc_matmul
  double tensor_peak_flops_per_ns = 0;  // 16-bit peak of the PE array at the TensorE clock

  /** @brief busy time of a compute queue / total time. */
  double utilization(const std::string& queue) const;
  /** @brief Achieved matmul FLOPs / (total time x 16-bit peak). */
  double tensor_flop_utilization() const;
  /** @brief DMA bytes / total time. */
  double dma_bytes_per_ns() const { return total_ns > 0 ? dma_bytes / total_ns : 0; }

  /** @brief A text summary, labelled as an estimate. */
  std::string summary(const jit::DeviceProgram& program, int top_instructions = 8) const;
  /** @brief Chrome / Perfetto trace JSON: a track per engine and per DMA queue. */
  std::string chrome_trace(const jit::DeviceProgram& program) const;
};

/**
 * @brief Replays a device program's streams with the published NKI cost model (docs/
 * performance-model.md): each queue is an in-order engine with its own clock, an instruction
 * starts when its queue is free and its semaphores are satisfied, and costs what the
 * per-instruction formulas say; DMA transfers share the DMA engines' bandwidth.
 *
 * Needs no data: runtime loops run their trip count when it is known at compile time (immediate
 * bounds, or registers set from immediates); a loop bound read from a tensor is a KernelError.
 * The program runs as a launch of one instance (see estimate_launch).
 */
Profile estimate(const jit::DeviceProgram& program);

/**
 * @brief The estimated profiles of one launch whose program instances meet (core_barrier,
 * sendrecv; runtime/launch.hpp): each instance on a NeuronCore of its own, replayed as estimate()
 * does, in parallel with the others. A meeting ends when its last member's queues have drained,
 * plus the DMA engines' fixed latency for the cross-core semaphore write (a sendrecv also moves
 * its bytes at the DMA bandwidth); it appears on the sync queue from the instance's arrival.
 * profile[i].total_ns is when instance i ends; the launch takes the longest of them.
 */
std::vector<Profile> estimate_launch(std::span<const jit::DeviceProgram* const> programs);

}  // namespace nikki::runtime
