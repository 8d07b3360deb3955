// The Scalar engine's activation functions (NKI's activation table), as the executors compute
// them: each function is evaluated in double precision from its exact formula and rounded once to
// fp32. Hardware uses piece-wise polynomial approximations within each function's valid range;
// nikki gives the mathematically exact value there (docs/numerics.md).
#pragma once

#include <cmath>

#include "nikki/ops.hpp"

namespace nikki {

namespace activation_detail {
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }
inline constexpr double kSqrt2 = 1.41421356237309504880;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
inline constexpr double kGeluTanhCubic = 0.044715;
inline constexpr double kGeluSigmoidScale = 1.702;
}  // namespace activation_detail

/** @brief f(x) for activation function `f`, rounded to fp32. */
inline float activation_apply(ActFunc f, float xf) {
  using namespace activation_detail;
  const double x = xf;
  double y;
  switch (f) {
    case ActFunc::copy: return xf;
    case ActFunc::square: y = x * x; break;
    case ActFunc::sigmoid: y = sigmoid(x); break;
    case ActFunc::relu: return std::isnan(xf) ? xf : (xf > 0 ? xf : 0.0f);
    case ActFunc::gelu: y = 0.5 * x * (1.0 + std::erf(x / kSqrt2)); break;
    case ActFunc::gelu_dx: y = 0.5 * (1.0 + std::erf(x / kSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x); break;
    case ActFunc::gelu_apprx_tanh:
      y = 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x)));
      break;
    case ActFunc::gelu_apprx_sigmoid: y = x * sigmoid(kGeluSigmoidScale * x); break;
    case ActFunc::gelu_apprx_sigmoid_dx: {
      const double s = sigmoid(kGeluSigmoidScale * x);
      y = s * (1.0 + kGeluSigmoidScale * x * (1.0 - s));
      break;
    }
    case ActFunc::silu: y = x * sigmoid(x); break;
    case ActFunc::silu_dx: {
      const double s = sigmoid(x);
      y = s * (1.0 + x * (1.0 - s));
      break;
    }
    case ActFunc::tanh: y = std::tanh(x); break;
    case ActFunc::softplus: y = softplus(x); break;
    case ActFunc::mish: y = x * std::tanh(softplus(x)); break;
    case ActFunc::erf: y = std::erf(x); break;
    case ActFunc::erf_dx: y = kTwoOverSqrtPi * std::exp(-x * x); break;
    case ActFunc::exp: y = std::exp(x); break;
    case ActFunc::log: y = std::log(x); break;
    case ActFunc::sin: y = std::sin(x); break;
    case ActFunc::arctan: y = std::atan(x); break;
    case ActFunc::sqrt: y = std::sqrt(x); break;
    case ActFunc::rsqrt: y = 1.0 / std::sqrt(x); break;
    case ActFunc::reciprocal: y = 1.0 / x; break;
    case ActFunc::sign: return std::isnan(xf) ? xf : xf > 0 ? 1.0f : xf < 0 ? -1.0f : 0.0f;
    case ActFunc::abs: return std::fabs(xf);
    default: y = NAN; break;
  }
  return static_cast<float>(y);
}

}  // namespace nikki
