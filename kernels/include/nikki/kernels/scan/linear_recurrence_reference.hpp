// Float64 reference of the first-order linear recurrence h_t = a_t * h_{t-1} + b_t over the last
// axis of [B, C, L], and of its backward.
#pragma once

#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief h[b, c, t] = a[b, c, t] * h[b, c, t - 1] + b[b, c, t], h[b, c, -1] = h0[b, c]. */
inline RefTensor linear_recurrence(const RefTensor& a, const RefTensor& b, const RefTensor& h0) {
  const int64_t L = a.shape[2], rows = a.size() / L;
  RefTensor h(a.shape);
  for (int64_t r = 0; r < rows; ++r) {
    double state = h0[r];
    for (int64_t t = 0; t < L; ++t) {
      state = a[r * L + t] * state + b[r * L + t];
      h[r * L + t] = state;
    }
  }
  return h;
}

/**
 * @brief (grad_a, grad_b, grad_h0) of linear_recurrence for grad_h, from the forward's a, h0 and
 * h: g_t = grad_h_t + a_{t+1} g_{t+1} (g_L = 0), grad_b = g, grad_a_t = g_t h_{t-1}
 * (h_{-1} = h0), grad_h0 = a_0 g_0.
 */
inline std::vector<RefTensor> linear_recurrence_bwd(const RefTensor& a, const RefTensor& h0, const RefTensor& h,
                                                    const RefTensor& grad_h) {
  const int64_t L = a.shape[2], rows = a.size() / L;
  RefTensor grad_a(a.shape), grad_b(a.shape), grad_h0(h0.shape);
  for (int64_t r = 0; r < rows; ++r) {
    double g = 0;
    for (int64_t t = L - 1; t >= 0; --t) {
      g = grad_h[r * L + t] + (t + 1 < L ? a[r * L + t + 1] * g : 0.0);
      grad_b[r * L + t] = g;
      grad_a[r * L + t] = g * (t > 0 ? h[r * L + t - 1] : h0[r]);
    }
    grad_h0[r] = a[r * L] * g;
  }
  return {grad_a, grad_b, grad_h0};
}

}  // namespace nikki::kernels::reference
