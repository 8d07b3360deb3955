// The kernel IR: storages (tensors), instructions in program order, and source locations.
//
// Both front ends (the Python tracer and the C++ DSL) build this IR through KernelBuilder; the
// JIT verifies, allocates and schedules it; the runtime executes it. Its text form (ir_printer.hpp)
// is stable and used by golden tests and NIKKI_DUMP.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "nikki/access_pattern.hpp"
#include "nikki/dtype.hpp"
#include "nikki/error.hpp"
#include "nikki/opcodes.hpp"
#include "nikki/ops.hpp"
#include "nikki/shape.hpp"
#include "nikki/target.hpp"

namespace nikki {

using LocId = uint32_t;

/** @brief How a kernel uses a storage. */
enum class StorageRole : uint8_t {
  input,    // kernel parameter (HBM, caller's buffer)
  output,   // returned shared_hbm tensor (caller's buffer)
  scratch,  // allocated inside the kernel (SBUF, PSUM or private HBM)
};

/** @brief Placement of an on-chip tensor: first partition and byte offset within a partition. */
struct Address {
  uint32_t partition = 0;
  uint32_t byte_offset = 0;
  friend bool operator==(const Address&, const Address&) = default;
};

/** @brief A tensor's memory: buffer, dtype, shape, role and (after allocation) its address. */
struct Storage {
  std::string name;
  Buffer buffer = Buffer::sbuf;
  DType dtype = DType::float32;
  Shape shape;
  StorageRole role = StorageRole::scratch;
  bool writable_input = false;     // an input the kernel may write (nt.mutable_tensor)
  std::optional<Address> address;  // set by the user (address=) or by the allocator
  bool user_address = false;
  LocId loc = 0;
  uint32_t defined_at = 0;  // number of instructions before the storage was created

  bool on_chip() const { return is_on_chip(buffer); }
  /** @brief Partitions spanned (on-chip tensors: the first dim). */
  int64_t partitions() const { return shape.rank() ? shape[0] : 1; }
  /** @brief Bytes per partition for on-chip tensors. */
  int64_t partition_bytes() const { return size_mul(shape.inner_elements(), dtype_size(dtype)); }
  /** @brief Bytes of the whole tensor (KernelBuilder::add_storage checked that they fit in int64). */
  int64_t total_bytes() const { return size_mul(shape.num_elements(), dtype_size(dtype)); }
};

/** @brief nc_stream_shuffle's shuffle_mask entry that leaves a destination lane unmodified. */
inline constexpr int32_t kShuffleKeepLane = 255;

// --- operands -----------------------------------------------------------------------------------
//
// An operand is 44 bytes: a tensor view whose rank is at most kInlineDims and whose offset,
// strides and counts fit in 32 bits is stored inline; any other view (longer, larger, or with
// runtime offsets) is stored whole in the kernel's `wide_views` side table and the operand holds
// its index. Kernel::view() turns either form back into an AccessPattern, Kernel::tensor_operand()
// makes one. Storage, dtype and rank are inline in both forms.

/** @brief Dims of a view an operand holds inline. */
inline constexpr int kInlineDims = 4;

/** @brief One operand: absent, a tensor view, an immediate or a register. */
class Operand {
 public:
  enum class Kind : uint8_t { none, tensor, imm, reg };

  static Operand none() { return {}; }
  static Operand immediate(double v) {
    Operand o;
    o.kind_ = Kind::imm;
    std::memcpy(o.words_.data(), &v, sizeof(v));
    return o;
  }
  static Operand reg_(RegisterId r) {
    Operand o;
    o.kind_ = Kind::reg;
    o.id_ = static_cast<uint32_t>(r);
    return o;
  }

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_tensor() const { return kind_ == Kind::tensor; }
  bool is_imm() const { return kind_ == Kind::imm; }
  bool is_reg() const { return kind_ == Kind::reg; }

  /** @brief The immediate (0 for an operand that is not one). */
  double imm() const {
    double v = 0.0;
    if (is_imm()) std::memcpy(&v, words_.data(), sizeof(v));
    return v;
  }
  /** @brief The register (-1 for an operand that is not one). */
  RegisterId reg() const { return is_reg() ? static_cast<RegisterId>(id_) : -1; }
  /** @brief The storage a tensor operand views (kNoStorage otherwise). */
  StorageId storage() const { return is_tensor() ? id_ : kNoStorage; }
  /** @brief The dtype a tensor operand views its storage as. */
  DType dtype() const { return dtype_; }
  /** @brief The number of dims of a tensor operand's view. */
  int rank() const { return rank_; }
  /** @brief Whether the view lives in the kernel's wide_views table (always for runtime offsets). */
  bool is_wide() const { return wide_; }
  /** @brief Whether the view has runtime offsets (NKI .ap(scalar_offset=, vector_offset=)). */
  bool is_dynamic() const { return dynamic_; }

 private:
  friend struct Kernel;
  Kind kind_ = Kind::none;
  DType dtype_ = DType::float32;
  uint8_t rank_ = 0;
  bool wide_ : 1 = false;
  bool dynamic_ : 1 = false;
  uint32_t id_ = 0;  // storage (tensor), register (reg)
  // Inline view: offset, then [stride, count] per dim. Wide view: words_[0] is the wide_views
  // index. Immediate: the double's bytes in words_[0..1].
  std::array<int32_t, 1 + 2 * kInlineDims> words_{};
};
static_assert(sizeof(Operand) == 44);

// --- attributes ---------------------------------------------------------------------------------

/**
 * @brief The attributes many opcodes use, inline in every instruction. Each opcode reads those its
 * OpcodeSpec lists (opcodes.hpp); the others keep their defaults (the builder checks it).
 */
struct Attributes {
  AluOp op0 = AluOp::bypass;
  AluOp op1 = AluOp::bypass;
  ActFunc func = ActFunc::copy;
  AluOp reduce_op = AluOp::bypass;
  ReduceCmd reduce_cmd = ReduceCmd::idle;
  AluOp cmp_op = AluOp::equal;
  Accumulate accumulate = Accumulate::automatic;
  bool reverse0 : 1 = false;
  bool reverse1 : 1 = false;
  bool negate : 1 = false;
  bool keepdims : 1 = false;
  bool reverse_pred : 1 = false;
  bool is_transpose : 1 = false;           // nc_matmul bit-accurate transpose mode
  bool is_stationary_onezero : 1 = false;  // nc_matmul performance hints
  bool is_moving_onezero : 1 = false;
  bool oob_skip : 1 = false;  // dma_copy / dma_compute: skip runtime out-of-bound elements
  uint32_t axes = 0;          // tensor_reduce: bit d set = reduce view dim d
};

/** @brief Attributes of few opcodes, kept in the kernel's side table (Kernel::rare). */
struct RareAttributes {
  int64_t offset = 0;              // iota / affine_select / range_select range_start / nonzero_with_count
  int64_t channel_multiplier = 0;  // iota / affine_select
  std::vector<Dim> pattern;        // iota / affine_select [[step, num], ...]
  int64_t step = 1;                // loop_begin
  int32_t jump = -1;               // loop_begin -> its loop_end, loop_end -> its loop_begin
  std::string text;                // device_print prefix
  double fill_value = 0.0;         // range_select on_false_value, nonzero_with_count padding_val
  // nc_stream_shuffle: source partition of each quadrant lane (255: keep); core_barrier: the
  // program instances that meet; sendrecv: {send_to_rank, recv_from_rank, pipe_id}
  std::vector<int32_t> lanes;
};

/** @brief The partners of a sendrecv, which RareAttributes::lanes holds as {send_to, recv_from, pipe_id}. */
struct SendRecvRanks {
  int32_t send_to = 0;    // the program instance whose dst receives this instance's src
  int32_t recv_from = 0;  // the program instance whose src this instance's dst receives
  int32_t pipe_id = 0;
  static SendRecvRanks of(const RareAttributes& a) {
    return a.lanes.size() == 3 ? SendRecvRanks{a.lanes[0], a.lanes[1], a.lanes[2]} : SendRecvRanks{};
  }
};

// --- instructions -------------------------------------------------------------------------------

inline constexpr uint32_t kNoRareAttributes = ~0u;

/**
 * @brief One instruction: opcode, engine, source line, attributes, operands (by slot). Its name
 * and rare attributes live in side tables of its kernel; instructions copied within a kernel share
 * them.
 */
struct Instruction {
  Opcode opcode = Opcode::tensor_copy;
  Engine engine = Engine::unknown;
  LocId loc = 0;
  Attributes attrs;
  uint32_t name = 0;                    // optional user name (nisa name=): Kernel::instruction_name
  uint32_t rare = kNoRareAttributes;    // index into Kernel::rare_attributes
  std::array<Operand, kMaxSlots> operands;

  const OpcodeSpec& spec() const { return opcode_spec(opcode); }
  Operand& operand(int slot) { return operands[slot]; }
  const Operand& operand(int slot) const { return operands[slot]; }
  /** @brief Effective access of a slot: nc_matmul reads its destination unless it overwrites. */
  Access access(int slot) const {
    if (opcode == Opcode::nc_matmul && slot == 0 && attrs.accumulate != Accumulate::overwrite)
      return Access::read_write;
    return spec().slots[slot].access;
  }
};
static_assert(sizeof(Instruction) <= 256, "instructions stay compact: rare parts go to the kernel's side tables");
static_assert(std::is_trivially_copyable_v<Instruction>);

/**
 * @brief One traced run of an nl.affine_range loop, whose iterations NKI may reorder and overlap.
 * Recorded only when a kernel is traced for the sanitizer (jit/sanitize.hpp), which checks that no
 * iteration depends on another. A loop nested in another is one run per outer iteration.
 */
struct ParallelLoop {
  LocId loc = 0;                          // the loop statement
  int32_t parent = -1;                    // the enclosing ParallelLoop, or -1
  int64_t start = 0;                      // iteration k has the loop value start + k * step
  int64_t step = 1;
  std::vector<uint32_t> iteration_begin;  // first instruction index of each iteration
  uint32_t end = 0;                       // one past the last instruction of the last iteration

  size_t iterations() const { return iteration_begin.size(); }
  /** @brief One past the last instruction of iteration k. */
  uint32_t iteration_end(size_t k) const { return k + 1 < iteration_begin.size() ? iteration_begin[k + 1] : end; }
  int64_t value(size_t k) const { return start + static_cast<int64_t>(k) * step; }
};
/**
 * @brief A whole kernel: storages, parameters, outputs, instructions in program order, and the
 * side tables its instructions point into (wide views, rare attributes, names).
 */
struct Kernel {
  std::string name;
  TargetId target = TargetId::trn2;
  std::vector<Storage> storages;
  std::vector<StorageId> inputs;
  std::vector<StorageId> outputs;
  std::vector<Instruction> instructions;
  std::vector<SourceLocation> locations;  // indexed by LocId; entry 0 is "unknown"
  int32_t num_registers = 0;
  bool allocated = false;  // every on-chip storage has an address
  std::vector<ParallelLoop> parallel_loops;  // side table for the sanitizer; empty unless traced for it
  // Side tables of the instructions. Entries no instruction refers to any more (an operand
  // replaced by another) are left in place; the file format stores only what instructions use.
  std::vector<AccessPattern> wide_views;        // operands that do not fit inline
  std::vector<RareAttributes> rare_attributes;  // Instruction::rare
  std::vector<std::string> instruction_names;   // Instruction::name - 1

  const SourceLocation& location(LocId id) const {
    static const SourceLocation unknown;
    return id < locations.size() ? locations[id] : unknown;
  }
  const Storage& storage(StorageId id) const { return storages.at(id); }
  const TargetConfig& config() const { return target_config(target); }

  /** @brief The view of a tensor operand. */
  AccessPattern view(const Operand& o) const {
    internal_check(o.is_tensor(), "view of an operand that is not a tensor");
    if (o.wide_) return wide_views[static_cast<uint32_t>(o.words_[0])];
    AccessPattern ap;
    ap.storage = o.id_;
    ap.dtype = o.dtype_;
    ap.rank = o.rank_;
    ap.offset = o.words_[0];
    for (int d = 0; d < o.rank_; ++d) ap.dims[d] = {o.words_[1 + 2 * d], o.words_[2 + 2 * d]};
    return ap;
  }
  /** @brief The runtime offsets of a tensor operand's view, or null for a static view. */
  const Indirection* indirection(const Operand& o) const {
    return o.dynamic_ ? wide_views[static_cast<uint32_t>(o.words_[0])].indirection.get() : nullptr;
  }
  /** @brief The view of slot `slot` of `inst` (a tensor operand). */
  AccessPattern view(const Instruction& inst, int slot) const { return view(inst.operands[slot]); }

  /** @brief A tensor operand for `ap`, inline when it fits, else in wide_views. */
  Operand tensor_operand(const AccessPattern& ap) {
    Operand o;
    o.kind_ = Operand::Kind::tensor;
    o.id_ = ap.storage;
    o.dtype_ = ap.dtype;
    o.rank_ = ap.rank;
    o.dynamic_ = ap.is_dynamic();
    auto fits = [](int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; };
    bool inline_form = !o.dynamic_ && ap.rank <= kInlineDims && fits(ap.offset);
    for (int d = 0; inline_form && d < ap.rank; ++d) inline_form = fits(ap.dims[d].stride) && fits(ap.dims[d].count);
    if (inline_form) {
      o.words_[0] = static_cast<int32_t>(ap.offset);
      for (int d = 0; d < ap.rank; ++d) {
        o.words_[1 + 2 * d] = static_cast<int32_t>(ap.dims[d].stride);
        o.words_[2 + 2 * d] = static_cast<int32_t>(ap.dims[d].count);
      }
    } else {
      internal_check(wide_views.size() < INT32_MAX, "too many wide views in one kernel");
      o.wide_ = true;
      o.words_[0] = static_cast<int32_t>(wide_views.size());
      wide_views.push_back(ap);
    }
    return o;
  }

  /** @brief The rare attributes of `inst` (defaults when it has none). */
  const RareAttributes& rare(const Instruction& inst) const {
    static const RareAttributes defaults;
    return inst.rare == kNoRareAttributes ? defaults : rare_attributes[inst.rare];
  }
  /** @brief The rare attributes of `inst` for writing; gives it a side-table entry on first use. */
  RareAttributes& mutable_rare(Instruction& inst) {
    if (inst.rare == kNoRareAttributes) {
      inst.rare = static_cast<uint32_t>(rare_attributes.size());
      rare_attributes.emplace_back();
    }
    return rare_attributes[inst.rare];
  }

  /** @brief The user's name of `inst` (nisa name=), or "". */
  std::string_view instruction_name(const Instruction& inst) const {
    return inst.name == 0 ? std::string_view() : std::string_view(instruction_names[inst.name - 1]);
  }
  void set_instruction_name(Instruction& inst, std::string_view name) {
    if (name.empty()) {
      inst.name = 0;
      return;
    }
    instruction_names.emplace_back(name);
    inst.name = static_cast<uint32_t>(instruction_names.size());
  }
};

}  // namespace nikki
