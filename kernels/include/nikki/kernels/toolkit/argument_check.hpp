// Argument checks of the library kernels. A failed check is a KernelError that names the kernel
// and points at the line that called it (from Python, the bindings then point it at the user's
// call), so that a caller sees which of its calls passed what.
#pragma once

#include <string>
#include <utility>

#include "nikki/nikki.hpp"

namespace nikki::kernels {

/** @brief A library kernel's name and call site, for the errors of its argument checks. */
class ArgumentCheck {
 public:
  /** `any_argument`: a tensor argument of the call (it gives the kernel builder being traced). */
  ArgumentCheck(std::string kernel, const Tensor& any_argument, Loc loc)
      : kernel_(std::move(kernel)), builder_(&any_argument.builder()), loc_(loc) {}

  const std::string& kernel() const { return kernel_; }

  /** @brief Throws "<kernel>: <what>" located at the call, with the limit and the fix. */
  [[noreturn]] void fail(const std::string& what, const std::string& limit = {}, const std::string& hint = {}) const {
    throw KernelError(kernel_ + ": " + what, builder_->source(builder_->location(loc_)), kernel_, limit, hint);
  }

  /** @brief fail(what, {}, hint) unless `ok`. */
  void require(bool ok, const std::string& what, const std::string& hint = {}) const {
    if (!ok) fail(what, {}, hint);
  }

 private:
  std::string kernel_;
  KernelBuilder* builder_;
  Loc loc_;
};

}  // namespace nikki::kernels
