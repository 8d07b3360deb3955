// Helpers for tests of user-facing errors: trace + compile a kernel, catch its KernelError, and
// check that the message names the test's own file:line and the expected facts.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/compile.hpp"
#include "nikki/nikki.hpp"

namespace nikki::test {

/** @brief The KernelError thrown while tracing and compiling `fn` (or nullopt when it compiles). */
template <class Fn, class... Specs>
std::optional<KernelError> kernel_error_on(const TraceOptions& options, Fn&& fn, const Specs&... specs) {
  try {
    jit::compile(trace(options, "k", std::forward<Fn>(fn), specs...));
  } catch (const KernelError& e) {
    return e;
  }
  return std::nullopt;
}

template <class Fn, class... Specs>
std::optional<KernelError> kernel_error(Fn&& fn, const Specs&... specs) {
  return kernel_error_on(TraceOptions{}, std::forward<Fn>(fn), specs...);
}

/** @brief The KernelError thrown while compiling an already traced (possibly edited) kernel. */
inline std::optional<KernelError> compile_kernel_error(Kernel kernel) {
  try {
    jit::compile(std::move(kernel));
  } catch (const KernelError& e) {
    return e;
  }
  return std::nullopt;
}

/**
 * @brief Checks that `e` is a KernelError located at `file_basename:line` whose text (summary,
 * instruction, limit and hint) contains every fragment of `parts`. `line` is taken by reference
 * because tests set it while the kernel traces, inside the same call expression.
 */
inline void check_kernel_error(const std::optional<KernelError>& e, std::string_view file_basename,
                               const int& line, std::initializer_list<std::string_view> parts) {
  REQUIRE_MESSAGE(e.has_value(), "expected a KernelError, but the kernel compiled");
  const std::string what = e->what();
  INFO("message:\n" << what);
  CHECK(print_detail::basename(e->location().file) == file_basename);
  CHECK(e->location().line == static_cast<uint32_t>(line));
  // The first line of the text form starts with file:line.
  CHECK(what.find(fmt::format("{}:{}: error: ", file_basename, line)) != std::string::npos);
  for (std::string_view p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, "missing: " << p);
}

/** @brief Checks that the kernel compiled (prints the error when it did not). */
inline void check_compiles(const std::optional<KernelError>& e) {
  CHECK_MESSAGE(!e.has_value(), (e ? e->what() : ""));
}

}  // namespace nikki::test
