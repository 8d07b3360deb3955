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

#include "nikki/ir_attributes.hpp"

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
  switch (o.kind()) {
    case Operand::Kind::none: return "-";
    case Operand::Kind::tensor: return view(k, k.view(o));
    case Operand::Kind::imm: return number(o.imm());
    case Operand::Kind::reg: return fmt::format("r{}", o.reg());
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

/** @brief An attribute's value in the text form. */
inline std::string attribute_value(const Kernel& k, const Instruction& inst, Attr a) {
  const RareAttributes& r = k.rare(inst);
  switch (attr_spec(a).type) {
    case AttrType::alu_op: return std::string(alu_op_name(AluOp(attr_int(k, inst, a))));
    case AttrType::act_func: return std::string(act_func_name(ActFunc(attr_int(k, inst, a))));
    case AttrType::reduce_cmd: return std::string(reduce_cmd_name(ReduceCmd(attr_int(k, inst, a))));
    case AttrType::accumulate: return std::string(accumulate_name(Accumulate(attr_int(k, inst, a))));
    case AttrType::flag: return attr_int(k, inst, a) ? "true" : "false";
    case AttrType::axes: return axes(uint32_t(attr_int(k, inst, a)));
    case AttrType::integer: return fmt::to_string(attr_int(k, inst, a));
    case AttrType::real: return fmt::to_string(r.fill_value);
    case AttrType::text: return fmt::format("\"{}\"", r.text);
    case AttrType::pattern: return pattern(r.pattern);
    case AttrType::lanes: return fmt::format("[{}]", fmt::join(r.lanes, ", "));
  }
  return "?";
}

/** @brief The attributes an opcode uses, in its OpcodeSpec's order, each when its rule shows it. */
inline std::string attributes(const Kernel& k, const Instruction& inst) {
  const OpcodeSpec& spec = inst.spec();
  std::string s;
  for (int i = 0; i < spec.num_attrs; ++i) {
    const AttrUse& use = spec.attrs[i];
    if (use.shown == AttrShown::never) continue;
    if (use.shown == AttrShown::unless_default && attr_is_default(k, inst, use.attr)) continue;
    if (use.shown == AttrShown::when_reducing && inst.attrs.reduce_cmd == ReduceCmd::idle) continue;
    if (use.shown == AttrShown::each_element) {
      const std::vector<int32_t>& lanes = k.rare(inst).lanes;
      std::string_view names = use.nki_name;
      for (size_t e = 0; !names.empty(); ++e) {
        const size_t comma = names.find(',');
        s += fmt::format(" {}={}", names.substr(0, comma), e < lanes.size() ? fmt::to_string(lanes[e]) : "-");
        names = comma == std::string_view::npos ? std::string_view() : names.substr(comma + 1);
      }
      continue;
    }
    s += fmt::format(" {}={}", use.nki_name, attribute_value(k, inst, use.attr));
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
  if (inst.name != 0) s += fmt::format(" \"{}\"", k.instruction_name(inst));
  s += print_detail::attributes(k, inst);
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
