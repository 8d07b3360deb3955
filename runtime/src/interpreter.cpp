#include "nikki/runtime/interpreter.hpp"

#include <utility>

#include "machine.hpp"
#include "reference_semantics.hpp"
#include "shadow_memory.hpp"

namespace nikki::runtime {

struct Interpreter::State {
  Machine machine;
  bool sanitize;
  // The run in progress (between begin and finish): its memories, the sanitizer's shadow (which
  // lives as long as the memories it describes), the next instruction and the meeting it stopped at.
  std::unique_ptr<Machine::Run> bound;
  std::unique_ptr<ShadowMemory> shadow;
  size_t pc = 0;
  int64_t stopped_at = -1;
  State(const Kernel& k, bool sanitize_runs) : machine(k), sanitize(sanitize_runs) {}

  const Instruction& stopped_instruction() const {
    internal_check(stopped_at >= 0, "the run is not stopped at a meeting instruction");
    return machine.kernel().instructions[size_t(stopped_at)];
  }
  void release() noexcept {
    shadow.reset();
    bound.reset();
  }
};

Interpreter::Interpreter(const Kernel& kernel, bool sanitize) : kernel_(kernel) {
  internal_check(kernel.allocated, "the interpreter needs an allocated kernel (run jit::allocate first)");
  state_ = std::make_unique<State>(kernel, sanitize);
}

Interpreter::~Interpreter() = default;

void Interpreter::run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs) {
  InstanceRun* self[] = {this};
  run_launch(self, inputs, outputs, fill_outputs);
}

const Kernel& Interpreter::launched_kernel() const { return kernel_; }

void Interpreter::begin(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs,
                        SharedScratch* shared) {
  State& s = *state_;
  s.release();  // a run abandoned by an error gives its memories back first
  s.bound = s.machine.bind(inputs, outputs, fill_outputs);
  if (shared) s.machine.share_scratch(*shared);
  if (s.sanitize) s.shadow = std::make_unique<ShadowMemory>(s.machine, fill_outputs);
  s.pc = 0;
  s.stopped_at = -1;
}

int64_t Interpreter::advance() {
  State& s = *state_;
  Machine& m = s.machine;
  const auto& insts = kernel_.instructions;
  if (s.stopped_at >= 0) s.pc = size_t(std::exchange(s.stopped_at, -1)) + 1;
  for (; s.pc < insts.size(); ++s.pc) {
    m.begin_instruction(s.pc);
    if (s.shadow) s.shadow->begin_instruction(m, s.pc);
    if (is_meeting(insts[s.pc].opcode)) return s.stopped_at = int64_t(s.pc);
    if (s.shadow) s.shadow->exec(m, insts[s.pc], s.pc);
    else reference::execute(m, insts[s.pc], s.pc);
  }
  return -1;
}

Payload Interpreter::read_operand(int slot) const {
  const State& s = *state_;
  const Instruction& inst = s.stopped_instruction();
  if (s.shadow) s.shadow->require_sent_valid(s.machine, inst, size_t(s.stopped_at), slot);
  return s.machine.read_payload(inst, slot);
}

void Interpreter::write_operand(int slot, const Payload& payload) {
  State& s = *state_;
  const Instruction& inst = s.stopped_instruction();
  s.machine.write_payload(inst, slot, payload);
  if (s.shadow) s.shadow->mark_received(s.machine, inst, size_t(s.stopped_at), slot);
}

void Interpreter::met() {
  if (state_->shadow) state_->shadow->partners_may_have_written(state_->machine);
}

void Interpreter::finish() {
  State& s = *state_;
  struct Release {
    State& s;
    ~Release() { s.release(); }
  } release{s};
  if (s.shadow) s.shadow->end_run(s.machine);
}

void Interpreter::abandon() noexcept { state_->release(); }

size_t Interpreter::resident_bytes() const { return sizeof(*this) + sizeof(State) + state_->machine.resident_bytes(); }

}  // namespace nikki::runtime
