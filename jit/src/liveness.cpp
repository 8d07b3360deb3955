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

namespace {

bool covers_storage(const Storage& s, const AccessPattern& ap) {
  return !ap.indirection && ap.offset == 0 && dtype_size(ap.dtype) == dtype_size(s.dtype) &&
         ap.num_elements() == s.shape.num_elements() && is_contiguous(ap);
}

/** Whether instruction `inst` overwrites all of storage `id` without reading any of it. */
bool overwrites_unread(const Kernel& kernel, const Instruction& inst, StorageId id) {
  bool covered = false;
  for (int slot = 0; slot < inst.spec().num_slots; ++slot) {
    const Operand& o = inst.operands[slot];
    if (!o.is_tensor()) continue;
    if (const Indirection* ind = o.ap.indirection.get()) {
      if ((ind->scalar_tensor && ind->scalar_tensor->storage == id) ||
          (ind->vector_offset && ind->vector_offset->storage == id))
        return false;
    }
    if (o.ap.storage != id) continue;
    if (inst.access(slot) != Access::write) return false;
    covered = covered || covers_storage(kernel.storage(id), o.ap);
  }
  return covered;
}

}  // namespace

std::vector<std::vector<StorageId>> sentinel_fills(const Kernel& kernel, const std::vector<LiveRange>& ranges) {
  std::vector<std::vector<StorageId>> fills(kernel.instructions.size());
  for (StorageId id = 0; id < kernel.storages.size(); ++id) {
    const Storage& s = kernel.storages[id];
    if (s.role != StorageRole::scratch || !ranges[id].used()) continue;
    const Instruction& first = kernel.instructions[ranges[id].begin];
    if (s.buffer != Buffer::psum && overwrites_unread(kernel, first, id)) continue;
    fills[ranges[id].begin].push_back(id);
  }
  return fills;
}

}  // namespace nikki::jit
