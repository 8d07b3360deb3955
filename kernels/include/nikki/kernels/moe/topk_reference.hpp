// Float64 reference of top-k over the rows of [T, N].
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief The k largest values of each row of x [T, N], in descending order, and their column
 *  indices; equal values in order of increasing index (a stable descending sort, as
 *  torch.sort(descending=True, stable=True) gives). Returns {values [T, k], indices [T, k]}. */
inline std::vector<RefTensor> topk(const RefTensor& x, int64_t k) {
  const int64_t T = x.shape[0], N = x.shape[1];
  RefTensor values(Shape{T, k}), indices(Shape{T, k});
  std::vector<int64_t> order(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[t * N + a] > x[t * N + b]; });
    for (int64_t j = 0; j < k; ++j) {
      values[t * k + j] = x[t * N + order[size_t(j)]];
      indices[t * k + j] = double(order[size_t(j)]);
    }
  }
  return {values, indices};
}

}  // namespace nikki::kernels::reference
