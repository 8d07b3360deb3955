// The sanitizer's shadow memory (internal to runtime/): which bytes of SBUF, PSUM and the HBM
// outputs and scratch hold a value, so the reference interpreter can report a kernel whose
// results depend on memory it never wrote.
//
// Every byte has two bits: written (something stored to it since its tensor was allocated) and
// valid (what was stored was computed from written bytes only). Reading a byte never written
// does not fail at once: a legacy kernel loads a tail tile with mask= and computes on all 128
// partitions, storing only the loaded ones, and that is correct. Instead, invalidity flows
// through each instruction element by element (as far as its semantics allow), and the kernel
// fails when an invalid value becomes observable: written to a kernel output, or read into a
// register or used as an index. The report names the instruction that first read never-written
// memory, the element, the line that allocated the tensor, and where the value surfaced.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "machine.hpp"
#include "nikki/alu.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/jit/liveness.hpp"
#include "reference_semantics.hpp"

namespace nikki::runtime {

/** One bit per byte, zero at first, in memory the host commits only where bits are set or
 * cleared (the shadow of a gigabyte scratch tensor the kernel barely touches stays small). */
class ByteBits {
 public:
  void resize(size_t bytes) { memory_ = ZeroedMemory((bytes + 63) / 64 * sizeof(uint64_t)); }
  bool empty() const { return memory_.empty(); }
  bool test(size_t i) const { return (words()[i / 64] >> (i % 64)) & 1; }
  void put(size_t i, bool value) {
    const uint64_t bit = uint64_t(1) << (i % 64);
    words()[i / 64] = value ? words()[i / 64] | bit : words()[i / 64] & ~bit;
  }
  void assign(size_t first, size_t count, bool value) {
    size_t i = first;
    const size_t end = first + count;
    for (; i < end && i % 64; ++i) put(i, value);
    for (; i + 64 <= end; i += 64) words()[i / 64] = value ? ~uint64_t(0) : 0;
    for (; i < end; ++i) put(i, value);
  }

 private:
  uint64_t* words() const { return reinterpret_cast<uint64_t*>(memory_.data()); }  // page-aligned
  ZeroedMemory memory_;
};

/** The written and valid bits of one memory. */
struct ShadowBits {
  ByteBits written, valid;
  void resize(size_t bytes) {
    written.resize(bytes);
    valid.resize(bytes);
  }
  bool empty() const { return written.empty(); }
  void assign(size_t first, size_t count, bool value) {
    written.assign(first, count, value);
    valid.assign(first, count, value);
  }
};

/** The shadow state of one run: see the file comment. */
class ShadowMemory {
 public:
  /** The shadow of one run on `m`, bound to its memories. `fill_outputs` is false for SPMD
   * instances after the first: the outputs then hold earlier instances' results, which this
   * shadow did not see, so they count as valid. */
  ShadowMemory(const Machine& m, bool fill_outputs)
      : k_(m.kernel()), fresh_(k_.instructions.size()), hbm_(k_.storages.size()), origin_of_(k_.storages.size(), -1),
        surfaced_at_(k_.storages.size(), -1), scalar_acc_invalid_(m.config().num_partitions, 0.0f),
        vector_acc_invalid_(m.config().num_partitions, 0.0f) {
    sbuf_.resize(size_t(m.config().num_partitions) * m.row_pitch(Buffer::sbuf));
    psum_.resize(size_t(m.config().num_partitions) * m.row_pitch(Buffer::psum));
    const std::vector<jit::LiveRange> ranges = jit::live_ranges(k_);
    for (StorageId id = 0; id < k_.storages.size(); ++id) {
      const Storage& s = k_.storages[id];
      // Inputs always hold values; writable ones are tracked, as a kernel may store garbage there.
      if (is_hbm(s.buffer) && (s.role != StorageRole::input || s.writable_input)) {
        hbm_[id].resize(s.total_bytes());
        if (s.role != StorageRole::scratch)
          hbm_[id].assign(0, s.total_bytes(), s.role == StorageRole::input || !fill_outputs);
      }
      if (s.role == StorageRole::scratch && ranges[id].used()) fresh_[ranges[id].begin].push_back(id);
    }
  }

  /** The scratch tensors whose live range begins at instruction `index` hold garbage. */
  void begin_instruction(const Machine& m, size_t index) {
    for (StorageId id : fresh_[index]) {
      if (m.shares_scratch(id)) continue;  // the partners' writes may already be there
      forget(m, id);
      origin_of_[id] = -1;
    }
  }

  /**
   * Runs `inst` on the machine (advancing `pc` as reference::execute does) and updates the shadow: each
   * element it writes is valid when the elements it was computed from are. Throws a KernelError
   * when a register or an index is read from invalid memory.
   */
  void exec(Machine& m, const Instruction& inst, size_t& pc) {
    index_ = pc;
    Views v;
    for (int slot = 0; slot < inst.spec().num_slots; ++slot) {
      const Operand& o = inst.operands[slot];
      if (!o.is_tensor()) continue;
      const AccessPattern ap = m.kernel().view(o);
      if (const Indirection* ind = ap.indirection.get()) {
        if (ind->scalar_tensor) require_valid(inst, read(m, inst, *ind->scalar_tensor), "is used as a runtime offset");
        if (ind->vector_offset) require_valid(inst, read(m, inst, *ind->vector_offset), "is used as a runtime offset");
      }
      // A predicated copy keeps the destination elements it does not select, without reading them.
      const bool reads =
          inst.access(slot) != Access::write && !(slot == 0 && inst.opcode == Opcode::tensor_copy_predicated);
      if (reads) v[slot] = read(m, inst, ap);
      else if (slot == 0) v[0] = View{m.resolve(inst, ap), std::vector<uint8_t>(ap.num_elements(), 1), -1};
    }
    if (inst.opcode == Opcode::register_load) require_valid(inst, v[1], "is loaded into a register");
    // nc_matmul adds to its destination only where it accumulates (in automatic mode: where a
    // matmul wrote since allocation, which exec is about to decide).
    std::vector<uint8_t> accumulates;
    if (inst.opcode == Opcode::nc_matmul) {
      accumulates = matmul_accumulates(m, inst, v[0]);
      bool reads_invalid = false;
      for (size_t i = 0; i < accumulates.size(); ++i)
        reads_invalid = reads_invalid || (accumulates[i] && !v[0].valid[i]);
      if (!reads_invalid) v[0].origin = -1;
    }
    reference::execute(m, inst, pc);
    switch (inst.opcode) {
      case Opcode::loop_begin:
      case Opcode::loop_end:
      case Opcode::register_move:
      case Opcode::register_load:
      case Opcode::device_print: return;
      default: break;
    }
    propagate(m, inst, v, accumulates);
  }

  /** A sendrecv's src leaves this core: throws a KernelError if it holds a value computed from
   * never-written memory (the other core's shadow cannot follow it). */
  void require_sent_valid(const Machine& m, const Instruction& inst, size_t index, int slot) {
    index_ = index;
    require_valid(inst, read(m, inst, k_.view(inst, slot)), "is sent to another core");
  }

  /** A sendrecv's dst (instruction `index`) received the other core's values, which are valid. */
  void mark_received(Machine& m, const Instruction& inst, size_t index, int slot) {
    index_ = index;
    store(m, inst, slot, std::vector<uint8_t>(k_.view(inst, slot).num_elements(), 1), -1);
  }

  /** A meeting with the other instances of the launch completed: the HBM they share with this
   * one (outputs, writable inputs, shared_hbm scratch) may hold their writes, which this shadow
   * did not see, so it counts as written and valid, as for later SPMD instances' outputs. */
  void partners_may_have_written(const Machine& m) {
    for (StorageId id = 0; id < k_.storages.size(); ++id) {
      const Storage& s = k_.storages[id];
      if (!hbm_[id].empty() && (s.role != StorageRole::scratch || m.shares_scratch(id)))
        hbm_[id].assign(0, s.total_bytes(), true);
    }
  }

  /** Throws a KernelError if a kernel output holds a value computed from never-written memory. */
  void end_run(const Machine& m) const {
    for (StorageId id = 0; id < k_.storages.size(); ++id) {
      if (surfaced_at_[id] < 0) continue;
      const Storage& s = k_.storages[id];
      for (int64_t b = 0; b < s.total_bytes(); ++b)
        if (hbm_[id].written.test(b) && !hbm_[id].valid.test(b)) {
          const Instruction& writer = k_.instructions[surfaced_at_[id]];
          report(origin_of_[id], fmt::format("values computed from it reach output '{}' ({}{}) through {} at {}",
                                             s.name, s.name, coordinates(m, id, m.hbm(id) + b),
                                             opcode_name(writer.opcode), k_.location(writer.loc).str()));
        }
    }
  }

 private:
  /** The first read of never-written memory behind some invalid values. */
  struct Origin {
    uint32_t instruction;
    StorageId storage;
    std::string element;  // "[p, f]" in the tensor
    int64_t unwritten, elements;
  };

  /** Per-element validity of one operand view (row-major over the view), as a machine view. */
  struct View {
    Elements e;
    std::vector<uint8_t> valid;
    int32_t origin = -1;  // of the first invalid element
    bool present() const { return !e.ptr.empty(); }
    bool at(int64_t p, int64_t f) const { return valid[p * e.free + f]; }
    bool row(int64_t p) const {
      return std::all_of(valid.begin() + p * e.free, valid.begin() + (p + 1) * e.free, [](uint8_t x) { return x; });
    }
    bool column(int64_t f) const {
      for (int64_t p = 0; p < e.partitions; ++p)
        if (!at(p, f)) return false;
      return true;
    }
  };
  using Views = std::array<View, kMaxSlots>;  // by operand slot

  /** The shadow of the byte at `p` of storage `id` (its index in `index`); null for an input the
   * kernel cannot write, which always holds values. */
  ShadowBits* bits(const Machine& m, StorageId id, const uint8_t* p, size_t& index) {
    const Storage& s = k_.storages[id];
    if (s.buffer == Buffer::sbuf) return index = size_t(p - m.memory(Buffer::sbuf)), &sbuf_;
    if (s.buffer == Buffer::psum) return index = size_t(p - m.memory(Buffer::psum)), &psum_;
    if (hbm_[id].empty()) return nullptr;
    index = size_t(p - m.hbm(id));
    return &hbm_[id];
  }

  /** A scratch tensor's bytes hold garbage again: never written. */
  void forget(const Machine& m, StorageId id) {
    const Storage& s = k_.storages[id];
    if (!s.on_chip()) {
      // Scratch: the bytes accesses can reach, as the sentinel fill does.
      const ByteRange used = m.scratch_hbm_used(id);
      hbm_[id].assign(used.begin, used.end - used.begin, false);
      return;
    }
    ShadowBits& b = s.buffer == Buffer::sbuf ? sbuf_ : psum_;
    const int64_t pitch = m.row_pitch(s.buffer);
    for (int64_t p = 0; p < s.partitions(); ++p)
      b.assign((s.address->partition + p) * pitch + s.address->byte_offset, s.partition_bytes(), false);
  }

  /** Validity of the elements of `ap`; a first read of never-written bytes becomes an origin. */
  View read(const Machine& m, const Instruction& inst, const AccessPattern& ap) {
    View v{m.resolve(inst, ap), {}, -1};
    const int64_t size = dtype_size(ap.dtype);
    v.valid.assign(v.e.size(), 1);
    int64_t unwritten = 0;
    const uint8_t* first_unwritten = nullptr;
    bool derived = false;  // invalid but written: computed from garbage earlier
    for (int64_t i = 0; i < v.e.size(); ++i) {
      if (!v.e.ptr[i]) continue;  // oob_mode=skip: an element the instruction does not transfer
      bool written = true, valid = true;
      for (int64_t b = 0; b < size; ++b) {
        size_t index = 0;
        if (const ShadowBits* bits_of = bits(m, ap.storage, v.e.ptr[i] + b, index)) {
          written = written && bits_of->written.test(index);
          valid = valid && bits_of->valid.test(index);
        }
      }
      v.valid[i] = valid;
      if (!written && !first_unwritten) first_unwritten = v.e.ptr[i];
      unwritten += !written;
      derived = derived || (written && !valid);
    }
    if (first_unwritten) v.origin = origin(m, ap.storage, first_unwritten, unwritten, v.e.size());
    else if (derived) v.origin = origin_of_[ap.storage];
    return v;
  }

  /** The origin of this instruction's first read of never-written bytes of a storage. */
  int32_t origin(const Machine& m, StorageId storage, const uint8_t* first, int64_t unwritten, int64_t elements) {
    // Once per instruction and storage: a runtime loop repeats its reads.
    const uint64_t key = (uint64_t(index_) << 32) | storage;
    auto [it, fresh] = origin_ids_.try_emplace(key, int32_t(origins_.size()));
    if (fresh)
      origins_.push_back(Origin{uint32_t(index_), storage, coordinates(m, storage, first), unwritten, elements});
    return it->second;
  }

  void require_valid(const Instruction& inst, const View& v, std::string_view use) const {
    if (std::find(v.valid.begin(), v.valid.end(), 0) != v.valid.end())
      report(v.origin, fmt::format("a value computed from it {} by {} at {}", use, opcode_name(inst.opcode),
                                   k_.location(inst.loc).str()));
  }

  /** Per destination element of an nc_matmul: whether it adds to the destination's value. */
  std::vector<uint8_t> matmul_accumulates(const Machine& m, const Instruction& inst, const View& dst) const {
    std::vector<uint8_t> out(dst.e.size(), 0);
    if (inst.attrs.is_transpose) return out;
    for (int64_t i = 0; i < dst.e.size(); ++i)
      out[i] = inst.attrs.accumulate == Accumulate::accumulate ||
               (inst.attrs.accumulate == Accumulate::automatic && m.psum_written(dst.e.ptr[i]));
    return out;
  }

  /** Writes the validity of what `inst` wrote into the shadow (`valid` per element of slot `slot`). */
  void store(Machine& m, const Instruction& inst, int slot, const std::vector<uint8_t>& valid, int32_t origin,
             const std::vector<uint8_t>* written_mask = nullptr) {
    const AccessPattern ap = m.kernel().view(inst, slot);
    const Elements e = m.resolve(inst, ap);
    const int64_t size = dtype_size(ap.dtype);
    bool any_invalid = false;
    for (int64_t i = 0; i < e.size(); ++i) {
      if ((written_mask && !(*written_mask)[i]) || !e.ptr[i]) continue;  // null: skipped (oob_mode=skip)
      any_invalid = any_invalid || !valid[i];
      for (int64_t b = 0; b < size; ++b) {
        size_t index = 0;
        if (ShadowBits* bits_of = bits(m, ap.storage, e.ptr[i] + b, index)) {
          bits_of->written.put(index, true);
          bits_of->valid.put(index, valid[i]);
        }
      }
    }
    if (!any_invalid) return;
    if (origin_of_[ap.storage] < 0) origin_of_[ap.storage] = origin;
    const StorageRole role = k_.storages[ap.storage].role;
    if (role == StorageRole::output || role == StorageRole::input) surfaced_at_[ap.storage] = int32_t(index_);
  }

  /** The first origin among the operands `inst` read. */
  static int32_t origin_of(const Views& v) {
    for (const View& view : v)
      if (view.origin >= 0) return view.origin;
    return -1;
  }

  /** Validity of a scalar-or-vector operand for partition p (immediates are valid). */
  static bool per_partition(const View& v, int64_t p) { return !v.present() || v.at(p, 0); }

  void propagate(Machine& m, const Instruction& inst, const Views& v, const std::vector<uint8_t>& accumulates) {
    const View& dst = v[0];
    const int64_t P = dst.e.partitions, F = dst.e.free;
    std::vector<uint8_t> out(dst.e.size(), 1);
    auto each = [&](auto&& valid_at) {
      for (int64_t p = 0; p < P; ++p)
        for (int64_t f = 0; f < F; ++f) out[p * F + f] = valid_at(p, f);
    };
    const int32_t origin = origin_of(v);
    const Attributes& at = inst.attrs;
    switch (inst.opcode) {
      case Opcode::dma_copy:
      case Opcode::tensor_copy:
      case Opcode::reciprocal: out = v[1].valid; break;
      case Opcode::nc_transpose:
        for (int64_t p = 0; p < v[1].e.partitions; ++p)
          for (int64_t f = 0; f < v[1].e.free; ++f) out[f * F + p] = v[1].at(p, f);
        break;
      case Opcode::tensor_tensor: each([&](int64_t p, int64_t f) { return v[1].at(p, f) && v[2].at(p, f); }); break;
      case Opcode::tensor_scalar:
        each([&](int64_t p, int64_t f) {
          return v[1].at(p, f) && per_partition(v[2], p) && per_partition(v[3], p);
        });
        break;
      case Opcode::scalar_tensor_tensor:
        each([&](int64_t p, int64_t f) {
          return v[1].at(p, f) && per_partition(v[2], p) && v[3].at(p, f);
        });
        break;
      case Opcode::activation: {
        each([&](int64_t p, int64_t f) {
          return v[1].at(p, f) && per_partition(v[2], p) && per_partition(v[3], p);
        });
        const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
        accumulate(scalar_acc_invalid_, at.reduce_cmd, out, P, F, reducing);
        if (inst.operands[4].is_tensor()) store_accumulator(m, inst, 4, scalar_acc_invalid_, origin);
        break;
      }
      case Opcode::tensor_reduce: {
        const int64_t run = reference::reduce_run(m.kernel(), inst);
        each([&](int64_t p, int64_t o) {
          for (int64_t i = 0; i < run; ++i)
            if (!v[1].at(p, o * run + i)) return false;
          return true;
        });
        break;
      }
      case Opcode::tensor_scalar_reduce:
        each([&](int64_t p, int64_t f) { return v[1].at(p, f) && per_partition(v[2], p); });
        accumulate(vector_acc_invalid_, ReduceCmd::reset_reduce, out, P, F, true);
        if (inst.operands[3].is_tensor()) store_accumulator(m, inst, 3, vector_acc_invalid_, origin);
        break;
      case Opcode::nc_matmul: matmul(inst, v, accumulates, out, P, F); break;
      case Opcode::memset:
      case Opcode::iota:
      case Opcode::register_store: break;
      case Opcode::affine_select:
        for (int64_t c = 0; c < P; ++c) {
          const std::vector<int64_t> values = reference::affine_values(m.kernel().rare(inst), c, F);
          for (int64_t f = 0; f < F; ++f) out[c * F + f] = !alu_apply_int(at.cmp_op, values[f], 0) || v[1].at(c, f);
        }
        break;
      case Opcode::bn_stats:
      case Opcode::bn_aggr:
      case Opcode::max8: each([&](int64_t p, int64_t) { return v[1].row(p); }); break;
      case Opcode::nc_find_index8: each([&](int64_t p, int64_t) { return v[1].row(p) && v[2].row(p); }); break;
      case Opcode::tensor_partition_reduce: each([&](int64_t, int64_t f) { return v[1].column(f); }); break;
      case Opcode::tensor_tensor_scan:
        for (int64_t p = 0; p < P; ++p) {
          bool valid = per_partition(v[3], p);
          for (int64_t f = 0; f < F; ++f) out[p * F + f] = valid = valid && v[1].at(p, f) && v[2].at(p, f);
        }
        break;
      case Opcode::tensor_copy_predicated: {
        // Writes only the selected elements; a scalar source is valid.
        std::vector<uint8_t> selected(dst.e.size());
        for (int64_t i = 0; i < dst.e.size(); ++i) {
          selected[i] = v[2].valid[i] &&
                        (numerics::load_int(v[2].e.dtype, v[2].e.ptr[i]) != 0) != at.reverse_pred;
          out[i] = !v[1].present() || v[1].valid[i];
        }
        // An invalid predicate leaves the element's fate unknown: it is written, invalid.
        for (int64_t i = 0; i < dst.e.size(); ++i)
          if (!v[2].valid[i]) selected[i] = 1, out[i] = 0;
        store(m, inst, 0, out, origin, &selected);
        return;
      }
      case Opcode::select_reduce: {
        for (int64_t p = 0; p < P; ++p)
          for (int64_t f = 0; f < F; ++f) {
            const bool take = (v[1].e.get_int(p, f) != 0) != at.reverse_pred;
            out[p * F + f] = v[1].at(p, f) && (take ? v[2].at(p, f) : per_partition(v[3], p));
          }
        const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
        accumulate(vector_acc_invalid_, at.reduce_cmd, out, P, F, reducing);
        if (inst.operands[4].is_tensor()) store_accumulator(m, inst, 4, vector_acc_invalid_, origin);
        break;
      }
      case Opcode::range_select:
        each([&](int64_t p, int64_t f) {
          return v[1].at(p, f) && per_partition(v[2], p) && per_partition(v[3], p);
        });
        accumulate(vector_acc_invalid_, at.reduce_cmd, out, P, F,
                   at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce);
        if (inst.operands[4].is_tensor()) store_accumulator(m, inst, 4, vector_acc_invalid_, origin);
        break;
      case Opcode::nc_n_gather:  // any element of the partition may be the one gathered
        each([&](int64_t p, int64_t f) { return v[2].at(p, f) && v[1].row(p); });
        break;
      case Opcode::local_gather: {  // any element of the row, by the valid indices of the core
        const int64_t group = 16, per_index = m.kernel().rare(inst).step;
        each([&](int64_t p, int64_t f) {
          const int64_t j = f / per_index;
          return v[1].row(p) && v[2].at(p / group * group + j % group, j / group);
        });
        break;
      }
      case Opcode::dma_compute:
        for (int64_t i = 0; i < dst.e.size(); ++i)
          for (int slot = 1; slot < kMaxSlots && v[slot].present(); ++slot) out[i] = out[i] && v[slot].valid[i];
        break;
      case Opcode::nc_match_replace8: {  // which element is replaced depends on the whole row and on vals
        each([&](int64_t p, int64_t) { return v[1].row(p) && v[2].row(p); });
        if (inst.operands[4].is_tensor()) {  // a write-only slot: resolved here, not among the read views
          const Elements idx = m.operand(inst, 4);
          std::vector<uint8_t> indices(idx.size());
          for (int64_t p = 0; p < idx.partitions; ++p)
            for (int64_t f = 0; f < idx.free; ++f) indices[p * idx.free + f] = v[1].row(p) && v[2].row(p);
          store(m, inst, 4, indices, origin);
        }
        break;
      }
      case Opcode::nc_stream_shuffle: {  // a quadrant's lane takes another lane's row; 255 keeps it
        const int64_t quadrant = k_.config().partition_quadrant;
        std::vector<uint8_t> written(dst.e.size(), 0);
        for (int64_t p = 0; p < P; ++p) {
          const int32_t lane = m.kernel().rare(inst).lanes[p % quadrant];
          if (lane == kShuffleKeepLane) continue;
          const int64_t from = (p / quadrant) * quadrant + lane;
          for (int64_t f = 0; f < F; ++f) {
            written[p * F + f] = 1;
            out[p * F + f] = from < v[1].e.partitions && v[1].at(from, f);
          }
        }
        store(m, inst, 0, out, origin, &written);
        return;
      }
      case Opcode::nonzero_with_count: {  // the first partition of each GpSimd core's group
        const int64_t group = k_.config().gpsimd_core_partitions;
        std::vector<uint8_t> written(dst.e.size(), 0);
        for (int64_t p = 0; p < P; p += group)
          for (int64_t f = 0; f < F; ++f) {
            written[p * F + f] = 1;
            out[p * F + f] = p < v[1].e.partitions && v[1].row(p);
          }
        store(m, inst, 0, out, origin, &written);
        return;
      }
      default: internal_check(false, "the sanitizer has no propagation rule for this opcode");
    }
    if (inst.attrs.oob_skip) {
      // A DMA with oob_mode=skip leaves a destination element alone when its source element is out
      // of bounds (a null element of the source's view).
      std::vector<uint8_t> transferred(dst.e.size(), 1);
      for (int slot = 1; slot < kMaxSlots && v[slot].present(); ++slot)
        if (v[slot].e.size() == dst.e.size())
          for (int64_t i = 0; i < dst.e.size(); ++i) transferred[i] = transferred[i] && v[slot].e.ptr[i];
      store(m, inst, 0, out, origin, &transferred);
      return;
    }
    store(m, inst, 0, out, origin);
  }

  void matmul(const Instruction& inst, const Views& v, const std::vector<uint8_t>& accumulates,
              std::vector<uint8_t>& out, int64_t M, int64_t N) {
    const View &st = v[1], &mv = v[2], &dst = v[0];
    const int64_t K = st.e.partitions;
    if (inst.attrs.is_transpose) {
      // Products with a zero moving factor are skipped (an identity moves values through).
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          bool valid = true;
          for (int64_t k = 0; k < K && valid; ++k)
            valid = mv.at(k, n) && (st.at(k, m) || mv.e.get(k, n) == 0.0f);
          out[m * N + n] = valid;
        }
      return;
    }
    std::vector<uint8_t> columns_st(M), columns_mv(N);
    for (int64_t m = 0; m < M; ++m) columns_st[m] = st.column(m);
    for (int64_t n = 0; n < N; ++n) columns_mv[n] = mv.column(n);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        out[m * N + n] = columns_st[m] && columns_mv[n] && (!accumulates[m * N + n] || dst.at(m, n));
  }

  /** Follows an engine accumulator's validity per partition (1.0 = invalid), as its reduce command
   * folds this instruction's rows: the same command semantics as the values, with max as "or". */
  static void accumulate(std::vector<float>& acc_invalid, ReduceCmd cmd, const std::vector<uint8_t>& rows_valid,
                         int64_t P, int64_t F, bool has_partial) {
    for (int64_t p = 0; p < P; ++p) {
      const bool row = std::all_of(rows_valid.begin() + p * F, rows_valid.begin() + (p + 1) * F,
                                   [](uint8_t x) { return x; });
      reference::apply_reduce_cmd(cmd, AluOp::maximum, 0.0f, acc_invalid, p, row ? 0.0f : 1.0f, has_partial);
    }
  }

  /** reduce_res: column 0 of each partition gets the accumulator. */
  void store_accumulator(Machine& m, const Instruction& inst, int slot, const std::vector<float>& acc_invalid,
                         int32_t origin) {
    const Elements e = m.operand(inst, slot);
    std::vector<uint8_t> valid(e.size(), 1), written(e.size(), 0);
    for (int64_t p = 0; p < e.partitions; ++p) {
      valid[p * e.free] = acc_invalid[p] == 0.0f;
      written[p * e.free] = 1;
    }
    store(m, inst, slot, valid, origin, &written);
  }

  /** Coordinates of the element at `p` in its tensor, as "[i, j, ...]". */
  std::string coordinates(const Machine& m, StorageId id, const uint8_t* p) const {
    const Storage& s = k_.storages[id];
    const int64_t size = dtype_size(s.dtype);
    int64_t element = 0;
    if (s.on_chip()) {
      const uint8_t* base = m.memory(s.buffer);
      const int64_t pitch = m.row_pitch(s.buffer);
      const int64_t offset = p - base;
      element = (offset / pitch - s.address->partition) * s.shape.inner_elements() +
                (offset % pitch - s.address->byte_offset) / size;
    } else {
      element = (p - m.hbm(id)) / size;
    }
    std::vector<int64_t> index(s.shape.rank(), 0);
    for (int d = s.shape.rank() - 1; d >= 0; --d) {
      index[d] = element % s.shape[d];
      element /= s.shape[d];
    }
    return fmt::format("[{}]", fmt::join(index, ", "));
  }

  [[noreturn]] void report(int32_t origin_id, const std::string& consequence) const {
    internal_check(origin_id >= 0 && origin_id < int32_t(origins_.size()), "invalid value without an origin");
    const Origin& o = origins_[origin_id];
    const Instruction& inst = k_.instructions[o.instruction];
    const Storage& s = k_.storages[o.storage];
    throw KernelError(
        fmt::format("{} reads uninitialized memory: {}{} was never written ({} of the {} elements read here; '{}' "
                    "was allocated at {}), and {}",
                    opcode_name(inst.opcode), s.name, o.element, o.unwritten, o.elements, s.name,
                    k_.location(s.loc).str(), consequence),
        k_.location(inst.loc), to_string(k_, inst),
        "SBUF, PSUM and HBM outputs and scratch are not zeroed: a read before any write sees whatever the memory "
        "held (nikki's sentinels: NaN, or 4 for integers)",
        fmt::format("write '{}' before reading it (nl.zeros or nisa.memset initialize a tile), or compute only on "
                    "the part the kernel wrote",
                    s.name));
  }

  const Kernel& k_;
  std::vector<std::vector<StorageId>> fresh_;  // scratch tensors whose live range begins at instruction i
  ShadowBits sbuf_, psum_;
  std::vector<ShadowBits> hbm_;  // outputs, writable inputs and HBM scratch; empty for other inputs
  std::vector<Origin> origins_;
  std::unordered_map<uint64_t, int32_t> origin_ids_;  // (instruction, storage) -> origin
  std::vector<int32_t> origin_of_;    // per storage: the origin of the invalid values it holds, or -1
  std::vector<int32_t> surfaced_at_;  // per output: the last instruction that wrote invalid values, or -1
  std::vector<float> scalar_acc_invalid_, vector_acc_invalid_;  // engine accumulators, per partition
  size_t index_ = 0;                  // the instruction being executed
};

}  // namespace nikki::runtime
