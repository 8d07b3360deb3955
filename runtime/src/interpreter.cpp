#include "nikki/runtime/interpreter.hpp"

#include "machine.hpp"
#include "reference_semantics.hpp"
#include "shadow_memory.hpp"

namespace nikki::runtime {

struct Interpreter::State {
  Machine machine;
  bool sanitize;
  State(const Kernel& k, bool sanitize_runs) : machine(k), sanitize(sanitize_runs) {}
};

Interpreter::Interpreter(const Kernel& kernel, bool sanitize) : kernel_(kernel) {
  internal_check(kernel.allocated, "the interpreter needs an allocated kernel (run jit::allocate first)");
  state_ = std::make_unique<State>(kernel, sanitize);
}

Interpreter::~Interpreter() = default;

void Interpreter::run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs) {
  Machine& m = state_->machine;
  const auto run = m.bind(inputs, outputs, fill_outputs);
  const auto& insts = kernel_.instructions;
  if (!state_->sanitize) {
    for (size_t pc = 0; pc < insts.size(); ++pc) {
      m.begin_instruction(pc);
      reference::execute(m, insts[pc], pc);
    }
    return;
  }
  // The shadow lives as long as the run, like the memories it describes.
  ShadowMemory shadow(m, fill_outputs);
  for (size_t pc = 0; pc < insts.size(); ++pc) {
    m.begin_instruction(pc);
    shadow.begin_instruction(m, pc);
    shadow.exec(m, insts[pc], pc);
  }
  shadow.end_run(m);
}

size_t Interpreter::resident_bytes() const { return sizeof(*this) + sizeof(State) + state_->machine.resident_bytes(); }

}  // namespace nikki::runtime
