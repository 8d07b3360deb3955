// Kernel introspection: the IR as plain Python data, so tools written in Python (an eager numpy
// executor, dependency or footprint analyzers, visualizers) can walk a compiled kernel without
// parsing its text form.
//
// Everything returned is built from str, int, float, bool, None, tuples, lists and dicts (plus two
// namedtuples, which are tuples), so it can be pickled or dumped as JSON as is. Enumerations are
// given by name, spelled as the _core enums spell them (AluOp, ActFunc, ReduceCmd, Accumulate,
// DType, Buffer, Engine, Opcode), so `getattr(_core.AluOp, name)` maps a name back.
//
// Shapes of the data (documented for users in the docstrings below):
//   storage:     {"id", "name", "buffer", "dtype", "shape", "role", "writable", "address"}
//   instruction: {"index", "opcode", "engine", "name", "location", "slots", "access", "operands",
//                 "attrs"[, "runtime_offsets"]}
//   operand:     None | float (immediate) | RegisterRef(id) | TensorView(storage, dtype, offset, pattern)
#include "program_introspection.hpp"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <string>
#include <string_view>

#include "nikki/ir_attributes.hpp"

namespace py = pybind11;

namespace nikki::bindings {

py::tuple shape_tuple(const Shape& s) {
  py::tuple t(s.rank());
  for (int i = 0; i < s.rank(); ++i) t[i] = s[i];
  return t;
}

int64_t int64_from_python(const py::handle& value, std::string_view what) {
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) {
    PyErr_Clear();
    throw ViewError{fmt::format("{} must be an integer, got {}", what, py::str(py::type::of(value)).cast<std::string>()),
                    {}, {}};
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0)
    throw ViewError{fmt::format("{} {} does not fit in a signed 64-bit integer", what,
                                py::str(index).cast<std::string>()),
                    size_limit_text(), "use smaller extents, indices and strides"};
  return static_cast<int64_t>(v);
}

Shape shape_from_python(const py::handle& dims) {
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(dims);
  const std::string shown = py::str(py::tuple(seq)).cast<std::string>();
  if (seq.size() > size_t(kMaxRank))
    throw ViewError{fmt::format("shape {} has rank {}, above the maximum of {}", shown, seq.size(), kMaxRank), {}, {}};
  Shape shape;
  for (const py::handle& d : seq) shape.push_back(int64_from_python(d, fmt::format("shape {}: extent", shown)));
  return shape;
}

namespace {

/** The namedtuple types of operands. Created once; deliberately never released, because a
 * pybind11 static py::object would be destroyed after the interpreter at exit. */
struct OperandTypes {
  py::handle tensor_view;
  py::handle register_ref;
};

OperandTypes& operand_types() {
  static OperandTypes types;
  return types;
}

py::str name_of(std::string_view s) { return py::str(s.data(), s.size()); }

const char* role_name(StorageRole r) {
  switch (r) {
    case StorageRole::input: return "input";
    case StorageRole::output: return "output";
    case StorageRole::scratch: return "scratch";
  }
  return "?";
}

const char* access_name(Access a) {
  switch (a) {
    case Access::read: return "read";
    case Access::write: return "write";
    case Access::read_write: return "read_write";
  }
  return "?";
}

// Python enum member names, not the IR printer's NKI flag spelling ("auto", "false", "true").
const char* accumulate_enum_name(Accumulate a) {
  switch (a) {
    case Accumulate::automatic: return "automatic";
    case Accumulate::overwrite: return "overwrite";
    case Accumulate::accumulate: return "accumulate";
  }
  return "?";
}

py::tuple pattern_tuple(std::span<const Dim> dims) {
  py::tuple t(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t[i] = py::make_tuple(dims[i].stride, dims[i].count);
  return t;
}

py::object tensor_view(const AccessPattern& ap) {
  return operand_types().tensor_view(ap.storage, name_of(dtype_name(ap.dtype)), ap.offset, pattern_tuple(ap.pattern()));
}

py::object operand_value(const Kernel& k, const Operand& o) {
  switch (o.kind()) {
    case Operand::Kind::none: return py::none();
    case Operand::Kind::imm: return py::float_(o.imm());
    case Operand::Kind::reg: return operand_types().register_ref(o.reg());
    case Operand::Kind::tensor: return tensor_view(k.view(o));
  }
  return py::none();
}

/** The runtime terms of a dynamic view, which its TensorView (the static part) leaves out. */
py::dict runtime_offsets(const Indirection& ind) {
  py::dict d;
  d["scalar_tensor"] = ind.scalar_tensor ? tensor_view(*ind.scalar_tensor) : py::none();
  d["scalar_register"] = ind.scalar_register >= 0 ? py::object(py::int_(ind.scalar_register)) : py::none();
  d["scalar_multiplier"] = ind.scalar_multiplier;
  d["vector_offset"] = ind.vector_offset ? tensor_view(*ind.vector_offset) : py::none();
  d["indirect_dim"] = ind.indirect_dim;
  d["vector_multiplier"] = ind.vector_multiplier;
  return d;
}

py::tuple axes_tuple(uint32_t mask) {
  py::list l;
  for (int d = 0; d < 32; ++d)
    if (mask & (1u << d)) l.append(d);
  return py::tuple(l);
}

/** The attributes an opcode's semantics read (its OpcodeSpec's list), every one of them with its
 * value (defaults included, unlike the text form), keyed by their attribute names. */
py::dict attributes(const Kernel& k, const Instruction& inst) {
  const RareAttributes& r = k.rare(inst);
  const OpcodeSpec& spec = inst.spec();
  py::dict d;
  for (int i = 0; i < spec.num_attrs; ++i) {
    const Attr a = spec.attrs[i].attr;
    const py::str key = name_of(attr_spec(a).name);
    switch (attr_spec(a).type) {
      case AttrType::alu_op: d[key] = name_of(alu_op_name(AluOp(attr_int(k, inst, a)))); break;
      case AttrType::act_func: d[key] = name_of(act_func_name(ActFunc(attr_int(k, inst, a)))); break;
      case AttrType::reduce_cmd: d[key] = name_of(reduce_cmd_name(ReduceCmd(attr_int(k, inst, a)))); break;
      case AttrType::accumulate: d[key] = accumulate_enum_name(Accumulate(attr_int(k, inst, a))); break;
      case AttrType::flag: d[key] = attr_int(k, inst, a) != 0; break;
      case AttrType::axes: d[key] = axes_tuple(uint32_t(attr_int(k, inst, a))); break;
      case AttrType::integer: d[key] = attr_int(k, inst, a); break;
      case AttrType::real: d[key] = r.fill_value; break;
      case AttrType::text: d[key] = r.text; break;
      case AttrType::pattern: d[key] = pattern_tuple(r.pattern); break;
      case AttrType::lanes: d[key] = py::tuple(py::cast(r.lanes)); break;
    }
  }
  return d;
}

py::dict storage_dict(const Kernel& k, StorageId id) {
  const Storage& s = k.storage(id);
  py::dict d;
  d["id"] = id;
  d["name"] = s.name;
  d["buffer"] = name_of(buffer_name(s.buffer));
  d["dtype"] = name_of(dtype_name(s.dtype));
  d["shape"] = shape_tuple(s.shape);
  d["role"] = role_name(s.role);
  d["writable"] = s.role != StorageRole::input || s.writable_input;
  d["address"] = s.address ? py::object(py::make_tuple(s.address->partition, s.address->byte_offset)) : py::none();
  return d;
}

py::dict instruction_dict(const Kernel& k, size_t index) {
  const Instruction& inst = k.instructions.at(index);
  const OpcodeSpec& spec = inst.spec();
  py::dict d;
  d["index"] = index;
  d["opcode"] = name_of(spec.name);
  d["engine"] = name_of(engine_name(inst.engine));
  d["name"] = name_of(k.instruction_name(inst));
  const SourceLocation& loc = k.location(inst.loc);
  d["location"] = loc.known() ? py::object(py::make_tuple(loc.file, loc.line)) : py::none();
  py::tuple slots(spec.num_slots), access(spec.num_slots);
  py::list operands;
  py::dict dynamic;
  for (int i = 0; i < spec.num_slots; ++i) {
    const Operand& o = inst.operands[i];
    slots[i] = name_of(spec.slots[i].name);
    access[i] = access_name(inst.access(i));
    operands.append(operand_value(k, o));
    if (const Indirection* ind = o.is_tensor() ? k.indirection(o) : nullptr) dynamic[py::int_(i)] = runtime_offsets(*ind);
  }
  d["slots"] = slots;
  d["access"] = access;
  d["operands"] = operands;
  d["attrs"] = attributes(k, inst);
  if (!dynamic.empty()) d["runtime_offsets"] = dynamic;
  return d;
}

py::tuple id_tuple(const std::vector<StorageId>& ids) {
  py::tuple t(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) t[i] = ids[i];
  return t;
}

}  // namespace

void bind_introspection(py::module_& m) {
  py::object namedtuple = py::module_::import("collections").attr("namedtuple");
  py::object tensor_view_type = namedtuple("TensorView", py::make_tuple("storage", "dtype", "offset", "pattern"),
                                           py::arg("module") = m.attr("__name__"));
  tensor_view_type.attr("__doc__") =
      "A static tensor operand: element (i0, ..., ik) is linear element\n"
      "offset + sum(stride_d * i_d) of storage `storage`, counted in elements of `dtype` (a DType name)\n"
      "over the storage laid out row-major. `pattern` is ((stride, count), ...), partition dim first\n"
      "for SBUF/PSUM storages (whose rows are partitions).";
  py::object register_ref_type =
      namedtuple("RegisterRef", py::make_tuple("id"), py::arg("module") = m.attr("__name__"));
  register_ref_type.attr("__doc__") = "A register operand (loop counters, runtime offsets).";
  m.attr("TensorView") = tensor_view_type;
  m.attr("RegisterRef") = register_ref_type;
  operand_types().tensor_view = tensor_view_type.release();
  operand_types().register_ref = register_ref_type.release();

  auto kernel = py::reinterpret_borrow<py::class_<Kernel>>(m.attr("Kernel"));
  kernel
      .def_property_readonly("target", [](const Kernel& k) { return std::string(k.config().name); })
      .def_property_readonly("inputs", [](const Kernel& k) { return id_tuple(k.inputs); },
                             "Storage ids of the parameters, in parameter order.")
      .def_property_readonly("outputs", [](const Kernel& k) { return id_tuple(k.outputs); },
                             "Storage ids of the returned outputs, in return order.")
      .def_property_readonly("allocated", [](const Kernel& k) { return k.allocated; },
                             "True once every on-chip storage has an address (compiled kernels).")
      .def(
          "storages",
          [](const Kernel& k) {
            py::list l;
            for (StorageId id = 0; id < k.storages.size(); ++id) l.append(storage_dict(k, id));
            return l;
          },
          R"doc(Every storage (tensor memory) of the kernel; list position = storage id.

Each is a dict: id, name, buffer ("hbm", "shared_hbm", "private_hbm", "sbuf", "psum"),
dtype (a DType name), shape (tuple; on-chip: partitions first), role ("input", "output" or
"scratch"), writable (False for inputs the kernel may not write), address ((partition,
byte offset) of an allocated on-chip storage, else None).)doc")
      .def(
          "instructions",
          [](const Kernel& k) {
            py::list l;
            for (size_t i = 0; i < k.instructions.size(); ++i) l.append(instruction_dict(k, i));
            return l;
          },
          R"doc(Every instruction in program order (the kernel's meaning), as dicts:

index; opcode and engine (Opcode / Engine names); name (nisa name=, or ""); location ((file,
line) of the user's source line, or None); slots (the opcode's operand slot names, NKI parameter
names such as "dst", "data", "operand0"); access ("read", "write" or "read_write" per slot;
nc_matmul's dst is read_write unless it overwrites); operands (one per slot: None when absent,
a float immediate, RegisterRef(id) or TensorView(storage, dtype, offset, pattern)); attrs (the
attributes the opcode's semantics use, every one with its value: ALU operators, activation
function and reduce command by name, axes as a tuple of view dims, flags as bools, accumulate as
"automatic" / "overwrite" / "accumulate"); runtime_offsets (only for instructions with dynamic
views: {slot: {scalar_tensor, scalar_register, scalar_multiplier, vector_offset, indirect_dim,
vector_multiplier}}, the runtime terms the slot's TensorView leaves out).)doc")
      .def("instruction",
           [](const Kernel& k, size_t i) {
             if (i >= k.instructions.size())
               throw py::index_error(fmt::format("instruction index {} out of range: kernel '{}' has {} instructions", i,
                                                 k.name, k.instructions.size()));
             return instruction_dict(k, i);
           },
           py::arg("index"),
           "Instruction `index` as instructions() describes it.");
}

}  // namespace nikki::bindings
