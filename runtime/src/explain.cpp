// Profile::explain: what limits a kernel, read from the timing model's per-instruction record of
// what each start waited for (runtime/src/timing.cpp).
#include "nikki/runtime/explain.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "nikki/cost_model.hpp"
#include "source_line.hpp"

namespace nikki::runtime {

namespace {

bool is_dma_queue(const std::string& q) { return q.rfind("qDMA", 0) == 0; }

/** The engine a compute queue feeds, as NKI's documentation names it. */
std::string engine_name(const std::string& q) {
  if (q == "qTensor") return "TensorE";
  if (q == "qVector") return "VectorE";
  if (q == "qScalar") return "ScalarE";
  if (q == "qGpSimd") return "GpSimdE";
  return q;
}

std::string us(double ns) { return fmt::format("{:.1f} us", ns / 1e3); }
std::string share(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}%", 100 * part / whole) : "-"; }

class Explainer {
 public:
  Explainer(const Profile& prof, const jit::DeviceProgram& p, double useful_flops)
      : prof_(prof), p_(p), k_(p.kernel) {
    e_.kernel = prof.kernel;
    e_.target = prof.target;
    e_.total_ns = prof.total_ns;
    e_.flops = useful_flops > 0 ? useful_flops : double(prof.matmul_flops);
    for (StorageId id : k_.inputs) e_.io_bytes += double(k_.storage(id).total_bytes());
    for (StorageId id : k_.outputs) e_.io_bytes += double(k_.storage(id).total_bytes());
    if (prof.tensor_peak_flops_per_ns > 0) e_.compute_roofline_ns = e_.flops / prof.tensor_peak_flops_per_ns;
    if (prof.dma_peak_bytes_per_ns > 0) e_.memory_roofline_ns = e_.io_bytes / prof.dma_peak_bytes_per_ns;
    for (const QueueUsage& q : prof.queues)
      if (q.instructions > 0) e_.queues.push_back(q);
  }

  Explanation run() {
    idle_time();
    critical_path();
    e_.limit = limit();
    suggest();
    return std::move(e_);
  }

 private:
  const std::string& queue(int32_t i) const { return prof_.queues[prof_.instructions[i].queue].name; }
  Opcode opcode(int32_t i) const { return k_.instructions[prof_.instructions[i].ir_index].opcode; }
  std::string line(int32_t i) const {
    std::string l = source_line(p_, prof_.instructions[i].ir_index);
    return l.empty() ? "(no source line)" : l;
  }
  std::string describe(int32_t i) const { return fmt::format("{} at {}", opcode_name(opcode(i)), line(i)); }

  std::string idle_reason(const InstructionTiming& it) const {
    switch (it.cause) {
      case WaitCause::semaphore: return fmt::format("waiting for {}: {}", queue(it.blocker), describe(it.blocker));
      case WaitCause::barrier: return "at a loop barrier (every queue drains before the next iteration)";
      case WaitCause::meeting: return "at a core_barrier or sendrecv, waiting for the other program instances";
      case WaitCause::port: return fmt::format("shared SBUF/PSUM port held by {}", queue(it.blocker));
      default: return "nothing issued to it yet";
    }
  }

  /** Gaps between a queue's instructions, each charged to what the next instruction waited for. */
  void idle_time() {
    std::map<std::pair<std::string, std::string>, double> idle;
    std::vector<double> last_end(prof_.queues.size(), 0.0);
    std::vector<bool> used(prof_.queues.size(), false);
    for (const InstructionTiming& it : prof_.instructions) {
      const double gap = it.start_ns - last_end[it.queue];
      if (gap > 1e-6) idle[{prof_.queues[it.queue].name, idle_reason(it)}] += gap;
      last_end[it.queue] = std::max(last_end[it.queue], it.end_ns);
      used[it.queue] = true;
    }
    for (size_t q = 0; q < last_end.size(); ++q)
      if (used[q] && prof_.total_ns - last_end[q] > 1e-6)
        idle[{prof_.queues[q].name, "finished while other queues still run"}] += prof_.total_ns - last_end[q];
    for (const auto& [key, ns] : idle) e_.idle.push_back({key.first, key.second, ns});
    std::sort(e_.idle.begin(), e_.idle.end(), [](const IdleReason& a, const IdleReason& b) { return a.ns > b.ns; });
  }

  /** From the instruction that ends last back through what each one waited for; each step owns
   *  the time from its blocker's end to its own end, so the steps partition the run. */
  void critical_path() {
    const auto& v = prof_.instructions;
    if (v.empty()) return;
    int32_t cur = 0;
    for (int32_t i = 1; i < int32_t(v.size()); ++i)
      if (v[i].end_ns > v[cur].end_ns) cur = i;
    std::map<std::pair<std::string, std::string>, PathLine> lines;
    const double dma_latency = k_.config().dma_fixed_latency_ns;
    while (cur >= 0) {
      const InstructionTiming& it = v[cur];
      // A transfer whose data waited behind another's ends when that one's data is through.
      const int32_t next = it.data_blocker >= 0 ? it.data_blocker : it.blocker;
      const double from = next >= 0 ? v[next].end_ns : 0.0;
      const double owned = std::max(0.0, it.end_ns - from);
      PathLine& pl = lines[{line(cur), queue(cur)}];
      if (pl.instructions == 0) pl = {line(cur), queue(cur), std::string(opcode_name(opcode(cur))), 0, 0};
      pl.ns += owned;
      pl.instructions += 1;
      if (is_dma_queue(queue(cur)) && it.data_blocker < 0) {
        path_dma_latency_ns_ += std::min(owned, dma_latency);
        path_dmas_ += 1;
      }
      e_.path_instructions += 1;
      if (next >= cur) break;  // blockers start earlier; never loop
      cur = next;
    }
    for (auto& [key, pl] : lines) e_.critical_path.push_back(pl);
    std::sort(e_.critical_path.begin(), e_.critical_path.end(),
              [](const PathLine& a, const PathLine& b) { return a.ns > b.ns; });
  }

  /** The busiest compute queue (the Tensor, Vector, Scalar and GpSimd engines). */
  const QueueUsage* busiest_engine() const {
    const QueueUsage* best = nullptr;
    for (const QueueUsage& q : e_.queues)
      if (!is_dma_queue(q.name) && q.name != "qSync" && (!best || q.busy_ns > best->busy_ns)) best = &q;
    return best;
  }

  std::string limit() const {
    const double total = e_.total_ns;
    const double roofline = std::max(e_.compute_roofline_ns, e_.memory_roofline_ns);
    const bool compute = e_.compute_roofline_ns >= e_.memory_roofline_ns;
    if (total > 0 && roofline >= 0.7 * total)
      return fmt::format("the estimate is within {:.0f}% of the {} roofline: {} limits the kernel",
                         100 * (1 - roofline / total), compute ? "compute" : "memory",
                         compute ? "TensorE's peak FLOP rate" : "HBM bandwidth");
    const QueueUsage* busy = busiest_engine();
    if (busy && busy->busy_ns >= 0.75 * total)
      return fmt::format("{} ({}) is busy {} of the run: it limits the kernel", engine_name(busy->name), busy->name,
                         share(busy->busy_ns, total));
    if (prof_.dma_active_ns >= 0.75 * total)
      return fmt::format("the DMA engines move data {} of the run: transfers limit the kernel",
                         share(prof_.dma_active_ns, total));
    return fmt::format("no engine is saturated (busiest: {} {}, DMA data moving {}): dependencies between engines "
                       "and DMA latency limit the kernel (see the critical path)",
                       busy ? busy->name : std::string("none"), busy ? share(busy->busy_ns, total) : "-",
                       share(prof_.dma_active_ns, total));
  }

  /** Busy time of one queue by source line, largest first. */
  std::vector<std::pair<std::string, double>> busy_lines(const std::string& q) const {
    std::map<std::string, double> by_line;
    for (int32_t i = 0; i < int32_t(prof_.instructions.size()); ++i)
      if (queue(i) == q) by_line[line(i)] += prof_.instructions[i].end_ns - prof_.instructions[i].start_ns;
    std::vector<std::pair<std::string, double>> out(by_line.begin(), by_line.end());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
  }

  void suggest() {
    const double total = e_.total_ns;
    std::vector<Suggestion> s;
    const QueueUsage* busy = busiest_engine();
    if (busy && busy->name != "qTensor" && busy->busy_ns >= 0.5 * total) {
      const auto lines = busy_lines(busy->name);
      std::string top;
      for (size_t i = 0; i < std::min<size_t>(2, lines.size()); ++i)
        top += fmt::format("{}{} ({})", i ? ", " : "", lines[i].first, us(lines[i].second));
      s.push_back({fmt::format("{} is busy {} of the run; its heaviest lines: {}. Move part of that work to an idler "
                               "engine (nisa.activation runs on ScalarE; engine=nisa.gpsimd_engine for element-wise "
                               "ops) or fuse passes so each element is read once.",
                               engine_name(busy->name), share(busy->busy_ns, total), top),
                   lines.empty() ? 0.0 : lines[0].second});
    }
    for (const QueueUsage& q : e_.queues)
      if (q.name == "qTensor" && q.busy_ns >= 0.5 * total && prof_.tensor_peak_flops_per_ns > 0) {
        const double busy_rate = double(prof_.matmul_flops) / (q.busy_ns * prof_.tensor_peak_flops_per_ns);
        if (busy_rate < 0.6)
          s.push_back({fmt::format("TensorE is busy {} of the run but reaches {:.0f}% of its peak FLOP rate while "
                                   "busy: its matmuls fill a fraction of the PE array (contraction over fewer than 128 "
                                   "partitions, fewer than 128 stationary columns, or fp32 operands at a quarter of "
                                   "the bf16 rate). Cast operands to bf16 and tile K by 128, M by 128, N by 512.",
                                   share(q.busy_ns, total), 100 * busy_rate),
                       q.busy_ns * (1 - busy_rate)});
      }
    dma_suggestions(s);
    for (const IdleReason& r : e_.idle)
      if (!is_dma_queue(r.queue) && r.reason.rfind("waiting for", 0) == 0) {
        s.push_back({fmt::format("{} sits {} ({}) {}. Give that tile two or three buffers (allocate it inside the "
                                 "loop, or rotate copies) so its producer runs ahead of its consumer.",
                                 engine_name(r.queue), us(r.ns), share(r.ns, total), r.reason),
                     r.ns});
        break;  // the largest one: the others usually follow from it
      }
    if (path_dma_latency_ns_ >= 0.15 * total)
      s.push_back({fmt::format("the critical path pays the fixed DMA latency {} times ({}, {} of the run): start "
                               "loads earlier (prefetch the next tile while computing on this one) and merge small "
                               "transfers.",
                               path_dmas_, us(path_dma_latency_ns_), share(path_dma_latency_ns_, total)),
                   path_dma_latency_ns_});
    std::stable_sort(s.begin(), s.end(), [](const Suggestion& a, const Suggestion& b) { return a.stake_ns > b.stake_ns; });
    if (s.size() > 3) s.resize(3);
    e_.suggestions = std::move(s);
  }

  void dma_suggestions(std::vector<Suggestion>& s) const {
    const double total = e_.total_ns;
    double bytes = 0, buffers = 0, spill_bytes = 0, spill_ns = 0;
    int64_t spills = 0;
    for (const InstructionTiming& it : prof_.instructions) {
      const Instruction& inst = k_.instructions[it.ir_index];
      if (inst.engine != Engine::dma) continue;
      const cost::DmaWork w = cost::dma_work(k_, inst);
      bytes += double(w.bytes);
      buffers += double(w.buffers);
      if (const std::string_view name = k_.instruction_name(inst); name == "spill" || name == "reload") {
        spills += 1;
        spill_bytes += double(w.bytes);
        spill_ns += it.end_ns - it.start_ns;
      }
    }
    const double active = prof_.dma_active_ns;
    if (active >= 0.4 * total && buffers > 0 && active > 0) {
      const double per_buffer = bytes / buffers;
      const double rate = bytes / active / prof_.dma_peak_bytes_per_ns;
      if (per_buffer < 512)
        s.push_back({fmt::format("DMA moves data {} of the run at {:.0f}% of peak bandwidth; transfers average {:.0f} B "
                                 "per descriptor and each descriptor has a fixed cost: make each partition's row of a "
                                 "transfer 512 B or more (2 KiB is better) by moving wider tiles.",
                                 share(active, total), 100 * rate, per_buffer),
                     active * (1 - rate)});
      if (bytes > 1.5 * e_.io_bytes && e_.io_bytes > 0)
        s.push_back({fmt::format("DMA moves {:.1f}x the kernel's compulsory traffic ({:.2f} MiB for {:.2f} MiB of "
                                 "inputs and outputs): keep reused tiles in SBUF instead of loading them again.",
                                 bytes / e_.io_bytes, bytes / (1 << 20), e_.io_bytes / (1 << 20)),
                     (bytes - e_.io_bytes) / prof_.dma_peak_bytes_per_ns});
    }
    if (spills > 0)
      s.push_back({fmt::format("the allocator spilled SBUF tensors to HBM: {} spill and reload DMAs move {:.2f} MiB; "
                               "shrink what is live at once (smaller tiles, fewer buffers) so it fits.",
                               spills, spill_bytes / (1 << 20)),
                   spill_ns});
  }

  const Profile& prof_;
  const jit::DeviceProgram& p_;
  const Kernel& k_;
  Explanation e_;
  double path_dma_latency_ns_ = 0;
  int64_t path_dmas_ = 0;
};

}  // namespace

Explanation explain(const Profile& profile, const jit::DeviceProgram& program, double useful_flops) {
  return Explainer(profile, program, useful_flops).run();
}

std::string Explanation::text(size_t rows) const {
  std::string out = fmt::format("{} on {}: {} ESTIMATED (nikki's timing model, not a measurement)\n", kernel, target,
                                us(total_ns));
  out += fmt::format("limit: {}\n", limit);
  const double roofline = std::max(compute_roofline_ns, memory_roofline_ns);
  out += fmt::format("roofline: {:.3g} FLOP and {:.2f} MiB of compulsory HBM traffic take {} of compute and {} of "
                     "memory at the target's peaks; the estimate is {:.2f}x the roofline\n",
                     flops, io_bytes / (1 << 20), us(compute_roofline_ns), us(memory_roofline_ns),
                     roofline > 0 ? total_ns / roofline : 0.0);
  out += "engines (busy; idle time by cause):\n";
  for (const QueueUsage& q : queues) {
    out += fmt::format("  {:<8} busy {:>6}", q.name, share(q.busy_ns, total_ns));
    size_t shown = 0;
    for (const IdleReason& r : idle)
      if (r.queue == q.name && shown < 2) {
        out += fmt::format("{}{} {}", shown ? "; " : "  idle: ", share(r.ns, total_ns), r.reason);
        ++shown;
      }
    out += "\n";
  }
  out += fmt::format("critical path: {} instructions; by line:\n", path_instructions);
  for (size_t i = 0; i < std::min(rows, critical_path.size()); ++i) {
    const PathLine& l = critical_path[i];
    out += fmt::format("  {:<28} {:<8} {:<22} {:>10} {:>6}  ({} instructions)\n", l.line, l.queue, l.opcode, us(l.ns),
                       share(l.ns, total_ns), l.instructions);
  }
  out += "what would help most:\n";
  if (suggestions.empty()) out += "  nothing stands out: the kernel is near what the model allows for its work\n";
  for (size_t i = 0; i < suggestions.size(); ++i) out += fmt::format("  {}. {}\n", i + 1, suggestions[i].text);
  return out;
}

}  // namespace nikki::runtime
