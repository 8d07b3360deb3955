// The library kernel registry as the Python package sees it: kernel descriptions, tracing a
// library kernel into its own Kernel, and inlining one into a kernel being traced from Python.
#include "library_bindings.hpp"

#include <algorithm>
#include <cmath>

#include <pybind11/numpy.h>
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

py::list case_inputs(const kernels::ExampleCase& ex) {
  py::list inputs;
  for (const TensorSpec& s : ex.inputs) {
    py::tuple shape(s.shape.rank());
    for (int i = 0; i < s.shape.rank(); ++i) shape[i] = s.shape[i];
    inputs.append(py::make_tuple(shape, s.dtype));
  }
  return inputs;
}

/** A parameter's value as the Python type of its kind (NaN, "not given", is None). */
py::object param_value(const kernels::ParamSpec& p, double v) {
  if (std::isnan(v)) return py::none();
  switch (p.kind) {
    case kernels::ParamKind::boolean: return py::bool_(v != 0);
    case kernels::ParamKind::integer: return py::int_(static_cast<int64_t>(v));
    default: return py::float_(v);
  }
}

py::dict case_params(const kernels::KernelInfo& k, const kernels::ExampleCase& ex) {
  py::dict values;
  for (const auto& [name, v] : ex.params.values()) {
    auto spec = std::find_if(k.params.begin(), k.params.end(), [&](const kernels::ParamSpec& p) { return p.name == name; });
    values[py::str(name)] = spec == k.params.end() ? py::object(py::float_(v)) : param_value(*spec, v);
  }
  return values;
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
  d["updated_inputs"] = k.updated_inputs;
  py::list params;
  for (const kernels::ParamSpec& p : k.params) {
    py::object def = p.kind == kernels::ParamKind::optional_real ? py::none() : param_value(p, p.default_value);
    params.append(py::make_tuple(p.name, kind_name(p.kind), def, p.doc));
  }
  d["params"] = params;
  py::dict tuning;  // parameter -> the values autotuning chooses from
  for (const kernels::ParamSpec& p : k.params) {
    if (p.tune_over.empty()) continue;
    py::list values;
    for (double v : p.tune_over) values.append(param_value(p, v));
    tuning[py::str(p.name)] = values;
  }
  d["tuning"] = tuning;
  py::list examples;
  for (const kernels::ExampleCase& ex : k.examples) examples.append(py::make_tuple(case_inputs(ex), case_params(k, ex), ex.label));
  d["examples"] = examples;
  py::list dtypes;
  for (DType t : k.dtypes) dtypes.append(t);
  d["dtypes"] = dtypes;
  d["gradient"] = k.gradient;
  d["has_reference"] = bool(k.reference);
  d["has_draw"] = bool(k.draw);
  if (k.benchmark) {
    py::dict b;
    b["inputs"] = case_inputs(k.benchmark->shape);
    b["params"] = case_params(k, k.benchmark->shape);
    b["label"] = k.benchmark->shape.label;
    b["bound"] = k.benchmark->bound == kernels::Bound::tensor_engine ? "tensor_engine" : "hbm";
    b["useful_flops"] = k.benchmark->useful_flops ? k.benchmark->useful_flops(k.benchmark->shape) : 0.0;
    b["goal"] = k.benchmark->goal;
    d["benchmark"] = b;
  } else {
    d["benchmark"] = py::none();
  }
  return d;
}

py::array_t<double> to_numpy(const kernels::RefTensor& t) {
  std::vector<py::ssize_t> shape;
  for (int i = 0; i < t.shape.rank(); ++i) shape.push_back(t.shape[i]);
  py::array_t<double> a(shape);
  std::copy(t.data.begin(), t.data.end(), a.mutable_data());
  return a;
}

kernels::RefTensor from_numpy(const py::array_t<double, py::array::c_style | py::array::forcecast>& a) {
  std::vector<int64_t> dims(a.shape(), a.shape() + a.ndim());
  kernels::RefTensor t{Shape(std::span<const int64_t>(dims))};
  std::copy(a.data(), a.data() + a.size(), t.data.begin());
  return t;
}

/** A test case as Python sees it: specs, parameters, label, input values and tolerance. */
py::dict describe_case(const kernels::KernelInfo& k, const kernels::ExampleCase& c, uint64_t seed) {
  py::dict d;
  d["inputs"] = case_inputs(c);
  d["params"] = case_params(k, c);
  d["label"] = c.label;
  kernels::CaseRng rng(seed);
  py::list values;
  for (const kernels::RefTensor& t : k.inputs_for(c, rng)) values.append(to_numpy(t));
  d["values"] = values;
  const kernels::Tolerance tol = k.tolerance_for(c);
  d["tolerance"] = py::make_tuple(tol.rtol, tol.atol);
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

  // Test cases of a kernel: its examples (by index) and randomly drawn ones (by seed), with input
  // values from the registration (rounded to each input's dtype) and the accepted tolerance.
  m.def(
      "library_case",
      [](const std::string& name, const std::string& kind, uint64_t index) {
        const kernels::KernelInfo& k = kernels::find_kernel(name);
        if (kind == "example") {
          if (index >= k.examples.size()) throw py::index_error("no example " + std::to_string(index) + " of " + name);
          return describe_case(k, k.examples[index], index + 1);
        }
        if (kind != "drawn") throw py::value_error("kind is 'example' or 'drawn'");
        if (!k.draw) throw py::value_error("kernel '" + name + "' draws no cases");
        kernels::CaseRng rng(index);
        return describe_case(k, k.draw(rng), index);
      },
      py::arg("name"), py::arg("kind"), py::arg("index"));

  // The float64 reference of a kernel on given inputs (any float64 arrays of the right shapes).
  m.def(
      "library_reference",
      [](const std::string& name, const std::vector<py::array_t<double, py::array::c_style | py::array::forcecast>>& inputs,
         const py::dict& params) {
        const kernels::KernelInfo& k = kernels::find_kernel(name);
        if (!k.reference) throw py::value_error("kernel '" + name + "' has no reference");
        std::vector<kernels::RefTensor> in;
        for (const auto& a : inputs) in.push_back(from_numpy(a));
        kernels::Params values = to_params(params);
        std::vector<kernels::RefTensor> results;
        {
          py::gil_scoped_release release;
          results = k.reference(in, kernels::ParamValues{k.params, values});
        }
        py::list out;
        for (const kernels::RefTensor& t : results) out.append(to_numpy(t));
        return out;
      },
      py::arg("name"), py::arg("inputs"), py::arg("params"));

  // Input values for any shapes of a kernel, from its registration (its own input maker: valid
  // targets, positive second moments, ...), rounded to each input's dtype.
  m.def(
      "library_inputs",
      [](const std::string& name, const std::vector<std::pair<py::object, DType>>& inputs, const py::dict& params,
         uint64_t seed) {
        const kernels::KernelInfo& info = kernels::find_kernel(name);
        kernels::ExampleCase c;
        for (const auto& [dims, dtype] : inputs) c.inputs.push_back(TensorSpec{shape_from_python(dims), dtype, {}, false});
        c.params = to_params(params);
        kernels::CaseRng rng(seed);
        py::list values;
        for (const kernels::RefTensor& t : info.inputs_for(c, rng)) values.append(to_numpy(t));
        return values;
      },
      py::arg("name"), py::arg("inputs"), py::arg("params"), py::arg("seed") = 0);

  // The useful FLOPs of a Tensor-engine-bound kernel on given input shapes (0 for HBM-bound
  // kernels): what its utilization is measured against at any size, not only its benchmark shape.
  using BenchmarkMeasure = std::function<double(const kernels::ExampleCase&)> kernels::Benchmark::*;
  // A benchmark measure of kernel `name` on given input shapes and parameters; 0 when it has none.
  auto measure = [](BenchmarkMeasure which, const std::string& name,
                    const std::vector<std::pair<py::object, DType>>& inputs, const py::dict& params) {
    const kernels::KernelInfo& info = kernels::find_kernel(name);
    if (!info.benchmark || !(*info.benchmark.*which)) return 0.0;
    kernels::ExampleCase c;
    for (const auto& [dims, dtype] : inputs) c.inputs.push_back(TensorSpec{shape_from_python(dims), dtype, {}, false});
    c.params = to_params(params);
    return (*info.benchmark.*which)(c);
  };
  m.def(
      "library_useful_flops",
      [measure](const std::string& name, const std::vector<std::pair<py::object, DType>>& inputs,
                const py::dict& params) { return measure(&kernels::Benchmark::useful_flops, name, inputs, params); },
      py::arg("name"), py::arg("inputs"), py::arg("params"));

  // The compulsory HBM bytes of an HBM-bound kernel on given input shapes when its registration
  // names them (a gather reads only the rows it names); 0 when every input is read once.
  m.def(
      "library_compulsory_bytes",
      [measure](const std::string& name, const std::vector<std::pair<py::object, DType>>& inputs,
                const py::dict& params) { return measure(&kernels::Benchmark::compulsory_bytes, name, inputs, params); },
      py::arg("name"), py::arg("inputs"), py::arg("params"));

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
        for (const Tensor& t : info.body(kernels::KernelCall(tensors, info.params, values)))
          results.push_back(t.access());
        return results;
      },
      py::arg("builder"), py::arg("name"), py::arg("inputs"), py::arg("params"));
}

}  // namespace nikki::bindings
