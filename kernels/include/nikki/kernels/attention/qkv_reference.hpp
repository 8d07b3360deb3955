// Float64 reference of the fused q/k/v projection (optional residual add, norm, projection with
// bias, split into heads, rotary embedding of q and k) and of its backward.
#pragma once

#include <cstdint>
#include <vector>

#include "nikki/kernels/attention/rope_reference.hpp"
#include "nikki/kernels/matmul/matmul_reference.hpp"
#include "nikki/kernels/norm/norm_reference.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief The norm in front of the projection. */
enum class QkvNorm : int { none = 0, rms = 1, layer = 2 };

/** @brief The options of the q/k/v projection (the kernels' parameters). */
struct QkvConfig {
  int64_t q_heads = 0, kv_heads = 0;
  QkvNorm norm = QkvNorm::rms;
  double eps = 1e-6;
  bool rope = true, interleaved = false;
};

/** @brief A tensor's data as a 2-D [rows, cols] tensor (the leading dims flattened). */
inline RefTensor as_rows(const RefTensor& t, int64_t cols) {
  RefTensor r(Shape{t.size() / cols, cols});
  r.data = t.data;
  return r;
}

/** @brief (x_norm, mean, rstd) of the rows x [M, H]: none gives x, mean 0 and rstd 1; rmsnorm
 *  gives mean 0. */
inline std::vector<RefTensor> qkv_norm(const RefTensor& x, const RefTensor& gamma, const RefTensor& beta,
                                       const QkvConfig& c) {
  const int64_t M = x.shape[0];
  RefTensor zeros(Shape{M}), ones(Shape{M});
  for (double& v : ones.data) v = 1;
  if (c.norm == QkvNorm::none) return {x, zeros, ones};
  if (c.norm == QkvNorm::layer) return layernorm(x, gamma, beta, c.eps);
  std::vector<RefTensor> n = rmsnorm(x, gamma, c.eps);
  return {n[0], zeros, n[1]};
}

/** @brief x_norm of the rows x [M, H] from the saved mean and rstd. */
inline RefTensor qkv_normalized(const RefTensor& x, const RefTensor& gamma, const RefTensor& beta, const RefTensor& mean,
                                const RefTensor& rstd, const QkvConfig& c) {
  if (c.norm == QkvNorm::none) return x;
  const int64_t M = x.shape[0], H = x.shape[1];
  RefTensor out(x.shape);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < H; ++h)
      out[m * H + h] = c.norm == QkvNorm::layer ? (x[m * H + h] - mean[m]) * rstd[m] * gamma[h] + beta[h]
                                                : x[m * H + h] * rstd[m] * gamma[h];
  return out;
}

/** @brief Heads h0 .. h0 + n - 1 of the projection's rows [B * S, heads * D], as [B, n, S, D]. */
inline RefTensor heads_of(const RefTensor& rows, int64_t B, int64_t S, int64_t h0, int64_t n, int64_t D) {
  const int64_t I = rows.shape[1];
  RefTensor out(Shape{B, n, S, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) out[((b * n + h) * S + s) * D + d] = rows[(b * S + s) * I + (h0 + h) * D + d];
  return out;
}

/** @brief heads_of's inverse: writes t [B, n, S, D] into heads h0 .. h0 + n - 1 of rows. */
inline void into_heads(RefTensor& rows, const RefTensor& t, int64_t h0) {
  const int64_t B = t.shape[0], n = t.shape[1], S = t.shape[2], D = t.shape[3], I = rows.shape[1];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) rows[(b * S + s) * I + (h0 + h) * D + d] = t[((b * n + h) * S + s) * D + d];
}

/**
 * @brief (q, k, v[, sum], mean, rstd) of the projection: sum = x + residual (when given),
 * x_norm = norm(sum), rows = x_norm @ w + bias, split into q [B, Hq, S, D], k and v [B, Hkv, S, D],
 * q and k rotated by rope(cos, sin) when c.rope.
 */
inline std::vector<RefTensor> qkv(const RefTensor& x, const RefTensor* residual, const RefTensor& w, const RefTensor& bias,
                                  const RefTensor& gamma, const RefTensor& beta, const RefTensor& cos, const RefTensor& sin,
                                  const QkvConfig& c) {
  const int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], I = w.shape[1];
  const int64_t D = I / (c.q_heads + 2 * c.kv_heads);
  RefTensor sum = x;
  if (residual)
    for (int64_t i = 0; i < sum.size(); ++i) sum[i] += (*residual)[i];
  const std::vector<RefTensor> norm = qkv_norm(as_rows(sum, H), gamma, beta, c);
  RefTensor rows = matmul(norm[0], w);
  for (int64_t m = 0; m < rows.shape[0]; ++m)
    for (int64_t i = 0; i < I; ++i) rows[m * I + i] += bias[i];
  RefTensor q = heads_of(rows, B, S, 0, c.q_heads, D), k = heads_of(rows, B, S, c.q_heads, c.kv_heads, D);
  RefTensor v = heads_of(rows, B, S, c.q_heads + c.kv_heads, c.kv_heads, D);
  if (c.rope) {
    q = rope(q, cos, sin, c.interleaved, false);
    k = rope(k, cos, sin, c.interleaved, false);
  }
  std::vector<RefTensor> out{q, k, v};
  if (residual) out.push_back(sum);
  out.push_back(norm[1]);
  out.push_back(norm[2]);
  return out;
}

/**
 * @brief The gradients of qkv: (grad_x[, grad_residual], grad_w, grad_bias, grad_gamma,
 * grad_beta) from x (the sum, with a residual), the saved mean and rstd, and grad_q, grad_k,
 * grad_v (and grad_sum, the gradient reaching the sum directly). Gradients of parameters the
 * norm does not use are zeros.
 */
inline std::vector<RefTensor> qkv_backward(const RefTensor& x, const RefTensor& w, const RefTensor& gamma,
                                           const RefTensor& beta, const RefTensor& cos, const RefTensor& sin,
                                           const RefTensor& mean, const RefTensor& rstd, const RefTensor& grad_q,
                                           const RefTensor& grad_k, const RefTensor& grad_v, const RefTensor* grad_sum,
                                           const QkvConfig& c) {
  const int64_t H = x.shape[2], I = w.shape[1], M = x.size() / H;
  RefTensor rows(Shape{M, I});
  into_heads(rows, c.rope ? rope(grad_q, cos, sin, c.interleaved, true) : grad_q, 0);
  into_heads(rows, c.rope ? rope(grad_k, cos, sin, c.interleaved, true) : grad_k, c.q_heads);
  into_heads(rows, grad_v, c.q_heads + c.kv_heads);
  const RefTensor x2 = as_rows(x, H);
  const RefTensor xn = qkv_normalized(x2, gamma, beta, mean, rstd, c);
  RefTensor grad_w(w.shape), grad_bias(Shape{I}), grad_xn(Shape{M, H});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const double g = rows[m * I + i];
      grad_bias[i] += g;
      for (int64_t h = 0; h < H; ++h) {
        grad_w[h * I + i] += xn[m * H + h] * g;
        grad_xn[m * H + h] += g * w[h * I + i];
      }
    }
  RefTensor grad_x = grad_xn, grad_gamma(gamma.shape), grad_beta(beta.shape);
  if (c.norm == QkvNorm::rms) {
    std::vector<RefTensor> g = rmsnorm_backward(x2, gamma, rstd, grad_xn);
    grad_x = g[0];
    grad_gamma = g[1];
  } else if (c.norm == QkvNorm::layer) {
    std::vector<RefTensor> g = layernorm_backward(x2, gamma, mean, rstd, grad_xn);
    grad_x = g[0];
    grad_gamma = g[1];
    grad_beta = g[2];
  }
  grad_x.shape = x.shape;
  if (grad_sum)
    for (int64_t i = 0; i < grad_x.size(); ++i) grad_x[i] += (*grad_sum)[i];
  std::vector<RefTensor> out{grad_x};
  if (grad_sum) out.push_back(grad_x);
  for (const RefTensor& t : {grad_w, grad_bias, grad_gamma, grad_beta}) out.push_back(t);
  return out;
}

}  // namespace nikki::kernels::reference
