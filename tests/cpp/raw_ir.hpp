// Raw IR for tests: instructions the C++ authoring API cannot express (registers, runtime loops).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "nikki/nikki.hpp"

namespace nikki::test {

/** @brief A tensor operand of the kernel being traced that views `t`. */
inline Operand tensor_operand(const Tensor& t) { return t.builder().operand(t.access()); }

/** @brief Appends a raw instruction to the kernel being traced. */
inline void append(Opcode op, std::vector<Operand> operands, Attributes attrs = {},
                   std::optional<RareAttributes> rare = std::nullopt, Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  Instruction inst;
  inst.opcode = op;
  inst.loc = b.location(loc);
  inst.attrs = attrs;
  if (rare) b.rare(inst) = std::move(*rare);
  for (size_t i = 0; i < operands.size(); ++i) inst.operands[i] = operands[i];
  b.append(inst);
}

/** @brief Links each loop_end with its loop_begin (innermost first), as a front end does. */
inline void link_loops(Kernel& k) {
  std::vector<int32_t> open;
  for (int32_t n = 0; n < static_cast<int32_t>(k.instructions.size()); ++n) {
    if (k.instructions[n].opcode == Opcode::loop_begin) open.push_back(n);
    if (k.instructions[n].opcode == Opcode::loop_end) {
      k.mutable_rare(k.instructions[n]).jump = open.back();
      k.mutable_rare(k.instructions[open.back()]).jump = n;
      open.pop_back();
    }
  }
}

}  // namespace nikki::test
