#include "nikki/jit/liveness.hpp"

#include <algorithm>
#include <utility>

namespace nikki::jit {

std::vector<LiveRange> live_ranges(const Kernel& kernel) {
  std::vector<LiveRange> ranges(kernel.storages.size());
  const auto& insts = kernel.instructions;
  for (uint32_t i = 0; i < insts.size(); ++i)
    for_each_view(kernel, insts[i], [&](const AccessPattern& ap, Access) {
      LiveRange& r = ranges[ap.storage];
      r.begin = std::min(r.begin, i);
      r.end = std::max(r.end, i);
    });

  // Extend ranges over runtime loops; repeat until stable so nested loops compose.
  bool changed = true;
  while (changed) {
    changed = false;
    for (uint32_t b = 0; b < insts.size(); ++b) {
      if (insts[b].opcode != Opcode::loop_begin) continue;
      const uint32_t e = static_cast<uint32_t>(kernel.rare(insts[b]).jump);
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

}  // namespace

bool overwrites_unread(const Kernel& kernel, const Instruction& inst, StorageId id) {
  bool covered = false, read = false;
  for_each_view(kernel, inst, [&](const AccessPattern& ap, Access access) {
    if (ap.storage != id) return;
    if (access == Access::write) covered = covered || covers_storage(kernel.storage(id), ap);
    else read = true;  // also as the index tensor of a runtime offset
  });
  return covered && !read;
}

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

bool element_intervals(const AccessPattern& ap, std::vector<std::pair<int64_t, int64_t>>& out, size_t budget) {
  // The innermost dims that are contiguous together form one run of `run` elements.
  int inner = ap.rank;
  int64_t run = 1;
  while (inner > 0 && (ap.dims[inner - 1].count == 1 || ap.dims[inner - 1].stride == run)) {
    run *= ap.dims[inner - 1].count;
    --inner;
  }
  int64_t runs = 1;
  for (int d = 0; d < inner; ++d) runs *= ap.dims[d].count;
  if (run == 0 || runs == 0) return true;
  if (out.size() + size_t(runs) > budget) return false;
  std::array<int64_t, kMaxRank> index{};
  for (int64_t r = 0; r < runs; ++r) {
    int64_t first = ap.offset;
    for (int d = 0; d < inner; ++d) first += ap.dims[d].stride * index[d];
    out.emplace_back(first, first + run);
    for (int d = inner - 1; d >= 0; --d) {
      if (++index[d] < ap.dims[d].count) break;
      index[d] = 0;
    }
  }
  return true;
}

namespace {

bool indexes_through(const AccessPattern& ap, StorageId id) {
  const Indirection* ind = ap.indirection.get();
  return ind && ((ind->scalar_tensor && ind->scalar_tensor->storage == id) ||
                 (ind->vector_offset && ind->vector_offset->storage == id));
}

}  // namespace

std::vector<StorageId> output_fills(const Kernel& kernel) {
  // Intervals per output with a chance of being skipped; an output drops out (filled) as soon as
  // something observes its initial contents or its intervals outgrow the budget.
  constexpr size_t kBudget = size_t(1) << 22;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> written(kernel.storages.size());
  std::vector<bool> candidate(kernel.storages.size(), false);
  for (StorageId id : kernel.outputs) candidate[id] = kernel.storages[id].role == StorageRole::output;
  int loop_depth = 0;
  for (const Instruction& inst : kernel.instructions) {
    if (inst.opcode == Opcode::loop_begin) ++loop_depth;
    if (inst.opcode == Opcode::loop_end) --loop_depth;
    for (int slot = 0; slot < inst.spec().num_slots; ++slot) {
      const Operand& o = inst.operands[slot];
      if (!o.is_tensor()) continue;
      const AccessPattern ap = kernel.view(o);
      for (StorageId id : kernel.outputs)
        if (indexes_through(ap, id)) candidate[id] = false;
      const StorageId id = ap.storage;
      if (!candidate[id]) continue;
      if (inst.access(slot) != Access::write) {
        candidate[id] = false;  // reads what the fill would have put there
        continue;
      }
      // Only DMA writes count (they write every element of their view), and not those that may
      // not happen (in a runtime loop) or not where the view says (runtime offsets).
      if (inst.engine != Engine::dma || loop_depth > 0 || ap.indirection ||
          dtype_size(ap.dtype) != dtype_size(kernel.storages[id].dtype))
        continue;
      if (!element_intervals(ap, written[id], kBudget)) candidate[id] = false;
    }
  }
  std::vector<StorageId> fills;
  for (StorageId id : kernel.outputs) {
    if (std::find(fills.begin(), fills.end(), id) != fills.end()) continue;
    bool covered = candidate[id];
    if (covered) {
      std::vector<std::pair<int64_t, int64_t>>& w = written[id];
      std::sort(w.begin(), w.end());
      int64_t reached = 0;  // every element below is written
      for (const auto& [first, last] : w) {
        if (first > reached) break;
        reached = std::max(reached, last);
      }
      covered = reached >= kernel.storages[id].shape.num_elements();
    }
    if (!covered && kernel.storages[id].role == StorageRole::output) fills.push_back(id);
  }
  return fills;
}

}  // namespace nikki::jit
