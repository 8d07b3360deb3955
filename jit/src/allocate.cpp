#include "nikki/jit/allocate.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/liveness.hpp"

namespace nikki::jit {

namespace {

constexpr int64_t kSbufAlignment = 4;

// Buffers per allocation site: double buffering, the default factor of NKI's multi_buffer
// allocation control (nki.compiler.multi_buffer(factor=2), Beta-1 API).
constexpr size_t kMultiBuffer = 2;

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }


/** A placed tensor: partitions [p0, p1) x bytes [b0, b1) during a live range. */
struct Box {
  StorageId id;
  int64_t p0, p1, b0, b1;
  LiveRange live;
  bool conflicts(const Box& o) const {
    return live.overlaps(o.live) && p0 < o.p1 && o.p0 < p1 && b0 < o.b1 && o.b0 < b1;
  }
};

class Allocator {
 public:
  Allocator(Kernel& k, Buffer buffer)
      : k_(k), t_(k.config()), buffer_(buffer), ranges_(live_ranges(k)),
        capacity_(buffer == Buffer::sbuf ? t_.sbuf_bytes_per_partition : t_.psum_bytes_per_partition()),
        granule_(buffer == Buffer::sbuf ? kSbufAlignment : t_.psum_bank_bytes) {}

  void run() {
    std::vector<StorageId> automatic;
    for (StorageId id = 0; id < k_.storages.size(); ++id) {
      Storage& s = k_.storages[id];
      if (s.buffer != buffer_) continue;
      if (s.user_address) place_manual(id);
      else if (ranges_[id].used()) automatic.push_back(id);
      else s.address = Address{0, 0};  // never touched: any address will do
    }
    std::stable_sort(automatic.begin(), automatic.end(), [&](StorageId a, StorageId b) {
      if (ranges_[a].begin != ranges_[b].begin) return ranges_[a].begin < ranges_[b].begin;
      return k_.storages[a].partition_bytes() > k_.storages[b].partition_bytes();
    });
    for (StorageId id : automatic) place_automatic(id);
  }

 private:
  int64_t footprint(const Storage& s) const { return align_up(s.partition_bytes(), granule_); }

  void place_manual(StorageId id) {
    const Storage& s = k_.storages[id];
    Box box{id, s.address->partition, s.address->partition + s.partitions(), s.address->byte_offset,
            s.address->byte_offset + s.partition_bytes(), ranges_[id]};
    for (const Box& other : manual_)
      if (box.conflicts(other)) {
        const Storage& o = k_.storages[other.id];
        throw KernelError(fmt::format("tensor '{}' at address ({}, {}) overlaps tensor '{}' while both are live",
                                      s.name, s.address->partition, s.address->byte_offset, o.name),
                          k_.location(s.loc), "ndarray",
                          fmt::format("'{}' occupies partitions [{}, {}) bytes [{}, {}) (created at {})", o.name,
                                      other.p0, other.p1, other.b0, other.b1, k_.location(o.loc).str()),
                          "move one of the tensors, or let nikki place it (omit address=)");
      }
    manual_.push_back(box);
  }

  void place_automatic(StorageId id) {
    Storage& s = k_.storages[id];
    const int64_t size = footprint(s);
    Box box{id, 0, s.partitions(), 0, size, ranges_[id]};
    // Storages arrive in order of their first use, so boxes that died before this one's first
    // use never block again.
    std::erase_if(active_, [&](const Box& b) { return b.live.end < box.live.begin; });
    std::vector<const Box*> blockers;
    for (const std::vector<Box>* boxes : {&active_, &manual_})
      for (const Box& b : *boxes)
        if (b.live.overlaps(box.live) && b.p0 < box.p1 && box.p0 < b.p1) blockers.push_back(&b);
    std::sort(blockers.begin(), blockers.end(), [](const Box* a, const Box* b) { return a->b0 < b->b0; });
    // Each allocation site (source line and size) cycles through kMultiBuffer buffers, as a
    // compiler multi-buffers a tile declared in a loop: iteration i + kMultiBuffer reuses
    // iteration i's buffer, so at most that many iterations are in flight.
    std::deque<int64_t>& ring = sites_[{s.loc, size}];
    int64_t offset = capacity_;
    if (ring.size() >= kMultiBuffer && fit(blockers, ring.front(), size) == ring.front()) offset = ring.front();
    // Otherwise next fit: continue after the previous placement and wrap around, so consecutive
    // tiles take different addresses (their engines and DMAs overlap instead of waiting on each
    // other), while a full memory still packs first-fit.
    if (offset + size > capacity_) offset = fit(blockers, align_up(cursor_, granule_), size);
    if (offset + size > capacity_) offset = fit(blockers, 0, size);
    if (offset + size > capacity_) report_overflow(id, blockers);
    if (ring.size() >= kMultiBuffer) ring.pop_front();
    ring.push_back(offset);
    box.b0 = offset;
    box.b1 = offset + size;
    cursor_ = box.b1 >= capacity_ ? 0 : box.b1;
    s.address = Address{0, static_cast<uint32_t>(offset)};
    active_.push_back(box);
  }

  /** The lowest offset >= start where `size` bytes fit between the blockers (sorted by offset). */
  int64_t fit(const std::vector<const Box*>& blockers, int64_t start, int64_t size) const {
    int64_t offset = start;
    for (const Box* b : blockers) {
      if (b->b1 <= offset) continue;
      if (b->b0 >= offset + size) break;
      offset = align_up(b->b1, granule_);
    }
    return offset;
  }


  /** Storages of this buffer live at instruction `at`. */
  std::vector<StorageId> live_at(uint32_t at) const {
    std::vector<StorageId> live;
    for (StorageId id = 0; id < k_.storages.size(); ++id)
      if (k_.storages[id].buffer == buffer_ && ranges_[id].used() && ranges_[id].begin <= at && at <= ranges_[id].end)
        live.push_back(id);
    return live;
  }
  int64_t total_footprint(const std::vector<StorageId>& ids) const {
    int64_t total = 0;
    for (StorageId id : ids) total += footprint(k_.storages[id]);
    return total;
  }

  /**
   * Reports that `failing` does not fit: either the tensors live at some point of its live range
   * need more than the capacity (reported where usage first exceeds it, with the peak when usage
   * grows further), or the free space is split into gaps that are each too small (fragmentation).
   */
  [[noreturn]] void report_overflow(StorageId failing, const std::vector<const Box*>& blockers) const {
    const LiveRange& range = ranges_[failing];
    // Usage per partition at each instruction of the failing tensor's live range (difference array).
    std::vector<int64_t> delta(range.end - range.begin + 2, 0);
    for (StorageId id = 0; id < k_.storages.size(); ++id) {
      const LiveRange& r = ranges_[id];
      if (k_.storages[id].buffer != buffer_ || !r.overlaps(range)) continue;
      delta[std::max(r.begin, range.begin) - range.begin] += footprint(k_.storages[id]);
      delta[std::min(r.end, range.end) - range.begin + 1] -= footprint(k_.storages[id]);
    }
    uint32_t peak_at = range.begin, first_over = range.end + 1;
    int64_t peak = -1, usage = 0;
    for (uint32_t i = range.begin; i <= range.end; ++i) {
      usage += delta[i - range.begin];
      if (usage > capacity_ && first_over > range.end) first_over = i;
      if (usage > peak) {
        peak = usage;
        peak_at = i;
      }
    }
    const bool over = peak > capacity_;
    const uint32_t at = over ? first_over : range.begin;
    std::vector<StorageId> live = live_at(at);
    std::stable_sort(live.begin(), live.end(), [&](StorageId a, StorageId b) {
      return footprint(k_.storages[a]) > footprint(k_.storages[b]);
    });
    std::string largest;
    for (size_t i = 0; i < live.size() && i < 5; ++i) {
      const Storage& s = k_.storages[live[i]];
      largest += fmt::format("\n    '{}' {}{} {} per partition (created at {})", s.name, info(s.dtype).short_name,
                             s.shape.str(), bytes_text(footprint(s)), k_.location(s.loc).str());
    }
    if (live.size() > 5) largest += fmt::format("\n    ... and {} more", live.size() - 5);
    const std::string mem = buffer_ == Buffer::sbuf ? "SBUF" : "PSUM";
    const std::string unit = buffer_ == Buffer::sbuf
                                 ? ""
                                 : fmt::format(" ({} banks of {})", t_.psum_num_banks, bytes_text(t_.psum_bank_bytes));
    const Instruction& inst = k_.instructions[at];
    std::string what;
    if (over) {
      what = fmt::format("{} capacity exceeded: {} live tensors need {} per partition, {} has {}{}", mem, live.size(),
                         bytes_text(total_footprint(live)), t_.name, bytes_text(capacity_), unit);
      if (peak_at != at)
        what += fmt::format("; usage peaks at {} per partition ({} live tensors) at {}", bytes_text(peak),
                            live_at(peak_at).size(), k_.location(k_.instructions[peak_at].loc).str());
    } else {
      // Largest hole between the tensors that stay live alongside the failing one.
      int64_t gap = 0, end = 0;
      for (const Box* b : blockers) {
        gap = std::max(gap, b->b0 - end);
        end = std::max(end, b->b1);
      }
      gap = std::max(gap, capacity_ - end);
      what = fmt::format("{} is too fragmented to place '{}' ({}): {} of {} per partition are live, but the largest "
                         "free gap is {}",
                         mem, k_.storages[failing].name, bytes_text(footprint(k_.storages[failing])),
                         bytes_text(total_footprint(live)), bytes_text(capacity_), bytes_text(gap));
    }
    throw KernelError(what + "\n  largest live tensors:" + largest, k_.location(inst.loc), to_string(k_, inst),
                      fmt::format("{} per partition on {} ({})", bytes_text(capacity_), t_.name, t_.core),
                      !over ? std::string("split the large tile into smaller ones, or shorten the live ranges of "
                                          "the tensors placed around it (tensors are placed in order of first use)")
                      : buffer_ == Buffer::sbuf
                          ? std::string("use smaller tiles, or end the live range of large tensors earlier (reuse "
                                        "buffers)")
                          : fmt::format("accumulate into fewer PSUM tiles at once (each tile takes whole {} banks); "
                                        "copy results out of PSUM sooner",
                                        bytes_text(t_.psum_bank_bytes)));
  }

  Kernel& k_;
  const TargetConfig& t_;
  Buffer buffer_;
  std::vector<LiveRange> ranges_;
  int64_t capacity_;
  int64_t granule_;
  std::vector<Box> manual_;  // user-placed tensors (address=)
  std::vector<Box> active_;  // automatically placed tensors that may still be live
  int64_t cursor_ = 0;       // next-fit position
  std::map<std::pair<LocId, int64_t>, std::deque<int64_t>> sites_;  // recent offsets per allocation site
};

}  // namespace

void allocate(Kernel& kernel) {
  Allocator(kernel, Buffer::sbuf).run();
  Allocator(kernel, Buffer::psum).run();
  kernel.allocated = true;
}

}  // namespace nikki::jit
