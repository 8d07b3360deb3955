// A small fixed-capacity shape: tensor ranks in NKI are tiny, so shapes never allocate.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "nikki/error.hpp"

namespace nikki {

/** @brief Largest rank a tensor or view may have (NKI views have at most 5 dims). */
inline constexpr int kMaxRank = 8;

// --- checked size arithmetic ------------------------------------------------------------------
// Extents, strides and offsets come from users and can be anything an int64 holds: products and
// sums of them are computed with these helpers so that a size that does not fit is reported,
// never wrapped around into a small (or negative) one.

/** @brief a * b, or nullopt when the product does not fit in int64_t. */
inline constexpr std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

/** @brief a + b, or nullopt when the sum does not fit in int64_t. */
inline constexpr std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

/** @brief The limit that checked_mul / checked_add enforce, as error messages state it. */
inline std::string size_limit_text() {
  return fmt::format("element counts, byte sizes and offsets must fit in a signed 64-bit integer (at most {})",
                     std::numeric_limits<int64_t>::max());
}

/**
 * @brief A byte count for messages: in whole TiB, GiB or MiB when exact ("96 GiB"), otherwise
 * from 1 GiB up as an approximate GiB figure with the exact count ("32.00 GiB (34359742464 B)"),
 * below it in whole KiB when exact ("48 KiB"), else in bytes ("212984 B").
 */
inline std::string bytes_text(int64_t bytes) {
  constexpr int64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;
  if (bytes <= 0) return fmt::format("{} B", bytes);
  for (auto [unit, name] : {std::pair{kTiB, "TiB"}, std::pair{kGiB, "GiB"}})
    if (bytes % unit == 0) return fmt::format("{} {}", bytes / unit, name);
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB ({} B)", double(bytes) / double(kGiB), bytes);
  for (auto [unit, name] : {std::pair{kMiB, "MiB"}, std::pair{kKiB, "KiB"}})
    if (bytes % unit == 0) return fmt::format("{} {}", bytes / unit, name);
  return fmt::format("{} B", bytes);
}

/** @brief Product of `values` with checked_mul; nullopt on overflow (1 when empty). */
inline constexpr std::optional<int64_t> checked_product(std::span<const int64_t> values) {
  int64_t n = 1;
  for (int64_t v : values) {
    std::optional<int64_t> next = checked_mul(n, v);
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

/** @brief a * b for sizes already known to be representable; an InternalError if they are not. */
inline int64_t size_mul(int64_t a, int64_t b, std::source_location where = std::source_location::current()) {
  std::optional<int64_t> product = checked_mul(a, b);
  internal_check(product.has_value(), "size arithmetic overflowed int64 on a size that was not validated", where);
  return *product;
}

/** @brief The extents of a tensor, outermost first. */
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}
  explicit Shape(std::span<const int64_t> dims) {
    internal_check(dims.size() <= kMaxRank, "shape rank above kMaxRank");
    rank_ = static_cast<uint8_t>(dims.size());
    std::copy(dims.begin(), dims.end(), dims_.begin());
  }

  int rank() const { return rank_; }
  bool empty() const { return rank_ == 0; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  int64_t back() const { return dims_[rank_ - 1]; }

  void push_back(int64_t d) {
    internal_check(rank_ < kMaxRank, "shape rank above kMaxRank");
    dims_[rank_++] = d;
  }
  void insert(int at, int64_t d) {
    internal_check(rank_ < kMaxRank, "shape rank above kMaxRank");
    for (int i = rank_; i > at; --i) dims_[i] = dims_[i - 1];
    dims_[at] = d;
    ++rank_;
  }
  void erase(int at) {
    for (int i = at; i + 1 < rank_; ++i) dims_[i] = dims_[i + 1];
    --rank_;
  }

  /** @brief Product of all extents (1 for a rank-0 shape); nullopt when it overflows int64. */
  std::optional<int64_t> checked_num_elements() const { return checked_product({begin(), end()}); }
  /**
   * @brief Bytes of a tensor of this shape with `element_bytes`-byte elements; nullopt when the
   * element count or the byte size overflows int64.
   */
  std::optional<int64_t> checked_bytes(int64_t element_bytes) const {
    std::optional<int64_t> n = checked_num_elements();
    return n ? checked_mul(*n, element_bytes) : std::nullopt;
  }
  /**
   * @brief Product of all extents (1 for a rank-0 shape). Shapes of tensors are validated when
   * the tensor is created, so an overflow here is a nikki bug (InternalError).
   */
  int64_t num_elements() const {
    std::optional<int64_t> n = checked_num_elements();
    internal_check(n.has_value(), "element count of an unvalidated shape overflowed int64");
    return *n;
  }
  /** @brief Product of the extents after the first: elements per partition of an on-chip tensor. */
  int64_t inner_elements() const {
    std::optional<int64_t> n = rank_ ? checked_product({begin() + 1, end()}) : std::optional<int64_t>(1);
    internal_check(n.has_value(), "element count of an unvalidated shape overflowed int64");
    return *n;
  }

  /** @brief "[128, 512]". */
  std::string str() const { return fmt::format("[{}]", fmt::join(begin(), end(), ", ")); }

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  std::array<int64_t, kMaxRank> dims_{};
  uint8_t rank_ = 0;
};

}  // namespace nikki
