// Accuracy of nikki's own activation functions (dsl/include/nikki/activation.hpp) against long
// double references (64-bit significands: their own error is far below the fp32 ulps measured
// here), over sweeps of fp32 inputs and the edge cases: overflow and underflow thresholds,
// subnormal inputs and results, +-0, +-inf, NaN.
//
// Error unit: ulps of the fp32 result, |got - exact| / ulp(exact), where ulp(v) is the spacing of
// fp32 values at |v| (2^-149 below the normal range). A correctly rounded result is within 0.5.
// Set NIKKI_ACTIVATION_REPORT=1 to print the measured table (docs/numerics.md quotes it).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "activation_ulp.hpp"
#include "nikki/activation.hpp"

namespace {

using namespace nikki;
using namespace nikki::test;

LD sigmoid_ref(LD x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }
LD softplus_ref(LD x) { return (x > 0 ? x : 0) + std::log1p(std::exp(-std::fabs(x))); }

/** The formulas of docs/numerics.md in long double, with their constants written out here (not
 *  taken from activation.hpp, so a wrong constant there shows as an error). */
LD reference(ActFunc f, LD x) {
  const LD sqrt2_over_pi = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
  const LD gelu_tanh_cubic = 0.044715L, gelu_sigmoid_scale = 1.702L;
  const LD two_over_sqrt_pi = 2.0L / std::sqrt(3.14159265358979323846264338327950288L);
  switch (f) {
    case ActFunc::exp: return std::exp(x);
    case ActFunc::log: return std::log(x);
    case ActFunc::tanh: return std::tanh(x);
    case ActFunc::sigmoid: return sigmoid_ref(x);
    case ActFunc::silu: return x * sigmoid_ref(x);
    case ActFunc::silu_dx: return sigmoid_ref(x) * (1 + x * sigmoid_ref(-x));
    case ActFunc::gelu_apprx_tanh: {
      const LD u = sqrt2_over_pi * (x + gelu_tanh_cubic * x * x * x);
      return x * sigmoid_ref(2 * u);
    }
    case ActFunc::gelu_apprx_sigmoid: return x * sigmoid_ref(gelu_sigmoid_scale * x);
    case ActFunc::gelu_apprx_sigmoid_dx: {
      const LD a = gelu_sigmoid_scale * x;
      return sigmoid_ref(a) * (1 + a * sigmoid_ref(-a));
    }
    case ActFunc::softplus: return softplus_ref(x);
    case ActFunc::mish: return x * std::tanh(softplus_ref(x));
    case ActFunc::erf_dx: return two_over_sqrt_pi * std::exp(-x * x);
    default: return NAN;
  }
}

struct Stats {
  double worst = 0;
  float worst_x = 0;
  int64_t count = 0, not_rounded = 0;
  void add(float x, float got, LD exact) {
    const double err = ulp_error(got, exact);
    ++count;
    not_rounded += std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(static_cast<float>(exact)) &&
                   !(std::isnan(got) && std::isnan(exact));
    if (err > worst) worst = err, worst_x = x;
  }
};

/** Every `stride`-th fp32 bit pattern whose value lies in [lo, hi], negative and positive. */
std::vector<float> sweep(float lo, float hi, uint32_t stride) {
  std::vector<float> xs;
  for (uint64_t b = 0; b <= 0xffffffffull; b += stride) {
    const float x = std::bit_cast<float>(uint32_t(b));
    if (x >= lo && x <= hi) xs.push_back(x);
  }
  return xs;
}

struct Case {
  ActFunc f;
  const char* name;
  float lo, hi;
  double max_ulp;          // worst error allowed (the measured worst, rounded up)
  double max_not_rounded;  // share of results allowed to differ from the correctly rounded ones
};

// Bounds: the worst error measured over these sweeps (and over every 61st fp32 input, run once
// when the functions were written; exp, log and tanh over every fp32 input, with
// nikki_activation_sweep), rounded up. The fp32 functions (exp, log, tanh) are faithfully rounded.
// The double-precision functions are correctly
// rounded but for inputs whose exact value lies within about 2^-40 of a rounding boundary; where
// a formula cancels (silu_dx, gelu_apprx_sigmoid_dx next to their zeros) the double-precision
// evaluation's absolute error is larger relative to the tiny result.
constexpr Case kCases[] = {
    {ActFunc::exp, "exp", -110.0f, 95.0f, 0.90, 0.006},
    {ActFunc::log, "log", 0.0f, kFltMax, 0.83, 0.002},
    {ActFunc::tanh, "tanh", -kFltMax, kFltMax, 0.75, 0.002},
    {ActFunc::sigmoid, "sigmoid", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::silu, "silu", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::silu_dx, "silu_dx", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::gelu_apprx_tanh, "gelu_apprx_tanh", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::gelu_apprx_sigmoid, "gelu_apprx_sigmoid", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::gelu_apprx_sigmoid_dx, "gelu_apprx_sigmoid_dx", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::softplus, "softplus", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::mish, "mish", -kFltMax, kFltMax, 0.5001, 1e-5},
    {ActFunc::erf_dx, "erf_dx", -kFltMax, kFltMax, 0.5001, 1e-5},
};

}  // namespace

TEST_CASE("activation: nikki's exp, log, tanh and sigmoid family against long double over fp32 sweeps") {
  const bool report = std::getenv("NIKKI_ACTIVATION_REPORT") != nullptr;
  // Whole range at a coarse stride, plus [-20, 20] (where the functions vary most) finely.
  std::vector<float> wide = sweep(-kFltMax, kFltMax, 1999), near = sweep(-20.0f, 20.0f, 997);
  for (const Case& c : kCases) {
    Stats s;
    for (const std::vector<float>* xs : {&wide, &near})
      for (float x : *xs)
        if (x >= c.lo && x <= c.hi) s.add(x, activation_apply(c.f, x), reference(c.f, x));
    const double share = double(s.not_rounded) / double(s.count);
    if (report)
      std::printf("%-22s %9lld inputs  worst %.6f ulp at %a  not correctly rounded: %lld (%.2e)\n", c.name,
                  (long long)s.count, s.worst, double(s.worst_x), (long long)s.not_rounded, share);
    INFO(fmt::format("{}: worst {} ulp at {} ({:a}), {} of {} not correctly rounded", c.name, s.worst, s.worst_x,
                     s.worst_x, s.not_rounded, s.count));
    CHECK(s.worst <= c.max_ulp);
    CHECK(share <= c.max_not_rounded);
  }
}

TEST_CASE("activation: fp32 exp, log and tanh are faithfully rounded on random inputs and their seams") {
  // 10^6 random bit patterns (all of the domain, by exponent as much as by value), plus every input
  // next to the places where the evaluation switches: tanh's pieces (0.625, 1.5) and its
  // saturation (9.01), log's reduction boundary (m = 2/3 and 4/3, i.e. x = 2^k * 2/3) and 1.
  std::vector<float> xs;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    xs.push_back(std::bit_cast<float>(uint32_t(state >> 32)));
  }
  const auto around = [&](float c, int count) {
    float up = c, down = c;
    for (int i = 0; i < count; ++i, up = std::nextafter(up, INFINITY), down = std::nextafter(down, -INFINITY))
      xs.insert(xs.end(), {up, down, -up, -down});
  };
  for (float c : {0.625f, 1.5f, 0x1.205968p3f, 1.0f, 0x1p-126f}) around(c, 20000);
  for (int k = -149; k <= 127; ++k) around(std::ldexp(2.0f / 3.0f, k), 200);
  for (ActFunc f : {ActFunc::exp, ActFunc::log, ActFunc::tanh}) {
    Stats s;
    for (float x : xs) s.add(x, activation_apply(f, x), reference(f, x));
    INFO(fmt::format("{}: worst {} ulp at {:a}, {} of {} not correctly rounded", int(f), s.worst, s.worst_x,
                     s.not_rounded, s.count));
    CHECK(s.worst < 1.0);
  }
}

TEST_CASE("activation: exp at its thresholds, subnormals, zeros, infinities and NaN") {
  const auto exp = [](float x) { return activation_apply(ActFunc::exp, x); };
  const auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  CHECK(bits(exp(0.0f)) == bits(1.0f));
  CHECK(bits(exp(-0.0f)) == bits(1.0f));
  CHECK(bits(exp(std::numeric_limits<float>::denorm_min())) == bits(1.0f));
  CHECK(bits(exp(-std::numeric_limits<float>::denorm_min())) == bits(1.0f));
  CHECK(bits(exp(INFINITY)) == bits(INFINITY));
  CHECK(bits(exp(-INFINITY)) == bits(0.0f));
  CHECK(bits(exp(NAN)) == 0x7fc00000u);
  CHECK(bits(exp(-NAN)) == 0x7fc00000u);
  CHECK(bits(exp(std::bit_cast<float>(0x7f800001u))) == 0x7fc00000u);  // signalling NaN
  // The overflow threshold is exact: the last input whose e^x rounds to a finite float, the next.
  const float last_finite = 0x1.62e42ep6f;
  CHECK(exp(last_finite) == static_cast<float>(std::exp(LD(last_finite))));
  CHECK(std::isfinite(exp(last_finite)));
  CHECK(bits(exp(std::nextafter(last_finite, INFINITY))) == bits(INFINITY));
  CHECK(bits(exp(1000.0f)) == bits(INFINITY));
  // Every input around the subnormal boundary and the underflow to zero, within one ulp.
  for (float start : {-87.5f, -103.5f}) {
    float x = start;
    for (int i = 0; i < 200000; ++i, x = std::nextafter(x, -INFINITY)) {
      INFO(fmt::format("exp({:a}) = {:a}", x, exp(x)));
      REQUIRE(ulp_error(exp(x), std::exp(LD(x))) <= 1.0);
    }
  }
  CHECK(bits(exp(-104.0f)) == bits(0.0f));
  CHECK(bits(exp(-1e30f)) == bits(0.0f));
}

TEST_CASE("activation: special values of log, tanh and the double-precision functions") {
  const auto act = [](ActFunc f, float x) { return std::bit_cast<uint32_t>(activation_apply(f, x)); };
  const auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  const float denorm = std::numeric_limits<float>::denorm_min();
  // log: zeros, negatives, infinity, subnormal inputs (scaled into the normal range), exactly 1
  // and powers of two (k ln 2 alone, correctly rounded)
  CHECK(act(ActFunc::log, 0.0f) == bits(-INFINITY));
  CHECK(act(ActFunc::log, -0.0f) == bits(-INFINITY));
  CHECK(act(ActFunc::log, -1.0f) == 0x7fc00000u);
  CHECK(act(ActFunc::log, -INFINITY) == 0x7fc00000u);
  CHECK(act(ActFunc::log, INFINITY) == bits(INFINITY));
  CHECK(act(ActFunc::log, NAN) == 0x7fc00000u);
  CHECK(act(ActFunc::log, 1.0f) == bits(0.0f));
  CHECK(act(ActFunc::log, denorm) == bits(static_cast<float>(std::log(LD(denorm)))));
  CHECK(act(ActFunc::log, kFltMax) == bits(static_cast<float>(std::log(LD(kFltMax)))));
  CHECK(act(ActFunc::log, 0x1p-149f) == bits(static_cast<float>(std::log(LD(0x1p-149f)))));
  CHECK(act(ActFunc::log, 2.0f) == bits(static_cast<float>(std::log(2.0L))));
  CHECK(act(ActFunc::log, 0.5f) == bits(static_cast<float>(std::log(0.5L))));
  CHECK(act(ActFunc::log, std::bit_cast<float>(0x80000001u)) == 0x7fc00000u);  // -denorm_min
  CHECK(act(ActFunc::log, -NAN) == 0x7fc00000u);
  // tanh: signed zeros, tiny arguments (tanh x = x), saturation
  CHECK(act(ActFunc::tanh, 0.0f) == bits(0.0f));
  CHECK(act(ActFunc::tanh, -0.0f) == bits(-0.0f));
  CHECK(act(ActFunc::tanh, denorm) == bits(denorm));
  CHECK(act(ActFunc::tanh, -1e-20f) == bits(-1e-20f));
  CHECK(act(ActFunc::tanh, INFINITY) == bits(1.0f));
  CHECK(act(ActFunc::tanh, -INFINITY) == bits(-1.0f));
  CHECK(act(ActFunc::tanh, 10.0f) == bits(1.0f));
  CHECK(act(ActFunc::tanh, -10.0f) == bits(-1.0f));
  CHECK(act(ActFunc::tanh, kFltMax) == bits(1.0f));
  CHECK(act(ActFunc::tanh, -denorm) == bits(-denorm));
  // saturation: the last input whose tanh rounds below 1, and the first that rounds to 1
  CHECK(activation_apply(ActFunc::tanh, 0x1.205966p3f) < 1.0f);
  CHECK(act(ActFunc::tanh, 0x1.205968p3f) == bits(1.0f));
  CHECK(act(ActFunc::tanh, -NAN) == 0x7fc00000u);
  CHECK(act(ActFunc::tanh, NAN) == 0x7fc00000u);
  // sigmoid: the limits, and a subnormal result (e^-100) that 1 / (1 + e^100) would lose
  CHECK(act(ActFunc::sigmoid, INFINITY) == bits(1.0f));
  CHECK(act(ActFunc::sigmoid, -INFINITY) == bits(0.0f));
  CHECK(act(ActFunc::sigmoid, 0.0f) == bits(0.5f));
  CHECK(act(ActFunc::sigmoid, -100.0f) == bits(static_cast<float>(std::exp(LD(-100)))));
  CHECK(activation_apply(ActFunc::sigmoid, -100.0f) > 0.0f);
  CHECK(act(ActFunc::sigmoid, -200.0f) == bits(0.0f));
  // silu / gelu_apprx_tanh far left: tiny negative results, not 0 from a cancelled 1 + tanh(u)
  CHECK(activation_apply(ActFunc::silu, -90.0f) < 0.0f);
  CHECK(act(ActFunc::gelu_apprx_tanh, -5.0f) == bits(static_cast<float>(reference(ActFunc::gelu_apprx_tanh, -5.0L))));
  CHECK(activation_apply(ActFunc::gelu_apprx_tanh, -9.0f) < 0.0f);
  CHECK(act(ActFunc::gelu_apprx_tanh, INFINITY) == bits(INFINITY));
  // softplus: large arguments are x itself, small ones e^x (no cancellation in log1p)
  CHECK(act(ActFunc::softplus, 100.0f) == bits(100.0f));
  CHECK(act(ActFunc::softplus, -30.0f) == bits(static_cast<float>(softplus_ref(-30.0L))));
  CHECK(act(ActFunc::softplus, INFINITY) == bits(INFINITY));
  CHECK(act(ActFunc::softplus, -INFINITY) == bits(0.0f));
  // every computed NaN is the canonical one, whatever the input NaN
  for (ActFunc f : {ActFunc::sigmoid, ActFunc::silu, ActFunc::softplus, ActFunc::mish, ActFunc::erf_dx,
                    ActFunc::gelu_apprx_tanh, ActFunc::gelu_apprx_sigmoid_dx})
    CHECK(act(f, -NAN) == 0x7fc00000u);
}
