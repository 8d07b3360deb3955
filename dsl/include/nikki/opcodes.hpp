// The opcode table: for every instruction kind, its NKI name, default engine, operand slots and
// the attributes it uses. It is the one description of an opcode's signature: the builder checks
// operands and attributes against it, the printer prints, introspection (Python) lists, the
// device-program file stores and the verifier names attributes from it.
//
// Adding an opcode (docs/architecture.md, "Adding an opcode"): append it to `Opcode` (and point
// kNumOpcodes at the new last enumerator), add one `set(...)` line to kOpcodeSpecs with its slots
// and attribute uses, then give it verifier rules
// (jit/src/verify.cpp), reference semantics (runtime/src/reference_semantics.cpp), a cost
// (dsl/include/nikki/cost_model.hpp) and front-end functions. A new kind of attribute is a new
// `Attr` with its AttrSpec below and its field in Attributes / RareAttributes (ir.hpp), bound in
// ir_attributes.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "nikki/ops.hpp"
#include "nikki/target.hpp"

namespace nikki {

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
  local_gather,
};
inline constexpr int kNumOpcodes = static_cast<int>(Opcode::local_gather) + 1;

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

// --- attributes ---------------------------------------------------------------------------------

/**
 * @brief Every non-operand parameter an instruction can have. The first group lives inline in
 * each Instruction (Attributes); the rest, which few opcodes use, in a side table of the kernel
 * (RareAttributes).
 */
enum class Attr : uint8_t {
  op0, op1, func, reduce_op, reduce_cmd, cmp_op, accumulate,
  reverse0, reverse1, negate, keepdims, reverse_pred, is_transpose, is_stationary_onezero, is_moving_onezero,
  oob_skip, axes,
  // rare
  offset, channel_multiplier, pattern, step, jump, text, fill_value, lanes,
};
inline constexpr int kNumAttrs = static_cast<int>(Attr::lanes) + 1;

/** @brief The value kind of an attribute, which decides how it is printed, stored and bound. */
enum class AttrType : uint8_t {
  alu_op,      // AluOp
  act_func,    // ActFunc
  reduce_cmd,  // ReduceCmd
  accumulate,  // Accumulate
  flag,        // bool
  axes,        // uint32_t bit mask of view dims
  integer,     // int64_t
  real,        // double
  text,        // std::string
  pattern,     // std::vector<Dim>: [[step, num], ...]
  lanes,       // std::vector<int32_t>
};

/** @brief An attribute's name (the IR field, the Python keyword and the introspection key) and type. */
struct AttrSpec {
  std::string_view name;
  AttrType type;
  bool rare = false;  // stored in the kernel's RareAttributes side table
};

inline constexpr std::array<AttrSpec, kNumAttrs> kAttrSpecs = {{
    {"op0", AttrType::alu_op},
    {"op1", AttrType::alu_op},
    {"func", AttrType::act_func},
    {"reduce_op", AttrType::alu_op},
    {"reduce_cmd", AttrType::reduce_cmd},
    {"cmp_op", AttrType::alu_op},
    {"accumulate", AttrType::accumulate},
    {"reverse0", AttrType::flag},
    {"reverse1", AttrType::flag},
    {"negate", AttrType::flag},
    {"keepdims", AttrType::flag},
    {"reverse_pred", AttrType::flag},
    {"is_transpose", AttrType::flag},
    {"is_stationary_onezero", AttrType::flag},
    {"is_moving_onezero", AttrType::flag},
    {"oob_skip", AttrType::flag},
    {"axes", AttrType::axes},
    {"offset", AttrType::integer, true},
    {"channel_multiplier", AttrType::integer, true},
    {"pattern", AttrType::pattern, true},
    {"step", AttrType::integer, true},
    {"jump", AttrType::integer, true},
    {"text", AttrType::text, true},
    {"fill_value", AttrType::real, true},
    {"lanes", AttrType::lanes, true},
}};

inline constexpr const AttrSpec& attr_spec(Attr a) { return kAttrSpecs[static_cast<int>(a)]; }
inline constexpr uint32_t attr_bit(Attr a) { return 1u << static_cast<int>(a); }
static_assert(kNumAttrs <= 32, "OpcodeSpec::attr_mask has one bit per attribute");

/** @brief When the text form shows an attribute. */
enum class AttrShown : uint8_t {
  always,
  unless_default,  // only a value other than the attribute's default
  when_reducing,   // only when the instruction's reduce_cmd is not idle
  never,           // structure the text shows otherwise (a loop's jump target)
  each_element,    // a lanes attribute whose elements are NKI parameters of their own, named in
                   // order by the use's nki_name, comma separated (sendrecv's ranks)
};

/** @brief One attribute an opcode uses: which, its NKI parameter name, and when it is printed. */
struct AttrUse {
  Attr attr = Attr::op0;
  std::string_view nki_name;
  AttrShown shown = AttrShown::always;
};

inline constexpr int kMaxAttrUses = 8;

/** @brief The static signature of an opcode: name, default engine, operand slots, attributes. */
struct OpcodeSpec {
  std::string_view name;
  Engine default_engine;
  uint8_t num_slots;
  std::array<SlotSpec, kMaxSlots> slots;
  bool is_control = false;  // register, loop and meeting instructions run on the sequencer
  uint8_t num_attrs = 0;
  std::array<AttrUse, kMaxAttrUses> attrs{};  // in the order the text form prints them
  uint32_t attr_mask = 0;                     // attr_bit of every attribute in `attrs`

  constexpr bool uses(Attr a) const { return (attr_mask & attr_bit(a)) != 0; }
  /** @brief The NKI parameter name of an attribute this opcode uses (its IR name otherwise). */
  constexpr std::string_view nki_name(Attr a) const {
    for (int i = 0; i < num_attrs; ++i)
      if (attrs[i].attr == a) return attrs[i].nki_name;
    return attr_spec(a).name;
  }
};

namespace detail {
inline constexpr SlotSpec W(std::string_view n) { return {n, Access::write, kTensor, false}; }
inline constexpr SlotSpec R(std::string_view n) { return {n, Access::read, kTensor, false}; }
inline constexpr SlotSpec RO(std::string_view n) { return {n, Access::read, kTensor, true}; }
inline constexpr SlotSpec WO(std::string_view n) { return {n, Access::write, kTensor, true}; }
inline constexpr SlotSpec RS(std::string_view n) { return {n, Access::read, kTensor | kImm, false}; }
inline constexpr SlotSpec RSO(std::string_view n) { return {n, Access::read, kTensor | kImm, true}; }
inline constexpr SlotSpec Imm(std::string_view n) { return {n, Access::read, kImm, false}; }
inline constexpr SlotSpec RegW(std::string_view n) { return {n, Access::write, kReg, false}; }
inline constexpr SlotSpec RegR(std::string_view n) { return {n, Access::read, kReg, false}; }
inline constexpr SlotSpec RegOrImm(std::string_view n) { return {n, Access::read, kReg | kImm, false}; }

/** Attribute uses: printed always, only when not the default, only while reducing, never. */
inline constexpr AttrUse A(Attr a, std::string_view nki = {}) {
  return {a, nki.empty() ? attr_spec(a).name : nki, AttrShown::always};
}
inline constexpr AttrUse Set(Attr a, std::string_view nki = {}) {
  return {a, nki.empty() ? attr_spec(a).name : nki, AttrShown::unless_default};
}
inline constexpr AttrUse Reducing(Attr a) { return {a, attr_spec(a).name, AttrShown::when_reducing}; }
inline constexpr AttrUse Hidden(Attr a) { return {a, attr_spec(a).name, AttrShown::never}; }
inline constexpr AttrUse Each(Attr a, std::string_view nki_names) { return {a, nki_names, AttrShown::each_element}; }
}  // namespace detail

inline constexpr std::array<OpcodeSpec, kNumOpcodes> kOpcodeSpecs = [] {
  using namespace detail;
  using enum Attr;
  std::array<OpcodeSpec, kNumOpcodes> t{};
  auto set = [&](Opcode op, OpcodeSpec s, std::initializer_list<AttrUse> attrs = {}) {
    for (const AttrUse& use : attrs) {
      s.attrs[s.num_attrs++] = use;
      s.attr_mask |= attr_bit(use.attr);
    }
    t[static_cast<int>(op)] = s;
  };
  set(Opcode::dma_copy, {"dma_copy", Engine::dma, 2, {W("dst"), R("src")}}, {Set(oob_skip)});
  set(Opcode::tensor_copy, {"tensor_copy", Engine::vector, 2, {W("dst"), R("src")}});
  set(Opcode::tensor_tensor, {"tensor_tensor", Engine::vector, 3, {W("dst"), R("data1"), R("data2")}},
      {A(op0, "op")});
  set(Opcode::tensor_scalar,
      {"tensor_scalar", Engine::vector, 4, {W("dst"), R("data"), RS("operand0"), RSO("operand1")}},
      {A(op0), Set(reverse0), Set(op1), Set(reverse1)});
  set(Opcode::scalar_tensor_tensor,
      {"scalar_tensor_tensor", Engine::vector, 4, {W("dst"), R("data"), RS("operand0"), R("operand1")}},
      {A(op0), Set(reverse0), Set(op1), Set(reverse1)});
  set(Opcode::activation,
      {"activation", Engine::scalar, 5, {W("dst"), R("data"), RO("bias"), RS("scale"), WO("reduce_res")}},
      {A(func, "op"), Set(reduce_op), Set(reduce_cmd)});
  set(Opcode::tensor_reduce, {"tensor_reduce", Engine::vector, 2, {W("dst"), R("data")}},
      {A(op0, "op"), A(axes, "axis"), Set(negate), Set(keepdims)});
  set(Opcode::tensor_scalar_reduce,
      {"tensor_scalar_reduce", Engine::vector, 4, {W("dst"), R("data"), RS("operand0"), WO("reduce_res")}},
      {A(op0), Set(reverse0), A(reduce_op)});
  set(Opcode::nc_matmul, {"nc_matmul", Engine::tensor, 3, {W("dst"), R("stationary"), R("moving")}},
      {Set(accumulate), Set(is_transpose), Set(is_stationary_onezero), Set(is_moving_onezero)});
  set(Opcode::nc_transpose, {"nc_transpose", Engine::tensor, 2, {W("dst"), R("data")}});
  set(Opcode::memset, {"memset", Engine::vector, 2, {W("dst"), Imm("value")}});
  set(Opcode::iota, {"iota", Engine::gpsimd, 1, {W("dst")}},
      {A(pattern), Set(offset), Set(channel_multiplier)});
  set(Opcode::affine_select,
      {"affine_select", Engine::gpsimd, 3, {W("dst"), R("on_true_tile"), Imm("on_false_value")}},
      {A(pattern), Set(offset), Set(channel_multiplier), A(cmp_op)});
  set(Opcode::bn_stats, {"bn_stats", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::bn_aggr, {"bn_aggr", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::tensor_tensor_scan,
      {"tensor_tensor_scan", Engine::vector, 4, {W("dst"), R("data0"), R("data1"), RS("initial")}},
      {A(op0), Set(reverse0), Set(op1), Set(reverse1)});
  set(Opcode::reciprocal, {"reciprocal", Engine::vector, 2, {W("dst"), R("data")}});
  set(Opcode::tensor_copy_predicated,
      {"tensor_copy_predicated", Engine::vector, 3,
       {SlotSpec{"dst", Access::read_write, kTensor, false}, RS("src"), R("predicate")}},
      {Set(reverse_pred)});
  set(Opcode::select_reduce,
      {"select_reduce", Engine::vector, 5, {W("dst"), R("predicate"), R("on_true"), RS("on_false"), WO("reduce_res")}},
      {Set(reverse_pred), Reducing(reduce_op), Reducing(reduce_cmd)});
  set(Opcode::max8, {"max8", Engine::vector, 2, {W("dst"), R("src")}});
  set(Opcode::nc_find_index8, {"nc_find_index8", Engine::vector, 3, {W("dst"), R("data"), R("vals")}});
  set(Opcode::tensor_partition_reduce, {"tensor_partition_reduce", Engine::gpsimd, 2, {W("dst"), R("data")}},
      {A(op0, "op")});
  set(Opcode::nc_stream_shuffle, {"nc_stream_shuffle", Engine::vector, 2, {W("dst"), R("src")}},
      {A(lanes, "shuffle_mask")});
  set(Opcode::nc_match_replace8,
      {"nc_match_replace8", Engine::vector, 5, {W("dst"), R("data"), R("vals"), Imm("imm"), WO("dst_idx")}});
  set(Opcode::range_select,
      {"range_select", Engine::vector, 5, {W("dst"), R("on_true_tile"), RS("bound0"), RS("bound1"), WO("reduce_res")}},
      {A(op0, "comp_op0"), A(op1, "comp_op1"), Set(offset, "range_start"), A(fill_value, "on_false_value"),
       Reducing(reduce_op), Reducing(reduce_cmd)});
  set(Opcode::nc_n_gather, {"nc_n_gather", Engine::gpsimd, 3, {W("dst"), R("data"), R("indices")}});
  set(Opcode::nonzero_with_count, {"nonzero_with_count", Engine::gpsimd, 2, {W("dst"), R("src")}},
      {Set(offset, "index_offset"), A(fill_value, "padding_val")});
  set(Opcode::dma_compute,
      {"dma_compute", Engine::dma, 5, {W("dst"), R("srcs[0]"), RO("srcs[1]"), RO("srcs[2]"), RO("srcs[3]")}},
      {A(op0, "reduce_op"), Set(oob_skip)});
  set(Opcode::register_move, {"register_move", Engine::sync, 2, {RegW("dst"), RegOrImm("src")}, true});
  set(Opcode::register_load, {"register_load", Engine::sync, 2, {RegW("dst"), R("src")}, true});
  set(Opcode::register_store, {"register_store", Engine::sync, 2, {W("dst"), RegR("src")}, true});
  set(Opcode::loop_begin,
      {"loop_begin", Engine::sync, 3, {RegW("counter"), RegOrImm("lower"), RegOrImm("upper")}, true},
      {A(step), Hidden(jump)});
  set(Opcode::loop_end, {"loop_end", Engine::sync, 0, {}, true}, {Hidden(jump)});
  set(Opcode::device_print, {"device_print", Engine::sync, 1, {R("src")}, true}, {A(text, "prefix")});
  // Where the program instances of a launch meet (runtime/launch.hpp): every queue drains, and the
  // launch resumes the instance once its partners have arrived (sendrecv: with the partner's data).
  set(Opcode::core_barrier, {"core_barrier", Engine::sync, 1, {RO("data")}, true}, {A(lanes, "cores")});
  set(Opcode::sendrecv, {"sendrecv", Engine::sync, 2, {W("dst"), R("src")}, true},
      {Each(lanes, "send_to_rank,recv_from_rank,pipe_id")});
  set(Opcode::local_gather, {"local_gather", Engine::gpsimd, 3, {W("dst"), R("src_buffer"), R("index")}},
      {A(step, "num_elem_per_idx"), A(offset, "num_valid_indices")});
  return t;
}();

inline constexpr const OpcodeSpec& opcode_spec(Opcode op) { return kOpcodeSpecs[static_cast<int>(op)]; }
inline constexpr std::string_view opcode_name(Opcode op) { return opcode_spec(op).name; }
/** @brief Whether program instances of a launch meet at this instruction (core_barrier, sendrecv). */
inline constexpr bool is_meeting(Opcode op) { return op == Opcode::core_barrier || op == Opcode::sendrecv; }

/** @brief The attribute named `name` (its AttrSpec name), or nullopt. */
inline constexpr std::optional<Attr> find_attr(std::string_view name) {
  for (int i = 0; i < kNumAttrs; ++i)
    if (kAttrSpecs[i].name == name) return static_cast<Attr>(i);
  return std::nullopt;
}

}  // namespace nikki
