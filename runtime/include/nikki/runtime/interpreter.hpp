// The reference interpreter: executes a verified, allocated kernel one instruction at a time in
// program order on a simulated NeuronCore. It is nikki's executable specification of every
// instruction; the native executor is tested against it bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "nikki/ir.hpp"

namespace nikki::runtime {

/**
 * @brief Runs one kernel. HBM tensors are the caller's buffers (no copies): inputs and outputs
 * are passed as pointers to dense row-major data in the order of Kernel::inputs and
 * Kernel::outputs. SBUF and PSUM are arrays owned by the interpreter.
 */
class Interpreter {
 public:
  /** @brief `kernel` must have passed jit::verify and jit::allocate, and must outlive this object. */
  explicit Interpreter(const Kernel& kernel);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  /**
   * @brief Executes the kernel once. Outputs are first filled with the NaN / 4 sentinels, so
   * anything the kernel does not write is visible. Throws KernelError for run-time faults
   * (runtime offsets out of bounds).
   */
  void run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs = true);

 private:
  struct State;
  const Kernel& kernel_;
  std::unique_ptr<State> state_;
};

}  // namespace nikki::runtime
