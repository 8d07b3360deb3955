// Registry-driven checks of every library kernel: each registration is complete, and every example
// and randomly drawn case matches the kernel's float64 reference, writes every output element,
// gives the same bits on the native executor as on the reference semantics, and the same bits
// when its tasks are emitted in declaration order (the task scheduler only changes overlap).
// Python sweeps more drawn cases and compares against PyTorch too (tests/python/kernels).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "harness.hpp"
#include "nikki/kernels/registry.hpp"
#include "scoped_env.hpp"

namespace nikki::test {
namespace {

using kernels::KernelInfo;

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

/** The integer environment variable `name`, at least `minimum`; `fallback` when unset. */
int64_t env_int(const char* name, int64_t fallback, int64_t minimum) {
  const char* v = std::getenv(name);
  return v ? std::max<int64_t>(minimum, std::atoll(v)) : fallback;
}

/** Drawn cases per kernel: NIKKI_SWEEP_CASES, 3 by default (`make sweep` runs many more). */
int64_t drawn_cases() { return env_int("NIKKI_SWEEP_CASES", 3, 0); }

/** The first drawn case's seed: NIKKI_SWEEP_SEED, 1 by default (a long sweep starts past the
 *  seeds the test suite already draws). */
int64_t first_drawn_seed() { return env_int("NIKKI_SWEEP_SEED", 1, 1); }

/** Whether to check kernel `name`: NIKKI_KERNELS (comma-separated names) narrows the checks of
 *  examples and drawn cases to those kernels; unset, every kernel. */
bool selected(const std::string& name) {
  const char* v = std::getenv("NIKKI_KERNELS");
  if (v == nullptr || *v == 0) return true;
  const std::string list = std::string(",") + v + ",";
  return list.find("," + name + ",") != std::string::npos;
}

std::vector<HostTensor> host_inputs(const kernels::ExampleCase& c, const std::vector<kernels::RefTensor>& values) {
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    HostTensor t(c.inputs[i].dtype, c.inputs[i].shape);
    for (int64_t e = 0; e < t.size(); ++e) t.set(e, float(values[i][e]));  // exact: rounded to the dtype
    inputs.push_back(std::move(t));
  }
  return inputs;
}

/** The largest |got - ref| beyond the tolerance (atol relative to the output's magnitude), or 0. */
double excess_error(const HostTensor& got, const kernels::RefTensor& ref, const kernels::Tolerance& tol) {
  double peak = 1.0;
  for (double r : ref.data) peak = std::max(peak, std::fabs(r));
  double worst = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.get(i), r = ref[i], allowed = tol.atol * peak + tol.rtol * std::fabs(r);
    const double err = std::isnan(g) ? INFINITY : std::fabs(g - r);
    if (err > allowed) worst = std::max(worst, err);
  }
  return worst;
}

/** The results of one run: the outputs, then the inputs the kernel updates in place (each run
 *  gets fresh copies of the inputs, so an in-place update is checked once per run). */
std::vector<HostTensor> run_case(const KernelInfo& k, Kernel kernel, const std::vector<HostTensor>& inputs, Mode mode) {
  std::vector<HostTensor> copies = inputs;
  std::vector<HostTensor*> ptrs;
  for (HostTensor& t : copies) ptrs.push_back(&t);
  std::vector<HostTensor> results = run_kernel(std::move(kernel), ptrs, mode);
  for (size_t i = 0; i < k.inputs.size(); ++i)
    if (kernels::is_updated_input(k, k.inputs[i])) results.push_back(std::move(copies[i]));
  return results;
}

/** Runs one case: native results against the reference; with `exhaustive`, also the reference
 *  semantics and the declaration order, bit for bit. */
void check_case(const KernelInfo& k, const kernels::ExampleCase& c, uint64_t seed, bool exhaustive) {
  CAPTURE(k.name);
  CAPTURE(c.label);
  std::string shapes;
  for (const TensorSpec& s : c.inputs) shapes += s.shape.str() + std::string(dtype_name(s.dtype)) + " ";
  CAPTURE(shapes);
  kernels::CaseRng rng(seed);
  const std::vector<kernels::RefTensor> values = k.inputs_for(c, rng);
  const std::vector<HostTensor> inputs = host_inputs(c, values);
  Kernel kernel = kernels::trace_library_kernel(k, c.inputs, c.params);
  REQUIRE(kernel.outputs.size() == k.outputs.size());
  std::vector<std::string> names = k.outputs;
  names.insert(names.end(), k.updated_inputs.begin(), k.updated_inputs.end());
  const std::vector<HostTensor> native = run_case(k, kernel, inputs, Mode::streams_native);
  const std::vector<kernels::RefTensor> expected = k.reference(values, kernels::ParamValues{k.params, c.params});
  REQUIRE(expected.size() == native.size());
  for (size_t o = 0; o < native.size(); ++o) {
    CAPTURE(names[o]);
    CHECK(native[o].shape == expected[o].shape);
    CHECK(excess_error(native[o], expected[o], k.tolerance_for(c)) == 0);
  }
  if (!exhaustive) return;
  const std::vector<HostTensor> interp = run_case(k, std::move(kernel), inputs, Mode::streams_interp);
  std::vector<HostTensor> declared;
  {
    // On the reference semantics: generating native code is most of a case's cost, and the
    // executors' agreement is checked just above.
    ScopedEnv order("NIKKI_TASK_ORDER", "declared");
    declared = run_case(k, kernels::trace_library_kernel(k, c.inputs, c.params), inputs, Mode::streams_interp);
  }
  for (size_t o = 0; o < native.size(); ++o) {
    CAPTURE(names[o]);
    CHECK(interp[o].bytes == native[o].bytes);
    CHECK(declared[o].bytes == native[o].bytes);
  }
}

TEST_CASE("library registry: every registration is complete") {
  std::set<std::string> names;
  for (const KernelInfo& k : kernels::registry()) {
    CAPTURE(k.name);
    CHECK(names.insert(k.name).second);
    const std::vector<std::string> missing = kernels::missing_registration(k, kernels::registry());
    CHECK_MESSAGE(missing.empty(), "kernel '" << k.name << "' is registered without: " << join(missing));
    for (const std::string& s : k.saved_outputs) CHECK(contains(k.outputs, s));
  }
}

TEST_CASE("library registry: an incomplete registration is reported by what it lacks") {
  KernelInfo k = kernels::find_kernel("softmax");
  k.name = "incomplete";
  k.reference = nullptr;
  k.draw = nullptr;
  k.backward.clear();
  k.doc = "Dimensions: x. Args: x. Returns: y. Notes: none.";
  k.examples.push_back({{}, {}, "no inputs"});
  k.params.push_back({"tile", kernels::ParamKind::real, 128, "a tile size", /*tune_over=*/{128, 256}});
  const std::vector<std::string> missing = kernels::missing_registration(k, kernels::registry());
  CHECK(join(missing) ==
        "doc section Pseudocode:, reference, draw (random cases), inputs of example 'no inputs', tuned parameter "
        "'tile' as an integer whose default 0 means 'choose', backward (or a gradient note)");
}

TEST_CASE("library registry: a case generator that gives inputs of the wrong count or shape is an internal error") {
  KernelInfo k = kernels::find_kernel("softmax");
  const kernels::ExampleCase c = k.examples.at(0);
  kernels::CaseRng rng(7);
  std::vector<kernels::RefTensor> made;
  k.make_inputs = [&](const kernels::ExampleCase&, kernels::CaseRng&) { return made; };
  const std::string expected = "kernel 'softmax': make_inputs does not give one tensor of each input's shape";
  SUBCASE("too few") {}
  SUBCASE("too many") { made = {kernels::RefTensor(c.inputs[0].shape), kernels::RefTensor(c.inputs[0].shape)}; }
  SUBCASE("another shape") {
    Shape other = c.inputs[0].shape;
    other[0] += 1;
    made = {kernels::RefTensor(other)};
  }
  try {
    k.inputs_for(c, rng);
    FAIL("no error");
  } catch (const InternalError& e) {
    CHECK(std::string(e.what()).find(expected) != std::string::npos);
  }
  made = {kernels::RefTensor(c.inputs[0].shape)};  // the right one is taken as made
  CHECK(k.inputs_for(c, rng).at(0).shape == c.inputs[0].shape);
}

TEST_CASE("library registry: backward kernels follow the naming contract") {
  for (const KernelInfo& k : kernels::registry()) {
    if (k.backward.empty()) continue;
    CAPTURE(k.name);
    const KernelInfo& b = kernels::find_kernel(k.backward);
    for (const std::string& in : b.inputs) {
      const bool known = contains(k.inputs, in) || contains(k.outputs, in) ||
                         (in.rfind("grad_", 0) == 0 && contains(k.outputs, in.substr(5)));
      CHECK_MESSAGE(known, "backward input '" << in << "' is neither a forward input, output nor grad_<output>");
    }
    for (const std::string& out : b.outputs) {
      CHECK_MESSAGE((out.rfind("grad_", 0) == 0 && contains(k.inputs, out.substr(5))),
                    "backward output '" << out << "' is not grad_<forward input>");
    }
    for (const kernels::ParamSpec& p : b.params) {
      const bool known = std::any_of(k.params.begin(), k.params.end(), [&](auto& q) { return q.name == p.name; });
      CHECK_MESSAGE(known, "backward parameter '" << p.name << "' is not a forward parameter");
    }
  }
}

TEST_CASE("library registry: unknown kernels and parameters are errors that name the alternatives") {
  try {
    kernels::find_kernel("sofmax");
    FAIL("no error");
  } catch (const KernelError& e) {
    CHECK(std::string(e.what()).find("no library kernel named 'sofmax'") != std::string::npos);
    CHECK(std::string(e.what()).find("softmax") != std::string::npos);
  }
  const KernelInfo& softmax = kernels::find_kernel("softmax");
  try {
    kernels::trace_library_kernel(softmax, {spec({4, 4}, DType::float32)}, kernels::Params{{"eps", 1e-5}});
    FAIL("no error");
  } catch (const KernelError& e) {
    CHECK(std::string(e.what()).find("kernel 'softmax' has no parameter 'eps'") != std::string::npos);
  }
  try {
    kernels::trace_library_kernel(softmax, {}, {});
    FAIL("no error");
  } catch (const KernelError& e) {
    CHECK(std::string(e.what()).find("kernel 'softmax' takes 1 inputs (x), got 0") != std::string::npos);
  }
}

// ctest runs every TEST_CASE as a test of its own: the kernels are dealt round-robin into parts so
// that `ctest -j` spreads the library's checks over the cores. One TEST_CASE per part below.
constexpr size_t kExampleParts = 4, kDrawnParts = 2;

void check_examples(size_t part) {
  const std::vector<KernelInfo>& all = kernels::registry();
  for (size_t n = part; n < all.size(); n += kExampleParts) {
    const KernelInfo& k = all[n];
    for (size_t i = 0; i < k.examples.size() && selected(k.name); ++i) check_case(k, k.examples[i], i + 1, /*exhaustive=*/true);
  }
}

void check_drawn_cases(size_t part) {
  const int64_t cases = drawn_cases();
  const std::vector<KernelInfo>& all = kernels::registry();
  for (size_t n = part; n < all.size(); n += kDrawnParts) {
    const KernelInfo& k = all[n];
    const int64_t first = first_drawn_seed();
    for (int64_t seed = first; seed < first + cases && selected(k.name); ++seed) {
      kernels::CaseRng rng{uint64_t(seed)};
      check_case(k, k.draw(rng), uint64_t(seed) + 1000, /*exhaustive=*/false);
    }
  }
}

TEST_CASE("library kernels: every example matches its reference, on both executors and in both task orders (part 1 of 4)") {
  check_examples(0);
}
TEST_CASE("library kernels: every example matches its reference, on both executors and in both task orders (part 2 of 4)") {
  check_examples(1);
}
TEST_CASE("library kernels: every example matches its reference, on both executors and in both task orders (part 3 of 4)") {
  check_examples(2);
}
TEST_CASE("library kernels: every example matches its reference, on both executors and in both task orders (part 4 of 4)") {
  check_examples(3);
}

TEST_CASE("library kernels: randomly drawn cases match their reference (part 1 of 2)") { check_drawn_cases(0); }
TEST_CASE("library kernels: randomly drawn cases match their reference (part 2 of 2)") { check_drawn_cases(1); }

}  // namespace
}  // namespace nikki::test
