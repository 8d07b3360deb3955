// Executors of device programs: they walk the per-engine streams in an order the semaphores
// allow (deliberately not program order), running each instruction either through the reference
// semantics or through its native routine.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "nikki/jit/streams.hpp"
#include "nikki/runtime/launch.hpp"

namespace nikki::jit {
class NativeCode;
}

namespace nikki::runtime {

/** @brief How instructions are executed. */
enum class ExecutorKind {
  interp,  // the reference semantics, one element at a time
  native,  // the JIT's native routines (instructions without one fall back to interp)
};

/** @brief interp | native from NIKKI_EXECUTOR (default native); a KernelError for other values. */
ExecutorKind executor_from_env();

/** @brief SBUF/PSUM memories of simulated cores allocated and not yet freed: executors borrow
 * one from a process-wide pool for each run, which keeps at most a few idle. */
size_t live_core_memories();

/** @brief Which ready instruction a stream walk runs next. */
enum class StreamOrder {
  latest_first,   // the ready instruction latest in program order: exposes any missing semaphore
  earliest_first, // the ready instruction earliest in program order
  random,         // a ready instruction chosen by a seeded pseudo-random sequence
};

/** @brief The walk order from NIKKI_STREAM_ORDER: latest (default), earliest (= program order
 * wherever the streams allow it) or random:<seed>. */
std::pair<StreamOrder, uint64_t> stream_order_from_env();

/**
 * @brief Runs a device program on a simulated NeuronCore.
 *
 * HBM tensors are the caller's buffers (dense row-major, in the order of Kernel::inputs and
 * Kernel::outputs). Results equal the program-order interpreter's bit for bit for every kernel
 * that does not read uninitialized memory.
 */
class StreamExecutor : public InstanceRun {
 public:
  /** `delayed_instruction` (a testing hook) runs that instruction only when nothing else is ready,
   * to show that whatever depends on it waits for it. */
  StreamExecutor(std::shared_ptr<const jit::DeviceProgram> program, ExecutorKind kind,
                 std::shared_ptr<const jit::NativeCode> native = nullptr,
                 StreamOrder order = StreamOrder::latest_first, uint64_t seed = 1,
                 int64_t delayed_instruction = -1);
  ~StreamExecutor() override;
  StreamExecutor(const StreamExecutor&) = delete;
  StreamExecutor& operator=(const StreamExecutor&) = delete;

  /** @brief One run, as a launch of this program alone; `fill_outputs=false` keeps the outputs'
   * contents (SPMD instances after the first). */
  void run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs = true);

  // InstanceRun: a run that stops where the program instances of a launch meet (launch.hpp).
  const Kernel& launched_kernel() const override;
  void begin(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs,
             SharedScratch* shared) override;
  int64_t advance() override;
  Payload read_operand(int slot) const override;
  void write_operand(int slot, const Payload& payload) override;
  void finish() override;
  void abandon() noexcept override;

  /** @brief Bytes this executor holds between runs. SBUF, PSUM and scratch are borrowed from a
   * process-wide pool for the length of each run, so they are not part of it. */
  size_t resident_bytes() const;

  /** @brief Instructions executed by native routines / by the reference semantics in the last run. */
  int64_t native_count() const;
  int64_t interpreted_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nikki::runtime
