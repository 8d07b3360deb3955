// Float64 reference of the cumulative sum along the last axis of [R, C], forward or reversed.
#pragma once

#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief out[r, i] = sum_{j <= i} x[r, j] (reverse: sum_{j >= i} x[r, j]). */
inline RefTensor cumsum(const RefTensor& x, bool reverse) {
  const int64_t R = x.shape[0], C = x.shape[1];
  RefTensor out(x.shape);
  for (int64_t r = 0; r < R; ++r) {
    double acc = 0;
    for (int64_t k = 0; k < C; ++k) {
      const int64_t c = reverse ? C - 1 - k : k;
      acc += x[r * C + c];
      out[r * C + c] = acc;
    }
  }
  return out;
}

}  // namespace nikki::kernels::reference
