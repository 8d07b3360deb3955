// The meaning of each ALU operator, as the executors compute it. This is nikki's definition of
// engine arithmetic; docs/numerics.md explains each choice.
//
//  - Arithmetic operators take and return fp32 (the engines compute in fp32).
//  - Comparisons and logical operators return 1.0f or 0.0f; logical operators treat nonzero as true.
//  - maximum/minimum propagate NaN (as numpy does), so uninitialized (NaN sentinel) data stays visible.
//  - Every NaN result is the canonical quiet NaN (0x7fc00000). Which NaN operand IEEE arithmetic
//    passes on is left to the host (x86 keeps the first source, and compilers may swap the
//    operands of + and *), so canonicalizing is what makes results identical across executors,
//    compilers and hosts.
//  - Bitvec operators act on the integer bit patterns, widened to 64 bits, of the source dtype;
//    right_shift is logical within `bits`, shifts by `bits` or more give 0.
#pragma once

#include <cmath>
#include <cstdint>

#include "nikki/ops.hpp"

namespace nikki {

inline float alu_apply_raw(AluOp op, float a, float b);

/** @brief `r`, with any NaN replaced by the canonical quiet NaN 0x7fc00000. Every instruction
 * that computes in fp32 outside alu_apply (statistics, ...) writes its results through it. */
inline float canonical_nan(float r) { return r != r ? NAN : r; }

/** @brief fp32 result of arithmetic operator `op` on (a, b); unary operators ignore b. */
inline float alu_apply(AluOp op, float a, float b) { return canonical_nan(alu_apply_raw(op, a, b)); }

/** @brief alu_apply before NaN canonicalization. */
inline float alu_apply_raw(AluOp op, float a, float b) {
  switch (op) {
    case AluOp::bypass: return a;
    case AluOp::add: return a + b;
    case AluOp::subtract: return a - b;
    case AluOp::multiply: return a * b;
    case AluOp::divide: return a / b;
    case AluOp::maximum: return (std::isnan(a) || std::isnan(b)) ? NAN : (a > b ? a : b);
    case AluOp::minimum: return (std::isnan(a) || std::isnan(b)) ? NAN : (a < b ? a : b);
    case AluOp::power: return static_cast<float>(std::pow(double(a), double(b)));
    case AluOp::mod: {
      float r = std::fmod(a, b);
      return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
    }
    case AluOp::fmod: return std::fmod(a, b);
    // maximum / minimum of the magnitudes, spelled out rather than calling alu_apply: a call cycle
    // (alu_apply -> alu_apply_raw -> alu_apply) keeps LLVM from inlining the operator into the
    // native routines, and every element then pays a call
    case AluOp::abs_max: {
      const float x = std::fabs(a), y = std::fabs(b);
      return (std::isnan(x) || std::isnan(y)) ? NAN : (x > y ? x : y);
    }
    case AluOp::abs_min: {
      const float x = std::fabs(a), y = std::fabs(b);
      return (std::isnan(x) || std::isnan(y)) ? NAN : (x < y ? x : y);
    }
    case AluOp::equal: return a == b ? 1.0f : 0.0f;
    case AluOp::not_equal: return a != b ? 1.0f : 0.0f;
    case AluOp::greater: return a > b ? 1.0f : 0.0f;
    case AluOp::greater_equal: return a >= b ? 1.0f : 0.0f;
    case AluOp::less: return a < b ? 1.0f : 0.0f;
    case AluOp::less_equal: return a <= b ? 1.0f : 0.0f;
    case AluOp::logical_and: return (a != 0 && b != 0) ? 1.0f : 0.0f;
    case AluOp::logical_or: return (a != 0 || b != 0) ? 1.0f : 0.0f;
    case AluOp::logical_xor: return ((a != 0) != (b != 0)) ? 1.0f : 0.0f;
    case AluOp::abs: return std::fabs(a);
    case AluOp::square: return a * a;
    case AluOp::relu: return std::isnan(a) ? a : (a > 0 ? a : 0.0f);
    case AluOp::rsqrt: return static_cast<float>(1.0 / std::sqrt(double(a)));
    case AluOp::reciprocal: return 1.0f / a;
    case AluOp::negate: return -a;
    case AluOp::average: return a + b;  // summed like add; the caller divides by the count
    default: return NAN;  // bitvec operators take the integer path
  }
}

/** @brief Integer result of bitvec operator `op` on bit patterns a, b of a `bits`-wide dtype. */
inline int64_t alu_apply_bits(AluOp op, int64_t a, int64_t b, int bits) {
  const uint64_t mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
  const uint64_t ua = uint64_t(a) & mask;
  switch (op) {
    case AluOp::bitwise_and: return a & b;
    case AluOp::bitwise_or: return a | b;
    case AluOp::bitwise_xor: return a ^ b;
    case AluOp::invert: return ~a;
    case AluOp::left_shift: return (b < 0 || b >= bits) ? 0 : int64_t((ua << b) & mask);
    case AluOp::right_shift: return (b < 0 || b >= bits) ? 0 : int64_t(ua >> b);
    default: return 0;
  }
}

/** @brief Integer arithmetic of the GpSimd engine on 32-bit integer tiles (exact, wrapping). */
inline int64_t alu_apply_int(AluOp op, int64_t a, int64_t b) {
  switch (op) {
    case AluOp::add: return a + b;
    case AluOp::subtract: return a - b;
    case AluOp::multiply: return int64_t(uint64_t(a) * uint64_t(b));
    case AluOp::maximum: return a > b ? a : b;
    case AluOp::minimum: return a < b ? a : b;
    case AluOp::equal: return a == b;
    case AluOp::not_equal: return a != b;
    case AluOp::greater: return a > b;
    case AluOp::greater_equal: return a >= b;
    case AluOp::less: return a < b;
    case AluOp::less_equal: return a <= b;
    case AluOp::logical_and: return a != 0 && b != 0;
    case AluOp::logical_or: return a != 0 || b != 0;
    case AluOp::logical_xor: return (a != 0) != (b != 0);
    default: return alu_apply_bits(op, a, b, 64);
  }
}

}  // namespace nikki
