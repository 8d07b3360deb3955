// Float64 reference of Mamba's selective scan (the semantics of mamba_ssm's selective_scan_fn with
// time-varying B and C shared by all channels, and the last state returned).
#pragma once

#include <cmath>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief The options of a selective scan call. */
struct SelectiveScanOptions {
  bool delta_softplus = false;  // delta = softplus(delta + delta_bias)
  bool gate = false;            // y *= silu(z)
};

/**
 * @brief (y [B, D, L], last_state [B, D, N]) of the selective scan, per (b, d, n):
 * dt_t = delta_t + delta_bias[d] (softplus'd when asked), h_t = exp(dt_t A[d, n]) h_{t-1} +
 * dt_t Bm[b, n, t] u_t from h_{-1} = h0[b, d, n]; y_t = sum_n Cm[b, n, t] h_t + Dskip[d] u_t, times
 * silu(z_t) when gated.
 */
inline std::vector<RefTensor> selective_scan(const RefTensor& u, const RefTensor& delta, const RefTensor& A,
                                             const RefTensor& Bm, const RefTensor& Cm, const RefTensor& Dskip,
                                             const RefTensor& z, const RefTensor& delta_bias, const RefTensor& h0,
                                             const SelectiveScanOptions& o) {
  const int64_t B = u.shape[0], D = u.shape[1], L = u.shape[2], N = A.shape[1];
  RefTensor y(u.shape), last({B, D, N});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t row = (b * D + d) * L;
      std::vector<double> h(static_cast<size_t>(N), 0.0);
      for (int64_t n = 0; n < N; ++n) h[size_t(n)] = h0[(b * D + d) * N + n];
      for (int64_t t = 0; t < L; ++t) {
        double dt = delta[row + t] + delta_bias[d];
        if (o.delta_softplus) dt = dt > 20 ? dt : std::log1p(std::exp(dt));
        double acc = Dskip[d] * u[row + t];
        for (int64_t n = 0; n < N; ++n) {
          const int64_t bn = (b * N + n) * L + t;
          h[size_t(n)] = std::exp(dt * A[d * N + n]) * h[size_t(n)] + dt * Bm[bn] * u[row + t];
          acc += Cm[bn] * h[size_t(n)];
        }
        if (o.gate) acc *= z[row + t] / (1 + std::exp(-z[row + t]));
        y[row + t] = acc;
      }
      for (int64_t n = 0; n < N; ++n) last[(b * D + d) * N + n] = h[size_t(n)];
    }
  return {y, last};
}

}  // namespace nikki::kernels::reference
