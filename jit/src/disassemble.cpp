// The device program as a kernel author reads it: one section per queue, each instruction with
// its operands' memory, partitions, addresses and access patterns, its semaphore waits and the
// source line it came from.
#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/streams.hpp"
#include "nikki/layout.hpp"

namespace nikki::jit {

namespace {

std::string describe_view(const Kernel& k, const AccessPattern& ap) {
  const Storage& s = k.storage(ap.storage);
  std::string out = fmt::format("%{} {} {}", s.name, buffer_name(s.buffer), info(ap.dtype).short_name);
  if (s.on_chip()) {
    TileGeometry g = tile_geometry(s, ap);
    const int64_t p0 = s.address->partition + g.first_partition;
    const int64_t byte = s.address->byte_offset + g.first_free * dtype_size(ap.dtype);
    out += fmt::format(" p[{}:{}] @0x{:x}", p0, p0 + g.partitions, byte);
  } else {
    out += fmt::format(" +{}", ap.offset);
  }
  out += fmt::format(" {}", print_detail::pattern(ap.pattern()));
  if (ap.is_dynamic()) out += " (runtime offset)";
  return out;
}

std::string describe_op(const DeviceProgram& p, const StreamOp& op) {
  const Kernel& k = p.kernel;
  const Instruction& inst = k.instructions[op.ir_index];
  std::string line;
  if (op.kind == StreamOp::Kind::barrier) {
    line = fmt::format("barrier ({})", opcode_name(inst.opcode));
  } else {
    line = fmt::format("{}{}", opcode_name(inst.opcode), print_detail::attributes(k, inst));
    const OpcodeSpec& spec = inst.spec();
    for (int s = 0; s < spec.num_slots; ++s) {
      const Operand& o = inst.operands[s];
      if (o.is_none()) continue;
      line += fmt::format("\n        {}={}", spec.slots[s].name,
                          o.is_tensor() ? describe_view(k, k.view(o)) : print_detail::operand(k, o));
    }
  }
  if (!op.waits.empty()) {
    line += "\n        wait";
    for (const SemaphoreWait& w : op.waits)
      line += fmt::format(" {}>={}", queue_name(p.streams[w.queue].queue), w.count);
  }
  const SourceLocation& loc = k.location(inst.loc);
  if (loc.known()) line += fmt::format("\n        at {}:{}", print_detail::basename(loc.file), loc.line);
  return line;
}

}  // namespace

std::string disassemble(const DeviceProgram& p) {
  const Kernel& k = p.kernel;
  size_t used = 0;
  for (const Stream& s : p.streams) used += !s.ops.empty();
  std::string out = fmt::format("device program '{}' for {} ({}): {} instructions on {} queues, {} semaphore waits\n",
                                k.name, k.config().name, k.config().core, k.instructions.size(), used,
                                count_dependency_waits(p));
  for (const Stream& s : p.streams) {
    if (s.ops.empty()) continue;
    out += fmt::format("\n{} ({} ops)\n", queue_name(s.queue), s.ops.size());
    for (size_t i = 0; i < s.ops.size(); ++i) out += fmt::format("  {:4}  {}\n", i, describe_op(p, s.ops[i]));
  }
  return out;
}

}  // namespace nikki::jit
