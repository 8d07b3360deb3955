// Independent references for tensor_reduce's fold order (docs/numerics.md, "Reduction order"),
// written from the contract without calling alu.hpp or reduction_order.hpp. Used by
// test_reduction_order.cpp (the shared fold itself) and test_instructions.cpp (the interpreter).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include <doctest/doctest.h>

#include "nikki/ops.hpp"

namespace nikki::test {

inline constexpr uint32_t kCanonicalNaN = 0x7fc00000;

/** Canonicalizes NaN results: every NaN an ALU operator produces is 0x7fc00000. */
inline float canonical(float v) { return v != v ? std::bit_cast<float>(kCanonicalNaN) : v; }

/** numpy's pairwise_sum, for a contiguous float32 run of n >= 1 elements. */
inline float pairwise_ref(const float* x, int64_t n) {
  if (n < 8) {
    float s = x[0];
    for (int64_t i = 1; i < n; ++i) s = s + x[i];
    return s;
  }
  if (n <= 128) {
    float r0 = x[0], r1 = x[1], r2 = x[2], r3 = x[3], r4 = x[4], r5 = x[5], r6 = x[6], r7 = x[7];
    int64_t i = 8;
    for (; i < n - n % 8; i += 8) {
      r0 = r0 + x[i], r1 = r1 + x[i + 1], r2 = r2 + x[i + 2], r3 = r3 + x[i + 3];
      r4 = r4 + x[i + 4], r5 = r5 + x[i + 5], r6 = r6 + x[i + 6], r7 = r7 + x[i + 7];
    }
    float s = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7));
    for (; i < n; ++i) s = s + x[i];
    return s;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_ref(x, n2) + pairwise_ref(x + n2, n - n2);
}

/** The reference fold of a run: pairwise for add (one element: itself), left to right otherwise,
 * with maximum / minimum as NKI's ALU defines them (NaN if either operand is NaN, else the first
 * operand when strictly greater / less, else the second) and NaN results canonical. */
inline float fold_ref(AluOp op, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  if (n == 1) return x[0];
  if (op == AluOp::add) return canonical(pairwise_ref(x.data(), n));
  float r = x[0];
  for (int64_t i = 1; i < n; ++i) {
    const float v = x[i];
    switch (op) {
      case AluOp::maximum: r = (std::isnan(r) || std::isnan(v)) ? NAN : (r > v ? r : v); break;
      case AluOp::minimum: r = (std::isnan(r) || std::isnan(v)) ? NAN : (r < v ? r : v); break;
      case AluOp::subtract: r = r - v; break;
      case AluOp::multiply: r = r * v; break;
      default: FAIL("no reference for this operator"); return NAN;
    }
    r = canonical(r);
  }
  return r;
}

}  // namespace nikki::test
