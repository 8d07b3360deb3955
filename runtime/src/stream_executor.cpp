#include <charconv>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "machine.hpp"
#include "native_dispatch.hpp"
#include "reference_semantics.hpp"
#include "nikki/runtime/executor.hpp"

namespace nikki::runtime {

ExecutorKind executor_from_env() {
  const char* env = std::getenv("NIKKI_EXECUTOR");
  if (!env || !*env) return ExecutorKind::native;
  std::string_view v(env);
  if (v == "native") return ExecutorKind::native;
  if (v == "interp") return ExecutorKind::interp;
  throw KernelError(fmt::format("NIKKI_EXECUTOR={} is not an executor", v), {}, {}, "executors: interp, native",
                    "set NIKKI_EXECUTOR=interp or NIKKI_EXECUTOR=native");
}

std::pair<StreamOrder, uint64_t> stream_order_from_env() {
  const char* env = std::getenv("NIKKI_STREAM_ORDER");
  if (!env || !*env) return {StreamOrder::latest_first, 1};
  std::string_view v(env);
  if (v == "latest") return {StreamOrder::latest_first, 1};
  if (v == "earliest") return {StreamOrder::earliest_first, 1};
  constexpr std::string_view kRandom = "random:";
  if (v.substr(0, kRandom.size()) == kRandom) {
    const std::string_view digits = v.substr(kRandom.size());
    uint64_t seed = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), seed);
    if (!digits.empty() && error == std::errc{} && end == digits.data() + digits.size())
      return {StreamOrder::random, seed};
    throw KernelError(fmt::format("NIKKI_STREAM_ORDER={}: the seed '{}' is not a non-negative integer", v, digits),
                      {}, {}, "orders: latest, earliest, random:<seed> with a decimal seed below 2**64",
                      "set NIKKI_STREAM_ORDER=random:42, latest or earliest");
  }
  throw KernelError(fmt::format("NIKKI_STREAM_ORDER={} is not a stream order", v), {}, {},
                    "orders: latest, earliest, random:<seed>", "set NIKKI_STREAM_ORDER=latest, earliest or random:42");
}

struct StreamExecutor::Impl {
  std::shared_ptr<const jit::DeviceProgram> program;
  ExecutorKind kind;
  StreamOrder order;
  uint64_t rng;
  int64_t delayed;
  Machine machine;
  NativeDispatch native;
  std::vector<std::vector<uint32_t>> barrier_positions;  // [stream][barrier ordinal] -> op position
  std::vector<int32_t> barrier_ordinal;                  // instruction index -> barrier ordinal (or -1)
  int64_t native_count = 0, interpreted_count = 0;
  // The run in progress (between begin and finish): its memories, each stream's next op and
  // completed count, and the meeting instruction it stopped at (-1: none).
  std::unique_ptr<Machine::Run> bound;
  std::vector<uint32_t> pos, done;
  int64_t stopped_at = -1;

  Impl(std::shared_ptr<const jit::DeviceProgram> p, ExecutorKind k, std::shared_ptr<const jit::NativeCode> code,
       StreamOrder o, uint64_t seed, int64_t delayed_instruction)
      : program(std::move(p)), kind(k), order(o), rng(seed * 0x9E3779B97F4A7C15ull + 1), delayed(delayed_instruction),
        machine(program->kernel),
        native(program->kernel, std::move(code)) {
    const auto& streams = program->streams;
    barrier_positions.resize(streams.size());
    barrier_ordinal.assign(program->kernel.instructions.size(), -1);
    for (size_t s = 0; s < streams.size(); ++s)
      for (uint32_t i = 0; i < streams[s].ops.size(); ++i)
        if (streams[s].ops[i].kind == jit::StreamOp::Kind::barrier) {
          if (s == 0) barrier_ordinal[streams[s].ops[i].ir_index] = int32_t(barrier_positions[s].size());
          barrier_positions[s].push_back(i);
        }
  }

  void execute(uint32_t ir_index) {
    const Instruction& inst = program->kernel.instructions[ir_index];
    machine.begin_instruction(ir_index);
    if (kind == ExecutorKind::native && native.run(machine, ir_index)) {
      ++native_count;
    } else {
      size_t pc = ir_index;
      reference::execute(machine, inst, pc);
      ++interpreted_count;
    }
  }

  void begin(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs,
             SharedScratch* shared) {
    bound.reset();  // a run abandoned by an error gives its memories back first
    bound = machine.bind(inputs, outputs, fill_outputs);
    if (shared) machine.share_scratch(*shared);
    pos.assign(program->streams.size(), 0);
    done.assign(program->streams.size(), 0);
    stopped_at = -1;
    native_count = interpreted_count = 0;
  }

  /** Every stream moves past the barrier of the instruction at `ir`, with the counts restarted. */
  void continue_after(uint32_t ir) {
    const int32_t target = barrier_ordinal[ir];
    internal_check(target >= 0, "control flow continues at an instruction without a barrier");
    for (size_t s = 0; s < pos.size(); ++s) pos[s] = barrier_positions[s][target] + 1;
    std::fill(done.begin(), done.end(), 0);
  }

  /** Runs until the program ends (-1) or every stream waits at a meeting instruction (its index). */
  int64_t advance() {
    const auto& streams = program->streams;
    const size_t n = streams.size();
    if (stopped_at >= 0) continue_after(uint32_t(std::exchange(stopped_at, -1)));
    for (;;) {
      // 1. The best ready instruction among the stream heads.
      int best = -1, delayed_stream = -1;
      uint32_t best_ir = 0;
      bool any_left = false, all_at_barrier = true;
      for (size_t s = 0; s < n; ++s) {
        if (pos[s] >= streams[s].ops.size()) continue;
        any_left = true;
        const jit::StreamOp& op = streams[s].ops[pos[s]];
        if (op.kind == jit::StreamOp::Kind::barrier) continue;
        all_at_barrier = false;
        bool ready = true;
        for (const jit::SemaphoreWait& w : op.waits) ready = ready && done[w.queue] >= w.count;
        if (!ready) continue;
        if (int64_t(op.ir_index) == delayed) {
          delayed_stream = int(s);
          continue;
        }
        bool better = false;
        switch (order) {
          case StreamOrder::latest_first: better = best < 0 || op.ir_index > best_ir; break;
          case StreamOrder::earliest_first: better = best < 0 || op.ir_index < best_ir; break;
          case StreamOrder::random:
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;  // LCG: cheap, reproducible
            better = best < 0 || (rng >> 33) % 2 == 0;
            break;
        }
        if (better) {
          best = int(s);
          best_ir = op.ir_index;
        }
      }
      if (best < 0 && delayed_stream >= 0) {
        best = delayed_stream;
        best_ir = uint32_t(delayed);
      }
      if (best >= 0) {
        execute(best_ir);
        ++done[best];
        ++pos[best];
        continue;
      }
      if (!any_left) return -1;
      internal_check(all_at_barrier, "device program deadlocked: no stream can make progress");
      // 2. Every stream waits at the same barrier. A meeting: stop, the launch goes on from here.
      //    A loop: run its control instruction once, then move all streams to where control
      //    continues, with the semaphore counts restarted.
      const uint32_t ir = streams[0].ops[pos[0]].ir_index;
      machine.begin_instruction(ir);
      if (is_meeting(program->kernel.instructions[ir].opcode)) return stopped_at = ir;
      size_t pc = ir;
      reference::execute(machine, program->kernel.instructions[ir], pc);
      continue_after(uint32_t(pc));
    }
  }

  const Instruction& stopped_instruction() const {
    internal_check(stopped_at >= 0, "the run is not stopped at a meeting instruction");
    return program->kernel.instructions[size_t(stopped_at)];
  }
};

StreamExecutor::StreamExecutor(std::shared_ptr<const jit::DeviceProgram> program, ExecutorKind kind,
                               std::shared_ptr<const jit::NativeCode> native, StreamOrder order, uint64_t seed,
                               int64_t delayed_instruction)
    : impl_(std::make_unique<Impl>(std::move(program), kind, std::move(native), order, seed, delayed_instruction)) {}

StreamExecutor::~StreamExecutor() = default;

void StreamExecutor::run(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs) {
  InstanceRun* self[] = {this};
  run_launch(self, inputs, outputs, fill_outputs);
}

const Kernel& StreamExecutor::launched_kernel() const { return impl_->program->kernel; }
void StreamExecutor::begin(std::span<void* const> inputs, std::span<void* const> outputs, bool fill_outputs,
                           SharedScratch* shared) {
  impl_->begin(inputs, outputs, fill_outputs, shared);
}
int64_t StreamExecutor::advance() { return impl_->advance(); }
Payload StreamExecutor::read_operand(int slot) const {
  return impl_->machine.read_payload(impl_->stopped_instruction(), slot);
}
void StreamExecutor::write_operand(int slot, const Payload& payload) {
  impl_->machine.write_payload(impl_->stopped_instruction(), slot, payload);
}
void StreamExecutor::finish() { impl_->bound.reset(); }
void StreamExecutor::abandon() noexcept { impl_->bound.reset(); }

size_t StreamExecutor::resident_bytes() const {
  size_t bytes = sizeof(Impl) + impl_->machine.resident_bytes() + impl_->barrier_ordinal.capacity() * sizeof(int32_t);
  for (const auto& positions : impl_->barrier_positions) bytes += sizeof(positions) + positions.capacity() * sizeof(uint32_t);
  return bytes;
}

int64_t StreamExecutor::native_count() const { return impl_->native_count; }
int64_t StreamExecutor::interpreted_count() const { return impl_->interpreted_count; }

}  // namespace nikki::runtime
