// ulps of an fp32 result against a long double reference, shared by tests/cpp/test_activation.cpp
// and the exhaustive sweep (tests/cpp/activation_sweep.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace nikki::test {

using LD = long double;

inline constexpr float kFltMax = std::numeric_limits<float>::max();

/** Error of `got` in ulps of the fp32 result: |got - exact| / ulp(exact), where ulp(v) is the
 *  spacing of fp32 values at |v| (2^-149 below the normal range). A correctly rounded result is
 *  within 0.5, a faithfully rounded one below 1. */
inline double ulp_error(float got, LD exact) {
  const float rounded = static_cast<float>(exact);
  if (std::isnan(exact)) return std::isnan(got) ? 0.0 : INFINITY;
  if (std::isinf(got) || std::isinf(rounded)) {
    if (got == rounded) return 0.0;
    // one side overflowed: adjacent when the other is the largest finite value of that sign
    return std::fabs(got) == kFltMax || std::fabs(rounded) == kFltMax ? 1.0 : INFINITY;
  }
  const int e = exact == 0 ? -149 : std::max(std::ilogb(exact), -126);
  return double(std::fabs(LD(got) - exact) / std::ldexp(LD(1), e - 23));
}

}  // namespace nikki::test
