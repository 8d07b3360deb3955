// The library kernel description: what the registry knows about each prebuilt kernel so that C++,
// Python (`nikki.kernels.<name>`) and PyTorch (`torch.ops.nikki.<name>`, autograd) can all call it
// from one definition.
//
// Naming contract used by autograd: a backward kernel's inputs are named after the forward's
// inputs and outputs, and `grad_<output>` for the gradient of a forward output; its outputs are
// named `grad_<input>` for each forward input that has a gradient.
#pragma once

#include <cmath>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "nikki/nikki.hpp"

namespace nikki::kernels {

/** @brief The number of size-b pieces that cover a (a >= 0, b > 0): tiles, chunks, blocks. */
inline constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/** @brief The type of a scalar kernel parameter (a compile-time constant, like eps or causal). */
enum class ParamKind { boolean, integer, real, optional_real };

/** @brief One scalar parameter of a library kernel. */
struct ParamSpec {
  std::string name;
  ParamKind kind = ParamKind::real;
  double default_value = 0;  // ignored for optional_real, whose default is "not given"
  std::string doc;
};

/** @brief Parameter values for one call; missing names take their defaults. */
class Params {
 public:
  Params() = default;
  Params(std::initializer_list<std::pair<std::string, double>> values) : values_(values) {}

  /** @brief Sets a value (NaN for an optional_real that is not given). */
  Params& set(std::string name, double value) {
    for (auto& [n, v] : values_)
      if (n == name) {
        v = value;
        return *this;
      }
    values_.emplace_back(std::move(name), value);
    return *this;
  }
  std::optional<double> find(const std::string& name) const {
    for (const auto& [n, v] : values_)
      if (n == name) return v;
    return std::nullopt;
  }
  const std::vector<std::pair<std::string, double>>& values() const { return values_; }

 private:
  std::vector<std::pair<std::string, double>> values_;
};

/** @brief A library kernel's inputs, resolved parameters and the call that builds its body. */
struct KernelCall {
  const std::vector<Tensor>& inputs;
  const std::vector<ParamSpec>& specs;
  const Params& params;

  /** @brief The value of a parameter (its default when not given). */
  double real(const std::string& name) const {
    if (auto v = params.find(name)) return *v;
    return spec(name).default_value;
  }
  bool flag(const std::string& name) const { return real(name) != 0; }
  int64_t integer(const std::string& name) const { return static_cast<int64_t>(real(name)); }
  /** @brief An optional_real parameter: nullopt when not given (or given as NaN). */
  std::optional<double> optional_real(const std::string& name) const {
    auto v = params.find(name);
    if (!v || std::isnan(*v)) return std::nullopt;
    return v;
  }

 private:
  const ParamSpec& spec(const std::string& name) const {
    for (const ParamSpec& s : specs)
      if (s.name == name) return s;
    throw InternalError("library kernel reads undeclared parameter '" + name + "'", std::source_location::current());
  }
};

/** @brief Inputs and parameters of one example call: registry-driven tests sweep these. */
struct ExampleCase {
  std::vector<TensorSpec> inputs;
  Params params;
  std::string label;  // what the case exercises ("tails", "gqa", ...)
};

/** @brief Everything the registry knows about one library kernel. */
struct KernelInfo {
  std::string name;     // "softmax"; the op is torch.ops.nikki.<name>
  std::string summary;  // one line
  std::string doc;      // Dimensions, Args, Returns, Notes, Pseudocode
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<ParamSpec> params;
  std::string backward;  // the backward kernel's name, or empty
  /** Outputs that exist only for the backward (logsumexp, mean, rstd): the torch convenience
   *  functions do not return them. */
  std::vector<std::string> saved_outputs;
  std::function<std::vector<Tensor>(const KernelCall&)> body;
  std::vector<ExampleCase> examples;
};

/**
 * @brief Checks a call of a library kernel: the number of inputs, that none is empty (the
 * kernels tile their inputs: an empty dim has no tiles) and the parameter names. Throws
 * KernelError naming the expected inputs, the empty input and its shape, or the unknown parameter.
 */
inline void check_library_call(const KernelInfo& info, std::span<const Shape> input_shapes, const Params& params) {
  const size_t num_inputs = input_shapes.size();
  if (num_inputs != info.inputs.size())
    throw KernelError("kernel '" + info.name + "' takes " + std::to_string(info.inputs.size()) + " inputs (" +
                          fmt::format("{}", fmt::join(info.inputs, ", ")) + "), got " + std::to_string(num_inputs),
                      SourceLocation{}, info.name);
  for (size_t i = 0; i < num_inputs; ++i)
    for (int64_t extent : input_shapes[i])
      if (extent < 1)
        throw KernelError(fmt::format("kernel '{}': input '{}' has shape {} with no elements", info.name,
                                      info.inputs[i], input_shapes[i].str()),
                          SourceLocation{}, info.name, "library kernels take inputs with every extent >= 1",
                          "skip the call when an input is empty; its result is known without running a kernel");
  for (const auto& [name, value] : params.values()) {
    bool known = false;
    for (const ParamSpec& p : info.params) known = known || p.name == name;
    if (!known) throw KernelError("kernel '" + info.name + "' has no parameter '" + name + "'", SourceLocation{}, info.name);
  }
}

/**
 * @brief Traces a library kernel for concrete input specs. Throws KernelError when the number of
 * inputs is wrong or a parameter is unknown, and whatever the kernel body throws for bad shapes.
 */
inline Kernel trace_library_kernel(const KernelInfo& info, std::vector<TensorSpec> specs, const Params& params,
                                   const TraceOptions& options = {}) {
  std::vector<Shape> shapes;
  for (const TensorSpec& s : specs) shapes.push_back(s.shape);
  check_library_call(info, shapes, params);
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name.empty()) specs[i].name = info.inputs[i];
  return trace_specs(options, info.name, specs, [&](const std::vector<Tensor>& inputs) {
    return info.body(KernelCall{inputs, info.params, params});
  });
}

}  // namespace nikki::kernels
