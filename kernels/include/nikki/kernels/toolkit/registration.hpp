// A library kernel's registration: everything nikki knows about a prebuilt kernel, in one place,
// so that C++, Python (`nikki.kernels.<name>`), PyTorch (`torch.ops.nikki.<name>` with autograd),
// the tests (examples, randomly drawn cases, the float64 reference), the documentation table and
// the estimates benchmark all work from one definition.
//
// Naming contract used by autograd: a backward kernel's inputs are named after the forward's
// inputs and outputs, and `grad_<output>` for the gradient of a forward output; its outputs are
// named `grad_<input>` for each forward input that has a gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "nikki/nikki.hpp"
#include "nikki/numerics.hpp"

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
  /** Values a caller from Python may leave to nikki: a parameter left at its default 0 is set to
   *  the one of these with the lowest estimated time for the call's shapes (nikki.autotune's
   *  choice, cached per shape). Only for integer tiling choices that leave the results'
   *  meaning unchanged; empty for every other parameter. */
  std::vector<double> tune_over = {};
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

/** @brief A call's parameters, read by name with their declared defaults. */
struct ParamValues {
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
    spec(name);
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

/** @brief A library kernel's inputs and parameters: what its body builds the kernel from. */
struct KernelCall : ParamValues {
  const std::vector<Tensor>& inputs;
  KernelCall(const std::vector<Tensor>& in, const std::vector<ParamSpec>& specs, const Params& params)
      : ParamValues{specs, params}, inputs(in) {}
};

/** @brief A dense row-major float64 tensor: what references take and return. */
struct RefTensor {
  Shape shape;
  std::vector<double> data;

  RefTensor() = default;
  explicit RefTensor(Shape s) : shape(s), data(size_t(s.num_elements()), 0.0) {}
  int64_t size() const { return int64_t(data.size()); }
  double& operator[](int64_t i) { return data[size_t(i)]; }
  double operator[](int64_t i) const { return data[size_t(i)]; }
};

/** @brief Inputs and parameters of one call: examples and randomly drawn cases. */
struct ExampleCase {
  std::vector<TensorSpec> inputs;
  Params params;
  std::string label;  // what the case exercises ("tails", "gqa", ...)
};

/**
 * @brief The random source of property-based tests: sizes skewed toward the edges where bugs
 * live (1, tile boundaries and their neighbours) but ranging over everything in between.
 */
class CaseRng {
 public:
  explicit CaseRng(uint64_t seed) : g_(seed) {}

  /** @brief An integer in [lo, hi]. */
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_); }
  /** @brief A size in [lo, hi]: a third of the time a multiple of `tile` or one off it. */
  int64_t size(int64_t lo, int64_t hi, int64_t tile = 128) {
    if (hi >= tile && uniform(0, 2) == 0) {
      const int64_t n = tile * uniform(1, hi / tile) + uniform(-1, 1);
      return std::clamp(n, lo, hi);
    }
    return uniform(lo, hi);
  }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(g_); }
  template <class T>
  T pick(std::initializer_list<T> options) {
    return *(options.begin() + uniform(0, int64_t(options.size()) - 1));
  }
  template <class T>
  T pick(const std::vector<T>& options) {
    return options[size_t(uniform(0, int64_t(options.size()) - 1))];
  }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(g_); }

 private:
  std::mt19937_64 g_;
};

/** @brief A value rounded to `dtype` (round to nearest even, as every engine write). */
inline double round_to(DType dtype, double v) {
  uint8_t bytes[8];
  numerics::store_float(dtype, bytes, float(v));
  return numerics::load_float(dtype, bytes);
}

/** @brief Standard normal values times `scale`, rounded to `dtype`: a kernel's default inputs. */
inline RefTensor random_input(const TensorSpec& spec, CaseRng& rng, double scale = 1.0) {
  RefTensor t(spec.shape);
  for (double& x : t.data) x = round_to(spec.dtype, scale * rng.normal());
  return t;
}

/** @brief How close a kernel's result must be to its float64 reference: |got - ref| <=
 *  atol + rtol * |ref| elementwise. */
struct Tolerance {
  double rtol = 0, atol = 0;
};

/** @brief A few roundings of `dtype`, relative to values of magnitude ~1. */
inline Tolerance dtype_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bfloat16: return {2e-2, 2e-2};
    case DType::float16: return {5e-3, 5e-3};
    default: return {1e-5, 1e-5};
  }
}

/** @brief What bounds a kernel's estimated time: the Tensor engine or HBM bandwidth. */
enum class Bound { tensor_engine, hbm };

/**
 * @brief The case the estimates benchmark and docs/kernels.md report for a kernel, with the
 * useful work it does (FLOPs for Tensor-engine-bound kernels; HBM-bound ones count every input
 * read once and every output written once, unless compulsory_bytes says otherwise) and the
 * utilization it should reach.
 */
struct Benchmark {
  ExampleCase shape;
  Bound bound = Bound::hbm;
  std::function<double(const ExampleCase&)> useful_flops;  // Bound::tensor_engine only
  double goal = 0;                                         // fraction, 0 when none is set
  /** Bound::hbm: the compulsory HBM bytes when they are not every input read once and every
   *  output written once (a gather reads only the rows it names); the default when null. */
  std::function<double(const ExampleCase&)> compulsory_bytes;
};

/** @brief Everything the registry knows about one library kernel. */
struct KernelInfo {
  std::string name;     // "softmax"; the op is torch.ops.nikki.<name>
  std::string summary;  // one line
  std::string doc;      // Dimensions, Args, Returns, Notes, Pseudocode
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<ParamSpec> params;
  std::vector<DType> dtypes;  // of its floating inputs
  /** The backward kernel's name, or empty; then `gradient` says how the kernel is differentiated
   *  (by other library ops) or why it is not. */
  std::string backward;
  std::string gradient;
  /** Outputs that exist only for the backward (logsumexp, mean, rstd): the torch convenience
   *  functions do not return them. */
  std::vector<std::string> saved_outputs;
  /** Inputs the kernel updates in place (a model's KV cache): they are writable during the call,
   *  the kernel does not return them, and its reference returns their new values after the
   *  outputs, in this order. */
  std::vector<std::string> updated_inputs;
  std::function<std::vector<Tensor>(const KernelCall&)> body;
  /** The float64 reference: outputs from inputs (the values the kernel gets) and parameters,
   *  then the new values of the updated inputs. */
  std::function<std::vector<RefTensor>(const std::vector<RefTensor>&, const ParamValues&)> reference;
  /** Inputs for a case; standard normal values rounded to each input's dtype when not set
   *  (backward kernels derive their forward outputs from the forward's reference). */
  std::function<std::vector<RefTensor>(const ExampleCase&, CaseRng&)> make_inputs;
  std::vector<ExampleCase> examples;
  /** A random case for property-based tests: shapes, options and dtypes drawn from `rng`. */
  std::function<ExampleCase(CaseRng&)> draw;
  /** The accepted error for a case; dtype_tolerance of its least precise input when not set. */
  std::function<Tolerance(const ExampleCase&)> tolerance;
  std::optional<Benchmark> benchmark;

  /** @brief The inputs of `c`: make_inputs, or the default standard normal ones. */
  std::vector<RefTensor> inputs_for(const ExampleCase& c, CaseRng& rng) const {
    if (make_inputs) return make_inputs(c, rng);
    std::vector<RefTensor> in;
    for (const TensorSpec& s : c.inputs) in.push_back(random_input(s, rng));
    return in;
  }
  /** @brief The tolerance of `c`. */
  Tolerance tolerance_for(const ExampleCase& c) const {
    if (tolerance) return tolerance(c);
    Tolerance t;
    for (const TensorSpec& s : c.inputs) {
      const Tolerance d = dtype_tolerance(s.dtype);
      t = {std::max(t.rtol, d.rtol), std::max(t.atol, d.atol)};
    }
    return t;
  }
};

/**
 * @brief What a registration lacks, by name ("reference", "doc section Pseudocode:", ...): every
 * kernel needs a summary, a doc with the five sections, supported dtypes, a body, a float64
 * reference, examples, a case generator and (unless it is itself some kernel's backward) a
 * backward kernel in `all` or a `gradient` note saying how it is differentiated; example and
 * benchmark cases must give every input. Empty when nothing is missing.
 */
inline std::vector<std::string> missing_registration(const KernelInfo& k, const std::vector<KernelInfo>& all) {
  std::vector<std::string> missing;
  if (k.summary.empty()) missing.push_back("summary");
  for (const char* section : {"Dimensions:", "Args:", "Returns:", "Notes:", "Pseudocode:"})
    if (k.doc.find(section) == std::string::npos) missing.push_back(std::string("doc section ") + section);
  if (k.dtypes.empty()) missing.push_back("dtypes");
  if (!k.body) missing.push_back("body");
  if (!k.reference) missing.push_back("reference");
  if (k.examples.empty()) missing.push_back("examples");
  if (!k.draw) missing.push_back("draw (random cases)");
  for (const ExampleCase& c : k.examples)
    if (c.inputs.size() != k.inputs.size()) missing.push_back("inputs of example '" + c.label + "'");
  if (k.benchmark && k.benchmark->shape.inputs.size() != k.inputs.size()) missing.push_back("inputs of the benchmark");
  for (const std::string& u : k.updated_inputs)
    if (std::find(k.inputs.begin(), k.inputs.end(), u) == k.inputs.end())
      missing.push_back("input '" + u + "' updated in place");
  for (const ParamSpec& p : k.params)
    if (!p.tune_over.empty() && (p.kind != ParamKind::integer || p.default_value != 0))
      missing.push_back("tuned parameter '" + p.name + "' as an integer whose default 0 means 'choose'");
  bool is_backward = false;
  for (const KernelInfo& other : all) is_backward = is_backward || other.backward == k.name;
  if (!is_backward && k.backward.empty() && k.gradient.empty()) missing.push_back("backward (or a gradient note)");
  if (!k.backward.empty()) {
    bool found = false;
    for (const KernelInfo& other : all) found = found || other.name == k.backward;
    if (!found) missing.push_back("backward kernel '" + k.backward + "' in the registry");
  }
  return missing;
}

/** @brief Whether the kernel updates its input `name` in place. */
inline bool is_updated_input(const KernelInfo& info, const std::string& name) {
  return std::find(info.updated_inputs.begin(), info.updated_inputs.end(), name) != info.updated_inputs.end();
}

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
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name.empty()) specs[i].name = info.inputs[i];
    specs[i].writable = specs[i].writable || is_updated_input(info, info.inputs[i]);
  }
  return trace_specs(options, info.name, specs, [&](const std::vector<Tensor>& inputs) {
    return info.body(KernelCall{inputs, info.params, params});
  });
}

}  // namespace nikki::kernels
