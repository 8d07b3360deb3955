// A small fixed-capacity shape: tensor ranks in NKI are tiny, so shapes never allocate.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include <fmt/format.h>

#include "nikki/error.hpp"

namespace nikki {

/** @brief Largest rank a tensor or view may have (NKI views have at most 5 dims). */
inline constexpr int kMaxRank = 8;

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

  /** @brief Product of all extents (1 for a rank-0 shape). */
  int64_t num_elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  /** @brief Product of the extents after the first: elements per partition of an on-chip tensor. */
  int64_t inner_elements() const {
    int64_t n = 1;
    for (int i = 1; i < rank_; ++i) n *= dims_[i];
    return n;
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
