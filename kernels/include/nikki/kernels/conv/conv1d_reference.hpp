// Float64 reference of the general conv1d (torch.nn.functional.conv1d) with a fused activation.
#pragma once

#include <cmath>

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

/** @brief act(conv1d(x, weight, bias)): x [B, C_in, L], weight [C_out, C_in / groups, K], bias [C_out]. */
inline RefTensor conv1d(const RefTensor& x, const RefTensor& w, const RefTensor& bias, const Conv1dGeometry& g,
                        ConvActivation act) {
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
        if (act == ConvActivation::silu) s = s / (1 + std::exp(-s));
        if (act == ConvActivation::gelu) s = 0.5 * s * std::erfc(-s / std::sqrt(2.0));
        out[(b * Cout + co) * Lout + t] = s;
      }
  return out;
}

}  // namespace nikki::kernels::reference
