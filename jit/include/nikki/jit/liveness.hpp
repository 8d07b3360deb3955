// Live ranges of storages in program order, shared by the allocator and the executors (which fill
// fresh allocations with sentinels when their range begins).
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "nikki/ir.hpp"

namespace nikki::jit {

/** @brief Inclusive range of instruction indices during which a storage holds live data. */
struct LiveRange {
  uint32_t begin = std::numeric_limits<uint32_t>::max();
  uint32_t end = 0;
  bool used() const { return begin <= end; }
  bool overlaps(const LiveRange& o) const { return used() && o.used() && begin <= o.end && o.begin <= end; }
};

/**
 * @brief Calls `f(view, access)` for every view instruction `inst` names: each tensor operand with
 * its slot's access, and the index tensors of runtime offsets (read), however deeply nested.
 */
template <class F>
void for_each_view(const Kernel& k, const Instruction& inst, F&& f) {
  auto visit = [&f](auto&& self, const AccessPattern& ap, Access access) -> void {
    f(ap, access);
    if (const Indirection* ind = ap.indirection.get()) {
      if (ind->scalar_tensor) self(self, *ind->scalar_tensor, Access::read);
      if (ind->vector_offset) self(self, *ind->vector_offset, Access::read);
    }
  };
  for (int slot = 0; slot < kMaxSlots; ++slot)
    if (inst.operands[slot].is_tensor()) visit(visit, k.view(inst.operands[slot]), inst.access(slot));
}

/**
 * @brief Live range of every storage (indexed by StorageId).
 *
 * A storage is live from the first to the last instruction that touches it (as an operand or as
 * an index tensor of a runtime offset). A storage created before a runtime loop and touched inside
 * it stays live for the whole loop, since later iterations see earlier iterations' values.
 */
std::vector<LiveRange> live_ranges(const Kernel& kernel);

/** @brief Whether `inst` overwrites every byte of storage `id` (one write-only operand covering
 * it, contiguously, in the storage's own dtype size) without reading any of it. */
bool overwrites_unread(const Kernel& kernel, const Instruction& inst, StorageId id);

/**
 * @brief The scratch storages to fill with sentinels (NaN / 4) when each instruction begins:
 * `result[i]` lists those whose live range begins at instruction i.
 *
 * A fill nobody can observe is left out: when the first instruction writes every byte of the
 * storage (one write-only operand covering it) and does not read it, the sentinels would be
 * overwritten unseen. PSUM tiles are always filled, since the fill also resets the per-word
 * "written since allocation" state that nc_matmul's automatic accumulation reads.
 */
std::vector<std::vector<StorageId>> sentinel_fills(const Kernel& kernel, const std::vector<LiveRange>& ranges);

/**
 * @brief The elements a static view visits, as intervals [first, last) of element indices (one per
 * run of consecutive elements), appended to `out`; false when they would exceed `budget`
 * intervals in total (`out` is then incomplete).
 */
bool element_intervals(const AccessPattern& ap, std::vector<std::pair<int64_t, int64_t>>& out, size_t budget);

/**
 * @brief The output storages to fill with sentinels when a run starts (the elements a kernel
 * never writes read as NaN / 4).
 *
 * An output is left out when no run can observe its fill: no instruction reads it (nor indexes
 * through it), and DMA writes outside runtime loops, with static offsets, together cover every
 * element. Filling a large output costs a pass over its memory on
 * every call, more than the kernel's own work for simple kernels.
 */
std::vector<StorageId> output_fills(const Kernel& kernel);

}  // namespace nikki::jit
