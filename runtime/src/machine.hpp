// The simulated NeuronCore shared by nikki's executors (internal to runtime/).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include <fmt/format.h>

#include "core_memory.hpp"
#include "nikki/activation.hpp"
#include "nikki/alu.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/jit/liveness.hpp"
#include "nikki/layout.hpp"
#include "nikki/numerics.hpp"
#include "nikki/reduction_order.hpp"

namespace nikki::runtime {

namespace machine_detail {

/** The elements of one operand view, in row-major order, as (partition, free) pairs. */
struct Elements {
  std::vector<uint8_t*> ptr;
  DType dtype = DType::float32;
  int64_t partitions = 1;
  int64_t free = 1;

  uint8_t* at(int64_t p, int64_t f) const { return ptr[p * free + f]; }
  float get(int64_t p, int64_t f) const { return numerics::load_float(dtype, at(p, f)); }
  void set(int64_t p, int64_t f, float v) const { numerics::store_float(dtype, at(p, f), v); }
  int64_t get_int(int64_t p, int64_t f) const { return numerics::load_int(dtype, at(p, f)); }
  void set_int(int64_t p, int64_t f, int64_t v) const { numerics::store_int(dtype, at(p, f), v); }
  int64_t size() const { return static_cast<int64_t>(ptr.size()); }
};

/** Writes an integer value with the cast rule of the engines (saturating to integer dtypes). */
inline void store_integer_value(DType t, uint8_t* p, int64_t v) {
  if (is_float(t)) {
    numerics::store_float(t, p, static_cast<float>(v));
    return;
  }
  const int bits = 8 * int(dtype_size(t));
  int64_t lo = info(t).is_signed ? -(int64_t(1) << (bits - 1)) : 0;
  int64_t hi = t == DType::bool_ ? 1 : info(t).is_signed ? (int64_t(1) << (bits - 1)) - 1 : (int64_t(1) << bits) - 1;
  numerics::store_int(t, p, std::clamp(v, lo, hi));
}

/** Copies one element: bit-exact when dtypes match, through fp32 otherwise. */
inline void copy_element(DType dst_t, uint8_t* dst, DType src_t, const uint8_t* src) {
  if (dst_t == src_t) std::memcpy(dst, src, dtype_size(dst_t));
  else numerics::store_float(dst_t, dst, numerics::load_float(src_t, src));
}

/**
 * Zero-filled memory whose pages the OS commits only when they are first written: a simulated
 * memory then costs the host what a kernel touches of it, not its capacity (an SPMD launch holds
 * one simulated core per program instance, and HBM scratch tensors can be gigabytes).
 */
class ZeroedMemory {
 public:
  ZeroedMemory() = default;
  explicit ZeroedMemory(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw KernelError(fmt::format("the host cannot reserve {} of address space for the simulated memory",
                                    bytes_text(int64_t(bytes))),
                        {}, {}, "nikki reserves each simulated memory (SBUF, PSUM, HBM scratch) in host memory",
                        "use smaller scratch tensors");
    data_ = static_cast<uint8_t*>(p);
  }
  ZeroedMemory(ZeroedMemory&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ZeroedMemory& operator=(ZeroedMemory&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ZeroedMemory(const ZeroedMemory&) = delete;
  ZeroedMemory& operator=(const ZeroedMemory&) = delete;
  ~ZeroedMemory() {
    if (data_) munmap(data_, size_);
  }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint8_t& operator[](size_t i) const { return data_[i]; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace machine_detail

using namespace machine_detail;

/**
 * The simulated NeuronCore's state (SBUF, PSUM, HBM bindings, registers, engine accumulators) and
 * the reference semantics of every instruction. The executors (program-order interpreter, stream
 * interpreter, native executor) all run on a Machine, so their results are comparable bit for bit.
 */
class Machine {
 public:
  const Kernel& k;
  const TargetConfig& t;
  int64_t sbuf_row;
  int64_t psum_row;
  // SBUF, PSUM and their flags belong to a CoreMemory borrowed for the length of a run (bind());
  // null between runs.
  uint8_t* sbuf = nullptr;
  uint8_t* psum = nullptr;
  uint8_t* psum_written = nullptr;  // per 4-byte PSUM word: written by a matmul since allocation
  float* native_scratch = nullptr;  // working memory of the native routines
  std::vector<uint8_t*> hbm;        // base address of every HBM storage
  std::vector<std::pair<StorageId, int64_t>> scratch_hbm;  // HBM scratch tensors' offsets in one block
  int64_t scratch_hbm_bytes = 0;
  std::vector<ByteRange> scratch_hbm_used;  // bytes of each HBM scratch tensor that accesses can reach
  std::vector<int64_t> regs;
  std::vector<float> scalar_acc;  // ScalarE per-partition accumulators (activation reduce)
  std::vector<float> vector_acc;  // VectorE per-partition accumulators (select_reduce)
  std::vector<std::vector<StorageId>> fills;  // storages whose live range begins at instruction i
  std::vector<StorageId> output_fills;        // outputs whose initial fill a run could observe
  uint64_t id;                                // unique in the process: who used a CoreMemory last
  // The rectangle of rows x bytes per row that the kernel's SBUF and PSUM tensors occupy.
  int64_t sbuf_rows_used = 0, sbuf_row_bytes_used = 0, psum_rows_used = 0, psum_row_bytes_used = 0;

  explicit Machine(const Kernel& kernel)
      : k(kernel),
        t(kernel.config()),
        sbuf_row(partition_pitch(t, Buffer::sbuf)),
        psum_row(partition_pitch(t, Buffer::psum)),
        hbm(kernel.storages.size(), nullptr),
        scalar_acc(t.num_partitions, 0.0f),
        vector_acc(t.num_partitions, 0.0f),
        fills(jit::sentinel_fills(kernel, jit::live_ranges(kernel))),
        output_fills(jit::output_fills(kernel)),
        id(next_id()) {
    constexpr int64_t kScratchAlign = 64;
    for (StorageId storage = 0; storage < kernel.storages.size(); ++storage) {
      const Storage& s = kernel.storages[storage];
      if (s.on_chip() && s.address) {
        const bool in_sbuf = s.buffer == Buffer::sbuf;
        int64_t& rows = in_sbuf ? sbuf_rows_used : psum_rows_used;
        int64_t& row_bytes = in_sbuf ? sbuf_row_bytes_used : psum_row_bytes_used;
        rows = std::max(rows, s.address->partition + s.partitions());
        row_bytes = std::max(row_bytes, s.address->byte_offset + s.partition_bytes());
      }
      if (s.role != StorageRole::scratch || !is_hbm(s.buffer)) continue;
      scratch_hbm.emplace_back(storage, scratch_hbm_bytes);
      scratch_hbm_bytes += (s.total_bytes() + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    }
    sbuf_rows_used = std::min<int64_t>(sbuf_rows_used, t.num_partitions);
    psum_rows_used = std::min<int64_t>(psum_rows_used, t.num_partitions);
    sbuf_row_bytes_used = std::min(sbuf_row_bytes_used, sbuf_row);
    psum_row_bytes_used = std::min(psum_row_bytes_used, psum_row);
    scratch_hbm_used.assign(kernel.storages.size(), ByteRange{0, 0});
    mark_scratch_hbm_used();
  }

  static uint64_t next_id() {
    static std::atomic<uint64_t> counter{1};
    return counter++;
  }

  /** Bytes this machine keeps between runs (its memories are borrowed per run, not counted). */
  size_t resident_bytes() const {
    size_t bytes = sizeof(*this) + hbm.capacity() * sizeof(uint8_t*) + scratch_hbm.capacity() * sizeof(scratch_hbm[0]) +
                   (scalar_acc.capacity() + vector_acc.capacity()) * sizeof(float) +
                   regs.capacity() * sizeof(int64_t) + output_fills.capacity() * sizeof(StorageId);
    for (const std::vector<StorageId>& f : fills) bytes += sizeof(f) + f.capacity() * sizeof(StorageId);
    return bytes;
  }


  // --- addressing ---------------------------------------------------------------------------
  /** Address of a storage's first byte (on-chip: its first partition at its byte offset). */
  uint8_t* storage_base(StorageId id) {
    const Storage& s = k.storages[id];
    if (is_hbm(s.buffer)) return hbm[id];
    uint8_t* mem = s.buffer == Buffer::sbuf ? sbuf : psum;
    const int64_t pitch = s.buffer == Buffer::sbuf ? sbuf_row : psum_row;
    return mem + s.address->partition * pitch + s.address->byte_offset;
  }

  uint8_t* element(StorageId id, DType dtype, int64_t e) {
    const Storage& s = k.storages[id];
    const int64_t size = dtype_size(dtype);
    if (is_hbm(s.buffer)) return hbm[id] + e * size;
    const int64_t row = row_elements(s, dtype);
    const int64_t p = e / row, f = e % row;
    uint8_t* mem = s.buffer == Buffer::sbuf ? sbuf : psum;
    const int64_t pitch = s.buffer == Buffer::sbuf ? sbuf_row : psum_row;
    return mem + (s.address->partition + p) * pitch + s.address->byte_offset + f * size;
  }

  [[noreturn]] void runtime_fault(const Instruction& inst, std::string what, std::string hint) {
    throw KernelError(fmt::format("{}: {}", opcode_name(inst.opcode), what), k.location(inst.loc),
                      to_string(k, inst), {}, std::move(hint));
  }

  Elements resolve(const Instruction& inst, const AccessPattern& ap) {
    Elements out;
    out.dtype = ap.dtype;
    out.partitions = ap.rank ? ap.dims[0].count : 1;
    out.free = ap.rank ? ap.inner_elements() : 1;
    const Storage& s = k.storages[ap.storage];
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
          v = regs[ind->scalar_register];
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
      if (!e || *e < 0 || *e >= n_storage)
        runtime_fault(inst,
                      fmt::format("runtime offset out of bounds: element {} of tensor '{}' which has {} elements",
                                  e ? fmt::to_string(*e) : "beyond 2^63", s.name, n_storage),
                      "check the values of the offset register or index tensor");
      out.ptr.push_back(element(ap.storage, ap.dtype, *e));
      for (int d = ap.rank - 1; d >= 0; --d) {
        if (++index[d] < ap.dims[d].count) break;
        index[d] = 0;
      }
    }
    return out;
  }

  Elements operand(const Instruction& inst, int slot) { return resolve(inst, inst.operands[slot].ap); }

  /** Value of a scalar-or-vector operand for partition p (fp32). */
  float per_partition(const Operand& o, const Elements& e, int64_t p) {
    return o.is_tensor() ? e.get(p, 0) : static_cast<float>(o.imm);
  }
  Elements optional_operand(const Instruction& inst, int slot) {
    return inst.operands[slot].is_tensor() ? operand(inst, slot) : Elements{};
  }

  void fill_sentinel(StorageId id) {
    const Storage& s = k.storages[id];
    const int64_t size = dtype_size(s.dtype);
    // HBM scratch: only the bytes accesses can reach, so untouched gigabytes stay uncommitted.
    const bool scratch = is_scratch_hbm(id);
    const int64_t skip = scratch ? scratch_hbm_used[id].begin : 0;
    const int64_t n = scratch ? (scratch_hbm_used[id].end - skip) / size : s.shape.num_elements();
    uint8_t pattern[4];
    if (is_float(s.dtype)) numerics::store_float(s.dtype, pattern, std::numeric_limits<float>::quiet_NaN());
    else numerics::store_int(s.dtype, pattern, 4);
    // Row by row: one partition's bytes are contiguous (HBM tensors are one row).
    const int64_t rows = s.on_chip() ? s.partitions() : 1;
    const int64_t row_bytes = s.on_chip() ? s.partition_bytes() : n * size;
    const int64_t pitch = s.buffer == Buffer::sbuf ? sbuf_row : psum_row;
    uint8_t* base = storage_base(id) + skip;
    // The first row by doubling copies of the pattern, then whole-row copies: memcpy speed.
    if (row_bytes > 0) std::memcpy(base, pattern, size);
    for (int64_t done = size; done < row_bytes; done *= 2)
      std::memcpy(base + done, base, std::min(done, row_bytes - done));
    for (int64_t r = 1; r < rows; ++r) std::memcpy(base + r * pitch, base, row_bytes);
    if (s.buffer == Buffer::psum) {
      for (int64_t p = 0; p < s.partitions(); ++p) {
        const int64_t word0 = ((s.address->partition + p) * psum_row + s.address->byte_offset) / 4;
        std::fill_n(psum_written + word0, (s.partition_bytes() + 3) / 4, 0);
      }
    }
  }

  /** The byte range of each HBM scratch tensor that the kernel's accesses reach, in whole
   * elements of the tensor's dtype: all of it when an access has runtime offsets. */
  bool is_scratch_hbm(StorageId id) const {
    const Storage& s = k.storages[id];
    return s.role == StorageRole::scratch && is_hbm(s.buffer);
  }
  void mark_scratch_hbm_used() {
    auto mark = [&](const AccessPattern& ap) {
      if (!is_scratch_hbm(ap.storage)) return;
      const Storage& s = k.storages[ap.storage];
      const int64_t element = dtype_size(s.dtype), view_element = dtype_size(ap.dtype);
      ByteRange r{0, s.total_bytes()};
      if (!ap.is_dynamic()) {
        const LinearExtent e = linear_extent(ap);  // verified to lie inside the tensor
        r = {e.first * view_element / element * element,
             ((e.last + 1) * view_element + element - 1) / element * element};
      }
      ByteRange& used = scratch_hbm_used[ap.storage];
      used = used.end == used.begin ? r : ByteRange{std::min(used.begin, r.begin), std::max(used.end, r.end)};
    };
    for (const Instruction& inst : k.instructions)
      for (int slot = 0; slot < inst.spec().num_slots; ++slot) {
        const Operand& o = inst.operands[slot];
        if (!o.is_tensor()) continue;
        mark(o.ap);
        if (const Indirection* ind = o.ap.indirection.get()) {
          if (ind->scalar_tensor) mark(*ind->scalar_tensor);
          if (ind->vector_offset) mark(*ind->vector_offset);
        }
      }
  }

  // --- instructions -------------------------------------------------------------------------
  void exec(const Instruction& inst, size_t& pc) {
    switch (inst.opcode) {
      case Opcode::dma_copy:
      case Opcode::tensor_copy: return exec_copy(inst);
      case Opcode::tensor_tensor: return exec_tensor_tensor(inst);
      case Opcode::tensor_scalar: return exec_tensor_scalar(inst);
      case Opcode::scalar_tensor_tensor: return exec_scalar_tensor_tensor(inst);
      case Opcode::activation: return exec_activation(inst);
      case Opcode::tensor_reduce: return exec_tensor_reduce(inst);
      case Opcode::tensor_scalar_reduce: return exec_tensor_scalar_reduce(inst);
      case Opcode::nc_matmul: return exec_matmul(inst);
      case Opcode::nc_transpose: return exec_transpose(inst);
      case Opcode::memset: return exec_memset(inst);
      case Opcode::iota:
      case Opcode::affine_select: return exec_affine(inst);
      case Opcode::bn_stats: return exec_bn_stats(inst);
      case Opcode::bn_aggr: return exec_bn_aggr(inst);
      case Opcode::tensor_tensor_scan: return exec_scan(inst);
      case Opcode::reciprocal: return exec_reciprocal(inst);
      case Opcode::tensor_copy_predicated: return exec_copy_predicated(inst);
      case Opcode::select_reduce: return exec_select_reduce(inst);
      case Opcode::max8: return exec_max8(inst);
      case Opcode::nc_find_index8: return exec_find_index8(inst);
      case Opcode::tensor_partition_reduce: return exec_partition_reduce(inst);
      case Opcode::register_move:
        regs[inst.operands[0].reg] = scalar_value(inst.operands[1]);
        return;
      case Opcode::register_load: {
        Elements src = operand(inst, 1);
        regs[inst.operands[0].reg] = is_integer(src.dtype) ? src.get_int(0, 0) : std::llrint(src.get(0, 0));
        return;
      }
      case Opcode::register_store: {
        Elements dst = operand(inst, 0);
        store_integer_value(dst.dtype, dst.ptr[0], regs[inst.operands[1].reg]);
        return;
      }
      case Opcode::loop_begin: {
        const int64_t lower = scalar_value(inst.operands[1]), upper = scalar_value(inst.operands[2]);
        regs[inst.operands[0].reg] = lower;
        if (lower >= upper) pc = static_cast<size_t>(inst.attrs.jump);  // skip the body
        return;
      }
      case Opcode::loop_end: {
        const Instruction& begin = k.instructions[inst.attrs.jump];
        int64_t& counter = regs[begin.operands[0].reg];
        counter += begin.attrs.step;
        if (counter < scalar_value(begin.operands[2])) pc = static_cast<size_t>(inst.attrs.jump);
        return;
      }
      case Opcode::device_print: return exec_device_print(inst);
    }
  }

  int64_t scalar_value(const Operand& o) { return o.is_reg() ? regs[o.reg] : static_cast<int64_t>(o.imm); }

  void exec_copy(const Instruction& inst) {
    Elements dst = operand(inst, 0), src = operand(inst, 1);
    for (int64_t i = 0; i < dst.size(); ++i) copy_element(dst.dtype, dst.ptr[i], src.dtype, src.ptr[i]);
  }

  void exec_tensor_tensor(const Instruction& inst) {
    const AluOp op = inst.attrs.op0;
    Elements dst = operand(inst, 0), a = operand(inst, 1), b = operand(inst, 2);
    auto int32_like = [](DType d) { return d == DType::int32 || d == DType::uint32; };
    if (is_bitvec_op(op)) {
      const int bits = 8 * int(dtype_size(a.dtype));
      for (int64_t i = 0; i < dst.size(); ++i)
        numerics::store_int(dst.dtype, dst.ptr[i],
                            alu_apply_bits(op, numerics::load_int(a.dtype, a.ptr[i]),
                                           numerics::load_int(b.dtype, b.ptr[i]), bits));
    } else if (inst.engine == Engine::gpsimd && int32_like(dst.dtype) && int32_like(a.dtype) && int32_like(b.dtype) &&
               op != AluOp::power) {
      for (int64_t i = 0; i < dst.size(); ++i)
        numerics::store_int(dst.dtype, dst.ptr[i],
                            alu_apply_int(op, numerics::load_int(a.dtype, a.ptr[i]),
                                          numerics::load_int(b.dtype, b.ptr[i])));
    } else {
      for (int64_t i = 0; i < dst.size(); ++i)
        numerics::store_float(dst.dtype, dst.ptr[i],
                              alu_apply(op, numerics::load_float(a.dtype, a.ptr[i]),
                                        numerics::load_float(b.dtype, b.ptr[i])));
    }
  }

  void exec_tensor_scalar(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    Elements op0v = optional_operand(inst, 2), op1v = optional_operand(inst, 3);
    const Operand &o0 = inst.operands[2], &o1 = inst.operands[3];
    const bool two = !o1.is_none();
    // reverse swaps an operator's operands; a unary operator has only the tensor operand (its
    // scalar operand is ignored), so reverse leaves it applied to the tensor value.
    auto swap = [](AluOp op, bool reverse) { return reverse && !is_unary_op(op); };
    if (is_bitvec_op(at.op0)) {
      const int bits = 8 * int(dtype_size(data.dtype));
      auto int_operand = [&](const Operand& o, const Elements& e, int64_t p) {
        return o.is_tensor() ? e.get_int(p, 0) : static_cast<int64_t>(o.imm);
      };
      for (int64_t p = 0; p < dst.partitions; ++p)
        for (int64_t f = 0; f < dst.free; ++f) {
          int64_t x = data.get_int(p, f), s0 = int_operand(o0, op0v, p);
          int64_t r = swap(at.op0, at.reverse0) ? alu_apply_bits(at.op0, s0, x, bits)
                                                : alu_apply_bits(at.op0, x, s0, bits);
          if (two) {
            int64_t s1 = int_operand(o1, op1v, p);
            r = swap(at.op1, at.reverse1) ? alu_apply_bits(at.op1, s1, r, bits) : alu_apply_bits(at.op1, r, s1, bits);
          }
          dst.set_int(p, f, r);
        }
      return;
    }
    for (int64_t p = 0; p < dst.partitions; ++p) {
      const float s0 = per_partition(o0, op0v, p);
      const float s1 = two ? per_partition(o1, op1v, p) : 0.0f;
      for (int64_t f = 0; f < dst.free; ++f) {
        const float x = data.get(p, f);
        float r = swap(at.op0, at.reverse0) ? alu_apply(at.op0, s0, x) : alu_apply(at.op0, x, s0);
        if (two) r = swap(at.op1, at.reverse1) ? alu_apply(at.op1, s1, r) : alu_apply(at.op1, r, s1);
        dst.set(p, f, r);
      }
    }
  }

  void exec_scalar_tensor_tensor(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), data = operand(inst, 1), s0v = optional_operand(inst, 2),
             other = operand(inst, 3);
    for (int64_t p = 0; p < dst.partitions; ++p) {
      const float s0 = per_partition(inst.operands[2], s0v, p);
      for (int64_t f = 0; f < dst.free; ++f) {
        const float x = data.get(p, f), y = other.get(p, f);
        float r = at.reverse0 ? alu_apply(at.op0, s0, x) : alu_apply(at.op0, x, s0);
        r = at.reverse1 ? alu_apply(at.op1, y, r) : alu_apply(at.op1, r, y);
        dst.set(p, f, r);
      }
    }
  }

  /** Applies a reduce command to per-partition accumulators given this instruction's partial results. */
  static void apply_reduce_cmd(ReduceCmd cmd, AluOp op, float identity, std::vector<float>& acc, int64_t p,
                               float partial, bool has_partial) {
    switch (cmd) {
      case ReduceCmd::idle: break;
      case ReduceCmd::reset: acc[p] = identity; break;
      case ReduceCmd::reduce:
      case ReduceCmd::load_reduce:
        if (has_partial) acc[p] = alu_apply(op, acc[p], partial);
        break;
      case ReduceCmd::reset_reduce: acc[p] = has_partial ? partial : identity; break;
    }
  }

  void exec_activation(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), data = operand(inst, 1), bias = optional_operand(inst, 2),
             scale = optional_operand(inst, 3), res = optional_operand(inst, 4);
    const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
    for (int64_t p = 0; p < dst.partitions; ++p) {
      const float b = inst.operands[2].is_tensor() ? bias.get(p, 0) : 0.0f;
      const float s = per_partition(inst.operands[3], scale, p);
      float sum = 0.0f;
      for (int64_t f = 0; f < dst.free; ++f) {
        const float y = activation_apply(at.func, std::fma(data.get(p, f), s, b));
        dst.set(p, f, y);
        if (reducing) sum = f == 0 ? y : sum + y;
      }
      apply_reduce_cmd(at.reduce_cmd, AluOp::add, 0.0f, scalar_acc, p, sum, reducing);
      if (inst.operands[4].is_tensor()) res.set(p, 0, scalar_acc[p]);
    }
  }

  /** Folds `values` with `op` left to right (the first element is the initial value). */
  static float fold(AluOp op, const std::vector<float>& values) {
    float r = values[0];
    for (size_t i = 1; i < values.size(); ++i) r = alu_apply(op, r, values[i]);
    return r;
  }
  static int64_t fold_bits(AluOp op, const std::vector<int64_t>& values, int bits) {
    int64_t r = values[0];
    for (size_t i = 1; i < values.size(); ++i) r = alu_apply_bits(op, r, values[i], bits);
    return r;
  }

  void exec_tensor_reduce(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    const AccessPattern& ap = inst.operands[1].ap;
    // The reduced axes are a suffix of the free dims: each output element reduces one run.
    int first = ap.rank;
    for (int d = 1; d < ap.rank; ++d)
      if (at.axes & (1u << d)) {
        first = d;
        break;
      }
    int64_t run = 1;
    for (int d = first; d < ap.rank; ++d) run *= ap.dims[d].count;
    const int bits = 8 * int(dtype_size(data.dtype));
    for (int64_t p = 0; p < dst.partitions; ++p)
      for (int64_t o = 0; o < dst.free; ++o) {
        if (is_bitvec_op(at.op0)) {
          std::vector<int64_t> v(run);
          for (int64_t i = 0; i < run; ++i) v[i] = data.get_int(p, o * run + i);
          dst.set_int(p, o, fold_bits(at.op0, v, bits));
        } else {
          // fp32 folds take nikki's reduction order (pairwise for add), shared with the native routine
          std::vector<float> v(run);
          for (int64_t i = 0; i < run; ++i) v[i] = data.get(p, o * run + i);
          const float r = reduction::fold(at.op0, run, [&](int64_t lo, int64_t, float*) { return v.data() + lo; });
          dst.set(p, o, at.negate ? -r : r);
        }
      }
  }

  void exec_tensor_scalar_reduce(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), data = operand(inst, 1), s0v = optional_operand(inst, 2),
             res = optional_operand(inst, 3);
    for (int64_t p = 0; p < dst.partitions; ++p) {
      const float s0 = per_partition(inst.operands[2], s0v, p);
      std::vector<float> v(dst.free);
      for (int64_t f = 0; f < dst.free; ++f) {
        v[f] = alu_apply(at.op0, data.get(p, f), s0);
        dst.set(p, f, v[f]);
      }
      vector_acc[p] = fold(at.reduce_op, v);
      if (inst.operands[3].is_tensor()) res.set(p, 0, vector_acc[p]);
    }
  }

  void exec_matmul(const Instruction& inst) {
    Elements dst = operand(inst, 0), st = operand(inst, 1), mv = operand(inst, 2);
    const int64_t K = st.partitions, M = st.free, N = mv.free;
    const Accumulate mode = inst.attrs.accumulate;
    // Transpose mode (nc_transpose on the tensor engine: data stationary, identity moving) is
    // bit-accurate: where moving column n is a unit vector (a single 1, zeros elsewhere), dst[m, n]
    // is stationary[k, m] passed through unchanged (-0 and NaN payloads included).
    std::vector<int64_t> unit(inst.attrs.is_transpose ? N : 0, -1);
    for (int64_t n = 0; n < static_cast<int64_t>(unit.size()); ++n)
      for (int64_t kk = 0; kk < K; ++kk) {
        const float b = mv.get(kk, n);
        if (b == 0.0f) continue;
        unit[n] = b == 1.0f && unit[n] == -1 ? kk : -2;
        if (unit[n] == -2) break;
      }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float partial = 0.0f;
        if (inst.attrs.is_transpose && unit[n] >= 0) {
          copy_element(dst.dtype, dst.at(m, n), st.dtype, st.at(unit[n], m));
          continue;
        }
        if (inst.attrs.is_transpose) {
          // Other moving tiles: products with a zero factor are skipped, so a NaN or Inf moves
          // through an identity-like operand instead of poisoning the whole row.
          for (int64_t kk = 0; kk < K; ++kk) {
            const float a = st.get(kk, m), b = mv.get(kk, n);
            if (a != 0.0f && b != 0.0f) partial = std::fma(a, b, partial);
          }
          dst.set(m, n, partial);
          continue;
        }
        for (int64_t kk = 0; kk < K; ++kk) partial = std::fma(st.get(kk, m), mv.get(kk, n), partial);
        uint8_t* out = dst.at(m, n);
        uint8_t& written = psum_written[(out - psum) / 4];
        const bool accumulate = mode == Accumulate::accumulate || (mode == Accumulate::automatic && written);
        dst.set(m, n, accumulate ? dst.get(m, n) + partial : partial);
        written = 1;
      }
  }

  void exec_transpose(const Instruction& inst) {
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    const int64_t size = dtype_size(dst.dtype);
    for (int64_t p = 0; p < data.partitions; ++p)
      for (int64_t f = 0; f < data.free; ++f) std::memcpy(dst.at(f, p), data.at(p, f), size);
  }

  void exec_memset(const Instruction& inst) {
    Elements dst = operand(inst, 0);
    const double v = inst.operands[1].imm;
    for (uint8_t* p : dst.ptr) {
      if (is_float(dst.dtype)) numerics::store_float(dst.dtype, p, static_cast<float>(v));
      else store_integer_value(dst.dtype, p, static_cast<int64_t>(v));
    }
  }

  /** iota / affine_select: the affine value offset + c * channel_multiplier + sum(step * index). */
  void exec_affine(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0);
    Elements on_true = inst.opcode == Opcode::affine_select ? operand(inst, 1) : Elements{};
    for (int64_t c = 0; c < dst.partitions; ++c) {
      std::vector<int64_t> idx(at.pattern.size(), 0);
      for (int64_t f = 0; f < dst.free; ++f) {
        int64_t v = at.offset + c * at.channel_multiplier;
        for (size_t d = 0; d < idx.size(); ++d) v += at.pattern[d].stride * idx[d];
        v = static_cast<int32_t>(static_cast<uint32_t>(v));  // computed in int32
        if (inst.opcode == Opcode::iota) {
          store_integer_value(dst.dtype, dst.at(c, f), v);
        } else if (alu_apply_int(at.cmp_op, v, 0)) {
          copy_element(dst.dtype, dst.at(c, f), on_true.dtype, on_true.at(c, f));
        } else {
          dst.set(c, f, static_cast<float>(inst.operands[2].imm));
        }
        for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
          if (++idx[d] < at.pattern[d].count) break;
          idx[d] = 0;
        }
      }
    }
  }

  void exec_bn_stats(const Instruction& inst) {
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    for (int64_t p = 0; p < data.partitions; ++p) {
      // Welford's running mean and sum of squared deviations, separately over even and odd elements.
      float count[2] = {0, 0}, mean[2] = {0, 0}, m2[2] = {0, 0};
      for (int64_t f = 0; f < data.free; ++f) {
        const int lane = f & 1;
        const float x = data.get(p, f);
        count[lane] += 1.0f;
        const float delta = x - mean[lane];
        mean[lane] += delta / count[lane];
        m2[lane] += delta * (x - mean[lane]);
      }
      const float out[6] = {count[0], mean[0], m2[0], count[1], mean[1], m2[1]};
      for (int i = 0; i < 6; ++i) dst.set(p, i, out[i]);
    }
  }

  void exec_bn_aggr(const Instruction& inst) {
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    for (int64_t p = 0; p < data.partitions; ++p) {
      // Chan et al.'s pairwise merge of (count, mean, M2) triples, in order.
      float n = 0, mean = 0, m2 = 0;
      for (int64_t i = 0; i + 2 < data.free; i += 3) {
        const float nb = data.get(p, i), mb = data.get(p, i + 1), m2b = data.get(p, i + 2);
        if (nb == 0) continue;
        const float total = n + nb;
        const float delta = mb - mean;
        mean += delta * (nb / total);
        m2 += m2b + delta * delta * (n * nb / total);
        n = total;
      }
      dst.set(p, 0, mean);
      dst.set(p, 1, n > 0 ? m2 / n : std::numeric_limits<float>::quiet_NaN());
    }
  }

  void exec_scan(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), d0 = operand(inst, 1), d1 = operand(inst, 2), init = optional_operand(inst, 3);
    for (int64_t p = 0; p < dst.partitions; ++p) {
      float prev = per_partition(inst.operands[3], init, p);
      for (int64_t f = 0; f < dst.free; ++f) {
        const float a = d0.get(p, f), b = d1.get(p, f);
        float t = at.reverse0 ? alu_apply(at.op0, prev, a) : alu_apply(at.op0, a, prev);
        prev = at.reverse1 ? alu_apply(at.op1, b, t) : alu_apply(at.op1, t, b);
        dst.set(p, f, prev);
      }
    }
  }

  void exec_reciprocal(const Instruction& inst) {
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    for (int64_t i = 0; i < dst.size(); ++i)
      numerics::store_float(dst.dtype, dst.ptr[i], 1.0f / numerics::load_float(data.dtype, data.ptr[i]));
  }

  void exec_copy_predicated(const Instruction& inst) {
    Elements dst = operand(inst, 0), src = optional_operand(inst, 1), pred = operand(inst, 2);
    const bool scalar_src = inst.operands[1].is_imm();
    for (int64_t i = 0; i < dst.size(); ++i) {
      const bool take = (numerics::load_int(pred.dtype, pred.ptr[i]) != 0) != inst.attrs.reverse_pred;
      if (!take) continue;
      if (scalar_src) numerics::store_float(dst.dtype, dst.ptr[i], static_cast<float>(inst.operands[1].imm));
      else copy_element(dst.dtype, dst.ptr[i], src.dtype, src.ptr[i]);
    }
  }

  void exec_select_reduce(const Instruction& inst) {
    const Attributes& at = inst.attrs;
    Elements dst = operand(inst, 0), pred = operand(inst, 1), on_true = operand(inst, 2),
             on_false = optional_operand(inst, 3), res = optional_operand(inst, 4);
    const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
    for (int64_t p = 0; p < dst.partitions; ++p) {
      const float fv = per_partition(inst.operands[3], on_false, p);
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t f = 0; f < dst.free; ++f) {
        const bool take = (pred.get_int(p, f) != 0) != at.reverse_pred;
        const float v = take ? on_true.get(p, f) : fv;
        dst.set(p, f, v);
        best = alu_apply(AluOp::maximum, best, v);
      }
      apply_reduce_cmd(at.reduce_cmd, AluOp::maximum, -std::numeric_limits<float>::infinity(), vector_acc, p, best,
                       reducing);
      if (inst.operands[4].is_tensor()) res.set(p, 0, vector_acc[p]);
    }
  }

  void exec_max8(const Instruction& inst) {
    Elements dst = operand(inst, 0), src = operand(inst, 1);
    for (int64_t p = 0; p < src.partitions; ++p) {
      std::vector<float> v(src.free);
      for (int64_t f = 0; f < src.free; ++f) v[f] = src.get(p, f);
      // Descending and stable; NaN never outranks a number.
      std::stable_sort(v.begin(), v.end(), [](float a, float b) {
        if (std::isnan(a)) return false;
        if (std::isnan(b)) return true;
        return a > b;
      });
      for (int i = 0; i < 8; ++i) dst.set(p, i, v[i]);
    }
  }

  void exec_find_index8(const Instruction& inst) {
    Elements dst = operand(inst, 0), data = operand(inst, 1), vals = operand(inst, 2);
    for (int64_t p = 0; p < data.partitions; ++p) {
      std::vector<bool> used(data.free, false);
      for (int i = 0; i < 8; ++i) {
        const float want = vals.get(p, i);
        int64_t found = 0xFFFFFFFFll;
        for (int64_t f = 0; f < data.free; ++f)
          if (!used[f] && data.get(p, f) == want) {
            found = f;
            used[f] = true;
            break;
          }
        store_integer_value(dst.dtype, dst.at(p, i), found);
      }
    }
  }

  void exec_partition_reduce(const Instruction& inst) {
    const AluOp op = inst.attrs.op0;
    Elements dst = operand(inst, 0), data = operand(inst, 1);
    const int bits = 8 * int(dtype_size(data.dtype));
    for (int64_t f = 0; f < data.free; ++f) {
      if (is_bitvec_op(op)) {
        int64_t r = data.get_int(0, f);
        for (int64_t p = 1; p < data.partitions; ++p) r = alu_apply_bits(op, r, data.get_int(p, f), bits);
        dst.set_int(0, f, r);
      } else {
        const AluOp fold_op = op == AluOp::average ? AluOp::add : op;
        float r = data.get(0, f);
        for (int64_t p = 1; p < data.partitions; ++p) r = alu_apply(fold_op, r, data.get(p, f));
        if (op == AluOp::average) r /= static_cast<float>(data.partitions);
        dst.set(0, f, r);
      }
    }
  }

  void exec_device_print(const Instruction& inst) {
    Elements src = operand(inst, 0);
    std::string out = fmt::format("{} {}:\n[", inst.attrs.text, inst.operands[0].ap.shape().str());
    for (int64_t p = 0; p < src.partitions; ++p) {
      out += p ? ",\n [" : "[";
      for (int64_t f = 0; f < src.free; ++f) {
        if (is_float(src.dtype)) out += fmt::format("{}{}", f ? ", " : "", src.get(p, f));
        else out += fmt::format("{}{}", f ? ", " : "", src.get_int(p, f));
      }
      out += "]";
    }
    out += "]\n";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }

  /** The memories of one run: a borrowed CoreMemory and the HBM scratch tensors (zeros). The
   * machine points into them while the run lasts; they are given back when it ends. */
  class Run {
   public:
    explicit Run(Machine& m)
        : machine_(m),
          memory_(size_t(m.t.num_partitions) * m.sbuf_row, size_t(m.t.num_partitions) * m.psum_row),
          scratch_(size_t(m.scratch_hbm_bytes)) {
      m.sbuf = memory_->sbuf.get();
      m.psum = memory_->psum.get();
      m.psum_written = memory_->psum_written.get();
      m.native_scratch = memory_->native_scratch.get();
      for (auto [id, offset] : m.scratch_hbm) m.hbm[id] = scratch_.data() + offset;
      if (memory_->last_user != m.id) {
        // As if this machine owned the memory: zeros where its tensors live, whatever the
        // previous user (another kernel) left there.
        for (int64_t p = 0; p < m.sbuf_rows_used; ++p) std::memset(m.sbuf + p * m.sbuf_row, 0, m.sbuf_row_bytes_used);
        for (int64_t p = 0; p < m.psum_rows_used; ++p) {
          std::memset(m.psum + p * m.psum_row, 0, m.psum_row_bytes_used);
          std::memset(m.psum_written + p * m.psum_row / 4, 0, (m.psum_row_bytes_used + 3) / 4);
        }
        memory_->last_user = m.id;
      }
    }
    ~Run() {
      machine_.sbuf = machine_.psum = machine_.psum_written = nullptr;
      machine_.native_scratch = nullptr;
      for (auto [id, offset] : machine_.scratch_hbm) machine_.hbm[id] = nullptr;
    }
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;

   private:
    Machine& machine_;
    CoreMemoryLease memory_;
    ZeroedMemory scratch_;  // pages committed only where the kernel touches them
  };

  /** Binds the caller's HBM buffers and the memories of one run, and resets the run state; the
   * run lasts as long as the returned object. Outputs get sentinels unless `fill_outputs` is
   * false (later instances of an SPMD grid share earlier ones' outputs). */
  [[nodiscard]] std::unique_ptr<Run> bind(std::span<void* const> inputs, std::span<void* const> outputs,
                                          bool fill_outputs = true) {
    if (inputs.size() != k.inputs.size() || outputs.size() != k.outputs.size())
      throw KernelError(fmt::format("kernel '{}' takes {} inputs and {} outputs, got {} and {}", k.name,
                                    k.inputs.size(), k.outputs.size(), inputs.size(), outputs.size()),
                        {});
    auto run = std::make_unique<Run>(*this);
    for (size_t i = 0; i < inputs.size(); ++i) hbm[k.inputs[i]] = static_cast<uint8_t*>(inputs[i]);
    for (size_t i = 0; i < outputs.size(); ++i) hbm[k.outputs[i]] = static_cast<uint8_t*>(outputs[i]);
    if (fill_outputs)
      for (StorageId id : output_fills) fill_sentinel(id);
    regs.assign(k.num_registers, 0);
    std::fill(scalar_acc.begin(), scalar_acc.end(), 0.0f);
    std::fill(vector_acc.begin(), vector_acc.end(), 0.0f);
    return run;
  }

  /** Fills the storages whose live range begins at instruction `index` with sentinels. */
  void begin_instruction(size_t index) {
    for (StorageId id : fills[index]) fill_sentinel(id);
  }
};

}  // namespace nikki::runtime
