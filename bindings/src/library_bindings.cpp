// The library kernel registry as the Python package sees it: kernel descriptions, tracing a
// library kernel into its own Kernel, and inlining one into a kernel being traced from Python.
#include "library_bindings.hpp"

#include <pybind11/stl.h>

#include "nikki/kernels/registry.hpp"
#include "program_introspection.hpp"

namespace py = pybind11;

namespace nikki::bindings {
namespace {

const char* kind_name(kernels::ParamKind k) {
  switch (k) {
    case kernels::ParamKind::boolean: return "bool";
    case kernels::ParamKind::integer: return "int";
    case kernels::ParamKind::real: return "float";
    case kernels::ParamKind::optional_real: return "float?";
  }
  return "?";
}

py::dict describe(const kernels::KernelInfo& k) {
  py::dict d;
  d["name"] = k.name;
  d["summary"] = k.summary;
  d["doc"] = k.doc;
  d["inputs"] = k.inputs;
  d["outputs"] = k.outputs;
  d["backward"] = k.backward;
  d["saved_outputs"] = k.saved_outputs;
  py::list params;
  for (const kernels::ParamSpec& p : k.params) {
    py::object def = p.kind == kernels::ParamKind::optional_real ? py::none()
                     : p.kind == kernels::ParamKind::boolean     ? py::object(py::bool_(p.default_value != 0))
                     : p.kind == kernels::ParamKind::integer
                         ? py::object(py::int_(static_cast<int64_t>(p.default_value)))
                         : py::object(py::float_(p.default_value));
    params.append(py::make_tuple(p.name, kind_name(p.kind), def, p.doc));
  }
  d["params"] = params;
  py::list examples;
  for (const kernels::ExampleCase& ex : k.examples) {
    py::list inputs;
    for (const TensorSpec& s : ex.inputs) {
      py::tuple shape(s.shape.rank());
      for (int i = 0; i < s.shape.rank(); ++i) shape[i] = s.shape[i];
      inputs.append(py::make_tuple(shape, s.dtype));
    }
    py::dict values;
    for (const auto& [name, v] : ex.params.values()) values[py::str(name)] = v;
    examples.append(py::make_tuple(inputs, values, ex.label));
  }
  d["examples"] = examples;
  return d;
}

kernels::Params to_params(const py::dict& values) {
  kernels::Params params;
  for (auto [key, value] : values)
    params.set(key.cast<std::string>(), value.is_none() ? std::nan("") : value.cast<double>());
  return params;
}

}  // namespace

void bind_library(py::module_& m) {
  m.def("library_kernels", [] {
    py::list l;
    for (const kernels::KernelInfo& k : kernels::registry()) l.append(describe(k));
    return l;
  });

  m.def(
      "trace_library",
      [](const std::string& name, const std::vector<std::pair<py::object, DType>>& inputs, const py::dict& params,
         const std::string& target) {
        const kernels::KernelInfo& info = kernels::find_kernel(name);
        std::vector<TensorSpec> specs;
        for (size_t i = 0; i < inputs.size(); ++i) {
          const auto& [dims, dtype] = inputs[i];
          try {
            specs.push_back(TensorSpec{shape_from_python(dims), dtype, {}, false});
          } catch (const ViewError& e) {
            const std::string input = i < info.inputs.size() ? info.inputs[i] : fmt::format("#{}", i);
            throw KernelError(fmt::format("kernel '{}': input '{}': {}", name, input, e.what), {}, name, e.limit,
                              e.hint);
          }
        }
        return kernels::trace_library_kernel(info, std::move(specs), to_params(params),
                                             TraceOptions{.target = require_target(target)});
      },
      py::arg("name"), py::arg("inputs"), py::arg("params"), py::arg("target"));

  // Emits a library kernel's body into a kernel being traced (a library kernel called from an
  // @nki.jit kernel): the inputs are HBM views of that kernel, the results its new shared_hbm
  // tensors.
  m.def(
      "inline_library",
      [](KernelBuilder& builder, const std::string& name, const std::vector<AccessPattern>& inputs,
         const py::dict& params) {
        const kernels::KernelInfo& info = kernels::find_kernel(name);
        kernels::Params values = to_params(params);
        std::vector<Shape> shapes;
        for (const AccessPattern& ap : inputs) shapes.push_back(ap.shape());
        kernels::check_library_call(info, shapes, values);
        BuilderScope scope(builder);
        std::vector<Tensor> tensors;
        for (const AccessPattern& ap : inputs) tensors.emplace_back(&builder, ap);
        std::vector<AccessPattern> results;
        for (const Tensor& t : info.body(kernels::KernelCall{tensors, info.params, values}))
          results.push_back(t.access());
        return results;
      },
      py::arg("builder"), py::arg("name"), py::arg("inputs"), py::arg("params"));
}

}  // namespace nikki::bindings
