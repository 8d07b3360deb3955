// What memory an instruction reads and writes, and the hazards (read-after-write, write-after-read,
// write-after-write) between instructions in program order. One definition serves the JIT's
// stream scheduler (on allocated kernels, where distinct tensors may share on-chip addresses) and
// the library kernels' trace-time task scheduler (before allocation, where each tensor is its own
// memory), so that both agree on what depends on what.
//
// Footprints are boxes: on-chip views are partitions x bytes, HBM views are rows x bytes of the
// tensor seen as rows of its last dimension (so tiles of one matrix are told apart), registers
// are single cells. Boxes are conservative (a strided view claims its whole bounding box): a
// hazard is never missed, a false one only costs overlap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "nikki/ir.hpp"
#include "nikki/layout.hpp"

namespace nikki::hazards {

/** @brief Where on-chip regions are measured from. */
enum class Placement : uint8_t {
  storage,  // each tensor is its own memory (before allocation)
  address,  // absolute SBUF / PSUM addresses (after allocation: tensors may share bytes)
};

enum class Space : uint8_t { sbuf, psum, hbm, reg };

/** @brief A box of memory touched by one access: partitions (HBM: rows) x bytes. */
struct Region {
  Space space = Space::sbuf;
  uint32_t object = 0;  // HBM: storage id; register: register id; on-chip: storage id or 0 (address)
  int64_t p0 = 0, p1 = 1;
  int64_t b0 = 0, b1 = 1;

  bool overlaps(const Region& o) const {
    return space == o.space && object == o.object && p0 < o.p1 && o.p0 < p1 && b0 < o.b1 && o.b0 < b1;
  }
  bool covers(const Region& o) const {
    return space == o.space && object == o.object && p0 <= o.p0 && o.p1 <= p1 && b0 <= o.b0 && o.b1 <= b1;
  }
};

/** @brief Bytes in one row of an HBM tensor: its last dimension (a 0-D or 1-D tensor is one row). */
inline int64_t hbm_row_bytes(const Storage& s) {
  const int64_t last = s.shape.rank() >= 2 ? s.shape[s.shape.rank() - 1] : s.shape.num_elements();
  return std::max<int64_t>(1, last * dtype_size(s.dtype));
}

/** @brief The origin of an on-chip storage's region: (first partition, first byte). */
inline Region on_chip_origin(const Storage& s, StorageId id, Placement placement) {
  Region r{s.buffer == Buffer::sbuf ? Space::sbuf : Space::psum};
  if (placement == Placement::address) {
    internal_check(s.address.has_value(), "hazards: an on-chip tensor has no address");
    r.p0 = s.address->partition;
    r.b0 = s.address->byte_offset;
  } else {
    r.object = id;
  }
  return r;
}

/** @brief Everything a storage occupies. */
inline Region whole_storage(const Kernel& k, StorageId id, Placement placement) {
  const Storage& s = k.storage(id);
  if (s.on_chip()) {
    Region r = on_chip_origin(s, id, placement);
    r.p1 = r.p0 + s.partitions();
    r.b1 = r.b0 + s.partition_bytes();
    return r;
  }
  const int64_t row = hbm_row_bytes(s);
  return Region{Space::hbm, id, 0, std::max<int64_t>(1, (s.total_bytes() + row - 1) / row), 0, row};
}

/** @brief An HBM view's box in (row, byte-in-row) coordinates: exact for rectangular slices of the
 *  tensor's rows and columns, the full width of the rows it touches otherwise. */
inline Region hbm_region(const Storage& s, const AccessPattern& ap) {
  const int64_t row = hbm_row_bytes(s);
  const int64_t size = dtype_size(ap.dtype);
  const int64_t start = ap.offset * size;
  int64_t rows = 0, bytes = size;
  bool rectangular = true;
  for (int d = 0; d < ap.rank && rectangular; ++d) {
    const int64_t stride = ap.dims[d].stride * size, count = ap.dims[d].count;
    if (count <= 1) continue;
    if (stride >= 0 && stride % row == 0) rows += (count - 1) * (stride / row);
    else if (stride >= 0 && stride < row) bytes += (count - 1) * stride;
    else rectangular = false;
  }
  if (rectangular && start % row + bytes <= row)
    return Region{Space::hbm, ap.storage, start / row, start / row + rows + 1, start % row, start % row + bytes};
  const LinearExtent e = linear_extent(ap);
  return Region{Space::hbm, ap.storage, e.first * size / row, (e.last + 1) * size / row + 1, 0, row};
}

/** @brief The box of an on-chip view whose partition steps are spread over several dims (a DMA
 *  destination that splits the partitions): the partitions and in-row bytes it spans, when every
 *  dim steps either whole rows or inside a row; nullopt otherwise. */
inline std::optional<Region> split_partition_region(const Storage& s, const AccessPattern& ap, Placement placement) {
  const int64_t row = row_elements(s, ap.dtype);
  if (row == 0 || ap.offset < 0) return std::nullopt;
  int64_t last_partition = ap.offset / row, first_free = ap.offset % row, last_free = first_free;
  const int64_t first_partition = last_partition;
  for (int d = 0; d < ap.rank; ++d) {
    const int64_t stride = ap.dims[d].stride, count = ap.dims[d].count;
    if (count <= 1) continue;
    if (stride < 0) return std::nullopt;
    if (stride % row == 0) last_partition += stride / row * (count - 1);
    else last_free += stride * (count - 1);
  }
  if (last_free >= row) return std::nullopt;
  const int64_t size = dtype_size(ap.dtype);
  Region r = on_chip_origin(s, ap.storage, placement);
  r.p1 = r.p0 + last_partition + 1;
  r.p0 += first_partition;
  r.b1 = r.b0 + (last_free + 1) * size;
  r.b0 += first_free * size;
  return r;
}

/** @brief The box a view touches. Views with runtime offsets claim their whole storage. */
inline Region view_region(const Kernel& k, const AccessPattern& ap, Placement placement) {
  const Storage& s = k.storage(ap.storage);
  if (ap.is_dynamic()) return whole_storage(k, ap.storage, placement);
  if (!s.on_chip()) return hbm_region(s, ap);
  const TileGeometry g = tile_geometry(s, ap);
  if (!g.partition_contiguous || !g.rows_in_bounds) {
    if (const std::optional<Region> r = split_partition_region(s, ap, placement)) return *r;
    return whole_storage(k, ap.storage, placement);
  }
  const int64_t size = dtype_size(ap.dtype);
  Region r = on_chip_origin(s, ap.storage, placement);
  r.p0 += g.first_partition;
  r.p1 = r.p0 + g.partitions;
  r.b1 = r.b0 + (g.last_free + 1) * size;
  r.b0 += g.first_free * size;
  return r;
}

/** @brief Read and write footprints of one instruction (or of several, gathered). */
struct Footprints {
  std::vector<Region> reads;
  std::vector<Region> writes;

  void add(const Region& r, Access access) {
    if (access != Access::write) reads.push_back(r);
    if (access != Access::read) writes.push_back(r);
  }
};

/** @brief Adds what `inst` reads and writes to `f`: its operands' views, the tensors and registers
 *  that give a view's runtime offset, and its register operands. The accumulators of the Scalar
 *  and Vector engines carry state between reduce instructions, but they are private to their
 *  engine, whose stream is in order, so they are not memory here. */
inline void add_footprints(const Kernel& k, const Instruction& inst, Placement placement, Footprints& f) {
  for (int s = 0; s < inst.spec().num_slots; ++s) {
    const Operand& o = inst.operands[s];
    if (o.is_tensor()) {
      f.add(view_region(k, k.view(o), placement), inst.access(s));
      if (const Indirection* ind = k.indirection(o)) {
        if (ind->scalar_tensor) f.reads.push_back(view_region(k, *ind->scalar_tensor, placement));
        if (ind->vector_offset) f.reads.push_back(view_region(k, *ind->vector_offset, placement));
        if (ind->scalar_register >= 0) f.reads.push_back(Region{Space::reg, uint32_t(ind->scalar_register)});
      }
    } else if (o.is_reg()) {
      f.add(Region{Space::reg, uint32_t(o.reg())}, inst.access(s));
    }
  }
}

inline Footprints footprints(const Kernel& k, const Instruction& inst, Placement placement) {
  Footprints f;
  add_footprints(k, inst, placement, f);
  return f;
}

/**
 * @brief Finds, for each access added in program order, the earlier accesses it must follow.
 * Records are bucketed by address so each access is compared against nearby ones only, and
 * accesses fully covered by a later write are retired (they are ordered through that write).
 */
class Tracker {
 public:
  /** @brief The earlier ids (sorted, unique) that `id`, with footprints `f`, depends on. */
  std::vector<uint32_t> add(uint32_t id, const Footprints& f) {
    std::vector<uint32_t> deps;
    auto scan = [&](const Region& r, bool writes_only) {
      for_each_bucket(r, [&](uint64_t key) {
        auto it = buckets_.find(key);
        if (it == buckets_.end()) return;
        for (uint32_t rid : it->second) {
          const Record& rec = records_[rid];
          if (rec.live && rec.id != id && (rec.write || !writes_only) && rec.region.overlaps(r)) deps.push_back(rec.id);
        }
      });
    };
    for (const Region& r : f.reads) scan(r, /*writes_only=*/true);
    for (const Region& w : f.writes) scan(w, /*writes_only=*/false);
    for (const Region& r : f.reads) insert(Record{r, id, false});
    for (const Region& w : f.writes) {
      retire_covered(w, id);
      insert(Record{w, id, true});
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    return deps;
  }

  /** @brief Forgets every access (everything before a barrier has completed). */
  void clear() {
    buckets_.clear();
    records_.clear();
  }

 private:
  static constexpr int64_t kOnChipBucketBytes = 1024;
  static constexpr int64_t kHbmBucketRows = 16;
  static constexpr int64_t kHbmBucketBytes = 4096;

  struct Record {
    Region region;
    uint32_t id;
    bool write;
    bool live = true;
  };

  /** Buckets a region falls in. Two cells sharing a key only cost an extra overlap test. */
  template <class F>
  static void for_each_bucket(const Region& r, F&& f) {
    const uint64_t space = uint64_t(r.space) << 60;
    if (r.space == Space::reg) {
      f(space | r.object);
      return;
    }
    if (r.space == Space::hbm) {
      for (int64_t g = r.p0 / kHbmBucketRows; g <= (r.p1 - 1) / kHbmBucketRows; ++g)
        for (int64_t c = r.b0 / kHbmBucketBytes; c <= (r.b1 - 1) / kHbmBucketBytes; ++c)
          f(space | ((uint64_t(r.object) * 0x9e3779b97f4a7c15ull) ^ (uint64_t(g) << 20) ^ uint64_t(c)) >> 4);
      return;
    }
    const uint64_t object = uint64_t(r.object) << 32;
    for (int64_t c = r.b0 / kOnChipBucketBytes; c <= (r.b1 - 1) / kOnChipBucketBytes; ++c)
      f(space | object | uint64_t(c));
  }

  void insert(Record rec) {
    const uint32_t rid = static_cast<uint32_t>(records_.size());
    records_.push_back(rec);
    for_each_bucket(rec.region, [&](uint64_t key) { buckets_[key].push_back(rid); });
  }

  void retire_covered(const Region& w, uint32_t id) {
    for_each_bucket(w, [&](uint64_t key) {
      auto it = buckets_.find(key);
      if (it == buckets_.end()) return;
      auto& ids = it->second;
      ids.erase(std::remove_if(ids.begin(), ids.end(),
                               [&](uint32_t rid) {
                                 Record& rec = records_[rid];
                                 if (rec.id != id && rec.live && w.covers(rec.region)) rec.live = false;
                                 return !rec.live;
                               }),
                ids.end());
    });
  }

  std::unordered_map<uint64_t, std::vector<uint32_t>> buckets_;
  std::vector<Record> records_;
};

}  // namespace nikki::hazards
