// The timing model: an event-driven replay of the streams (docs/performance-model.md).
//
// Each queue is an in-order engine. An instruction starts when its queue is free and every
// semaphore it waits on has been signalled (the waited-for instruction has ended); among the
// ready stream heads the one that can start earliest goes first, so shared resources are handed
// out in time order. Compute instructions cost their formula's cycles at their engine's clock;
// DMA transfers pay a fixed latency, then move their bytes through the DMA engines' shared
// bandwidth, one data phase at a time.
#include <algorithm>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "nikki/cost_model.hpp"
#include "nikki/runtime/launch.hpp"
#include "nikki/runtime/profile.hpp"

namespace nikki::runtime {

namespace {

class Replay {
 public:
  explicit Replay(const jit::DeviceProgram& p) : p_(p), k_(p.kernel), t_(k_.config()) {
    const size_t n = p.streams.size();
    pos_.assign(n, 0);
    free_.assign(n, 0.0);
    ends_.assign(n, {});
    issued_.assign(n, {});
    prev_.assign(n, {WaitCause::none, -1});
    regs_.assign(k_.num_registers, std::nullopt);
    barrier_ordinal_.assign(k_.instructions.size(), -1);
    barrier_positions_.resize(n);
    for (size_t s = 0; s < n; ++s)
      for (uint32_t i = 0; i < p.streams[s].ops.size(); ++i)
        if (p.streams[s].ops[i].kind == jit::StreamOp::Kind::barrier) {
          if (s == 0) barrier_ordinal_[p.streams[s].ops[i].ir_index] = int32_t(barrier_positions_[s].size());
          barrier_positions_[s].push_back(i);
        }
    profile_.kernel = k_.name;
    profile_.target = fmt::format("{} ({})", t_.name, t_.core);
    for (const jit::Stream& s : p.streams) profile_.queues.push_back({jit::queue_name(s.queue), 0, 0});
    profile_.dma_peak_bytes_per_ns = t_.dma_engines * t_.dma_bytes_per_ns_per_engine;
    profile_.tensor_peak_flops_per_ns = 2.0 * t_.pe_array_rows * t_.pe_array_cols * t_.clock_ghz.tensor;
  }

  /** Replays until the program ends (-1) or every queue has drained at a meeting instruction (its
   * index; drained_ns() is when). */
  int64_t advance() {
    const auto& streams = p_.streams;
    for (;;) {
      int best = -1;
      double best_start = std::numeric_limits<double>::infinity();
      bool any_left = false, all_at_barrier = true;
      for (size_t s = 0; s < streams.size(); ++s) {
        if (pos_[s] >= streams[s].ops.size()) continue;
        any_left = true;
        const jit::StreamOp& op = streams[s].ops[pos_[s]];
        if (op.kind == jit::StreamOp::Kind::barrier) continue;
        all_at_barrier = false;
        double start = free_[s];
        bool ready = true;
        for (const jit::SemaphoreWait& w : op.waits) {
          if (ends_[w.queue].size() < w.count) {
            ready = false;
            break;
          }
          start = std::max(start, ends_[w.queue][w.count - 1]);
        }
        if (ready && start < best_start) {
          best = int(s);
          best_start = start;
        }
      }
      if (best >= 0) {
        issue(best, best_start);
        continue;
      }
      if (!any_left) return -1;
      internal_check(all_at_barrier, "timing replay deadlocked");
      const uint32_t ir = streams[0].ops[pos_[0]].ir_index;
      if (is_meeting(k_.instructions[ir].opcode)) return ir;
      barrier();
    }
  }

  /** When the last queue drained. */
  double drained_ns() const { return *std::max_element(free_.begin(), free_.end()); }

  /** The meeting every queue waits at completed at `release_ns`: it enters the timeline (on the
   * sync queue, from when the queues drained), and every queue goes on from then. */
  void release(double release_ns) {
    const uint32_t ir = p_.streams[0].ops[pos_[0]].ir_index;
    const double now = drained_ns();
    InstructionTiming it;
    it.ir_index = ir;
    it.queue = uint16_t(sync_queue());
    it.start_ns = now;
    it.end_ns = std::max(now, release_ns);
    it.cause = WaitCause::meeting;
    const int32_t index = int32_t(profile_.instructions.size());
    profile_.instructions.push_back(it);
    resume_after(ir, it.end_ns, WaitCause::meeting, index);
  }

  Profile finish() {
    for (const InstructionTiming& it : profile_.instructions) profile_.total_ns = std::max(profile_.total_ns, it.end_ns);
    sort_by_start();
    return std::move(profile_);
  }

  const Kernel& kernel() const { return k_; }
  const TargetConfig& target() const { return t_; }

 private:
  void issue(int s, double start) {
    const jit::StreamOp& op = p_.streams[s].ops[pos_[s]];
    const Instruction& inst = k_.instructions[op.ir_index];
    InstructionTiming it;
    it.ir_index = op.ir_index;
    it.queue = uint16_t(s);
    attribute_start(s, op, it);
    const int32_t index = int32_t(profile_.instructions.size());
    if (inst.engine == Engine::dma) {
      const cost::DmaWork w = cost::dma_work(k_, inst);
      const double data = cost::dma_data_ns(t_, w.bytes, w.buffers);
      const double data_start = std::max(start + t_.dma_fixed_latency_ns, dma_free_);
      if (dma_free_ > start + t_.dma_fixed_latency_ns) it.data_blocker = dma_holder_;
      it.start_ns = start;
      it.end_ns = data_start + data;
      it.bytes = w.bytes;
      dma_free_ = it.end_ns;
      dma_holder_ = index;
      profile_.dma_bytes += w.bytes;
      profile_.dma_active_ns += data;
    } else {
      const double cycles = cost::compute_cycles(k_, inst);
      const double ports = port_ready(inst);
      if (ports > start) it.cause = WaitCause::port, it.blocker = port_holder(inst);
      start = std::max(start, ports);
      it.start_ns = start;
      it.end_ns = start + cycles / cost::clock_ghz(t_, inst.engine);
      it.cycles = cycles;
      hold_ports(inst, it.end_ns, index);
      if (inst.opcode == Opcode::nc_matmul) {
        const AccessPattern st = k_.view(inst, 1), mv = k_.view(inst, 2);
        profile_.matmul_flops += 2 * st.dims[0].count * st.inner_elements() * mv.inner_elements();
      }
      if (inst.spec().is_control) control(inst);
    }
    profile_.queues[s].busy_ns += it.end_ns - it.start_ns;
    profile_.queues[s].instructions += 1;
    profile_.instructions.push_back(it);
    ends_[s].push_back(it.end_ns);
    issued_[s].push_back(index);
    prev_[s] = {WaitCause::queue, index};
    free_[s] = it.end_ns;
    ++pos_[s];
  }

  /** Why the instruction at the head of queue s starts when it does: its queue's previous
   *  instruction (or the barrier before it), or the semaphore wait that is satisfied last. */
  void attribute_start(int s, const jit::StreamOp& op, InstructionTiming& it) const {
    it.cause = prev_[s].first;
    it.blocker = prev_[s].second;
    double latest = free_[s];
    for (const jit::SemaphoreWait& w : op.waits) {
      const double end = ends_[w.queue][w.count - 1];
      if (end > latest) {
        latest = end;
        it.cause = WaitCause::semaphore;
        it.blocker = issued_[w.queue][w.count - 1];
      }
    }
  }

  /** NeuronCore-v2 port sharing (cost::shared_ports): an instruction waits for the ports it needs. */
  double port_ready(const Instruction& inst) const {
    const cost::SharedPorts ports = cost::shared_ports(k_, inst);
    return std::max(ports.sbuf ? sbuf_port_free_ : 0.0, ports.psum ? psum_port_free_ : 0.0);
  }
  int32_t port_holder(const Instruction& inst) const {
    const cost::SharedPorts ports = cost::shared_ports(k_, inst);
    if (ports.sbuf && ports.psum) return sbuf_port_free_ >= psum_port_free_ ? sbuf_port_holder_ : psum_port_holder_;
    return ports.sbuf ? sbuf_port_holder_ : psum_port_holder_;
  }
  void hold_ports(const Instruction& inst, double end, int32_t index) {
    const cost::SharedPorts ports = cost::shared_ports(k_, inst);
    if (ports.sbuf) sbuf_port_free_ = end, sbuf_port_holder_ = index;
    if (ports.psum) psum_port_free_ = end, psum_port_holder_ = index;
  }

  /** Instructions in start order, with `blocker` renumbered to match. */
  void sort_by_start() {
    std::vector<InstructionTiming>& v = profile_.instructions;
    std::vector<int32_t> order(v.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a].start_ns < v[b].start_ns; });
    std::vector<int32_t> position(v.size());
    for (size_t i = 0; i < order.size(); ++i) position[order[i]] = int32_t(i);
    std::vector<InstructionTiming> sorted;
    sorted.reserve(v.size());
    for (int32_t i : order) {
      InstructionTiming& it = sorted.emplace_back(v[i]);
      if (it.blocker >= 0) it.blocker = position[it.blocker];
      if (it.data_blocker >= 0) it.data_blocker = position[it.data_blocker];
    }
    v = std::move(sorted);
  }

  /** Registers the model can follow without data: immediates and register copies. */
  void control(const Instruction& inst) {
    const Operand& dst = inst.operands[0];
    if (inst.opcode == Opcode::register_move)
      regs_[dst.reg()] = inst.operands[1].is_imm() ? std::optional<int64_t>(int64_t(inst.operands[1].imm()))
                                                   : regs_[inst.operands[1].reg()];
    else if (inst.opcode == Opcode::register_load)
      regs_[dst.reg()] = std::nullopt;
  }

  int64_t value(const Instruction& inst, const Operand& o) {
    if (o.is_imm()) return int64_t(o.imm());
    if (!regs_[o.reg()])
      throw KernelError("the timing estimate needs the loop's bounds at compile time, but register r" +
                            std::to_string(o.reg()) + " is read from a tensor",
                        k_.location(inst.loc), std::string(opcode_name(inst.opcode)), {},
                        "estimate with concrete arrays through a run, or use compile-time loop bounds");
    return *regs_[o.reg()];
  }

  /** All queues have drained at a barrier: run the loop control once, restart the counts. */
  void barrier() {
    size_t latest = 0;  // the queue that drains last: every queue's next op follows its last op
    for (size_t q = 1; q < free_.size(); ++q)
      if (free_[q] > free_[latest]) latest = q;
    const double now = free_[latest];
    const int32_t last = prev_[latest].second;
    const uint32_t ir = p_.streams[0].ops[pos_[0]].ir_index;
    const Instruction& inst = k_.instructions[ir];
    uint32_t target = ir;
    if (inst.opcode == Opcode::loop_begin) {
      const int64_t lower = value(inst, inst.operands[1]), upper = value(inst, inst.operands[2]);
      regs_[inst.operands[0].reg()] = lower;
      if (lower >= upper) target = uint32_t(k_.rare(inst).jump);
    } else {
      const Instruction& begin = k_.instructions[k_.rare(inst).jump];
      int64_t& counter = *regs_[begin.operands[0].reg()];
      counter += k_.rare(begin).step;
      if (counter < value(begin, begin.operands[2])) target = uint32_t(k_.rare(inst).jump);
    }
    resume_after(target, now, last < 0 ? WaitCause::none : WaitCause::barrier, last);
  }

  /** Every queue goes on after the barrier of instruction `ir` at time `now`, its next op
   * following `cause` (instruction `last` of the profile). */
  void resume_after(uint32_t ir, double now, WaitCause cause, int32_t last) {
    const int32_t ordinal = barrier_ordinal_[ir];
    internal_check(ordinal >= 0, "the replay continues at an instruction without a barrier");
    for (size_t s = 0; s < pos_.size(); ++s) {
      pos_[s] = barrier_positions_[s][ordinal] + 1;
      free_[s] = now;
      ends_[s].clear();
      issued_[s].clear();
      prev_[s] = {cause, last};
    }
  }

  /** The stream of the sync engine, where meetings are shown. */
  size_t sync_queue() const {
    for (size_t s = 0; s < p_.streams.size(); ++s)
      if (p_.streams[s].queue.kind == jit::QueueKind::sync) return s;
    return 0;
  }

  const jit::DeviceProgram& p_;
  const Kernel& k_;
  const TargetConfig& t_;
  std::vector<uint32_t> pos_;
  std::vector<double> free_;
  std::vector<std::vector<double>> ends_;  // per queue: end times of the ops since the last barrier
  std::vector<std::vector<int32_t>> issued_;  // ... and their indices in profile_.instructions
  std::vector<std::pair<WaitCause, int32_t>> prev_;  // per queue: what its next op follows
  std::vector<std::optional<int64_t>> regs_;
  std::vector<int32_t> barrier_ordinal_;
  std::vector<std::vector<uint32_t>> barrier_positions_;
  double dma_free_ = 0, sbuf_port_free_ = 0, psum_port_free_ = 0;
  int32_t dma_holder_ = -1, sbuf_port_holder_ = -1, psum_port_holder_ = -1;
  Profile profile_;
};

}  // namespace

Profile estimate(const jit::DeviceProgram& program) {
  const jit::DeviceProgram* alone[] = {&program};  // a launch of one: its core_barriers wait for no one
  return std::move(estimate_launch(alone).front());
}

std::vector<Profile> estimate_launch(std::span<const jit::DeviceProgram* const> programs) {
  const size_t n = programs.size();
  std::vector<std::unique_ptr<Replay>> replays;
  for (const jit::DeviceProgram* p : programs) replays.push_back(std::make_unique<Replay>(*p));
  std::vector<InstancePlace> places(n);
  std::vector<uint8_t> running(n, 1);
  for (size_t i = 0; i < n; ++i) places[i].kernel = &replays[i]->kernel();
  for (;;) {
    for (size_t i = 0; i < n; ++i)
      if (running[i]) places[i].at = replays[i]->advance(), running[i] = 0;
    if (std::all_of(places.begin(), places.end(), [](const InstancePlace& p) { return p.at < 0; })) break;
    const std::vector<size_t> go = completed_meetings(places);
    // A meeting completes when the last of its members has drained, plus a cross-core semaphore
    // write (the DMA engines' fixed latency); a sendrecv then also moves its bytes.
    std::vector<double> release(n, 0.0);
    for (size_t i : go) {
      const Replay& r = *replays[i];
      double ready = r.drained_ns();
      for (size_t m : meeting_partners(places, i)) ready = std::max(ready, replays[m]->drained_ns());
      const Instruction& inst = r.kernel().instructions[size_t(places[i].at)];
      release[i] = ready + r.target().dma_fixed_latency_ns;
      if (inst.opcode == Opcode::sendrecv) {
        const cost::DmaWork w = cost::dma_work(r.kernel(), inst);
        release[i] += cost::dma_data_ns(r.target(), w.bytes, w.buffers);
      }
    }
    for (size_t i : go) {
      replays[i]->release(release[i]);
      ++places[i].meetings;
      running[i] = 1;
    }
  }
  std::vector<Profile> out;
  for (auto& r : replays) out.push_back(r->finish());
  return out;
}

const char* wait_cause_name(WaitCause c) {
  switch (c) {
    case WaitCause::none: return "none";
    case WaitCause::queue: return "queue";
    case WaitCause::semaphore: return "semaphore";
    case WaitCause::barrier: return "barrier";
    case WaitCause::meeting: return "meeting";
    case WaitCause::port: return "port";
  }
  return "?";
}

double Profile::utilization(const std::string& queue) const {
  for (const QueueUsage& q : queues)
    if (q.name == queue) return total_ns > 0 ? q.busy_ns / total_ns : 0;
  return 0;
}

double Profile::tensor_flop_utilization() const {
  return total_ns > 0 ? double(matmul_flops) / (total_ns * tensor_peak_flops_per_ns) : 0;
}

}  // namespace nikki::runtime
