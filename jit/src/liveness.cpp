#include "nikki/jit/liveness.hpp"

#include <algorithm>

namespace nikki::jit {

namespace {

void touch(std::vector<LiveRange>& ranges, const AccessPattern& ap, uint32_t at) {
  LiveRange& r = ranges[ap.storage];
  r.begin = std::min(r.begin, at);
  r.end = std::max(r.end, at);
  if (const Indirection* ind = ap.indirection.get()) {
    if (ind->scalar_tensor) touch(ranges, *ind->scalar_tensor, at);
    if (ind->vector_offset) touch(ranges, *ind->vector_offset, at);
  }
}

}  // namespace

std::vector<LiveRange> live_ranges(const Kernel& kernel) {
  std::vector<LiveRange> ranges(kernel.storages.size());
  const auto& insts = kernel.instructions;
  for (uint32_t i = 0; i < insts.size(); ++i)
    for (const Operand& o : insts[i].operands)
      if (o.is_tensor()) touch(ranges, o.ap, i);

  // Extend ranges over runtime loops; repeat until stable so nested loops compose.
  bool changed = true;
  while (changed) {
    changed = false;
    for (uint32_t b = 0; b < insts.size(); ++b) {
      if (insts[b].opcode != Opcode::loop_begin) continue;
      const uint32_t e = static_cast<uint32_t>(insts[b].attrs.jump);
      for (StorageId s = 0; s < ranges.size(); ++s) {
        LiveRange& r = ranges[s];
        if (!r.used() || kernel.storages[s].defined_at > b) continue;
        if (r.end < b || r.begin > e) continue;
        if (r.begin > b || r.end < e) {
          r.begin = std::min(r.begin, b);
          r.end = std::max(r.end, e);
          changed = true;
        }
      }
    }
  }
  return ranges;
}

}  // namespace nikki::jit
