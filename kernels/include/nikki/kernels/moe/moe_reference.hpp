// Float64 references of the mixture-of-experts kernels: the nonzero entries of each column of a
// routing mask, and the expert MLPs combined with the routing weights (prefill and decode), with
// the prefill's gradients. Each is the textbook loop over experts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "nikki/kernels/mlp/gated_mlp_reference.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief {indices [C, T], counts [C]} of x [T, C]: for each column c, the rows t with
 *  x[t, c] != 0 in increasing order, then -1; counts[c] how many there are (NaN is nonzero). */
inline std::vector<RefTensor> find_nonzero_indices(const RefTensor& x) {
  const int64_t T = x.shape[0], C = x.shape[1];
  RefTensor indices(Shape{C, T}), counts(Shape{C});
  for (int64_t c = 0; c < C; ++c) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t)
      if (x[t * C + c] != 0) indices[c * T + n++] = double(t);
    for (int64_t j = n; j < T; ++j) indices[c * T + j] = -1;
    counts[c] = double(n);
  }
  return {indices, counts};
}

/**
 * @brief The routing weight of each (token, expert): a[t * E + e] = the sum of weights[t, j] over
 * the slots j with expert_ids[t, j] == e (ids outside [0, E) route nowhere).
 */
inline std::vector<double> routing_affinities(const RefTensor& ids, const RefTensor& weights, int64_t E) {
  const int64_t T = ids.shape[0], k = ids.shape[1];
  std::vector<double> a(size_t(T * E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const double e = ids[t * k + j];
      if (e >= 0 && e < double(E)) a[size_t(t * E + int64_t(e))] += weights[t * k + j];
    }
  return a;
}

/** @brief Whether token t is routed to expert e (some slot names it). */
inline std::vector<bool> routing_mask(const RefTensor& ids, int64_t E) {
  const int64_t T = ids.shape[0], k = ids.shape[1];
  std::vector<bool> m(size_t(T * E), false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const double e = ids[t * k + j];
      if (e >= 0 && e < double(E)) m[size_t(t * E + int64_t(e))] = true;
    }
  return m;
}

/** @brief Expert e's gated MLP of token t: (act(x_t @ w_gate[e]) * (x_t @ w_up[e])) @ w_down[e],
 *  with the intermediate h_t returned in `h` (size I). Weights: w_gate, w_up [E, H, I], w_down
 *  [E, I, H]; `scale_gu` and `scale_down` (when not null) scale the columns of w_gate / w_up
 *  ([E, I] each) and of w_down ([E, H]). */
struct ExpertWeights {
  const RefTensor& w_gate;
  const RefTensor& w_up;
  const RefTensor& w_down;
  const RefTensor* gate_scale = nullptr;  // [E, I]
  const RefTensor* up_scale = nullptr;    // [E, I]
  const RefTensor* down_scale = nullptr;  // [E, H]
};

inline std::vector<double> expert_mlp(const ExpertWeights& w, const RefTensor& x, int64_t t, int64_t e,
                                      GateActivation act, std::vector<double>* h_out = nullptr) {
  const int64_t H = x.shape[1], I = w.w_gate.shape[2];
  std::vector<double> h(static_cast<size_t>(I)), y(static_cast<size_t>(H), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t c = 0; c < H; ++c) {
      g += x[t * H + c] * w.w_gate[(e * H + c) * I + i];
      u += x[t * H + c] * w.w_up[(e * H + c) * I + i];
    }
    if (w.gate_scale) g *= (*w.gate_scale)[e * I + i];
    if (w.up_scale) u *= (*w.up_scale)[e * I + i];
    h[size_t(i)] = gate_activation(act, g) * u;
  }
  for (int64_t c = 0; c < H; ++c) {
    double o = 0;
    for (int64_t i = 0; i < I; ++i) o += h[size_t(i)] * w.w_down[(e * I + i) * H + c];
    if (w.down_scale) o *= (*w.down_scale)[e * H + c];
    y[size_t(c)] = o;
  }
  if (h_out) *h_out = std::move(h);
  return y;
}

/**
 * @brief out [T, H] = sum over the slots j of token t of weights[t, j] * expert_{ids[t, j]}(x_t)
 * (slots whose id is outside [0, E) contribute nothing; an expert named twice counts twice).
 */
inline RefTensor moe(const RefTensor& x, const RefTensor& ids, const RefTensor& weights, const ExpertWeights& w,
                     GateActivation act) {
  const int64_t T = x.shape[0], H = x.shape[1], E = w.w_gate.shape[0];
  const std::vector<double> a = routing_affinities(ids, weights, E);
  const std::vector<bool> m = routing_mask(ids, E);
  RefTensor out(Shape{T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      if (!m[size_t(t * E + e)]) continue;
      const std::vector<double> y = expert_mlp(w, x, t, e, act);
      for (int64_t c = 0; c < H; ++c) out[t * H + c] += a[size_t(t * E + e)] * y[size_t(c)];
    }
  return out;
}

/**
 * @brief {grad_x [T, H], grad_weights [T, k], grad_w_gate, grad_w_up [E, H, I], grad_w_down
 * [E, I, H]} of moe for the gradient g [T, H] of out.
 */
inline std::vector<RefTensor> moe_backward(const RefTensor& x, const RefTensor& ids, const RefTensor& weights,
                                           const RefTensor& w_gate, const RefTensor& w_up, const RefTensor& w_down,
                                           const RefTensor& g, GateActivation act) {
  const int64_t T = x.shape[0], H = x.shape[1], k = ids.shape[1], E = w_gate.shape[0], I = w_gate.shape[2];
  const std::vector<double> a = routing_affinities(ids, weights, E);
  const std::vector<bool> m = routing_mask(ids, E);
  RefTensor gx(Shape{T, H}), gw(Shape{T, k}), gg(w_gate.shape), gu(w_up.shape), gd(w_down.shape);
  const size_t nI = static_cast<size_t>(I);
  std::vector<double> gate(nI), up(nI), dh(nI);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      if (!m[size_t(t * E + e)]) continue;
      const double w = a[size_t(t * E + e)];
      for (int64_t i = 0; i < I; ++i) {
        double gv = 0, uv = 0;
        for (int64_t c = 0; c < H; ++c) {
          gv += x[t * H + c] * w_gate[(e * H + c) * I + i];
          uv += x[t * H + c] * w_up[(e * H + c) * I + i];
        }
        gate[size_t(i)] = gv;
        up[size_t(i)] = uv;
      }
      // dL/dy = w g_t; dL/dw = g_t . y = (g_t @ w_down^T) . h.
      double dot = 0;
      for (int64_t i = 0; i < I; ++i) {
        double s = 0;
        for (int64_t c = 0; c < H; ++c) s += g[t * H + c] * w_down[(e * I + i) * H + c];
        const double h = gate_activation(act, gate[size_t(i)]) * up[size_t(i)];
        dot += s * h;
        dh[size_t(i)] = w * s;
        for (int64_t c = 0; c < H; ++c) gd[(e * I + i) * H + c] += h * w * g[t * H + c];
      }
      for (int64_t j = 0; j < k; ++j)
        if (ids[t * k + j] == double(e)) gw[t * k + j] = dot;
      for (int64_t i = 0; i < I; ++i) {
        const double gv = gate[size_t(i)];
        const double du = dh[size_t(i)] * gate_activation(act, gv);
        const double dg = dh[size_t(i)] * up[size_t(i)] * gate_activation_slope(act, gv);
        for (int64_t c = 0; c < H; ++c) {
          gx[t * H + c] += dg * w_gate[(e * H + c) * I + i] + du * w_up[(e * H + c) * I + i];
          gg[(e * H + c) * I + i] += x[t * H + c] * dg;
          gu[(e * H + c) * I + i] += x[t * H + c] * du;
        }
      }
    }
  return {gx, gw, gg, gu, gd};
}

}  // namespace nikki::kernels::reference
