// The two error types of nikki: KernelError for user mistakes, InternalError for nikki bugs.
#pragma once

#include <cstdint>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace nikki {

/** @brief A line of user code: where an IR node came from. */
struct SourceLocation {
  std::string file;
  uint32_t line = 0;
  uint32_t column = 0;
  std::string function;
  uint32_t end_column = 0;  // one past the last column of the expression, when known (Python)

  static SourceLocation from(const std::source_location& loc) {
    return {loc.file_name(), loc.line(), loc.column(), loc.function_name()};
  }
  bool known() const { return !file.empty(); }
  /** @brief "file:line" (or "<unknown location>"). */
  std::string str() const {
    return known() ? fmt::format("{}:{}", file, line) : std::string("<unknown location>");
  }
  friend bool operator==(const SourceLocation&, const SourceLocation&) = default;
};

/**
 * @brief A kernel the hardware would reject, or a misuse of the nikki API.
 *
 * Carries the user's source line, the instruction involved, the limit that was broken and a
 * hint on how to fix it, each as a separate field so front ends can lay them out (the Python
 * front end adds the source line and a caret).
 */
class KernelError : public std::runtime_error {
 public:
  KernelError(std::string what, SourceLocation where, std::string instruction = {},
              std::string limit = {}, std::string hint = {})
      : std::runtime_error(format(what, where, instruction, limit, hint)),
        summary_(std::move(what)),
        location_(std::move(where)),
        instruction_(std::move(instruction)),
        limit_(std::move(limit)),
        hint_(std::move(hint)) {}

  const std::string& summary() const { return summary_; }
  const SourceLocation& location() const { return location_; }
  const std::string& instruction() const { return instruction_; }
  const std::string& limit() const { return limit_; }
  const std::string& hint() const { return hint_; }

 private:
  static std::string format(const std::string& what, const SourceLocation& where,
                            const std::string& instruction, const std::string& limit,
                            const std::string& hint) {
    std::string s = fmt::format("{}: error: {}", where.str(), what);
    if (!instruction.empty()) s += fmt::format("\n  in: {}", instruction);
    if (!limit.empty()) s += fmt::format("\n  limit: {}", limit);
    if (!hint.empty()) s += fmt::format("\n  hint: {}", hint);
    return s;
  }

  std::string summary_;
  SourceLocation location_;
  std::string instruction_;
  std::string limit_;
  std::string hint_;
};

/** @brief A broken invariant inside nikki itself: always a nikki bug, never the user's. */
class InternalError : public std::logic_error {
 public:
  InternalError(const std::string& what, const std::source_location& where)
      : std::logic_error(fmt::format(
            "nikki internal error (this is a bug in nikki, not in your kernel): {} [{}:{}]", what,
            where.file_name(), where.line())) {}
};

/** @brief Checks an internal invariant; throws InternalError naming nikki's own line. */
inline void internal_check(bool ok, const char* what,
                           std::source_location where = std::source_location::current()) {
  if (!ok) [[unlikely]]
    throw InternalError(what, where);
}

}  // namespace nikki
