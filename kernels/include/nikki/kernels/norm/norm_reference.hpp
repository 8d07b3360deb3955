// Float64 references of layernorm and rmsnorm over the last axis of x [R, H], and their backwards.
#pragma once

#include <cmath>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief (out, mean, rstd) of layernorm: (x - mean) * rstd * gamma + beta per row. */
inline std::vector<RefTensor> layernorm(const RefTensor& x, const RefTensor& gamma, const RefTensor& beta, double eps) {
  const int64_t R = x.shape[0], H = x.shape[1];
  RefTensor out(x.shape), mean(Shape{R}), rstd(Shape{R});
  for (int64_t r = 0; r < R; ++r) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < H; ++c) m += x[r * H + c];
    m /= double(H);
    for (int64_t c = 0; c < H; ++c) var += (x[r * H + c] - m) * (x[r * H + c] - m);
    const double rs = 1.0 / std::sqrt(var / double(H) + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t c = 0; c < H; ++c) out[r * H + c] = (x[r * H + c] - m) * rs * gamma[c] + beta[c];
  }
  return {out, mean, rstd};
}

/** @brief (grad_x, grad_gamma, grad_beta) of layernorm from the saved mean and rstd. */
inline std::vector<RefTensor> layernorm_backward(const RefTensor& x, const RefTensor& gamma, const RefTensor& mean,
                                                 const RefTensor& rstd, const RefTensor& grad_out) {
  const int64_t R = x.shape[0], H = x.shape[1];
  RefTensor gx(x.shape), gg(Shape{H}), gb(Shape{H});
  for (int64_t r = 0; r < R; ++r) {
    double mg = 0, mgx = 0;
    for (int64_t c = 0; c < H; ++c) {
      const double xhat = (x[r * H + c] - mean[r]) * rstd[r], g = grad_out[r * H + c] * gamma[c];
      mg += g;
      mgx += g * xhat;
      gg[c] += grad_out[r * H + c] * xhat;
      gb[c] += grad_out[r * H + c];
    }
    mg /= double(H);
    mgx /= double(H);
    for (int64_t c = 0; c < H; ++c) {
      const double xhat = (x[r * H + c] - mean[r]) * rstd[r], g = grad_out[r * H + c] * gamma[c];
      gx[r * H + c] = rstd[r] * (g - mg - xhat * mgx);
    }
  }
  return {gx, gg, gb};
}

/** @brief (out, rstd) of rmsnorm: x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps). */
inline std::vector<RefTensor> rmsnorm(const RefTensor& x, const RefTensor& gamma, double eps) {
  const int64_t R = x.shape[0], H = x.shape[1];
  RefTensor out(x.shape), rstd(Shape{R});
  for (int64_t r = 0; r < R; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < H; ++c) ms += x[r * H + c] * x[r * H + c];
    rstd[r] = 1.0 / std::sqrt(ms / double(H) + eps);
    for (int64_t c = 0; c < H; ++c) out[r * H + c] = x[r * H + c] * rstd[r] * gamma[c];
  }
  return {out, rstd};
}

/** @brief (grad_x, grad_gamma) of rmsnorm from the saved rstd. */
inline std::vector<RefTensor> rmsnorm_backward(const RefTensor& x, const RefTensor& gamma, const RefTensor& rstd,
                                               const RefTensor& grad_out) {
  const int64_t R = x.shape[0], H = x.shape[1];
  RefTensor gx(x.shape), gg(Shape{H});
  for (int64_t r = 0; r < R; ++r) {
    double mgx = 0;
    for (int64_t c = 0; c < H; ++c) {
      const double xhat = x[r * H + c] * rstd[r];
      mgx += grad_out[r * H + c] * gamma[c] * xhat;
      gg[c] += grad_out[r * H + c] * xhat;
    }
    mgx /= double(H);
    for (int64_t c = 0; c < H; ++c) {
      const double xhat = x[r * H + c] * rstd[r];
      gx[r * H + c] = rstd[r] * (grad_out[r * H + c] * gamma[c] - xhat * mgx);
    }
  }
  return {gx, gg};
}

/** @brief (out, sum, rstd) of a residual add followed by rmsnorm: sum = x + residual. */
inline std::vector<RefTensor> add_rmsnorm(const RefTensor& x, const RefTensor& residual, const RefTensor& gamma,
                                          double eps) {
  RefTensor sum(x.shape);
  for (int64_t i = 0; i < x.size(); ++i) sum[i] = x[i] + residual[i];
  std::vector<RefTensor> norm = rmsnorm(sum, gamma, eps);
  return {norm[0], sum, norm[1]};
}

/** @brief (grad_x, grad_residual, grad_gamma) of add_rmsnorm: both addends get the gradient of
 *  the sum, through the norm and directly (grad_sum). */
inline std::vector<RefTensor> add_rmsnorm_backward(const RefTensor& sum, const RefTensor& gamma, const RefTensor& rstd,
                                                   const RefTensor& grad_out, const RefTensor& grad_sum) {
  std::vector<RefTensor> g = rmsnorm_backward(sum, gamma, rstd, grad_out);
  for (int64_t i = 0; i < g[0].size(); ++i) g[0][i] += grad_sum[i];
  return {g[0], g[0], g[1]};
}

}  // namespace nikki::kernels::reference
