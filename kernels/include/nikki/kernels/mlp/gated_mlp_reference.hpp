// Float64 reference of the gated MLP (SwiGLU / GeGLU feed-forward block).
#pragma once

#include <cmath>
#include <numbers>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief The gate's activation function. */
enum class GateActivation { silu = 0, gelu = 1, gelu_tanh = 2 };

/** @brief act(g): silu (x * sigmoid(x)), gelu (erf form) or gelu's tanh approximation. */
inline double gate_activation(GateActivation act, double g) {
  switch (act) {
    case GateActivation::silu: return g / (1 + std::exp(-g));
    case GateActivation::gelu: return 0.5 * g * std::erfc(-g / std::numbers::sqrt2);
    case GateActivation::gelu_tanh: {
      const double c = std::sqrt(2 / std::numbers::pi);
      return 0.5 * g * (1 + std::tanh(c * (g + 0.044715 * g * g * g)));
    }
  }
  return 0;
}

/** @brief act'(g), the derivative of gate_activation. */
inline double gate_activation_slope(GateActivation act, double g) {
  switch (act) {
    case GateActivation::silu: {
      const double s = 1 / (1 + std::exp(-g));
      return s * (1 + g * (1 - s));
    }
    case GateActivation::gelu:
      return 0.5 * std::erfc(-g / std::numbers::sqrt2) + g * std::exp(-0.5 * g * g) / std::sqrt(2 * std::numbers::pi);
    case GateActivation::gelu_tanh: {
      const double c = std::sqrt(2 / std::numbers::pi), t = std::tanh(c * (g + 0.044715 * g * g * g));
      return 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * c * (1 + 3 * 0.044715 * g * g);
    }
  }
  return 0;
}

/** @brief Per-column dequantization scales of a gated MLP's fp8 weights: w_gate's and w_up's
 *  [I], w_down's [H]. */
struct ColumnScales {
  const RefTensor& gate;
  const RefTensor& up;
  const RefTensor& down;
};

/** @brief out = (act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down, for x [T, H],
 *  w_gate, w_up [H, I], w_down [I, H], b_gate, b_up [I], b_down [H]; with `scales`, each
 *  product's column is multiplied by its weight's scale before the bias is added. */
inline RefTensor gated_mlp(const RefTensor& x, const RefTensor& w_gate, const RefTensor& w_up, const RefTensor& w_down,
                           const RefTensor& b_gate, const RefTensor& b_up, const RefTensor& b_down,
                           GateActivation act, const ColumnScales* scales = nullptr) {
  const int64_t T = x.shape[0], H = x.shape[1], I = w_gate.shape[1];
  RefTensor out(Shape{T, H});
  std::vector<double> h(static_cast<size_t>(I));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0;
      for (int64_t k = 0; k < H; ++k) {
        g += x[t * H + k] * w_gate[k * I + i];
        u += x[t * H + k] * w_up[k * I + i];
      }
      if (scales) g *= scales->gate[i], u *= scales->up[i];
      h[size_t(i)] = gate_activation(act, g + b_gate[i]) * (u + b_up[i]);
    }
    for (int64_t c = 0; c < H; ++c) {
      double o = 0;
      for (int64_t i = 0; i < I; ++i) o += h[size_t(i)] * w_down[i * H + c];
      out[t * H + c] = (scales ? o * scales->down[c] : o) + b_down[c];
    }
  }
  return out;
}

}  // namespace nikki::kernels::reference
