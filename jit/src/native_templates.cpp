// Builds native templates: each instruction's operands are expressed as byte strides over one
// common iteration space, so a routine addresses every operand with base + sum(index * stride).
//
// Views of different shapes with the same element count (dst [128, 512] and src [128, 2, 256])
// pair elements by their flattened order; their dims are split to a common refinement. When no
// common affine refinement exists (or a view is not affine in bytes), the instruction keeps the
// reference semantics.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "native_templates.hpp"
#include "nikki/layout.hpp"

namespace nikki::jit {

namespace {

using native::kIterDims;
using native::kSlots;

/** One dim of an operand: element count and byte stride. */
struct ByteDim {
  int64_t count;
  int64_t stride;
};
using ByteDims = std::vector<ByteDim>;

/** A common iteration axis: extent and each slot's byte stride. */
struct Axis {
  int64_t count;
  std::array<int64_t, kSlots> stride{};
};

/** Byte dims of a view, or nullopt when its element addresses are not affine in its indices. */
std::optional<ByteDims> byte_dims(const Kernel& k, const AccessPattern& ap) {
  const Storage& s = k.storage(ap.storage);
  const int64_t size = dtype_size(ap.dtype);
  ByteDims dims;
  if (!s.on_chip()) {
    for (int d = 0; d < ap.rank; ++d) dims.push_back({ap.dims[d].count, ap.dims[d].stride * size});
    return dims;
  }
  // On chip, element e lives at partition e / row, byte (e % row) * size: affine only when each
  // dim either steps whole partitions or stays inside the row the view starts in.
  const int64_t row = row_elements(s, ap.dtype);
  const int64_t pitch = partition_pitch(k.config(), s.buffer);
  const int64_t f0 = ap.offset % row;
  int64_t lo = f0, hi = f0;
  for (int d = 0; d < ap.rank; ++d) {
    const Dim& dim = ap.dims[d];
    if (dim.count == 1) {
      dims.push_back({1, 0});
    } else if (dim.stride % row == 0) {
      dims.push_back({dim.count, dim.stride / row * pitch});
    } else {
      const int64_t span = dim.stride * (dim.count - 1);
      (span < 0 ? lo : hi) += span;
      dims.push_back({dim.count, dim.stride * size});
    }
  }
  if (lo < 0 || hi >= row || ap.offset < 0) return std::nullopt;
  return dims;
}

/** Byte offset of a view's first element from its storage's base. */
int64_t first_element_offset(const Kernel& k, const AccessPattern& ap) {
  const Storage& s = k.storage(ap.storage);
  const int64_t size = dtype_size(ap.dtype);
  if (!s.on_chip()) return ap.offset * size;
  const int64_t row = row_elements(s, ap.dtype);
  return (ap.offset / row) * partition_pitch(k.config(), s.buffer) + (ap.offset % row) * size;
}

ByteDims without_unit_dims(const ByteDims& dims) {
  ByteDims out;
  for (const ByteDim& d : dims)
    if (d.count != 1) out.push_back(d);
  return out;
}

/**
 * The coarsest common refinement of several operands' dims (all with the same element count):
 * each operand's dims split so that all share one list of axes. nullopt when the dim boundaries
 * of the operands do not nest (e.g. [4, 3] against [3, 4]).
 */
std::optional<std::vector<Axis>> refine(const std::vector<std::pair<int, ByteDims>>& operands) {
  std::set<int64_t> periods;  // inner-element counts at which some operand's dim wraps
  for (const auto& [slot, dims] : operands) {
    int64_t q = 1;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) periods.insert(q *= it->count);
  }
  std::vector<int64_t> p(periods.begin(), periods.end());
  for (size_t i = 1; i < p.size(); ++i)
    if (p[i] % p[i - 1] != 0) return std::nullopt;
  std::vector<Axis> axes;
  for (size_t j = p.size(); j-- > 0;) {
    const int64_t inner = j == 0 ? 1 : p[j - 1];
    Axis axis;
    axis.count = p[j] / inner;
    for (const auto& [slot, dims] : operands) {
      int64_t q = 1;  // elements inside dim d
      for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
        if (inner < q * it->count) {
          axis.stride[slot] = it->stride * (inner / q);
          break;
        }
        q *= it->count;
      }
    }
    axes.push_back(axis);
  }
  return axes;
}

/** Merges adjacent axes that every slot walks contiguously (fewer, longer loops). */
std::vector<Axis> merge(std::vector<Axis> axes, const std::vector<int>& slots) {
  std::vector<Axis> out;
  for (const Axis& a : axes) {
    if (!out.empty()) {
      Axis& prev = out.back();
      bool mergeable = true;
      for (int s : slots) mergeable = mergeable && prev.stride[s] == a.stride[s] * a.count;
      if (mergeable) {
        prev.count *= a.count;
        prev.stride = a.stride;
        continue;
      }
    }
    out.push_back(a);
  }
  return out;
}

class TemplateBuilder {
 public:
  TemplateBuilder(const Kernel& k, uint32_t index) : k_(k), inst_(k.instructions[index]) {
    std::memset(&t_.desc, 0, sizeof(t_.desc));  // padding bytes take part in template identity
    native::OpDesc& d = t_.desc;
    const Attributes& a = inst_.attrs;
    d.opcode = int32_t(inst_.opcode);
    d.engine = int32_t(inst_.engine);
    d.op0 = int32_t(a.op0);
    d.op1 = int32_t(a.op1);
    d.func = int32_t(a.func);
    d.reduce_op = int32_t(a.reduce_op);
    d.reduce_cmd = int32_t(a.reduce_cmd);
    d.cmp_op = int32_t(a.cmp_op);
    d.accumulate = int32_t(a.accumulate);
    d.flags = (a.reverse0 ? native::kFlagReverse0 : 0) | (a.reverse1 ? native::kFlagReverse1 : 0) |
              (a.negate ? native::kFlagNegate : 0) | (a.reverse_pred ? native::kFlagReversePred : 0) |
              (a.is_transpose ? native::kFlagIsTranspose : 0);
    for (int i = 0; i < kIterDims; ++i) d.count[i] = 1;
  }

  std::optional<std::pair<NativeTemplate, NativeInstruction>> build() {
    if (inst_.spec().is_control) return std::nullopt;
    for (int s = 0; s < inst_.spec().num_slots; ++s) {
      const Operand& o = inst_.operands[s];
      NativeOperand& n = out_.operands[s];
      if (o.is_imm()) {
        n.kind = NativeOperand::Kind::imm;
        n.imm = o.imm;
        t_.desc.slot_kind[s] = native::kSlotImm;
      } else if (o.is_tensor()) {
        if (!static_operand(s)) return std::nullopt;
        t_.desc.slot_kind[s] = native::kSlotTensor;
        t_.desc.view[s].dtype = int32_t(o.ap.dtype);
      }
    }
    const std::vector<int> full = tensor_slots();
    bool ok = false;
    switch (inst_.opcode) {
      case Opcode::dma_copy:
      case Opcode::tensor_copy: ok = elementwise("nk_copy", false, {0, 1}, {}); break;
      case Opcode::tensor_tensor: ok = elementwise("nk_tensor_tensor", true, {0, 1, 2}, {}); break;
      case Opcode::tensor_scalar: ok = elementwise("nk_tensor_scalar", true, {0, 1}, {2, 3}); break;
      case Opcode::scalar_tensor_tensor: ok = elementwise("nk_scalar_tensor_tensor", true, {0, 1, 3}, {2}); break;
      case Opcode::reciprocal: ok = elementwise("nk_reciprocal", true, {0, 1}, {}); break;
      case Opcode::memset: ok = elementwise("nk_memset", true, {0}, {}); break;
      case Opcode::activation: ok = elementwise("nk_activation", true, {0, 1}, {2, 3, 4}); break;
      case Opcode::tensor_reduce: ok = reduce(); break;
      case Opcode::nc_matmul: ok = matmul(); break;
      case Opcode::nc_transpose: ok = transpose(); break;
      default: break;
    }
    if (!ok) return std::nullopt;
    const DType data = inst_.spec().num_slots > 1 && inst_.operands[1].is_tensor() ? inst_.operands[1].ap.dtype
                                                                                   : inst_.operands[0].ap.dtype;
    t_.desc.bits = 8 * int32_t(dtype_size(data));
    if (inst_.opcode == Opcode::tensor_tensor && inst_.engine == Engine::gpsimd && !is_bitvec_op(inst_.attrs.op0)) {
      auto int32 = [&](int s) {
        DType d = inst_.operands[s].ap.dtype;
        return d == DType::int32 || d == DType::uint32;
      };
      if (int32(0) && int32(1) && int32(2) && inst_.attrs.op0 != AluOp::power) t_.desc.flags |= native::kFlagGpsimdInt;
    }
    return std::make_pair(t_, out_);
  }

 private:
  std::vector<int> tensor_slots() const {
    std::vector<int> s;
    for (int i = 0; i < inst_.spec().num_slots; ++i)
      if (inst_.operands[i].is_tensor()) s.push_back(i);
    return s;
  }

  /** Records where a tensor operand lives; false for views only the interpreter can address. */
  bool static_operand(int s) {
    const AccessPattern& ap = inst_.operands[s].ap;
    NativeOperand& n = out_.operands[s];
    n.kind = NativeOperand::Kind::tensor;
    n.storage = ap.storage;
    n.byte_offset = first_element_offset(k_, ap);
    if (const Indirection* ind = ap.indirection.get()) {
      const Storage& st = k_.storage(ap.storage);
      // Only a scalar shift of an HBM view is a pure change of base address.
      if (ind->has_vector() || st.on_chip()) return false;
      n.indirection = ind;
      n.scalar_bytes = ind->scalar_multiplier * dtype_size(ap.dtype);
      const LinearExtent e = linear_extent(ap);
      const int64_t total = storage_elements(st, ap.dtype);
      // shift * multiplier must keep [first, last] inside [0, total)
      if (e.first < 0 || e.last >= total || ind->scalar_multiplier <= 0) return false;
      n.min_shift = -(e.first / ind->scalar_multiplier);
      n.max_shift = (total - 1 - e.last) / ind->scalar_multiplier;
    }
    return true;
  }

  /** Element-wise family: `full` slots pair element by element, `per_partition` slots are
   * [P, 1] views broadcast along the free dims. With `tile`, dim 0 is the partition dim. */
  bool elementwise(const char* entry, bool tile, std::vector<int> full, std::vector<int> per_partition) {
    std::vector<std::pair<int, ByteDims>> ops;
    int64_t partitions = 1, partition_stride_slot = -1;
    std::array<int64_t, kSlots> pstride{};
    for (int s : full) {
      if (!inst_.operands[s].is_tensor()) continue;
      auto dims = byte_dims(k_, inst_.operands[s].ap);
      if (!dims) return false;
      if (tile) {
        if (dims->empty()) return false;
        partitions = (*dims)[0].count;
        pstride[s] = (*dims)[0].stride;
        partition_stride_slot = s;
        dims->erase(dims->begin());
      }
      ops.emplace_back(s, without_unit_dims(*dims));
    }
    (void)partition_stride_slot;
    auto axes = refine(ops);
    if (!axes) return false;
    std::vector<int> used;
    for (const auto& [s, dims] : ops) used.push_back(s);
    for (int s : per_partition) {
      if (!inst_.operands[s].is_tensor()) continue;
      auto dims = byte_dims(k_, inst_.operands[s].ap);
      if (!dims || dims->empty()) return false;
      pstride[s] = (*dims)[0].stride;  // free strides stay 0: broadcast along the row
      used.push_back(s);
    }
    std::vector<Axis> merged = merge(std::move(*axes), used);
    if (int(merged.size()) > kIterDims - 1) return false;
    native::OpDesc& d = t_.desc;
    d.count[0] = partitions;
    for (int s = 0; s < kSlots; ++s) d.view[s].stride[0] = pstride[s];
    const int first = kIterDims - int(merged.size());
    for (size_t i = 0; i < merged.size(); ++i) {
      d.count[first + i] = merged[i].count;
      for (int s = 0; s < kSlots; ++s) d.view[s].stride[first + i] = merged[i].stride[s];
    }
    if (!tile) {
      // Copies between arbitrary views: no partition dim, the free axes cover everything.
      d.count[0] = 1;
      if (int(merged.size()) > kIterDims - 1) return false;
    }
    t_.entry = entry;
    return true;
  }

  /** tensor_reduce: [P, kept axes..., reduced axes...] with dst strides 0 on the reduced axes. */
  bool reduce() {
    const AccessPattern& data = inst_.operands[1].ap;
    auto data_dims = byte_dims(k_, data);
    auto dst_dims = byte_dims(k_, inst_.operands[0].ap);
    if (!data_dims || !dst_dims || data_dims->empty() || dst_dims->empty()) return false;
    int first_reduced = data.rank;
    for (int d = 1; d < data.rank; ++d)
      if (inst_.attrs.axes & (1u << d)) {
        first_reduced = d;
        break;
      }
    ByteDims kept(data_dims->begin() + 1, data_dims->begin() + first_reduced);
    ByteDims reduced(data_dims->begin() + first_reduced, data_dims->end());
    ByteDims dst_free(dst_dims->begin() + 1, dst_dims->end());
    auto kept_axes = refine({{0, without_unit_dims(dst_free)}, {1, without_unit_dims(kept)}});
    auto reduced_axes = refine({{1, without_unit_dims(reduced)}});
    if (!kept_axes || !reduced_axes) return false;
    std::vector<Axis> k_axes = merge(*kept_axes, {0, 1}), r_axes = merge(*reduced_axes, {1});
    if (r_axes.empty()) r_axes.push_back(Axis{1, {}});
    if (k_axes.size() > 3 || k_axes.size() + r_axes.size() > size_t(kIterDims - 1)) return false;
    native::OpDesc& d = t_.desc;
    d.count[0] = (*data_dims)[0].count;
    d.view[0].stride[0] = (*dst_dims)[0].stride;
    d.view[1].stride[0] = (*data_dims)[0].stride;
    for (size_t i = 0; i < k_axes.size(); ++i) {
      d.count[1 + i] = k_axes[i].count;
      d.view[0].stride[1 + i] = k_axes[i].stride[0];
      d.view[1].stride[1 + i] = k_axes[i].stride[1];
    }
    const int first = kIterDims - int(r_axes.size());
    for (size_t i = 0; i < r_axes.size(); ++i) {
      d.count[first + i] = r_axes[i].count;
      d.view[1].stride[first + i] = r_axes[i].stride[1];
    }
    d.reduce_from = first;
    t_.entry = "nk_tensor_reduce";
    return true;
  }

  /** A tile view as (partitions, pitch, free elements, free byte stride); nullopt unless its free
   * dims merge into one strided dim. */
  std::optional<std::array<int64_t, 4>> flat_tile(int s) {
    auto dims = byte_dims(k_, inst_.operands[s].ap);
    if (!dims || dims->empty()) return std::nullopt;
    ByteDims free = without_unit_dims(ByteDims(dims->begin() + 1, dims->end()));
    std::vector<Axis> axes;
    for (const ByteDim& b : free) {
      Axis a;
      a.count = b.count;
      a.stride[0] = b.stride;
      axes.push_back(a);
    }
    axes = merge(axes, {0});
    if (axes.size() > 1) return std::nullopt;
    const int64_t n = axes.empty() ? 1 : axes[0].count, stride = axes.empty() ? 0 : axes[0].stride[0];
    return std::array<int64_t, 4>{(*dims)[0].count, (*dims)[0].stride, n, stride};
  }

  bool matmul() {
    auto dst = flat_tile(0), st = flat_tile(1), mv = flat_tile(2);
    if (!dst || !st || !mv) return false;
    native::OpDesc& d = t_.desc;
    d.mm_k = (*st)[0];
    d.mm_m = (*st)[2];
    d.mm_n = (*mv)[2];
    d.view[0].stride[0] = (*dst)[1];
    d.view[0].stride[1] = (*dst)[3];
    d.view[1].stride[0] = (*st)[1];
    d.view[1].stride[1] = (*st)[3];
    d.view[2].stride[0] = (*mv)[1];
    d.view[2].stride[1] = (*mv)[3];
    t_.entry = "nk_matmul";
    return true;
  }

  bool transpose() {
    auto dst = flat_tile(0), data = flat_tile(1);
    if (!dst || !data) return false;
    native::OpDesc& d = t_.desc;
    d.count[0] = (*data)[0];
    d.count[1] = (*data)[2];
    d.view[1].stride[0] = (*data)[1];
    d.view[1].stride[1] = (*data)[3];
    d.view[0].stride[0] = (*dst)[1];  // per data free index (dst partition)
    d.view[0].stride[1] = (*dst)[3];  // per data partition (dst free element)
    t_.entry = "nk_transpose";
    return true;
  }

  const Kernel& k_;
  const Instruction& inst_;
  NativeTemplate t_;
  NativeInstruction out_;
};

}  // namespace

std::optional<std::pair<NativeTemplate, NativeInstruction>> make_template(const Kernel& kernel, uint32_t index) {
  return TemplateBuilder(kernel, index).build();
}

namespace {

class CompiledProgram final : public NativeCode {
 public:
  CompiledProgram(std::vector<NativeInstruction> instructions, NativeStats stats, std::shared_ptr<void> keep_alive)
      : keep_alive_(std::move(keep_alive)) {
    instructions_ = std::move(instructions);
    stats_ = stats;
  }

 private:
  std::shared_ptr<void> keep_alive_;
};

struct DescKey {
  std::string bytes;
  bool operator==(const DescKey&) const = default;
};
struct DescKeyHash {
  size_t operator()(const DescKey& k) const { return std::hash<std::string>()(k.bytes); }
};

}  // namespace

std::shared_ptr<const NativeCode> compile_native(const DeviceProgram& program) {
  const auto start = std::chrono::steady_clock::now();
  const Kernel& k = program.kernel;
  std::vector<NativeInstruction> instructions(k.instructions.size());
  std::vector<bool> native(k.instructions.size(), false);
  std::vector<NativeTemplate> templates;
  std::unordered_map<DescKey, uint32_t, DescKeyHash> ids;
  NativeStats stats;
  for (uint32_t i = 0; i < k.instructions.size(); ++i) {
    auto t = make_template(k, i);
    if (!t) {
      stats.fallbacks += !k.instructions[i].spec().is_control;
      continue;
    }
    DescKey key;
    key.bytes.assign(reinterpret_cast<const char*>(&t->first.desc), sizeof(native::OpDesc));
    key.bytes.append(t->first.entry);
    auto [it, inserted] = ids.emplace(std::move(key), uint32_t(templates.size()));
    if (inserted) templates.push_back(t->first);
    instructions[i] = t->second;
    instructions[i].template_id = it->second;
    native[i] = true;
    ++stats.instructions;
  }
  std::shared_ptr<void> keep_alive;
  std::vector<native::Routine> routines = generate_routines(templates, keep_alive);
  for (uint32_t i = 0; i < k.instructions.size(); ++i)
    if (native[i]) instructions[i].routine = routines[instructions[i].template_id];
  stats.templates = int64_t(templates.size());
  stats.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return std::make_shared<CompiledProgram>(std::move(instructions), stats, std::move(keep_alive));
}

}  // namespace nikki::jit
