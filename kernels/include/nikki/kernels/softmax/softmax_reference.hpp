// Float64 references of softmax and its backward over the last axis of [R, C].
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief out = softmax(x) along each row of x [R, C]. */
inline RefTensor softmax(const RefTensor& x) {
  const int64_t R = x.shape[0], C = x.shape[1];
  RefTensor out(x.shape);
  for (int64_t r = 0; r < R; ++r) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[r * C + c]);
    for (int64_t c = 0; c < C; ++c) sum += std::exp(x[r * C + c] - m);
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = std::exp(x[r * C + c] - m) / sum;
  }
  return out;
}

/** @brief grad_x = out * (grad_out - rowsum(grad_out * out)), the softmax backward. */
inline RefTensor softmax_backward(const RefTensor& out, const RefTensor& grad_out) {
  const int64_t R = out.shape[0], C = out.shape[1];
  RefTensor gx(out.shape);
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += grad_out[r * C + c] * out[r * C + c];
    for (int64_t c = 0; c < C; ++c) gx[r * C + c] = out[r * C + c] * (grad_out[r * C + c] - dot);
  }
  return gx;
}

}  // namespace nikki::kernels::reference
