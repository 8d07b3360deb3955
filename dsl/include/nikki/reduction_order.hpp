// The order in which tensor_reduce folds a run of fp32 elements with one ALU operator. It is part
// of nikki's numerics contract (docs/numerics.md, "Reduction order"), and the reference
// interpreter and the native routines both call fold() below, so they produce the same bits.
//
//  - add: numpy's pairwise summation. A fold in one fixed sequence of roundings cannot use SIMD
//    (each add waits for the previous one); this order runs 8 independent accumulators, one
//    8-float register, and gives the same bits as numpy's np.add.reduce over a contiguous float32
//    row.
//  - maximum / minimum: any order gives the value of the left-to-right fold with alu_apply, whose
//    only order-dependent parts are NaN (any NaN gives the canonical NaN) and the sign of a zero
//    result (the last zero of the run wins, since alu_apply returns its second operand on ties).
//    Those two are computed explicitly, so the result is exactly the sequential fold's.
//  - every other operator (subtract, multiply, divide, average, ...) folds left to right: its
//    results depend on the order and no other order has been defined for it.
//
// A run of one element is that element as it is (no operator applied, NaN payload kept), for every
// operator, as in the sequential fold seeded by its first element.
//
// Elements reach the fold through fetch(lo, len, buf): a pointer to elements [lo, lo + len) of the
// run (len <= kBlock) as fp32, either into the caller's data or into buf (kBlock floats) after
// filling it. The native routines return their source directly when it is contiguous fp32.
#pragma once

#include <cmath>
#include <cstdint>

#include "nikki/alu.hpp"
#include "nikki/ops.hpp"

namespace nikki::reduction {

/** Elements fetched at a time, and the longest run summed by one block (numpy's PW_BLOCKSIZE). */
inline constexpr int64_t kBlock = 128;
/** Accumulators of a block sum (numpy's unroll factor): one 8-float SIMD register. */
inline constexpr int64_t kSumLanes = 8;
/** Independent running maxima / minima: four 8-float registers, so that the dependent max / min
 * instructions of the lanes overlap. Any count gives the same result. */
inline constexpr int64_t kExtremumLanes = 32;

/** The combination of block_sum's accumulators, ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)).
 * T is float, or a vector of floats (one block sum per lane, as the native routines fold several
 * partitions at once). */
template <class T>
inline T combine_accumulators(const T (&r)[kSumLanes]) {
  return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
}

/**
 * fp32 sum of x[0..n), 1 <= n <= kBlock, with raw IEEE adds (NaNs are not canonicalized here).
 * n < 8: left to right from x[0]. Otherwise accumulator r[j] starts at x[j] and adds
 * x[8 + j], x[16 + j], ... over the whole steps of 8; the accumulators combine as
 * ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), and the remaining n % 8 elements are added in
 * order. This is numpy's pairwise_sum block, up to the sign of a zero sum: numpy's reduction
 * starts from +0.0, so numpy sums a run of only -0.0 to +0.0 where nikki keeps -0.0.
 */
inline float block_sum(const float* x, int64_t n) {
  if (n < kSumLanes) {
    float s = x[0];
    for (int64_t i = 1; i < n; ++i) s += x[i];
    return s;
  }
  float r[kSumLanes];
  for (int64_t j = 0; j < kSumLanes; ++j) r[j] = x[j];
  int64_t i = kSumLanes;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int64_t j = 0; j < kSumLanes; ++j) r[j] += x[i + j];
  float s = combine_accumulators(r);
  for (; i < n; ++i) s += x[i];
  return s;
}

/**
 * Pairwise sum of elements [lo, lo + n) of the run, n >= 1: runs of up to kBlock elements are one
 * block_sum; longer runs split at n / 2 rounded down to a multiple of 8, and the two halves' sums
 * are added (numpy's pairwise_sum).
 */
template <class Fetch>
float pairwise_sum(int64_t lo, int64_t n, Fetch& fetch) {
  if (n <= kBlock) {
    float buf[kBlock];
    return block_sum(fetch(lo, n, buf), n);
  }
  const int64_t half = n / 2 - (n / 2) % kSumLanes;
  return pairwise_sum(lo, half, fetch) + pairwise_sum(lo + half, n - half, fetch);
}

/**
 * The left-to-right fold with alu_apply(maximum or minimum) of a run of n >= 2 elements,
 * computed in any order. A NaN anywhere makes the fold the canonical NaN. Otherwise the fold's
 * value is the extremum, and only a zero extremum has several encodings: alu_apply keeps its
 * second operand unless the first is strictly better, so the sequential fold ends on the last
 * element equal to the extremum, and a zero result takes the sign of the run's last zero.
 * Here kExtremumLanes running extrema ignore NaNs (one max / min instruction each: the new value
 * replaces the lane's only when strictly better, which is also false for a NaN), and as many
 * "NaN seen" lanes record NaNs; the lanes, and a scalar pair for the elements of a block past
 * its last whole step of lanes, combine at the end.
 */
template <class Fetch>
float extremum(bool is_max, int64_t n, Fetch& fetch) {
  float buf[kBlock];
  const float first = fetch(0, 1, buf)[0];
  // nan_seen lanes start at 0 and keep the last NaN they met (NaN: the only value unequal to itself)
  float lane[kExtremumLanes], nan_seen[kExtremumLanes];
  for (int64_t l = 0; l < kExtremumLanes; ++l) lane[l] = first, nan_seen[l] = 0.0f;
  float rest = first, rest_nan = 0.0f;
  auto better = [is_max](float v, float m) { return is_max ? v > m : v < m; };
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t len = n - lo < kBlock ? n - lo : kBlock;
    const float* x = fetch(lo, len, buf);
    int64_t i = 0;
    for (; i + kExtremumLanes <= len; i += kExtremumLanes)
      for (int64_t l = 0; l < kExtremumLanes; ++l) {
        const float v = x[i + l];
        lane[l] = better(v, lane[l]) ? v : lane[l];
        nan_seen[l] = v != v ? v : nan_seen[l];
      }
    // separate scalars, not a lane: indexing the lanes here would keep them in memory
    for (; i < len; ++i) {
      rest = better(x[i], rest) ? x[i] : rest;
      rest_nan = x[i] != x[i] ? x[i] : rest_nan;
    }
  }
  bool nan = rest_nan != rest_nan;
  float m = rest;
  for (int64_t l = 0; l < kExtremumLanes; ++l) {
    nan = nan || nan_seen[l] != nan_seen[l];
    m = better(lane[l], m) ? lane[l] : m;
  }
  if (nan) return NAN;
  if (m != 0) return m;  // a nonzero value has one encoding
  for (int64_t hi = n; hi > 0;) {
    const int64_t len = hi < kBlock ? hi : kBlock;
    const float* x = fetch(hi - len, len, buf);
    for (int64_t i = len - 1; i >= 0; --i)
      if (x[i] == 0) return x[i];
    hi -= len;
  }
  return m;  // unreachable: a zero extremum is one of the elements
}

/** The left-to-right fold r = alu_apply(op, r, x) from the first element, for operators whose
 * result depends on the order. */
template <class Fetch>
float sequential(AluOp op, int64_t n, Fetch& fetch) {
  float buf[kBlock];
  float r = 0.0f;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t len = n - lo < kBlock ? n - lo : kBlock;
    const float* x = fetch(lo, len, buf);
    for (int64_t i = 0; i < len; ++i) r = lo + i == 0 ? x[0] : alu_apply(op, r, x[i]);
  }
  return r;
}

/** tensor_reduce's fold of a run of n >= 1 fp32 elements with arithmetic operator `op`. */
template <class Fetch>
float fold(AluOp op, int64_t n, Fetch&& fetch) {
  if (n == 1) {
    float buf[kBlock];
    return fetch(0, 1, buf)[0];
  }
  switch (op) {
    case AluOp::add: {
      // n >= 2: the result comes out of an add, so a NaN becomes the canonical NaN as alu_apply
      // would make it. Canonicalizing once at the end is enough: the raw adds give alu_apply's
      // values whenever no NaN is involved, and a NaN stays NaN through later adds.
      const float s = pairwise_sum(0, n, fetch);
      return s != s ? NAN : s;
    }
    case AluOp::maximum: return extremum(true, n, fetch);
    case AluOp::minimum: return extremum(false, n, fetch);
    default: return sequential(op, n, fetch);
  }
}

}  // namespace nikki::reduction
