// Registry-driven checks of every library kernel: the metadata is consistent, every example case
// traces, compiles and writes every output element, and the native executor agrees bit for bit
// with the reference semantics. Numerical correctness against independent references lives in
// tests/python/kernels (numpy and PyTorch).
#include <algorithm>
#include <cmath>
#include <set>

#include "harness.hpp"
#include "nikki/kernels/registry.hpp"

namespace nikki::test {
namespace {

using kernels::KernelInfo;

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

std::vector<HostTensor> example_inputs(const kernels::ExampleCase& ex, uint32_t seed) {
  std::vector<HostTensor> inputs;
  for (const TensorSpec& s : ex.inputs) {
    // Positive values keep variance-like inputs (rstd, row sums) meaningful.
    inputs.push_back(is_float(s.dtype) ? random_tensor(s.dtype, s.shape, seed++, 0.25f, 1.0f)
                                       : HostTensor(s.dtype, s.shape));
  }
  return inputs;
}

TEST_CASE("library registry: names are unique and backward kernels follow the naming contract") {
  std::set<std::string> names;
  for (const KernelInfo& k : kernels::registry()) {
    CAPTURE(k.name);
    CHECK(names.insert(k.name).second);
    CHECK(!k.summary.empty());
    CHECK(!k.doc.empty());
    CHECK(!k.examples.empty());
    CHECK(k.body);
    for (const std::string& s : k.saved_outputs) CHECK(contains(k.outputs, s));
    for (const kernels::ExampleCase& ex : k.examples) CHECK(ex.inputs.size() == k.inputs.size());
  }
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

TEST_CASE("library kernels: every example writes every output and native matches the reference semantics") {
  for (const KernelInfo& k : kernels::registry()) {
    for (const kernels::ExampleCase& ex : k.examples) {
      CAPTURE(k.name);
      CAPTURE(ex.label);
      std::vector<HostTensor> inputs = example_inputs(ex, 7);
      std::vector<HostTensor*> ptrs;
      for (HostTensor& t : inputs) ptrs.push_back(&t);
      Kernel kernel = kernels::trace_library_kernel(k, ex.inputs, ex.params);
      REQUIRE(kernel.outputs.size() == k.outputs.size());
      std::vector<HostTensor> reference = run_kernel(kernel, ptrs, Mode::streams_interp);
      std::vector<HostTensor> native = run_kernel(std::move(kernel), ptrs, Mode::streams_native);
      for (size_t o = 0; o < reference.size(); ++o) {
        CAPTURE(k.outputs[o]);
        const HostTensor& r = reference[o];
        // Fresh memory holds NaN sentinels: a NaN left in an output is an element never written.
        int64_t unwritten = 0;
        if (is_float(r.dtype))
          for (int64_t i = 0; i < r.size(); ++i) unwritten += std::isnan(r.get(i));
        CHECK(unwritten == 0);
        CHECK(r.bytes == native[o].bytes);
      }
    }
  }
}

}  // namespace
}  // namespace nikki::test
