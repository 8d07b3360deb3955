// Tensor: the C++ counterpart of NKI's NkiTensor, a view of a storage inside a kernel being built.
#pragma once

#include <initializer_list>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "nikki/access_pattern.hpp"
#include "nikki/builder.hpp"

namespace nikki {

using Loc = std::source_location;

struct ApOptions;

/**
 * @brief A view of a tensor in the kernel being built (NkiTensor).
 *
 * Views are free: every method returns a new Tensor over the same storage with a different
 * access pattern. Mistakes (out-of-bounds slices, impossible reshapes) throw KernelError naming
 * the caller's line.
 */
class Tensor {
 public:
  Tensor() = default;
  Tensor(KernelBuilder* builder, AccessPattern ap) : builder_(builder), ap_(std::move(ap)) {}

  bool valid() const { return builder_ != nullptr; }
  KernelBuilder& builder() const { return *builder_; }
  const AccessPattern& access() const { return ap_; }
  const Storage& storage() const { return builder_->storage(ap_.storage); }

  Shape shape() const { return ap_.shape(); }
  DType dtype() const { return ap_.dtype; }
  Buffer buffer() const { return storage().buffer; }
  int ndim() const { return ap_.rank; }
  int64_t size() const { return ap_.num_elements(); }
  const std::string& name() const { return storage().name; }
  int64_t offset() const { return ap_.offset; }
  std::vector<Dim> pattern() const { return {ap_.dims.begin(), ap_.dims.begin() + ap_.rank}; }
  std::vector<int64_t> strides() const {
    std::vector<int64_t> s;
    for (int d = 0; d < ap_.rank; ++d) s.push_back(ap_.dims[d].stride);
    return s;
  }
  bool is_contiguous() const { return nikki::is_contiguous(ap_); }

  /**
   * @brief NumPy-style indexing: t(0, Slice{0, 64}). Integer subscripts drop their dim, except
   * that SBUF/PSUM views keep the partition dim (size 1) and never drop below 2 dims (NKI rule).
   */
  Tensor operator()(Index i0, Loc loc = Loc::current()) const { return index({i0}, loc); }
  Tensor operator()(Index i0, Index i1, Loc loc = Loc::current()) const { return index({i0, i1}, loc); }
  Tensor operator()(Index i0, Index i1, Index i2, Loc loc = Loc::current()) const {
    return index({i0, i1, i2}, loc);
  }
  Tensor operator()(Index i0, Index i1, Index i2, Index i3, Loc loc = Loc::current()) const {
    return index({i0, i1, i2, i3}, loc);
  }
  Tensor operator()(Index i0, Index i1, Index i2, Index i3, Index i4, Loc loc = Loc::current()) const {
    return index({i0, i1, i2, i3, i4}, loc);
  }
  Tensor index(std::initializer_list<Index> subscripts, Loc loc = Loc::current()) const {
    return index(std::span<const Index>(subscripts.begin(), subscripts.size()), loc);
  }
  Tensor index(std::span<const Index> subscripts, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::subscript(ap_, subscripts, is_on_chip(buffer())); });
  }

  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1, Loc loc = Loc::current()) const {
    return guarded(loc, [&] {
      int d = view::normalize_dim(ap_, dim, "slice");
      return view::strict_slice(ap_, d, Slice{start, end, step});
    });
  }
  Tensor select(int64_t dim, int64_t index, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::select(ap_, dim, index); });
  }
  Tensor permute(std::vector<int64_t> dims, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::permute(ap_, dims); });
  }
  Tensor broadcast(int64_t dim, int64_t size, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::broadcast(ap_, dim, size); });
  }
  Tensor expand_dim(int64_t dim, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::expand_dim(ap_, dim); });
  }
  Tensor squeeze_dim(int64_t dim, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::squeeze_dim(ap_, dim); });
  }
  Tensor reshape(const Shape& shape, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::reshape(ap_, shape); });
  }
  Tensor reshape_dim(int64_t dim, const Shape& shape, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::reshape_dim(ap_, dim, shape); });
  }
  Tensor flatten_dims(int64_t start, int64_t end, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::flatten_dims(ap_, start, end); });
  }
  /** @brief Bit reinterpretation as another dtype (NKI view(dtype)). */
  Tensor view(DType dtype, Loc loc = Loc::current()) const {
    return guarded(loc, [&] { return view::reinterpret(ap_, dtype); });
  }

  /**
   * @brief A raw access pattern over this tensor's storage ([[stride, count], ...] plus offset),
   * ignoring the current view, as NKI's .ap() does. Runtime offsets are scaled by the product of
   * the storage dims after indirect_dim.
   */
  Tensor ap(std::vector<Dim> pattern, Loc loc = Loc::current()) const;
  Tensor ap(std::vector<Dim> pattern, const ApOptions& opts, Loc loc = Loc::current()) const;

 private:
  template <class F>
  Tensor guarded(const Loc& loc, F&& make) const {
    if (!builder_) throw KernelError("operation on an empty tensor handle", SourceLocation::from(loc));
    try {
      return Tensor(builder_, make());
    } catch (const ViewError& e) {
      throw KernelError(fmt::format("tensor '{}': {}", name(), e.what), builder_->source(builder_->location(loc)),
                        {}, e.limit, e.hint);
    }
  }

  KernelBuilder* builder_ = nullptr;
  AccessPattern ap_;
};

/** @brief Options of the raw access pattern escape hatch (NKI .ap()). */
struct ApOptions {
  std::optional<int64_t> offset;
  std::optional<Tensor> scalar_offset_tensor;  // 1x1 tensor holding the runtime offset
  RegisterId scalar_offset_register = -1;
  std::optional<Tensor> vector_offset;  // per-partition index tensor
  int indirect_dim = 0;
  std::optional<DType> dtype;
};

inline Tensor Tensor::ap(std::vector<Dim> pattern, Loc loc) const { return ap(std::move(pattern), ApOptions{}, loc); }

inline Tensor Tensor::ap(std::vector<Dim> pattern, const ApOptions& opts, Loc loc) const {
  return guarded(loc, [&] {
    const Storage& st = storage();
    if (pattern.empty() || static_cast<int>(pattern.size()) > kMaxRank)
      throw ViewError{fmt::format("ap(): pattern needs 1 to {} [stride, count] pairs, got {}", kMaxRank,
                                  pattern.size()), {}, {}};
    AccessPattern out;
    out.storage = ap_.storage;
    out.dtype = opts.dtype.value_or(st.dtype);
    out.rank = static_cast<uint8_t>(pattern.size());
    out.offset = opts.offset.value_or(0);
    for (size_t d = 0; d < pattern.size(); ++d) {
      if (pattern[d].count < 1)
        throw ViewError{fmt::format("ap(): count {} of pattern entry {} must be positive", pattern[d].count, d),
                        {}, {}};
      out.dims[d] = pattern[d];
    }
    view::check_arithmetic(out, "ap()");
    const bool scalar = opts.scalar_offset_tensor.has_value() || opts.scalar_offset_register >= 0;
    if (scalar || opts.vector_offset) {
      if (opts.indirect_dim < 0 || opts.indirect_dim >= st.shape.rank())
        throw ViewError{fmt::format("ap(): indirect_dim {} is out of range for a tensor of rank {}",
                                    opts.indirect_dim, st.shape.rank()), {}, {}};
      int64_t multiplier = 1;
      for (int d = opts.indirect_dim + 1; d < st.shape.rank(); ++d) multiplier *= st.shape[d];
      auto ind = std::make_shared<Indirection>();
      if (opts.scalar_offset_tensor) {
        const Tensor& t = *opts.scalar_offset_tensor;
        if (t.size() != 1)
          throw ViewError{fmt::format("ap(): scalar_offset must be a 1x1 tensor, got shape {}", t.shape().str()),
                          {}, "pass a [1, 1] SBUF tensor or a register"};
        ind->scalar_tensor = t.access();
      }
      ind->scalar_register = opts.scalar_offset_register;
      ind->scalar_multiplier = multiplier;
      if (opts.vector_offset) {
        if (opts.indirect_dim != 0)
          throw ViewError{"ap(): vector_offset supports only indirect_dim=0", "indirect_dim must be 0",
                          "move the gathered dim first"};
        ind->vector_offset = opts.vector_offset->access();
        ind->indirect_dim = 0;
        ind->vector_multiplier = multiplier;
      }
      out.indirection = std::move(ind);
    }
    return out;
  });
}

}  // namespace nikki
