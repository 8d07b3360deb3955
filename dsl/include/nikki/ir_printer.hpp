// The text form of the kernel IR: stable, readable, used by golden tests and NIKKI_DUMP.
//
//   kernel add(%a: hbm f32[128, 512], %b: hbm f32[128, 512]) -> (%out: shared_hbm f32[128, 512]) target=trn2
//     %a_t = sbuf f32[128, 512] @(0, 0)                      # add.cpp:12
//     dma_copy.dma dst=%a_t src=%a                           # add.cpp:13
//     tensor_tensor.vector op=add dst=%c data1=%a_t data2=%b_t
//   end
//
// A view that is its whole storage prints as the storage name; any other view prints its NKI
// access pattern: %x{offset, [[stride, count], ...]}, with :dtype when reinterpreted and the
// runtime offsets after it.
#pragma once

#include <string>

#include <fmt/format.h>

#include "nikki/ir.hpp"

namespace nikki {

/** @brief Printing choices. Locations print as file basename:line so golden files are portable. */
struct PrintOptions {
  bool locations = true;
};

namespace print_detail {

inline std::string basename(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

inline std::string number(double v) { return fmt::format("{}", v); }

inline std::string pattern(std::span<const Dim> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += fmt::format("{}[{}, {}]", i ? ", " : "", dims[i].stride, dims[i].count);
  return s + "]";
}

inline std::string view(const Kernel& k, const AccessPattern& ap) {
  const Storage& st = k.storage(ap.storage);
  std::string s = "%" + st.name;
  AccessPattern whole = full_view(ap.storage, st.dtype, st.shape);
  const bool same_layout = ap.dtype == st.dtype && ap.offset == 0 && ap.rank == whole.rank &&
                           std::equal(ap.dims.begin(), ap.dims.begin() + ap.rank, whole.dims.begin());
  if (!same_layout) {
    s += fmt::format("{{{}, {}}}", ap.offset, pattern(ap.pattern()));
    if (ap.dtype != st.dtype) s += fmt::format(":{}", info(ap.dtype).short_name);
  }
  if (const Indirection* ind = ap.indirection.get()) {
    if (ind->scalar_tensor)
      s += fmt::format(" +({})*{}", view(k, *ind->scalar_tensor), ind->scalar_multiplier);
    if (ind->scalar_register >= 0) s += fmt::format(" +(r{})*{}", ind->scalar_register, ind->scalar_multiplier);
    if (ind->vector_offset)
      s += fmt::format(" gather(dim {} <- {})*{}", ind->indirect_dim, view(k, *ind->vector_offset),
                       ind->vector_multiplier);
  }
  return s;
}

inline std::string operand(const Kernel& k, const Operand& o) {
  switch (o.kind) {
    case Operand::Kind::none: return "-";
    case Operand::Kind::tensor: return view(k, o.ap);
    case Operand::Kind::imm: return number(o.imm);
    case Operand::Kind::reg: return fmt::format("r{}", o.reg);
  }
  return "?";
}

inline std::string axes(uint32_t mask) {
  std::string s = "[";
  bool first = true;
  for (int d = 0; d < 32; ++d)
    if (mask & (1u << d)) {
      s += fmt::format("{}{}", first ? "" : ", ", d);
      first = false;
    }
  return s + "]";
}

/** @brief The attributes an opcode uses, in a fixed order. */
inline std::string attributes(const Instruction& inst) {
  const Attributes& a = inst.attrs;
  std::string s;
  auto add = [&](std::string_view key, const std::string& value) { s += fmt::format(" {}={}", key, value); };
  auto flag = [&](std::string_view key, bool v) {
    if (v) add(key, "true");
  };
  switch (inst.opcode) {
    case Opcode::tensor_tensor: add("op", std::string(alu_op_name(a.op0))); break;
    case Opcode::tensor_scalar:
    case Opcode::scalar_tensor_tensor:
    case Opcode::tensor_tensor_scan:
      add("op0", std::string(alu_op_name(a.op0)));
      flag("reverse0", a.reverse0);
      if (a.op1 != AluOp::bypass) add("op1", std::string(alu_op_name(a.op1)));
      flag("reverse1", a.reverse1);
      break;
    case Opcode::activation:
      add("op", std::string(act_func_name(a.func)));
      if (a.reduce_op != AluOp::bypass) add("reduce_op", std::string(alu_op_name(a.reduce_op)));
      if (a.reduce_cmd != ReduceCmd::idle) add("reduce_cmd", std::string(reduce_cmd_name(a.reduce_cmd)));
      break;
    case Opcode::tensor_reduce:
      add("op", std::string(alu_op_name(a.op0)));
      add("axis", axes(a.axes));
      flag("negate", a.negate);
      flag("keepdims", a.keepdims);
      break;
    case Opcode::tensor_scalar_reduce:
      add("op0", std::string(alu_op_name(a.op0)));
      flag("reverse0", a.reverse0);
      add("reduce_op", std::string(alu_op_name(a.reduce_op)));
      break;
    case Opcode::nc_matmul:
      if (a.accumulate != Accumulate::automatic) add("accumulate", std::string(accumulate_name(a.accumulate)));
      flag("is_transpose", a.is_transpose);
      flag("is_stationary_onezero", a.is_stationary_onezero);
      flag("is_moving_onezero", a.is_moving_onezero);
      break;
    case Opcode::iota:
    case Opcode::affine_select:
      add("pattern", pattern(a.pattern));
      if (a.offset) add("offset", fmt::to_string(a.offset));
      if (a.channel_multiplier) add("channel_multiplier", fmt::to_string(a.channel_multiplier));
      if (inst.opcode == Opcode::affine_select) add("cmp_op", std::string(alu_op_name(a.cmp_op)));
      break;
    case Opcode::tensor_copy_predicated: flag("reverse_pred", a.reverse_pred); break;
    case Opcode::select_reduce:
      flag("reverse_pred", a.reverse_pred);
      if (a.reduce_cmd != ReduceCmd::idle) {
        add("reduce_op", std::string(alu_op_name(a.reduce_op)));
        add("reduce_cmd", std::string(reduce_cmd_name(a.reduce_cmd)));
      }
      break;
    case Opcode::tensor_partition_reduce: add("op", std::string(alu_op_name(a.op0))); break;
    case Opcode::nc_stream_shuffle:
    case Opcode::core_barrier: {
      std::string lanes = "[";
      for (size_t i = 0; i < a.lanes.size(); ++i) lanes += fmt::format("{}{}", i ? ", " : "", a.lanes[i]);
      add(inst.opcode == Opcode::core_barrier ? "cores" : "shuffle_mask", lanes + "]");
      break;
    }
    case Opcode::sendrecv: {
      const SendRecvRanks r = SendRecvRanks::of(a);
      add("send_to_rank", fmt::to_string(r.send_to));
      add("recv_from_rank", fmt::to_string(r.recv_from));
      add("pipe_id", fmt::to_string(r.pipe_id));
      break;
    }
    case Opcode::range_select:
      add("comp_op0", std::string(alu_op_name(a.op0)));
      add("comp_op1", std::string(alu_op_name(a.op1)));
      if (a.offset) add("range_start", fmt::to_string(a.offset));
      add("on_false_value", fmt::to_string(a.fill_value));
      if (a.reduce_cmd != ReduceCmd::idle) {
        add("reduce_op", std::string(alu_op_name(a.reduce_op)));
        add("reduce_cmd", std::string(reduce_cmd_name(a.reduce_cmd)));
      }
      break;
    case Opcode::nonzero_with_count:
      if (a.offset) add("index_offset", fmt::to_string(a.offset));
      add("padding_val", fmt::to_string(a.fill_value));
      break;
    case Opcode::dma_compute:
      add("reduce_op", std::string(alu_op_name(a.op0)));
      flag("oob_skip", a.oob_skip);
      break;
    case Opcode::dma_copy: flag("oob_skip", a.oob_skip); break;
    case Opcode::loop_begin: add("step", fmt::to_string(a.step)); break;
    case Opcode::device_print: add("prefix", fmt::format("\"{}\"", a.text)); break;
    default: break;
  }
  return s;
}

inline std::string storage_type(const Storage& s) {
  return fmt::format("{} {}{}", buffer_name(s.buffer), info(s.dtype).short_name, s.shape.str());
}

}  // namespace print_detail

/** @brief One instruction on one line, without its location. */
inline std::string to_string(const Kernel& k, const Instruction& inst) {
  std::string s = fmt::format("{}.{}", opcode_name(inst.opcode), engine_name(inst.engine));
  if (!inst.name.empty()) s += fmt::format(" \"{}\"", inst.name);
  s += print_detail::attributes(inst);
  const OpcodeSpec& spec = inst.spec();
  for (int i = 0; i < spec.num_slots; ++i) {
    const Operand& o = inst.operands[i];
    if (o.is_none() && spec.slots[i].optional) continue;
    s += fmt::format(" {}={}", spec.slots[i].name, print_detail::operand(k, o));
  }
  return s;
}

/** @brief The whole kernel in its text form. */
inline std::string to_string(const Kernel& k, const PrintOptions& opts = {}) {
  using namespace print_detail;
  auto where = [&](LocId loc) -> std::string {
    if (!opts.locations || loc == 0) return {};
    const SourceLocation& l = k.location(loc);
    return fmt::format("  # {}:{}", basename(l.file), l.line);
  };
  auto param = [&](StorageId id) {
    const Storage& s = k.storage(id);
    return fmt::format("%{}: {}{}", s.name, storage_type(s), s.writable_input ? " mutable" : "");
  };
  std::string out = fmt::format("kernel {}(", k.name);
  for (size_t i = 0; i < k.inputs.size(); ++i) out += (i ? ", " : "") + param(k.inputs[i]);
  out += ") -> (";
  for (size_t i = 0; i < k.outputs.size(); ++i) out += (i ? ", " : "") + param(k.outputs[i]);
  out += fmt::format(") target={}\n", target_config(k.target).name);

  for (StorageId id = 0; id < k.storages.size(); ++id) {
    const Storage& s = k.storages[id];
    if (s.role == StorageRole::input) continue;
    if (s.role == StorageRole::output && std::find(k.outputs.begin(), k.outputs.end(), id) != k.outputs.end())
      continue;
    std::string line = fmt::format("  %{} = {}", s.name, storage_type(s));
    if (s.address) line += fmt::format(" @({}, {})", s.address->partition, s.address->byte_offset);
    out += line + where(s.loc) + "\n";
  }
  int depth = 1;
  for (const Instruction& inst : k.instructions) {
    if (inst.opcode == Opcode::loop_end) --depth;
    out += std::string(2 * depth, ' ') + to_string(k, inst) + where(inst.loc) + "\n";
    if (inst.opcode == Opcode::loop_begin) ++depth;
  }
  return out + "end\n";
}

}  // namespace nikki
