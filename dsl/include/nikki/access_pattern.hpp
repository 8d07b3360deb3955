// Views of tensor storage: an offset plus [stride, count] pairs, as NKI's NkiTensor defines them.
//
// Element (i0, ..., ik) of a view lives at linear element index
//     offset + sum_d stride[d] * i_d            (+ runtime terms, see Indirection)
// of its storage, counted in elements of the view's dtype over the storage laid out row-major.
// For SBUF/PSUM storage the first storage dim is the partition dim, so linear index e sits on
// partition e / row_elems at free element e % row_elems.
//
// The transformations here are pure: they throw ViewError (no location); the tensor layer adds
// the user's source line and rethrows as KernelError.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "nikki/dtype.hpp"
#include "nikki/shape.hpp"

namespace nikki {

using StorageId = uint32_t;
using RegisterId = int32_t;
inline constexpr StorageId kNoStorage = ~0u;

/** @brief One dimension of an access pattern: step between elements and number of elements. */
struct Dim {
  int64_t stride = 0;
  int64_t count = 1;
  friend bool operator==(const Dim&, const Dim&) = default;
};

/** @brief A view-level mistake (bad slice, bad reshape...); converted to KernelError by callers. */
struct ViewError {
  std::string what;
  std::string limit;
  std::string hint;
};

struct Indirection;

/** @brief A Python-style slice (start:stop:step); missing bounds mean the whole dim. */
struct Slice {
  std::optional<int64_t> start;
  std::optional<int64_t> stop;
  int64_t step = 1;
};

/** @brief One subscript of a view: an integer or a Slice. */
class Index {
 public:
  Index(int64_t i) : value_(i) {}
  Index(int i) : value_(int64_t(i)) {}
  Index(Slice s) : value_(s) {}
  bool is_int() const { return std::holds_alternative<int64_t>(value_); }
  int64_t integer() const { return std::get<int64_t>(value_); }
  const Slice& slice() const { return std::get<Slice>(value_); }

 private:
  std::variant<int64_t, Slice> value_;
};

/** @brief A strided view of one storage (NKI access pattern). */
struct AccessPattern {
  StorageId storage = kNoStorage;
  DType dtype = DType::float32;
  uint8_t rank = 0;
  int64_t offset = 0;
  std::array<Dim, kMaxRank> dims{};
  /** Runtime offsets (register, 1x1 tensor or per-partition index tensor); null for static views. */
  std::shared_ptr<const Indirection> indirection;

  Shape shape() const {
    Shape s;
    for (int d = 0; d < rank; ++d) s.push_back(dims[d].count);
    return s;
  }
  /** @brief Elements the view enumerates; nullopt when the count overflows int64. */
  std::optional<int64_t> checked_num_elements() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) {
      std::optional<int64_t> next = checked_mul(n, dims[d].count);
      if (!next) return std::nullopt;
      n = *next;
    }
    return n;
  }
  /**
   * @brief Elements the view enumerates. Views are validated when they are made (see
   * view::check_arithmetic), so an overflow here is a nikki bug (InternalError).
   */
  int64_t num_elements() const {
    std::optional<int64_t> n = checked_num_elements();
    internal_check(n.has_value(), "element count of an unvalidated view overflowed int64");
    return *n;
  }
  /** @brief Elements per partition when dim 0 is the partition dim. */
  int64_t inner_elements() const {
    int64_t n = 1;
    for (int d = 1; d < rank; ++d) n = size_mul(n, dims[d].count);
    return n;
  }
  std::span<const Dim> pattern() const { return {dims.data(), rank}; }
  bool is_dynamic() const { return indirection != nullptr; }

  /** @brief Static part of the linear element index of the element at `index`. */
  int64_t linear_index(std::span<const int64_t> index) const {
    int64_t e = offset;
    for (int d = 0; d < rank; ++d) e += dims[d].stride * index[d];
    return e;
  }
};

/**
 * @brief Runtime parts of an access pattern (NKI .ap(scalar_offset=, vector_offset=)).
 *
 * scalar: start += value * scalar_multiplier, value read at run time from a register or a 1x1
 * tensor. vector: along view dim `indirect_dim`, coordinate i is replaced by index[i] (read from
 * the index tensor, one index per partition) times vector_multiplier.
 */
struct Indirection {
  std::optional<AccessPattern> scalar_tensor;
  RegisterId scalar_register = -1;
  int64_t scalar_multiplier = 0;
  std::optional<AccessPattern> vector_offset;
  int indirect_dim = 0;
  int64_t vector_multiplier = 0;

  bool has_scalar() const { return scalar_tensor.has_value() || scalar_register >= 0; }
  bool has_vector() const { return vector_offset.has_value(); }
};

/** @brief Inclusive range [first, last] of linear element indices a static view touches. */
struct LinearExtent {
  int64_t first;
  int64_t last;
};

/** @brief The static view's LinearExtent; nullopt when an offset on the way overflows int64. */
inline std::optional<LinearExtent> checked_linear_extent(const AccessPattern& ap) {
  LinearExtent e{ap.offset, ap.offset};
  for (int d = 0; d < ap.rank; ++d) {
    if (ap.dims[d].count < 1) continue;  // an empty dim touches nothing; num_elements() is 0
    std::optional<int64_t> span = checked_mul(ap.dims[d].stride, ap.dims[d].count - 1);
    if (!span) return std::nullopt;
    std::optional<int64_t> end = checked_add(*span < 0 ? e.first : e.last, *span);
    if (!end) return std::nullopt;
    (*span < 0 ? e.first : e.last) = *end;
  }
  return e;
}

/** @brief Row-major view of a whole storage. */
inline AccessPattern full_view(StorageId storage, DType dtype, const Shape& shape) {
  AccessPattern ap;
  ap.storage = storage;
  ap.dtype = dtype;
  ap.rank = static_cast<uint8_t>(shape.rank());
  int64_t stride = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    ap.dims[d] = {stride, shape[d]};
    stride *= shape[d];
  }
  return ap;
}

/** @brief True when the view covers a dense row-major block (strides compact, any offset). */
inline bool is_contiguous(const AccessPattern& ap) {
  int64_t expect = 1;
  for (int d = ap.rank - 1; d >= 0; --d) {
    if (ap.dims[d].count == 1) continue;
    if (ap.dims[d].stride != expect) return false;
    expect *= ap.dims[d].count;
  }
  return true;
}

namespace view {

/**
 * @brief Checks that a view made from user numbers (broadcast sizes, raw .ap() patterns, dtype
 * reinterpretation) has an element count and an element and byte extent that fit in int64, so
 * that everything computed from it later is exact. Throws ViewError naming the view.
 */
inline void check_arithmetic(const AccessPattern& ap, std::string_view what) {
  auto pattern = [&] {
    std::string p;
    for (int d = 0; d < ap.rank; ++d) p += fmt::format("{}[{}, {}]", d ? ", " : "", ap.dims[d].stride, ap.dims[d].count);
    return fmt::format("offset {} and [stride, count] pattern [{}]", ap.offset, p);
  };
  if (!ap.checked_num_elements())
    throw ViewError{fmt::format("{}: a view of shape {} has more elements than a 64-bit integer can count", what,
                                ap.shape().str()),
                    size_limit_text(), "use smaller extents"};
  const std::optional<LinearExtent> e = checked_linear_extent(ap);
  const int64_t size = dtype_size(ap.dtype);
  bool strides_fit = true;  // in bytes, even of size-1 dims, whose stride nothing else bounds
  for (int d = 0; d < ap.rank; ++d) strides_fit = strides_fit && checked_mul(ap.dims[d].stride, size);
  if (!e || !strides_fit || !checked_mul(e->first, size) || !checked_mul(e->last, size))
    throw ViewError{fmt::format("{}: the view with {} reaches offsets that overflow a 64-bit integer in bytes",
                                what, pattern()),
                    size_limit_text(), "check the offset, strides and counts of the access pattern"};
}

inline int normalize_dim(const AccessPattern& ap, int64_t dim, const char* what) {
  int64_t d = dim < 0 ? dim + ap.rank : dim;
  if (d < 0 || d >= ap.rank)
    throw ViewError{fmt::format("{}: dim {} is out of range for a view of rank {}", what, dim, ap.rank),
                    {}, fmt::format("use a dim in [{}, {})", -int(ap.rank), int(ap.rank))};
  return static_cast<int>(d);
}

/** @brief Elements [start, end) with `step` along `dim` (Python slice semantics, clamped). */
inline AccessPattern slice(AccessPattern ap, int64_t dim, std::optional<int64_t> start,
                           std::optional<int64_t> end, int64_t step = 1) {
  int d = normalize_dim(ap, dim, "slice");
  if (step <= 0)
    throw ViewError{fmt::format("slice step must be positive, got {}", step), {},
                    "reverse iteration is not expressible as an NKI access pattern"};
  const int64_t n = ap.dims[d].count;
  auto clamp = [n](int64_t v) { return v < 0 ? std::max<int64_t>(0, v + n) : std::min(v, n); };
  int64_t lo = start ? clamp(*start) : 0;
  int64_t hi = end ? clamp(*end) : n;
  // (hi - lo - 1) / step + 1 rather than a rounding-up division: hi - lo + step can overflow.
  int64_t count = hi > lo ? (hi - lo - 1) / step + 1 : 0;
  if (count == 0)
    throw ViewError{fmt::format("slice [{}:{}] of dim {} (size {}) selects no elements",
                                start ? fmt::to_string(*start) : "", end ? fmt::to_string(*end) : "",
                                d, n),
                    {}, "NKI tensors cannot be empty; check the slice bounds"};
  ap.offset += lo * ap.dims[d].stride;
  // With two or more elements, step < n, so stride * step stays inside the view's extent; a
  // single element needs no stride (and a huge step must not overflow computing one).
  ap.dims[d] = {count > 1 ? ap.dims[d].stride * step : ap.dims[d].stride, count};
  return ap;
}

/** @brief Bounds-checked [start, start + size) along `dim`, as nl.ds(start, size). */
inline AccessPattern ds(AccessPattern ap, int64_t dim, int64_t start, int64_t size) {
  int d = normalize_dim(ap, dim, "ds");
  const int64_t n = ap.dims[d].count;
  if (size <= 0 || start < 0 || size > n || start > n - size)  // start + size could overflow
    throw ViewError{fmt::format("out-of-bound access on dim {}: index range [{}, {}] exceeds dimension size {}",
                                d, start, checked_add(start, size - 1).value_or(std::numeric_limits<int64_t>::max()), n),
                    fmt::format("dim {} has {} elements", d, n), "shrink the slice or pad the tensor"};
  ap.offset += start * ap.dims[d].stride;
  ap.dims[d].count = size;
  return ap;
}

/** @brief Fixes `dim` at `index` and removes it. */
inline AccessPattern select(AccessPattern ap, int64_t dim, int64_t index) {
  int d = normalize_dim(ap, dim, "select");
  const int64_t n = ap.dims[d].count;
  int64_t i = index < 0 ? index + n : index;
  if (i < 0 || i >= n)
    throw ViewError{fmt::format("index {} is out of bounds for dim {} of size {}", index, d, n),
                    fmt::format("dim {} has {} elements", d, n), {}};
  ap.offset += i * ap.dims[d].stride;
  for (int k = d; k + 1 < ap.rank; ++k) ap.dims[k] = ap.dims[k + 1];
  ap.dims[--ap.rank] = Dim{};
  return ap;
}

/** @brief Reorders dims: result dim k is input dim order[k]. */
inline AccessPattern permute(AccessPattern ap, std::span<const int64_t> order) {
  if (static_cast<int>(order.size()) != ap.rank)
    throw ViewError{fmt::format("permute needs {} dims, got {}", int(ap.rank), order.size()), {},
                    "pass one entry per dim of the view"};
  AccessPattern out = ap;
  uint32_t seen = 0;
  for (int k = 0; k < ap.rank; ++k) {
    int d = normalize_dim(ap, order[k], "permute");
    if (seen & (1u << d))
      throw ViewError{fmt::format("permute lists dim {} twice", d), {}, "each dim must appear exactly once"};
    seen |= 1u << d;
    out.dims[k] = ap.dims[d];
  }
  return out;
}

/** @brief Repeats a size-1 dim `size` times (stride 0). */
inline AccessPattern broadcast(AccessPattern ap, int64_t dim, int64_t size) {
  int d = normalize_dim(ap, dim, "broadcast");
  if (ap.dims[d].count != 1)
    throw ViewError{fmt::format("broadcast needs a dim of size 1, dim {} has size {}", d, ap.dims[d].count),
                    {}, "broadcast only size-1 dims (use expand_dim to add one)"};
  if (size < 1) throw ViewError{fmt::format("broadcast size must be positive, got {}", size), {}, {}};
  ap.dims[d] = {0, size};
  check_arithmetic(ap, fmt::format("broadcast of dim {} to {}", d, size));
  return ap;
}

/** @brief Inserts a size-1 dim before position `dim` (dim == rank appends). */
inline AccessPattern expand_dim(AccessPattern ap, int64_t dim) {
  int64_t d = dim < 0 ? dim + ap.rank + 1 : dim;
  if (d < 0 || d > ap.rank)
    throw ViewError{fmt::format("expand_dim: dim {} out of range for rank {}", dim, int(ap.rank)), {}, {}};
  if (ap.rank >= kMaxRank)
    throw ViewError{"expand_dim: view would exceed the maximum rank",
                    fmt::format("at most {} dims", kMaxRank), {}};
  for (int k = ap.rank; k > d; --k) ap.dims[k] = ap.dims[k - 1];
  ap.dims[d] = {0, 1};
  ++ap.rank;
  return ap;
}

/** @brief Removes a size-1 dim. */
inline AccessPattern squeeze_dim(AccessPattern ap, int64_t dim) {
  int d = normalize_dim(ap, dim, "squeeze_dim");
  if (ap.dims[d].count != 1)
    throw ViewError{fmt::format("squeeze_dim: dim {} has size {}, not 1", d, ap.dims[d].count), {}, {}};
  return select(std::move(ap), d, 0);
}

/**
 * @brief Same elements in row-major order with a new shape, without copying.
 *
 * Works whenever each group of old dims that maps onto a group of new dims is itself contiguous
 * (the no-copy reshape rule numpy uses); otherwise the view would need a copy and is rejected.
 */
inline AccessPattern reshape(AccessPattern ap, const Shape& shape) {
  if (!shape.checked_num_elements())
    throw ViewError{fmt::format("cannot reshape to {}: it has more elements than a 64-bit integer can count",
                                shape.str()),
                    size_limit_text(), {}};
  if (shape.num_elements() != ap.num_elements())
    throw ViewError{fmt::format("cannot reshape a view of shape {} ({} elements) to {} ({} elements)",
                                ap.shape().str(), ap.num_elements(), shape.str(), shape.num_elements()),
                    "reshape must preserve the number of elements", {}};
  for (int i = 0; i < shape.rank(); ++i)
    if (shape[i] < 1) throw ViewError{fmt::format("reshape: extent {} must be positive", shape[i]), {}, {}};
  // Old dims without the size-1 ones (they carry no layout information).
  std::array<Dim, kMaxRank> old{};
  int n_old = 0;
  for (int d = 0; d < ap.rank; ++d)
    if (ap.dims[d].count != 1) old[n_old++] = ap.dims[d];

  AccessPattern out = ap;
  out.rank = static_cast<uint8_t>(shape.rank());
  int oi = 0, ni = 0;
  while (ni < shape.rank()) {
    if (shape[ni] == 1) {
      out.dims[ni++] = {0, 1};
      continue;
    }
    // Grow one group of old dims [oi, oj) and new dims [ni, nj) until their products agree.
    int oj = oi + 1, nj = ni + 1;
    int64_t po = old[oi].count, pn = shape[ni];
    while (po != pn) {
      if (po < pn) po *= old[oj++].count;
      else pn *= shape[nj++];
    }
    for (int k = oi; k + 1 < oj; ++k)
      if (old[k].stride != old[k + 1].stride * old[k + 1].count)
        throw ViewError{fmt::format("cannot reshape view of shape {} to {} without a copy",
                                    ap.shape().str(), shape.str()),
                        "reshape needs the merged dims to be contiguous",
                        "copy the data into a contiguous tile first (nisa.tensor_copy)"};
    int64_t stride = old[oj - 1].stride;
    for (int k = nj - 1; k >= ni; --k) {
      out.dims[k] = {stride, shape[k]};
      if (k > ni) stride *= shape[k];  // not past the group's outermost dim, whose end may not be addressable
    }
    oi = oj;
    ni = nj;
  }
  for (int k = out.rank; k < kMaxRank; ++k) out.dims[k] = Dim{};
  return out;
}

/** @brief Splits dim `dim` into `shape` (its extents must multiply to the dim's size). */
inline AccessPattern reshape_dim(AccessPattern ap, int64_t dim, const Shape& shape) {
  int d = normalize_dim(ap, dim, "reshape_dim");
  Shape full;
  for (int k = 0; k < ap.rank; ++k) {
    if (k == d) {
      for (int64_t e : shape) full.push_back(e);
    } else {
      full.push_back(ap.dims[k].count);
    }
  }
  if (shape.checked_num_elements() != ap.dims[d].count)
    throw ViewError{fmt::format("reshape_dim: {} does not have {} elements (dim {} has)",
                                shape.str(), ap.dims[d].count, d),
                    "reshape must preserve the number of elements", {}};
  return reshape(std::move(ap), full);
}

/** @brief Merges dims [start, end] into one. */
inline AccessPattern flatten_dims(AccessPattern ap, int64_t start, int64_t end) {
  int s = normalize_dim(ap, start, "flatten_dims"), e = normalize_dim(ap, end, "flatten_dims");
  if (s > e) throw ViewError{"flatten_dims: start dim is after end dim", {}, {}};
  Shape full;
  int64_t merged = 1;
  for (int k = 0; k < ap.rank; ++k) {
    if (k < s || k > e) full.push_back(ap.dims[k].count);
    else {
      merged *= ap.dims[k].count;
      if (k == e) full.push_back(merged);
    }
  }
  return reshape(std::move(ap), full);
}

/**
 * @brief Reinterprets the bytes as another dtype (NKI view(dtype)); the last dim is rescaled.
 * The last dim must be contiguous (stride 1) and its byte size divisible by the new element size.
 */
inline AccessPattern reinterpret(AccessPattern ap, DType dtype) {
  const int64_t from = dtype_size(ap.dtype), to = dtype_size(dtype);
  if (from == to) {
    ap.dtype = dtype;
    return ap;
  }
  if (ap.rank == 0 || ap.dims[ap.rank - 1].stride != 1)
    throw ViewError{"view(dtype) needs a contiguous last dim", "the last dim must have stride 1",
                    "copy into a contiguous tile first"};
  auto rescale = [&](int64_t v, const char* what) {
    const std::optional<int64_t> bytes = checked_mul(v, from);
    if (!bytes)
      throw ViewError{fmt::format("view({}): the {} ({} elements of {} bytes) overflows a 64-bit integer in bytes",
                                  dtype_name(dtype), what, v, from),
                      size_limit_text(), {}};
    if (*bytes % to != 0)
      throw ViewError{fmt::format("view({}): the {} ({} bytes) is not a multiple of {} bytes",
                                  dtype_name(dtype), what, *bytes, to),
                      {}, "pick a dtype whose size divides the row size"};
    return *bytes / to;
  };
  ap.offset = rescale(ap.offset, "offset");
  for (int d = 0; d + 1 < ap.rank; ++d) ap.dims[d].stride = rescale(ap.dims[d].stride, "stride");
  ap.dims[ap.rank - 1].count = rescale(ap.dims[ap.rank - 1].count, "last dim");
  ap.dtype = dtype;
  return ap;
}

/** @brief A slice that must lie within the dim: NKI rejects out-of-bound access instead of clipping. */
inline AccessPattern strict_slice(const AccessPattern& ap, int d, const Slice& s) {
  const int64_t n = ap.dims[d].count;
  auto norm = [n](int64_t v) { return v < 0 ? v + n : v; };
  int64_t lo = s.start ? norm(*s.start) : 0;
  int64_t hi = s.stop ? norm(*s.stop) : n;
  if (lo < 0 || hi > n || lo >= hi)
    throw ViewError{fmt::format("out-of-bound access on dim {}: index range [{}, {}] exceeds dimension size {}", d,
                                lo, hi - 1, n),
                    fmt::format("dim {} has {} elements", d, n), "shrink the slice or pad the tensor"};
  return slice(ap, d, lo, hi, s.step);
}

/**
 * @brief NumPy-style subscripts. Integer subscripts drop their dim, except that on-chip
 * (SBUF/PSUM) views keep the partition dim (size 1) and never drop below 2 dims (NKI's rule).
 */
inline AccessPattern subscript(const AccessPattern& base, std::span<const Index> subscripts, bool on_chip) {
  if (static_cast<int>(subscripts.size()) > base.rank)
    throw ViewError{fmt::format("too many indices ({}) for a tensor of rank {}", subscripts.size(), int(base.rank)),
                    {}, {}};
  AccessPattern ap = base;
  int dim = 0;
  std::vector<int> int_dims;  // dims to drop, as positions in `ap`
  for (const Index& ix : subscripts) {
    if (ix.is_int()) {
      const int64_t n = ap.dims[dim].count, i = ix.integer();
      if (i < -n || i >= n)
        throw ViewError{fmt::format("index {} is out of bounds for dim {} of size {}", i, dim, n),
                        fmt::format("dim {} has {} elements", dim, n), {}};
      ap = ds(ap, dim, i < 0 ? i + n : i, 1);
      int_dims.push_back(dim);
    } else {
      ap = strict_slice(ap, dim, ix.slice());
    }
    ++dim;
  }
  // Drop integer-indexed dims from the back so positions stay valid.
  int rank = ap.rank;
  for (auto it = int_dims.rbegin(); it != int_dims.rend(); ++it) {
    const int d = *it;
    if (on_chip && (d == 0 || rank <= 2)) continue;
    ap = select(ap, d, 0);
    --rank;
  }
  return ap;
}

}  // namespace view
}  // namespace nikki
