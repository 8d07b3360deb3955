// nikki._core: the Python front end's view of the C++ core. It exposes the same KernelBuilder the
// C++ DSL uses, views (access patterns), the compile pipeline and the executors. Argument
// defaults and NKI's Python signatures live in the Python package; this layer stays thin.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "library_bindings.hpp"
#include "program_introspection.hpp"
#include "nikki/builder.hpp"
#include "nikki/ir_attributes.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/jit/cache.hpp"
#include "nikki/jit/compile.hpp"
#include "nikki/jit/sanitize.hpp"
#include "nikki/nl.hpp"
#include "nikki/runtime/executor.hpp"
#include "nikki/runtime/interpreter.hpp"
#include "nikki/runtime/launch.hpp"
#include "nikki/runtime/explain.hpp"
#include "nikki/runtime/profile.hpp"

namespace py = pybind11;
using namespace nikki;
using bindings::int64_from_python;
using bindings::shape_from_python;
using bindings::shape_tuple;

namespace {

// Set by nikki.errors at import: the Python KernelError class to raise for nikki::KernelError.
py::object g_kernel_error_class;
py::object g_view_error_class;

/** A register handle as the Python side sees it. */
struct Register {
  RegisterId id;
};

Operand to_operand(KernelBuilder& b, const py::handle& h) {
  if (h.is_none()) return Operand::none();
  if (py::isinstance<AccessPattern>(h)) return b.operand(h.cast<const AccessPattern&>());
  if (py::isinstance<Register>(h)) return Operand::reg_(h.cast<const Register&>().id);
  if (py::isinstance<py::bool_>(h)) return Operand::immediate(h.cast<bool>() ? 1.0 : 0.0);
  return Operand::immediate(h.cast<double>());
}

AluOp alu_of(const py::handle& h) { return h.cast<AluOp>(); }

std::string operand_kinds_text(uint8_t kinds) {
  std::string text;
  for (auto [bit, name] : {std::pair{kTensor, "a tensor"}, std::pair{kImm, "a number"}, std::pair{kReg, "a register"}})
    if (kinds & bit) text += (text.empty() ? "" : " or ") + std::string(name);
  return text;
}

/**
 * A KernelError, at the user's line, for an operand an opcode's slot does not take: from Python such
 * an operand is the user's mistake (None for a required operand, a number where a tile goes), which
 * the builder's own slot check would report as an internal error.
 */
void check_user_operands(const KernelBuilder& b, const Instruction& inst) {
  const OpcodeSpec& spec = inst.spec();
  for (int s = 0; s < spec.num_slots; ++s) {
    const SlotSpec& slot = spec.slots[s];
    const Operand& o = inst.operands[s];
    const uint8_t kind = o.is_none() ? 0 : o.is_tensor() ? kTensor : o.is_imm() ? kImm : kReg;
    if (kind == 0 ? slot.optional : (slot.kinds & kind) != 0) continue;
    const std::string expected = operand_kinds_text(slot.kinds);
    throw KernelError(kind == 0 ? fmt::format("{}: {} is required, got None", spec.name, slot.name)
                                : fmt::format("{}: {} must be {}, got {}", spec.name, slot.name, expected,
                                              operand_kinds_text(kind)),
                      b.source(inst.loc), {}, {}, fmt::format("pass {} as {}", expected, slot.name));
  }
}

/**
 * Sets the attribute `key` (its opcodes.hpp name) of an instruction being built from a Python
 * value of the attribute's type. An attribute the opcode does not use is a bug of the front end.
 */
void set_attribute(KernelBuilder& b, Instruction& inst, std::string_view key, const py::handle& v) {
  const std::optional<Attr> found = find_attr(key);
  if (!found) throw std::invalid_argument(fmt::format("unknown instruction attribute: {}", key));
  const Attr a = *found;
  if (!inst.spec().uses(a))
    throw std::invalid_argument(fmt::format("{} has no attribute {}", opcode_name(inst.opcode), key));
  switch (attr_spec(a).type) {
    case AttrType::alu_op: return set_attr_int(b.kernel_for_update(), inst, a, int64_t(v.cast<AluOp>()));
    case AttrType::act_func: return set_attr_int(b.kernel_for_update(), inst, a, int64_t(v.cast<ActFunc>()));
    case AttrType::reduce_cmd: return set_attr_int(b.kernel_for_update(), inst, a, int64_t(v.cast<ReduceCmd>()));
    case AttrType::accumulate: return set_attr_int(b.kernel_for_update(), inst, a, int64_t(v.cast<Accumulate>()));
    case AttrType::flag: return set_attr_int(b.kernel_for_update(), inst, a, v.cast<bool>());
    case AttrType::axes: return set_attr_int(b.kernel_for_update(), inst, a, v.cast<uint32_t>());
    case AttrType::integer: {
      const int64_t value = int64_from_python(v, key);
      if (value < attr_int_min(a) || value > attr_int_max(a))
        throw ViewError{fmt::format("{} {} is out of range", key, value), {}, {}};
      return set_attr_int(b.kernel_for_update(), inst, a, value);
    }
    case AttrType::real: b.rare(inst).fill_value = v.cast<double>(); return;
    case AttrType::text: b.rare(inst).text = v.cast<std::string>(); return;
    case AttrType::pattern: {
      std::vector<Dim> pattern;
      for (const py::handle& pair : v) {
        const py::sequence seq = py::reinterpret_borrow<py::sequence>(pair);
        if (seq.size() != 2) throw ViewError{"pattern entries are [step, num] pairs", {}, {}};
        pattern.push_back({int64_from_python(seq[0], "pattern step"), int64_from_python(seq[1], "pattern num")});
      }
      if (!pattern.empty()) b.rare(inst).pattern = std::move(pattern);
      return;
    }
    case AttrType::lanes: {
      std::vector<int32_t> lanes = v.cast<std::vector<int32_t>>();
      if (!lanes.empty()) b.rare(inst).lanes = std::move(lanes);
      return;
    }
  }
}

/** A compiled kernel plus its executor (NIKKI_EXECUTOR: native by default), created on first run;
 * a sanitized kernel runs on the reference interpreter with its uninitialized-read checks. */
struct PyProgram {
  jit::Program program;
  runtime::ExecutorKind kind = runtime::ExecutorKind::native;
  bool sanitize = false;
  std::unique_ptr<runtime::StreamExecutor> executor;
  std::unique_ptr<runtime::Interpreter> sanitizer;

  /** The run of this program as an instance of a launch: its executor, created on first use. */
  runtime::InstanceRun& instance() {
    if (sanitize && !sanitizer) {
      sanitizer = std::make_unique<runtime::Interpreter>(program.kernel(), /*sanitize=*/true);
    } else if (!sanitize && !executor) {
      auto [order, seed] = runtime::stream_order_from_env();
      executor = std::make_unique<runtime::StreamExecutor>(program.device, kind, program.native, order, seed);
    }
    if (sanitizer) return *sanitizer;
    return *executor;
  }

  /** Runs the program; `fill_outputs=false` for SPMD instances after the first, which share the
   * shared_hbm outputs the earlier instances wrote. */
  void run(const std::vector<uintptr_t>& inputs, const std::vector<uintptr_t>& outputs, bool fill_outputs) {
    run_programs({this}, inputs, outputs, fill_outputs);
  }

  /** Whether the program has instructions where the instances of a launch meet. */
  bool meets() const {
    const auto& insts = program.kernel().instructions;
    return std::any_of(insts.begin(), insts.end(), [](const Instruction& i) { return is_meeting(i.opcode); });
  }

  /** One launch of `programs` (program instance i = programs[i]) on the same buffers. */
  static void run_programs(const std::vector<PyProgram*>& programs, const std::vector<uintptr_t>& inputs,
                           const std::vector<uintptr_t>& outputs, bool fill_outputs) {
    std::vector<runtime::InstanceRun*> runs;
    for (PyProgram* p : programs) runs.push_back(&p->instance());
    std::vector<void*> in(inputs.size()), out(outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) in[i] = reinterpret_cast<void*>(inputs[i]);
    for (size_t i = 0; i < outputs.size(); ++i) out[i] = reinterpret_cast<void*>(outputs[i]);
    py::gil_scoped_release release;
    runtime::run_launch(runs, in, out, fill_outputs);
  }

  /** Drops the executor and its simulated core until the next run: an SPMD launch runs one
   * program per instance and would otherwise keep a simulated core alive for each. */
  void release_executor() { executor.reset(); }
};

/** A disk-cache key for the Python side: this build's identity, then the caller's bytes. */
jit::CacheKey python_cache_key(const py::bytes& key) {
  const std::string k = key;
  jit::CacheKey ck;
  ck.bytes(&jit::build_id(), sizeof(jit::Hash128)).bytes(k.data(), k.size());
  return ck;
}

py::dict tile_sizes(const TargetConfig& t) {
  nl::TileSize s = nl::tile_size_of(t);
  py::dict d;
  d["pmax"] = s.pmax;
  d["psum_fmax"] = s.psum_fmax;
  d["psum_bank_fmax"] = s.psum_bank_fmax;
  d["psum_bank_fmax_bytes"] = s.psum_bank_fmax_bytes;
  d["psum_num_banks"] = s.psum_num_banks;
  d["gemm_stationary_fmax"] = s.gemm_stationary_fmax;
  d["gemm_moving_fmax"] = s.gemm_moving_fmax;
  d["bn_stats_fmax"] = s.bn_stats_fmax;
  d["sbuf_fmax_bytes"] = s.sbuf_fmax_bytes;
  d["sbuf_fmax"] = s.sbuf_fmax;
  d["sbuf_size_bytes"] = s.sbuf_size_bytes;
  d["total_available_sbuf_size"] = s.sbuf_fmax_bytes;
  d["psum_min_align"] = 4;
  d["sbuf_min_align"] = 4;
  return d;
}

/** The verifier's access rules that nl.tile_size does not name (tests generate kernels from them). */
py::dict access_limits(const TargetConfig& t) {
  py::dict d;
  d["partition_quadrant"] = t.partition_quadrant;
  d["vector_transpose_max"] = t.vector_transpose_max;
  d["max_free_elems_sbuf"] = t.max_free_elems_sbuf;
  d["max_free_elems_psum"] = t.max_free_elems_psum;
  d["max_access_dims"] = t.max_access_dims;
  d["max8_min_elems"] = t.max8_min_elems;
  d["max8_max_elems"] = t.max8_max_elems;
  return d;
}

py::dict storage_info(const Storage& s) {
  py::dict d;
  d["name"] = s.name;
  d["buffer"] = s.buffer;
  d["dtype"] = s.dtype;
  d["shape"] = shape_tuple(s.shape);
  d["role"] = s.role == StorageRole::input ? "input" : s.role == StorageRole::output ? "output" : "scratch";
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "nikki's C++ core: kernel IR builder, compile pipeline and simulated NeuronCore";

  // --- enums -------------------------------------------------------------------------------
  py::enum_<DType> dtype(m, "DType");
  for (int i = 0; i < kNumDTypes; ++i) dtype.value(std::string(kDTypeInfo[i].name).c_str(), static_cast<DType>(i));
  py::enum_<Buffer>(m, "Buffer")
      .value("hbm", Buffer::hbm)
      .value("shared_hbm", Buffer::shared_hbm)
      .value("private_hbm", Buffer::private_hbm)
      .value("sbuf", Buffer::sbuf)
      .value("psum", Buffer::psum);
  py::enum_<Engine>(m, "Engine")
      .value("tensor", Engine::tensor)
      .value("vector", Engine::vector)
      .value("scalar", Engine::scalar)
      .value("gpsimd", Engine::gpsimd)
      .value("sync", Engine::sync)
      .value("dma", Engine::dma)
      .value("unknown", Engine::unknown);
  py::enum_<AluOp> alu(m, "AluOp");
  for (int i = 0; i < kNumAluOps; ++i) alu.value(std::string(kAluOpNames[i]).c_str(), static_cast<AluOp>(i));
  // Unary operators ignore their second operand, so an instruction may leave it out.
  alu.def_property_readonly("is_unary", [](AluOp op) { return is_unary_op(op); });
  py::enum_<ActFunc> act(m, "ActFunc");
  for (int i = 0; i < kNumActFuncs; ++i) act.value(std::string(kActFuncNames[i]).c_str(), static_cast<ActFunc>(i));
  py::enum_<ReduceCmd>(m, "ReduceCmd")
      .value("idle", ReduceCmd::idle)
      .value("reset", ReduceCmd::reset)
      .value("reduce", ReduceCmd::reduce)
      .value("reset_reduce", ReduceCmd::reset_reduce)
      .value("load_reduce", ReduceCmd::load_reduce);
  py::enum_<Accumulate>(m, "Accumulate")
      .value("automatic", Accumulate::automatic)
      .value("overwrite", Accumulate::overwrite)
      .value("accumulate", Accumulate::accumulate);
  py::enum_<Opcode> opcode(m, "Opcode");
  for (int i = 0; i < kNumOpcodes; ++i)
    opcode.value(std::string(kOpcodeSpecs[i].name).c_str(), static_cast<Opcode>(i));
  // The NKI parameter name of each operand slot, for errors about an operand the user passed.
  opcode.def_property_readonly("slot_names", [](Opcode op) {
    const OpcodeSpec& spec = kOpcodeSpecs[static_cast<int>(op)];
    std::vector<std::string> names;
    for (int s = 0; s < spec.num_slots; ++s) names.emplace_back(spec.slots[s].name);
    return names;
  });

  m.attr("max_rank") = kMaxRank;
  m.def("dtype_size", [](DType d) { return dtype_size(d); });
  m.def("dtype_is_float", [](DType d) { return is_float(d); });
  m.def("target_names", [] { return std::vector<std::string>{"trn1", "trn2"}; });
  m.def("target_info", [](const std::string& name) {
    const TargetConfig& t = target_config(require_target(name));
    py::dict d;
    d["name"] = std::string(t.name);
    d["core"] = std::string(t.core);
    d["generation"] = t.generation;
    d["tile_size"] = tile_sizes(t);
    d["limits"] = access_limits(t);
    return d;
  });
  m.def("default_target", [] { return std::string(target_config(default_target()).name); });
  m.def("max_instructions", [] { return max_instructions(); },
        "The most instructions a kernel launch may trace into (NIKKI_MAX_INSTRUCTIONS).");
  m.def("instruction_limit_text", &instruction_limit_text, py::arg("limit"));

  // --- errors ------------------------------------------------------------------------------
  m.def("_set_error_classes", [](py::object kernel_error, py::object view_error) {
    g_kernel_error_class = std::move(kernel_error);
    g_view_error_class = std::move(view_error);
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KernelError& e) {
      if (!g_kernel_error_class) throw;
      const SourceLocation& l = e.location();
      py::object err = g_kernel_error_class(e.summary(), py::arg("file") = l.file, py::arg("line") = l.line,
                                            py::arg("column") = l.column, py::arg("end_column") = l.end_column,
                                            py::arg("instruction") = e.instruction(), py::arg("limit") = e.limit(),
                                            py::arg("hint") = e.hint());
      PyErr_SetObject(g_kernel_error_class.ptr(), err.ptr());
    } catch (const ViewError& e) {
      if (!g_view_error_class) throw std::runtime_error(e.what);
      py::object err = g_view_error_class(e.what, e.limit, e.hint);
      PyErr_SetObject(g_view_error_class.ptr(), err.ptr());
    } catch (const InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  // --- views -------------------------------------------------------------------------------
  py::class_<Register>(m, "Register").def_readonly("id", &Register::id).def("__repr__", [](const Register& r) {
    return fmt::format("<register r{}>", r.id);
  });

  py::class_<AccessPattern>(m, "View")
      .def_readonly("storage", &AccessPattern::storage)
      .def_readonly("dtype", &AccessPattern::dtype)
      // The dtype as its enum's integer: tracing looks dtypes up per operand, and an integer is
      // much cheaper to hash from Python than the enum object.
      .def_property_readonly("dtype_index", [](const AccessPattern& ap) { return int(ap.dtype); })
      // Stride 0 over several partitions: an engine cannot stream such a view (see isa.py).
      .def_property_readonly("is_partition_broadcast",
                             [](const AccessPattern& ap) {
                               return ap.rank >= 2 && ap.dims[0].stride == 0 && ap.dims[0].count > 1;
                             })
      .def_readonly("offset", &AccessPattern::offset)
      .def_property_readonly("ndim", [](const AccessPattern& ap) { return int(ap.rank); })
      .def_property_readonly("shape", [](const AccessPattern& ap) { return shape_tuple(ap.shape()); })
      .def_property_readonly("size", &AccessPattern::num_elements)
      .def_property_readonly("pattern",
                             [](const AccessPattern& ap) {
                               py::list l;
                               for (const Dim& d : ap.pattern()) l.append(py::make_tuple(d.stride, d.count));
                               return l;
                             })
      .def_property_readonly("strides",
                             [](const AccessPattern& ap) {
                               py::tuple t(ap.rank);
                               for (int d = 0; d < ap.rank; ++d) t[d] = ap.dims[d].stride;
                               return t;
                             })
      .def_property_readonly("is_dynamic", &AccessPattern::is_dynamic)
      .def("is_contiguous", [](const AccessPattern& ap) { return is_contiguous(ap); })
      .def("subscript",
           [](const AccessPattern& ap, const py::sequence& subs, bool on_chip) {
             std::vector<Index> idx;
             idx.reserve(subs.size());
             for (const py::handle& h : subs) {
               if (py::isinstance<py::slice>(h)) {
                 auto sl = h.cast<py::slice>();
                 Slice s;
                 py::object start = sl.attr("start"), stop = sl.attr("stop"), step = sl.attr("step");
                 if (!start.is_none()) s.start = int64_from_python(start, "slice start");
                 if (!stop.is_none()) s.stop = int64_from_python(stop, "slice stop");
                 if (!step.is_none()) s.step = int64_from_python(step, "slice step");
                 idx.emplace_back(s);
               } else {
                 idx.emplace_back(int64_from_python(h, "index"));
               }
             }
             return view::subscript(ap, idx, on_chip);
           })
      .def("slice",
           [](const AccessPattern& ap, int64_t dim, const py::object& start, const py::object& end,
              const py::object& step) {
             Slice s{std::nullopt, std::nullopt, int64_from_python(step, "slice step")};
             if (!start.is_none()) s.start = int64_from_python(start, "slice start");
             if (!end.is_none()) s.stop = int64_from_python(end, "slice end");
             return view::strict_slice(ap, view::normalize_dim(ap, dim, "slice"), s);
           })
      .def("select", [](const AccessPattern& ap, int64_t dim,
                        const py::object& i) { return view::select(ap, dim, int64_from_python(i, "index")); })
      .def("permute", [](const AccessPattern& ap, const std::vector<int64_t>& order) { return view::permute(ap, order); })
      .def("broadcast", [](const AccessPattern& ap, int64_t dim,
                           const py::object& n) { return view::broadcast(ap, dim, int64_from_python(n, "broadcast size")); })
      .def("expand_dim", [](const AccessPattern& ap, int64_t dim) { return view::expand_dim(ap, dim); })
      .def("squeeze_dim", [](const AccessPattern& ap, int64_t dim) { return view::squeeze_dim(ap, dim); })
      .def("reshape",
           [](const AccessPattern& ap, const py::object& s) { return view::reshape(ap, shape_from_python(s)); })
      .def("reshape_dim", [](const AccessPattern& ap, int64_t dim,
                             const py::object& s) { return view::reshape_dim(ap, dim, shape_from_python(s)); })
      .def("flatten_dims", [](const AccessPattern& ap, int64_t s, int64_t e) { return view::flatten_dims(ap, s, e); })
      .def("reinterpret", [](const AccessPattern& ap, DType d) { return view::reinterpret(ap, d); })
      .def("with_pattern",
           [](const AccessPattern& ap, const py::sequence& pattern, const py::object& offset, DType dtype) {
             if (pattern.size() == 0 || pattern.size() > size_t(kMaxRank))
               throw ViewError{fmt::format("ap(): pattern needs 1 to {} [stride, count] pairs, got {}", kMaxRank,
                                           pattern.size()),
                               {}, {}};
             AccessPattern out;
             out.storage = ap.storage;
             out.dtype = dtype;
             out.offset = int64_from_python(offset, "ap(): offset");
             out.rank = static_cast<uint8_t>(pattern.size());
             for (size_t d = 0; d < pattern.size(); ++d) {
               const py::sequence pair = py::reinterpret_borrow<py::sequence>(pattern[d]);
               if (pair.size() != 2) throw ViewError{"ap(): pattern entries are [stride, count] pairs", {}, {}};
               const Dim dim{int64_from_python(pair[0], "ap(): stride"), int64_from_python(pair[1], "ap(): count")};
               if (dim.count < 1)
                 throw ViewError{fmt::format("ap(): count {} of pattern entry {} must be positive", dim.count, d), {}, {}};
               out.dims[d] = dim;
             }
             view::check_arithmetic(out, "ap()");
             return out;
           })
      .def("with_indirection",
           [](const AccessPattern& ap, std::optional<AccessPattern> scalar_tensor, std::optional<Register> scalar_reg,
              int64_t scalar_multiplier, std::optional<AccessPattern> vector_offset, int indirect_dim,
              int64_t vector_multiplier) {
             auto ind = std::make_shared<Indirection>();
             ind->scalar_tensor = std::move(scalar_tensor);
             ind->scalar_register = scalar_reg ? scalar_reg->id : -1;
             ind->scalar_multiplier = scalar_multiplier;
             ind->vector_offset = std::move(vector_offset);
             ind->indirect_dim = indirect_dim;
             ind->vector_multiplier = vector_multiplier;
             AccessPattern out = ap;
             out.indirection = std::move(ind);
             return out;
           })
      .def("same_as", &same_static_view);

  // --- building ----------------------------------------------------------------------------
  py::class_<Kernel>(m, "Kernel")
      .def_readonly("name", &Kernel::name)
      .def_property_readonly("num_instructions", [](const Kernel& k) { return k.instructions.size(); })
      .def("text", [](const Kernel& k, bool locations) { return to_string(k, PrintOptions{.locations = locations}); },
           py::arg("locations") = true)
      .def("output_specs", [](const Kernel& k) {
        py::list l;
        for (StorageId id : k.outputs) l.append(py::make_tuple(shape_tuple(k.storage(id).shape), k.storage(id).dtype));
        return l;
      });

  py::class_<KernelBuilder>(m, "Builder")
      .def(py::init([](const std::string& name, const std::string& target, std::vector<int64_t> grid,
                       std::vector<int64_t> ids) {
             return std::make_unique<KernelBuilder>(name, require_target(target),
                                                    ProgramGrid{std::move(grid), std::move(ids)});
           }),
           py::arg("name"), py::arg("target"), py::arg("grid") = std::vector<int64_t>{},
           py::arg("program_ids") = std::vector<int64_t>{})
      .def_property_readonly("target", [](const KernelBuilder& b) { return std::string(b.config().name); })
      .def_property_readonly("generation", [](const KernelBuilder& b) { return b.config().generation; })
      .def_property_readonly("num_instructions",
                             [](const KernelBuilder& b) { return b.kernel().instructions.size(); })
      .def_property_readonly("num_storages", [](const KernelBuilder& b) { return b.kernel().storages.size(); })
      .def("location",
           [](KernelBuilder& b, std::string file, uint32_t line, uint32_t column, uint32_t end_column,
              std::string function) {
             return b.location(SourceLocation{std::move(file), line, column, std::move(function), end_column});
           })
      .def("add_storage",
           [](KernelBuilder& b, const std::string& name, Buffer buffer, DType dtype, const py::object& shape,
              const std::string& role, LocId loc, const py::object& address) {
             StorageRole r = role == "input"    ? StorageRole::input
                             : role == "output" ? StorageRole::output
                                                : StorageRole::scratch;
             std::optional<Address> a;
             Shape s;
             try {
               s = shape_from_python(shape);
               if (!address.is_none()) {
                 const py::sequence pair = py::reinterpret_borrow<py::sequence>(address);
                 const int64_t partition = int64_from_python(pair[0], "address partition");
                 const int64_t byte = int64_from_python(pair[1], "address byte offset");
                 if (partition < 0 || byte < 0 || partition > UINT32_MAX || byte > UINT32_MAX)
                   throw ViewError{fmt::format("address ({}, {}) is outside the memory", partition, byte),
                                   "addresses are (partition, byte offset) pairs of non-negative numbers",
                                   "choose an address inside the buffer, or omit address= and let nikki place "
                                   "the tensor"};
                 a = Address{uint32_t(partition), uint32_t(byte)};
               }
             } catch (const ViewError& e) {
               throw KernelError(fmt::format("tensor '{}': {}", name, e.what), b.source(loc),
                                 r == StorageRole::input ? "input" : "ndarray", e.limit, e.hint);
             }
             StorageId id = b.add_storage(name, buffer, dtype, s, r, loc, a);
             return full_view(id, dtype, s);
           })
      .def("storage", [](const KernelBuilder& b, StorageId id) { return storage_info(b.storage(id)); })
      .def("storage_buffer", [](const KernelBuilder& b, StorageId id) { return b.storage(id).buffer; })
      .def("storage_name", [](const KernelBuilder& b, StorageId id) { return b.storage(id).name; })
      .def("set_writable", [](KernelBuilder& b, StorageId id) { b.storage(id).writable_input = true; })
      .def("set_role_scratch", [](KernelBuilder& b, StorageId id) { b.storage(id).role = StorageRole::scratch; })
      .def("new_register", [](KernelBuilder& b) { return Register{b.new_register()}; })
      .def("emit",
           [](KernelBuilder& b, Opcode op, Engine engine, LocId loc, const py::sequence& operands, std::string name,
              const py::kwargs& attrs) {
             b.append_in_place([&](Instruction& inst) {
               inst.opcode = op;
               inst.engine = engine;
               inst.loc = loc;
               b.set_name(inst, name);
               const size_t n = operands.size();
               for (size_t i = 0; i < n && i < size_t(kMaxSlots); ++i) inst.operands[i] = to_operand(b, operands[i]);
               try {
                 for (auto item : attrs) set_attribute(b, inst, py::str(item.first).cast<std::string_view>(), item.second);
               } catch (const ViewError& e) {  // an attribute out of range: the user's line is `loc`
                 throw KernelError(fmt::format("{}: {}", opcode_name(op), e.what), b.source(loc),
                                   std::string(opcode_name(op)), e.limit, e.hint);
               }
               check_user_operands(b, inst);
             });
             return b.kernel().instructions.size() - 1;
           })
      .def("set_jump", [](KernelBuilder& b, int32_t index, int32_t target) { b.set_jump(index, target); })
      .def("instruction_opcode", [](const KernelBuilder& b, size_t i) { return b.kernel().instructions.at(i).opcode; })
      .def("instruction_operand",
           [](const KernelBuilder& b, size_t i, int slot) -> py::object {
             const Operand& o = b.kernel().instructions.at(i).operands.at(slot);
             if (!o.is_tensor()) return py::none();
             return py::cast(b.kernel().view(o));
           })
      .def("storage_defined_at", [](const KernelBuilder& b, StorageId id) { return b.storage(id).defined_at; })
      .def("retarget",
           [](KernelBuilder& b, size_t i, int slot, const AccessPattern& view) {
             // `dst[...] = <fresh tile>`: the instruction that produced the tile writes dst instead.
             Instruction& inst = b.instruction(i);
             internal_check(slot >= 0 && slot < inst.spec().num_slots && inst.operands[slot].is_tensor(),
                            "retarget of an operand slot that holds no tensor");
             inst.operands[slot] = b.operand(view);
           })
      .def("retarget_accumulate",
           [](KernelBuilder& b, size_t i, const AccessPattern& dst) {
             // The legacy `psum[...] += nisa.nc_matmul(...)` idiom: the matmul that produced a
             // fresh tile now accumulates into `psum` directly, as the PE array does: the first
             // matmul into a location since its allocation starts the sum (Beta 1 kernels also
             // `+=` into freshly allocated, uninitialized PSUM tiles), later ones add.
             Instruction& inst = b.instruction(i);
             internal_check(inst.opcode == Opcode::nc_matmul, "retarget_accumulate on a non-matmul");
             inst.operands[0] = b.operand(dst);
             inst.attrs.accumulate = Accumulate::automatic;
           })
      .def("record_parallel_loops", &KernelBuilder::record_parallel_loops)
      .def("open_parallel_loop", &KernelBuilder::open_parallel_loop)
      .def("begin_iteration", &KernelBuilder::begin_iteration)
      .def("close_parallel_loop", &KernelBuilder::close_parallel_loop)
      .def("add_output", &KernelBuilder::add_output)
      .def("finish", &KernelBuilder::finish);

  // --- compiling and running ---------------------------------------------------------------
  py::class_<PyProgram>(m, "Program")
      .def("text", [](const PyProgram& p, bool locations) {
        return to_string(p.program.kernel(), PrintOptions{.locations = locations});
      }, py::arg("locations") = true)
      .def_property_readonly("kernel", [](const PyProgram& p) -> const Kernel& { return p.program.kernel(); },
                             py::return_value_policy::reference_internal)
      .def_property_readonly("timings",
                             [](const PyProgram& p) {
                               py::list l;
                               for (const auto& t : p.program.timings) l.append(py::make_tuple(t.stage, t.milliseconds));
                               return l;
                             })
      .def_property_readonly("warnings",
                             [](const PyProgram& p) {
                               py::list l;
                               for (const jit::Diagnostic& d : p.program.diagnostics)
                                 l.append(py::make_tuple(d.message, d.where.file, d.where.line));
                               return l;
                             })
      .def_property_readonly("spills",
                             [](const PyProgram& p) {
                               const Kernel& k = p.program.kernel();
                               py::list l;
                               for (const jit::Spill& s : p.program.spills) {
                                 py::dict d;
                                 d["tensor"] = k.storage(s.tensor).name;
                                 d["home"] = k.storage(s.home).name;
                                 d["saves"] = s.saves;
                                 d["reloads"] = s.reloads;
                                 d["bytes"] = jit::spilled_bytes(k, {s});
                                 l.append(d);
                               }
                               return l;
                             })
      .def("disassemble", [](const PyProgram& p) { return jit::disassemble(*p.program.device); })
      .def("serialize", [](const PyProgram& p) {
        std::vector<uint8_t> bytes = jit::serialize(*p.program.device);
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      })
      .def_property_readonly("memory_bytes", [](const PyProgram& p) {
        return sizeof(PyProgram) + jit::memory_bytes(p.program) + (p.executor ? p.executor->resident_bytes() : 0) +
               (p.sanitizer ? p.sanitizer->resident_bytes() : 0);
      }, "Approximate bytes the program holds between runs: IR, streams, native code, executor state.")
      .def_property_readonly("executor", [](const PyProgram& p) {
        return p.sanitize ? "sanitizer" : p.kind == runtime::ExecutorKind::native ? "native" : "interp";
      })
      .def_property_readonly("native_stats", [](const PyProgram& p) {
        py::dict d;
        if (!p.program.native) return d;
        const jit::NativeStats& s = p.program.native->stats();
        d["instructions"] = s.instructions;
        d["fallbacks"] = s.fallbacks;
        d["templates"] = s.templates;
        d["compiled"] = s.compiled;
        d["milliseconds"] = s.milliseconds;
        d["origin"] = jit::code_origin_name(s.origin);
        return d;
      })
      .def_property_readonly("meets", &PyProgram::meets,
                             "Whether program instances meet in it (core_barrier, sendrecv): a launch runs them together.")
      .def("run", &PyProgram::run, py::arg("inputs"), py::arg("outputs"), py::arg("fill_outputs") = true)
      .def("release_executor", &PyProgram::release_executor,
           "Drops the simulated core (and its memory) until the next run.");

  m.def(
      "load_program",
      [](const py::bytes& data) {
        const std::string_view view = data;
        std::vector<uint8_t> bytes(view.begin(), view.end());
        auto p = std::make_unique<PyProgram>();
        p->program.device = std::make_shared<jit::DeviceProgram>(jit::deserialize(bytes));
        p->kind = runtime::ExecutorKind::interp;  // a loaded program carries no native code
        return p;
      },
      py::arg("data"), "Loads a device program file written by Program.serialize (KernelError if damaged).");

  m.def(
      "compile",
      [](Kernel& kernel, bool for_running, bool sanitize, int64_t sbuf_budget) {
        // A traced kernel always has its "unknown" location; a moved-from one has none.
        if (kernel.locations.empty())
          throw py::value_error(fmt::format("kernel '{}' was compiled already: compile takes over a traced kernel's IR",
                                            kernel.name));
        auto p = std::make_unique<PyProgram>();
        p->kind = runtime::executor_from_env();
        p->sanitize = sanitize;
        // A program only estimated (nikki.estimate) or run by the sanitizer needs no native code.
        const bool native = for_running && !sanitize && p->kind == runtime::ExecutorKind::native;
        p->program = jit::compile(std::move(kernel), jit::CompileOptions{.native = native,
                                                              .allocate_options = {.sbuf_budget = sbuf_budget},
                                                              .sanitize = sanitize});
        return p;
      },
      py::arg("kernel"), py::arg("for_running") = true, py::arg("sanitize") = false, py::arg("sbuf_budget") = 0,
      "Compiles a traced kernel, taking over its IR (the Kernel is empty afterwards and cannot be "
      "compiled again); sbuf_budget (bytes per partition, 0: the target's) is a testing hook that "
      "makes kernels spill.");
  m.def("sanitize_from_env", &jit::sanitize_from_env, "NIKKI_SANITIZE: 1 on, 0 or unset off (KernelError otherwise).");

  py::class_<runtime::Profile>(m, "Profile")
      .def_readonly("kernel", &runtime::Profile::kernel)
      .def_readonly("target", &runtime::Profile::target)
      .def_readonly("total_ns", &runtime::Profile::total_ns)
      .def_readonly("dma_bytes", &runtime::Profile::dma_bytes)
      .def_readonly("dma_active_ns", &runtime::Profile::dma_active_ns)
      .def_readonly("dma_peak_bytes_per_ns", &runtime::Profile::dma_peak_bytes_per_ns)
      .def_readonly("matmul_flops", &runtime::Profile::matmul_flops)
      .def_readonly("tensor_peak_flops_per_ns", &runtime::Profile::tensor_peak_flops_per_ns)
      .def("utilization", &runtime::Profile::utilization)
      .def("tensor_flop_utilization", &runtime::Profile::tensor_flop_utilization)
      .def("dma_bytes_per_ns", &runtime::Profile::dma_bytes_per_ns)
      .def_property_readonly("queues",
                             [](const runtime::Profile& p) {
                               py::list l;
                               for (const auto& q : p.queues) l.append(py::make_tuple(q.name, q.busy_ns, q.instructions));
                               return l;
                             })
      .def("instructions", [](const runtime::Profile& p, const PyProgram& prog) {
        // (queue name, opcode, start ns, end ns, source line) per instruction, in start order
        const Kernel& k = prog.program.device->kernel;
        py::list l;
        for (const auto& it : p.instructions) {
          const Instruction& inst = k.instructions[it.ir_index];
          const SourceLocation& loc = k.location(inst.loc);
          l.append(py::make_tuple(p.queues[it.queue].name, std::string(opcode_name(inst.opcode)), it.start_ns, it.end_ns,
                                  loc.known() ? loc.str() : std::string()));
        }
        return l;
      });

  m.def("live_core_memories", &runtime::live_core_memories,
        "SBUF/PSUM memories of simulated cores currently allocated (borrowed per run from a small pool).");

  m.def("estimate", [](const PyProgram& p) { return runtime::estimate(*p.program.device); });
  m.def(
      "run_launch",
      [](const std::vector<PyProgram*>& programs, const std::vector<uintptr_t>& inputs,
         const std::vector<uintptr_t>& outputs) { PyProgram::run_programs(programs, inputs, outputs, true); },
      py::arg("programs"), py::arg("inputs"), py::arg("outputs"),
      "Runs program instance i = programs[i] of one launch together on the same buffers, meeting at "
      "core_barrier and sendrecv (KernelError when they wait for each other forever).");
  m.def(
      "estimate_launch",
      [](const std::vector<const PyProgram*>& programs) {
        std::vector<const jit::DeviceProgram*> devices;
        for (const PyProgram* p : programs) devices.push_back(p->program.device.get());
        return runtime::estimate_launch(devices);
      },
      py::arg("programs"),
      "Estimated profiles of the instances of a launch that meet, each on a core of its own, in parallel.");
  m.def("profile_summary", [](const runtime::Profile& prof, const PyProgram& p, int top) {
    return prof.summary(*p.program.device, top);
  }, py::arg("profile"), py::arg("program"), py::arg("top") = 8);
  m.def("profile_chrome_trace", [](const runtime::Profile& prof, const PyProgram& p) {
    return prof.chrome_trace(*p.program.device);
  });
  // Small artifacts of the Python side (autotuning choices) in the disk compile cache: the key is
  // this build's identity and the caller's bytes, so a rebuilt nikki never reuses a stale entry.
  m.def(
      "cache_load",
      [](const std::string& category, const py::bytes& key) -> py::object {
        const jit::DiskCache cache;
        if (!cache.enabled()) return py::none();
        const auto payload = cache.load(category, python_cache_key(key));
        if (!payload) return py::none();
        return py::bytes(reinterpret_cast<const char*>(payload->data()), payload->size());
      },
      py::arg("category"), py::arg("key"));
  m.def(
      "cache_store",
      [](const std::string& category, const py::bytes& key, const py::bytes& payload) {
        const jit::DiskCache cache;
        if (!cache.enabled()) return false;
        const std::string v = payload;
        cache.store(category, python_cache_key(key), std::vector<uint8_t>(v.begin(), v.end()));
        return true;
      },
      py::arg("category"), py::arg("key"), py::arg("payload"));
  m.def(
      "profile_explain",
      [](const runtime::Profile& prof, const PyProgram& p, double useful_flops, int rows) {
        const runtime::Explanation e = runtime::explain(prof, *p.program.device, useful_flops);
        py::dict d;
        d["limit"] = e.limit;
        d["total_ns"] = e.total_ns;
        d["flops"] = e.flops;
        d["io_bytes"] = e.io_bytes;
        d["compute_roofline_ns"] = e.compute_roofline_ns;
        d["memory_roofline_ns"] = e.memory_roofline_ns;
        py::list idle, path, suggestions;
        for (const auto& r : e.idle) idle.append(py::make_tuple(r.queue, r.reason, r.ns));
        for (const auto& l : e.critical_path) path.append(py::make_tuple(l.line, l.queue, l.opcode, l.ns, l.instructions));
        for (const auto& s : e.suggestions) suggestions.append(py::make_tuple(s.text, s.stake_ns));
        d["idle"] = idle;
        d["critical_path"] = path;
        d["path_instructions"] = e.path_instructions;
        d["suggestions"] = suggestions;
        d["text"] = e.text(size_t(rows));
        return d;
      },
      py::arg("profile"), py::arg("program"), py::arg("useful_flops") = 0.0, py::arg("rows") = 5);

  nikki::bindings::bind_library(m);
  nikki::bindings::bind_introspection(m);
}
