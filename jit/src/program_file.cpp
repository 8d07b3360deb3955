// nikki's device-program file (docs/device-program.md): a header (magic, format version, payload
// size, FNV-1a checksum of the payload) followed by the kernel IR and the streams, all fields
// little-endian and fixed width, strings and lists prefixed by a u32 count.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "byte_codec.hpp"
#include "nikki/ir_attributes.hpp"
#include "nikki/jit/streams.hpp"

namespace nikki::jit {

namespace {

constexpr char kMagic[8] = {'N', 'I', 'K', 'K', 'I', 'D', 'P', '\0'};
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 8;

uint64_t fnv1a(const uint8_t* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

void write_ap(Writer& w, const AccessPattern& ap);

void write_optional_ap(Writer& w, const std::optional<AccessPattern>& ap) {
  w.u8(ap.has_value());
  if (ap) write_ap(w, *ap);
}

void write_ap(Writer& w, const AccessPattern& ap) {
  w.u32(ap.storage);
  w.u8(uint8_t(ap.dtype));
  w.u8(ap.rank);
  w.i64(ap.offset);
  for (int d = 0; d < ap.rank; ++d) {
    w.i64(ap.dims[d].stride);
    w.i64(ap.dims[d].count);
  }
  const Indirection* ind = ap.indirection.get();
  w.u8(ind != nullptr);
  if (ind) {
    write_optional_ap(w, ind->scalar_tensor);
    w.i32(ind->scalar_register);
    w.i64(ind->scalar_multiplier);
    write_optional_ap(w, ind->vector_offset);
    w.i32(ind->indirect_dim);
    w.i64(ind->vector_multiplier);
  }
}

AccessPattern read_ap(Reader& r, size_t num_storages, int depth = 0) {
  if (depth > 2) Reader::corrupt("runtime offsets nest too deeply");
  AccessPattern ap;
  ap.storage = r.u32();
  if (ap.storage >= num_storages) Reader::corrupt("an operand names a missing tensor");
  ap.dtype = r.enumeration<DType>(kNumDTypes);
  ap.rank = r.u8();
  if (ap.rank > kMaxRank) Reader::corrupt("an access pattern has too many dims");
  ap.offset = r.i64();
  for (int d = 0; d < ap.rank; ++d) ap.dims[d] = {r.i64(), r.i64()};
  if (r.u8()) {
    auto ind = std::make_shared<Indirection>();
    if (r.u8()) ind->scalar_tensor = read_ap(r, num_storages, depth + 1);
    ind->scalar_register = r.i32();
    ind->scalar_multiplier = r.i64();
    if (r.u8()) ind->vector_offset = read_ap(r, num_storages, depth + 1);
    ind->indirect_dim = r.i32();
    ind->vector_multiplier = r.i64();
    ap.indirection = std::move(ind);
  }
  return ap;
}

/** The attributes an opcode uses, in its OpcodeSpec's order, each as its type's fixed-width field. */
void write_attributes(Writer& w, const Kernel& k, const Instruction& inst) {
  const OpcodeSpec& spec = inst.spec();
  const RareAttributes& rare = k.rare(inst);
  for (int i = 0; i < spec.num_attrs; ++i) {
    const Attr a = spec.attrs[i].attr;
    switch (attr_spec(a).type) {
      case AttrType::alu_op:
      case AttrType::act_func:
      case AttrType::reduce_cmd:
      case AttrType::accumulate:
      case AttrType::flag: w.u8(uint64_t(attr_int(k, inst, a))); break;
      case AttrType::axes: w.u32(uint64_t(attr_int(k, inst, a))); break;
      case AttrType::integer: w.i64(attr_int(k, inst, a)); break;
      case AttrType::real: w.f64(rare.fill_value); break;
      case AttrType::text: w.str(rare.text); break;
      case AttrType::pattern:
        w.u32(rare.pattern.size());
        for (const Dim& d : rare.pattern) {
          w.i64(d.stride);
          w.i64(d.count);
        }
        break;
      case AttrType::lanes:
        w.u32(rare.lanes.size());
        for (int32_t lane : rare.lanes) w.i32(lane);
        break;
    }
  }
}

void read_attributes(Reader& r, Kernel& k, Instruction& inst) {
  const OpcodeSpec& spec = inst.spec();
  for (int i = 0; i < spec.num_attrs; ++i) {
    const Attr a = spec.attrs[i].attr;
    auto scalar = [&](int64_t v) {
      if (v < attr_int_min(a) || v > attr_int_max(a)) Reader::corrupt("an attribute is out of range");
      if (v != attr_int(k, inst, a)) set_attr_int(k, inst, a, v);  // defaults need no side-table entry
    };
    switch (attr_spec(a).type) {
      case AttrType::alu_op:
      case AttrType::act_func:
      case AttrType::reduce_cmd:
      case AttrType::accumulate:
      case AttrType::flag: scalar(r.u8()); break;
      case AttrType::axes: scalar(r.u32()); break;
      case AttrType::integer: scalar(r.i64()); break;
      case AttrType::real:
        if (const double v = r.f64(); v != 0.0 || std::signbit(v)) k.mutable_rare(inst).fill_value = v;
        break;
      case AttrType::text:
        if (std::string text = r.str(); !text.empty()) k.mutable_rare(inst).text = std::move(text);
        break;
      case AttrType::pattern: {
        const uint32_t n = r.count(16);
        if (n) {
          std::vector<Dim>& pattern = k.mutable_rare(inst).pattern;
          for (uint32_t d = 0; d < n; ++d) pattern.push_back({r.i64(), r.i64()});
        }
        break;
      }
      case AttrType::lanes: {
        const uint32_t n = r.count(4);
        if (n) {
          std::vector<int32_t>& lanes = k.mutable_rare(inst).lanes;
          for (uint32_t l = 0; l < n; ++l) lanes.push_back(r.i32());
        }
        break;
      }
    }
  }
}

void write_kernel(Writer& w, const Kernel& k) {
  w.str(k.name);
  w.u8(uint8_t(k.target));
  w.i32(k.num_registers);
  w.u8(k.allocated);
  w.u32(k.locations.size());
  for (const SourceLocation& l : k.locations) {
    w.str(l.file);
    w.u32(l.line);
    w.u32(l.column);
    w.u32(l.end_column);
    w.str(l.function);
  }
  w.u32(k.storages.size());
  for (const Storage& s : k.storages) {
    w.str(s.name);
    w.u8(uint8_t(s.buffer));
    w.u8(uint8_t(s.dtype));
    w.u8(s.shape.rank());
    for (int64_t e : s.shape) w.i64(e);
    w.u8(uint8_t(s.role));
    w.u8(s.writable_input);
    w.u8(s.address.has_value());
    w.u32(s.address ? s.address->partition : 0);
    w.u32(s.address ? s.address->byte_offset : 0);
    w.u8(s.user_address);
    w.u32(s.loc);
    w.u32(s.defined_at);
  }
  w.u32(k.inputs.size());
  for (StorageId id : k.inputs) w.u32(id);
  w.u32(k.outputs.size());
  for (StorageId id : k.outputs) w.u32(id);
  w.u32(k.instructions.size());
  for (const Instruction& inst : k.instructions) {
    w.u8(uint8_t(inst.opcode));
    w.u8(uint8_t(inst.engine));
    w.u32(inst.loc);
    w.str(k.instruction_name(inst));
    for (int s = 0; s < inst.spec().num_slots; ++s) {
      const Operand& o = inst.operands[s];
      w.u8(uint8_t(o.kind()));
      if (o.is_tensor()) write_ap(w, k.view(o));
      if (o.is_imm()) w.f64(o.imm());
      if (o.is_reg()) w.i32(o.reg());
    }
    write_attributes(w, k, inst);
  }
}

Kernel read_kernel(Reader& r) {
  Kernel k;
  k.name = r.str();
  k.target = r.enumeration<TargetId>(2);
  k.num_registers = r.i32();
  k.allocated = r.u8();
  uint32_t n = r.count(20);
  k.locations.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    SourceLocation l;
    l.file = r.str();
    l.line = r.u32();
    l.column = r.u32();
    l.end_column = r.u32();
    l.function = r.str();
    k.locations.push_back(std::move(l));
  }
  n = r.count(30);
  k.storages.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    Storage s;
    s.name = r.str();
    s.buffer = r.enumeration<Buffer>(5);
    s.dtype = r.enumeration<DType>(kNumDTypes);
    uint8_t rank = r.u8();
    if (rank > kMaxRank) Reader::corrupt("a tensor has too many dims");
    for (int d = 0; d < rank; ++d) s.shape.push_back(r.i64());
    s.role = r.enumeration<StorageRole>(3);
    s.writable_input = r.u8();
    bool has_address = r.u8();
    Address a{r.u32(), r.u32()};
    if (has_address) s.address = a;
    s.user_address = r.u8();
    s.loc = r.u32();
    s.defined_at = r.u32();
    k.storages.push_back(std::move(s));
  }
  auto ids = [&](std::vector<StorageId>& out) {
    uint32_t m = r.count(4);
    for (uint32_t i = 0; i < m; ++i) {
      StorageId id = r.u32();
      if (id >= k.storages.size()) Reader::corrupt("a parameter names a missing tensor");
      out.push_back(id);
    }
  };
  ids(k.inputs);
  ids(k.outputs);
  n = r.count(7);
  k.instructions.resize(n);
  for (Instruction& inst : k.instructions) {
    inst.opcode = r.enumeration<Opcode>(kNumOpcodes);
    inst.engine = r.enumeration<Engine>(7);
    inst.loc = r.u32();
    k.set_instruction_name(inst, r.str());
    for (int s = 0; s < inst.spec().num_slots; ++s) {
      const auto kind = r.enumeration<Operand::Kind>(4);
      Operand& o = inst.operands[s];
      if (kind == Operand::Kind::tensor) o = k.tensor_operand(read_ap(r, k.storages.size()));
      if (kind == Operand::Kind::imm) o = Operand::immediate(r.f64());
      if (kind == Operand::Kind::reg) o = Operand::reg_(r.i32());
    }
    read_attributes(r, k, inst);
  }
  return k;
}

}  // namespace

std::vector<uint8_t> serialize_kernel(const Kernel& kernel) {
  Writer w;
  write_kernel(w, kernel);
  return std::move(w.out);
}

std::vector<uint8_t> serialize(const DeviceProgram& p) {
  Writer payload;
  write_kernel(payload, p.kernel);
  payload.u32(p.streams.size());
  for (const Stream& s : p.streams) {
    payload.u8(uint8_t(s.queue.kind));
    payload.u16(s.queue.index);
    payload.u32(s.ops.size());
    for (const StreamOp& op : s.ops) {
      payload.u8(uint8_t(op.kind));
      payload.u32(op.ir_index);
      payload.u32(op.waits.size());
      for (const SemaphoreWait& w : op.waits) {
        payload.u16(w.queue);
        payload.u32(w.count);
      }
    }
  }
  payload.u32(p.spills.size());
  for (const Spill& s : p.spills) {
    payload.u32(s.tensor);
    payload.u32(s.home);
    for (const std::vector<uint32_t>* transfers : {&s.saves, &s.reloads}) {
      payload.u32(transfers->size());
      for (uint32_t i : *transfers) payload.u32(i);
    }
  }
  Writer file;
  file.bytes(kMagic, 8);
  file.u32(kDeviceProgramVersion);
  file.pod<uint64_t>(payload.out.size());
  file.pod<uint64_t>(fnv1a(payload.out.data(), payload.out.size()));
  file.bytes(payload.out.data(), payload.out.size());
  return std::move(file.out);
}

DeviceProgram deserialize(const std::vector<uint8_t>& bytes, PayloadCheck check) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
    Reader::corrupt("it is not a nikki device program (bad magic or too short)");
  Reader header(bytes.data() + 8, kHeaderBytes - 8);
  const uint32_t version = header.u32();
  const uint64_t size = header.pod<uint64_t>();
  const uint64_t checksum = header.pod<uint64_t>();
  if (version != kDeviceProgramVersion)
    throw KernelError(fmt::format("device program file has format version {}, this nikki reads version {}", version,
                                  kDeviceProgramVersion),
                      {}, {}, {}, "recompile the kernel");
  if (bytes.size() - kHeaderBytes != size) Reader::corrupt("its size does not match its header (truncated)");
  const uint8_t* payload = bytes.data() + kHeaderBytes;
  if (check == PayloadCheck::verify && fnv1a(payload, size) != checksum) Reader::corrupt("its checksum does not match");

  Reader r(payload, size);
  DeviceProgram p;
  p.kernel = read_kernel(r);
  uint32_t n = r.count(7);
  for (uint32_t s = 0; s < n; ++s) {
    Stream stream;
    stream.queue.kind = r.enumeration<QueueKind>(6);
    stream.queue.index = r.u16();
    uint32_t m = r.count(9);
    stream.ops.reserve(m);
    for (uint32_t i = 0; i < m; ++i) {
      StreamOp op;
      op.kind = r.enumeration<StreamOp::Kind>(2);
      op.ir_index = r.u32();
      if (op.ir_index >= p.kernel.instructions.size()) Reader::corrupt("a stream names a missing instruction");
      uint32_t w = r.count(6);
      for (uint32_t j = 0; j < w; ++j) {
        SemaphoreWait wait{r.u16(), r.u32()};
        if (wait.queue >= n) Reader::corrupt("a wait names a missing queue");
        op.waits.push_back(wait);
      }
      stream.ops.push_back(std::move(op));
    }
    p.streams.push_back(std::move(stream));
  }
  n = r.count(16);
  for (uint32_t i = 0; i < n; ++i) {
    Spill s;
    s.tensor = r.u32();
    s.home = r.u32();
    if (s.tensor >= p.kernel.storages.size() || s.home >= p.kernel.storages.size())
      Reader::corrupt("a spill names a missing tensor");
    for (std::vector<uint32_t>* transfers : {&s.saves, &s.reloads}) {
      const uint32_t m = r.count(4);
      for (uint32_t j = 0; j < m; ++j) {
        transfers->push_back(r.u32());
        if (transfers->back() >= p.kernel.instructions.size()) Reader::corrupt("a spill names a missing instruction");
      }
    }
    p.spills.push_back(std::move(s));
  }
  if (!r.done()) Reader::corrupt("it has trailing bytes");
  p.placement.assign(p.kernel.instructions.size(), {0, 0});
  for (uint32_t s = 0; s < p.streams.size(); ++s)
    for (uint32_t i = 0; i < p.streams[s].ops.size(); ++i)
      if (p.streams[s].ops[i].kind == StreamOp::Kind::instruction) p.placement[p.streams[s].ops[i].ir_index] = {s, i};
  return p;
}

}  // namespace nikki::jit
