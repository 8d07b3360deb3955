// nikki's reduction order (dsl/include/nikki/reduction_order.hpp) against references written here
// from the contract in docs/numerics.md ("Reduction order"), never calling alu.hpp:
//  - add: a recursive pairwise sum in float (numpy's pairwise_sum, transcribed independently);
//  - maximum / minimum: the left-to-right fold that nikki used before, with its NaN and tie rules
//    spelled out, so the reordered fold must reproduce it bit for bit;
//  - other operators: the left-to-right fold.
// Every length from 1 to 3000 is checked, on random data and on data full of NaN, +-0 and +-inf.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "nikki/reduction_order.hpp"
#include "reduction_reference.hpp"

namespace {

using namespace nikki;

using test::kCanonicalNaN;
using test::fold_ref;

uint32_t bits(float v) { return std::bit_cast<uint32_t>(v); }

/** nikki's fold of x, its elements fetched from a buffer of the run (as the interpreter does). */
float fold_of(AluOp op, const std::vector<float>& x) {
  return reduction::fold(op, static_cast<int64_t>(x.size()), [&](int64_t lo, int64_t len, float* buf) {
    std::memcpy(buf, x.data() + lo, len * sizeof(float));
    return static_cast<const float*>(buf);
  });
}

/** Values from a small pool with ties, both zeros, infinities and NaNs of several encodings. */
std::vector<float> tricky(int64_t n, std::mt19937& rng, bool with_nan) {
  const float pool[] = {-0.0f, 0.0f, -0.0f, 0.0f, 1.5f, -1.5f, -3.0f, 2.0f, INFINITY, -INFINITY};
  const uint32_t nans[] = {kCanonicalNaN, 0xffc00000u, 0x7fc01234u, 0x7f800001u /* signaling */};
  std::vector<float> x(n);
  for (float& v : x) {
    const uint32_t r = rng();
    v = with_nan && r % 97 == 0 ? std::bit_cast<float>(nans[(r >> 8) % 4]) : pool[r % 10];
  }
  return x;
}

/** Mostly zeros of both signs below (for maximum) or above (for minimum) the other values, so
 * that the extremum is zero and its sign is the last zero's. */
std::vector<float> zeros_win(int64_t n, std::mt19937& rng, bool is_max) {
  std::vector<float> x(n);
  for (float& v : x) {
    const uint32_t r = rng() % 6;
    v = r < 2 ? -0.0f : r < 4 ? 0.0f : (is_max ? -1.0f : 1.0f) * float(r);
  }
  return x;
}

}  // namespace

TEST_CASE("reduction order: add is numpy's pairwise sum for every length 1..3000") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  int64_t differs_from_sequential = 0;
  for (int64_t n = 1; n <= 3000; ++n) {
    std::vector<float> x(n);
    // magnitudes spread over a few binades, so that the order of the roundings shows in the result
    for (float& v : x) v = normal(rng) * std::ldexp(1.0f, int(rng() % 12));
    const float got = fold_of(AluOp::add, x), want = fold_ref(AluOp::add, x);
    INFO(fmt::format("n {}: got {:#x}, want {:#x}", n, bits(got), bits(want)));
    REQUIRE(bits(got) == bits(want));
    float sequential = x[0];
    for (int64_t i = 1; i < n; ++i) sequential += x[i];
    differs_from_sequential += bits(sequential) != bits(want);
  }
  // the data tells the orders apart, so a left-to-right fold would fail this test
  CHECK(differs_from_sequential > 1000);
}

TEST_CASE("reduction order: add with NaN, infinities and signed zeros") {
  std::mt19937 rng(8);
  for (int64_t n = 1; n <= 3000; n += n < 300 ? 1 : 37) {
    for (bool with_nan : {false, true}) {
      const std::vector<float> x = tricky(n, rng, with_nan);
      const float got = fold_of(AluOp::add, x), want = fold_ref(AluOp::add, x);
      INFO(fmt::format("n {} nan {}: got {:#x}, want {:#x}", n, with_nan, bits(got), bits(want)));
      REQUIRE(bits(got) == bits(want));
    }
  }
  // all negative zeros sum to -0 (the first element seeds the sum; numpy would start from +0)
  CHECK(bits(fold_of(AluOp::add, std::vector<float>(200, -0.0f))) == 0x80000000u);
  // a single element is passed through as it is, NaN payload included
  CHECK(bits(fold_of(AluOp::add, {std::bit_cast<float>(0x7fc01234u)})) == 0x7fc01234u);
  CHECK(bits(fold_of(AluOp::add, {1.0f, std::bit_cast<float>(0xffc01234u)})) == kCanonicalNaN);
  CHECK(bits(fold_of(AluOp::add, {INFINITY, 1.0f, -INFINITY})) == kCanonicalNaN);
}

TEST_CASE("reduction order: maximum and minimum equal the left-to-right fold, NaN and -0/+0 included") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (AluOp op : {AluOp::maximum, AluOp::minimum}) {
    const bool is_max = op == AluOp::maximum;
    for (int64_t n = 1; n <= 3000; ++n) {
      std::vector<std::vector<float>> inputs = {tricky(n, rng, false), tricky(n, rng, true), zeros_win(n, rng, is_max)};
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      inputs.push_back(x);
      for (size_t c = 0; c < inputs.size(); ++c) {
        const float got = fold_of(op, inputs[c]), want = fold_ref(op, inputs[c]);
        INFO(fmt::format("{} n {} data {}: got {:#x}, want {:#x}", is_max ? "max" : "min", n, c, bits(got),
                         bits(want)));
        REQUIRE(bits(got) == bits(want));
      }
    }
  }
  // ties between zeros go to the later one; a NaN anywhere wins, canonical
  CHECK(bits(fold_of(AluOp::maximum, {0.0f, -0.0f})) == 0x80000000u);
  CHECK(bits(fold_of(AluOp::maximum, {-0.0f, 0.0f, -1.0f})) == 0u);
  CHECK(bits(fold_of(AluOp::minimum, {-0.0f, 0.0f})) == 0u);
  CHECK(bits(fold_of(AluOp::maximum, {-INFINITY, -INFINITY})) == bits(-INFINITY));
  CHECK(bits(fold_of(AluOp::minimum, {INFINITY, std::bit_cast<float>(0xffc01234u), -INFINITY})) == kCanonicalNaN);
  std::vector<float> late_nan(1000, 2.0f);
  late_nan[999] = std::bit_cast<float>(0x7f800001u);
  CHECK(bits(fold_of(AluOp::maximum, late_nan)) == kCanonicalNaN);
}

TEST_CASE("reduction order: order-dependent operators fold left to right") {
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> near_one(0.9f, 1.1f);
  for (int64_t n : {1, 2, 7, 8, 9, 127, 128, 129, 257, 1000}) {
    std::vector<float> x(n);
    for (float& v : x) v = near_one(rng);
    for (AluOp op : {AluOp::subtract, AluOp::multiply}) {
      const float got = fold_of(op, x), want = fold_ref(op, x);
      INFO(fmt::format("op {} n {}: got {:#x}, want {:#x}", int(op), n, bits(got), bits(want)));
      CHECK(bits(got) == bits(want));
    }
  }
}
