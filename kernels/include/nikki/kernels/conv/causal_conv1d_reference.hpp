// Float64 reference of the depthwise causal conv1d (the Mamba / Hyena short convolution) and its
// backward.
#pragma once

#include <cmath>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

namespace causal_conv1d_detail {

/** x[b, c, t] for t >= 0, else the state's token t (its last column is t = -1; zero before it). */
inline double token(const RefTensor& x, const RefTensor& state, int64_t b, int64_t c, int64_t t) {
  const int64_t C = x.shape[1], L = x.shape[2], S = state.shape[2];
  if (t >= 0) return x[(b * C + c) * L + t];
  return t >= -S ? state[(b * C + c) * S + S + t] : 0.0;
}

inline double sigmoid(double z) { return 1 / (1 + std::exp(-z)); }

/** The pre-activation z[b, c, t] = bias[c] + sum_k w[c, k] x[b, c, t - K + 1 + k]. */
inline RefTensor preactivation(const RefTensor& x, const RefTensor& w, const RefTensor& bias, const RefTensor& state) {
  const int64_t B = x.shape[0], C = x.shape[1], L = x.shape[2], K = w.shape[1];
  RefTensor z(x.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < L; ++t) {
        double s = bias[c];
        for (int64_t k = 0; k < K; ++k) s += w[c * K + k] * token(x, state, b, c, t - K + 1 + k);
        z[(b * C + c) * L + t] = s;
      }
  return z;
}

}  // namespace causal_conv1d_detail

/** @brief out = act(depthwise causal conv1d of x with w, + bias), act SiLU or the identity. */
inline RefTensor causal_conv1d(const RefTensor& x, const RefTensor& w, const RefTensor& bias, const RefTensor& state,
                               bool silu) {
  RefTensor z = causal_conv1d_detail::preactivation(x, w, bias, state);
  if (silu)
    for (double& v : z.data) v = v * causal_conv1d_detail::sigmoid(v);
  return z;
}

/** @brief (grad_x, grad_weight, grad_bias, grad_initial_state) of causal_conv1d for grad_out. */
inline std::vector<RefTensor> causal_conv1d_bwd(const RefTensor& x, const RefTensor& w, const RefTensor& bias,
                                                const RefTensor& state, const RefTensor& grad_out, bool silu) {
  using causal_conv1d_detail::token;
  const int64_t B = x.shape[0], C = x.shape[1], L = x.shape[2], K = w.shape[1], S = state.shape[2];
  RefTensor g = grad_out;
  if (silu) {
    const RefTensor z = causal_conv1d_detail::preactivation(x, w, bias, state);
    for (int64_t i = 0; i < g.size(); ++i) {
      const double s = causal_conv1d_detail::sigmoid(z[i]);
      g[i] *= s * (1 + z[i] * (1 - s));
    }
  }
  RefTensor gx(x.shape), gw(w.shape), gb(bias.shape), gs(state.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < L; ++t) {
        const double gt = g[(b * C + c) * L + t];
        gb[c] += gt;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t src = t - K + 1 + k;
          gw[c * K + k] += gt * token(x, state, b, c, src);
          if (src >= 0) gx[(b * C + c) * L + src] += w[c * K + k] * gt;
          else if (src >= -S) gs[(b * C + c) * S + S + src] += w[c * K + k] * gt;
        }
      }
  return {gx, gw, gb, gs};
}

}  // namespace nikki::kernels::reference
