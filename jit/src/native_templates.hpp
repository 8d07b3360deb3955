// Instruction -> native template: the constant descriptor a generated routine is specialized on,
// and where the executor finds each operand. Internal to jit/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nikki/jit/native.hpp"
#include "op_desc.hpp"

namespace nikki::jit {

/** @brief A routine to generate: a library entry specialized on a constant descriptor. */
struct NativeTemplate {
  native::OpDesc desc;
  const char* entry = nullptr;  // library function, e.g. "nk_tensor_tensor"
};

/** @brief The template of instruction `index` and its run-time operands, or nullopt when the
 * instruction has no native form (it then runs through the reference semantics). */
std::optional<std::pair<NativeTemplate, NativeInstruction>> make_template(const Kernel& kernel, uint32_t index);

/** @brief Generates one routine per template (LLVM ORC). `keep_alive` owns the code. */
std::vector<native::Routine> generate_routines(const std::vector<NativeTemplate>& templates,
                                               std::shared_ptr<void>& keep_alive);

}  // namespace nikki::jit
