// Tests of nikki/numerics.hpp (and element_stores.hpp) against independent reference computations.
//
// The references here never call the code under test: values come from sign/exponent/mantissa
// fields through std::ldexp, rounding from a brute-force nearest-value search over a sorted table
// of every representable value (in double, where all of these values and midpoints are exact), and
// tf32/integer rounding from double arithmetic. Every bit pattern of the 8- and 16-bit formats is
// decoded and (when finite) re-encoded, every midpoint between neighbours is probed, and a few
// million random fp32 inputs per format are rounded both ways.
#include <doctest/doctest.h>

#include <nikki/element_stores.hpp>
#include <nikki/numerics.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace nikki;
using namespace nikki::numerics;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string describe(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (%s)", static_cast<double>(f), hex(bits_of(f)).c_str());
  return buf;
}

// Collects mismatches of a long loop and reports the first few, so that a loop of millions of
// comparisons costs one assertion instead of millions.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  void add(const std::string& message) {
    if (count_++ < kShown) FAIL_CHECK(what_ << ": " << message);
  }
  ~Mismatches() { CHECK_MESSAGE(count_ == 0, what_ << ": " << count_ << " mismatches"); }

 private:
  static constexpr int kShown = 8;
  std::string what_;
  long count_ = 0;
};

// ------------------------------------------------------------------------------------------------
// Reference model of a small float format, built from its field layout only.
// ------------------------------------------------------------------------------------------------

struct Format {
  const char* name;
  int exp_bits;
  int man_bits;
  int bias;
  bool has_inf;  // IEEE-like specials; otherwise only S.1..1.1..1 is NaN ("fn")
  // Documented results of the code under test for special inputs.
  uint32_t canonical_nan;  // positive; the negative one has the sign bit set
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);

  int bits() const { return 1 + exp_bits + man_bits; }
  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  uint32_t pattern_count() const { return 1u << bits(); }
};

const Format kBf16{"bfloat16", 8, 7, 127, true, 0x7fc0,
                   [](float v) -> uint32_t { return bf16_from_float(v); },
                   [](uint32_t p) { return bf16_to_float(uint16_t(p)); }};
const Format kFp16{"float16", 5, 10, 15, true, 0x7e00,
                   [](float v) -> uint32_t { return fp16_from_float(v); },
                   [](uint32_t p) { return fp16_to_float(uint16_t(p)); }};
const Format kE4M3{"float8_e4m3", 4, 3, 7, true, 0x7c,
                   [](float v) -> uint32_t { return fp8_e4m3_from_float(v); },
                   [](uint32_t p) { return fp8_e4m3_to_float(uint8_t(p)); }};
const Format kE4M3FN{"float8_e4m3fn", 4, 3, 7, false, 0x7f,
                     [](float v) -> uint32_t { return fp8_e4m3fn_from_float(v); },
                     [](uint32_t p) { return fp8_e4m3fn_to_float(uint8_t(p)); }};
const Format kE5M2{"float8_e5m2", 5, 2, 15, true, 0x7e,
                   [](float v) -> uint32_t { return fp8_e5m2_from_float(v); },
                   [](uint32_t p) { return fp8_e5m2_to_float(uint8_t(p)); }};

const std::array<const Format*, 5> kFormats = {&kBf16, &kFp16, &kE4M3, &kE4M3FN, &kE5M2};

enum class Kind { finite, inf, nan };

struct RefValue {
  Kind kind;
  bool negative;
  double magnitude;  // finite only
};

// The value of a bit pattern, straight from its fields.
RefValue ref_decode(const Format& f, uint32_t pattern) {
  const bool negative = (pattern & f.sign_bit()) != 0;
  const int exp = int(pattern >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int man = int(pattern) & ((1 << f.man_bits) - 1);
  const int exp_all_ones = (1 << f.exp_bits) - 1;
  const int man_all_ones = (1 << f.man_bits) - 1;
  if (f.has_inf && exp == exp_all_ones) return {man == 0 ? Kind::inf : Kind::nan, negative, 0};
  if (!f.has_inf && exp == exp_all_ones && man == man_all_ones) return {Kind::nan, negative, 0};
  // Subnormals scale the bare mantissa from the smallest normal exponent; normals add the
  // implicit leading 1.
  const double significand = exp == 0 ? double(man) : double((1 << f.man_bits) + man);
  const int scale = (exp == 0 ? 1 : exp) - f.bias - f.man_bits;
  const double magnitude = std::ldexp(significand, scale);
  return {Kind::finite, negative, magnitude};
}

// Every non-negative finite value of a format in increasing order, plus one "virtual" entry one
// step past the largest: rounding treats the exponent range as unbounded, and an input that
// rounds to the virtual value overflows. Ties go to the neighbour whose last mantissa bit is 0.
struct Table {
  struct Entry {
    double value;
    uint32_t pattern;  // for the virtual entry: the pattern an overflow produces
    bool odd;          // last mantissa bit
  };
  std::vector<Entry> entries;
  std::vector<double> values;  // entries[i].value, for lower_bound

  const Entry& overflow() const { return entries.back(); }
};

Table build_table(const Format& f) {
  Table table;
  for (uint32_t p = 0; p < f.sign_bit(); ++p) {
    const RefValue r = ref_decode(f, p);
    if (r.kind == Kind::finite) table.entries.push_back({r.magnitude, p, (p & 1u) != 0});
  }
  std::sort(table.entries.begin(), table.entries.end(),
            [](const auto& a, const auto& b) { return a.value < b.value; });
  const Table::Entry top = table.entries.back();
  const Table::Entry below_top = table.entries[table.entries.size() - 2];
  // The next value past the maximum, had the format one more exponent, is one more top-binade
  // step; its last mantissa bit is that of the pattern following the maximum's.
  const uint32_t next_pattern = top.pattern + 1;
  const uint32_t overflow_pattern =
      f.has_inf ? uint32_t(((1 << f.exp_bits) - 1) << f.man_bits) : f.canonical_nan;
  table.entries.push_back(
      {top.value + (top.value - below_top.value), overflow_pattern, (next_pattern & 1u) != 0});
  for (const auto& e : table.entries) table.values.push_back(e.value);
  return table;
}

const Table& table_for(const Format& f) {
  static const std::array<Table, kFormats.size()> tables = [] {
    std::array<Table, kFormats.size()> built;
    for (size_t i = 0; i < kFormats.size(); ++i) built[i] = build_table(*kFormats[i]);
    return built;
  }();
  return tables[size_t(std::find(kFormats.begin(), kFormats.end(), &f) - kFormats.begin())];
}

// Brute-force nearest representable value with ties to even, for a non-NaN input.
uint32_t ref_encode(const Format& f, const Table& table, float x) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0u;
  const double a = std::fabs(double(x));
  if (std::isinf(a) || a >= table.overflow().value) return sign | table.overflow().pattern;
  const auto it = std::lower_bound(table.values.begin(), table.values.end(), a);
  const size_t hi = size_t(it - table.values.begin());
  if (table.values[hi] == a) return sign | table.entries[hi].pattern;
  const Table::Entry& lower = table.entries[hi - 1];
  const Table::Entry& upper = table.entries[hi];
  const double below = a - lower.value;
  const double above = upper.value - a;
  const Table::Entry& tie = lower.odd ? upper : lower;
  const Table::Entry& pick = below < above ? lower : above < below ? upper : tie;
  return sign | pick.pattern;
}

// A random fp32 whose magnitude lies around the format's range (a few binades past each end),
// with a random sign and a random full-width mantissa.
float random_in_range(const Format& f, std::mt19937_64& rng) {
  const int lowest = 1 - f.bias - f.man_bits - 3;         // below the smallest subnormal
  const int highest = (1 << f.exp_bits) - 1 - f.bias + 2;  // above the largest finite
  const int exp = std::clamp(lowest + int(rng() % uint64_t(highest - lowest + 1)), -149, 127);
  const uint32_t mantissa = uint32_t(rng()) & 0x7f'ffffu;
  const float x = std::ldexp(1.0f + float(mantissa) * 0x1p-23f, exp);
  return (rng() & 1u) ? -x : x;
}

// ------------------------------------------------------------------------------------------------
// The 8- and 16-bit formats.
// ------------------------------------------------------------------------------------------------

TEST_CASE("numerics: decode every bit pattern from its fields") {
  for (const Format* f : kFormats) {
    SUBCASE(f->name) {
      Mismatches bad(std::string("decode ") + f->name);
      for (uint32_t p = 0; p < f->pattern_count(); ++p) {
        const RefValue r = ref_decode(*f, p);
        const float got = f->decode(p);
        bool ok = std::signbit(got) == r.negative;
        if (r.kind == Kind::nan) ok = ok && std::isnan(got);
        else if (r.kind == Kind::inf) ok = ok && std::isinf(got);
        else ok = ok && bits_of(got) == bits_of(float(r.negative ? -r.magnitude : r.magnitude));
        if (!ok) bad.add(hex(p) + " decoded to " + describe(got));
      }
    }
  }
}

TEST_CASE("numerics: decoded NaNs follow the documented choice") {
  SUBCASE("bfloat16 and float16 widen the payload exactly") {
    for (uint32_t p : {0x7f81u, 0xff81u, 0x7fc0u, 0x7fffu, 0xffc1u})
      CHECK(bits_of(bf16_to_float(uint16_t(p))) == p << 16);
    for (uint32_t p : {0x7c01u, 0xfc01u, 0x7e00u, 0x7fffu}) {
      const uint32_t sign = (p & 0x8000u) << 16;
      CHECK(bits_of(fp16_to_float(uint16_t(p))) == (sign | 0x7f80'0000u | ((p & 0x3ffu) << 13)));
    }
  }
  SUBCASE("fp8 NaNs read as the fp32 quiet NaN with their sign") {
    for (const Format* f : {&kE4M3, &kE4M3FN, &kE5M2}) {
      for (uint32_t p = 0; p < 256; ++p) {
        if (ref_decode(*f, p).kind != Kind::nan) continue;
        CAPTURE(f->name);
        CAPTURE(p);
        CHECK(bits_of(f->decode(p)) == (((p & 0x80u) << 24) | 0x7fc0'0000u));
      }
    }
  }
}

TEST_CASE("numerics: every finite value encodes to its own pattern") {
  for (const Format* f : kFormats) {
    SUBCASE(f->name) {
      Mismatches bad(std::string("round trip ") + f->name);
      for (uint32_t p = 0; p < f->pattern_count(); ++p) {
        const RefValue r = ref_decode(*f, p);
        if (r.kind != Kind::finite) continue;
        const float x = float(r.negative ? -r.magnitude : r.magnitude);  // exact
        const uint32_t got = f->encode(x);
        if (got != p) bad.add(describe(x) + " encoded to " + hex(got) + ", want " + hex(p));
      }
      CHECK(f->encode(0.0f) == 0u);
      CHECK(f->encode(-0.0f) == f->sign_bit());
    }
  }
}

TEST_CASE("numerics: midpoints round to even, their neighbours to the nearer value") {
  for (const Format* f : kFormats) {
    SUBCASE(f->name) {
      const Table& table = table_for(*f);
      Mismatches bad(std::string("midpoints ") + f->name);
      for (size_t i = 0; i + 1 < table.entries.size(); ++i) {
        const Table::Entry& lower = table.entries[i];
        const Table::Entry& upper = table.entries[i + 1];
        const double mid = (lower.value + upper.value) / 2;
        const float mid_f = float(mid);
        REQUIRE(double(mid_f) == mid);  // every midpoint here is an fp32 value
        const uint32_t even = lower.odd ? upper.pattern : lower.pattern;
        const float above = std::nextafter(mid_f, kInf);
        const float below = std::nextafter(mid_f, 0.0f);
        for (const uint32_t sign : {0u, f->sign_bit()}) {
          const float s = sign ? -1.0f : 1.0f;
          const auto expect = [&](float x, uint32_t want) {
            const uint32_t got = f->encode(s * x);
            if (got != (sign | want))
              bad.add(describe(s * x) + " encoded to " + hex(got) + ", want " + hex(sign | want));
          };
          expect(mid_f, even);
          expect(above, upper.pattern);
          expect(below, lower.pattern);
        }
      }
    }
  }
}

TEST_CASE("numerics: overflow thresholds and special inputs") {
  // The documented per-format rule: IEEE-like formats overflow to inf at max + half a step (a tie
  // rounds to the even "next binade", which is inf); float8_e4m3fn's tie goes to 448 (mantissa
  // 110 is even) and anything above becomes NaN.
  struct Case {
    const Format* f;
    float max_finite;
    float threshold;  // smallest input (as a midpoint) that no longer rounds to max_finite
    bool tie_overflows;
  };
  const Case cases[] = {
      {&kBf16, 0x1.fep127f, 0x1.ffp127f, true},
      {&kFp16, 65504.0f, 65520.0f, true},
      {&kE4M3, 240.0f, 248.0f, true},
      {&kE4M3FN, 448.0f, 464.0f, false},
      {&kE5M2, 57344.0f, 61440.0f, true},
  };
  for (const Case& c : cases) {
    SUBCASE(c.f->name) {
      const Format& f = *c.f;
      const uint32_t max_pattern = f.encode(c.max_finite);
      REQUIRE(ref_decode(f, max_pattern).kind == Kind::finite);
      CHECK(ref_decode(f, max_pattern).magnitude == double(c.max_finite));
      CHECK(ref_decode(f, max_pattern + 1).kind != Kind::finite);  // nothing larger is finite

      const uint32_t overflow = f.has_inf ? uint32_t(((1 << f.exp_bits) - 1) << f.man_bits)
                                          : f.canonical_nan;
      for (const float s : {1.0f, -1.0f}) {
        const uint32_t sign = s < 0 ? f.sign_bit() : 0u;
        CAPTURE(s);
        CHECK(f.encode(s * std::nextafter(c.threshold, 0.0f)) == (sign | max_pattern));
        CHECK(f.encode(s * c.threshold) == (sign | (c.tie_overflows ? overflow : max_pattern)));
        CHECK(f.encode(s * std::nextafter(c.threshold, kInf)) == (sign | overflow));
        CHECK(f.encode(s * 2 * c.threshold) == (sign | overflow));  // inf for bfloat16
        CHECK(f.encode(s * std::numeric_limits<float>::max()) == (sign | overflow));
        CHECK(f.encode(s * kInf) == (sign | overflow));
      }
      if (f.has_inf) {
        CHECK(std::isinf(f.decode(overflow)));
      } else {
        CHECK(std::isnan(f.decode(overflow)));
      }
    }
  }
}

TEST_CASE("numerics: NaN inputs give the canonical quiet NaN with their sign") {
  const uint32_t nans[] = {0x7fc0'0000u, 0x7f80'0001u, 0x7fbf'ffffu, 0x7fff'ffffu, 0x7f81'2345u,
                           0x7fa0'0000u};
  for (const Format* f : kFormats) {
    SUBCASE(f->name) {
      for (const uint32_t nan_bits : nans) {
        for (const uint32_t sign : {0u, 0x8000'0000u}) {
          const float x = float_of(nan_bits | sign);
          CAPTURE(hex(nan_bits | sign));
          const uint32_t got = f->encode(x);
          CHECK(got == ((sign ? f->sign_bit() : 0u) | f->canonical_nan));
          CHECK(ref_decode(*f, got).kind == Kind::nan);
        }
      }
    }
  }
}

TEST_CASE("numerics: random fp32 inputs round to the brute-force nearest value") {
  constexpr int kSamplesPerFormat = 2'000'000;
  for (const Format* f : kFormats) {
    SUBCASE(f->name) {
      const Table& table = table_for(*f);
      std::mt19937_64 rng(0x6e696b6b69ull + uint64_t(f->bits()) * 31 + uint64_t(f->bias));
      Mismatches bad(std::string("random ") + f->name);
      for (int i = 0; i < kSamplesPerFormat; ++i) {
        // Half uniform over all fp32 bit patterns, half concentrated on the format's range.
        const float x = (i & 1) ? float_of(uint32_t(rng())) : random_in_range(*f, rng);
        const uint32_t got = f->encode(x);
        if (std::isnan(x)) {
          if (ref_decode(*f, got).kind != Kind::nan) bad.add(describe(x) + " lost its NaN");
          continue;
        }
        const uint32_t want = ref_encode(*f, table, x);
        if (got != want) bad.add(describe(x) + " encoded to " + hex(got) + ", want " + hex(want));
      }
    }
  }
}

TEST_CASE("numerics: subnormals are kept, not flushed") {
  CHECK(fp16_from_float(0x1p-24f) == 0x0001);            // smallest fp16 subnormal
  CHECK(fp16_from_float(0x1p-25f) == 0x0000);            // half of it: tie to even (zero)
  CHECK(fp16_from_float(0x1.000002p-25f) == 0x0001);     // just above the tie
  CHECK(fp16_from_float(-0x1.8p-24f) == 0x8002);         // 1.5 ulps: tie to even (2)
  CHECK(fp16_to_float(0x03ff) == 0x1.ff8p-15f);          // largest subnormal
  CHECK(bf16_from_float(0x1p-133f) == 0x0001);           // smallest bf16 subnormal
  CHECK(bf16_from_float(0x1p-149f) == 0x0000);           // fp32 subnormal below bf16's range
  CHECK(bf16_to_float(0x0001) == 0x1p-133f);
  CHECK(fp8_e4m3_from_float(0x1p-9f) == 0x01);
  CHECK(fp8_e4m3fn_to_float(0x07) == 0x1.cp-7f);
  CHECK(fp8_e5m2_from_float(-0x1p-16f) == 0x81);
  CHECK(fp8_e5m2_from_float(0x1p-17f) == 0x00);          // tie to even (zero)
  CHECK(tf32_round(0x1p-149f) == 0.0f);                  // below half a tf32 subnormal step
  CHECK(tf32_round(0x1p-136f) == 0x1p-136f);             // smallest tf32 subnormal
}

// ------------------------------------------------------------------------------------------------
// tfloat32
// ------------------------------------------------------------------------------------------------

// Round a finite fp32 to 11 significant bits (10 stored) in double arithmetic: divide by the tf32
// step of the input's binade, round to the nearest integer (ties to even), multiply back.
float ref_tf32(float x) {
  if (x == 0.0f) return x;
  const int exp = std::max(std::ilogb(x), -126);  // fp32 subnormals share the -126 binade's step
  const double step = std::ldexp(1.0, exp - 10);
  const double r = std::nearbyint(double(x) / step) * step;
  if (std::fabs(r) >= 0x1p128) return std::copysign(kInf, x);
  return float(r) == 0.0f ? std::copysign(0.0f, x) : float(r);
}

TEST_CASE("numerics: tfloat32 rounding") {
  SUBCASE("ties and their neighbours") {
    const float step = 0x1p-10f;  // tf32 step in [1, 2)
    CHECK(tf32_round(1.0f + step / 2) == 1.0f);                         // tie, 1.0 is even
    CHECK(tf32_round(std::nextafter(1.0f + step / 2, 2.0f)) == 1.0f + step);
    CHECK(tf32_round(1.0f + 3 * step / 2) == 1.0f + 2 * step);          // tie, goes up to even
    CHECK(tf32_round(std::nextafter(1.0f + 3 * step / 2, 0.0f)) == 1.0f + step);
    CHECK(tf32_round(-(1.0f + 3 * step / 2)) == -(1.0f + 2 * step));
    CHECK(tf32_round(0x1.ffep0f) == 2.0f);                              // carries into exponent
    CHECK(tf32_round(0x1.3fep-128f) == 0x1.4p-128f);                    // subnormal tie to even
  }
  SUBCASE("results keep only 10 mantissa bits") {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 1000; ++i) {
      const float x = float_of(uint32_t(rng()));
      if (!std::isnan(x)) CHECK((bits_of(tf32_round(x)) & 0x1fffu) == 0u);
    }
  }
  SUBCASE("overflow, infinities, zeros, NaN") {
    const float max_tf32 = 0x1.ffcp127f;
    CHECK(tf32_round(max_tf32) == max_tf32);
    CHECK(tf32_round(std::nextafter(0x1.ffep127f, 0.0f)) == max_tf32);
    CHECK(tf32_round(0x1.ffep127f) == kInf);  // tie: the even neighbour is 2^128
    CHECK(tf32_round(-std::numeric_limits<float>::max()) == -kInf);
    CHECK(tf32_round(kInf) == kInf);
    CHECK(tf32_round(-kInf) == -kInf);
    CHECK(bits_of(tf32_round(-0.0f)) == 0x8000'0000u);
    CHECK(bits_of(tf32_round(kNaN)) == 0x7fc0'0000u);
    CHECK(bits_of(tf32_round(float_of(0xff80'0001u))) == 0xffc0'0000u);
    CHECK(bits_of(tf32_round(float_of(0x7f80'1000u))) == 0x7fc0'0000u);  // would round to inf
  }
  SUBCASE("random inputs against double arithmetic") {
    std::mt19937_64 rng(0x7f32);
    Mismatches bad("tf32 random");
    for (int i = 0; i < 1'000'000; ++i) {
      const float x = float_of(uint32_t(rng()));
      if (std::isnan(x)) continue;
      const float got = tf32_round(x);
      const float want = ref_tf32(x);
      if (bits_of(got) != bits_of(want))
        bad.add(describe(x) + " rounded to " + describe(got) + ", want " + describe(want));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Float -> integer
// ------------------------------------------------------------------------------------------------

// Truncate, saturate, NaN -> 0, computed in double.
template <class I>
I ref_int(float x) {
  if (std::isnan(x)) return 0;
  const double t = std::trunc(double(x));
  if (t <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (t >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(t);
}

template <class I>
void check_random_ints(I (*convert)(float), const char* name) {
  std::mt19937_64 rng(0x1e7);
  Mismatches bad(std::string("random ") + name);
  const double span = double(std::numeric_limits<I>::max()) * 1.5 + 10;
  for (int i = 0; i < 200'000; ++i) {
    // Alternate values spread over (and past) the range with arbitrary fp32 bit patterns.
    const float x = (i & 1) ? float_of(uint32_t(rng()))
                            : float((double(rng() % 2'000'001) / 1'000'000.0 - 1.0) * span);
    const I got = convert(x);
    const I want = ref_int<I>(x);
    if (got != want)
      bad.add(describe(x) + " -> " + std::to_string(got) + ", want " + std::to_string(want));
  }
}

TEST_CASE("numerics: float to integer truncates, saturates and sends NaN to 0") {
  SUBCASE("int8") {
    CHECK(int8_from_float(2.5f) == 2);
    CHECK(int8_from_float(-2.5f) == -2);
    CHECK(int8_from_float(0.999f) == 0);
    CHECK(int8_from_float(-0.999f) == 0);
    CHECK(int8_from_float(127.9f) == 127);
    CHECK(int8_from_float(128.0f) == 127);
    CHECK(int8_from_float(-128.9f) == -128);
    CHECK(int8_from_float(-129.0f) == -128);
    CHECK(int8_from_float(1e30f) == 127);
    CHECK(int8_from_float(kInf) == 127);
    CHECK(int8_from_float(-kInf) == -128);
    CHECK(int8_from_float(kNaN) == 0);
    CHECK(int8_from_float(-kNaN) == 0);
    check_random_ints<int8_t>(int8_from_float, "int8");
  }
  SUBCASE("int16") {
    CHECK(int16_from_float(32767.5f) == 32767);
    CHECK(int16_from_float(32768.0f) == 32767);
    CHECK(int16_from_float(-32768.5f) == -32768);
    CHECK(int16_from_float(-40000.0f) == -32768);
    CHECK(int16_from_float(-1.5f) == -1);
    CHECK(int16_from_float(kNaN) == 0);
    check_random_ints<int16_t>(int16_from_float, "int16");
  }
  SUBCASE("int32") {
    CHECK(int32_from_float(2147483520.0f) == 2147483520);  // largest fp32 below 2^31
    CHECK(int32_from_float(2147483648.0f) == std::numeric_limits<int32_t>::max());
    CHECK(int32_from_float(-2147483648.0f) == std::numeric_limits<int32_t>::min());
    CHECK(int32_from_float(-2147483904.0f) == std::numeric_limits<int32_t>::min());
    CHECK(int32_from_float(16777217.0f) == 16777216);  // the float itself is 2^24
    CHECK(int32_from_float(-7.9f) == -7);
    CHECK(int32_from_float(kInf) == std::numeric_limits<int32_t>::max());
    CHECK(int32_from_float(-kInf) == std::numeric_limits<int32_t>::min());
    CHECK(int32_from_float(kNaN) == 0);
    check_random_ints<int32_t>(int32_from_float, "int32");
  }
  SUBCASE("unsigned: negative values give 0") {
    CHECK(uint8_from_float(-1.0f) == 0);
    CHECK(uint8_from_float(-0.5f) == 0);
    CHECK(uint8_from_float(-kInf) == 0);
    CHECK(uint8_from_float(255.9f) == 255);
    CHECK(uint8_from_float(256.0f) == 255);
    CHECK(uint8_from_float(kNaN) == 0);
    CHECK(uint16_from_float(-3.0f) == 0);
    CHECK(uint16_from_float(65535.5f) == 65535);
    CHECK(uint16_from_float(65536.0f) == 65535);
    CHECK(uint32_from_float(-1.0f) == 0u);
    CHECK(uint32_from_float(4294967040.0f) == 4294967040u);  // largest fp32 below 2^32
    CHECK(uint32_from_float(4294967296.0f) == std::numeric_limits<uint32_t>::max());
    CHECK(uint32_from_float(3e9f) == 3000000000u);
    CHECK(uint32_from_float(kInf) == std::numeric_limits<uint32_t>::max());
    CHECK(uint32_from_float(kNaN) == 0u);
    check_random_ints<uint8_t>(uint8_from_float, "uint8");
    check_random_ints<uint16_t>(uint16_from_float, "uint16");
    check_random_ints<uint32_t>(uint32_from_float, "uint32");
  }
  SUBCASE("bool_") {
    CHECK(bool_from_float(0.0f) == 0);
    CHECK(bool_from_float(-0.0f) == 0);
    CHECK(bool_from_float(0x1p-149f) == 1);
    CHECK(bool_from_float(-3.0f) == 1);
    CHECK(bool_from_float(kInf) == 1);
    CHECK(bool_from_float(kNaN) == 1);
  }
}

// ------------------------------------------------------------------------------------------------
// Generic access by dtype
// ------------------------------------------------------------------------------------------------

constexpr std::array<DType, kNumDTypes> kAllDTypes = {
    DType::float32, DType::bfloat16, DType::float16, DType::tfloat32, DType::float8_e4m3,
    DType::float8_e4m3fn, DType::float8_e5m2, DType::int8, DType::int16, DType::int32,
    DType::uint8, DType::uint16, DType::uint32, DType::bool_};

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

TEST_CASE("numerics: store_float then load_float gives round_to, and writes only the element") {
  std::mt19937_64 rng(42);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.5f, -2.5f, 100.7f, 240.0f,
                               250.0f, 448.0f, 500.0f, 65504.0f, 70000.0f, 3e9f, -3e9f, 1e-8f,
                               0x1p-149f, kInf, -kInf, kNaN, -kNaN, 16777217.0f};
  for (int i = 0; i < 2000; ++i) values.push_back(float_of(uint32_t(rng())));
  for (int i = 0; i < 2000; ++i)
    values.push_back(float(double(int64_t(rng() % 2'000'001) - 1'000'000) / 7.0));  // near integers
  for (const DType t : kAllDTypes) {
    CAPTURE(dtype_name(t));
    const size_t size = dtype_size(t);
    Mismatches bad(std::string("store/load ") + std::string(dtype_name(t)));
    for (const float v : values) {
      std::array<uint8_t, 8> buf;
      buf.fill(0xa5);
      store_float(t, buf.data(), v);
      const float back = load_float(t, buf.data());
      if (!same_float(back, round_to(t, v)))
        bad.add(describe(v) + " read back as " + describe(back) + ", round_to gives " +
                describe(round_to(t, v)));
      if (std::any_of(buf.begin() + long(size), buf.end(), [](uint8_t b) { return b != 0xa5; }))
        bad.add(describe(v) + " wrote past the element");
      // Reading back and storing again changes nothing: round_to is idempotent.
      if (!same_float(round_to(t, back), back)) bad.add(describe(v) + " is not a fixed point");
    }
  }
}

TEST_CASE("numerics: store_float writes the per-format encoding") {
  std::array<uint8_t, 4> buf{};
  const float v = -1234.5678f;
  uint16_t u16 = 0;
  store_float(DType::bfloat16, buf.data(), v);
  std::memcpy(&u16, buf.data(), 2);
  CHECK(u16 == bf16_from_float(v));
  store_float(DType::float16, buf.data(), v);
  std::memcpy(&u16, buf.data(), 2);
  CHECK(u16 == fp16_from_float(v));
  store_float(DType::float8_e4m3, buf.data(), 3.3f);
  CHECK(buf[0] == fp8_e4m3_from_float(3.3f));
  store_float(DType::float8_e4m3fn, buf.data(), 3.3f);
  CHECK(buf[0] == fp8_e4m3fn_from_float(3.3f));
  store_float(DType::float8_e5m2, buf.data(), 3.3f);
  CHECK(buf[0] == fp8_e5m2_from_float(3.3f));
  uint32_t u32 = 0;
  store_float(DType::tfloat32, buf.data(), v);
  std::memcpy(&u32, buf.data(), 4);
  CHECK(u32 == bits_of(tf32_round(v)));
  store_float(DType::float32, buf.data(), float_of(0x7f80'0001u));  // fp32 keeps every bit
  std::memcpy(&u32, buf.data(), 4);
  CHECK(u32 == 0x7f80'0001u);
  store_float(DType::bool_, buf.data(), -0.0f);
  CHECK(buf[0] == 0);
  store_float(DType::bool_, buf.data(), 0.25f);
  CHECK(buf[0] == 1);
}

TEST_CASE("numerics: round_to per dtype") {
  CHECK(round_to(DType::float32, 0.1f) == 0.1f);
  CHECK(round_to(DType::bfloat16, 1.0f + 0x1p-8f) == 1.0f);
  CHECK(round_to(DType::float16, 1.0f + 0x1p-11f) == 1.0f);
  CHECK(round_to(DType::tfloat32, 1.0f + 0x1p-11f) == 1.0f);
  CHECK(round_to(DType::float8_e4m3, 1000.0f) == kInf);
  CHECK(std::isnan(round_to(DType::float8_e4m3fn, 1000.0f)));
  CHECK(round_to(DType::float8_e5m2, -1e6f) == -kInf);
  CHECK(round_to(DType::int8, -200.0f) == -128.0f);
  CHECK(round_to(DType::int32, 3e9f) == 2147483648.0f);  // INT32_MAX read back as fp32
  CHECK(round_to(DType::uint8, -5.0f) == 0.0f);
  CHECK(round_to(DType::uint16, 1.99f) == 1.0f);
  CHECK(round_to(DType::uint32, 5e9f) == 4294967296.0f);
  CHECK(round_to(DType::bool_, kNaN) == 1.0f);
  CHECK(round_to(DType::int16, kNaN) == 0.0f);
}

TEST_CASE("numerics: integers load as the nearest fp32") {
  std::array<uint8_t, 4> buf{};
  const auto load_i32 = [&](int32_t v) {
    std::memcpy(buf.data(), &v, 4);
    return load_float(DType::int32, buf.data());
  };
  const auto load_u32 = [&](uint32_t v) {
    std::memcpy(buf.data(), &v, 4);
    return load_float(DType::uint32, buf.data());
  };
  CHECK(load_i32(16777216) == 16777216.0f);
  CHECK(load_i32(16777217) == 16777216.0f);  // tie: 2^24 is even
  CHECK(load_i32(16777219) == 16777220.0f);  // tie: 2^24 + 4 is even
  CHECK(load_i32(-16777217) == -16777216.0f);
  CHECK(load_i32(std::numeric_limits<int32_t>::max()) == 2147483648.0f);
  CHECK(load_i32(std::numeric_limits<int32_t>::min()) == -2147483648.0f);
  CHECK(load_u32(std::numeric_limits<uint32_t>::max()) == 4294967296.0f);
  CHECK(load_u32(0x8000'0000u) == 2147483648.0f);  // not negative
  buf[0] = 0xff;
  CHECK(load_float(DType::int8, buf.data()) == -1.0f);
  CHECK(load_float(DType::uint8, buf.data()) == 255.0f);
  CHECK(load_float(DType::bool_, buf.data()) == 1.0f);  // any nonzero byte is true
  buf[0] = 0x00;
  buf[1] = 0x80;
  CHECK(load_float(DType::int16, buf.data()) == -32768.0f);
  CHECK(load_float(DType::uint16, buf.data()) == 32768.0f);
}

TEST_CASE("numerics: load_int and store_int wrap to the width and expose float bits") {
  std::array<uint8_t, 8> buf{};
  const auto round_trip = [&](DType t, int64_t v) {
    buf.fill(0xa5);
    store_int(t, buf.data(), v);
    for (size_t i = dtype_size(t); i < buf.size(); ++i) REQUIRE(buf[i] == 0xa5);
    return load_int(t, buf.data());
  };
  CHECK(round_trip(DType::int8, 200) == -56);
  CHECK(round_trip(DType::int8, -129) == 127);
  CHECK(round_trip(DType::uint8, -1) == 255);
  CHECK(round_trip(DType::uint8, 0x1ff) == 0xff);
  CHECK(round_trip(DType::int16, 0x1'2345) == 0x2345);
  CHECK(round_trip(DType::int16, 0x8000) == -32768);
  CHECK(round_trip(DType::uint16, -2) == 0xfffe);
  CHECK(round_trip(DType::int32, 0x1'8000'0000ll) == std::numeric_limits<int32_t>::min());
  CHECK(round_trip(DType::int32, -5) == -5);
  CHECK(round_trip(DType::uint32, -1) == 0xffff'ffffll);
  CHECK(round_trip(DType::bool_, 2) == 0);  // bool keeps the low bit: ~true == false
  CHECK(round_trip(DType::bool_, 3) == 1);
  CHECK(round_trip(DType::bool_, ~int64_t(1)) == 0);
  CHECK(round_trip(DType::bool_, ~int64_t(0)) == 1);

  // Float dtypes: raw bit patterns, zero-extended, never rounded.
  CHECK(round_trip(DType::float32, 0x3f80'0000) == 0x3f80'0000);
  CHECK(load_float(DType::float32, buf.data()) == 1.0f);
  CHECK(round_trip(DType::bfloat16, 0xbf80) == 0xbf80);
  CHECK(load_float(DType::bfloat16, buf.data()) == -1.0f);
  CHECK(round_trip(DType::float16, 0x1'3c00) == 0x3c00);
  CHECK(load_float(DType::float16, buf.data()) == 1.0f);
  CHECK(round_trip(DType::float8_e4m3, 0x38) == 0x38);
  CHECK(load_float(DType::float8_e4m3, buf.data()) == 1.0f);
  CHECK(round_trip(DType::float8_e4m3fn, 0xff) == 0xff);
  CHECK(std::isnan(load_float(DType::float8_e4m3fn, buf.data())));
  CHECK(round_trip(DType::float8_e5m2, 0x7c) == 0x7c);
  CHECK(load_float(DType::float8_e5m2, buf.data()) == kInf);
  CHECK(round_trip(DType::tfloat32, 0x3f80'0001) == 0x3f80'0001);
  CHECK(bits_of(load_float(DType::tfloat32, buf.data())) == 0x3f80'0001u);

  buf.fill(0);
  buf[0] = 0x80;
  CHECK(load_int(DType::int8, buf.data()) == -128);
  CHECK(load_int(DType::uint8, buf.data()) == 128);
  CHECK(load_int(DType::float8_e4m3, buf.data()) == 0x80);
  CHECK(load_int(DType::bool_, buf.data()) == 1);
}

TEST_CASE("numerics: the templated and run-time dispatched forms agree") {
  std::array<uint8_t, 4> a{}, b{};
  const float v = -37.77f;
  store_float<DType::float8_e5m2>(a.data(), v);
  store_float(DType::float8_e5m2, b.data(), v);
  CHECK(a == b);
  CHECK(load_float<DType::float8_e5m2>(a.data()) == load_float(DType::float8_e5m2, b.data()));
  CHECK(round_to<DType::uint16>(70000.0f) == round_to(DType::uint16, 70000.0f));
  store_int<DType::int16>(a.data(), -3);
  CHECK(load_int<DType::int16>(a.data()) == load_int(DType::int16, a.data()));
}

// The engines' store rules: integers clamp to the destination's range (hand-computed bounds:
// int8 [-128, 127], uint8 [0, 255], int16 [-32768, 32767], uint32 [0, 2^32 - 1], bool_ [0, 1]),
// floats round as any write; copies keep the bits when the dtypes match.
TEST_CASE("numerics: saturating integer stores and element copies") {
  auto saturated = [](DType t, int64_t value) {
    uint8_t bytes[4] = {0xAA, 0xAA, 0xAA, 0xAA};
    store_saturated(t, bytes, value);
    return load_int(t, bytes);
  };
  CHECK(saturated(DType::int8, 300) == 127);
  CHECK(saturated(DType::int8, -300) == -128);
  CHECK(saturated(DType::int8, -5) == -5);
  CHECK(saturated(DType::uint8, -5) == 0);
  CHECK(saturated(DType::uint8, 255) == 255);
  CHECK(saturated(DType::int16, 40000) == 32767);
  CHECK(saturated(DType::uint32, int64_t(1) << 33) == 0xFFFFFFFFll);
  CHECK(saturated(DType::int32, -(int64_t(1) << 40)) == -2147483648ll);
  CHECK(saturated(DType::bool_, 7) == 1);
  CHECK(saturated(DType::bool_, -7) == 0);
  uint8_t f[4];
  store_saturated(DType::bfloat16, f, 257);  // 257 lies between bf16's 256 and 258: ties to even
  CHECK(load_float(DType::bfloat16, f) == 256.0f);
  store_saturated(DType::float32, f, (int64_t(1) << 24) + 1);  // rounds to even as an fp32 cast
  CHECK(load_float(DType::float32, f) == 16777216.0f);

  const uint16_t payload_nan = 0x7f81;  // a signalling bf16 NaN: a conversion would canonicalize it
  uint16_t copied = 0;
  copy_element(DType::bfloat16, &copied, DType::bfloat16, &payload_nan);
  CHECK(copied == payload_nan);
  const float x = 1.0f + 0x1p-8f + 0x1p-20f;  // above the midpoint between bf16 1.0 and 1.0078125
  copy_element(DType::bfloat16, &copied, DType::float32, &x);
  CHECK(copied == 0x3f81);
  const int32_t big = (1 << 24) + 1;  // int32 -> uint32 goes through fp32 and loses the low bit
  uint32_t widened = 0;
  copy_element(DType::uint32, &widened, DType::int32, &big);
  CHECK(widened == uint32_t(1) << 24);
}

// The per-format conversions are usable in constant expressions.
static_assert(bf16_from_float(1.0f) == 0x3f80);
static_assert(bf16_from_float(1.0f + 0x1p-8f) == 0x3f80);
static_assert(bf16_to_float(0x4049) == 3.140625f);
static_assert(fp16_from_float(65504.0f) == 0x7bff);
static_assert(fp16_from_float(65520.0f) == 0x7c00);
static_assert(fp16_to_float(0x3555) == 0x1.554p-2f);
static_assert(tf32_round(1.0f + 0x1p-11f) == 1.0f);
static_assert(fp8_e4m3_from_float(240.0f) == 0x77);
static_assert(fp8_e4m3fn_from_float(448.0f) == 0x7e);
static_assert(fp8_e5m2_from_float(57344.0f) == 0x7b);
static_assert(fp8_e4m3_to_float(0x01) == 0x1p-9f);
static_assert(fp8_e4m3fn_to_float(0xfe) == -448.0f);
static_assert(fp8_e5m2_to_float(0x7b) == 57344.0f);
static_assert(int32_from_float(-2.9f) == -2);
static_assert(uint8_from_float(300.0f) == 255);

}  // namespace
