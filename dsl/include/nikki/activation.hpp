// The Scalar engine's activation functions (NKI's activation table), as the executors compute
// them. This header is the one definition: the reference semantics
// (runtime/src/reference_semantics.cpp) call activation_apply per element, and the native routines
// (jit/native/kernels.cpp) inline the same code, so both executors agree bit for bit.
// docs/numerics.md gives the formulas.
//
// exp, tanh and log are computed in fp32 (exp_f32, tanh_f32, log_f32; faithfully rounded: the
// correctly rounded value or its neighbour). Every other function is evaluated in double precision
// from its formula and rounded once to fp32. The transcendental parts (exp, expm1, log, log1p,
// tanh, sigmoid) are nikki's own approximations, not libm's: straight-line arithmetic without calls
// or branches (special cases are selects), so LLVM vectorizes them inside the native routines, and
// every compiler evaluates them with the same IEEE operations (every multiply-add is an explicit
// fma, so no compiler's contraction choice can change a rounding). Their relative error in double
// is below about 2^-40, far below fp32's 2^-24, so the fp32 result is the correctly rounded value
// of the exact formula except when that value lies within about 2^-40 (relative) of a point halfway
// between two floats: then it may be the other neighbour (error below 0.5 + 2^-16 ulp). erf, erfc
// (gelu, gelu_dx), sin and arctan still call libm (almost always correctly rounded in fp32, not
// vectorized). docs/numerics.md tabulates the measured errors; tests/cpp/test_activation.cpp bounds
// them.
//
// Hardware uses piece-wise polynomial approximations within each function's valid range; nikki
// gives the correctly or faithfully rounded value of the exact formula everywhere.
//
// NaN results are the canonical quiet NaN 0x7fc00000, as ALU results are (alu.hpp): which NaN
// IEEE arithmetic passes on is up to the host and the compiler. copy, relu, sign and abs pass a
// NaN operand through bit for bit (they do no arithmetic on it).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "nikki/ops.hpp"

namespace nikki {

namespace activation_detail {

inline constexpr double kSqrt2 = 1.41421356237309504880;
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
inline constexpr double kGeluTanhCubic = 0.044715;
inline constexpr double kGeluSigmoidScale = 1.702;
inline constexpr double kInf = __builtin_huge_val();

inline constexpr double kLog2e = 1.4426950408889634074;
// ln 2 as a double (kLn2Hi) plus the rest (kLn2Lo): n * ln 2 to about 2^-106 relative via two fmas
inline constexpr double kLn2Hi = 0x1.62e42fefa39efp-1;
inline constexpr double kLn2Lo = 0x1.abc9e3b39803fp-56;
// Adding 1.5 * 2^52 rounds a double of magnitude < 2^51 to an integer held in the low mantissa bits.
inline constexpr double kRoundShift = 0x1.8p52;
// exp's argument range: below, e^x < 2^-1021 (every fp32 result that can depend on it is 0 or its
// limit); above, e^x overflows fp32 whatever it is multiplied by. Inside it 2^n stays normal.
inline constexpr double kExpLow = -708.0, kExpHigh = 709.0;

/**
 * (e^r - 1) / r for |r| <= 0.354 (a little over ln(2) / 2): the minimax polynomial of degree 8
 * for relative error (fitted for nikki with a Remez exchange in 60-digit arithmetic; the
 * coefficients are near 1/(k+1)!), relative error 2^-43.3 with the coefficients rounded to double.
 * 1 + r q(r) is e^r and r q(r) is e^r - 1, both to about that relative accuracy.
 */
inline double expm1_ratio(double r) {
  double q = 2.755729919789126e-06;
  q = std::fma(q, r, 2.487905046038483e-05);
  q = std::fma(q, r, 0.00019841379864650314);
  q = std::fma(q, r, 0.0013888816417737524);
  q = std::fma(q, r, 0.00833333321889463);
  q = std::fma(q, r, 0.04166666691749033);
  q = std::fma(q, r, 0.16666666666987864);
  q = std::fma(q, r, 0.4999999999976601);
  return std::fma(q, r, 0.9999999999999867);
}

/** x = n ln 2 + r with n the integer nearest x / ln 2 and |r| <= 0.354, for |x| <= 709; `scale`
 * receives 2^n (n from -1022 to 1023, always a normal double). Returns r; `n_is_zero` tells
 * whether n = 0 (then r = x exactly). A NaN x gives a NaN r. */
inline double exp_reduce(double x, double& scale, bool& n_is_zero) {
  const double t = std::fma(x, kLog2e, kRoundShift);
  const double n = t - kRoundShift;
  const double r = std::fma(n, -kLn2Lo, std::fma(n, -kLn2Hi, x));
  // t's low 12 bits are n + 2^51 modulo 2^12, so (bits + 1023) << 52 is the exponent field of 2^n
  scale = std::bit_cast<double>((std::bit_cast<uint64_t>(t) + 1023u) << 52);
  n_is_zero = n == 0.0;
  return r;
}

/** e^x in double, relative error below 2^-42; 0 below kExpLow, +inf above kExpHigh, NaN for NaN. */
inline double exp_d(double x) {
  const double xc = x < kExpLow ? kExpLow : (x > kExpHigh ? kExpHigh : x);  // NaN stays NaN
  double scale;
  bool n_is_zero;
  const double r = exp_reduce(xc, scale, n_is_zero);
  const double y = std::fma(r, expm1_ratio(r), 1.0) * scale;
  return x < kExpLow ? 0.0 : (x > kExpHigh ? kInf : y);
}

/** e^x - 1 in double, relative error below 2^-41 (no cancellation near 0: there it is r q(r)). */
inline double expm1_d(double x) {
  const double xc = x < kExpLow ? kExpLow : (x > kExpHigh ? kExpHigh : x);
  double scale;
  bool n_is_zero;
  const double r = exp_reduce(xc, scale, n_is_zero);
  const double q = expm1_ratio(r);
  // |n| >= 1 means e^x >= 1.41 or <= 0.71, so subtracting 1 loses at most 2 bits
  const double y = n_is_zero ? r * q : std::fma(std::fma(r, q, 1.0), scale, -1.0);
  return x < kExpLow ? -1.0 : (x > kExpHigh ? kInf : y);
}

/**
 * atanh(s) / s as a polynomial in z = s^2 for s^2 <= 0.0297 (|s| <= 0.1716 + 0.5%): degree 5
 * minimax for relative error (fitted like expm1_ratio; the coefficients are near 1/(2k+1)),
 * 2^-45 relative. log(1 + f) = 2 atanh(f / (2 + f)).
 */
inline double atanh_ratio(double z) {
  double h = 0.09812039434489975;
  h = std::fma(h, z, 0.11086589456927153);
  h = std::fma(h, z, 0.14286095496493284);
  h = std::fma(h, z, 0.1999999732985165);
  h = std::fma(h, z, 0.33333333340162613);
  return std::fma(h, z, 0.9999999999999717);
}

/**
 * log(u) for u >= 1 or u a positive normal double, written as log(2^k m) = k ln 2 + log1p(f)
 * with m in [sqrt(1/2), sqrt(2)) and f = m - 1 (exact). When k = 0 the caller may pass a more
 * precise f than u - 1 (`f_if_k0`: log1p's own argument). Relative error below 2^-50 away from
 * u = 1, and log1p's near it. u <= 0, +inf and NaN are the caller's to select.
 */
inline double log_core(double u, double f_if_k0) {
  const uint64_t bits = std::bit_cast<uint64_t>(u);
  const double m1 = std::bit_cast<double>((bits & 0x000f'ffff'ffff'ffffu) | 0x3ff0'0000'0000'0000u);  // [1, 2)
  const bool halve = m1 > kSqrt2;
  const int64_t k = int64_t((bits >> 52) & 0x7ff) - 1023 + (halve ? 1 : 0);
  const double m = halve ? 0.5 * m1 : m1;
  const double f = k == 0 ? f_if_k0 : m - 1.0;
  const double s = f / (2.0 + f);
  const double l = (s + s) * atanh_ratio(s * s);
  const double kd = double(k);
  return std::fma(kd, kLn2Hi, std::fma(kd, kLn2Lo, l));
}

/** log(1 + t) in double for t in [0, 1] (softplus' argument) or NaN, without cancellation for
 * small t. */
inline double log1p_d(double t) { return t == t ? log_core(1.0 + t, t) : t; }

/** tanh in double, for mish (the tanh activation is tanh_f32): sign(x) (1 - e^-2|x|) / (1 + e^-2|x|)
 * through expm1, exact sign of zeros. */
inline double tanh_d(double x) {
  const double em = expm1_d(-2.0 * std::fabs(x));  // in [-1, 0]
  return std::copysign(-em / (2.0 + em), x);
}

/** The logistic function s(x) = 1 / (1 + e^-x) and its complement 1 - s(x) = s(-x), both without
 * cancellation (e^-|x| is at most 1). NaN gives NaN for both. */
inline void sigmoid_d(double x, double& s, double& c) {
  const double e = exp_d(-std::fabs(x));
  const double big = 1.0 / (1.0 + e);  // s(|x|)
  const double small = e * big;        // s(-|x|)
  s = x >= 0.0 ? big : small;
  c = x >= 0.0 ? small : big;
}

inline constexpr float kLn2HiF = 0x1.62e4p-1f, kLn2LoF = 0x1.7f7d1cp-20f, kShiftF = 0x1.8p23f;

/** x = n ln 2 + r in fp32 with n the integer nearest x / ln 2 (|n| <= 256, returned in `n`) and
 * |r| <= 0.347, exact to within one rounding: ln 2's high part has 15 bits, so n * kLn2HiF is exact. */
inline float exp_reduce_f32(float x, int32_t& n) {
  const float t = std::fma(x, 0x1.715476p+0f, kShiftF);
  n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShiftF);
  const float nf = t - kShiftF;
  return std::fma(nf, -kLn2LoF, std::fma(nf, -kLn2HiF, x));
}

/** (e^r - 1) / r for |r| <= 0.347: the degree-6 minimax fit for relative error (2^-31.8, fitted
 * like expm1_ratio). e^r = 1 + r q(r). */
inline float expm1_ratio_f32(float r) {
  float q = 0x1.a019e6p-13f;
  q = std::fma(q, r, 0x1.6d82ap-10f);
  q = std::fma(q, r, 0x1.1111b2p-7f);
  q = std::fma(q, r, 0x1.5554ap-5f);
  q = std::fma(q, r, 0x1.555554p-3f);
  q = std::fma(q, r, 0.5f);
  return std::fma(q, r, 1.0f);
}

/**
 * e^x evaluated in fp32, for the exp activation (the hot one: softmax). Faithfully rounded: the
 * result is the correctly rounded e^x or its neighbour (worst error over every fp32 input 0.874
 * ulp, docs/numerics.md), including subnormal results and the overflow threshold. x = n ln 2 + r
 * (exp_reduce_f32); e^r = 1 + r q(r) (expm1_ratio_f32); 2^n is applied as two factors so that each
 * stays a normal float and only the last multiplication rounds.
 */
inline float exp_f32(float x) {
  // below -104, e^x < 2^-150 rounds to 0; above 90 it overflows; inside, |n| <= 150
  float xc = x < -104.0f ? -104.0f : (x > 90.0f ? 90.0f : x);
  xc = x != x ? 0.0f : xc;
  int32_t ni;
  const float r = exp_reduce_f32(xc, ni);
  const float p = std::fma(r, expm1_ratio_f32(r), 1.0f);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float y = (p * std::bit_cast<float>((n1 + 127) << 23)) * std::bit_cast<float>((n2 + 127) << 23);
  // Up to 0x1.62e42ep6 the exact e^x rounds to a finite float and beyond it to infinity; p's
  // last-bit error must not move that threshold.
  constexpr float kMaxFinite = 0x1.fffffep127f, kLastFiniteX = 0x1.62e42ep6f;
  const float bounded = x > kLastFiniteX ? __builtin_inff() : (y > kMaxFinite ? kMaxFinite : y);
  return x != x ? NAN : bounded;
}

/**
 * tanh evaluated in fp32, for the tanh activation. Faithfully rounded (docs/numerics.md gives the
 * exhaustively measured worst error). Three pieces on y = |x|, all computed and one selected, so
 * the loop has no branches; the sign is copied back at the end (tanh(-0) = -0):
 *  - y < 0.625: y + y^3 P(y^2), P the degree-5 minimax fit of (tanh(y) - y) / y^3 (relative error
 *    2^-25). The correction y^3 P is at most 16% of the result, so P's error and roundings shrink
 *    by that factor; tiny and subnormal y give y itself.
 *  - 0.625 <= y < 1.5: a degree-9 polynomial in y - c, fitted (minimax for relative error, each
 *    coefficient rounded to fp32 in turn and the higher ones refitted) to 2^-31.5. c = kTanhMid is
 *    a float whose tanh lies within 2^-38 of a float, so the constant term loses nothing. Here the
 *    exp formula below would lose too much: 1 - d cannot absorb d's relative error when d ~ 0.5.
 *  - y >= 1.5: 1 - 2E / (1 + E) with E = e^-2y (the exp_f32 steps; -2y >= -20, where tanh already
 *    rounds to 1 and 2^n stays normal). d = 2E / (1 + E) <= 0.095 carries three roundings and E's
 *    (about 2^-22.4 relative in all), which is at most 0.34 ulp of the result.
 */
inline float tanh_f32(float x) {
  const float y = std::fabs(x);
  const float z = y * y;
  float pa = 0x1.6e3a9cp-9f;
  pa = std::fma(pa, z, -0x1.21d58cp-7f);
  pa = std::fma(pa, z, 0x1.678df6p-6f);
  pa = std::fma(pa, z, -0x1.ba3e9ep-5f);
  pa = std::fma(pa, z, 0x1.11119cp-3f);
  pa = std::fma(pa, z, -0x1.555556p-2f);
  const float small = std::fma(y * z, pa, y);

  constexpr float kTanhMid = 0x1.0b653p+0f;
  const float t = y - kTanhMid;
  float pb = 0x1.76f23ap-9f;
  pb = std::fma(pb, t, -0x1.72b368p-8f);
  pb = std::fma(pb, t, 0x1.236a9ep-12f);
  pb = std::fma(pb, t, 0x1.3cd1a8p-6f);
  pb = std::fma(pb, t, -0x1.516864p-5f);
  pb = std::fma(pb, t, 0x1.26786ep-6f);
  pb = std::fma(pb, t, 0x1.b8f42ep-4f);
  pb = std::fma(pb, t, -0x1.391p-2f);
  pb = std::fma(pb, t, 0x1.918906p-2f);
  const float mid = std::fma(pb, t, 0x1.8f301ap-1f);

  const float yc = y < 10.0f ? y : 10.0f;  // NaN and inf become 10 (selected away or exact)
  int32_t n;
  const float r = exp_reduce_f32(-2.0f * yc, n);
  const float e = std::fma(r, expm1_ratio_f32(r), 1.0f) * std::bit_cast<float>((n + 127) << 23);
  const float large = 1.0f - (2.0f * e) / (1.0f + e);

  const float m = y < 0.625f ? small : (y < 1.5f ? mid : large);
  return x != x ? NAN : std::copysign(m, x);
}

/**
 * Natural log evaluated in fp32, for the log activation. Faithfully rounded (docs/numerics.md).
 * x = 2^k m with m in [2/3, 4/3) (subnormal x is scaled by 2^23 first), f = m - 1 exact, and
 * log x = k ln 2 + f + f^2 Q(f) with Q the degree-10 fit of (log1p(f) - f) / f^2 on |f| <= 1/3
 * (relative error 2^-29.5; coefficients rounded like tanh_f32's). The correction f^2 Q is at most
 * 19% of the result, so its roundings count for little; k ln 2 + f is the one sum that could cost a
 * full rounding, so it is split exactly (Fast2Sum: |k ln 2| > |f| whenever k != 0) and its error
 * joins the small terms before the single last rounding.
 */
inline float log_f32(float x) {
  const bool subnormal = x < 0x1p-126f;  // also 0 and negatives, selected away below
  const uint32_t bits = std::bit_cast<uint32_t>(subnormal ? x * 0x1p23f : x);
  // k = floor(log2(x / (2/3))): 0x3f2aaaab is 2/3 rounded up
  const int32_t k = int32_t(bits - 0x3f2aaaabu) >> 23;
  const float f = std::bit_cast<float>(bits - (uint32_t(k) << 23)) - 1.0f;
  const float kf = float(k) - (subnormal ? 23.0f : 0.0f);
  float q = -0x1.c43eecp-4f;
  q = std::fma(q, f, 0x1.e43ed4p-4f);
  q = std::fma(q, f, -0x1.8bf788p-4f);
  q = std::fma(q, f, 0x1.ba7a62p-4f);
  q = std::fma(q, f, -0x1.005d5p-3f);
  q = std::fma(q, f, 0x1.24ddf4p-3f);
  q = std::fma(q, f, -0x1.555336p-3f);
  q = std::fma(q, f, 0x1.999842p-3f);
  q = std::fma(q, f, -0x1.000002p-2f);
  q = std::fma(q, f, 0x1.555556p-2f);
  q = std::fma(q, f, -0.5f);
  const float hi = kf * kLn2HiF;  // exact: |k| <= 149 has 8 bits, kLn2HiF 15
  const float s = hi + f;
  const float err = (hi - s) + f;  // s + err = hi + f exactly
  const float lo = std::fma(f * f, q, std::fma(kf, kLn2LoF, err));
  const float y = s + lo;
  return !(x >= 0.0f) ? NAN : (x == 0.0f ? -__builtin_inff() : (x == __builtin_inff() ? __builtin_inff() : y));
}

inline double softplus_d(double x) { return (x > 0.0 ? x : 0.0) + log1p_d(exp_d(-std::fabs(x))); }

inline float canonical(double y) {
  const float r = static_cast<float>(y);
  return r != r ? NAN : r;
}

}  // namespace activation_detail

/** @brief f(x) for activation function `f`, rounded to fp32. */
inline float activation_apply(ActFunc f, float xf) {
  using namespace activation_detail;
  const double x = xf;
  double y, s, c;
  switch (f) {
    case ActFunc::copy: return xf;
    case ActFunc::square: y = x * x; break;
    case ActFunc::sigmoid:
      sigmoid_d(x, s, c);
      y = s;
      break;
    case ActFunc::relu: return std::isnan(xf) ? xf : (xf > 0 ? xf : 0.0f);
    // 1 + erf(x / sqrt 2) = erfc(-x / sqrt 2): the same value without the cancellation of
    // 1 + erf < 0 (a relative error of 1% at x = -8, and 0 instead of -1e-18 at x = -9)
    case ActFunc::gelu: y = 0.5 * x * std::erfc(-x / kSqrt2); break;
    case ActFunc::gelu_dx: y = std::fma(x * kInvSqrt2Pi, exp_d(-0.5 * x * x), 0.5 * std::erfc(-x / kSqrt2)); break;
    case ActFunc::gelu_apprx_tanh:
      // 0.5 x (1 + tanh(u)) = x s(2u): the same value without the cancellation of 1 + tanh(u) < 0
      sigmoid_d(2.0 * kSqrt2OverPi * std::fma(kGeluTanhCubic * x * x, x, x), s, c);
      y = x * s;
      break;
    case ActFunc::gelu_apprx_sigmoid:
      sigmoid_d(kGeluSigmoidScale * x, s, c);
      y = x * s;
      break;
    case ActFunc::gelu_apprx_sigmoid_dx:
      sigmoid_d(kGeluSigmoidScale * x, s, c);
      y = s * std::fma(kGeluSigmoidScale * x, c, 1.0);
      break;
    case ActFunc::silu:
      sigmoid_d(x, s, c);
      y = x * s;
      break;
    case ActFunc::silu_dx:
      sigmoid_d(x, s, c);
      y = s * std::fma(x, c, 1.0);
      break;
    case ActFunc::tanh: return tanh_f32(xf);
    case ActFunc::softplus: y = softplus_d(x); break;
    case ActFunc::mish: y = x * tanh_d(softplus_d(x)); break;
    case ActFunc::erf: y = std::erf(x); break;
    case ActFunc::erf_dx: y = kTwoOverSqrtPi * exp_d(-x * x); break;
    case ActFunc::exp: return exp_f32(xf);
    case ActFunc::log: return log_f32(xf);
    case ActFunc::sin: y = std::sin(x); break;
    case ActFunc::arctan: y = std::atan(x); break;
    case ActFunc::sqrt: y = std::sqrt(x); break;
    case ActFunc::rsqrt: y = 1.0 / std::sqrt(x); break;
    case ActFunc::reciprocal: y = 1.0 / x; break;
    case ActFunc::sign: return std::isnan(xf) ? xf : xf > 0 ? 1.0f : xf < 0 ? -1.0f : 0.0f;
    case ActFunc::abs: return std::fabs(xf);
    default: y = NAN; break;
  }
  return canonical(y);
}

}  // namespace nikki
