#include "nikki/runtime/interpreter.hpp"

#include "machine.hpp"

namespace nikki::runtime {

struct Interpreter::State {
  Machine machine;
  explicit State(const Kernel& k) : machine(k) {}
};

Interpreter::Interpreter(const Kernel& kernel) : kernel_(kernel), state_(std::make_unique<State>(kernel)) {
  internal_check(kernel.allocated, "the interpreter needs an allocated kernel (run jit::allocate first)");
}

Interpreter::~Interpreter() = default;

void Interpreter::run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs) {
  Machine& m = state_->machine;
  const auto run = m.bind(inputs, outputs, fill_outputs);
  const auto& insts = kernel_.instructions;
  for (size_t pc = 0; pc < insts.size(); ++pc) {
    m.begin_instruction(pc);
    m.exec(insts[pc], pc);
  }
}

}  // namespace nikki::runtime
