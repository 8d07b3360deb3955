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

/**
 * @brief The gradients (u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0) of the selective scan for
 * grad_y [B, D, L] and grad_last_state [B, D, N]: the adjoint state lambda_t = gy'_t Cm_t +
 * exp(dt_{t+1} A) lambda_{t+1} (from grad_last_state) runs backwards in time over the forward's
 * states; grad_z is zeros without the gate.
 */
inline std::vector<RefTensor> selective_scan_bwd(const RefTensor& u, const RefTensor& delta, const RefTensor& A,
                                                 const RefTensor& Bm, const RefTensor& Cm, const RefTensor& Dskip,
                                                 const RefTensor& z, const RefTensor& delta_bias, const RefTensor& h0,
                                                 const RefTensor& grad_y, const RefTensor& grad_last,
                                                 const SelectiveScanOptions& o) {
  const int64_t B = u.shape[0], D = u.shape[1], L = u.shape[2], N = A.shape[1];
  RefTensor gu(u.shape), gdelta(u.shape), gA(A.shape), gB(Bm.shape), gC(Cm.shape), gD(Dskip.shape), gz(u.shape),
      gbias(delta_bias.shape), gh0(h0.shape);
  std::vector<double> dt(static_cast<size_t>(L)), slope(dt), gy(dt), h(static_cast<size_t>(N * (L + 1))),
      lambda(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t row = (b * D + d) * L;
      for (int64_t n = 0; n < N; ++n) h[size_t(n * (L + 1))] = h0[(b * D + d) * N + n];
      for (int64_t t = 0; t < L; ++t) {
        const double x = delta[row + t] + delta_bias[d];
        const bool soft = o.delta_softplus && x <= 20;
        dt[size_t(t)] = soft ? std::log1p(std::exp(x)) : x;
        slope[size_t(t)] = soft ? 1 / (1 + std::exp(-x)) : 1;
        double y = Dskip[d] * u[row + t];
        for (int64_t n = 0; n < N; ++n) {
          const int64_t bn = (b * N + n) * L + t, at = n * (L + 1) + t;
          h[size_t(at + 1)] = std::exp(dt[size_t(t)] * A[d * N + n]) * h[size_t(at)] + dt[size_t(t)] * Bm[bn] * u[row + t];
          y += Cm[bn] * h[size_t(at + 1)];
        }
        gy[size_t(t)] = grad_y[row + t];
        if (o.gate) {
          const double zt = z[row + t], sig = 1 / (1 + std::exp(-zt));
          gz[row + t] = grad_y[row + t] * y * sig * (1 + zt * (1 - sig));
          gy[size_t(t)] *= zt * sig;
        }
      }
      for (int64_t n = 0; n < N; ++n) lambda[size_t(n)] = grad_last[(b * D + d) * N + n];
      for (int64_t t = L - 1; t >= 0; --t) {
        const double g = gy[size_t(t)];
        double gdt = 0;
        gD[d] += g * u[row + t];
        gu[row + t] += g * Dskip[d];
        for (int64_t n = 0; n < N; ++n) {
          const int64_t bn = (b * N + n) * L + t, at = n * (L + 1) + t;
          const double a = std::exp(dt[size_t(t)] * A[d * N + n]);
          double& lam = lambda[size_t(n)];
          lam += g * Cm[bn];  // lambda_t: dLoss / dh_t
          gC[bn] += g * h[size_t(at + 1)];
          gB[bn] += lam * dt[size_t(t)] * u[row + t];
          gu[row + t] += lam * dt[size_t(t)] * Bm[bn];
          const double rho = lam * a * h[size_t(at)];  // dLoss / d(dt A) through the decay
          gdt += lam * Bm[bn] * u[row + t] + rho * A[d * N + n];
          gA[d * N + n] += rho * dt[size_t(t)];
          lam *= a;  // carried to step t - 1
        }
        gdelta[row + t] = gdt * slope[size_t(t)];
        gbias[d] += gdelta[row + t];
      }
      for (int64_t n = 0; n < N; ++n) gh0[(b * D + d) * N + n] = lambda[size_t(n)];
    }
  return {gu, gdelta, gA, gB, gC, gD, gz, gbias, gh0};
}

}  // namespace nikki::kernels::reference
