// An instruction's attributes by name (Attr): where each one is stored, its default, and the
// attributes an instruction's opcode does not use. The printer, introspection, the device-program
// file and the Python builder go through these, driven by the opcode table (opcodes.hpp).
#pragma once

#include <cstdint>

#include "nikki/ir.hpp"

namespace nikki {

/**
 * @brief The value of a scalar attribute (every type but real, text, pattern and lanes) as an
 * integer: enums as their index, flags as 0 / 1.
 */
inline int64_t attr_int(const Kernel& k, const Instruction& inst, Attr a) {
  const Attributes& at = inst.attrs;
  switch (a) {
    case Attr::op0: return int64_t(at.op0);
    case Attr::op1: return int64_t(at.op1);
    case Attr::func: return int64_t(at.func);
    case Attr::reduce_op: return int64_t(at.reduce_op);
    case Attr::reduce_cmd: return int64_t(at.reduce_cmd);
    case Attr::cmp_op: return int64_t(at.cmp_op);
    case Attr::accumulate: return int64_t(at.accumulate);
    case Attr::reverse0: return at.reverse0;
    case Attr::reverse1: return at.reverse1;
    case Attr::negate: return at.negate;
    case Attr::keepdims: return at.keepdims;
    case Attr::reverse_pred: return at.reverse_pred;
    case Attr::is_transpose: return at.is_transpose;
    case Attr::is_stationary_onezero: return at.is_stationary_onezero;
    case Attr::is_moving_onezero: return at.is_moving_onezero;
    case Attr::oob_skip: return at.oob_skip;
    case Attr::axes: return at.axes;
    case Attr::offset: return k.rare(inst).offset;
    case Attr::channel_multiplier: return k.rare(inst).channel_multiplier;
    case Attr::step: return k.rare(inst).step;
    case Attr::jump: return k.rare(inst).jump;
    case Attr::pattern:
    case Attr::text:
    case Attr::fill_value:
    case Attr::lanes: break;
  }
  internal_check(false, "attr_int of an attribute that is not an integer");
  return 0;
}

/** @brief Largest integer value a scalar attribute takes (enums: their last index). */
inline constexpr int64_t attr_int_max(Attr a) {
  switch (attr_spec(a).type) {
    case AttrType::alu_op: return kNumAluOps - 1;
    case AttrType::act_func: return kNumActFuncs - 1;
    case AttrType::reduce_cmd: return int64_t(ReduceCmd::load_reduce);
    case AttrType::accumulate: return int64_t(Accumulate::accumulate);
    case AttrType::flag: return 1;
    case AttrType::axes: return UINT32_MAX;
    default: return a == Attr::jump ? INT32_MAX : INT64_MAX;
  }
}

/** @brief Lowest integer value a scalar attribute takes. */
inline constexpr int64_t attr_int_min(Attr a) {
  if (attr_spec(a).type != AttrType::integer) return 0;
  return a == Attr::jump ? INT32_MIN : INT64_MIN;
}

/** @brief Sets a scalar attribute from its integer value (in [attr_int_min, attr_int_max]). */
inline void set_attr_int(Kernel& k, Instruction& inst, Attr a, int64_t v) {
  internal_check(v >= attr_int_min(a) && v <= attr_int_max(a), "attribute value out of range");
  Attributes& at = inst.attrs;
  switch (a) {
    case Attr::op0: at.op0 = AluOp(v); return;
    case Attr::op1: at.op1 = AluOp(v); return;
    case Attr::func: at.func = ActFunc(v); return;
    case Attr::reduce_op: at.reduce_op = AluOp(v); return;
    case Attr::reduce_cmd: at.reduce_cmd = ReduceCmd(v); return;
    case Attr::cmp_op: at.cmp_op = AluOp(v); return;
    case Attr::accumulate: at.accumulate = Accumulate(v); return;
    case Attr::reverse0: at.reverse0 = v != 0; return;
    case Attr::reverse1: at.reverse1 = v != 0; return;
    case Attr::negate: at.negate = v != 0; return;
    case Attr::keepdims: at.keepdims = v != 0; return;
    case Attr::reverse_pred: at.reverse_pred = v != 0; return;
    case Attr::is_transpose: at.is_transpose = v != 0; return;
    case Attr::is_stationary_onezero: at.is_stationary_onezero = v != 0; return;
    case Attr::is_moving_onezero: at.is_moving_onezero = v != 0; return;
    case Attr::oob_skip: at.oob_skip = v != 0; return;
    case Attr::axes: at.axes = uint32_t(v); return;
    case Attr::offset: k.mutable_rare(inst).offset = v; return;
    case Attr::channel_multiplier: k.mutable_rare(inst).channel_multiplier = v; return;
    case Attr::step: k.mutable_rare(inst).step = v; return;
    case Attr::jump: k.mutable_rare(inst).jump = int32_t(v); return;
    case Attr::pattern:
    case Attr::text:
    case Attr::fill_value:
    case Attr::lanes: break;
  }
  internal_check(false, "set_attr_int of an attribute that is not an integer");
}

/** @brief Whether attribute `a` of `inst` holds its default value. */
inline bool attr_is_default(const Kernel& k, const Instruction& inst, Attr a) {
  static const Instruction fresh;
  static const RareAttributes defaults;
  const RareAttributes& r = k.rare(inst);
  switch (a) {
    case Attr::pattern: return r.pattern.empty();
    case Attr::text: return r.text.empty();
    case Attr::fill_value: return r.fill_value == defaults.fill_value;
    case Attr::lanes: return r.lanes.empty();
    default: break;
  }
  if (attr_spec(a).rare && inst.rare == kNoRareAttributes) return true;
  static const Kernel empty;
  return attr_int(k, inst, a) == attr_int(empty, fresh, a);
}

/**
 * @brief The first attribute `inst` sets although its opcode does not use it, or nullopt. A
 * front end that sets one has a bug: nothing reads it, and the file format does not keep it.
 */
inline std::optional<Attr> unused_attribute_set(const Kernel& k, const Instruction& inst) {
  const OpcodeSpec& spec = inst.spec();
  for (int i = 0; i < kNumAttrs; ++i) {
    const Attr a = static_cast<Attr>(i);
    if (spec.uses(a) || (attr_spec(a).rare && inst.rare == kNoRareAttributes)) continue;
    if (!attr_is_default(k, inst, a)) return a;
  }
  return std::nullopt;
}

}  // namespace nikki
