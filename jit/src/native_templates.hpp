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

/**
 * @brief What native compilation derives from a program before generating code: its distinct
 * templates and every instruction's run-time operands. Deriving it costs about a microsecond per
 * instruction, so the disk cache keeps it beside the device program.
 */
struct NativePlan {
  static constexpr uint32_t kInterpreted = UINT32_MAX;  // template_id of an instruction without a routine
  std::vector<NativeTemplate> templates;
  std::vector<NativeInstruction> instructions;  // one per kernel instruction; routines not yet set
  int64_t fallbacks = 0;                        // non-control instructions left to the reference semantics
  std::vector<std::string> entry_names;         // a loaded plan's entries (templates point into them)

  NativePlan() = default;
  NativePlan(NativePlan&&) = default;
  NativePlan& operator=(NativePlan&&) = default;
  NativePlan(const NativePlan&) = delete;  // a copy's templates would point into the original's names
};

/** @brief Derives the plan of `kernel`: make_template for every instruction, equal templates merged. */
NativePlan plan_native(const Kernel& kernel);

/** @brief The plan in the cache's encoding (fixed-width fields; run-time offsets as a flag),
 * stamped with `program_key`, the disk-cache key of the program it was derived from. */
std::vector<uint8_t> serialize_plan(const NativePlan& plan, const Hash128& program_key);

/** @brief A plan read back for `kernel` (whose program has `program_key`), or nullopt when the
 * bytes do not describe a plan of that program. */
std::optional<NativePlan> deserialize_plan(const std::vector<uint8_t>& bytes, const Kernel& kernel,
                                          const Hash128& program_key);

/** @brief Routines for a template set, in template order; `keep_alive` owns their code. */
struct GeneratedRoutines {
  std::vector<native::Routine> routines;
  std::shared_ptr<void> keep_alive;
  CodeOrigin origin = CodeOrigin::none;
  int64_t compiled = 0;    // templates LLVM generated code for
  int64_t code_bytes = 0;  // estimated memory of the loaded code
};

/** @brief One routine per template (LLVM ORC, or object code cached on disk or in memory). */
GeneratedRoutines generate_routines(const std::vector<NativeTemplate>& templates);

}  // namespace nikki::jit
