// Float64 references of the fp8 quantization kernels: rmsnorm_quant (static and dynamic scaling)
// and fp8_matmul.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "nikki/kernels/norm/norm_reference.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief The largest finite value of a floating dtype (fp8 included), from its encoding. */
inline double largest_finite(DType dtype) {
  double best = 0;
  const int64_t patterns = int64_t(1) << (8 * std::min<int64_t>(dtype_size(dtype), 2));
  for (int64_t bits = 0; bits < patterns; ++bits) {
    uint8_t bytes[2] = {uint8_t(bits & 0xff), uint8_t(bits >> 8)};
    const double v = numerics::load_float(dtype, bytes);
    if (std::isfinite(v)) best = std::max(best, v);
  }
  return best;
}

/** @brief The smallest dequantization scale a row gets: the smallest normal fp32, so that the
 *  scale and its reciprocal are finite normal numbers even for an all-zero row. */
inline double smallest_quant_scale() { return double(std::numeric_limits<float>::min()); }

/**
 * @brief (q, scales) of rmsnorm_quant: y = rmsnorm(x) * gamma in float64; per row t the dequant
 * scale s_t is `*static_scale` or max(max|y_t| / qmax, smallest_quant_scale()); q = y / s_t
 * clamped to [-qmax, qmax] and rounded to `q_dtype` (through fp32, as nikki's conversion).
 */
inline std::vector<RefTensor> rmsnorm_quant(const RefTensor& x, const RefTensor& gamma, std::optional<double> static_scale,
                                            double eps, DType q_dtype, double qmax) {
  const RefTensor y = rmsnorm(x, gamma, eps)[0];
  const int64_t R = x.shape[0], H = x.shape[1];
  RefTensor q(x.shape), scales(Shape{R});
  for (int64_t r = 0; r < R; ++r) {
    double s = 0;
    if (static_scale) {
      s = *static_scale;
    } else {
      double amax = 0;
      for (int64_t c = 0; c < H; ++c) amax = std::max(amax, std::fabs(y[r * H + c]));
      s = std::max(amax / qmax, smallest_quant_scale());
    }
    scales[r] = s;
    for (int64_t c = 0; c < H; ++c) q[r * H + c] = round_to(q_dtype, std::clamp(y[r * H + c] / s, -qmax, qmax));
  }
  return {q, scales};
}

/** @brief (a @ b) * sa[:, None] * sb[None, :] (+ bias), in float64. */
inline RefTensor fp8_matmul(const RefTensor& a, const RefTensor& sa, const RefTensor& b, const RefTensor& sb,
                            const RefTensor* bias) {
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  RefTensor out(Shape{M, N});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += a[m * K + k] * b[k * N + n];
      out[m * N + n] = acc * sa[m] * sb[n] + (bias ? (*bias)[n] : 0.0);
    }
  return out;
}

}  // namespace nikki::kernels::reference
