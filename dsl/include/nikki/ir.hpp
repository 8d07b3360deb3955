// The kernel IR: storages (tensors), instructions in program order, and source locations.
//
// Both front ends (the Python tracer and the C++ DSL) build this IR through KernelBuilder; the
// JIT verifies, allocates and schedules it; the runtime executes it. Its text form (ir_printer.hpp)
// is stable and used by golden tests and NIKKI_DUMP.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nikki/access_pattern.hpp"
#include "nikki/dtype.hpp"
#include "nikki/error.hpp"
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

/** @brief Instruction kinds. Compute opcodes mirror nki.isa; the rest are control. */
enum class Opcode : uint8_t {
  dma_copy,
  tensor_copy,
  tensor_tensor,
  tensor_scalar,
  scalar_tensor_tensor,
  activation,
  tensor_reduce,
  tensor_scalar_reduce,
  nc_matmul,
  nc_transpose,
  memset,
  iota,
  affine_select,
  bn_stats,
  bn_aggr,
  tensor_tensor_scan,
  reciprocal,
  tensor_copy_predicated,
  select_reduce,
  max8,
  nc_find_index8,
  tensor_partition_reduce,
  nc_stream_shuffle,
  nc_match_replace8,
  range_select,
  nc_n_gather,
  nonzero_with_count,
  dma_compute,
  register_move,
  register_load,
  register_store,
  loop_begin,
  loop_end,
  device_print,
  core_barrier,
  sendrecv,
};
inline constexpr int kNumOpcodes = static_cast<int>(Opcode::sendrecv) + 1;

/** @brief How an instruction uses an operand slot. */
enum class Access : uint8_t { read, write, read_write };

/** @brief What an operand slot may hold. */
enum OperandKinds : uint8_t { kTensor = 1, kImm = 2, kReg = 4 };

/** @brief One operand slot of an opcode: its NKI parameter name, access, and allowed kinds. */
struct SlotSpec {
  std::string_view name;
  Access access = Access::read;
  uint8_t kinds = kTensor;
  bool optional = false;
};

inline constexpr int kMaxSlots = 5;

/** @brief The static signature of an opcode: name, default engine, operand slots. */
struct OpcodeSpec {
  std::string_view name;
  Engine default_engine;
  uint8_t num_slots;
  std::array<SlotSpec, kMaxSlots> slots;
  bool is_control = false;  // register, loop and meeting instructions run on the sequencer
};

namespace detail {
inline constexpr SlotSpec W(std::string_view n) { return {n, Access::write, kTensor, false}; }
inline constexpr SlotSpec R(std::string_view n) { return {n, Access::read, kTensor, false}; }
inline constexpr SlotSpec RO(std::string_view n) { return {n, Access::read, kTensor, true}; }
inline constexpr SlotSpec WO(std::string_view n) { return {n, Access::write, kTensor, true}; }
inline constexpr SlotSpec RS(std::string_view n) { return {n, Access::read, kTensor | kImm, false}; }
inline constexpr SlotSpec RSO(std::string_view n) { return {n, Access::read, kTensor | kImm, true}; }
inline constexpr SlotSpec Imm(std::string_view n) { return {n, Access::read, kImm, false}; }
}  // namespace detail

inline constexpr std::array<OpcodeSpec, kNumOpcodes> kOpcodeSpecs = [] {
  using namespace detail;
  std::array<OpcodeSpec, kNumOpcodes> t{};
  auto set = [&](Opcode op, OpcodeSpec s) { t[static_cast<int>(op)] = s; };
  set(Opcode::dma_copy, {"dma_copy", Engine::dma, 2, {W("dst"), R("src")}});
  set(Opcode::tensor_copy, {"tensor_copy", Engine::vector, 2, {W("dst"), R("src")}});
  set(Opcode::tensor_tensor, {"tensor_tensor", Engine::vector, 3, {W("dst"), R("data1"), R("data2")}});
  set(Opcode::tensor_scalar,
      {"tensor_scalar", Engine::vector, 4, {W("dst"), R("data"), RS("operand0"), RSO("operand1")}});
  set(Opcode::scalar_tensor_tensor,
      {"scalar_tensor_tensor", Engine::vector, 4, {W("dst"), R("data"), RS("operand0"), R("operand1")}});
  set(Opcode::activation,
      {"activation", Engine::scalar, 5, {W("dst"), R("data"), RO("bias"), RS("scale"), WO("reduce_res")}});
  set(Opcode::tensor_reduce, {"tensor_reduce", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::tensor_scalar_reduce,
      {"tensor_scalar_reduce", Engine::vector, 4, {W("dst"), R("data"), RS("operand0"), WO("reduce_res")}});
  set(Opcode::nc_matmul, {"nc_matmul", Engine::tensor, 3, {W("dst"), R("stationary"), R("moving")}});
  set(Opcode::nc_transpose, {"nc_transpose", Engine::tensor, 2, {W("dst"), R("data")}});
  set(Opcode::memset, {"memset", Engine::vector, 2, {W("dst"), Imm("value")}});
  set(Opcode::iota, {"iota", Engine::gpsimd, 1, {W("dst")}});
  set(Opcode::affine_select,
      {"affine_select", Engine::gpsimd, 3, {W("dst"), R("on_true_tile"), Imm("on_false_value")}});
  set(Opcode::bn_stats, {"bn_stats", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::bn_aggr, {"bn_aggr", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::tensor_tensor_scan,
      {"tensor_tensor_scan", Engine::vector, 4, {W("dst"), R("data0"), R("data1"), RS("initial")}});
  set(Opcode::reciprocal, {"reciprocal", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::tensor_copy_predicated,
      {"tensor_copy_predicated", Engine::vector, 3,
       {SlotSpec{"dst", Access::read_write, kTensor, false}, RS("src"), R("predicate")}});
  set(Opcode::select_reduce,
      {"select_reduce", Engine::vector, 5,
       {W("dst"), R("predicate"), R("on_true"), RS("on_false"), WO("reduce_res")}});
  set(Opcode::max8, {"max8", Engine::vector, 2, {W("dst"), R("src")}});
  set(Opcode::nc_find_index8, {"nc_find_index8", Engine::vector, 3, {W("dst"), R("data"), R("vals")}});
  set(Opcode::tensor_partition_reduce,
      {"tensor_partition_reduce", Engine::gpsimd, 2, {W("dst"), R("data")}});
  set(Opcode::nc_stream_shuffle, {"nc_stream_shuffle", Engine::vector, 2, {W("dst"), R("src")}});
  set(Opcode::nc_match_replace8,
      {"nc_match_replace8", Engine::vector, 5, {W("dst"), R("data"), R("vals"), Imm("imm"), WO("dst_idx")}});
  set(Opcode::range_select,
      {"range_select", Engine::vector, 5,
       {W("dst"), R("on_true_tile"), RS("bound0"), RS("bound1"), WO("reduce_res")}});
  set(Opcode::nc_n_gather, {"nc_n_gather", Engine::gpsimd, 3, {W("dst"), R("data"), R("indices")}});
  set(Opcode::nonzero_with_count, {"nonzero_with_count", Engine::gpsimd, 2, {W("dst"), R("src")}});
  set(Opcode::dma_compute,
      {"dma_compute", Engine::dma, 5, {W("dst"), R("srcs[0]"), RO("srcs[1]"), RO("srcs[2]"), RO("srcs[3]")}});
  set(Opcode::register_move,
      {"register_move", Engine::sync, 2,
       {SlotSpec{"dst", Access::write, kReg, false}, SlotSpec{"src", Access::read, kReg | kImm, false}}, true});
  set(Opcode::register_load,
      {"register_load", Engine::sync, 2, {SlotSpec{"dst", Access::write, kReg, false}, R("src")}, true});
  set(Opcode::register_store,
      {"register_store", Engine::sync, 2, {W("dst"), SlotSpec{"src", Access::read, kReg, false}}, true});
  set(Opcode::loop_begin,
      {"loop_begin", Engine::sync, 3,
       {SlotSpec{"counter", Access::write, kReg, false}, SlotSpec{"lower", Access::read, kReg | kImm, false},
        SlotSpec{"upper", Access::read, kReg | kImm, false}}, true});
  set(Opcode::loop_end, {"loop_end", Engine::sync, 0, {}, true});
  set(Opcode::device_print, {"device_print", Engine::sync, 1, {R("src")}, true});
  // Where the program instances of a launch meet (runtime/launch.hpp): every queue drains, and the
  // launch resumes the instance once its partners have arrived (sendrecv: with the partner's data).
  set(Opcode::core_barrier, {"core_barrier", Engine::sync, 1, {RO("data")}, true});
  set(Opcode::sendrecv, {"sendrecv", Engine::sync, 2, {W("dst"), R("src")}, true});
  return t;
}();

inline constexpr const OpcodeSpec& opcode_spec(Opcode op) { return kOpcodeSpecs[static_cast<int>(op)]; }
inline constexpr std::string_view opcode_name(Opcode op) { return opcode_spec(op).name; }
/** @brief Whether program instances of a launch meet at this instruction (core_barrier, sendrecv). */
inline constexpr bool is_meeting(Opcode op) { return op == Opcode::core_barrier || op == Opcode::sendrecv; }

/** @brief nc_stream_shuffle's shuffle_mask entry that leaves a destination lane unmodified. */
inline constexpr int32_t kShuffleKeepLane = 255;

/** @brief One operand: absent, a tensor view, an immediate or a register. */
struct Operand {
  enum class Kind : uint8_t { none, tensor, imm, reg };
  Kind kind = Kind::none;
  AccessPattern ap;     // when tensor
  double imm = 0.0;     // when imm: exact for every fp32 and int32 value
  RegisterId reg = -1;  // when reg

  static Operand none() { return {}; }
  static Operand tensor(AccessPattern a) {
    Operand o;
    o.kind = Kind::tensor;
    o.ap = std::move(a);
    return o;
  }
  static Operand immediate(double v) {
    Operand o;
    o.kind = Kind::imm;
    o.imm = v;
    return o;
  }
  static Operand reg_(RegisterId r) {
    Operand o;
    o.kind = Kind::reg;
    o.reg = r;
    return o;
  }
  bool is_none() const { return kind == Kind::none; }
  bool is_tensor() const { return kind == Kind::tensor; }
  bool is_imm() const { return kind == Kind::imm; }
  bool is_reg() const { return kind == Kind::reg; }
};

/**
 * @brief Non-operand parameters of an instruction. Each opcode reads the fields it documents;
 * the others keep their defaults (the printer shows only the fields an opcode uses).
 */
struct Attributes {
  AluOp op0 = AluOp::bypass;
  AluOp op1 = AluOp::bypass;
  ActFunc func = ActFunc::copy;
  AluOp reduce_op = AluOp::bypass;
  ReduceCmd reduce_cmd = ReduceCmd::idle;
  AluOp cmp_op = AluOp::equal;
  Accumulate accumulate = Accumulate::automatic;
  bool reverse0 = false;
  bool reverse1 = false;
  bool negate = false;
  bool keepdims = false;
  bool reverse_pred = false;
  bool is_transpose = false;           // nc_matmul bit-accurate transpose mode
  bool is_stationary_onezero = false;  // nc_matmul performance hints
  bool is_moving_onezero = false;
  uint32_t axes = 0;                // tensor_reduce: bit d set = reduce view dim d
  int64_t offset = 0;               // iota / affine_select
  int64_t channel_multiplier = 0;   // iota / affine_select
  std::vector<Dim> pattern;         // iota / affine_select [[step, num], ...]
  int64_t step = 1;                 // loop_begin
  int32_t jump = -1;                // loop_begin -> its loop_end, loop_end -> its loop_begin
  std::string text;                 // device_print prefix
  double fill_value = 0.0;          // range_select on_false_value, nonzero_with_count padding_val
  // nc_stream_shuffle: source partition of each quadrant lane (255: keep); core_barrier: the
  // program instances that meet; sendrecv: {send_to_rank, recv_from_rank, pipe_id}
  std::vector<int32_t> lanes;
  bool oob_skip = false;            // dma_copy / dma_compute: skip runtime out-of-bound elements
};

/** @brief The partners of a sendrecv, which Attributes::lanes holds as {send_to, recv_from, pipe_id}. */
struct SendRecvRanks {
  int32_t send_to = 0;    // the program instance whose dst receives this instance's src
  int32_t recv_from = 0;  // the program instance whose src this instance's dst receives
  int32_t pipe_id = 0;
  static SendRecvRanks of(const Attributes& a) {
    return a.lanes.size() == 3 ? SendRecvRanks{a.lanes[0], a.lanes[1], a.lanes[2]} : SendRecvRanks{};
  }
};

/** @brief One instruction: opcode, engine, operands (by slot), attributes, source line. */
struct Instruction {
  Opcode opcode = Opcode::tensor_copy;
  Engine engine = Engine::unknown;
  LocId loc = 0;
  std::array<Operand, kMaxSlots> operands;
  Attributes attrs;
  std::string name;  // optional user name (nisa name=)

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

/** @brief A whole kernel: storages, parameters, outputs, instructions in program order. */
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

  const SourceLocation& location(LocId id) const {
    static const SourceLocation unknown;
    return id < locations.size() ? locations[id] : unknown;
  }
  const Storage& storage(StorageId id) const { return storages.at(id); }
  const TargetConfig& config() const { return target_config(target); }
};

}  // namespace nikki
