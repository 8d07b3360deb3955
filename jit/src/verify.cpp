#include "nikki/jit/verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "nikki/ir_attributes.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/layout.hpp"

namespace nikki::jit {

namespace {

std::string shape_of(const AccessPattern& ap) { return ap.shape().str(); }

std::string strides_of(const AccessPattern& ap) {
  std::string s = "[";
  for (int d = 0; d < ap.rank; ++d) s += fmt::format("{}{}", d ? ", " : "", ap.dims[d].stride);
  return s + "]";
}

/**
 * Free dims an engine needs to walk a view: size-1 dims dropped, and an outer dim merged into the
 * next inner one when it continues it (outer stride == inner stride * inner count).
 */
int merged_free_dims(const AccessPattern& ap) {
  int n = 0;
  Dim inner{};
  for (int d = ap.rank - 1; d >= 1; --d) {
    const Dim& dim = ap.dims[d];
    if (dim.count == 1) continue;
    if (n > 0 && dim.stride == inner.stride * inner.count) {
      inner.count *= dim.count;
      continue;
    }
    inner = dim;
    ++n;
  }
  return n;
}

bool is_comparison(AluOp op) {
  return op == AluOp::equal || op == AluOp::not_equal || op == AluOp::greater ||
         op == AluOp::greater_equal || op == AluOp::less || op == AluOp::less_equal;
}

/** Checks one kernel; each method covers one family of rules. */
class Verifier {
 public:
  explicit Verifier(const Kernel& k) : k_(k), t_(k.config()) {}

  void run() {
    for (StorageId id = 0; id < k_.storages.size(); ++id) check_storage(id);
    check_hbm_total();
    std::vector<bool> written(k_.storages.size(), false);
    std::vector<bool> register_set(k_.num_registers, false);
    int loop_depth = 0;
    for (const Instruction& inst : k_.instructions) {
      load_views(inst);
      check_instruction(inst);
      check_registers_set(inst, register_set);
      for (int s = 0; s < inst.spec().num_slots; ++s)
        if (inst.operands[s].is_tensor() && inst.access(s) != Access::read) written[inst.operands[s].storage()] = true;
      if (inst.opcode == Opcode::loop_begin) ++loop_depth;
      if (inst.opcode == Opcode::loop_end) --loop_depth;
      internal_check(loop_depth >= 0, "loop_end without loop_begin");
    }
    internal_check(loop_depth == 0, "loop_begin without loop_end");
    // A program instance that meets others (core_barrier, sendrecv) shares its outputs with them,
    // and one of them may be the one that writes an output (nki-library: `if shard_id == 0`).
    const bool meets = std::any_of(k_.instructions.begin(), k_.instructions.end(),
                                   [](const Instruction& inst) { return is_meeting(inst.opcode); });
    for (StorageId id : k_.outputs)
      if (!written[id] && !meets) {
        const Storage& s = k_.storage(id);
        throw KernelError(fmt::format("output tensor '{}' is never written", s.name), k_.location(s.loc),
                          "return", "every returned tensor must be written by the kernel",
                          "write it with nisa.dma_copy (or nl.store) before returning it");
      }
  }

 private:
  // --- the instruction being checked ------------------------------------------------------
  /** Materializes the views of `inst`'s tensor operands once (the rules read them many times). */
  void load_views(const Instruction& inst) {
    for (int s = 0; s < kMaxSlots; ++s) views_[s] = inst.operands[s].is_tensor() ? k_.view(inst.operands[s]) : AccessPattern{};
  }
  /** The view of operand `slot` of the instruction being checked. */
  const AccessPattern& view(int slot) const { return views_[slot]; }

  // --- reporting --------------------------------------------------------------------------
  [[noreturn]] void fail(const Instruction& inst, std::string what, std::string limit = {},
                         std::string hint = {}) const {
    throw KernelError(fmt::format("{}: {}", opcode_name(inst.opcode), what), k_.location(inst.loc),
                      to_string(k_, inst), std::move(limit), std::move(hint));
  }
  std::string slot_name(const Instruction& inst, int slot) const { return std::string(inst.spec().slots[slot].name); }
  const Storage& storage_of(const AccessPattern& ap) const { return k_.storage(ap.storage); }
  std::string describe(const Instruction& inst, int slot) const {
    const AccessPattern& ap = view(slot);
    return fmt::format("{} ('{}' {} {}{})", slot_name(inst, slot), storage_of(ap).name,
                       buffer_name(storage_of(ap).buffer), info(ap.dtype).short_name, shape_of(ap));
  }
  std::string target_name() const { return fmt::format("{} ({})", t_.name, t_.core); }

  // --- registers ----------------------------------------------------------------------------
  /** A register read (an operand, a loop bound or a runtime offset) must follow, in program order,
   * an instruction that sets it: registers hold no defined value before. Registers set inside a
   * runtime loop count as set after it. */
  void check_registers_set(const Instruction& inst, std::vector<bool>& set) const {
    auto require = [&](RegisterId r, const std::string& role) {
      internal_check(r >= 0 && r < k_.num_registers, "register id out of range");
      if (!set[r])
        fail(inst, fmt::format("register r{} ({}) is read but never set before this instruction", r, role),
             "a register has no value until an instruction writes it",
             "give it a value first: nisa.register_alloc(value), nisa.register_move or nisa.register_load");
    };
    for (int s = 0; s < inst.spec().num_slots; ++s) {
      const Operand& o = inst.operands[s];
      if (o.is_reg() && inst.access(s) != Access::write) require(o.reg(), slot_name(inst, s));
      const Indirection* ind = o.is_tensor() ? k_.indirection(o) : nullptr;
      if (ind && ind->scalar_register >= 0)
        require(ind->scalar_register, fmt::format("the runtime offset of {}", slot_name(inst, s)));
    }
    for (int s = 0; s < inst.spec().num_slots; ++s)
      if (inst.operands[s].is_reg() && inst.access(s) != Access::read) set[inst.operands[s].reg()] = true;
  }

  // --- storages -----------------------------------------------------------------------------
  void check_storage(StorageId id) {
    const Storage& s = k_.storage(id);
    const SourceLocation& where = k_.location(s.loc);
    if (!s.on_chip()) return check_hbm_storage(s);
    if (s.shape.rank() < 2)
      throw KernelError(fmt::format("{} tensor '{}' has shape {}; on-chip tensors need a partition dim and a free dim",
                                    buffer_name(s.buffer), s.name, s.shape.str()),
                        where, "ndarray", "SBUF/PSUM tensors are at least 2-D (partition dim first)",
                        fmt::format("use a shape such as ({}, 1)", s.shape.rank() ? s.shape[0] : 1));
    if (s.partitions() > t_.num_partitions)
      throw KernelError(fmt::format("number of partitions {} of tensor '{}' exceeds the architecture limit of {}",
                                    s.partitions(), s.name, t_.num_partitions),
                        where, "ndarray", fmt::format("pmax = {} partitions on {}", t_.num_partitions, target_name()),
                        "tile the partition dim into chunks of at most nl.tile_size.pmax");
    const int64_t capacity = s.buffer == Buffer::sbuf ? t_.sbuf_bytes_per_partition : t_.psum_bytes_per_partition();
    if (s.partition_bytes() > capacity)
      throw KernelError(fmt::format("tensor '{}' needs {} bytes per partition but {} has {} bytes per partition",
                                    s.name, s.partition_bytes(), buffer_name(s.buffer), capacity),
                        where, "ndarray",
                        fmt::format("{} capacity per partition on {}", buffer_name(s.buffer), target_name()),
                        "tile the free dim into smaller tensors");
    if (s.user_address) {
      const Address& a = *s.address;
      if (s.buffer == Buffer::psum && a.byte_offset % t_.psum_bank_bytes != 0)
        throw KernelError(fmt::format("PSUM tensor '{}' at address byte {} does not start at a bank boundary",
                                      s.name, a.byte_offset),
                          where, "ndarray", fmt::format("PSUM banks are {} bytes per partition", t_.psum_bank_bytes),
                          fmt::format("use address=(0, k * {}) for bank k", t_.psum_bank_bytes));
      if (a.partition + s.partitions() > t_.num_partitions || a.byte_offset + s.partition_bytes() > capacity)
        throw KernelError(fmt::format("tensor '{}' at address ({}, {}) spans partitions [{}, {}) and bytes [{}, {}) "
                                      "of each partition, past the end of {}",
                                      s.name, a.partition, a.byte_offset, a.partition, a.partition + s.partitions(),
                                      a.byte_offset, a.byte_offset + s.partition_bytes(), buffer_name(s.buffer)),
                          where, "ndarray",
                          fmt::format("{} has {} partitions x {} bytes per partition on {}", buffer_name(s.buffer),
                                      t_.num_partitions, capacity, target_name()),
                          "choose an address inside the buffer, or omit address= and let nikki place the tensor");
      check_start_partition_rule(a.partition, s.partitions(), [&](std::string what, std::string limit,
                                                                  std::string hint) {
        throw KernelError(fmt::format("tensor '{}': {}", s.name, what), where, "ndarray", limit,
                          fmt::format("{} (address=(partition, byte))", hint));
      });
    }
  }

  std::string hbm_capacity_text() const {
    return fmt::format("{} of device memory (HBM) per {} chip, shared by its {} NeuronCores",
                       bytes_text(t_.hbm_bytes_per_chip), t_.name, t_.cores_per_chip);
  }

  /** An HBM tensor must fit the chip's device memory. */
  void check_hbm_storage(const Storage& s) const {
    if (s.total_bytes() <= t_.hbm_bytes_per_chip) return;
    throw KernelError(fmt::format("{} tensor '{}' of shape {} {} needs {}, more than the device memory of {}",
                                  s.role == StorageRole::input ? "input" : buffer_name(s.buffer), s.name,
                                  s.shape.str(), dtype_name(s.dtype), bytes_text(s.total_bytes()), target_name()),
                      k_.location(s.loc), s.role == StorageRole::input ? "input" : "ndarray", hbm_capacity_text(),
                      "split the work into launches on smaller tensors");
  }

  /** All HBM tensors of a launch exist at once, so together they must fit the device memory too. */
  void check_hbm_total() const {
    int64_t total = 0;
    std::vector<StorageId> hbm;
    for (StorageId id = 0; id < k_.storages.size(); ++id)
      if (!k_.storage(id).on_chip()) {
        hbm.push_back(id);
        total += k_.storage(id).total_bytes();  // each is within the capacity: the sum cannot overflow
      }
    if (total <= t_.hbm_bytes_per_chip) return;
    std::stable_sort(hbm.begin(), hbm.end(), [&](StorageId a, StorageId b) {
      return k_.storage(a).total_bytes() > k_.storage(b).total_bytes();
    });
    std::string largest;
    for (size_t i = 0; i < hbm.size() && i < 5; ++i) {
      const Storage& s = k_.storage(hbm[i]);
      largest += fmt::format("\n    '{}' {} {}{} {} (created at {})", s.name, buffer_name(s.buffer),
                             info(s.dtype).short_name, s.shape.str(), bytes_text(s.total_bytes()),
                             k_.location(s.loc).str());
    }
    const Storage& first = k_.storage(hbm.front());
    throw KernelError(fmt::format("the HBM tensors of kernel '{}' need more than the device memory of {} together"
                                  "\n  largest HBM tensors:{}",
                                  k_.name, target_name(), largest),
                      k_.location(first.loc), "ndarray", hbm_capacity_text(),
                      "split the work into launches on smaller tensors, or reuse scratch tensors");
  }

  template <class Fail>
  void check_start_partition_rule(int64_t start, int64_t count, Fail&& fail_with) const {
    const int64_t q = t_.partition_quadrant;
    bool ok;
    if (count > 2 * q) ok = start == 0;
    else if (count > q) ok = start == 0 || start == 2 * q;
    else ok = start % q == 0;
    if (!ok)
      fail_with(fmt::format("an access of {} partitions cannot start at partition {}", count, start),
                fmt::format("start partition must be 0 for > {} partitions, 0 or {} for {}-{}, a multiple of {} "
                            "for <= {}",
                            2 * q, 2 * q, q + 1, 2 * q, q, q),
                count > 2 * q ? std::string("start the access at partition 0")
                : count > q   ? fmt::format("start the access at partition 0 or {}", 2 * q)
                              : fmt::format("start the access at a multiple of {}", q));
  }

  // --- operands -----------------------------------------------------------------------------
  void check_index_tensor(const Instruction& inst, const AccessPattern& idx, const char* role) const {
    const Storage& s = storage_of(idx);
    if (!is_integer(idx.dtype) || idx.dtype == DType::bool_)
      fail(inst, fmt::format("{} tensor '{}' has dtype {}; runtime offsets are integers", role, s.name,
                             dtype_name(idx.dtype)),
           {}, "store offsets in an int32 or uint32 tensor");
    if (s.buffer == Buffer::psum)
      fail(inst, fmt::format("{} tensor '{}' is in PSUM", role, s.name), "runtime offsets are read from SBUF or HBM",
           "copy the offsets to SBUF first");
    check_bounds(inst, idx, role);
  }

  void check_bounds(const Instruction& inst, const AccessPattern& ap, const std::string& role) const {
    const Storage& s = storage_of(ap);
    if ((s.total_bytes() % dtype_size(ap.dtype)) != 0)
      fail(inst, fmt::format("{} views tensor '{}' ({} bytes) as {}, whose size does not divide the tensor's bytes",
                             role, s.name, s.total_bytes(), dtype_name(ap.dtype)),
           fmt::format("a view's dtype size ({} bytes) must divide the tensor's size", dtype_size(ap.dtype)),
           "reinterpret with a dtype whose size divides the tensor's bytes");
    if (s.on_chip() && row_elements(s, ap.dtype) == 0)  // element e sits on partition e / row_elements
      fail(inst, fmt::format("{} views tensor '{}' as {}, but a partition row of it holds only {} bytes", role,
                             s.name, dtype_name(ap.dtype), s.partition_bytes()),
           fmt::format("an on-chip view's element ({} bytes) must fit in one partition row", dtype_size(ap.dtype)),
           "view the tensor as a dtype no larger than its row, or give it more elements per partition");
    const int64_t n = storage_elements(s, ap.dtype);
    if (n == 0)
      fail(inst, fmt::format("{} accesses tensor '{}' of shape {}, which has no elements", role, s.name,
                             s.shape.str()),
           "an access reads or writes at least one element",
           "skip the access when the tensor is empty (its shape is known while tracing)");
    if (ap.is_dynamic()) return;  // checked at run time, when the offsets are known
    // Checked: raw IR (C++ builders, program files) may hold patterns no view function validated.
    const std::optional<LinearExtent> e = checked_linear_extent(ap);
    if (!e || e->first < 0 || e->last >= n)
      fail(inst, e ? fmt::format("out-of-bound access for tensor '{}' ({}): elements [{}, {}] of a tensor with {} "
                                 "elements", s.name, role, e->first, e->last, n)
                   : fmt::format("out-of-bound access for tensor '{}' ({}): the access pattern's offsets overflow a "
                                 "64-bit integer", s.name, role),
           fmt::format("tensor '{}' has shape {}", s.name, s.shape.str()),
           "check the access pattern's offset, strides and counts");
  }

  /** Generic checks for every tensor operand; engine operands also get the tile rules. */
  void check_operand(const Instruction& inst, int slot) const {
    const Operand& o = inst.operands[slot];
    if (!o.is_tensor()) return;
    const AccessPattern& ap = view(slot);
    const Storage& s = storage_of(ap);
    check_bounds(inst, ap, slot_name(inst, slot));
    if (inst.access(slot) != Access::read && s.role == StorageRole::input && !s.writable_input)
      fail(inst, fmt::format("cannot write to kernel input '{}'", s.name), "kernel parameters are immutable",
           "allocate an output with nl.ndarray(..., buffer=nl.shared_hbm) and write that, or declare the "
           "parameter mutable (nt.mutable_tensor)");
    if (const Indirection* ind = ap.indirection.get()) {
      if (ind->scalar_tensor) check_index_tensor(inst, *ind->scalar_tensor, "scalar_offset");
      if (ind->scalar_register >= k_.num_registers) internal_check(false, "register id out of range");
      if (ind->vector_offset) {
        if (inst.opcode != Opcode::dma_copy && inst.opcode != Opcode::dma_compute)
          fail(inst, fmt::format("{} uses a vector_offset (gather/scatter) access", slot_name(inst, slot)),
               "per-partition vector offsets are only supported by DMA instructions", "gather with nisa.dma_copy");
        if (!is_hbm(s.buffer))
          fail(inst, fmt::format("vector_offset indexes tensor '{}' in {}", s.name, buffer_name(s.buffer)),
               "the gathered/scattered tensor must be in HBM",
               "gather from (or scatter to) an HBM tensor; move rows within SBUF with static views");
        const AccessPattern& idx = *ind->vector_offset;
        check_index_tensor(inst, idx, "vector_offset");
        if (storage_of(idx).buffer != Buffer::sbuf)
          fail(inst, fmt::format("vector_offset index tensor '{}' is in {}", storage_of(idx).name,
                                 buffer_name(storage_of(idx).buffer)),
               "the per-partition indices of a gather/scatter are read from SBUF",
               "load the indices into a (P, 1) SBUF tile with nisa.dma_copy first");
        if (idx.rank == 0 || idx.dims[0].count != ap.dims[0].count || idx.inner_elements() != 1)
          fail(inst, fmt::format("vector_offset has shape {} but the access needs one index per row ({}, 1)",
                                 shape_of(idx), ap.dims[0].count),
               "vector_offset holds one row index per partition of the access: shape (P, 1)",
               fmt::format("pass a ({}, 1) index tile", ap.dims[0].count));
      }
    }
    if (inst.engine == Engine::dma || inst.spec().is_control) {
      if (inst.engine == Engine::dma && s.buffer == Buffer::psum)
        fail(inst, fmt::format("{} is in PSUM", describe(inst, slot)), "DMA moves data between HBM and SBUF only",
             "copy PSUM to SBUF with nisa.tensor_copy first");
      return;
    }
    // Compute engines.
    if (!s.on_chip())
      fail(inst, fmt::format("{} is in {}; compute engines read and write SBUF/PSUM only", describe(inst, slot),
                             buffer_name(s.buffer)),
           {}, "load the data into SBUF with nisa.dma_copy first");
    if (inst.engine == Engine::gpsimd && s.buffer == Buffer::psum)
      fail(inst, fmt::format("{} is in PSUM, which the GpSimd engine cannot access", describe(inst, slot)),
           "the GpSimd engine reads and writes SBUF only",
           inst.spec().default_engine == Engine::gpsimd
               ? fmt::format("{} runs only on the GpSimd engine: allocate the tensor in SBUF (buffer=nl.sbuf)",
                             opcode_name(inst.opcode))
               : std::string("use the vector engine, or copy the data to SBUF"));
    const TileGeometry g = tile_geometry(s, ap);
    if (g.partitions > t_.num_partitions)
      fail(inst, fmt::format("{} partition dimension {} exceeds maximum {}", slot_name(inst, slot), g.partitions,
                             t_.num_partitions),
           fmt::format("pmax = {}", t_.num_partitions), "tile the partition dim");
    if (!g.partition_contiguous)
      fail(inst, fmt::format("{} steps over partitions with stride {}; engines access consecutive partitions",
                             slot_name(inst, slot), ap.dims[0].stride / std::max<int64_t>(1, row_elements(s, ap.dtype))),
           "the first dim of an engine operand is the partition dim, with step 1",
           "do not slice the partition dim with a step, or permute another dim first");
    if (!g.rows_in_bounds)
      fail(inst, fmt::format("{} free-dim access runs outside its partition row", slot_name(inst, slot)),
           fmt::format("each partition of '{}' holds {} elements", s.name, row_elements(s, ap.dtype)),
           "keep dim 0 as the partition dim and the other dims within a row");
    const int64_t max_free = s.buffer == Buffer::sbuf ? t_.max_free_elems_sbuf : t_.max_free_elems_psum;
    if (g.free_elements > max_free)
      fail(inst, fmt::format("{} has {} elements per partition", slot_name(inst, slot), g.free_elements),
           fmt::format("at most {} elements per partition from {}", max_free, buffer_name(s.buffer)),
           "split the instruction along the free dim");
    const int free_dims = merged_free_dims(ap);
    if (free_dims > static_cast<int>(t_.max_access_dims) - 1)
      fail(inst, fmt::format("{} {} needs {} free dims in its access pattern (strides {})", slot_name(inst, slot),
                             shape_of(ap), free_dims, strides_of(ap)),
           fmt::format("an engine access pattern has a partition dim and at most {} free dims on {}",
                       t_.max_access_dims - 1, target_name()),
           "copy the data into a contiguous tile first, or split the instruction along an outer dim");
    int64_t start = g.first_partition + (s.address ? s.address->partition : 0);
    check_start_partition_rule(start, g.partitions, [&](std::string what, std::string limit, std::string hint) {
      fail(inst, fmt::format("{}: {}", slot_name(inst, slot), what), limit, hint);
    });
  }

  // --- shape helpers ------------------------------------------------------------------------
  TileGeometry geom(const Instruction& inst, int slot) const {
    const AccessPattern& ap = view(slot);
    return tile_geometry(storage_of(ap), ap);
  }
  void same_partitions(const Instruction& inst, int a, int b) const {
    if (geom(inst, a).partitions != geom(inst, b).partitions)
      fail(inst, fmt::format("number of partitions mismatch: {} has {}, {} has {}", describe(inst, a),
                             geom(inst, a).partitions, describe(inst, b), geom(inst, b).partitions),
           "operands must span the same partitions",
           "slice the operands to the same partition range (the partition dim does not broadcast)");
  }
  void same_tile(const Instruction& inst, int a, int b) const {
    same_partitions(inst, a, b);
    if (geom(inst, a).free_elements != geom(inst, b).free_elements)
      fail(inst, fmt::format("elements per partition mismatch: {} has {}, {} has {}", describe(inst, a),
                             geom(inst, a).free_elements, describe(inst, b), geom(inst, b).free_elements),
           "operands must have the same number of elements per partition",
           "binary operands do not broadcast; use tensor_scalar for a [P, 1] operand");
  }
  /** A scalar-or-vector operand: an immediate, or a [P, 1] tile matching `data`'s partitions. */
  void per_partition(const Instruction& inst, int slot, int data_slot, bool require_fp32) const {
    const Operand& o = inst.operands[slot];
    if (!o.is_tensor()) return;
    TileGeometry g = geom(inst, slot), d = geom(inst, data_slot);
    if (g.free_elements != 1 || g.partitions != d.partitions)
      fail(inst, fmt::format("{} must be a scalar or a [{}, 1] vector, got shape {}", slot_name(inst, slot),
                             d.partitions, shape_of(view(slot))),
           "per-partition operands have one element per partition",
           fmt::format("pass an immediate or a [{}, 1] tile", d.partitions));
    if (require_fp32 && o.dtype() != DType::float32)
      fail(inst, fmt::format("{} has dtype {}; a vector {} must be float32", slot_name(inst, slot),
                             dtype_name(o.dtype()), slot_name(inst, slot)),
           {}, "keep per-partition scalars in a float32 [P, 1] tile");
  }
  void not_both_psum(const Instruction& inst, int a, int b) const {
    const Operand &oa = inst.operands[a], &ob = inst.operands[b];
    if (oa.is_tensor() && ob.is_tensor() && k_.storage(oa.storage()).buffer == Buffer::psum &&
        k_.storage(ob.storage()).buffer == Buffer::psum)
      fail(inst, fmt::format("{} and {} are both in PSUM", slot_name(inst, a), slot_name(inst, b)),
           "at most one tensor input may be read from PSUM", "copy one of them to SBUF first");
  }
  void engine_in(const Instruction& inst, std::initializer_list<Engine> allowed) const {
    for (Engine e : allowed)
      if (e == inst.engine) return;
    std::string names;
    for (Engine e : allowed) names += (names.empty() ? "" : ", ") + std::string(engine_name(e));
    fail(inst, fmt::format("cannot run on the {} engine", engine_name(inst.engine)),
         fmt::format("{} runs on: {}", opcode_name(inst.opcode), names),
         fmt::format("pass engine= one of: {} (or leave it unset)", names));
  }
  void integer_operands_for_bitvec(const Instruction& inst, AluOp op) const {
    if (!is_bitvec_op(op)) return;
    for (int s = 0; s < inst.spec().num_slots; ++s) {
      const Operand& o = inst.operands[s];
      if (o.is_tensor() && !is_integer(o.dtype()))
        fail(inst, fmt::format("bitwise operator {} needs integer tiles, but {} is {}", alu_op_name(op),
                               slot_name(inst, s), dtype_name(o.dtype())),
             "bitvec operators act on integer bit patterns", "use .view() to reinterpret float bits as an integer dtype");
      if (o.is_imm() && o.imm() != std::floor(o.imm()))
        fail(inst, fmt::format("bitwise operator {} needs an integer operand, but {} is {}", alu_op_name(op),
                               slot_name(inst, s), o.imm()),
             "bitvec operators act on integer bit patterns", "pass an integer immediate");
    }
    if (inst.engine != Engine::vector)
      fail(inst, fmt::format("bitwise operator {} cannot run on the {} engine", alu_op_name(op),
                             engine_name(inst.engine)),
           "bitvec operators run on the vector engine only", "pass engine=nki.isa.vector_engine (or leave it unset)");
  }
  /** An ALU operator attribute: its value, and its NKI parameter name for messages (opcodes.hpp). */
  struct OperatorAttr {
    AluOp op;
    std::string_view param;
  };
  OperatorAttr alu_attr(const Instruction& inst, Attr which) const {
    return {AluOp(attr_int(k_, inst, which)), inst.spec().nki_name(which)};
  }
  void hardware_alu_op(const Instruction& inst, Attr which) const {
    const auto [op, param] = alu_attr(inst, which);
    if (op == AluOp::divide || op == AluOp::mod || op == AluOp::fmod)
      fail(inst, fmt::format("{}={} is not a NeuronCore ALU operator", param, alu_op_name(op)), {},
           op == AluOp::divide ? "multiply by the reciprocal (nisa.reciprocal or activation(op=nl.reciprocal))"
                               : "compute the remainder with subtract/multiply");
    if (op == AluOp::average || op == AluOp::bypass)
      fail(inst, fmt::format("{}={} is not an element-wise operator", param, alu_op_name(op)),
           op == AluOp::average ? "nl.average is only a tensor_partition_reduce operator" : "",
           "use an arithmetic operator such as nl.add or nl.multiply");
    if (op == AluOp::arith_shift_right)
      fail(inst, fmt::format("{}=arith_shift_right: arithmetic shift right is not supported by the hardware", param),
           "the ALU shifts right logically only", "use nl.right_shift (logical)");
    if ((op == AluOp::abs_max || op == AluOp::abs_min) && t_.generation < 4)
      fail(inst, fmt::format("{}={} needs NeuronCore-v4; {} does not have it", param, alu_op_name(op), target_name()),
           "abs_max and abs_min exist on the NeuronCore-v4 vector engine only",
           "compute abs with nl.abs, then use nl.maximum / nl.minimum");
  }
  /** A unary operator ignores its operand, which NKI requires to be None or 0. */
  void unary_operand_is_zero(const Instruction& inst, AluOp op, int slot) const {
    if (!is_unary_op(op) || op == AluOp::invert) return;
    const Operand& o = inst.operands[slot];
    if (!(o.is_imm() && o.imm() == 0.0))
      fail(inst,
           fmt::format("{} is unary; {} must be 0, got {}", alu_op_name(op), slot_name(inst, slot),
                       o.is_imm() ? fmt::to_string(o.imm()) : "a tensor"),
           "the operand of a unary operator must be None or 0", fmt::format("pass {}=0.0", slot_name(inst, slot)));
  }
  void binary_op(const Instruction& inst, Attr which) const {
    hardware_alu_op(inst, which);
    const auto [op, param] = alu_attr(inst, which);
    if (is_unary_op(op))
      fail(inst, fmt::format("{}={} is a unary operator", param, alu_op_name(op)),
           fmt::format("{} of {} takes a binary operator", param, opcode_name(inst.opcode)),
           "apply unary operators with tensor_scalar (operand0=0) or activation");
  }
  void reduce_op(const Instruction& inst, Attr which) const {
    const auto [op, param] = alu_attr(inst, which);
    if (!is_reduce_op(op) || op == AluOp::abs_max || op == AluOp::abs_min)
      fail(inst, fmt::format("{}={} is not a legal reduction operator", param, alu_op_name(op)),
           "reductions use add, subtract, multiply, maximum, minimum, bitwise_and/or/xor or logical_and/or/xor",
           "reduce with one of the legal operators (apply other operators element-wise first)");
  }

  // --- instructions -------------------------------------------------------------------------
  void check_instruction(const Instruction& inst) {
    internal_check(!unused_attribute_set(k_, inst), "an instruction sets an attribute its opcode does not use");
    for (int s = 0; s < inst.spec().num_slots; ++s) check_operand(inst, s);
    switch (inst.opcode) {
      case Opcode::dma_copy: return check_dma_copy(inst);
      case Opcode::tensor_copy: return check_tensor_copy(inst);
      case Opcode::tensor_tensor: return check_tensor_tensor(inst);
      case Opcode::tensor_scalar: return check_tensor_scalar(inst);
      case Opcode::scalar_tensor_tensor: return check_scalar_tensor_tensor(inst);
      case Opcode::activation: return check_activation(inst);
      case Opcode::tensor_reduce: return check_tensor_reduce(inst);
      case Opcode::tensor_scalar_reduce: return check_tensor_scalar_reduce(inst);
      case Opcode::nc_matmul: return check_matmul(inst);
      case Opcode::nc_transpose: return check_transpose(inst);
      case Opcode::memset: return check_memset(inst);
      case Opcode::iota:
      case Opcode::affine_select: return check_affine(inst);
      case Opcode::bn_stats: return check_bn_stats(inst);
      case Opcode::bn_aggr: return check_bn_aggr(inst);
      case Opcode::tensor_tensor_scan: return check_scan(inst);
      case Opcode::reciprocal:
        engine_in(inst, {Engine::vector});
        return same_tile(inst, 0, 1);
      case Opcode::tensor_copy_predicated: return check_copy_predicated(inst);
      case Opcode::select_reduce: return check_select_reduce(inst);
      case Opcode::max8: return check_max8(inst);
      case Opcode::nc_find_index8: return check_find_index8(inst);
      case Opcode::tensor_partition_reduce: return check_partition_reduce(inst);
      case Opcode::nc_stream_shuffle: return check_stream_shuffle(inst);
      case Opcode::nc_match_replace8: return check_match_replace8(inst);
      case Opcode::range_select: return check_range_select(inst);
      case Opcode::nc_n_gather: return check_n_gather(inst);
      case Opcode::local_gather: return check_local_gather(inst);
      case Opcode::nonzero_with_count: return check_nonzero_with_count(inst);
      case Opcode::dma_compute: return check_dma_compute(inst);
      case Opcode::register_move:
      case Opcode::register_load:
      case Opcode::register_store:
      case Opcode::loop_begin:
      case Opcode::loop_end:
      case Opcode::device_print: return check_control(inst);
      case Opcode::core_barrier: return check_core_barrier(inst);
      case Opcode::sendrecv: return check_sendrecv(inst);
    }
  }

  void check_dma_copy(const Instruction& inst) const {
    const AccessPattern &dst = view(0), &src = view(1);
    if (dst.num_elements() != src.num_elements())
      fail(inst, fmt::format("dst has {} elements {} but src has {} {}", dst.num_elements(), shape_of(dst),
                             src.num_elements(), shape_of(src)),
           "dma_copy moves the same number of elements", "slice dst or src so their sizes agree");
  }

  void check_tensor_copy(const Instruction& inst) const {
    engine_in(inst, {Engine::vector, Engine::scalar, Engine::gpsimd});
    if (inst.engine == Engine::scalar && t_.generation < 3)
      fail(inst, fmt::format("tensor_copy cannot run on the scalar engine of {}", target_name()), {},
           "use nisa.activation(op=nl.copy) on the scalar engine, or the vector engine");
    same_tile(inst, 0, 1);
  }

  void check_tensor_tensor(const Instruction& inst) const {
    const AluOp op = inst.attrs.op0;
    binary_op(inst, Attr::op0);
    engine_in(inst, {Engine::vector, Engine::gpsimd});
    if (op == AluOp::power && inst.engine != Engine::gpsimd)
      fail(inst, fmt::format("op=power cannot run on the {} engine", engine_name(inst.engine)),
           "tensor_tensor computes nl.power on the GpSimd engine only", "pass engine=nki.isa.gpsimd_engine");
    integer_operands_for_bitvec(inst, op);
    same_tile(inst, 1, 2);
    same_tile(inst, 0, 1);
    not_both_psum(inst, 1, 2);
  }

  void check_tensor_scalar(const Instruction& inst) const {
    const Attributes& a = inst.attrs;
    engine_in(inst, {Engine::vector, Engine::scalar, Engine::gpsimd});
    hardware_alu_op(inst, Attr::op0);
    const bool two_ops = !inst.operands[3].is_none();
    if (two_ops) hardware_alu_op(inst, Attr::op1);
    if (two_ops && is_bitvec_op(a.op0) != is_bitvec_op(a.op1))
      fail(inst, fmt::format("op0={} is {} but op1={} is {}", alu_op_name(a.op0),
                             is_bitvec_op(a.op0) ? "bitwise" : "arithmetic", alu_op_name(a.op1),
                             is_bitvec_op(a.op1) ? "bitwise" : "arithmetic"),
           "op0 and op1 must both be bitwise or both be arithmetic operators",
           "split the computation into two tensor_scalar instructions");
    integer_operands_for_bitvec(inst, a.op0);
    if (two_ops) integer_operands_for_bitvec(inst, a.op1);
    if (inst.engine == Engine::scalar) {
      const bool ok = (a.op0 == AluOp::multiply && (!two_ops || a.op1 == AluOp::add)) ||
                      (a.op0 == AluOp::add && !two_ops);
      if (!ok)
        fail(inst, fmt::format("op0={}{} is not supported on the scalar engine", alu_op_name(a.op0),
                               two_ops ? fmt::format(", op1={}", alu_op_name(a.op1)) : std::string()),
             "the scalar engine runs tensor_scalar only as (multiply, add), (multiply) or (add)",
             "use the vector engine");
    }
    if (inst.engine == Engine::gpsimd && a.op0 != AluOp::rsqrt)
      fail(inst, fmt::format("op0={} is not supported on the GpSimd engine", alu_op_name(a.op0)),
           "tensor_scalar runs on the GpSimd engine only for rsqrt", "use the vector engine");
    for (int slot : {2, 3}) {
      AluOp op = slot == 2 ? a.op0 : a.op1;
      if (slot == 3 && !two_ops) continue;
      unary_operand_is_zero(inst, op, slot);
      // Any dtype: the engine casts inputs to fp32 for arithmetic (NKI's own kernels pass bf16
      // [P, 1] vectors) and reads bit patterns for bitvec operators.
      per_partition(inst, slot, 1, false);
    }
    same_tile(inst, 0, 1);
  }

  void check_scalar_tensor_tensor(const Instruction& inst) const {
    const Attributes& a = inst.attrs;
    engine_in(inst, {Engine::vector});
    binary_op(inst, Attr::op0);
    binary_op(inst, Attr::op1);
    if (is_bitvec_op(a.op0) || is_bitvec_op(a.op1))
      fail(inst, fmt::format("op0={}, op1={}: bitwise operators are not supported", alu_op_name(a.op0),
                             alu_op_name(a.op1)),
           "scalar_tensor_tensor takes arithmetic operators only",
           "use tensor_scalar and tensor_tensor for bitwise operators");
    // NKI documents every input as any dtype (cast to fp32 on the way in), operand0 included.
    per_partition(inst, 2, 1, false);
    same_tile(inst, 0, 1);
    same_tile(inst, 1, 3);
    not_both_psum(inst, 1, 3);
  }

  void check_activation(const Instruction& inst) const {
    const Attributes& a = inst.attrs;
    engine_in(inst, {Engine::scalar});
    same_tile(inst, 0, 1);
    const Operand& bias = inst.operands[2];
    if (bias.is_tensor()) {
      per_partition(inst, 2, 1, false);
      if (bias.dtype() == DType::tfloat32)
        fail(inst, fmt::format("bias has dtype {}", dtype_name(bias.dtype())),
             "bias can be any dtype except tfloat32", "keep the bias in a float32 [P, 1] tile");
    }
    per_partition(inst, 3, 1, true);
    const Operand& res = inst.operands[4];
    if (res.is_tensor()) {
      per_partition(inst, 4, 1, false);
    }
    if (a.reduce_cmd != ReduceCmd::idle || res.is_tensor()) {
      if (a.reduce_op != AluOp::add)
        fail(inst, fmt::format("reduce_op={} is not supported", alu_op_name(a.reduce_op)),
             "the scalar engine's accumulators reduce with nl.add only", "pass reduce_op=nl.add");
    }
    if (a.reduce_cmd == ReduceCmd::load_reduce)
      fail(inst, "reduce_cmd=load_reduce is not supported by activation",
           "activation's reduce_cmd is idle, reset, reduce or reset_reduce",
           "reset the accumulators (reset_reduce) or keep accumulating (reduce)");
  }

  void check_tensor_reduce(const Instruction& inst) const {
    const Attributes& a = inst.attrs;
    engine_in(inst, {Engine::vector, Engine::gpsimd});
    reduce_op(inst, Attr::op0);
    integer_operands_for_bitvec(inst, a.op0);
    if (a.negate && is_bitvec_op(a.op0))
      fail(inst, fmt::format("negate=True with the bitwise operator {}", alu_op_name(a.op0)),
           "negate applies to arithmetic reductions only", "drop negate=True, or negate with a separate instruction");
    const AccessPattern& data = view(1);
    if (a.axes == 0) fail(inst, "axis is empty", {}, "pass the free axes to reduce, e.g. axis=[1]");
    if (a.axes & 1u)
      fail(inst, "cannot reduce over axis 0, the partition dim", "tensor_reduce reduces free dims only",
           "reduce across partitions with nisa.tensor_partition_reduce, or transpose first");
    // The reduced axes must be the last free dims, contiguous up to the final dim.
    int first = -1;
    for (int d = 1; d < data.rank; ++d)
      if (a.axes & (1u << d)) {
        if (first < 0) first = d;
      } else if (first >= 0) {
        fail(inst, fmt::format("axis {} is not reduced but an earlier axis is", d),
             "the reduced axes must be the last free dims, ending at the final dim", {});
      }
    if (a.axes >> data.rank)
      fail(inst, fmt::format("axis {} is out of range for data of rank {}", print_detail::axes(a.axes), int(data.rank)),
           fmt::format("axes are 1 to {}", int(data.rank) - 1), "reduce only dims the data view has");
    int64_t kept = 1;
    for (int d = 1; d < first; ++d) kept *= data.dims[d].count;
    same_partitions(inst, 0, 1);
    if (geom(inst, 0).free_elements != kept)
      fail(inst, fmt::format("dst has {} elements per partition; reducing {} over axis {} leaves {}",
                             geom(inst, 0).free_elements, shape_of(data), print_detail::axes(a.axes), kept),
           {}, "size dst as data's shape with the reduced axes removed (or kept as 1)");
  }

  void check_tensor_scalar_reduce(const Instruction& inst) const {
    const Attributes& a = inst.attrs;
    engine_in(inst, {Engine::vector});
    hardware_alu_op(inst, Attr::op0);
    if (is_bitvec_op(a.op0))
      fail(inst, fmt::format("op0={} is a bitwise operator", alu_op_name(a.op0)),
           "tensor_scalar_reduce takes an arithmetic op0 only",
           "use tensor_scalar for bitwise operators, then tensor_reduce");
    unary_operand_is_zero(inst, a.op0, 2);
    if (a.reduce_op != AluOp::add && a.reduce_op != AluOp::multiply && a.reduce_op != AluOp::maximum &&
        a.reduce_op != AluOp::minimum)
      fail(inst, fmt::format("reduce_op={} is not supported", alu_op_name(a.reduce_op)),
           "reduce_op is one of add, multiply, maximum, minimum", {});
    if (a.reverse0)
      fail(inst, "reverse0=True is not supported by tensor_scalar_reduce",
           "NKI documents reverse0 as not supported yet",
           "use tensor_scalar with reverse0=True, then tensor_reduce");
    per_partition(inst, 2, 1, false);  // as tensor_scalar's operand0
    same_tile(inst, 0, 1);
    if (inst.operands[3].is_tensor()) per_partition(inst, 3, 1, false);
  }

  void check_matmul(const Instruction& inst) const {
    engine_in(inst, {Engine::tensor});
    const AccessPattern &dst = view(0), &st = view(1), &mv = view(2);
    const Storage &dst_s = storage_of(dst), &st_s = storage_of(st), &mv_s = storage_of(mv);
    if (st_s.buffer != Buffer::sbuf || mv_s.buffer != Buffer::sbuf)
      fail(inst, fmt::format("{} must be in SBUF", st_s.buffer != Buffer::sbuf ? describe(inst, 1) : describe(inst, 2)),
           "nc_matmul reads stationary and moving from SBUF", "copy the operand to SBUF");
    if (dst_s.buffer != Buffer::psum)
      fail(inst, fmt::format("{} must be in PSUM", describe(inst, 0)), "the tensor engine writes PSUM only",
           "allocate dst with buffer=nl.psum, then copy it to SBUF");
    auto legal_input = [&](DType d) {
      return d == DType::float8_e4m3 || d == DType::float8_e5m2 || d == DType::bfloat16 || d == DType::float16 ||
             d == DType::tfloat32 || d == DType::float32;
    };
    for (int s : {1, 2}) {
      DType d = view(s).dtype;
      if (!legal_input(d))
        fail(inst, fmt::format("{} has dtype {}", slot_name(inst, s), dtype_name(d)),
             fmt::format("matmul inputs on {} are float8_e4m3, float8_e5m2, bfloat16, float16, tfloat32 or float32",
                         target_name()),
             "cast the operand (tensor_copy into a tile of a supported dtype)");
    }
    auto wide = [](DType d) { return d == DType::float32 || d == DType::tfloat32; };
    if (wide(st.dtype) != wide(mv.dtype))
      fail(inst, fmt::format("stationary is {} but moving is {}", dtype_name(st.dtype), dtype_name(mv.dtype)),
           "float32/tfloat32 inputs must be paired with float32/tfloat32", "cast both operands to the same precision");
    if (inst.attrs.is_transpose && t_.generation >= 3) {
      // Transpose mode moves the stationary tile bit-accurately: dst holds stationary's values.
      if (dst.dtype != DType::float32 && dst.dtype != st.dtype)
        fail(inst, fmt::format("is_transpose=True with dst {} but stationary {}", dtype_name(dst.dtype),
                               dtype_name(st.dtype)),
             "in transpose mode dst has the dtype of the transposed (stationary) tile, or float32",
             fmt::format("allocate dst as {} (or float32)", dtype_name(st.dtype)));
    } else if (dst.dtype != DType::float32) {
      fail(inst, fmt::format("dst has dtype {}", dtype_name(dst.dtype)),
           fmt::format("matmul results are float32 on {}", target_name()), "allocate the PSUM tile as nl.float32");
    }
    TileGeometry gs = geom(inst, 1), gm = geom(inst, 2), gd = geom(inst, 0);
    if (gs.partitions != gm.partitions)
      fail(inst, fmt::format("contraction sizes differ: stationary has {} partitions, moving has {}", gs.partitions,
                             gm.partitions),
           "stationary and moving share the partition (contraction) dim",
           "slice both operands to the same K rows");
    if (gs.free_elements > t_.gemm_stationary_fmax)
      fail(inst, fmt::format("stationary free size {} exceeds {}", gs.free_elements, t_.gemm_stationary_fmax),
           fmt::format("gemm_stationary_fmax = {}", t_.gemm_stationary_fmax), "tile the stationary free dim");
    if (gm.free_elements > t_.gemm_moving_fmax)
      fail(inst, fmt::format("moving free size {} exceeds {}", gm.free_elements, t_.gemm_moving_fmax),
           fmt::format("gemm_moving_fmax = {}", t_.gemm_moving_fmax), "tile the moving free dim");
    if (gd.partitions != gs.free_elements || gd.free_elements != gm.free_elements)
      fail(inst, fmt::format("dst {} does not match stationary.T @ moving = [{}, {}]", shape_of(dst),
                             gs.free_elements, gm.free_elements),
           "dst partitions = stationary free size, dst free size = moving free size",
           fmt::format("allocate dst as [{}, {}]", gs.free_elements, gm.free_elements));
    check_within_bank(inst, 0);
  }

  /** The matmul output of one instruction accumulates within a single PSUM bank. */
  void check_within_bank(const Instruction& inst, int slot) const {
    const AccessPattern& ap = view(slot);
    const Storage& s = storage_of(ap);
    ByteRange r = partition_byte_range(s, ap);
    const int64_t base = s.address ? s.address->byte_offset : 0;  // auto placement starts PSUM tensors on a bank
    const int64_t bank = t_.psum_bank_bytes;
    if ((base + r.begin) / bank != (base + r.end - 1) / bank)
      fail(inst, fmt::format("dst spans bytes [{}, {}) of each partition, crossing a PSUM bank boundary",
                             base + r.begin, base + r.end),
           fmt::format("one matmul accumulates within one PSUM bank of {} bytes ({} float32) per partition", bank,
                       bank / 4),
           "split the moving free dim so each matmul writes at most one bank");
  }

  void check_transpose(const Instruction& inst) const {
    engine_in(inst, {Engine::tensor, Engine::vector});
    const AccessPattern &dst = view(0), &data = view(1);
    if (dst.dtype != data.dtype)
      fail(inst, fmt::format("dst is {} but data is {}", dtype_name(dst.dtype), dtype_name(data.dtype)),
           "nc_transpose does not convert dtypes", "transpose into a tile of data's dtype, then copy");
    TileGeometry gd = geom(inst, 0), gs = geom(inst, 1);
    if (gd.partitions != gs.free_elements || gd.free_elements != gs.partitions)
      fail(inst, fmt::format("dst {} is not the transpose of data {}", shape_of(dst), shape_of(data)),
           "dst partitions = data free size, dst free size = data partitions",
           fmt::format("allocate dst as [{}, {}]", gs.free_elements, gs.partitions));
    if (inst.engine == Engine::tensor) {
      if (storage_of(data).buffer != Buffer::sbuf || storage_of(dst).buffer != Buffer::psum)
        fail(inst, fmt::format("data is in {} and dst in {}", buffer_name(storage_of(data).buffer),
                               buffer_name(storage_of(dst).buffer)),
             "the tensor engine transposes from SBUF into PSUM",
             "read data from SBUF and allocate dst in PSUM, or pass engine=nki.isa.vector_engine for <= 32x32");
      if (gs.partitions > t_.num_partitions || gs.free_elements > t_.gemm_stationary_fmax)
        fail(inst, fmt::format("data {} exceeds the tensor engine transpose limit", shape_of(data)),
             fmt::format("at most [{}, {}]", t_.num_partitions, t_.gemm_stationary_fmax), "transpose in tiles");
      check_within_bank(inst, 0);
    } else {
      const int64_t m = t_.vector_transpose_max;
      if (gs.partitions > m || gs.free_elements > m)
        fail(inst, fmt::format("data {} exceeds the vector engine transpose limit", shape_of(data)),
             fmt::format("at most [{}, {}] on the vector engine", m, m), "use the tensor engine (dst in PSUM)");
    }
  }

  void check_memset(const Instruction& inst) const {
    engine_in(inst, {Engine::vector, Engine::gpsimd});
    const double v = inst.operands[1].imm();
    const DType d = view(0).dtype;
    if (is_integer(d)) {
      if (v != std::floor(v) || !std::isfinite(v))
        fail(inst, fmt::format("value {} does not match the integer dtype {}", v, dtype_name(d)),
             "memset's value must have the dst dtype's type", "pass an integer value for integer tiles");
      const int bits = 8 * int(dtype_size(d));
      const double lo = info(d).is_signed ? -std::ldexp(1.0, bits - 1) : 0.0;
      const double hi = d == DType::bool_ ? 1.0 : info(d).is_signed ? std::ldexp(1.0, bits - 1) - 1 : std::ldexp(1.0, bits) - 1;
      if (v < lo || v > hi)
        fail(inst, fmt::format("value {} is outside the range of {} [{}, {}]", v, dtype_name(d), lo, hi),
             "memset's value must be representable in the dst dtype", "pass a value within the dtype's range");
    }
  }

  void check_affine(const Instruction& inst) const {
    // dst and on_true_tile must be in SBUF: the generic operand rules (compute engines use on-chip
    // memory, GpSimd cannot access PSUM) already enforce it.
    engine_in(inst, {Engine::gpsimd});
    const RareAttributes& a = k_.rare(inst);
    if (a.pattern.empty() || a.pattern.size() > 4)
      fail(inst, fmt::format("pattern has {} [step, num] pairs", a.pattern.size()),
           "the pattern has 1 to 4 [step, num] pairs", "describe the free dims with at most 4 pairs");
    std::optional<int64_t> n = 1;
    for (size_t i = 0; i < a.pattern.size(); ++i) {
      const Dim& d = a.pattern[i];
      if (d.count < 1)
        fail(inst, fmt::format("pattern pair {} has num {}", i, d.count), "every num of the pattern must be >= 1", {});
      if (n) n = checked_mul(*n, d.count);
    }
    // NKI: "an int32 offset", "an int32 multiplier"; the affine value is computed in int32.
    auto check_int32 = [&](int64_t v, const std::string& what) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail(inst, fmt::format("{} {} does not fit in int32", what, v),
             fmt::format("{} computes its affine value in int32 arithmetic", opcode_name(inst.opcode)),
             fmt::format("keep {} within [{}, {}]", what, std::numeric_limits<int32_t>::min(),
                         std::numeric_limits<int32_t>::max()));
    };
    check_int32(a.offset, "offset");
    check_int32(a.channel_multiplier, "channel_multiplier");
    for (size_t i = 0; i < a.pattern.size(); ++i) check_int32(a.pattern[i].stride, fmt::format("pattern step {}", i));
    if (n != geom(inst, 0).free_elements)
      fail(inst, fmt::format("pattern generates {} elements per partition but dst has {}",
                             n ? fmt::to_string(*n) : "more than 2^63", geom(inst, 0).free_elements),
           "the pattern's element count must equal dst's elements per partition",
           "make the product of the pattern's nums equal dst's free size");
    if (inst.opcode == Opcode::affine_select) {
      if (!is_comparison(inst.attrs.cmp_op))
        fail(inst, fmt::format("cmp_op={} is not a comparison operator", alu_op_name(inst.attrs.cmp_op)),
             "cmp_op is one of equal, not_equal, greater, greater_equal, less, less_equal", {});
      same_tile(inst, 0, 1);
    }
  }

  void check_bn_stats(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    same_partitions(inst, 0, 1);
    if (geom(inst, 1).free_elements > t_.bn_stats_fmax)
      fail(inst, fmt::format("data has {} elements per partition", geom(inst, 1).free_elements),
           fmt::format("bn_stats_fmax = {}", t_.bn_stats_fmax),
           "split the row into chunks of nl.tile_size.bn_stats_fmax and aggregate with bn_aggr");
    if (geom(inst, 0).free_elements != 6)
      fail(inst, fmt::format("dst has {} elements per partition", geom(inst, 0).free_elements),
           "bn_stats writes 6 values per partition", "allocate dst as [P, 6]");
  }

  void check_bn_aggr(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    same_partitions(inst, 0, 1);
    if (geom(inst, 1).free_elements % 3 != 0)
      fail(inst, fmt::format("data has {} elements per partition", geom(inst, 1).free_elements),
           "bn_aggr reads (count, mean, variance*count) triples", "pass concatenated bn_stats outputs");
    if (geom(inst, 0).free_elements != 2)
      fail(inst, fmt::format("dst has {} elements per partition", geom(inst, 0).free_elements),
           "bn_aggr writes (mean, variance) per partition", "allocate dst as [P, 2]");
  }

  void check_scan(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    binary_op(inst, Attr::op0);
    binary_op(inst, Attr::op1);
    if (is_bitvec_op(inst.attrs.op0) || is_bitvec_op(inst.attrs.op1))
      fail(inst, fmt::format("op0={}, op1={}: bitwise operators are not supported", alu_op_name(inst.attrs.op0),
                             alu_op_name(inst.attrs.op1)),
           "tensor_tensor_scan takes binary arithmetic operators only", {});
    same_tile(inst, 1, 2);
    same_tile(inst, 0, 1);
    not_both_psum(inst, 1, 2);
    per_partition(inst, 3, 1, true);
  }

  void check_copy_predicated(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    const AccessPattern& pred = view(2);
    if (pred.dtype != DType::uint8 && pred.dtype != DType::uint16 && pred.dtype != DType::uint32 &&
        pred.dtype != DType::bool_)
      fail(inst, fmt::format("predicate has dtype {}", dtype_name(pred.dtype)),
           "predicates are uint8, uint16 or uint32 (nonzero = true)", "produce the predicate with a comparison into a uint8 tile");
    same_tile(inst, 0, 2);
    if (inst.operands[1].is_tensor()) {
      same_tile(inst, 0, 1);
      if (view(1).dtype != view(0).dtype)
        fail(inst, fmt::format("src is {} but dst is {}", dtype_name(view(1).dtype),
                               dtype_name(view(0).dtype)),
             "tensor_copy_predicated copies bits: src and dst must have the same dtype",
             "convert src with nisa.tensor_copy first");
      not_both_psum(inst, 1, 2);
    }
  }

  void check_select_reduce(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    const DType p = view(1).dtype;
    if (p != DType::int8 && p != DType::uint8 && p != DType::int16 && p != DType::uint16 && p != DType::bool_)
      fail(inst, fmt::format("predicate has dtype {}", dtype_name(p)),
           "select_reduce predicates are int8, uint8, int16 or uint16",
           "produce the predicate with a comparison into a uint8 tile");
    const DType ot = view(2).dtype;
    if (ot == DType::tfloat32 || ot == DType::int32 || ot == DType::uint32)
      fail(inst, fmt::format("on_true has dtype {}", dtype_name(ot)), "on_true cannot be tfloat32, int32 or uint32",
           "copy on_true into a float32, bfloat16 or 16-bit integer tile first");
    same_tile(inst, 0, 1);
    same_tile(inst, 0, 2);
    not_both_psum(inst, 1, 2);
    per_partition(inst, 3, 1, false);  // NKI requires float32 only of a scalar on_false (immediates are)
    if (inst.operands[4].is_tensor()) {
      per_partition(inst, 4, 1, false);
      if (!is_float(view(4).dtype))
        fail(inst, fmt::format("reduce_res has dtype {}", dtype_name(view(4).dtype)),
             "reduce_res must have a float dtype", "allocate reduce_res as a float32 [P, 1] tile");
    }
    if (inst.attrs.reduce_cmd != ReduceCmd::idle && inst.attrs.reduce_op != AluOp::maximum)
      fail(inst, fmt::format("reduce_op={} is not supported", alu_op_name(inst.attrs.reduce_op)),
           "select_reduce reduces with nl.maximum only", "pass reduce_op=nl.maximum");
  }

  /** max8 / nc_find_index8 read tensors of at most 3 dims (partition + 2 free). */
  void at_most_3d(const Instruction& inst, int slot) const {
    const AccessPattern& ap = view(slot);
    if (ap.rank > 3)
      fail(inst, fmt::format("{} is {}-D ({})", slot_name(inst, slot), int(ap.rank), shape_of(ap)),
           fmt::format("{} reads {} of up to 3 dims", opcode_name(inst.opcode), slot_name(inst, slot)),
           "flatten the free dims (flatten_dims / reshape)");
  }

  void check_max8(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    at_most_3d(inst, 1);
    same_partitions(inst, 0, 1);
    const int64_t n = geom(inst, 1).free_elements;
    if (n < t_.max8_min_elems || n > t_.max8_max_elems)
      fail(inst, fmt::format("src has {} elements per partition", n),
           fmt::format("max8 reads {} to {} elements per partition", t_.max8_min_elems, t_.max8_max_elems),
           n < t_.max8_min_elems ? fmt::format("pad the row to at least {} elements", t_.max8_min_elems)
                                 : std::string("take the top 8 of each chunk, then max8 over the concatenated "
                                               "results"));
    if (geom(inst, 0).free_elements != 8)
      fail(inst, fmt::format("dst has {} elements per partition", geom(inst, 0).free_elements),
           "max8 writes 8 values per partition", "allocate dst as [P, 8]");
  }

  /** The data row that nc_find_index8 and nc_match_replace8 search: the size max8 reads. */
  void searched_row_size(const Instruction& inst) const {
    const int64_t n = geom(inst, 1).free_elements;
    if (n < t_.max8_min_elems || n > t_.max8_max_elems)
      fail(inst, fmt::format("data has {} elements per partition", n),
           fmt::format("{} reads {} to {} elements per partition", opcode_name(inst.opcode), t_.max8_min_elems,
                       t_.max8_max_elems),
           {});
  }

  void check_find_index8(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    at_most_3d(inst, 1);
    at_most_3d(inst, 2);
    same_partitions(inst, 0, 1);
    same_partitions(inst, 0, 2);
    searched_row_size(inst);
    for (int s : {2, 0})
      if (geom(inst, s).free_elements != 8)
        fail(inst, fmt::format("{} has {} elements per partition", slot_name(inst, s), geom(inst, s).free_elements),
             "vals and dst have exactly 8 elements per partition", "allocate them as [P, 8]");
    const DType d = view(0).dtype;
    if (d != DType::uint16 && d != DType::uint32)
      fail(inst, fmt::format("dst has dtype {}", dtype_name(d)), "indices are written as uint16 or uint32",
           "allocate dst as nl.uint32 (or nl.uint16)");
  }

  void needs_generation(const Instruction& inst, int generation) const {
    if (t_.generation < generation)
      fail(inst, fmt::format("{} needs NeuronCore-v{}; {} does not have it", opcode_name(inst.opcode), generation,
                             target_name()),
           fmt::format("{} exists on NeuronCore-v{} and later", opcode_name(inst.opcode), generation),
           "compile for a newer target (target=\"trn2\")");
  }

  void check_stream_shuffle(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    // src may span fewer partitions than dst (a lane read several times broadcasts a row); a
    // lane past src's partitions is a run-time fault
    if (geom(inst, 0).free_elements != geom(inst, 1).free_elements)
      fail(inst, fmt::format("dst has {} elements per partition but src has {}", geom(inst, 0).free_elements,
                             geom(inst, 1).free_elements),
           "nc_stream_shuffle moves whole rows: dst and src have the same elements per partition", {});
    if (view(0).dtype != view(1).dtype)
      fail(inst, fmt::format("dst is {} but src is {}", dtype_name(view(0).dtype),
                             dtype_name(view(1).dtype)),
           "nc_stream_shuffle moves bits: dst has src's dtype", "shuffle into a tile of src's dtype, then convert");
    const auto& lanes = k_.rare(inst).lanes;
    if (lanes.size() != t_.partition_quadrant)
      fail(inst, fmt::format("shuffle_mask has {} entries", lanes.size()),
           fmt::format("shuffle_mask names a source lane for each of the {} partitions of a quadrant",
                       t_.partition_quadrant),
           fmt::format("pass a list of {} lanes (255 keeps a destination partition)", t_.partition_quadrant));
    for (size_t i = 0; i < lanes.size(); ++i)
      if (lanes[i] != kShuffleKeepLane && (lanes[i] < 0 || lanes[i] >= int32_t(t_.partition_quadrant)))
        fail(inst, fmt::format("shuffle_mask[{}] is {}", i, lanes[i]),
             fmt::format("lanes are 0..{} within a quadrant, or {} to keep the destination", t_.partition_quadrant - 1,
                         kShuffleKeepLane),
             "shuffle across quadrants with nisa.dma_copy");
  }

  void check_match_replace8(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    at_most_3d(inst, 1);
    same_tile(inst, 0, 1);
    same_partitions(inst, 0, 2);
    searched_row_size(inst);
    if (geom(inst, 2).free_elements != 8)
      fail(inst, fmt::format("vals has {} elements per partition", geom(inst, 2).free_elements),
           "vals holds exactly 8 values per partition", "pass the [P, 8] result of nisa.max8");
    if (inst.operands[4].is_tensor()) {
      same_partitions(inst, 0, 4);
      if (geom(inst, 4).free_elements != 8)
        fail(inst, fmt::format("dst_idx has {} elements per partition", geom(inst, 4).free_elements),
             "dst_idx receives exactly 8 indices per partition", "allocate dst_idx as [P, 8]");
      const DType d = view(4).dtype;
      if (d != DType::uint16 && d != DType::uint32 && d != DType::int32)
        fail(inst, fmt::format("dst_idx has dtype {}", dtype_name(d)), "indices are written as integers",
             "allocate dst_idx as nl.uint32");
    }
  }

  void check_range_select(const Instruction& inst) const {
    engine_in(inst, {Engine::vector});
    needs_generation(inst, 3);
    same_tile(inst, 0, 1);
    for (AluOp op : {inst.attrs.op0, inst.attrs.op1})
      if (op != AluOp::equal && op != AluOp::not_equal && op != AluOp::greater && op != AluOp::greater_equal &&
          op != AluOp::less && op != AluOp::less_equal)
        fail(inst, fmt::format("comp_op {} is not a comparison", alu_op_name(op)),
             "range_select compares positions with nl.greater_equal, nl.less, ...", {});
    per_partition(inst, 2, 1, true);
    per_partition(inst, 3, 1, true);
    if (inst.operands[4].is_tensor()) {
      per_partition(inst, 4, 1, false);
      if (!is_float(view(4).dtype))
        fail(inst, fmt::format("reduce_res has dtype {}", dtype_name(view(4).dtype)),
             "reduce_res must have a float dtype", "allocate reduce_res as a float32 [P, 1] tile");
    }
    if (inst.attrs.reduce_cmd != ReduceCmd::idle) reduce_op(inst, Attr::reduce_op);
  }

  void check_n_gather(const Instruction& inst) const {
    engine_in(inst, {Engine::gpsimd});
    same_partitions(inst, 0, 1);
    same_tile(inst, 0, 2);
    const DType d = view(2).dtype;
    if (d != DType::uint32 && d != DType::int32)
      fail(inst, fmt::format("indices have dtype {}", dtype_name(d)), "nc_n_gather indices are uint32",
           "compute the indices into a nl.uint32 tile");
    if (view(0).dtype != view(1).dtype)
      fail(inst, fmt::format("dst is {} but data is {}", dtype_name(view(0).dtype),
                             dtype_name(view(1).dtype)),
           "nc_n_gather copies elements: dst has data's dtype", {});
  }

  void check_local_gather(const Instruction& inst) const {
    constexpr int64_t group = 16;  // partitions of one GpSimd core
    engine_in(inst, {Engine::gpsimd});
    same_partitions(inst, 0, 1);
    same_partitions(inst, 1, 2);
    const TileGeometry src = geom(inst, 1), index = geom(inst, 2);
    if (src.partitions % group != 0 || src.first_partition % group != 0)
      fail(inst, fmt::format("src_buffer spans {} partitions from partition {}", src.partitions, src.first_partition),
           "local_gather works on whole groups of 16 partitions (one per GpSimd core): a multiple of 16 partitions "
           "starting at a multiple of 16",
           "pad the tiles to a multiple of 16 partitions");
    if (view(2).dtype != DType::uint16)
      fail(inst, fmt::format("index has dtype {}", dtype_name(view(2).dtype)), "local_gather indices are uint16",
           "copy the indices into a nl.uint16 tile (nisa.tensor_copy converts)");
    if (view(0).dtype != view(1).dtype)
      fail(inst, fmt::format("dst is {} but src_buffer is {}", dtype_name(view(0).dtype), dtype_name(view(1).dtype)),
           "local_gather copies elements: dst has src_buffer's dtype", {});
    const RareAttributes& a = k_.rare(inst);
    const int64_t per_index = a.step, valid = a.offset, slice = index.free_elements * group;
    if (per_index != 1 && per_index != 2 && per_index != 4 && per_index != 8 && per_index != 16 && per_index != 32)
      fail(inst, fmt::format("num_elem_per_idx={}", per_index), "num_elem_per_idx is one of 1, 2, 4, 8, 16, 32", {});
    if (valid < 1 || valid > slice || valid > 4096)
      fail(inst, fmt::format("num_valid_indices={} for {} indices per GpSimd core", valid, slice),
           "between 1 and the indices of a core's 16 partitions of index, and at most 4096",
           fmt::format("pass num_valid_indices <= {}", std::min<int64_t>(slice, 4096)));
    if (geom(inst, 0).free_elements != valid * per_index)
      fail(inst, fmt::format("dst has {} elements per partition", geom(inst, 0).free_elements),
           "dst holds num_valid_indices * num_elem_per_idx elements per partition",
           fmt::format("allocate dst with {} elements per partition ({} indices x {})", valid * per_index, valid,
                       per_index));
  }

  void check_nonzero_with_count(const Instruction& inst) const {
    engine_in(inst, {Engine::gpsimd});
    needs_generation(inst, 3);
    same_partitions(inst, 0, 1);
    if (geom(inst, 0).free_elements != geom(inst, 1).free_elements + 1)
      fail(inst, fmt::format("dst has {} elements per partition for src's {}", geom(inst, 0).free_elements,
                             geom(inst, 1).free_elements),
           "dst holds the indices, the padding and the count: one element more than src",
           fmt::format("allocate dst with {} elements per partition", geom(inst, 1).free_elements + 1));
    if (!is_integer(view(0).dtype))
      fail(inst, fmt::format("dst has dtype {}", dtype_name(view(0).dtype)),
           "nonzero_with_count writes integer indices and counts", "allocate dst as nl.int32");
  }

  void check_dma_compute(const Instruction& inst) const {
    if (const auto [op, param] = alu_attr(inst, Attr::op0); op != AluOp::add)
      fail(inst, fmt::format("{}={} is not supported", param, alu_op_name(op)),
           "the DMA engines reduce with nl.add only", "pass reduce_op=nl.add");
    const int64_t n = view(0).num_elements();
    for (int slot = 1; slot < kMaxSlots; ++slot)
      if (inst.operands[slot].is_tensor() && view(slot).num_elements() != n)
        fail(inst, fmt::format("{} has {} elements {} but dst has {} {}", slot_name(inst, slot),
                               view(slot).num_elements(), shape_of(view(slot)), n,
                               shape_of(view(0))),
             "dma_compute combines sources of dst's size element by element", "slice the sources to dst's size");
  }

  void check_partition_reduce(const Instruction& inst) const {
    engine_in(inst, {Engine::gpsimd});
    const AluOp op = inst.attrs.op0;
    if (op != AluOp::add && op != AluOp::maximum && op != AluOp::bitwise_or && op != AluOp::bitwise_and &&
        op != AluOp::average)
      fail(inst, fmt::format("{}={} is not supported", inst.spec().nki_name(Attr::op0), alu_op_name(op)),
           "tensor_partition_reduce reduces with add, average, maximum, bitwise_or or bitwise_and", {});
    if (is_bitvec_op(op)) {
      for (int s : {0, 1})
        if (!is_integer(view(s).dtype))
          fail(inst, fmt::format("op={} needs integer tiles, but {} is {}", alu_op_name(op), slot_name(inst, s),
                                 dtype_name(view(s).dtype)),
               "bitwise reductions act on integer bit patterns", "use .view() to reinterpret float bits as integers");
    }
    if (geom(inst, 0).partitions != 1 || geom(inst, 0).free_elements != geom(inst, 1).free_elements)
      fail(inst, fmt::format("dst {} must be [1, {}]", shape_of(view(0)), geom(inst, 1).free_elements),
           "tensor_partition_reduce writes one partition with data's free size",
           fmt::format("allocate dst as [1, {}]", geom(inst, 1).free_elements));
  }

  void check_control(const Instruction& inst) const {
    for (int s = 0; s < inst.spec().num_slots; ++s) {
      const Operand& o = inst.operands[s];
      if (o.is_reg()) internal_check(o.reg() >= 0 && o.reg() < k_.num_registers, "register id out of range");
      if (o.is_tensor() && (inst.opcode == Opcode::register_load || inst.opcode == Opcode::register_store)) {
        if (view(s).num_elements() != 1)
          fail(inst, fmt::format("{} must be a single element, got shape {}", slot_name(inst, s), shape_of(view(s))),
               "registers load from and store to 1x1 tensors", "index one element, e.g. t[0:1, 0:1]");
        if (storage_of(view(s)).buffer == Buffer::psum)
          fail(inst, fmt::format("{} is in PSUM", describe(inst, s)), "registers load from and store to SBUF or HBM",
               "copy the value to SBUF first");
      }
    }
    if (inst.opcode == Opcode::loop_begin && k_.rare(inst).step <= 0)
      fail(inst, fmt::format("loop step {} must be a positive compile-time integer", k_.rare(inst).step),
           "runtime loops count up with a positive step", "iterate upwards and compute reversed indices in the body");
  }

  void check_core_barrier(const Instruction& inst) const {
    needs_generation(inst, 3);
    const std::vector<int32_t>& cores = k_.rare(inst).lanes;
    if (cores.empty())
      fail(inst, "cores is empty", "a barrier names the program instances that meet there", "pass cores=(0, 1)");
    for (size_t i = 0; i < cores.size(); ++i) {
      if (cores[i] < 0)
        fail(inst, fmt::format("cores[{}] is {}", i, cores[i]), "cores are program instance numbers, from 0",
             "pass cores=(0, 1)");
      for (size_t j = 0; j < i; ++j)
        if (cores[j] == cores[i])
          fail(inst, fmt::format("cores names instance {} twice", cores[i]), "each core meets the barrier once",
               "list each program instance once");
    }
  }

  void check_sendrecv(const Instruction& inst) const {
    needs_generation(inst, 3);
    for (int slot : {0, 1}) {
      const Storage& s = storage_of(view(slot));
      if (s.buffer != Buffer::sbuf)
        fail(inst, fmt::format("{} is in {}", describe(inst, slot), buffer_name(s.buffer)),
             "sendrecv moves tiles between the SBUFs of two NeuronCores", "stage the tile in SBUF first");
    }
    const AccessPattern &dst = view(0), &src = view(1);
    if (dst.dtype != src.dtype)
      fail(inst, fmt::format("src is {} but dst is {}", info(src.dtype).name, info(dst.dtype).name),
           "sendrecv's src and dst have the same dtype (it copies bytes)", "convert the tile with nisa.tensor_copy first");
    if (dst.num_elements() != src.num_elements())
      fail(inst, fmt::format("dst has {} elements {} but src has {} {}", dst.num_elements(), shape_of(dst),
                             src.num_elements(), shape_of(src)),
           "the partner's dst receives as many elements as this src sends", "give src and dst the same shape");
    const SendRecvRanks r = SendRecvRanks::of(k_.rare(inst));
    if (k_.rare(inst).lanes.size() != 3 || r.send_to < 0 || r.recv_from < 0)
      fail(inst, fmt::format("send_to_rank={} and recv_from_rank={}", r.send_to, r.recv_from),
           "ranks are program instance numbers, from 0", "pass send_to_rank=1 - nl.program_id(0)");
  }

  const Kernel& k_;
  const TargetConfig& t_;
  std::array<AccessPattern, kMaxSlots> views_;  // of the instruction being checked
};

}  // namespace

void verify(const Kernel& kernel) { Verifier(kernel).run(); }

}  // namespace nikki::jit
