// Builds native templates: each instruction's operands are expressed as byte strides over one
// common iteration space, so a routine addresses every operand with base + sum(index * stride).
//
// Views of different shapes with the same element count (dst [128, 512] and src [128, 2, 256])
// pair elements by their flattened order; their dims are split to a common refinement. When the
// dims do not nest ([4, 6] against [6, 4], each in its own memory order), the iteration space is
// the first operand's and the others are "irregular": addressed by decomposing the flattened
// index into their own dims. Instructions keep the reference semantics only when a view is not
// affine in bytes (an on-chip dim that runs across partition rows, a vector offset), has more
// dims than a routine iterates, reads register operands, or overlaps another operand in a way a
// routine's order of reads and writes would change (see in_order_safe).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "native_templates.hpp"
#include "operand_overlap.hpp"
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

/** An operand's dims without the size-1 ones, adjacent dims that continue each other merged (so
 * contiguous views of different shapes, [4, 6] against [6, 4], still pair as [24]). */
ByteDims without_unit_dims(const ByteDims& dims) {
  ByteDims out;
  for (const ByteDim& d : dims) {
    if (d.count == 1) continue;
    if (!out.empty() && out.back().stride == d.stride * d.count) {
      out.back() = {out.back().count * d.count, d.stride};
      continue;
    }
    out.push_back(d);
  }
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
    for (int s = 0; s < kMaxSlots; ++s)
      if (inst_.operands[s].is_tensor()) views_[s] = k.view(inst_.operands[s]);
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
    // oob_mode=skip drops out-of-bound elements at run time: the reference semantics do that.
    if (inst_.spec().is_control || inst_.attrs.oob_skip) return std::nullopt;
    for (int s = 0; s < inst_.spec().num_slots; ++s) {
      const Operand& o = inst_.operands[s];
      NativeOperand& n = out_.operands[s];
      if (o.is_reg()) return std::nullopt;  // register operands are read by the reference semantics
      if (o.is_imm()) {
        n.kind = NativeOperand::Kind::imm;
        n.imm = o.imm();
        t_.desc.slot_kind[s] = native::kSlotImm;
      } else if (o.is_tensor()) {
        if (!static_operand(s)) return std::nullopt;
        t_.desc.slot_kind[s] = native::kSlotTensor;
        t_.desc.view[s].dtype = int32_t(o.dtype());
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
      case Opcode::activation: ok = elementwise("nk_activation", true, {0, 1}, {2, 3, 4}) && stack_partitions(); break;
      case Opcode::tensor_reduce: ok = reduce(); break;
      case Opcode::tensor_scalar_reduce:
        ok = elementwise("nk_tensor_scalar_reduce", true, {0, 1}, {2, 3}) && stack_partitions();
        break;
      case Opcode::tensor_tensor_scan: ok = elementwise("nk_scan", true, {0, 1, 2}, {3}) && stack_partitions(); break;
      case Opcode::tensor_copy_predicated:
        ok = !inst_.operands[1].is_none() && elementwise("nk_copy_predicated", true, {0, 1, 2}, {});
        break;
      case Opcode::select_reduce:
        ok = elementwise("nk_select_reduce", true, {0, 1, 2}, {3, 4}) && stack_partitions();
        break;
      case Opcode::iota:
      case Opcode::affine_select: ok = affine(); break;
      case Opcode::bn_stats: ok = with_output_space("nk_bn_stats", {1}, {0}); break;
      case Opcode::bn_aggr: ok = with_output_space("nk_bn_aggr", {1}, {0}); break;
      case Opcode::max8: ok = with_output_space("nk_max8", {1}, {0}) && free_elements(1) >= 8; break;
      case Opcode::nc_find_index8:
        // The routine reads all of a partition's vals and data before writing its indices, the
        // reference writes each index as it goes: only equal when no write lands on a later read.
        ok = in_order_safe(0, 1) && in_order_safe(0, 2) && with_output_space("nk_find_index8", {1}, {0, 2});
        break;
      case Opcode::tensor_partition_reduce:
        // Columns are read in blocks before their sums are written (the reference: one at a time).
        ok = in_order_safe(0, 1) && partition_reduce();
        break;
      case Opcode::nc_matmul: ok = matmul(); break;
      case Opcode::nc_transpose: ok = transpose(); break;
      default: break;
    }
    if (!ok) return std::nullopt;
    const DType data = inst_.spec().num_slots > 1 && inst_.operands[1].is_tensor() ? inst_.operands[1].dtype()
                                                                                   : inst_.operands[0].dtype();
    t_.desc.bits = 8 * int32_t(dtype_size(data));
    if (inst_.opcode == Opcode::tensor_tensor && inst_.engine == Engine::gpsimd && !is_bitvec_op(inst_.attrs.op0)) {
      auto int32 = [&](int s) {
        DType d = inst_.operands[s].dtype();
        return d == DType::int32 || d == DType::uint32;
      };
      if (int32(0) && int32(1) && int32(2) && inst_.attrs.op0 != AluOp::power) t_.desc.flags |= native::kFlagGpsimdInt;
    }
    decide_overlap();
    return std::make_pair(t_, out_);
  }

 private:
  std::vector<int> tensor_slots() const {
    std::vector<int> s;
    for (int i = 0; i < inst_.spec().num_slots; ++i)
      if (inst_.operands[i].is_tensor()) s.push_back(i);
    return s;
  }

  /**
   * Decides the routines' overlap test now when every tensor operand is on chip: the allocator
   * fixed their addresses, and only the distances between them matter. HBM tensors arrive at run
   * time (two parameters may even be one array), so their instructions keep the run-time test.
   */
  void decide_overlap() {
    // SBUF and PSUM are separate memories: placed far apart here, they never overlap.
    constexpr intptr_t kPsumOrigin = intptr_t(1) << 48;
    intptr_t base[native::kSlots] = {};
    for (int s = 0; s < native::kSlots; ++s) {
      if (t_.desc.slot_kind[s] != native::kSlotTensor) continue;
      const NativeOperand& n = out_.operands[s];
      const Storage& st = k_.storage(n.storage);
      if (!st.on_chip()) return;  // (only HBM views carry runtime offsets natively)
      base[s] = (st.buffer == Buffer::psum ? kPsumOrigin : 0) +
                st.address->partition * partition_pitch(k_.config(), st.buffer) + st.address->byte_offset +
                n.byte_offset;
    }
    t_.desc.static_hazards = native::overlap_hazards(&t_.desc, 0, base);
    t_.desc.flags |= native::kFlagStaticOverlap;
  }

  /** Records where a tensor operand lives; false for views only the interpreter can address. */
  bool static_operand(int s) {
    const AccessPattern& ap = view(s);
    NativeOperand& n = out_.operands[s];
    n.kind = NativeOperand::Kind::tensor;
    n.storage = ap.storage;
    n.byte_offset = first_element_offset(k_, ap);
    if (const Indirection* ind = k_.indirection(inst_.operands[s])) {
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
    if (!place(tile, full, per_partition, {}, t_.desc.count)) return false;
    t_.entry = entry;
    return true;
  }

  /**
   * Expresses `full` slots (and `extra` pseudo-operands: dims with strides in their own units) over
   * one iteration space written to `count`, each slot's strides into view[slot].stride (extra
   * ones too), free axes right-aligned so the innermost is dim 4. With `tile`, dim 0 is the
   * partition dim and `per_partition` slots are [P, 1] views broadcast along the free dims;
   * without, dim 0 stays 1 and the free axes cover the operands' elements in flattened order.
   */
  bool place(bool tile, const std::vector<int>& full, const std::vector<int>& per_partition,
             const std::vector<std::pair<int, ByteDims>>& extra, int64_t* count) {
    std::vector<std::pair<int, ByteDims>> ops;
    int64_t partitions = 1;
    std::array<int64_t, kSlots> pstride{};
    for (int s : full) {
      if (!inst_.operands[s].is_tensor()) continue;
      auto dims = byte_dims(k_, view(s));
      if (!dims) return false;
      if (tile) {
        if (dims->empty()) return false;
        partitions = (*dims)[0].count;
        pstride[s] = (*dims)[0].stride;
        dims->erase(dims->begin());
      }
      ops.emplace_back(s, without_unit_dims(*dims));
    }
    for (const auto& [s, dims] : extra) ops.emplace_back(s, without_unit_dims(dims));
    if (ops.empty()) return false;
    std::vector<int> broadcast;  // per-partition slots: stride 0 along every free axis
    for (int s : per_partition) {
      if (!inst_.operands[s].is_tensor()) continue;
      auto dims = byte_dims(k_, view(s));
      if (!dims || dims->empty()) return false;
      pstride[s] = (*dims)[0].stride;
      broadcast.push_back(s);
    }
    // Copies between arbitrary views have no partition dim: their axes may use dim 0 too.
    const int max_axes = kIterDims - (tile ? 1 : 0);
    auto common = [&](const std::vector<std::pair<int, ByteDims>>& with) -> std::optional<std::vector<Axis>> {
      auto axes = refine(with);
      if (!axes) return std::nullopt;
      std::vector<int> used = broadcast;
      for (const auto& [s, dims] : with) used.push_back(s);
      std::vector<Axis> merged = merge(std::move(*axes), used);
      if (int(merged.size()) > max_axes) return std::nullopt;
      return merged;
    };
    auto axes = common(ops);
    // Dims that do not nest ([4, 6] against [6, 4] with different memory orders), or whose common
    // refinement has too many axes: iterate the first operand's own dims and address the others
    // through their flattened index.
    std::vector<std::pair<int, ByteDims>> irregular;
    if (!axes) {
      irregular.assign(ops.begin() + 1, ops.end());
      ops.resize(1);
      axes = common(ops);
      if (!axes) return false;
    }
    std::vector<int> used = broadcast;
    for (const auto& [s, dims] : ops) used.push_back(s);
    const std::vector<Axis>& merged = *axes;
    native::OpDesc& d = t_.desc;
    for (int i = 0; i < kIterDims; ++i) count[i] = 1;
    if (tile) count[0] = partitions;
    for (int s : used) d.view[s].stride[0] = pstride[s];
    const int first = kIterDims - int(merged.size());
    std::vector<int64_t> counts;
    for (size_t i = 0; i < merged.size(); ++i) {
      count[first + i] = merged[i].count;
      counts.push_back(merged[i].count);
      for (int s : used) d.view[s].stride[first + i] = merged[i].stride[s];
    }
    for (const auto& [s, dims] : irregular) {
      d.view[s].stride[0] = pstride[s];
      if (!make_irregular(s, dims, first, counts)) return false;
    }
    return true;
  }

  /**
   * Addresses `slot` through its own free dims `own`: its flattened index is row-major over the
   * iteration dims [first, first + counts.size()) with those counts (other dims do not move it).
   */
  bool make_irregular(int slot, const ByteDims& own, int first, const std::vector<int64_t>& counts) {
    if (int(own.size()) > kIterDims) return false;
    native::IrregularView& v = t_.desc.irr[slot];
    for (int k = 0; k < kIterDims; ++k) v.count[k] = 1, v.stride[k] = 0;
    const int off = kIterDims - int(own.size());
    for (size_t i = 0; i < own.size(); ++i) {
      v.count[off + i] = own[i].count;
      v.stride[off + i] = own[i].stride;
    }
    int64_t m = 1;
    for (int i = int(counts.size()) - 1; i >= 0; --i) {
      v.flat[first + i] = m;
      m *= counts[i];
    }
    for (int k = first; k < kIterDims; ++k) t_.desc.view[slot].stride[k] = 0;
    t_.desc.irregular |= 1 << slot;
    return true;
  }

  /**
   * Whether a routine that reads `src` ahead of writing `dst` (within a partition) computes what
   * the reference's interleaved order does: true when the two views touch different bytes, or
   * when dst's element i is src's element i of the same partition (an in-place update).
   */
  bool in_order_safe(int dst, int src) const {
    const AccessPattern &x = view(dst), &y = view(src);
    if (!inst_.operands[src].is_tensor() || x.storage != y.storage) return true;
    const Storage& st = k_.storage(x.storage);
    auto dx = byte_dims(k_, x), dy = byte_dims(k_, y);
    if (dx && dy && !dx->empty() && !dy->empty() && dtype_size(x.dtype) == dtype_size(y.dtype) &&
        first_element_offset(k_, x) == first_element_offset(k_, y)) {
      const ByteDims a = without_unit_dims(ByteDims(dx->begin() + 1, dx->end())),
                     b = without_unit_dims(ByteDims(dy->begin() + 1, dy->end()));
      bool same = a.size() == b.size();
      for (size_t i = 0; same && i < a.size(); ++i) same = a[i].count == b[i].count && a[i].stride == b[i].stride;
      if (same) return true;
    }
    if (!st.on_chip()) return false;
    const TileGeometry gx = tile_geometry(st, x), gy = tile_geometry(st, y);
    const bool rows = gx.first_partition < gy.first_partition + gy.partitions &&
                      gy.first_partition < gx.first_partition + gx.partitions;
    const ByteRange bx = partition_byte_range(st, x), by = partition_byte_range(st, y);
    return !(rows && bx.begin < by.end && by.begin < bx.end);
  }

  /** Routines that keep per-partition state in stack arrays handle at most kMaxPartitions. */
  bool stack_partitions() const { return t_.desc.count[0] <= native::kMaxPartitions; }

  int64_t free_elements(int slot) const {
    const AccessPattern& ap = view(slot);
    return ap.rank ? ap.inner_elements() : 1;
  }

  /**
   * iota / affine_select: dst (and on_true) with the affine pattern as a pseudo-operand whose
   * "strides" are the pattern steps, so dst's free dims and the pattern's dims pair in flattened
   * order however each is shaped.
   */
  bool affine() {
    const RareAttributes& at = k_.rare(inst_);
    constexpr int kPattern = kSlots - 1;  // a slot neither opcode uses
    if (inst_.spec().num_slots > kPattern || at.pattern.empty()) return false;
    ByteDims pattern;
    for (const Dim& dim : at.pattern) pattern.push_back({dim.count, dim.stride});
    const std::vector<int> full = inst_.opcode == Opcode::affine_select ? std::vector<int>{0, 1} : std::vector<int>{0};
    if (!place(true, full, {}, {{kPattern, pattern}}, t_.desc.count)) return false;
    native::OpDesc& d = t_.desc;
    d.offset = at.offset;
    d.view[kPattern].stride[0] = at.channel_multiplier;
    t_.entry = inst_.opcode == Opcode::iota ? "nk_iota" : "nk_affine_select";
    return true;
  }

  /** Data slots over `count`, fixed-size output slots (their own shape) over `out_count`. */
  bool with_output_space(const char* entry, std::vector<int> data, std::vector<int> out) {
    native::OpDesc& d = t_.desc;
    if (!place(true, data, {}, {}, d.count)) return false;
    const int64_t partitions = d.count[0];
    if (!place(true, out, {}, {}, d.out_count) || d.out_count[0] != partitions) return false;
    d.out_count[0] = 1;
    for (int s : out) d.out_slots |= 1 << s;
    t_.entry = entry;
    return stack_partitions();
  }

  /** tensor_partition_reduce: data [P, free...] folds into dst [1, free...], free dims paired in
   * flattened order; dst's partition stride is 0. */
  bool partition_reduce() {
    auto data = byte_dims(k_, view(1)), dst = byte_dims(k_, view(0));
    if (!data || !dst || data->empty() || dst->empty()) return false;
    const ByteDims dst_free = without_unit_dims(ByteDims(dst->begin() + 1, dst->end()));
    const ByteDims data_free = without_unit_dims(ByteDims(data->begin() + 1, data->end()));
    auto axes = refine({{0, dst_free}, {1, data_free}});
    const bool irregular_dst = !axes;
    if (irregular_dst) axes = refine({{1, data_free}});
    if (!axes) return false;
    std::vector<Axis> merged = merge(std::move(*axes), irregular_dst ? std::vector<int>{1} : std::vector<int>{0, 1});
    if (int(merged.size()) > kIterDims - 1) return false;
    native::OpDesc& d = t_.desc;
    d.count[0] = (*data)[0].count;
    d.view[1].stride[0] = (*data)[0].stride;
    const int first = kIterDims - int(merged.size());
    std::vector<int64_t> counts;
    for (size_t i = 0; i < merged.size(); ++i) {
      d.count[first + i] = merged[i].count;
      counts.push_back(merged[i].count);
      for (int s : {0, 1}) d.view[s].stride[first + i] = merged[i].stride[s];
    }
    if (irregular_dst && !make_irregular(0, dst_free, first, counts)) return false;
    t_.entry = "nk_partition_reduce";
    return true;
  }

  /** tensor_reduce: [P, kept axes..., reduced axes...] with dst strides 0 on the reduced axes. */
  bool reduce() {
    const AccessPattern& data = view(1);
    auto data_dims = byte_dims(k_, data);
    auto dst_dims = byte_dims(k_, view(0));
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
    const bool irregular_dst = !kept_axes;  // dst's dims do not nest with the kept ones
    if (irregular_dst) kept_axes = refine({{1, without_unit_dims(kept)}});
    auto reduced_axes = refine({{1, without_unit_dims(reduced)}});
    if (!kept_axes || !reduced_axes) return false;
    std::vector<Axis> k_axes = merge(*kept_axes, irregular_dst ? std::vector<int>{1} : std::vector<int>{0, 1}),
                      r_axes = merge(*reduced_axes, {1});
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
    if (irregular_dst) {
      std::vector<int64_t> counts;
      for (const Axis& a : k_axes) counts.push_back(a.count);
      if (!make_irregular(0, without_unit_dims(dst_free), 1, counts)) return false;
    }
    t_.entry = "nk_tensor_reduce";
    return stack_partitions();
  }

  /**
   * A tile view addressed as (partition index at iteration dim 0, flattened free index at dim 1):
   * its partition stride, and its free dims merged into one strided dim when they merge, else as
   * an irregular operand. Returns (partitions, free elements), or nullopt.
   */
  std::optional<std::pair<int64_t, int64_t>> tile_2d(int s) {
    auto dims = byte_dims(k_, view(s));
    if (!dims || dims->empty()) return std::nullopt;
    const ByteDims free = without_unit_dims(ByteDims(dims->begin() + 1, dims->end()));
    int64_t n = 1;
    for (const ByteDim& b : free) n *= b.count;
    native::ViewDesc& v = t_.desc.view[s];
    v.stride[0] = (*dims)[0].stride;
    if (free.size() == 1) v.stride[1] = free[0].stride;
    else if (free.size() > 1 && !make_irregular(s, free, 1, {n})) return std::nullopt;
    return std::make_pair((*dims)[0].count, n);
  }

  bool matmul() {
    auto dst = tile_2d(0), st = tile_2d(1), mv = tile_2d(2);
    if (!dst || !st || !mv) return false;
    native::OpDesc& d = t_.desc;
    d.mm_k = st->first;
    d.mm_m = st->second;
    d.mm_n = mv->second;
    t_.entry = "nk_matmul";
    return true;
  }

  /** nc_transpose: data[p, f] at (p, f), dst[f, p] at (f, p): dst's partition index is data's
   * free index. */
  bool transpose() {
    auto dst = tile_2d(0), data = tile_2d(1);
    if (!dst || !data) return false;
    native::OpDesc& d = t_.desc;
    d.count[0] = data->first;
    d.count[1] = data->second;
    t_.entry = "nk_transpose";
    return true;
  }

  /** The view of tensor operand `slot`. */
  const AccessPattern& view(int slot) const { return views_[slot]; }

  const Kernel& k_;
  const Instruction& inst_;
  std::array<AccessPattern, kMaxSlots> views_;  // of the tensor operands
  NativeTemplate t_;
  NativeInstruction out_;
};

}  // namespace

std::optional<std::pair<NativeTemplate, NativeInstruction>> make_template(const Kernel& kernel, uint32_t index) {
  return TemplateBuilder(kernel, index).build();
}

}  // namespace nikki::jit
