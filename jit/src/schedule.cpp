// The scheduling pass: program order -> per-queue streams with semaphore waits.
//
// Hazards are found on memory footprints: each operand's bounding box in SBUF/PSUM (partitions x
// bytes, absolute after allocation), its box in an HBM tensor seen as rows of its last dimension
// (rows x bytes, so tiles of one matrix are told apart), or a register. Boxes are conservative (a
// strided view claims its whole bounding box), so a hazard is never missed; a false one only costs
// overlap. Records are bucketed by address so each instruction compares against nearby accesses
// only, and accesses fully covered by a later write are retired.
#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "nikki/jit/liveness.hpp"
#include "nikki/jit/streams.hpp"
#include "nikki/layout.hpp"

namespace nikki::jit {

namespace {

enum class Space : uint8_t { sbuf, psum, hbm, reg };

/** A box of memory touched by one access: partitions (HBM: rows) x bytes. */
struct Region {
  Space space;
  uint32_t object = 0;  // HBM: storage id; register: register id; on-chip: 0
  int64_t p0 = 0, p1 = 1;
  int64_t b0 = 0, b1 = 1;

  bool overlaps(const Region& o) const {
    return space == o.space && object == o.object && p0 < o.p1 && o.p0 < p1 && b0 < o.b1 && o.b0 < b1;
  }
  bool covers(const Region& o) const {
    return space == o.space && object == o.object && p0 <= o.p0 && o.p1 <= p1 && b0 <= o.b0 && o.b1 <= b1;
  }
};

constexpr int64_t kOnChipBucketBytes = 1024;
constexpr int64_t kHbmBucketRows = 16;
constexpr int64_t kHbmBucketBytes = 4096;

/** Bytes in one row of an HBM tensor: its last dimension (a 0-D or 1-D tensor is one row). */
int64_t hbm_row_bytes(const Storage& s) {
  const int64_t last = s.shape.rank() >= 2 ? s.shape[s.shape.rank() - 1] : s.shape.num_elements();
  return std::max<int64_t>(1, last * dtype_size(s.dtype));
}

Region whole_storage(const Storage& s, StorageId id) {
  if (s.on_chip()) {
    Region r{s.buffer == Buffer::sbuf ? Space::sbuf : Space::psum};
    r.p0 = s.address->partition;
    r.p1 = r.p0 + s.partitions();
    r.b0 = s.address->byte_offset;
    r.b1 = r.b0 + s.partition_bytes();
    return r;
  }
  const int64_t row = hbm_row_bytes(s);
  return Region{Space::hbm, id, 0, std::max<int64_t>(1, (s.total_bytes() + row - 1) / row), 0, row};
}

/** An HBM view's box in (row, byte-in-row) coordinates: exact for rectangular slices of the
 * tensor's rows and columns, the full width of the rows it touches otherwise. */
Region hbm_footprint(const Storage& s, const AccessPattern& ap) {
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
  LinearExtent e = linear_extent(ap);
  return Region{Space::hbm, ap.storage, e.first * size / row, (e.last + 1) * size / row + 1, 0, row};
}

Region footprint(const Kernel& k, const AccessPattern& ap) {
  const Storage& s = k.storage(ap.storage);
  if (ap.is_dynamic()) return whole_storage(s, ap.storage);
  const int64_t size = dtype_size(ap.dtype);
  if (!s.on_chip()) return hbm_footprint(s, ap);
  TileGeometry g = tile_geometry(s, ap);
  if (!g.partition_contiguous || !g.rows_in_bounds) return whole_storage(s, ap.storage);
  Region r{s.buffer == Buffer::sbuf ? Space::sbuf : Space::psum};
  r.p0 = s.address->partition + g.first_partition;
  r.p1 = r.p0 + g.partitions;
  r.b0 = s.address->byte_offset + g.first_free * size;
  r.b1 = s.address->byte_offset + (g.last_free + 1) * size;
  return r;
}

/** Read and write footprints of one instruction. */
struct Footprints {
  std::vector<Region> reads;
  std::vector<Region> writes;
};

void add_view(const Kernel& k, const AccessPattern& ap, Access access, Footprints& f) {
  Region r = footprint(k, ap);
  if (access != Access::write) f.reads.push_back(r);
  if (access != Access::read) f.writes.push_back(r);
  if (const Indirection* ind = ap.indirection.get()) {
    if (ind->scalar_tensor) f.reads.push_back(footprint(k, *ind->scalar_tensor));
    if (ind->vector_offset) f.reads.push_back(footprint(k, *ind->vector_offset));
    if (ind->scalar_register >= 0) f.reads.push_back(Region{Space::reg, uint32_t(ind->scalar_register)});
  }
}

Footprints footprints(const Kernel& k, const Instruction& inst) {
  Footprints f;
  for (int s = 0; s < inst.spec().num_slots; ++s) {
    const Operand& o = inst.operands[s];
    if (o.is_tensor()) add_view(k, o.ap, inst.access(s), f);
    if (o.is_reg()) {
      Region r{Space::reg, uint32_t(o.reg)};
      if (inst.access(s) != Access::write) f.reads.push_back(r);
      if (inst.access(s) != Access::read) f.writes.push_back(r);
    }
  }
  // The accumulators of the Scalar / Vector engines carry state between reduce instructions;
  // they are private to their engine, whose stream is in order, so they need no semaphores.
  return f;
}

/** Buckets that a region falls in (an address index for hazard lookups). */
template <class F>
void for_each_bucket(const Region& r, F&& f) {
  const uint64_t space = uint64_t(r.space) << 60;
  if (r.space == Space::reg) {
    f(space | r.object);
    return;
  }
  if (r.space == Space::hbm) {
    // Keys mix tensor, row group and byte group; two cells sharing a key only cost an extra
    // overlap test, never a missed hazard.
    for (int64_t g = r.p0 / kHbmBucketRows; g <= (r.p1 - 1) / kHbmBucketRows; ++g)
      for (int64_t c = r.b0 / kHbmBucketBytes; c <= (r.b1 - 1) / kHbmBucketBytes; ++c)
        f(space | ((uint64_t(r.object) * 0x9e3779b97f4a7c15ull) ^ (uint64_t(g) << 20) ^ uint64_t(c)) >> 4);
    return;
  }
  const uint64_t object = uint64_t(r.object) << 32;
  for (int64_t c = r.b0 / kOnChipBucketBytes; c <= (r.b1 - 1) / kOnChipBucketBytes; ++c)
    f(space | object | uint64_t(c));
}

struct Record {
  Region region;
  uint32_t inst;
  bool write;
  bool live = true;
};

/** Finds the earlier instructions each instruction depends on. */
class HazardTracker {
 public:
  std::vector<uint32_t> add(uint32_t inst, const Footprints& f) {
    std::vector<uint32_t> deps;
    auto scan = [&](const Region& r, bool writes_only) {
      for_each_bucket(r, [&](uint64_t key) {
        auto it = buckets_.find(key);
        if (it == buckets_.end()) return;
        for (uint32_t id : it->second) {
          const Record& rec = records_[id];
          if (rec.live && rec.inst != inst && (rec.write || !writes_only) && rec.region.overlaps(r))
            deps.push_back(rec.inst);
        }
      });
    };
    for (const Region& r : f.reads) scan(r, /*writes_only=*/true);
    for (const Region& w : f.writes) scan(w, /*writes_only=*/false);
    for (const Region& r : f.reads) insert(Record{r, inst, false});
    for (const Region& w : f.writes) {
      retire_covered(w, inst);
      insert(Record{w, inst, true});
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    return deps;
  }

  void clear() {
    buckets_.clear();
    records_.clear();
  }

 private:
  void insert(Record rec) {
    const uint32_t id = static_cast<uint32_t>(records_.size());
    records_.push_back(rec);
    for_each_bucket(rec.region, [&](uint64_t key) { buckets_[key].push_back(id); });
  }
  /** Accesses a write fully covers are ordered through the write; later hazards need only it. */
  void retire_covered(const Region& w, uint32_t inst) {
    for_each_bucket(w, [&](uint64_t key) {
      auto it = buckets_.find(key);
      if (it == buckets_.end()) return;
      auto& ids = it->second;
      ids.erase(std::remove_if(ids.begin(), ids.end(),
                               [&](uint32_t id) {
                                 Record& rec = records_[id];
                                 if (rec.inst != inst && rec.live && w.covers(rec.region)) rec.live = false;
                                 return !rec.live;
                               }),
                ids.end());
    });
  }

  std::unordered_map<uint64_t, std::vector<uint32_t>> buckets_;
  std::vector<Record> records_;
};

constexpr int kComputeQueues = 5;  // tensor, vector, scalar, gpsimd, sync

int compute_queue(Engine e) {
  switch (e) {
    case Engine::tensor: return 0;
    case Engine::vector: return 1;
    case Engine::scalar: return 2;
    case Engine::gpsimd: return 3;
    default: return 4;  // sync: control instructions and anything without an engine
  }
}

}  // namespace

std::string queue_name(QueueId q) {
  switch (q.kind) {
    case QueueKind::tensor: return "qTensor";
    case QueueKind::vector: return "qVector";
    case QueueKind::scalar: return "qScalar";
    case QueueKind::gpsimd: return "qGpSimd";
    case QueueKind::sync: return "qSync";
    case QueueKind::dma: return fmt::format("qDMA{}", q.index);
  }
  return "q?";
}

DeviceProgram schedule(Kernel kernel, const ScheduleOptions& options) {
  internal_check(kernel.allocated, "schedule needs an allocated kernel");
  DeviceProgram program;
  const uint32_t dma_queues = kernel.config().dma_queues;
  const int num_queues = kComputeQueues + static_cast<int>(dma_queues);
  program.streams.resize(num_queues);
  const QueueKind kinds[kComputeQueues] = {QueueKind::tensor, QueueKind::vector, QueueKind::scalar, QueueKind::gpsimd,
                                           QueueKind::sync};
  for (int q = 0; q < kComputeQueues; ++q) program.streams[q].queue = {kinds[q], 0};
  for (uint32_t d = 0; d < dma_queues; ++d) program.streams[kComputeQueues + d].queue = {QueueKind::dma, uint16_t(d)};

  const auto& insts = kernel.instructions;
  program.placement.assign(insts.size(), {0, 0});
  using Clock = std::vector<uint32_t>;
  std::vector<Clock> queue_clock(num_queues, Clock(num_queues, 0));  // what each queue knows has completed
  std::vector<uint32_t> count(num_queues, 0);                        // ops issued since the last barrier
  std::vector<Clock> done_clock(insts.size());                       // knowledge when an instruction completes
  std::vector<uint32_t> position_in_epoch(insts.size(), 0);
  HazardTracker hazards;
  uint32_t next_dma = 0;
  // A scratch tensor's first instruction also fills the whole tensor with sentinels (NaN / 4),
  // a write to every byte of it, not just to the part the instruction names.
  const std::vector<std::vector<StorageId>> fills = sentinel_fills(kernel, live_ranges(kernel));
  int64_t wait_edges = 0;

  for (uint32_t i = 0; i < insts.size(); ++i) {
    const Instruction& inst = insts[i];
    if (inst.opcode == Opcode::loop_begin || inst.opcode == Opcode::loop_end) {
      for (int q = 0; q < num_queues; ++q) {
        program.streams[q].ops.push_back(StreamOp{StreamOp::Kind::barrier, i, {}});
        std::fill(queue_clock[q].begin(), queue_clock[q].end(), 0);
      }
      std::fill(count.begin(), count.end(), 0);
      hazards.clear();  // everything before a barrier has completed
      continue;
    }
    const int q = inst.engine == Engine::dma ? kComputeQueues + int(next_dma++ % dma_queues) : compute_queue(inst.engine);
    Footprints f = footprints(kernel, inst);
    for (StorageId id : fills[i]) f.writes.push_back(whole_storage(kernel.storage(id), id));
    std::vector<uint32_t> deps = hazards.add(i, f);

    // Waits: the latest dependency first, since its completion implies the most.
    StreamOp op{StreamOp::Kind::instruction, i, {}};
    Clock& clock = queue_clock[q];
    for (auto it = deps.rbegin(); it != deps.rend(); ++it) {
      const uint32_t j = *it;
      const int qj = static_cast<int>(program.placement[j].first);
      const uint32_t need = position_in_epoch[j] + 1;
      if (qj == q || clock[qj] >= need) continue;
      if (wait_edges++ == options.drop_dependency) continue;
      op.waits.push_back(SemaphoreWait{uint16_t(qj), need});
      for (int x = 0; x < num_queues; ++x) clock[x] = std::max(clock[x], done_clock[j][x]);
    }
    position_in_epoch[i] = count[q]++;
    clock[q] = count[q];
    done_clock[i] = clock;
    program.placement[i] = {uint32_t(q), uint32_t(program.streams[q].ops.size())};
    program.streams[q].ops.push_back(std::move(op));
  }
  program.kernel = std::move(kernel);
  return program;
}

int64_t count_dependency_waits(const DeviceProgram& program) {
  int64_t n = 0;
  for (const Stream& s : program.streams)
    for (const StreamOp& op : s.ops) n += static_cast<int64_t>(op.waits.size());
  return n;
}

}  // namespace nikki::jit
