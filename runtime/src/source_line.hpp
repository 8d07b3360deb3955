// The user's source line of a device-program instruction, as profiles print it.
#pragma once

#include <string>

#include <fmt/format.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/streams.hpp"

namespace nikki::runtime {

/** "file.py:42" (the file's base name), or empty when the instruction has no location. */
inline std::string source_line(const jit::DeviceProgram& p, uint32_t ir) {
  const SourceLocation& l = p.kernel.location(p.kernel.instructions[ir].loc);
  return l.known() ? fmt::format("{}:{}", print_detail::basename(l.file), l.line) : std::string();
}

}  // namespace nikki::runtime
