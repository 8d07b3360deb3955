// Raw IR for tests: instructions the C++ authoring API cannot express (registers, runtime loops).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "nikki/nikki.hpp"

namespace nikki::test {

/** @brief Appends a raw instruction to the kernel being traced. */
inline void append(Opcode op, std::vector<Operand> operands, Attributes attrs = {}, Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  Instruction inst;
  inst.opcode = op;
  inst.loc = b.location(loc);
  inst.attrs = std::move(attrs);
  for (size_t i = 0; i < operands.size(); ++i) inst.operands[i] = std::move(operands[i]);
  b.append(std::move(inst));
}

/** @brief Links each loop_end with its loop_begin (innermost first), as a front end does. */
inline void link_loops(Kernel& k) {
  std::vector<int32_t> open;
  for (int32_t n = 0; n < static_cast<int32_t>(k.instructions.size()); ++n) {
    if (k.instructions[n].opcode == Opcode::loop_begin) open.push_back(n);
    if (k.instructions[n].opcode == Opcode::loop_end) {
      k.instructions[n].attrs.jump = open.back();
      k.instructions[open.back()].attrs.jump = n;
      open.pop_back();
    }
  }
}

}  // namespace nikki::test
