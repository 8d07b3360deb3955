#include "machine.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/liveness.hpp"

namespace nikki::runtime {

Machine::Machine(const Kernel& kernel)
    : kernel_(kernel),
      config_(kernel.config()),
      sbuf_row_(partition_pitch(config_, Buffer::sbuf)),
      psum_row_(partition_pitch(config_, Buffer::psum)),
      hbm_(kernel.storages.size(), nullptr),
      scalar_acc_(config_.num_partitions, 0.0f),
      vector_acc_(config_.num_partitions, 0.0f),
      fills_(jit::sentinel_fills(kernel, jit::live_ranges(kernel))),
      output_fills_(jit::output_fills(kernel)),
      id_(next_id()) {
  constexpr int64_t kScratchAlign = 64;
  for (StorageId storage = 0; storage < kernel.storages.size(); ++storage) {
    const Storage& s = kernel.storages[storage];
    if (s.on_chip() && s.address) {
      const bool in_sbuf = s.buffer == Buffer::sbuf;
      int64_t& rows = in_sbuf ? sbuf_rows_used_ : psum_rows_used_;
      int64_t& row_bytes = in_sbuf ? sbuf_row_bytes_used_ : psum_row_bytes_used_;
      rows = std::max(rows, s.address->partition + s.partitions());
      row_bytes = std::max(row_bytes, s.address->byte_offset + s.partition_bytes());
    }
    if (s.role != StorageRole::scratch || !is_hbm(s.buffer)) continue;
    scratch_hbm_.emplace_back(storage, scratch_hbm_bytes_);
    scratch_hbm_bytes_ += (s.total_bytes() + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  }
  sbuf_rows_used_ = std::min<int64_t>(sbuf_rows_used_, config_.num_partitions);
  psum_rows_used_ = std::min<int64_t>(psum_rows_used_, config_.num_partitions);
  sbuf_row_bytes_used_ = std::min(sbuf_row_bytes_used_, sbuf_row_);
  psum_row_bytes_used_ = std::min(psum_row_bytes_used_, psum_row_);
  scratch_hbm_used_.assign(kernel.storages.size(), ByteRange{0, 0});
  mark_scratch_hbm_used();
}

uint64_t Machine::next_id() {
  static std::atomic<uint64_t> counter{1};
  return counter++;
}

size_t Machine::resident_bytes() const {
  size_t bytes = sizeof(*this) + hbm_.capacity() * sizeof(uint8_t*) +
                 scratch_hbm_.capacity() * sizeof(scratch_hbm_[0]) +
                 (scalar_acc_.capacity() + vector_acc_.capacity()) * sizeof(float) +
                 regs_.capacity() * sizeof(int64_t) + output_fills_.capacity() * sizeof(StorageId);
  for (const std::vector<StorageId>& f : fills_) bytes += sizeof(f) + f.capacity() * sizeof(StorageId);
  return bytes;
}

// --- runs -------------------------------------------------------------------------------------

Machine::Run::Run(Machine& m)
    : machine_(m),
      memory_(size_t(m.config_.num_partitions) * m.sbuf_row_, size_t(m.config_.num_partitions) * m.psum_row_),
      scratch_(size_t(m.scratch_hbm_bytes_)) {
  m.sbuf_ = memory_->sbuf.get();
  m.psum_ = memory_->psum.get();
  m.psum_written_ = memory_->psum_written.get();
  m.native_scratch_ = memory_->native_scratch.get();
  for (auto [id, offset] : m.scratch_hbm_) m.hbm_[id] = scratch_.data() + offset;
  if (memory_->last_user != m.id_) {
    // As if this machine owned the memory: zeros where its tensors live, whatever the
    // previous user (another kernel) left there.
    for (int64_t p = 0; p < m.sbuf_rows_used_; ++p) std::memset(m.sbuf_ + p * m.sbuf_row_, 0, m.sbuf_row_bytes_used_);
    for (int64_t p = 0; p < m.psum_rows_used_; ++p) {
      std::memset(m.psum_ + p * m.psum_row_, 0, m.psum_row_bytes_used_);
      std::memset(m.psum_written_ + p * m.psum_row_ / 4, 0, (m.psum_row_bytes_used_ + 3) / 4);
    }
    memory_->last_user = m.id_;
  }
}

Machine::Run::~Run() {
  machine_.sbuf_ = machine_.psum_ = machine_.psum_written_ = nullptr;
  machine_.native_scratch_ = nullptr;
  for (auto [id, offset] : machine_.scratch_hbm_) machine_.hbm_[id] = nullptr;
}

std::unique_ptr<Machine::Run> Machine::bind(std::span<void* const> inputs, std::span<void* const> outputs,
                                            bool fill_outputs) {
  const Kernel& k = kernel_;
  if (inputs.size() != k.inputs.size() || outputs.size() != k.outputs.size())
    throw KernelError(fmt::format("kernel '{}' takes {} inputs and {} outputs, got {} and {}", k.name,
                                  k.inputs.size(), k.outputs.size(), inputs.size(), outputs.size()),
                      {});
  auto run = std::make_unique<Run>(*this);
  shared_.clear();
  for (size_t i = 0; i < inputs.size(); ++i) hbm_[k.inputs[i]] = static_cast<uint8_t*>(inputs[i]);
  for (size_t i = 0; i < outputs.size(); ++i) hbm_[k.outputs[i]] = static_cast<uint8_t*>(outputs[i]);
  if (fill_outputs)
    for (StorageId id : output_fills_) fill_sentinel(id);
  regs_.assign(k.num_registers, 0);
  std::fill(scalar_acc_.begin(), scalar_acc_.end(), 0.0f);
  std::fill(vector_acc_.begin(), vector_acc_.end(), 0.0f);
  return run;
}

void Machine::fill_sentinel(StorageId id) {
  const Storage& s = kernel_.storages[id];
  const int64_t size = dtype_size(s.dtype);
  // HBM scratch: only the bytes accesses can reach, so untouched gigabytes stay uncommitted.
  const bool scratch = is_scratch_hbm(id);
  const int64_t skip = scratch ? scratch_hbm_used_[id].begin : 0;
  const int64_t n = scratch ? (scratch_hbm_used_[id].end - skip) / size : s.shape.num_elements();
  uint8_t pattern[4];
  if (is_float(s.dtype)) numerics::store_float(s.dtype, pattern, std::numeric_limits<float>::quiet_NaN());
  else numerics::store_int(s.dtype, pattern, 4);
  // Row by row: one partition's bytes are contiguous (HBM tensors are one row).
  const int64_t rows = s.on_chip() ? s.partitions() : 1;
  const int64_t row_bytes = s.on_chip() ? s.partition_bytes() : n * size;
  const int64_t pitch = row_pitch(s.buffer);
  uint8_t* base = storage_base(id) + skip;
  // The first row by doubling copies of the pattern, then whole-row copies: memcpy speed.
  if (row_bytes > 0) std::memcpy(base, pattern, size);
  for (int64_t done = size; done < row_bytes; done *= 2)
    std::memcpy(base + done, base, std::min(done, row_bytes - done));
  for (int64_t r = 1; r < rows; ++r) std::memcpy(base + r * pitch, base, row_bytes);
  if (s.buffer == Buffer::psum) {
    for (int64_t p = 0; p < s.partitions(); ++p) {
      const int64_t word0 = ((s.address->partition + p) * psum_row_ + s.address->byte_offset) / 4;
      std::fill_n(psum_written_ + word0, (s.partition_bytes() + 3) / 4, 0);
    }
  }
}

/** The byte range of each HBM scratch tensor that the kernel's accesses reach, in whole elements
 * of the tensor's dtype: all of it when an access has runtime offsets. */
void Machine::mark_scratch_hbm_used() {
  auto mark = [&](const AccessPattern& ap) {
    if (!is_scratch_hbm(ap.storage)) return;
    const Storage& s = kernel_.storages[ap.storage];
    const int64_t element = dtype_size(s.dtype), view_element = dtype_size(ap.dtype);
    ByteRange r{0, s.total_bytes()};
    if (!ap.is_dynamic()) {
      const LinearExtent e = linear_extent(ap);  // verified to lie inside the tensor
      r = {e.first * view_element / element * element,
           ((e.last + 1) * view_element + element - 1) / element * element};
    }
    ByteRange& used = scratch_hbm_used_[ap.storage];
    used = used.end == used.begin ? r : ByteRange{std::min(used.begin, r.begin), std::max(used.end, r.end)};
  };
  for (const Instruction& inst : kernel_.instructions)
    for (int slot = 0; slot < inst.spec().num_slots; ++slot) {
      const Operand& o = inst.operands[slot];
      if (!o.is_tensor()) continue;
      mark(kernel_.view(o));
      if (const Indirection* ind = kernel_.indirection(o)) {
        if (ind->scalar_tensor) mark(*ind->scalar_tensor);
        if (ind->vector_offset) mark(*ind->vector_offset);
      }
    }
}

// --- addressing -------------------------------------------------------------------------------

uint8_t* Machine::element(StorageId id, DType dtype, int64_t e) const {
  const Storage& s = kernel_.storages[id];
  const int64_t size = dtype_size(dtype);
  if (is_hbm(s.buffer)) return hbm_[id] + e * size;
  const int64_t row = row_elements(s, dtype);
  const int64_t p = e / row, f = e % row;
  return memory(s.buffer) + (s.address->partition + p) * row_pitch(s.buffer) + s.address->byte_offset + f * size;
}

void Machine::runtime_fault(const Instruction& inst, std::string what, std::string hint) const {
  throw KernelError(fmt::format("{}: {}", opcode_name(inst.opcode), what), kernel_.location(inst.loc),
                    to_string(kernel_, inst), {}, std::move(hint));
}

Elements Machine::resolve(const Instruction& inst, const AccessPattern& ap) const {
  Elements out;
  out.dtype = ap.dtype;
  out.partitions = ap.rank ? ap.dims[0].count : 1;
  out.free = ap.rank ? ap.inner_elements() : 1;
  const Storage& s = kernel_.storages[ap.storage];
  const int64_t n_storage = storage_elements(s, ap.dtype);
  int64_t base = ap.offset;
  std::vector<int64_t> gather;  // replaces the dim-0 coordinate when a vector offset is used
  if (const Indirection* ind = ap.indirection.get()) {
    if (ind->has_scalar()) {
      int64_t v;
      if (ind->scalar_tensor) {
        Elements idx = resolve(inst, *ind->scalar_tensor);
        v = idx.get_int(0, 0);
      } else {
        v = regs_[ind->scalar_register];
      }
      // Register values are arbitrary: an overflowing offset is out of bounds, not wrapped.
      const std::optional<int64_t> shift = checked_mul(v, ind->scalar_multiplier);
      const std::optional<int64_t> shifted = shift ? checked_add(base, *shift) : std::nullopt;
      if (!shifted)
        runtime_fault(inst,
                      fmt::format("runtime offset out of bounds: offset {} x {} elements of tensor '{}' overflows "
                                  "a 64-bit integer",
                                  v, ind->scalar_multiplier, s.name),
                      "check the values of the offset register or index tensor");
      base = *shifted;
    }
    if (ind->vector_offset) {
      Elements idx = resolve(inst, *ind->vector_offset);
      for (int64_t i = 0; i < idx.size(); ++i) gather.push_back(idx.get_int(i, 0));
    }
  }
  out.ptr.reserve(ap.num_elements());
  std::array<int64_t, kMaxRank> index{};
  const int64_t n = ap.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    std::optional<int64_t> e = base;
    for (int d = 0; d < ap.rank && e; ++d) {
      const std::optional<int64_t> step =
          d == 0 && !gather.empty() ? checked_mul(gather[index[0]], ap.indirection->vector_multiplier)
                                    : checked_mul(ap.dims[d].stride, index[d]);
      e = step ? checked_add(*e, *step) : std::nullopt;
    }
    if (inst.attrs.oob_skip && (!e || *e < 0 || *e >= n_storage)) {
      out.ptr.push_back(nullptr);  // oob_mode=skip: the element is not transferred
    } else if (!e || *e < 0 || *e >= n_storage) {
      runtime_fault(inst,
                    fmt::format("runtime offset out of bounds: element {} of tensor '{}' which has {} elements",
                                e ? fmt::to_string(*e) : "beyond 2^63", s.name, n_storage),
                    "check the values of the offset register or index tensor");
    } else {
      out.ptr.push_back(element(ap.storage, ap.dtype, *e));
    }
    for (int d = ap.rank - 1; d >= 0; --d) {
      if (++index[d] < ap.dims[d].count) break;
      index[d] = 0;
    }
  }
  return out;
}

void Machine::share_scratch(SharedScratch& launch) {
  const Kernel& k = kernel_;
  shared_.assign(k.storages.size(), 0);
  const bool first = !launch.published;
  size_t ordinal = 0;
  for (auto [id, offset] : scratch_hbm_) {
    const Storage& s = k.storages[id];
    if (s.buffer != Buffer::shared_hbm) continue;
    shared_[id] = 1;
    if (first) {
      launch.tensors.push_back({&k, id, hbm_[id]});
      fill_sentinel(id);
      continue;
    }
    if (ordinal >= launch.tensors.size())
      throw KernelError(fmt::format("shared_hbm tensor '{}' has no counterpart in the launch's first program "
                                    "instance, which allocates {} shared_hbm tensor{}",
                                    s.name, launch.tensors.size(), launch.tensors.size() == 1 ? "" : "s"),
                        k.location(s.loc), {}, "the instances of a launch share their shared_hbm tensors in allocation order",
                        "allocate the same shared_hbm tensors on every program instance");
    const SharedScratch::Tensor& owner = launch.tensors[ordinal++];
    const Storage& o = owner.kernel->storages[owner.storage];
    if (o.shape != s.shape || o.dtype != s.dtype)
      throw KernelError(fmt::format("shared_hbm tensor '{}' is {} {} but the first program instance's tensor '{}' "
                                    "it shares is {} {}",
                                    s.name, info(s.dtype).name, s.shape.str(), o.name, info(o.dtype).name, o.shape.str()),
                        k.location(s.loc), {}, "the instances of a launch share their shared_hbm tensors in allocation order",
                        "allocate the same shared_hbm tensors on every program instance");
    hbm_[id] = owner.base;
  }
  launch.published = true;
}

Payload Machine::read_payload(const Instruction& inst, int slot) const {
  const Elements e = operand(inst, slot);
  const size_t size = dtype_size(e.dtype);
  Payload p;
  p.dtype = e.dtype;
  p.bytes.resize(size_t(e.size()) * size);
  for (int64_t i = 0; i < e.size(); ++i) std::memcpy(p.bytes.data() + size_t(i) * size, e.ptr[i], size);
  return p;
}

void Machine::write_payload(const Instruction& inst, int slot, const Payload& payload) const {
  const Elements e = operand(inst, slot);
  internal_check(payload.dtype == e.dtype && payload.elements() == e.size(), "a payload of another dtype or size");
  const size_t size = dtype_size(e.dtype);
  for (int64_t i = 0; i < e.size(); ++i) std::memcpy(e.ptr[i], payload.bytes.data() + size_t(i) * size, size);
}

}  // namespace nikki::runtime
