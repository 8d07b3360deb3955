// Float64 reference of the general conv1d (torch.nn.functional.conv1d) with a fused activation, and
// its backward.
#pragma once

#include <cmath>
#include <numbers>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief The activation applied to a conv1d's output. */
enum class ConvActivation { none = 0, silu = 1, gelu = 2 };

/** @brief How a conv1d slides: torch's stride, padding (zeros on both ends), dilation, groups. */
struct Conv1dGeometry {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;

  /** @brief Output length for L inputs and K taps (at least 1 for a valid call). */
  int64_t out_length(int64_t L, int64_t K) const { return (L + 2 * padding - dilation * (K - 1) - 1) / stride + 1; }
};

/** @brief conv1d(x, weight) + bias before the activation. */
inline RefTensor conv1d_preactivation(const RefTensor& x, const RefTensor& w, const RefTensor& bias,
                                      const Conv1dGeometry& g) {
  const int64_t B = x.shape[0], Cin = x.shape[1], L = x.shape[2];
  const int64_t Cout = w.shape[0], cig = w.shape[1], K = w.shape[2], cog = Cout / g.groups;
  const int64_t Lout = g.out_length(L, K);
  RefTensor out(Shape{B, Cout, Lout});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t co = 0; co < Cout; ++co)
      for (int64_t t = 0; t < Lout; ++t) {
        double s = bias[co];
        const int64_t ci0 = (co / cog) * cig;
        for (int64_t ci = 0; ci < cig; ++ci)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t pos = t * g.stride + k * g.dilation - g.padding;
            if (pos >= 0 && pos < L) s += w[(co * cig + ci) * K + k] * x[(b * Cin + ci0 + ci) * L + pos];
          }
        out[(b * Cout + co) * Lout + t] = s;
      }
  return out;
}

/** @brief act(z) for the pre-activation z. */
inline double conv_activate(double z, ConvActivation act) {
  if (act == ConvActivation::silu) return z / (1 + std::exp(-z));
  if (act == ConvActivation::gelu) return 0.5 * z * std::erfc(-z / std::sqrt(2.0));
  return z;
}

/** @brief act'(z): SiLU's sigma(z) (1 + z (1 - sigma(z))), GELU's Phi(z) + z phi(z). */
inline double conv_activation_slope(double z, ConvActivation act) {
  if (act == ConvActivation::silu) {
    const double s = 1 / (1 + std::exp(-z));
    return s * (1 + z * (1 - s));
  }
  if (act == ConvActivation::gelu) return 0.5 * std::erfc(-z / std::sqrt(2.0)) + z * std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
  return 1;
}

/** @brief act(conv1d(x, weight, bias)): x [B, C_in, L], weight [C_out, C_in / groups, K], bias [C_out]. */
inline RefTensor conv1d(const RefTensor& x, const RefTensor& w, const RefTensor& bias, const Conv1dGeometry& g,
                        ConvActivation act) {
  RefTensor out = conv1d_preactivation(x, w, bias, g);
  for (double& v : out.data) v = conv_activate(v, act);
  return out;
}

/**
 * @brief (grad_x, grad_weight, grad_bias) of act(conv1d(x, weight, bias)) for grad_out
 * [B, C_out, L_out]: g = grad_out * act'(z), then the transposed convolution of g for grad_x and
 * the correlation of g with x for grad_weight.
 */
inline std::vector<RefTensor> conv1d_bwd(const RefTensor& x, const RefTensor& w, const RefTensor& bias,
                                         const RefTensor& grad_out, const Conv1dGeometry& geo, ConvActivation act) {
  const int64_t B = x.shape[0], Cin = x.shape[1], L = x.shape[2];
  const int64_t Cout = w.shape[0], cig = w.shape[1], K = w.shape[2], cog = Cout / geo.groups;
  const int64_t Lout = geo.out_length(L, K);
  RefTensor g = grad_out;
  if (act != ConvActivation::none) {
    const RefTensor z = conv1d_preactivation(x, w, bias, geo);
    for (int64_t i = 0; i < g.size(); ++i) g[i] *= conv_activation_slope(z[i], act);
  }
  RefTensor gx(x.shape), gw(w.shape), gb(bias.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t co = 0; co < Cout; ++co)
      for (int64_t t = 0; t < Lout; ++t) {
        const double gt = g[(b * Cout + co) * Lout + t];
        gb[co] += gt;
        const int64_t ci0 = (co / cog) * cig;
        for (int64_t ci = 0; ci < cig; ++ci)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t pos = t * geo.stride + k * geo.dilation - geo.padding;
            if (pos < 0 || pos >= L) continue;
            gw[(co * cig + ci) * K + k] += gt * x[(b * Cin + ci0 + ci) * L + pos];
            gx[(b * Cin + ci0 + ci) * L + pos] += gt * w[(co * cig + ci) * K + k];
          }
      }
  return {gx, gw, gb};
}

}  // namespace nikki::kernels::reference
