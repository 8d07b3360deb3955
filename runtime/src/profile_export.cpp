// Profile outputs: a text summary and Chrome / Perfetto trace JSON. Every figure is labelled as
// an estimate of the modelled target.
#include <algorithm>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/runtime/profile.hpp"
#include "source_line.hpp"

namespace nikki::runtime {

namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string Profile::summary(const jit::DeviceProgram& p, int top) const {
  std::string s = fmt::format("ESTIMATE for {} (cycle-approximate model, not a measurement)\n", target);
  s += fmt::format("kernel '{}': {:.3f} us estimated, {} instructions\n", kernel, total_ns / 1000.0, instructions.size());
  s += "engine      busy (us)  util   instructions\n";
  double dma_busy = 0;
  int64_t dma_count = 0;
  for (const QueueUsage& q : queues) {
    if (q.name.rfind("qDMA", 0) == 0) {
      dma_busy = std::max(dma_busy, q.busy_ns);
      dma_count += q.instructions;
      continue;
    }
    if (q.instructions == 0) continue;
    s += fmt::format("{:<10} {:>10.3f} {:>5.1f}%  {}\n", q.name, q.busy_ns / 1000.0,
                     total_ns > 0 ? 100.0 * q.busy_ns / total_ns : 0.0, q.instructions);
  }
  s += fmt::format("DMA        {:>10.3f} {:>5.1f}%  {} transfers, {:.3f} MB at {:.1f} GB/s achieved ({:.0f}% of {:.0f} GB/s)\n",
                   dma_active_ns / 1000.0, total_ns > 0 ? 100.0 * dma_active_ns / total_ns : 0.0, dma_count,
                   dma_bytes / 1e6, dma_bytes_per_ns(), 100.0 * dma_bytes_per_ns() / dma_peak_bytes_per_ns,
                   dma_peak_bytes_per_ns);
  if (matmul_flops > 0)
    s += fmt::format("TensorE    {:.3f} GFLOP, {:.1f}% of the {:.1f} TFLOPS 16-bit peak\n", matmul_flops / 1e9,
                     100.0 * tensor_flop_utilization(), tensor_peak_flops_per_ns / 1000.0);
  std::vector<const InstructionTiming*> longest;
  for (const InstructionTiming& it : instructions) longest.push_back(&it);
  std::sort(longest.begin(), longest.end(), [](const InstructionTiming* a, const InstructionTiming* b) {
    return a->end_ns - a->start_ns > b->end_ns - b->start_ns;
  });
  if (!longest.empty()) s += "longest instructions:\n";
  for (int i = 0; i < top && i < int(longest.size()); ++i) {
    const InstructionTiming& it = *longest[i];
    s += fmt::format("  {:>9.3f} us  {:<8} {:<22} {}\n", (it.end_ns - it.start_ns) / 1000.0, queues[it.queue].name,
                     opcode_name(p.kernel.instructions[it.ir_index].opcode), source_line(p, it.ir_index));
  }
  return s;
}

std::string Profile::chrome_trace(const jit::DeviceProgram& p) const {
  std::string out = "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"estimate\":\"" + json_escape(target) +
                    ", cycle-approximate model, not a measurement\"},\"traceEvents\":[";
  bool first = true;
  auto add = [&](const std::string& event) {
    out += (first ? "\n" : ",\n") + event;
    first = false;
  };
  add(fmt::format("{{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\",\"args\":{{\"name\":\"{} (estimate)\"}}}}",
                  json_escape(kernel)));
  for (size_t q = 0; q < queues.size(); ++q)
    if (queues[q].instructions > 0)
      add(fmt::format("{{\"ph\":\"M\",\"pid\":0,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"{}\"}}}}", q,
                      queues[q].name));
  for (const InstructionTiming& it : instructions) {
    const Instruction& inst = p.kernel.instructions[it.ir_index];
    std::string args = fmt::format("\"instruction\":\"{}\",\"source\":\"{}\"",
                                   json_escape(to_string(p.kernel, inst)), json_escape(source_line(p, it.ir_index)));
    if (it.bytes) args += fmt::format(",\"bytes\":{}", it.bytes);
    if (it.cycles) args += fmt::format(",\"cycles\":{:.0f}", it.cycles);
    add(fmt::format("{{\"ph\":\"X\",\"pid\":0,\"tid\":{},\"name\":\"{}\",\"ts\":{:.4f},\"dur\":{:.4f},\"args\":{{{}}}}}",
                    it.queue, opcode_name(inst.opcode), it.start_ns / 1000.0, (it.end_ns - it.start_ns) / 1000.0,
                    args));
  }
  return out + "\n]}\n";
}

}  // namespace nikki::runtime
