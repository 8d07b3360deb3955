// The reference interpreter: executes a verified, allocated kernel one instruction at a time in
// program order on a simulated NeuronCore. It is nikki's executable specification of every
// instruction; the native executor is tested against it bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "nikki/ir.hpp"
#include "nikki/runtime/launch.hpp"

namespace nikki::runtime {

/**
 * @brief Runs one kernel. HBM tensors are the caller's buffers (no copies): inputs and outputs
 * are passed as pointers to dense row-major data in the order of Kernel::inputs and
 * Kernel::outputs. SBUF and PSUM are arrays owned by the interpreter.
 */
class Interpreter : public InstanceRun {
 public:
  /**
   * @brief `kernel` must have passed jit::verify and jit::allocate, and must outlive this object.
   * With `sanitize`, a shadow follows which bytes hold values computed from written memory only:
   * a run whose outputs (or registers, or runtime offsets) depend on memory the kernel never wrote
   * throws a KernelError naming the line that read it and the line that allocated the tensor.
   */
  explicit Interpreter(const Kernel& kernel, bool sanitize = false);
  ~Interpreter() override;
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  /**
   * @brief Executes the kernel once. Outputs are first filled with the NaN / 4 sentinels, so
   * anything the kernel does not write is visible. Throws KernelError for run-time faults
   * (runtime offsets out of bounds) and, when sanitizing, for uses of uninitialized memory.
   */
  void run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs = true);

  // InstanceRun: a run that stops where the program instances of a launch meet (launch.hpp);
  // run() is a launch of this kernel alone.
  const Kernel& launched_kernel() const override;
  void begin(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs,
             SharedScratch* shared) override;
  int64_t advance() override;
  Payload read_operand(int slot) const override;
  void write_operand(int slot, const Payload& payload) override;
  void met() override;
  void finish() override;
  void abandon() noexcept override;

  /** @brief Bytes this interpreter holds between runs (SBUF, PSUM and the sanitizer's shadow
   * exist only while a run lasts). */
  size_t resident_bytes() const;

 private:
  struct State;
  const Kernel& kernel_;
  std::unique_ptr<State> state_;
};

}  // namespace nikki::runtime
