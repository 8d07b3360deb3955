// Per-instruction tests of the reference interpreter (runtime/src/interpreter.cpp).
//
// Each test writes a small kernel with the C++ DSL, runs it on the interpreter through
// test::run1 / test::run_kernel, and compares the outputs against a reference computed here with
// plain loops from the NKI semantics (nki.isa docstrings, /work/research/isa-semantics.md). The
// references never call the interpreter, alu.hpp or activation.hpp; rounding into narrow float
// formats is recomputed here in double precision (round_format below), independently of
// numerics.hpp. Where the semantics make a result exact (copies, transposes, integer and bitwise
// operations, comparisons, single fp32 operations, iota, max8, ...) the comparison is exact;
// elsewhere each tolerance is justified next to it.
#include "harness.hpp"
#include "raw_ir.hpp"
#include "reduction_reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

namespace {

using namespace nikki;
using test::HostTensor;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps32 = 0x1p-24;  // unit roundoff of fp32 (half an ulp at 1.0)

// --- kernel-side helpers ------------------------------------------------------------------------

/** A fresh SBUF tile holding a copy of `src` (an HBM tensor or view), optionally converted. */
Tensor to_sbuf(const Tensor& src, std::optional<DType> dtype = std::nullopt) {
  Tensor t = nl::ndarray(src.shape(), dtype.value_or(src.dtype()), nl::sbuf);
  isa::dma_copy(t, src);
  return t;
}

/** A fresh kernel output holding `t` (PSUM goes through SBUF, since DMA cannot read PSUM). */
Tensor to_hbm(const Tensor& t) {
  Tensor src = t;
  if (t.buffer() == nl::psum) {
    src = nl::ndarray(t.shape(), t.dtype(), nl::sbuf);
    isa::tensor_copy(src, t);
  }
  Tensor out = nl::ndarray(t.shape(), t.dtype(), nl::shared_hbm);
  isa::dma_copy(out, src);
  return out;
}

// --- host-side helpers --------------------------------------------------------------------------

HostTensor uniform(DType dtype, Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return test::random_tensor(dtype, shape, seed, lo, hi);
}

HostTensor integers(DType dtype, Shape shape, uint32_t seed, int64_t lo, int64_t hi) {
  HostTensor t(dtype, shape);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  for (int64_t i = 0; i < t.size(); ++i) t.set_int(i, dist(rng));
  return t;
}

/** fp32 element i of an fp32 host tensor (a plain memcpy, no conversion). */
double f32_at(const HostTensor& t, int64_t i) {
  if (t.dtype != DType::float32) throw std::logic_error("f32_at on a non-fp32 tensor");
  float v;
  std::memcpy(&v, t.bytes.data() + 4 * i, 4);
  return v;
}
uint32_t f32_bits_at(const HostTensor& t, int64_t i) {
  uint32_t v;
  std::memcpy(&v, t.bytes.data() + 4 * i, 4);
  return v;
}
uint16_t u16_at(const HostTensor& t, int64_t i) {
  uint16_t v;
  std::memcpy(&v, t.bytes.data() + 2 * i, 2);
  return v;
}
/** bf16 element i decoded by hand: a bf16 is the top half of an fp32. */
double bf16_at(const HostTensor& t, int64_t i) {
  if (t.dtype != DType::bfloat16) throw std::logic_error("bf16_at on a non-bf16 tensor");
  return std::bit_cast<float>(uint32_t(u16_at(t, i)) << 16);
}
/** Integer element i (sign- or zero-extended by HostTensor::get_int, a raw load). */
int64_t int_at(const HostTensor& t, int64_t i) { return t.get_int(i); }

void set_f32(HostTensor& t, int64_t i, float v) {
  if (t.dtype != DType::float32) throw std::logic_error("set_f32 on a non-fp32 tensor");
  std::memcpy(t.bytes.data() + 4 * i, &v, 4);
}

/** A binary floating-point format, for rounding references computed in double. */
struct FloatFormat {
  int man;         // explicit mantissa bits
  int emin;        // exponent of the smallest normal
  double max;      // largest finite value
  bool has_inf;    // false: overflow and inf become NaN (OCP "fn" formats)
};
constexpr FloatFormat kBF16{7, -126, 0x1.fep127, true};
constexpr FloatFormat kFP16{10, -14, 65504.0, true};
constexpr FloatFormat kTF32{10, -126, 0x1.ff8p127, true};
constexpr FloatFormat kE4M3{3, -6, 240.0, true};
constexpr FloatFormat kE4M3FN{3, -6, 448.0, false};
constexpr FloatFormat kE5M2{2, -14, 57344.0, true};
constexpr FloatFormat kF32{23, -126, 0x1.fffffep127, true};

/**
 * Rounds x to the nearest value of format f, ties to even (nearbyint under the default rounding
 * mode), keeping subnormals; results past the largest finite value overflow to inf (or NaN for
 * formats without inf). x / q is exact because q is a power of two.
 */
double round_format(double x, const FloatFormat& f) {
  if (std::isnan(x)) return kNaN;
  if (std::isinf(x)) return f.has_inf ? x : kNaN;
  if (x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, f.emin);
  const double q = std::ldexp(1.0, lead - f.man);
  const double r = std::nearbyint(x / q) * q;
  if (std::fabs(r) > f.max) return f.has_inf ? std::copysign(kInf, x) : kNaN;
  return r;
}

/** NKI's fp32 -> integer store as nikki defines it: truncate toward zero, saturate, NaN -> 0. */
double int_convert(double x, DType d) {
  if (d == DType::bool_) return x != 0 || std::isnan(x) ? 1 : 0;
  if (std::isnan(x)) return 0;
  const int bits = 8 * int(dtype_size(d));
  const double lo = info(d).is_signed ? -std::ldexp(1, bits - 1) : 0;
  const double hi = info(d).is_signed ? std::ldexp(1, bits - 1) - 1 : std::ldexp(1, bits) - 1;
  return std::clamp(std::trunc(x), lo, hi) + 0.0;  // integers have no -0
}

/** The value an fp32 result reads back as after being written to dtype d. */
double store_ref(double x, DType d) {
  switch (d) {
    case DType::float32: return round_format(x, kF32);
    case DType::bfloat16: return round_format(x, kBF16);
    case DType::float16: return round_format(x, kFP16);
    case DType::tfloat32: return round_format(x, kTF32);
    case DType::float8_e4m3: return round_format(x, kE4M3);
    case DType::float8_e4m3fn: return round_format(x, kE4M3FN);
    case DType::float8_e5m2: return round_format(x, kE5M2);
    default: return int_convert(x, d);
  }
}

/**
 * Compares n results with expectations: exact (values and the sign of zero) when atol and rtol are
 * both 0, else |got - want| <= atol + rtol * |want|. NaN must meet NaN; infinities must be equal.
 * Reports the count and the first mismatch.
 */
template <class Got, class Want>
void check_all(const std::string& what, int64_t n, Got&& got, Want&& want, double atol = 0, double rtol = 0) {
  int64_t bad = 0, first = -1;
  double g0 = 0, w0 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got(i), w = want(i);
    bool ok;
    if (std::isnan(w) || std::isnan(g)) ok = std::isnan(w) && std::isnan(g);
    else if (std::isinf(w) || std::isinf(g)) ok = g == w;
    else if (atol == 0 && rtol == 0) ok = g == w && std::signbit(g) == std::signbit(w);
    else ok = std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok && bad++ == 0) {
      first = i;
      g0 = g;
      w0 = w;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} of {} elements differ; first at {}: got {:.9g}, want {:.9g}", what,
                                      bad, n, first, g0, w0));
}

/** Same as check_all with a per-element tolerance tol(i). */
template <class Got, class Want, class Tol>
void check_within(const std::string& what, int64_t n, Got&& got, Want&& want, Tol&& tol) {
  int64_t bad = 0, first = -1;
  double g0 = 0, w0 = 0, t0 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got(i), w = want(i), t = tol(i);
    bool ok;
    if (std::isnan(w) || std::isnan(g)) ok = std::isnan(w) && std::isnan(g);
    else if (std::isinf(w) || std::isinf(g)) ok = g == w;
    else ok = std::fabs(g - w) <= t;
    if (!ok && bad++ == 0) {
      first = i;
      g0 = g;
      w0 = w;
      t0 = t;
    }
  }
  CHECK_MESSAGE(bad == 0, fmt::format("{}: {} of {} elements differ; first at {}: got {:.9g}, want {:.9g} (tol {:.3g})",
                                      what, bad, n, first, g0, w0, t0));
}

/** Runs a kernel of any number of outputs on the given inputs. */
template <class Fn, class... T>
std::vector<HostTensor> run(Fn&& fn, T&... inputs) {
  Kernel k = trace("test", std::forward<Fn>(fn), inputs.spec()...);
  return test::run_kernel(std::move(k), {&inputs...});
}

}  // namespace

// =================================================================================================
// Sentinels
// =================================================================================================

TEST_CASE("instr: fresh allocations read as NaN (float) and 4 (integer) sentinels") {
  HostTensor x = uniform(DType::float32, {128, 8}, 1);
  auto outs = run(
      [](Tensor x) {
        // A tile that is written and stored first; the tiles below are allocated after its live
        // range ends, so the allocator may reuse its bytes: they must still read as sentinels.
        Tensor used = to_sbuf(x);
        Tensor first = to_hbm(used);
        Tensor f = nl::ndarray({128, 8}, nl::float32, nl::sbuf);
        Tensor h = nl::ndarray({128, 8}, nl::bfloat16, nl::sbuf);
        Tensor e = nl::ndarray({128, 8}, nl::float8_e4m3, nl::sbuf);
        Tensor i8 = nl::ndarray({128, 8}, nl::int8, nl::sbuf);
        Tensor u16 = nl::ndarray({128, 8}, nl::uint16, nl::sbuf);
        Tensor i32 = nl::ndarray({128, 8}, nl::int32, nl::sbuf);
        Tensor ps = nl::ndarray({128, 8}, nl::float32, nl::psum);
        Tensor hb = nl::ndarray({128, 8}, nl::float32, nl::private_hbm);
        Tensor hb_out = nl::ndarray({128, 8}, nl::float32, nl::shared_hbm);
        isa::dma_copy(hb_out, hb);
        return std::vector<Tensor>{first, to_hbm(f), to_hbm(h), to_hbm(e), to_hbm(i8), to_hbm(u16), to_hbm(i32),
                                   to_hbm(ps), hb_out};
      },
      x);
  const int64_t n = 128 * 8;
  check_all("stored tile", n, [&](int64_t i) { return f32_at(outs[0], i); }, [&](int64_t i) { return f32_at(x, i); });
  check_all("fresh fp32 SBUF", n, [&](int64_t i) { return f32_at(outs[1], i); }, [](int64_t) { return kNaN; });
  check_all("fresh bf16 SBUF", n, [&](int64_t i) { return bf16_at(outs[2], i); }, [](int64_t) { return kNaN; });
  // fp8 e4m3 NaN codes are S.1111.mmm with mmm != 0.
  auto is_e4m3_nan = [&](int64_t i) { return (outs[3].bytes[i] & 0x78) == 0x78 && (outs[3].bytes[i] & 7) != 0; };
  check_all("fresh fp8 SBUF", n, [&](int64_t i) { return double(is_e4m3_nan(i)); }, [](int64_t) { return 1.0; });
  check_all("fresh int8 SBUF", n, [&](int64_t i) { return double(int_at(outs[4], i)); }, [](int64_t) { return 4.0; });
  check_all("fresh uint16 SBUF", n, [&](int64_t i) { return double(int_at(outs[5], i)); }, [](int64_t) { return 4.0; });
  check_all("fresh int32 SBUF", n, [&](int64_t i) { return double(int_at(outs[6], i)); }, [](int64_t) { return 4.0; });
  check_all("fresh fp32 PSUM", n, [&](int64_t i) { return f32_at(outs[7], i); }, [](int64_t) { return kNaN; });
  check_all("fresh private HBM", n, [&](int64_t i) { return f32_at(outs[8], i); }, [](int64_t) { return kNaN; });
}

TEST_CASE("instr: output elements a kernel does not write come back as NaN / 4") {
  HostTensor x = uniform(DType::float32, {64, 16}, 2);
  HostTensor k = integers(DType::int32, {4, 8}, 3, -1000, 1000);
  auto outs = run(
      [](Tensor x, Tensor k) {
        Tensor out = nl::ndarray({64, 32}, nl::float32, nl::shared_hbm);
        isa::dma_copy(out(nl::all, nl::ds(8, 16)), x);  // columns [8, 24) only
        Tensor outi = nl::ndarray({8, 8}, nl::int32, nl::shared_hbm);
        isa::dma_copy(outi(nl::ds(2, 4), nl::all), k);  // rows [2, 6) only
        return std::make_tuple(out, outi);
      },
      x, k);
  check_all("partially written fp32 output", 64 * 32, [&](int64_t i) { return f32_at(outs[0], i); },
            [&](int64_t i) {
              const int64_t r = i / 32, c = i % 32;
              return c >= 8 && c < 24 ? f32_at(x, r * 16 + c - 8) : kNaN;
            });
  check_all("partially written int32 output", 64, [&](int64_t i) { return double(int_at(outs[1], i)); },
            [&](int64_t i) {
              const int64_t r = i / 8;
              return r >= 2 && r < 6 ? double(int_at(k, i - 16)) : 4.0;
            });
}

// =================================================================================================
// Data movement and dtype conversion
// =================================================================================================

TEST_CASE("instr: dma_copy moves elements through views exactly") {
  HostTensor x = uniform(DType::float32, {64, 96}, 4);
  auto outs = run(
      [](Tensor x) {
        Tensor plain = to_hbm(to_sbuf(x));
        Tensor strided = to_hbm(to_sbuf(x(nl::all, Slice{1, std::nullopt, 2})));   // odd columns
        Tensor transposed = to_hbm(to_sbuf(x.permute({1, 0})));                     // [96, 64]
        Tensor bcast = to_hbm(to_sbuf(x(nl::ds(5, 1), nl::all).broadcast(0, 32)));  // row 5 x 32
        // HBM -> HBM, only the element counts match: elements move in row-major order.
        Tensor flat = nl::ndarray({96 * 64}, nl::float32, nl::shared_hbm);
        isa::dma_copy(flat, x);
        // Write through a strided destination view: even rows of a [128, 96] output.
        Tensor rows = nl::ndarray({128, 96}, nl::float32, nl::shared_hbm);
        isa::dma_copy(rows(Slice{0, std::nullopt, 2}, nl::all), x);
        // 3-D reshaped view, sliced in the middle dim.
        Tensor cube = to_hbm(to_sbuf(x.reshape({64, 8, 12})(nl::all, nl::ds(2, 3), nl::all)));
        return std::vector<Tensor>{plain, strided, transposed, bcast, flat, rows, cube};
      },
      x);
  auto X = [&](int64_t r, int64_t c) { return f32_at(x, r * 96 + c); };
  check_all("plain", 64 * 96, [&](int64_t i) { return f32_at(outs[0], i); }, [&](int64_t i) { return f32_at(x, i); });
  check_all("strided", 64 * 48, [&](int64_t i) { return f32_at(outs[1], i); },
            [&](int64_t i) { return X(i / 48, 2 * (i % 48) + 1); });
  check_all("transposed", 96 * 64, [&](int64_t i) { return f32_at(outs[2], i); },
            [&](int64_t i) { return X(i % 64, i / 64); });
  check_all("broadcast", 32 * 96, [&](int64_t i) { return f32_at(outs[3], i); },
            [&](int64_t i) { return X(5, i % 96); });
  check_all("flattened", 96 * 64, [&](int64_t i) { return f32_at(outs[4], i); },
            [&](int64_t i) { return f32_at(x, i); });
  check_all("strided dst", 128 * 96, [&](int64_t i) { return f32_at(outs[5], i); },
            [&](int64_t i) { return (i / 96) % 2 == 0 ? X(i / 96 / 2, i % 96) : kNaN; });
  check_all("reshaped slice", 64 * 3 * 12, [&](int64_t i) { return f32_at(outs[6], i); },
            [&](int64_t i) {
              const int64_t r = i / 36, j = (i % 36) / 12, c = i % 12;
              return X(r, (j + 2) * 12 + c);
            });
}

namespace {

/** fp32 test values: specials, format edges, ties, and random values over a wide exponent range. */
HostTensor conversion_inputs() {
  HostTensor x(DType::float32, {128, 64});
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, float(kInf), float(-kInf), float(kNaN), -float(kNaN),
                          // integer edges (truncation, saturation)
                          0.7f, -0.7f, 1.5f, -1.5f, 2.5f, 127.9f, 128.0f, -128.5f, -129.0f, 255.5f, 256.0f,
                          32767.5f, 32768.0f, -32769.0f, 65535.7f, 65536.0f, 2147483520.0f, 2147483648.0f,
                          -2147483904.0f, 4294967040.0f, 4294967296.0f, 1e10f, -1e10f, 16777217.0f,
                          // fp8 / fp16 / bf16 range edges
                          240.0f, 247.9f, 248.0f, 250.0f, 448.0f, 464.0f, 465.0f, 480.0f, 57344.0f, 61439.0f,
                          61440.0f, 65504.0f, 65519.0f, 65520.0f, 3.3e38f, 3.4e38f, -3.4e38f,
                          // subnormal ranges of the small formats
                          0x1p-9f, 0x1.8p-10f, 0x1p-10f, 0x1p-11f, 0x1p-16f, 0x1.8p-17f, 0x1p-24f, 0x1p-25f,
                          0x1.8p-25f, -0x1p-20f, 0x1p-126f, 0x1p-130f, 0x1p-149f, 3e-39f};
  // Exact ties between neighbours for every mantissa width in use (2, 3, 7, 10 bits).
  for (int m : {2, 3, 7, 10})
    for (int k : {1, 3, 5}) {
      v.push_back(1.0f + std::ldexp(float(k), -(m + 1)));
      v.push_back(-(4.0f + std::ldexp(float(k), -(m - 1))));
    }
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> exp(-30, 20);
  std::uniform_real_distribution<float> man(1.0f, 2.0f);
  for (int64_t i = 0; i < x.size(); ++i) {
    float val = i < int64_t(v.size()) ? v[i] : std::ldexp(man(rng), exp(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    set_f32(x, i, val);
  }
  return x;
}

}  // namespace

TEST_CASE("instr: dtype conversion on write (dma_copy, tensor_copy on vector and gpsimd)") {
  HostTensor x = conversion_inputs();
  const DType dtypes[] = {DType::bfloat16, DType::float16, DType::tfloat32, DType::float8_e4m3,
                          DType::float8_e4m3fn, DType::float8_e5m2, DType::int8, DType::int16,
                          DType::int32, DType::uint8, DType::uint16, DType::uint32, DType::bool_};
  for (DType dt : dtypes) {
    CAPTURE(dtype_name(dt));
    auto outs = run(
        [dt](Tensor x) {
          // A: the DMA converts fp32 -> dt; widening back to fp32 is exact.
          Tensor a = nl::ndarray({128, 64}, dt, nl::sbuf);
          isa::dma_copy(a, x);
          Tensor a32 = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
          isa::tensor_copy(a32, a);
          // B: the vector engine converts; the tile goes to HBM as dt, and an HBM -> HBM DMA
          // widens it to fp32.
          Tensor s = to_sbuf(x);
          Tensor b = nl::ndarray({128, 64}, dt, nl::sbuf);
          isa::tensor_copy(b, s);
          Tensor hb = nl::ndarray({128, 64}, dt, nl::private_hbm);
          isa::dma_copy(hb, b);
          Tensor b32 = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm);
          isa::dma_copy(b32, hb);
          // C: the GpSimd engine converts.
          Tensor c = nl::ndarray({128, 64}, dt, nl::sbuf);
          isa::tensor_copy(c, s, isa::gpsimd_engine);
          Tensor c32 = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
          isa::tensor_copy(c32, c);
          return std::vector<Tensor>{to_hbm(a32), b32, to_hbm(c32), to_hbm(a)};
        },
        x);
    // Exact: one RNE rounding (or truncation for integers) of an fp32 value, then an exact widening
    // (integer results above 2^24 widen to fp32 with RNE, as a C++ int -> float cast does).
    auto want = [&](int64_t i) {
      const double r = store_ref(f32_at(x, i), dt);
      return is_integer(dt) ? double(float(r)) : r;
    };
    check_all("dma_copy", x.size(), [&](int64_t i) { return f32_at(outs[0], i); }, want);
    check_all("tensor_copy (vector)", x.size(), [&](int64_t i) { return f32_at(outs[1], i); }, want);
    check_all("tensor_copy (gpsimd)", x.size(), [&](int64_t i) { return f32_at(outs[2], i); }, want);
    if (is_integer(dt))
      check_all("integer store", x.size(), [&](int64_t i) { return double(int_at(outs[3], i)); },
                [&](int64_t i) { return store_ref(f32_at(x, i), dt); });
  }
}

TEST_CASE("instr: same-dtype copies are bit exact; integer sources convert through fp32") {
  // Every bf16 bit pattern, NaN payloads included.
  HostTensor h(DType::bfloat16, {128, 512});
  for (int64_t i = 0; i < h.size(); ++i) {
    const uint16_t b = uint16_t(i);
    std::memcpy(h.bytes.data() + 2 * i, &b, 2);
  }
  // fp32 NaNs with payloads (signalling included), -0, subnormals.
  HostTensor f(DType::float32, {4, 8});
  const uint32_t fbits[] = {0x7fa00001u, 0xffc12345u, 0x7f800001u, 0x80000000u, 0x00000001u, 0x807fffffu,
                            0x7f7fffffu, 0x3f800001u};
  for (int64_t i = 0; i < f.size(); ++i) std::memcpy(f.bytes.data() + 4 * i, &fbits[i % 8], 4);
  HostTensor k(DType::int32, {4, 8});
  const int64_t kv[] = {16777217, -16777219, 2147483647, -2147483648LL, 300, -129, 70000, -5};
  for (int64_t i = 0; i < k.size(); ++i) k.set_int(i, kv[i % 8]);
  auto outs = run(
      [](Tensor h, Tensor f, Tensor k) {
        Tensor hs = to_sbuf(h);
        Tensor hv = nl::ndarray({128, 512}, nl::bfloat16, nl::sbuf);
        isa::tensor_copy(hv, hs);
        Tensor hg = nl::ndarray({128, 512}, nl::bfloat16, nl::sbuf);
        isa::tensor_copy(hg, hs, isa::gpsimd_engine);
        Tensor hw = nl::ndarray({128, 512}, nl::float32, nl::sbuf);  // bf16 -> fp32 widening
        isa::tensor_copy(hw, hs);
        Tensor hsc = nl::ndarray({128, 512}, nl::bfloat16, nl::sbuf);  // ScalarE copies exist from NeuronCore-v3
        isa::tensor_copy(hsc, hs, isa::scalar_engine);
        Tensor fs = to_sbuf(f);
        Tensor fv = nl::ndarray({4, 8}, nl::float32, nl::sbuf);
        isa::tensor_copy(fv, fs);
        std::vector<Tensor> r{to_hbm(hv), to_hbm(hg), to_hbm(hw), to_hbm(fv)};
        for (DType d : {nl::int8, nl::uint8, nl::int16, nl::float32, nl::bfloat16}) r.push_back(to_hbm(to_sbuf(k, d)));
        r.push_back(to_hbm(to_sbuf(k)));
        r.push_back(to_hbm(hsc));
        return r;
      },
      h, f, k);
  check_all("bf16 copy (vector)", h.size(), [&](int64_t i) { return double(u16_at(outs[0], i)); },
            [&](int64_t i) { return double(u16_at(h, i)); });
  check_all("bf16 copy (gpsimd)", h.size(), [&](int64_t i) { return double(u16_at(outs[1], i)); },
            [&](int64_t i) { return double(u16_at(h, i)); });
  // bf16 -> fp32 is exact for every pattern: the bf16 bits become the high half.
  check_all("bf16 widening", h.size(), [&](int64_t i) { return double(f32_bits_at(outs[2], i)); },
            [&](int64_t i) { return double(uint32_t(u16_at(h, i)) << 16); });
  check_all("fp32 copy", f.size(), [&](int64_t i) { return double(f32_bits_at(outs[3], i)); },
            [&](int64_t i) { return double(fbits[i % 8]); });
  // Integer -> integer goes through fp32: 16777217 reads as 16777216, then saturates.
  const DType kd[] = {DType::int8, DType::uint8, DType::int16, DType::float32, DType::bfloat16};
  for (int j = 0; j < 5; ++j) {
    CAPTURE(dtype_name(kd[j]));
    check_all("int32 source", k.size(),
              [&](int64_t i) { return kd[j] == DType::float32 ? f32_at(outs[4 + j], i)
                                      : kd[j] == DType::bfloat16 ? bf16_at(outs[4 + j], i)
                                                                 : double(int_at(outs[4 + j], i)); },
              [&](int64_t i) { return store_ref(double(float(kv[i % 8])), kd[j]); });
  }
  check_all("int32 copy", k.size(), [&](int64_t i) { return double(int_at(outs[9], i)); },
            [&](int64_t i) { return double(kv[i % 8]); });
  check_all("bf16 copy (scalar)", h.size(), [&](int64_t i) { return double(u16_at(outs[10], i)); },
            [&](int64_t i) { return double(u16_at(h, i)); });
}

// =================================================================================================
// Element-wise arithmetic
// =================================================================================================

namespace {

/** fp32 reference of a binary arithmetic operator: one IEEE fp32 operation (exact to compare). */
double alu_ref(const nl::Op& op, float a, float b) {
  const std::string_view n = op.name;
  if (n == "add") return a + b;
  if (n == "subtract") return a - b;
  if (n == "multiply") return a * b;
  if (n == "maximum") return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b);
  if (n == "minimum") return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b);
  if (n == "equal") return a == b;
  if (n == "not_equal") return a != b;
  if (n == "greater") return a > b;
  if (n == "greater_equal") return a >= b;
  if (n == "less") return a < b;
  if (n == "less_equal") return a <= b;
  if (n == "logical_and") return a != 0 && b != 0;
  if (n == "logical_or") return a != 0 || b != 0;
  if (n == "logical_xor") return (a != 0) != (b != 0);
  throw std::logic_error("no reference for this operator");
}

const nl::Op kBinaryOps[] = {nl::add,     nl::subtract,      nl::multiply,    nl::maximum,     nl::minimum,
                             nl::equal,   nl::not_equal,     nl::greater,     nl::greater_equal, nl::less,
                             nl::less_equal, nl::logical_and, nl::logical_or, nl::logical_xor};

}  // namespace

TEST_CASE("instr: tensor_tensor arithmetic and comparison operators (data1 is the lhs)") {
  HostTensor a = uniform(DType::float32, {128, 32}, 10, -2, 2), b = uniform(DType::float32, {128, 32}, 11, -2, 2);
  // Equal pairs and zeros, so comparisons and logical operators see every case.
  for (int64_t i = 0; i < a.size(); ++i) {
    if (i % 7 == 0) set_f32(b, i, float(f32_at(a, i)));
    if (i % 11 == 0) set_f32(a, i, 0.0f);
    if (i % 13 == 0) set_f32(b, i, 0.0f);
  }
  HostTensor pb = uniform(DType::float32, {128, 32}, 12, 0.25f, 3.0f);  // positive bases for power
  auto outs = run(
      [](Tensor a, Tensor b, Tensor pb) {
        Tensor sa = to_sbuf(a), sb = to_sbuf(b), spb = to_sbuf(pb);
        std::vector<Tensor> r;
        for (const nl::Op& op : kBinaryOps) {
          Tensor d = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
          isa::tensor_tensor(d, sa, sb, op);
          r.push_back(to_hbm(d));
        }
        Tensor p = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
        isa::tensor_tensor(p, spb, sa, nl::power, isa::gpsimd_engine);
        r.push_back(to_hbm(p));
        Tensor h = nl::ndarray({128, 32}, nl::bfloat16, nl::sbuf);  // fp32 result rounded on write
        isa::tensor_tensor(h, sa, sb, nl::multiply);
        r.push_back(to_hbm(h));
        Tensor c = nl::ndarray({128, 32}, nl::uint8, nl::sbuf);  // comparison into an integer mask
        isa::tensor_tensor(c, sa, sb, nl::less_equal);
        r.push_back(to_hbm(c));
        // One operand read from PSUM.
        Tensor ps = nl::ndarray({128, 32}, nl::float32, nl::psum);
        isa::tensor_copy(ps, sb);
        Tensor d = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
        isa::tensor_tensor(d, sa, ps, nl::subtract);
        r.push_back(to_hbm(d));
        return r;
      },
      a, b, pb);
  const int64_t n = a.size();
  auto A = [&](int64_t i) { return float(f32_at(a, i)); };
  auto B = [&](int64_t i) { return float(f32_at(b, i)); };
  for (size_t k = 0; k < std::size(kBinaryOps); ++k)
    check_all(std::string(kBinaryOps[k].name), n, [&](int64_t i) { return f32_at(outs[k], i); },
              [&](int64_t i) { return alu_ref(kBinaryOps[k], A(i), B(i)); });
  const size_t m = std::size(kBinaryOps);
  // power: the fp32 result of pow, allowed 1 ulp since the hardware's pow is not correctly rounded.
  check_all("power", n, [&](int64_t i) { return f32_at(outs[m], i); },
            [&](int64_t i) { return std::pow(f32_at(pb, i), double(A(i))); }, 0, 2 * kEps32);
  check_all("multiply into bf16", n, [&](int64_t i) { return bf16_at(outs[m + 1], i); },
            [&](int64_t i) { return round_format(A(i) * B(i), kBF16); });
  check_all("less_equal into uint8", n, [&](int64_t i) { return double(int_at(outs[m + 2], i)); },
            [&](int64_t i) { return A(i) <= B(i) ? 1.0 : 0.0; });
  check_all("subtract with a PSUM operand", n, [&](int64_t i) { return f32_at(outs[m + 3], i); },
            [&](int64_t i) { return double(A(i) - B(i)); });
}

TEST_CASE("instr: tensor_tensor bitwise operators on integer bit patterns, and int32 on GpSimd") {
  HostTensor a = integers(DType::int32, {64, 32}, 20, INT32_MIN, INT32_MAX);
  HostTensor b = integers(DType::int32, {64, 32}, 21, INT32_MIN, INT32_MAX);
  HostTensor s = integers(DType::int32, {64, 32}, 22, 0, 31);  // shift counts
  HostTensor a16 = integers(DType::int16, {64, 32}, 23, INT16_MIN, INT16_MAX);
  HostTensor s16 = integers(DType::int16, {64, 32}, 24, 0, 15);
  HostTensor u8a = integers(DType::uint8, {64, 32}, 25, 0, 255), u8b = integers(DType::uint8, {64, 32}, 26, 0, 255);
  HostTensor big = integers(DType::int32, {64, 32}, 27, -(1 << 30), 1 << 30);
  auto outs = run(
      [](Tensor a, Tensor b, Tensor s, Tensor a16, Tensor s16, Tensor u8a, Tensor u8b, Tensor big) {
        Tensor ta = to_sbuf(a), tb = to_sbuf(b), ts = to_sbuf(s), t16 = to_sbuf(a16), ts16 = to_sbuf(s16),
               tu = to_sbuf(u8a), tv = to_sbuf(u8b), tg = to_sbuf(big);
        std::vector<Tensor> r;
        auto op = [&](const Tensor& x, const Tensor& y, const nl::Op& o, Engine e = isa::unknown_engine) {
          Tensor d = nl::ndarray(x.shape(), x.dtype(), nl::sbuf);
          isa::tensor_tensor(d, x, y, o, e);
          r.push_back(to_hbm(d));
        };
        op(ta, tb, nl::bitwise_and);
        op(ta, tb, nl::bitwise_or);
        op(ta, tb, nl::bitwise_xor);
        op(ta, ts, nl::left_shift);
        op(ta, ts, nl::right_shift);
        op(t16, ts16, nl::left_shift);
        op(t16, ts16, nl::right_shift);
        op(tu, tv, nl::bitwise_xor);
        // int32 tiles on GpSimd: exact wrapping integer arithmetic.
        op(tg, ta, nl::add, isa::gpsimd_engine);
        op(tg, ta, nl::subtract, isa::gpsimd_engine);
        op(tg, ta, nl::multiply, isa::gpsimd_engine);
        op(tg, ta, nl::maximum, isa::gpsimd_engine);
        op(tg, ta, nl::minimum, isa::gpsimd_engine);
        // The same add on the vector engine computes in fp32.
        op(tg, ta, nl::add, isa::vector_engine);
        return r;
      },
      a, b, s, a16, s16, u8a, u8b, big);
  const int64_t n = a.size();
  auto U = [&](const HostTensor& t, int64_t i) { return uint32_t(int_at(t, i)); };
  auto as_i32 = [](uint32_t v) { return double(int32_t(v)); };
  auto as_i16 = [](uint32_t v) { return double(int16_t(uint16_t(v))); };
  auto got = [&](int k) { return [&, k](int64_t i) { return double(int_at(outs[k], i)); }; };
  check_all("and", n, got(0), [&](int64_t i) { return as_i32(U(a, i) & U(b, i)); });
  check_all("or", n, got(1), [&](int64_t i) { return as_i32(U(a, i) | U(b, i)); });
  check_all("xor", n, got(2), [&](int64_t i) { return as_i32(U(a, i) ^ U(b, i)); });
  check_all("left_shift", n, got(3), [&](int64_t i) { return as_i32(U(a, i) << U(s, i)); });
  check_all("right_shift is logical", n, got(4), [&](int64_t i) { return as_i32(U(a, i) >> U(s, i)); });
  check_all("left_shift int16", n, got(5), [&](int64_t i) { return as_i16(uint16_t(U(a16, i)) << U(s16, i)); });
  check_all("right_shift int16", n, got(6), [&](int64_t i) { return as_i16(uint16_t(U(a16, i)) >> U(s16, i)); });
  check_all("xor uint8", n, got(7), [&](int64_t i) { return double(U(u8a, i) ^ U(u8b, i)); });
  check_all("gpsimd add", n, got(8), [&](int64_t i) { return as_i32(U(big, i) + U(a, i)); });
  check_all("gpsimd subtract", n, got(9), [&](int64_t i) { return as_i32(U(big, i) - U(a, i)); });
  check_all("gpsimd multiply", n, got(10), [&](int64_t i) { return as_i32(U(big, i) * U(a, i)); });
  check_all("gpsimd maximum", n, got(11), [&](int64_t i) { return double(std::max(int_at(big, i), int_at(a, i))); });
  check_all("gpsimd minimum", n, got(12), [&](int64_t i) { return double(std::min(int_at(big, i), int_at(a, i))); });
  check_all("vector add (fp32)", n, got(13), [&](int64_t i) {
    const float sum = float(int_at(big, i)) + float(int_at(a, i));
    return int_convert(sum, DType::int32);
  });
}

TEST_CASE("instr: tensor_scalar with one and two operators, reverse flags, [P, 1] operands, unary operators") {
  HostTensor x = uniform(DType::float32, {128, 48}, 30, -2, 2);
  HostTensor c0 = uniform(DType::float32, {128, 1}, 31, -1, 1), c1 = uniform(DType::float32, {128, 1}, 32, 0.5f, 1.5f);
  struct Case {
    const char* what;
    std::function<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&)> emit;  // dst, x, c0, c1
    std::function<double(float, float, float)> ref;                                    // x, c0, c1
    DType dst = DType::float32;
    double rtol = 0;
  };
  const std::vector<Case> cases = {
      {"x * 2.5", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::multiply, 2.5); },
       [](float x, float, float) { return x * 2.5f; }},
      {"(x - c0) * c1",
       [](auto& d, auto& x, auto& c0, auto& c1) {
         isa::tensor_scalar(d, x, nl::subtract, c0, {.op1 = nl::multiply, .operand1 = c1});
       },
       [](float x, float c0, float c1) { return (x - c0) * c1; }},
      {"0.25 - (1 - x) (reverse0, reverse1)",
       [](auto& d, auto& x, auto&, auto&) {
         isa::tensor_scalar(d, x, nl::subtract, 1.0,
                            {.reverse0 = true, .op1 = nl::subtract, .operand1 = 0.25, .reverse1 = true});
       },
       [](float x, float, float) { return 0.25f - (1.0f - x); }},
      {"c0 - x (reverse0, vector operand)",
       [](auto& d, auto& x, auto& c0, auto&) { isa::tensor_scalar(d, x, nl::subtract, c0, {.reverse0 = true}); },
       [](float x, float c0, float) { return c0 - x; }},
      {"min(max(x, -0.5), c1)",
       [](auto& d, auto& x, auto&, auto& c1) {
         isa::tensor_scalar(d, x, nl::maximum, -0.5, {.op1 = nl::minimum, .operand1 = c1});
       },
       [](float x, float, float c1) { return std::min(std::max(x, -0.5f), c1); }},
      {"x > c0 into uint8",
       [](auto& d, auto& x, auto& c0, auto&) { isa::tensor_scalar(d, x, nl::greater, c0); },
       [](float x, float c0, float) { return x > c0 ? 1.0 : 0.0; }, DType::uint8},
      {"(x >= 0) * 3",
       [](auto& d, auto& x, auto&, auto&) {
         isa::tensor_scalar(d, x, nl::greater_equal, 0.0, {.op1 = nl::multiply, .operand1 = 3.0});
       },
       [](float x, float, float) { return x >= 0 ? 3.0 : 0.0; }},
      {"x * c1 + c0 on the scalar engine",
       [](auto& d, auto& x, auto& c0, auto& c1) {
         isa::tensor_scalar(d, x, nl::multiply, c1, {.op1 = nl::add, .operand1 = c0, .engine = isa::scalar_engine});
       },
       [](float x, float c0, float c1) { return x * c1 + c0; }},
      {"x * 3 into bf16", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::multiply, 3.0); },
       [](float x, float, float) { return round_format(x * 3.0f, kBF16); }, DType::bfloat16},
      // Unary operators: operand0 is 0 and ignored.
      {"abs", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::abs, 0.0); },
       [](float x, float, float) { return std::fabs(x); }},
      {"square", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::square, 0.0); },
       [](float x, float, float) { return x * x; }},
      {"relu", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::relu, 0.0); },
       [](float x, float, float) { return x > 0 ? x : 0.0f; }},
      {"negative", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::negative, 0.0); },
       [](float x, float, float) { return -x; }},
      {"reciprocal", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::reciprocal, 0.0); },
       [](float x, float, float) { return 1.0f / x; }},
      // rsqrt: fp32 result of 1/sqrt, allowed 1 ulp (NaN for negative inputs).
      {"rsqrt", [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::rsqrt, 0.0); },
       [](float x, float, float) { return 1.0 / std::sqrt(double(x)); }, DType::float32, 2 * kEps32},
      {"rsqrt on gpsimd",
       [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::rsqrt, 0.0, {.engine = isa::gpsimd_engine}); },
       [](float x, float, float) { return 1.0 / std::sqrt(double(x)); }, DType::float32, 2 * kEps32},
      {"abs(x * -3) (unary op1)",
       [](auto& d, auto& x, auto&, auto&) {
         isa::tensor_scalar(d, x, nl::multiply, -3.0, {.op1 = nl::abs, .operand1 = 0.0});
       },
       [](float x, float, float) { return std::fabs(x * -3.0f); }},
      // A unary operator has one operand, so reversing it changes nothing.
      {"abs with reverse0",
       [](auto& d, auto& x, auto&, auto&) { isa::tensor_scalar(d, x, nl::abs, 0.0, {.reverse0 = true}); },
       [](float x, float, float) { return std::fabs(x); }},
      {"square(x + 1) with reverse1",
       [](auto& d, auto& x, auto&, auto&) {
         isa::tensor_scalar(d, x, nl::add, 1.0, {.op1 = nl::square, .operand1 = 0.0, .reverse1 = true});
       },
       [](float x, float, float) { return (x + 1.0f) * (x + 1.0f); }},
  };
  auto outs = run(
      [&](Tensor x, Tensor c0, Tensor c1) {
        Tensor sx = to_sbuf(x), s0 = to_sbuf(c0), s1 = to_sbuf(c1);
        std::vector<Tensor> r;
        for (const Case& c : cases) {
          Tensor d = nl::ndarray({128, 48}, c.dst, nl::sbuf);
          c.emit(d, sx, s0, s1);
          r.push_back(to_hbm(d));
        }
        return r;
      },
      x, c0, c1);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    check_all(c.what, x.size(),
              [&](int64_t i) {
                return c.dst == DType::float32 ? f32_at(outs[k], i)
                       : c.dst == DType::bfloat16 ? bf16_at(outs[k], i)
                                                  : double(int_at(outs[k], i));
              },
              [&](int64_t i) {
                return c.ref(float(f32_at(x, i)), float(f32_at(c0, i / 48)), float(f32_at(c1, i / 48)));
              },
              0, c.rtol);
  }
}

TEST_CASE("instr: tensor_scalar bitwise operators on integer tiles") {
  HostTensor x = integers(DType::int32, {64, 16}, 40, INT32_MIN, INT32_MAX);
  HostTensor col = integers(DType::int32, {64, 1}, 41, INT32_MIN, INT32_MAX);
  HostTensor sh = integers(DType::int32, {64, 16}, 42, 0, 31);
  HostTensor u = integers(DType::uint16, {64, 16}, 43, 0, 65535);
  auto outs = run(
      [](Tensor x, Tensor col, Tensor sh, Tensor u) {
        Tensor sx = to_sbuf(x), sc = to_sbuf(col), ss = to_sbuf(sh), su = to_sbuf(u);
        std::vector<Tensor> r;
        auto out = [&](DType d, auto&& emit) {
          Tensor t = nl::ndarray({64, 16}, d, nl::sbuf);
          emit(t);
          r.push_back(to_hbm(t));
        };
        out(nl::int32, [&](const Tensor& d) {
          isa::tensor_scalar(d, sx, nl::bitwise_and, 0xFF, {.op1 = nl::left_shift, .operand1 = 4});
        });
        out(nl::int32, [&](const Tensor& d) { isa::tensor_scalar(d, sx, nl::bitwise_xor, sc); });
        out(nl::int32, [&](const Tensor& d) { isa::tensor_scalar(d, sx, nl::right_shift, 3); });
        out(nl::int32, [&](const Tensor& d) { isa::tensor_scalar(d, sx, nl::invert, 0); });
        out(nl::int32, [&](const Tensor& d) {  // 1 << sh, then | 0x10
          isa::tensor_scalar(d, ss, nl::left_shift, 1, {.reverse0 = true, .op1 = nl::bitwise_or, .operand1 = 0x10});
        });
        out(nl::int32, [&](const Tensor& d) {  // 0x7fffffff >> (sh & 7)
          isa::tensor_scalar(d, ss, nl::bitwise_and, 7,
                             {.op1 = nl::right_shift, .operand1 = 0x7fffffff, .reverse1 = true});
        });
        out(nl::uint16, [&](const Tensor& d) { isa::tensor_scalar(d, su, nl::bitwise_or, 0x8001); });
        return r;
      },
      x, col, sh, u);
  const int64_t n = x.size();
  auto X = [&](int64_t i) { return uint32_t(int_at(x, i)); };
  auto S = [&](int64_t i) { return uint32_t(int_at(sh, i)); };
  auto i32 = [](uint32_t v) { return double(int32_t(v)); };
  auto got = [&](int k) { return [&, k](int64_t i) { return double(int_at(outs[k], i)); }; };
  check_all("(x & 0xff) << 4", n, got(0), [&](int64_t i) { return i32((X(i) & 0xFFu) << 4); });
  check_all("x ^ col", n, got(1), [&](int64_t i) { return i32(X(i) ^ uint32_t(int_at(col, i / 16))); });
  check_all("x >> 3 (logical)", n, got(2), [&](int64_t i) { return i32(X(i) >> 3); });
  check_all("~x", n, got(3), [&](int64_t i) { return i32(~X(i)); });
  check_all("(1 << sh) | 0x10", n, got(4), [&](int64_t i) { return i32((1u << S(i)) | 0x10u); });
  check_all("0x7fffffff >> (sh & 7)", n, got(5), [&](int64_t i) { return i32(0x7fffffffu >> (S(i) & 7)); });
  check_all("uint16 | 0x8001", n, got(6), [&](int64_t i) { return double(uint32_t(int_at(u, i)) | 0x8001u); });
}

TEST_CASE("instr: scalar_tensor_tensor and reciprocal") {
  HostTensor x = uniform(DType::float32, {128, 40}, 50, -2, 2), y = uniform(DType::float32, {128, 40}, 51, -2, 2);
  HostTensor c = uniform(DType::float32, {128, 1}, 52, -1, 1);
  HostTensor r = uniform(DType::float32, {128, 40}, 53, -4, 4);
  set_f32(r, 0, 0.0f);
  set_f32(r, 1, -0.0f);
  set_f32(r, 2, float(kInf));
  set_f32(r, 3, 1e-40f);  // subnormal: 1/x overflows to inf in fp32
  auto outs = run(
      [](Tensor x, Tensor y, Tensor c, Tensor r) {
        Tensor sx = to_sbuf(x), sy = to_sbuf(y), sc = to_sbuf(c), sr = to_sbuf(r);
        std::vector<Tensor> o;
        auto stt = [&](const nl::Op& op0, isa::Scalar s, const nl::Op& op1, bool r0, bool r1) {
          Tensor d = nl::ndarray({128, 40}, nl::float32, nl::sbuf);
          isa::scalar_tensor_tensor(d, sx, op0, s, op1, sy, r0, r1);
          o.push_back(to_hbm(d));
        };
        stt(nl::multiply, sc, nl::add, false, false);
        stt(nl::subtract, 2.0, nl::multiply, true, false);
        stt(nl::multiply, 0.5, nl::subtract, false, true);
        stt(nl::maximum, sc, nl::subtract, true, true);
        Tensor rr = nl::ndarray({128, 40}, nl::float32, nl::sbuf);
        isa::reciprocal(rr, sr);
        o.push_back(to_hbm(rr));
        Tensor rh = nl::ndarray({128, 40}, nl::bfloat16, nl::sbuf);
        isa::reciprocal(rh, sr);
        o.push_back(to_hbm(rh));
        return o;
      },
      x, y, c, r);
  const int64_t n = x.size();
  auto X = [&](int64_t i) { return float(f32_at(x, i)); };
  auto Y = [&](int64_t i) { return float(f32_at(y, i)); };
  auto C = [&](int64_t i) { return float(f32_at(c, i / 40)); };
  auto got = [&](int k) { return [&, k](int64_t i) { return f32_at(outs[k], i); }; };
  // Two fp32 operations in the documented order: exact.
  check_all("(x * c) + y", n, got(0), [&](int64_t i) { return double((X(i) * C(i)) + Y(i)); });
  check_all("(2 - x) * y", n, got(1), [&](int64_t i) { return double((2.0f - X(i)) * Y(i)); });
  check_all("y - (x * 0.5)", n, got(2), [&](int64_t i) { return double(Y(i) - X(i) * 0.5f); });
  check_all("y - max(c, x)", n, got(3), [&](int64_t i) { return double(Y(i) - std::max(C(i), X(i))); });
  // reciprocal is one correctly rounded fp32 division.
  check_all("reciprocal", n, got(4), [&](int64_t i) { return double(1.0f / float(f32_at(r, i))); });
  check_all("reciprocal into bf16", n, [&](int64_t i) { return bf16_at(outs[5], i); },
            [&](int64_t i) { return round_format(1.0f / float(f32_at(r, i)), kBF16); });
}

// =================================================================================================
// Scalar engine: activation
// =================================================================================================

namespace {

double sigmoid_ref(double x) { return 0.5 * (1.0 + std::tanh(0.5 * x)); }

/** Central difference; with h = 1e-5 its error (~h^2 f''' / 6 + 1e-16 f / h) is below 1e-10 here. */
template <class F>
double derivative(F&& f, double x, double h = 1e-5) {
  return (f(x + h) - f(x - h)) / (2 * h);
}

/** Activation functions from their textbook definitions (the *_dx ones by differentiation). */
double act_ref(std::string_view name, double x) {
  constexpr double pi = 3.14159265358979323846;
  auto gelu = [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); };
  auto gelu_sig = [](double v) { return v * sigmoid_ref(1.702 * v); };
  auto silu = [](double v) { return v * sigmoid_ref(v); };
  auto erf = [](double v) { return std::erf(v); };
  // erf differentiated through erfc of the tail side, so the difference quotient does not cancel.
  auto erf_tail = [x](double v) { return x > 0 ? -std::erfc(v) : std::erfc(-v); };
  if (name == "copy") return x;
  if (name == "square") return x * x;
  if (name == "sigmoid") return sigmoid_ref(x);
  if (name == "relu") return x > 0 ? x : 0;
  if (name == "gelu") return gelu(x);
  if (name == "gelu_dx") return derivative(gelu, x);
  if (name == "gelu_apprx_tanh") return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
  if (name == "gelu_apprx_sigmoid") return gelu_sig(x);
  if (name == "gelu_apprx_sigmoid_dx") return derivative(gelu_sig, x);
  if (name == "silu") return silu(x);
  if (name == "silu_dx") return derivative(silu, x);
  if (name == "tanh") return std::tanh(x);
  if (name == "softplus") return std::log1p(std::exp(x));
  if (name == "mish") return x * std::tanh(std::log1p(std::exp(x)));
  if (name == "erf") return erf(x);
  if (name == "erf_dx") return derivative(erf_tail, x);
  if (name == "exp") return std::exp(x);
  if (name == "log") return std::log(x);
  if (name == "sin") return std::sin(x);
  if (name == "arctan") return std::atan(x);
  if (name == "sqrt") return std::sqrt(x);
  if (name == "rsqrt") return 1 / std::sqrt(x);
  if (name == "reciprocal") return 1 / x;
  if (name == "sign") return x > 0 ? 1 : x < 0 ? -1 : 0;
  if (name == "abs") return std::fabs(x);
  throw std::logic_error("no reference for this activation");
}

/**
 * Tolerance of an activation result at argument a (a = x * scale + bias, exact in double): the
 * engine rounds a to fp32 (relative error <= 2^-24, moving f by |f'(a) a| 2^-24) and rounds f to
 * fp32 (<= 2^-24 |f|); twice that sum covers second-order terms. The hardware uses polynomial
 * approximations; nikki evaluates the exact function, which is what is checked here.
 */
double act_tol(std::string_view name, double a) {
  const double f = act_ref(name, a);
  const double df = derivative([&](double v) { return act_ref(name, v); }, a, 1e-4);
  return 2 * kEps32 * (std::fabs(df * a) + std::fabs(f)) + 1e-30;
}

struct ActCase {
  nl::Op op;
  int domain;  // 0: [-3, 3], 1: [0.5, 3], 2: [-2, 2], 3: [-0.95, 0.95]
};
// With scale in [0.5, 1.5] and bias in [-0.1, 0.1], every argument stays inside the function's
// documented valid range (log, sqrt, rsqrt, reciprocal > 0.15; |sin arg| < pi; |arctan arg| < pi/2).
const ActCase kActCases[] = {
    {nl::copy, 0},    {nl::square, 0},  {nl::sigmoid, 0},  {nl::relu, 0},   {nl::gelu, 0},
    {nl::gelu_dx, 0}, {nl::gelu_apprx_tanh, 0}, {nl::gelu_apprx_sigmoid, 0}, {nl::gelu_apprx_sigmoid_dx, 0},
    {nl::silu, 0},    {nl::silu_dx, 0}, {nl::tanh, 0},     {nl::softplus, 0}, {nl::mish, 0},
    {nl::erf, 0},     {nl::erf_dx, 0},  {nl::exp, 0},      {nl::log, 1},    {nl::sin, 2},
    {nl::arctan, 3},  {nl::sqrt, 1},    {nl::rsqrt, 1},    {nl::reciprocal, 1}, {nl::sign, 0},
    {nl::abs, 0}};

}  // namespace

TEST_CASE("instr: activation computes op(data * scale + bias) for every activation function") {
  static_assert(std::size(kActCases) == kNumActFuncs);
  HostTensor xs[4] = {uniform(DType::float32, {128, 32}, 60, -3, 3), uniform(DType::float32, {128, 32}, 61, 0.5f, 3),
                      uniform(DType::float32, {128, 32}, 62, -2, 2),
                      uniform(DType::float32, {128, 32}, 63, -0.95f, 0.95f)};
  HostTensor scale = uniform(DType::float32, {128, 1}, 64, 0.5f, 1.5f);
  HostTensor bias = uniform(DType::float32, {128, 1}, 65, -0.1f, 0.1f);
  auto outs = run(
      [](Tensor x0, Tensor x1, Tensor x2, Tensor x3, Tensor scale, Tensor bias) {
        Tensor sx[4] = {to_sbuf(x0), to_sbuf(x1), to_sbuf(x2), to_sbuf(x3)};
        Tensor ss = to_sbuf(scale), sb = to_sbuf(bias);
        std::vector<Tensor> r;
        for (const ActCase& c : kActCases) {
          Tensor d = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
          isa::activation(d, c.op, sx[c.domain], {.bias = sb, .scale = ss});
          r.push_back(to_hbm(d));
        }
        // Immediate scale, no bias.
        Tensor e = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
        isa::activation(e, nl::exp, sx[0], {.scale = -0.5});
        r.push_back(to_hbm(e));
        // bf16 destination, bf16 bias, data read from PSUM.
        Tensor ps = nl::ndarray({128, 32}, nl::float32, nl::psum);
        isa::tensor_copy(ps, sx[0]);
        Tensor hb = to_sbuf(bias, nl::bfloat16);
        Tensor g = nl::ndarray({128, 32}, nl::bfloat16, nl::sbuf);
        isa::activation(g, nl::gelu, ps, {.bias = hb, .scale = 1.25});
        r.push_back(to_hbm(g));
        return r;
      },
      xs[0], xs[1], xs[2], xs[3], scale, bias);
  const int64_t n = 128 * 32;
  for (size_t k = 0; k < std::size(kActCases); ++k) {
    const ActCase& c = kActCases[k];
    const std::string_view name = c.op.name;
    auto arg = [&](int64_t i) { return f32_at(xs[c.domain], i) * f32_at(scale, i / 32) + f32_at(bias, i / 32); };
    check_within(std::string(name), n, [&](int64_t i) { return f32_at(outs[k], i); },
                 [&](int64_t i) { return act_ref(name, arg(i)); }, [&](int64_t i) { return act_tol(name, arg(i)); });
  }
  const size_t m = std::size(kActCases);
  check_within("exp(-0.5 x)", n, [&](int64_t i) { return f32_at(outs[m], i); },
               [&](int64_t i) { return std::exp(-0.5 * f32_at(xs[0], i)); },
               [&](int64_t i) { return act_tol("exp", -0.5 * f32_at(xs[0], i)); });
  // bf16 output: the fp32 tolerance plus half a bf16 ulp (2^-8 relative); the bias is bf16-rounded.
  auto garg = [&](int64_t i) { return f32_at(xs[0], i) * 1.25 + round_format(f32_at(bias, i / 32), kBF16); };
  check_within("gelu into bf16 with bf16 bias from PSUM", n, [&](int64_t i) { return bf16_at(outs[m + 1], i); },
               [&](int64_t i) { return act_ref("gelu", garg(i)); },
               [&](int64_t i) { return act_tol("gelu", garg(i)) + 0x1p-8 * std::fabs(act_ref("gelu", garg(i))); });
}

TEST_CASE("instr: activation accumulators across reset / reduce / idle / reset_reduce sequences") {
  HostTensor x[4] = {uniform(DType::float32, {128, 32}, 70, -1, 1), uniform(DType::float32, {128, 32}, 71, -1, 1),
                     uniform(DType::float32, {128, 32}, 72, -1, 1), uniform(DType::float32, {128, 32}, 73, -1, 1)};
  auto outs = run(
      [](Tensor x0, Tensor x1, Tensor x2, Tensor x3) {
        Tensor s[4] = {to_sbuf(x0), to_sbuf(x1), to_sbuf(x2), to_sbuf(x3)};
        auto dst = [] { return nl::ndarray({128, 32}, nl::float32, nl::sbuf); };
        auto res = [] { return nl::ndarray({128, 1}, nl::float32, nl::sbuf); };
        Tensor r1 = res(), r2 = res(), r3 = res(), r4 = res(), r5 = res(), vr = res();
        // acc = 0 (the activation still writes its dst)
        isa::activation(dst(), nl::exp, s[0], {.reduce_op = nl::add, .reduce_cmd = ReduceCmd::reset});
        // acc += sum(x1)
        isa::activation(dst(), nl::copy, s[1], {.reduce_op = nl::add, .reduce_cmd = ReduceCmd::reduce});
        // idle: acc unchanged
        isa::activation(dst(), nl::square, s[2], {.reduce_op = nl::add, .reduce_cmd = ReduceCmd::idle});
        // the vector engine's accumulators are separate
        isa::tensor_scalar_reduce(dst(), s[3], nl::multiply, 100.0, nl::add, vr);
        // acc += sum(x3^2), read out: sum(x1) + sum(x3^2)
        isa::activation(dst(), nl::square, s[3],
                        {.reduce_op = nl::add, .reduce_res = r1, .reduce_cmd = ReduceCmd::reduce});
        // acc = sum(exp(x0))
        isa::activation(dst(), nl::exp, s[0],
                        {.reduce_op = nl::add, .reduce_res = r2, .reduce_cmd = ReduceCmd::reset_reduce});
        // activation_reduce = reset_reduce: sum(2 x2 + 1)
        isa::activation_reduce(dst(), nl::copy, s[2], nl::add, r3, std::nullopt, 2.0);
        // reset with a reduce_res reads the reset value
        isa::activation(dst(), nl::copy, s[1],
                        {.reduce_op = nl::add, .reduce_res = r4, .reduce_cmd = ReduceCmd::reset});
        isa::activation(dst(), nl::copy, s[1],
                        {.reduce_op = nl::add, .reduce_res = r5, .reduce_cmd = ReduceCmd::reduce});
        return std::vector<Tensor>{to_hbm(r1), to_hbm(r2), to_hbm(r3), to_hbm(r4), to_hbm(r5), to_hbm(vr)};
      },
      x[0], x[1], x[2], x[3]);
  // Row sums of values computed in double; fp32 sequential summation of 64 terms errs by at most
  // 64 * 2^-24 * sum|v| (plus the per-element rounding of exp/square, covered by the same bound).
  auto row = [&](int64_t p, auto&& f) {
    double s = 0, a = 0;
    for (int64_t j = 0; j < 32; ++j) {
      s += f(p * 32 + j);
      a += std::fabs(f(p * 32 + j));
    }
    return std::pair{s, a};
  };
  auto X = [&](int k) { return [&, k](int64_t i) { return f32_at(x[k], i); }; };
  struct Want {
    const char* what;
    std::function<std::pair<double, double>(int64_t)> sum;  // (value, sum of magnitudes)
  };
  const Want wants[] = {
      {"reduce after reset, idle, vector op", [&](int64_t p) {
         auto a = row(p, X(1));
         auto b = row(p, [&](int64_t i) { return X(3)(i) * X(3)(i); });
         return std::pair{a.first + b.first, a.second + b.second};
       }},
      {"reset_reduce", [&](int64_t p) { return row(p, [&](int64_t i) { return std::exp(X(0)(i)); }); }},
      {"activation_reduce", [&](int64_t p) { return row(p, [&](int64_t i) { return 2 * X(2)(i); }); }},
      {"reset", [&](int64_t) { return std::pair{0.0, 0.0}; }},
      {"reduce after reset", [&](int64_t p) { return row(p, X(1)); }},
      {"tensor_scalar_reduce", [&](int64_t p) { return row(p, [&](int64_t i) { return 100 * X(3)(i); }); }},
  };
  for (size_t k = 0; k < std::size(wants); ++k)
    check_within(wants[k].what, 128, [&](int64_t p) { return f32_at(outs[k], p); },
                 [&](int64_t p) { return wants[k].sum(p).first; },
                 [&](int64_t p) { return 64 * kEps32 * wants[k].sum(p).second; });
}

// =================================================================================================
// Reductions
// =================================================================================================

TEST_CASE("instr: tensor_reduce over one and several trailing axes, negate, keepdims, integer bitwise") {
  HostTensor x = uniform(DType::float32, {128, 4, 6, 5}, 80, 0.5f, 1.5f);
  HostTensor k = integers(DType::int32, {128, 4, 6, 5}, 81, INT32_MIN, INT32_MAX);
  HostTensor y = uniform(DType::float32, {128, 8, 10}, 82, -1, 1);
  struct Case {
    const char* what;
    nl::Op op;
    std::vector<int> axis;
    bool negate, keepdims;
    Shape dst;
    bool ints = false;
    DType dtype = DType::float32;
  };
  const std::vector<Case> cases = {
      {"add axis 3", nl::add, {3}, false, false, {128, 4, 6}},
      {"add axis 3 keepdims", nl::add, {3}, false, true, {128, 4, 6, 1}},
      {"max axes 2,3", nl::maximum, {2, 3}, false, false, {128, 4}},
      {"max axes 2,3 negate", nl::maximum, {2, 3}, true, false, {128, 4}},
      {"multiply axes 1,2,3", nl::multiply, {1, 2, 3}, false, false, {128, 1}},
      {"min axis -1 keepdims", nl::minimum, {-1}, false, true, {128, 4, 6, 1}},
      {"add all into bf16", nl::add, {1, 2, 3}, true, true, {128, 1, 1, 1}, false, DType::bfloat16},
      {"bitwise_and axes 2,3", nl::bitwise_and, {2, 3}, false, false, {128, 4}, true, DType::int32},
      {"bitwise_or axis 3", nl::bitwise_or, {3}, false, false, {128, 4, 6}, true, DType::int32},
      {"bitwise_xor axes 1,2,3", nl::bitwise_xor, {1, 2, 3}, false, false, {128, 1}, true, DType::int32},
  };
  auto outs = run(
      [&](Tensor x, Tensor k, Tensor y) {
        Tensor sx = to_sbuf(x), sk = to_sbuf(k), sy = to_sbuf(y);
        std::vector<Tensor> r;
        for (const Case& c : cases) {
          Tensor d = nl::ndarray(c.dst, c.dtype, nl::sbuf);
          isa::tensor_reduce(d, c.op, c.ints ? sk : sx, c.axis, c.negate, c.keepdims);
          r.push_back(to_hbm(d));
        }
        // Reduce a permuted view: sum over y's middle dim.
        Tensor d = nl::ndarray({128, 10}, nl::float32, nl::sbuf);
        isa::tensor_reduce(d, nl::add, sy.permute({0, 2, 1}), {2});
        r.push_back(to_hbm(d));
        return r;
      },
      x, k, y);
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& cs = cases[c];
    int first = 4;
    for (int a : cs.axis) first = std::min(first, a < 0 ? a + 4 : a);
    int64_t run_len = 1;
    for (int d = first; d < 4; ++d) run_len *= x.shape[d];
    const int64_t outputs = x.size() / run_len;
    const std::string_view op = cs.op.name;
    // Each output folds one contiguous run of data. add: double sum, error <= n 2^-24 sum|v|;
    // multiply: positive factors, error <= n 2^-24 |product|; max/min/bitwise: exact.
    std::vector<double> want(outputs), tol(outputs);
    for (int64_t o = 0; o < outputs; ++o) {
      double acc = op == "multiply" ? 1 : 0, mag = 0;
      uint32_t bits = op == "bitwise_and" ? ~0u : 0u;
      for (int64_t j = 0; j < run_len; ++j) {
        const int64_t i = o * run_len + j;
        const double v = cs.ints ? 0 : f32_at(x, i);
        const uint32_t b = cs.ints ? uint32_t(int_at(k, i)) : 0;
        if (op == "add") acc += v, mag += std::fabs(v);
        else if (op == "multiply") acc *= v;
        else if (op == "maximum") acc = j == 0 ? v : std::max(acc, v);
        else if (op == "minimum") acc = j == 0 ? v : std::min(acc, v);
        else if (op == "bitwise_and") bits &= b;
        else if (op == "bitwise_or") bits |= b;
        else bits ^= b;
      }
      if (cs.ints) acc = double(int32_t(bits));
      if (cs.negate) acc = -acc;
      tol[o] = op == "add" ? run_len * kEps32 * mag : op == "multiply" ? run_len * kEps32 * std::fabs(acc) : 0;
      if (cs.dtype == DType::bfloat16) {
        tol[o] += 0x1p-8 * std::fabs(acc);
      }
      want[o] = acc;
    }
    check_within(cs.what, outputs,
                 [&](int64_t o) {
                   return cs.dtype == DType::float32 ? f32_at(outs[c], o)
                          : cs.dtype == DType::bfloat16 ? bf16_at(outs[c], o)
                                                        : double(int_at(outs[c], o));
                 },
                 [&](int64_t o) { return want[o]; }, [&](int64_t o) { return tol[o]; });
  }
  check_within("add over a permuted view", 128 * 10, [&](int64_t i) { return f32_at(outs[cases.size()], i); },
               [&](int64_t i) {
                 double s = 0;
                 for (int64_t m = 0; m < 8; ++m) s += f32_at(y, (i / 10) * 80 + m * 10 + i % 10);
                 return s;
               },
               [&](int64_t) { return 8 * kEps32 * 8; });
}

TEST_CASE("instr: tensor_reduce sums pairwise and folds max / min as left to right, bit for bit") {
  // Exact references (reduction_reference.hpp): numpy's pairwise sum in float, and the sequential
  // maximum / minimum fold with NKI's NaN and tie rules. Runs from 1 to 3000 elements cover
  // short sequential sums, whole 8-accumulator blocks with and without leftovers, and the
  // recursive halving above 128; two-axis reductions fold the run in the view's row-major order.
  constexpr int64_t P = 8, N = 3000;
  const std::vector<int64_t> lengths = {1, 2, 7, 8, 9, 15, 16, 17, 100, 127, 128, 129, 136, 255, 256, 257, 1000, 2048, 2999};
  HostTensor x(DType::float32, {P, N}), t(DType::float32, {P, N});
  std::mt19937 rng(83);
  std::normal_distribution<float> normal;
  // Specials: partitions 0-3 hold no positive values (the maximum is a zero of either sign), 4-7
  // no negative ones (so is the minimum); partitions 2, 3, 6 and 7 also hold a few NaNs.
  const float below[] = {-0.0f, 0.0f, -1.0f, -1e30f, -float(kInf)}, above[] = {-0.0f, 0.0f, 1.0f, 1e30f, float(kInf)};
  for (int64_t i = 0; i < x.size(); ++i) {
    set_f32(x, i, normal(rng) * std::ldexp(1.0f, int(rng() % 16)));  // spread magnitudes: the order shows
    const int64_t p = i / N;
    const uint32_t r = rng() % 100;
    set_f32(t, i, (p & 2) && r == 0 ? float(kNaN) : (p < 4 ? below : above)[r % 5]);
  }
  const nl::Op ops[] = {nl::add, nl::maximum, nl::minimum};
  auto outs = run(
      [&](Tensor x, Tensor t) {
        Tensor sx = to_sbuf(x), st = to_sbuf(t);
        std::vector<Tensor> r;
        for (const nl::Op& op : ops)
          for (const Tensor& src : {sx, st}) {
            Tensor d = nl::ndarray({P, int64_t(lengths.size()) + 2}, nl::float32, nl::sbuf);
            for (size_t c = 0; c < lengths.size(); ++c)
              isa::tensor_reduce(d(nl::all, nl::ds(int64_t(c), 1)), op, src(nl::all, nl::ds(0, lengths[c])), {1});
            const int64_t c = int64_t(lengths.size());
            isa::tensor_reduce(d(nl::all, nl::ds(c, 1)), op, src.reshape({P, 24, 125}), {1, 2});
            isa::tensor_reduce(d(nl::all, nl::ds(c + 1, 1)), op, src.reshape({P, 125, 24}).permute({0, 2, 1}), {1, 2});
            r.push_back(to_hbm(d));
          }
        return r;
      },
      x, t);
  for (size_t o = 0; o < 6; ++o) {
    const HostTensor& in = o % 2 ? t : x;
    const AluOp op = static_cast<AluOp>(ops[o / 2].alu);
    const int64_t cols = int64_t(lengths.size()) + 2;
    for (int64_t p = 0; p < P; ++p)
      for (int64_t c = 0; c < cols; ++c) {
        std::vector<float> run(c < cols - 2 ? lengths[c] : N);
        for (int64_t i = 0; i < int64_t(run.size()); ++i) {
          // element i of the permuted view's run is (a, b) = (i / 125, i % 125), row element b * 24 + a
          const int64_t f = c == cols - 1 ? (i % 125) * 24 + i / 125 : i;
          run[i] = float(f32_at(in, p * N + f));
        }
        const uint32_t want = std::bit_cast<uint32_t>(test::fold_ref(op, run)), got = f32_bits_at(outs[o], p * cols + c);
        INFO(fmt::format("op {} data {} partition {} column {} (run {}): got {:#x}, want {:#x}", ops[o / 2].name,
                         o % 2 ? "specials" : "normal", p, c, run.size(), got, want));
        CHECK(got == want);
      }
  }
}

TEST_CASE("instr: tensor_scalar_reduce writes op0(data, operand0) and its row reduction") {
  HostTensor x = uniform(DType::float32, {128, 40}, 90, -2, 2);
  HostTensor pos = uniform(DType::float32, {128, 40}, 91, 0.8f, 1.25f);
  HostTensor c = uniform(DType::float32, {128, 1}, 92, -1, 1);
  struct Case {
    const char* what;
    nl::Op op0;
    bool col;
    double imm;
    nl::Op red;
    bool positive;
  };
  const Case cases[] = {{"x * c, add", nl::multiply, true, 0, nl::add, false},
                        {"x - 0.5, max", nl::subtract, false, 0.5, nl::maximum, false},
                        {"x + c, min", nl::add, true, 0, nl::minimum, false},
                        {"pos * 1.5, multiply", nl::multiply, false, 1.5, nl::multiply, true},
                        {"x >= 0, add (count)", nl::greater_equal, false, 0.0, nl::add, false}};
  auto outs = run(
      [&](Tensor x, Tensor pos, Tensor c) {
        Tensor sx = to_sbuf(x), sp = to_sbuf(pos), sc = to_sbuf(c);
        std::vector<Tensor> r;
        for (const Case& cs : cases) {
          Tensor d = nl::ndarray({128, 40}, nl::float32, nl::sbuf);
          Tensor res = nl::ndarray({128, 1}, nl::float32, nl::sbuf);
          isa::tensor_scalar_reduce(d, cs.positive ? sp : sx, cs.op0, cs.col ? isa::Scalar(sc) : isa::Scalar(cs.imm),
                                    cs.red, res);
          r.push_back(to_hbm(d));
          r.push_back(to_hbm(res));
        }
        return r;
      },
      x, pos, c);
  for (size_t k = 0; k < std::size(cases); ++k) {
    const Case& cs = cases[k];
    const HostTensor& data = cs.positive ? pos : x;
    auto elem = [&](int64_t i) {
      const float s = cs.col ? float(f32_at(c, i / 40)) : float(cs.imm);
      return alu_ref(cs.op0, float(f32_at(data, i)), s);
    };
    check_all(std::string(cs.what) + " (dst)", data.size(), [&](int64_t i) { return f32_at(outs[2 * k], i); }, elem);
    const std::string_view red = cs.red.name;
    // add/multiply: fp32 folding of 40 terms errs by at most 40 * 2^-24 of the magnitudes; max/min exact.
    std::vector<double> want(128), tol(128);
    for (int64_t p = 0; p < 128; ++p) {
      double acc = red == "multiply" ? 1 : red == "add" ? 0 : elem(p * 40), mag = 0;
      for (int64_t j = 0; j < 40; ++j) {
        const double v = elem(p * 40 + j);
        if (red == "add") acc += v, mag += std::fabs(v);
        else if (red == "multiply") acc *= v;
        else if (red == "maximum") acc = std::max(acc, v);
        else acc = std::min(acc, v);
      }
      want[p] = acc;
      tol[p] = red == "add" ? 40 * kEps32 * mag : red == "multiply" ? 40 * kEps32 * std::fabs(acc) : 0;
    }
    check_within(std::string(cs.what) + " (reduce_res)", 128, [&](int64_t p) { return f32_at(outs[2 * k + 1], p); },
                 [&](int64_t p) { return want[p]; }, [&](int64_t p) { return tol[p]; });
  }
}

// =================================================================================================
// Tensor engine: matmul and transposes
// =================================================================================================

namespace {

/** stationary.T @ moving over rows [k0, k0 + K) of row-major host matrices st [*, M], mv [*, N]. */
struct MatmulRef {
  std::vector<double> value, bound;  // bound: sum of |products|, for the fp32 accumulation error
};
using Matrix = std::function<double(int64_t, int64_t)>;
MatmulRef matmul_ref(const Matrix& st, const Matrix& mv, int64_t k0, int64_t K, int64_t M, int64_t N) {
  MatmulRef r{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = k0; k < k0 + K; ++k) {
        const double p = st(k, m) * mv(k, n);
        r.value[m * N + n] += p;
        r.bound[m * N + n] += std::fabs(p);
      }
  return r;
}

}  // namespace

TEST_CASE("instr: nc_matmul accumulate sequences, K tiles, fp32 / bf16 / fp8 inputs, partial PSUM tiles") {
  constexpr int64_t K = 200, M = 64, N = 192;
  HostTensor a = uniform(DType::float32, {K, M}, 100), b = uniform(DType::float32, {K, N}, 101);
  HostTensor ah = uniform(DType::bfloat16, {K, M}, 102), bh = uniform(DType::bfloat16, {K, N}, 103);
  HostTensor a8 = uniform(DType::float32, {128, 32}, 104, -4, 4), b8 = uniform(DType::float32, {128, 48}, 105, -4, 4);
  auto outs = run(
      [](Tensor a, Tensor b, Tensor ah, Tensor bh, Tensor a8, Tensor b8) {
        std::vector<Tensor> r;
        // Two K tiles (128 + 72 rows) accumulated with accumulate=None, fp32 and bf16.
        for (auto [x, y] : {std::pair{a, b}, std::pair{ah, bh}}) {
          Tensor acc = nl::ndarray({M, N}, nl::float32, nl::psum);
          for (int64_t k0 : {0, 128}) {
            const int64_t kt = std::min<int64_t>(128, K - k0);
            isa::nc_matmul(acc, to_sbuf(x(nl::ds(k0, kt), nl::all)), to_sbuf(y(nl::ds(k0, kt), nl::all)));
          }
          r.push_back(to_hbm(acc));
        }
        // Explicit accumulate flags: None (first write overwrites), None (accumulates), False, True.
        Tensor a0 = to_sbuf(a(nl::ds(0, 128), nl::all)), b0 = to_sbuf(b(nl::ds(0, 128), nl::all));
        Tensor a1 = to_sbuf(a(nl::ds(128, 72), nl::all)), b1 = to_sbuf(b(nl::ds(128, 72), nl::all));
        Tensor p = nl::ndarray({M, N}, nl::float32, nl::psum);
        isa::nc_matmul(p, a0, b0);
        isa::nc_matmul(p, a1, b1);
        r.push_back(to_hbm(p));  // a0.T b0 + a1.T b1
        isa::nc_matmul(p, a1, b1, {.accumulate = false});
        r.push_back(to_hbm(p));  // a1.T b1
        isa::nc_matmul(p, a0, b0, {.accumulate = true});
        r.push_back(to_hbm(p));  // a1.T b1 + a0.T b0
        // Partial tiles of one PSUM tensor; the rest keeps its NaN sentinel.
        Tensor q = nl::ndarray({128, 256}, nl::float32, nl::psum);
        isa::nc_matmul(q(nl::ds(0, 64), nl::ds(0, 100)), a0, b0(nl::all, nl::ds(0, 100)));
        isa::nc_matmul(q(nl::ds(64, 64), nl::ds(100, 100)), a0, b0(nl::all, nl::ds(92, 100)));
        isa::nc_matmul(q(nl::ds(0, 32), nl::ds(200, 56)), a0(nl::all, nl::ds(32, 32)), b0(nl::all, nl::ds(0, 56)));
        r.push_back(to_hbm(q));
        // fp8 e4m3 inputs (the DMA rounds them), and accumulate=True onto a fresh PSUM tile.
        Tensor s8 = to_sbuf(a8, nl::float8_e4m3), m8 = to_sbuf(b8, nl::float8_e4m3);
        Tensor f8 = nl::ndarray({32, 48}, nl::float32, nl::psum);
        isa::nc_matmul(f8, s8, m8);
        r.push_back(to_hbm(f8));
        Tensor fresh = nl::ndarray({32, 48}, nl::float32, nl::psum);
        isa::nc_matmul(fresh, s8, m8, {.accumulate = true});
        r.push_back(to_hbm(fresh));
        return r;
      },
      a, b, ah, bh, a8, b8);
  auto A = [&](int64_t k, int64_t m) { return f32_at(a, k * M + m); };
  auto B = [&](int64_t k, int64_t n) { return f32_at(b, k * N + n); };
  auto AH = [&](int64_t k, int64_t m) { return bf16_at(ah, k * M + m); };
  auto BH = [&](int64_t k, int64_t n) { return bf16_at(bh, k * N + n); };
  // Products of fp32 (or bf16) inputs accumulated in fp32 (fma) over at most K terms: the error is
  // at most (K + 1) 2^-24 sum|products| (+1 for the PSUM add between instructions).
  auto check_mm = [&](const char* what, const HostTensor& out, const MatmulRef& ref, int64_t K_terms) {
    check_within(what, int64_t(ref.value.size()), [&](int64_t i) { return f32_at(out, i); },
                 [&](int64_t i) { return ref.value[i]; },
                 [&](int64_t i) { return (K_terms + 1) * kEps32 * ref.bound[i] + 1e-30; });
  };
  const MatmulRef full = matmul_ref(A, B, 0, K, M, N), lo = matmul_ref(A, B, 0, 128, M, N),
                  hi = matmul_ref(A, B, 128, 72, M, N);
  check_mm("fp32, two K tiles", outs[0], full, K);
  check_mm("bf16, two K tiles", outs[1], matmul_ref(AH, BH, 0, K, M, N), K);
  check_mm("accumulate None, None", outs[2], full, K);
  check_mm("accumulate False", outs[3], hi, 72);
  check_mm("accumulate True", outs[4], full, K);
  // Partial tiles.
  const MatmulRef q1 = lo;
  const MatmulRef q3 = matmul_ref([&](int64_t k, int64_t m) { return A(k, m + 32); }, B, 0, 128, 32, 56);
  std::vector<double> qv(128 * 256, kNaN), qb(128 * 256, 0);
  for (int64_t m = 0; m < 64; ++m)
    for (int64_t n = 0; n < 100; ++n) {
      qv[m * 256 + n] = q1.value[m * N + n];
      qb[m * 256 + n] = q1.bound[m * N + n];
      qv[(m + 64) * 256 + 100 + n] = q1.value[m * N + n + 92];
      qb[(m + 64) * 256 + 100 + n] = q1.bound[m * N + n + 92];
    }
  for (int64_t m = 0; m < 32; ++m)
    for (int64_t n = 0; n < 56; ++n) {
      qv[m * 256 + 200 + n] = q3.value[m * 56 + n];
      qb[m * 256 + 200 + n] = q3.bound[m * 56 + n];
    }
  check_within("partial PSUM tiles", 128 * 256, [&](int64_t i) { return f32_at(outs[5], i); },
               [&](int64_t i) { return qv[i]; }, [&](int64_t i) { return 129 * kEps32 * qb[i] + 1e-30; });
  const MatmulRef r8 = matmul_ref([&](int64_t k, int64_t m) { return round_format(f32_at(a8, k * 32 + m), kE4M3); },
                                  [&](int64_t k, int64_t n) { return round_format(f32_at(b8, k * 48 + n), kE4M3); },
                                  0, 128, 32, 48);
  check_mm("fp8 e4m3", outs[6], r8, 128);
  check_all("accumulate=True onto fresh PSUM keeps the NaN sentinel", 32 * 48,
            [&](int64_t i) { return f32_at(outs[7], i); }, [](int64_t) { return kNaN; });
}

TEST_CASE("instr: nc_transpose (tensor and vector engine) and nc_matmul is_transpose are bit exact") {
  HostTensor x = uniform(DType::float32, {128, 96}, 110);
  const uint32_t specials[] = {0x7fc00000u, 0xffa00001u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                               0x80000000u, 0x00000000u, 0x00000001u, 0x7f7fffffu};
  for (int i = 0; i < 9; ++i) std::memcpy(x.bytes.data() + 4 * (i * 101), &specials[i], 4);
  HostTensor h(DType::bfloat16, {64, 128});
  for (int64_t i = 0; i < h.size(); ++i) {
    const uint16_t v = uint16_t(i * 40503u);  // spreads over all patterns, NaNs and -0 included
    std::memcpy(h.bytes.data() + 2 * i, &v, 2);
  }
  HostTensor k = integers(DType::int32, {16, 32}, 111, INT32_MIN, INT32_MAX);
  HostTensor eye(DType::float32, {64, 64});
  for (int64_t i = 0; i < 64; ++i) set_f32(eye, i * 64 + i, 1.0f);
  HostTensor eyeh(DType::bfloat16, {64, 64});
  for (int64_t i = 0; i < 64; ++i) eyeh.set_int(i * 64 + i, 0x3f80);  // bf16 1.0
  auto outs = run(
      [](Tensor x, Tensor h, Tensor k, Tensor eye, Tensor eyeh) {
        Tensor sx = to_sbuf(x), sh = to_sbuf(h), sk = to_sbuf(k), se = to_sbuf(eye), seh = to_sbuf(eyeh);
        std::vector<Tensor> r;
        Tensor tx = nl::ndarray({96, 128}, nl::float32, nl::psum);
        isa::nc_transpose(tx, sx);  // PSUM destination: tensor engine
        r.push_back(to_hbm(tx));
        Tensor th = nl::ndarray({128, 64}, nl::bfloat16, nl::psum);
        isa::nc_transpose(th, sh, isa::tensor_engine);
        r.push_back(to_hbm(th));
        Tensor vx = nl::ndarray({20, 32}, nl::float32, nl::sbuf);
        isa::nc_transpose(vx, sx(nl::ds(0, 32), nl::ds(0, 20)), isa::vector_engine);
        r.push_back(to_hbm(vx));
        Tensor vk = nl::ndarray({32, 16}, nl::int32, nl::sbuf);
        isa::nc_transpose(vk, sk);
        r.push_back(to_hbm(vk));
        // Several free dims are flattened first: [16, 2, 16] -> [32, 16].
        Tensor vf = nl::ndarray({32, 16}, nl::int32, nl::sbuf);
        isa::nc_transpose(vf, sk.reshape({16, 2, 16}));
        r.push_back(to_hbm(vf));
        // matmul transpose mode: stationary data against an identity moving tile.
        Tensor mt = nl::ndarray({32, 64}, nl::float32, nl::psum);
        isa::nc_matmul(mt, sx(nl::ds(0, 64), nl::ds(0, 32)), se, {.is_transpose = true});
        r.push_back(to_hbm(mt));
        Tensor mth = nl::ndarray({128, 64}, nl::bfloat16, nl::psum);
        isa::nc_matmul(mth, sh, seh, {.is_transpose = true});
        r.push_back(to_hbm(mth));
        return r;
      },
      x, h, k, eye, eyeh);
  auto xbits = [&](int64_t p, int64_t f) { return double(f32_bits_at(x, p * 96 + f)); };
  check_all("tensor engine fp32", 96 * 128, [&](int64_t i) { return double(f32_bits_at(outs[0], i)); },
            [&](int64_t i) { return xbits(i % 128, i / 128); });
  check_all("tensor engine bf16", 128 * 64, [&](int64_t i) { return double(u16_at(outs[1], i)); },
            [&](int64_t i) { return double(u16_at(h, (i % 64) * 128 + i / 64)); });
  check_all("vector engine fp32", 20 * 32, [&](int64_t i) { return double(f32_bits_at(outs[2], i)); },
            [&](int64_t i) { return xbits(i % 32, i / 32); });
  check_all("vector engine int32", 32 * 16, [&](int64_t i) { return double(int_at(outs[3], i)); },
            [&](int64_t i) { return double(int_at(k, (i % 16) * 32 + i / 16)); });
  check_all("vector engine, flattened free dims", 32 * 16, [&](int64_t i) { return double(int_at(outs[4], i)); },
            [&](int64_t i) { return double(int_at(k, (i % 16) * 32 + i / 16)); });
  check_all("matmul is_transpose fp32", 32 * 64, [&](int64_t i) { return double(f32_bits_at(outs[5], i)); },
            [&](int64_t i) { return xbits(i % 64, i / 64); });
  check_all("matmul is_transpose bf16", 128 * 64, [&](int64_t i) { return double(u16_at(outs[6], i)); },
            [&](int64_t i) { return double(u16_at(h, (i % 64) * 128 + i / 64)); });
}

// =================================================================================================
// Initialization and index generation
// =================================================================================================

namespace {

/** An fp32 copy of an on-chip tile as a kernel output (widening to fp32 is exact). */
Tensor to_hbm_f32(const Tensor& t) {
  Tensor w = nl::ndarray(t.shape(), nl::float32, nl::sbuf);
  isa::tensor_copy(w, t);
  return to_hbm(w);
}

}  // namespace

TEST_CASE("instr: memset fills float and integer tiles, whole or through a strided view") {
  struct Case {
    DType dtype;
    double value;
    Engine engine = Engine::unknown;
  };
  const Case cases[] = {{DType::float32, 3.25},         {DType::bfloat16, 1.0 / 3},
                        {DType::float16, -65504.0},     {DType::float8_e4m3, 0.3, Engine::gpsimd},
                        {DType::float8_e4m3fn, 300.0},  {DType::float8_e5m2, -1000.0},
                        {DType::int8, -128},            {DType::uint8, 255, Engine::gpsimd},
                        {DType::int16, -12345},         {DType::uint16, 65535},
                        {DType::int32, -123456789},     {DType::uint32, 4000000000.0},
                        {DType::bool_, 1}};
  HostTensor unused = uniform(DType::float32, {1, 1}, 0);  // kernels without inputs trip a trace.hpp warning
  auto outs = run([&](Tensor) {
    std::vector<Tensor> r;
    for (const Case& c : cases) {
      Tensor t = nl::ndarray({32, 16}, c.dtype, nl::sbuf);
      isa::memset(t, c.value, c.engine);
      r.push_back(is_float(c.dtype) ? to_hbm_f32(t) : to_hbm(t));
    }
    Tensor s = nl::ndarray({32, 16}, nl::int32, nl::sbuf);
    isa::memset(s(nl::all, Slice{0, std::nullopt, 2}), 7);  // odd columns keep the sentinel
    r.push_back(to_hbm(s));
    Tensor ps = nl::ndarray({32, 16}, nl::float32, nl::psum);
    isa::memset(ps, -2.5);
    r.push_back(to_hbm(ps));
    return r;
  }, unused);
  for (size_t k = 0; k < std::size(cases); ++k) {
    const Case& c = cases[k];
    CAPTURE(dtype_name(c.dtype));
    // Exact: the value is an fp32 scalar, rounded once (RNE) into a float dtype; integers are exact.
    const double want = is_float(c.dtype) ? store_ref(double(float(c.value)), c.dtype) : c.value;
    check_all("memset", 32 * 16,
              [&](int64_t i) { return is_float(c.dtype) ? f32_at(outs[k], i) : double(int_at(outs[k], i)); },
              [&](int64_t) { return want; });
  }
  const size_t m = std::size(cases);
  check_all("memset through a strided view", 32 * 16, [&](int64_t i) { return double(int_at(outs[m], i)); },
            [](int64_t i) { return i % 2 == 0 ? 7.0 : 4.0; });
  check_all("memset PSUM", 32 * 16, [&](int64_t i) { return f32_at(outs[m + 1], i); }, [](int64_t) { return -2.5; });
}

TEST_CASE("instr: iota generates offset + c * channel_multiplier + sum(step * index)") {
  struct Case {
    std::vector<Dim> pattern;  // [step, num] pairs, outermost first
    int64_t offset, cm;
    Shape dst;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {{{1, 64}}, 0, 0, {128, 64}, DType::int32},
      {{{100, 3}, {10, 4}, {1, 5}}, 7, 1000, {128, 3, 4, 5}, DType::int32},
      {{{-3, 8}}, 5, -2, {128, 8}, DType::int32},
      {{{1, 2}, {2, 2}, {4, 2}, {8, 2}}, 0, 16, {128, 16}, DType::float32},
      {{{1, 64}}, 1000, 3, {128, 64}, DType::bfloat16},
      {{{7, 6}, {-1, 6}}, -20, 1, {96, 36}, DType::int16},
  };
  HostTensor unused = uniform(DType::float32, {1, 1}, 0);
  auto outs = run([&](Tensor) {
    std::vector<Tensor> r;
    for (const Case& c : cases) {
      Tensor t = nl::ndarray(c.dst, c.dtype, nl::sbuf);
      isa::iota(t, c.pattern, c.offset, c.cm);
      r.push_back(c.dtype == DType::bfloat16 ? to_hbm_f32(t) : to_hbm(t));
    }
    return r;
  }, unused);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const int64_t free = c.dst.inner_elements();
    // Exact: integer arithmetic; bf16 rounds the (exactly representable in fp32) integer once.
    check_all(fmt::format("iota case {}", k), c.dst.num_elements(),
              [&](int64_t i) { return is_float(c.dtype) ? f32_at(outs[k], i) : double(int_at(outs[k], i)); },
              [&](int64_t i) {
                const int64_t p = i / free;
                int64_t f = i % free, v = c.offset + p * c.cm;
                for (int d = int(c.pattern.size()) - 1; d >= 0; --d) {
                  v += c.pattern[d].stride * (f % c.pattern[d].count);
                  f /= c.pattern[d].count;
                }
                return store_ref(double(v), c.dtype);
              });
  }
}

TEST_CASE("instr: affine_select keeps on_true where cmp_op(affine value, 0) holds") {
  HostTensor x = uniform(DType::float32, {128, 128}, 120);
  HostTensor xh = uniform(DType::bfloat16, {128, 128}, 121);
  struct Case {
    nl::Op cmp;
    std::vector<Dim> pattern;
    int64_t cm, offset;
    double on_false;
  };
  const std::vector<Case> cases = {
      {nl::greater_equal, {{1, 128}}, -1, 0, -9984.0},  // causal mask: keep f >= p
      {nl::equal, {{1, 128}}, -1, -3, -1.0},
      {nl::not_equal, {{1, 128}}, -1, -3, -1.0},
      {nl::greater, {{1, 128}}, -1, -3, -1.0},
      {nl::greater_equal, {{1, 128}}, -1, -3, -1.0},
      {nl::less, {{1, 128}}, -1, -3, -1.0},
      {nl::less_equal, {{1, 128}}, -1, -3, -1.0},
      {nl::less, {{8, 16}, {1, 8}}, -1, -2, 0.5},  // 2-D pattern over a [128, 16, 8] view
      {nl::greater, {{-2, 128}}, 3, 40, -3e38},
  };
  auto outs = run(
      [&](Tensor x, Tensor xh) {
        Tensor sx = to_sbuf(x), sh = to_sbuf(xh);
        std::vector<Tensor> r;
        for (const Case& c : cases) {
          const bool three = c.pattern.size() == 2;
          Tensor d = nl::ndarray(three ? Shape{128, 16, 8} : Shape{128, 128}, nl::float32, nl::sbuf);
          isa::affine_select(d, c.pattern, c.cm, three ? sx.reshape({128, 16, 8}) : sx, c.on_false, c.cmp, c.offset);
          r.push_back(to_hbm(d));
        }
        // dtype changes: bf16 on_true into an fp32 dst, and fp32 on_true into a bf16 dst.
        Tensor d1 = nl::ndarray({128, 128}, nl::float32, nl::sbuf);
        isa::affine_select(d1, {{1, 128}}, -1, sh, -9984.0, nl::greater_equal);
        r.push_back(to_hbm(d1));
        Tensor d2 = nl::ndarray({128, 128}, nl::bfloat16, nl::sbuf);
        isa::affine_select(d2, {{1, 128}}, -1, sx, 0.1, nl::less_equal);
        r.push_back(to_hbm(d2));
        return r;
      },
      x, xh);
  auto cmp = [](std::string_view op, int64_t v) {
    if (op == "equal") return v == 0;
    if (op == "not_equal") return v != 0;
    if (op == "greater") return v > 0;
    if (op == "greater_equal") return v >= 0;
    if (op == "less") return v < 0;
    return v <= 0;
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    check_all(fmt::format("affine_select {} case {}", c.cmp.name, k), x.size(),
              [&](int64_t i) { return f32_at(outs[k], i); },
              [&](int64_t i) {
                const int64_t p = i / 128;
                int64_t f = i % 128, v = c.offset + p * c.cm;
                for (int d = int(c.pattern.size()) - 1; d >= 0; --d) {
                  v += c.pattern[d].stride * (f % c.pattern[d].count);
                  f /= c.pattern[d].count;
                }
                return cmp(c.cmp.name, v) ? f32_at(x, i) : double(float(c.on_false));
              });
  }
  const size_t m = cases.size();
  check_all("bf16 on_true into fp32", x.size(), [&](int64_t i) { return f32_at(outs[m], i); },
            [&](int64_t i) { return i % 128 >= i / 128 ? bf16_at(xh, i) : -9984.0; });
  check_all("fp32 on_true into bf16", x.size(), [&](int64_t i) { return bf16_at(outs[m + 1], i); },
            [&](int64_t i) { return round_format(i % 128 <= i / 128 ? f32_at(x, i) : double(0.1f), kBF16); });
}

// =================================================================================================
// Statistics and scans
// =================================================================================================

TEST_CASE("instr: bn_stats per-lane statistics and bn_aggr mean / population variance") {
  constexpr int64_t N = 1000;
  HostTensor x = uniform(DType::float32, {128, N}, 130, -1, 2);
  HostTensor y = uniform(DType::float32, {128, 4, 25}, 131, 2, 4);
  const std::pair<int64_t, int64_t> chunks[] = {{0, 511}, {511, 1}, {512, 488}};  // odd, single, even
  auto outs = run(
      [&](Tensor x, Tensor y) {
        Tensor sx = to_sbuf(x), sy = to_sbuf(y);
        Tensor stats = nl::ndarray({128, 18}, nl::float32, nl::sbuf);
        for (int c = 0; c < 3; ++c)
          isa::bn_stats(stats(nl::all, nl::ds(6 * c, 6)), sx(nl::all, nl::ds(chunks[c].first, chunks[c].second)));
        Tensor agg = nl::ndarray({128, 2}, nl::float32, nl::sbuf);
        isa::bn_aggr(agg, stats);
        Tensor ys = nl::ndarray({128, 6}, nl::float32, nl::sbuf);
        isa::bn_stats(ys, sy);  // several free dims are flattened
        Tensor yagg = nl::ndarray({128, 2}, nl::float32, nl::sbuf);
        isa::bn_aggr(yagg, ys);
        return std::vector<Tensor>{to_hbm(stats), to_hbm(agg), to_hbm(ys), to_hbm(yagg)};
      },
      x, y);
  // Reference moments in double. Tolerances from the standard error bounds of one-pass
  // (Welford / Chan) updates in fp32 with unit roundoff u = 2^-24 over n values:
  // mean: 2 n u max|x|; sum of squared deviations M2: 2 n u kappa M2 with kappa = 1 + mean^2 / var.
  struct Moments {
    double n = 0, mean = 0, m2 = 0, max_abs = 0;
  };
  auto moments = [](auto&& at, int64_t begin, int64_t end, int64_t step) {
    Moments m;
    for (int64_t i = begin; i < end; i += step) {
      m.n += 1;
      m.mean += at(i);
      m.max_abs = std::max(m.max_abs, std::fabs(at(i)));
    }
    if (m.n == 0) return m;
    m.mean /= m.n;
    for (int64_t i = begin; i < end; i += step) m.m2 += (at(i) - m.mean) * (at(i) - m.mean);
    return m;
  };
  auto m2_tol = [](const Moments& m) {
    const double var = m.n ? m.m2 / m.n : 0;
    return var > 0 ? 2 * m.n * kEps32 * (1 + m.mean * m.mean / var) * m.m2 + 1e-30 : 0.0;
  };
  auto check_stats = [&](const char* what, const HostTensor& out, int64_t out_stride, int64_t out_off,
                         auto&& at, int64_t p0, int64_t len) {
    std::vector<double> want, tol, got;
    for (int64_t p = 0; p < 128; ++p)
      for (int lane = 0; lane < 2; ++lane) {
        const Moments m = moments(at, p * p0 + lane, p * p0 + len, 2);
        const double w[3] = {m.n, m.mean, m.m2}, t[3] = {0, 2 * m.n * kEps32 * m.max_abs, m2_tol(m)};
        for (int j = 0; j < 3; ++j) {
          want.push_back(w[j]);
          tol.push_back(t[j]);
          got.push_back(f32_at(out, p * out_stride + out_off + 3 * lane + j));
        }
      }
    check_within(what, int64_t(want.size()), [&](int64_t i) { return got[i]; }, [&](int64_t i) { return want[i]; },
                 [&](int64_t i) { return tol[i]; });
  };
  for (int c = 0; c < 3; ++c) {
    const int64_t b = chunks[c].first, len = chunks[c].second;
    check_stats(fmt::format("bn_stats chunk {}", c).c_str(), outs[0], 18, 6 * c,
                [&](int64_t i) { return f32_at(x, (i / len) * N + b + i % len); }, len, len);
  }
  check_stats("bn_stats of a 3-D tile", outs[2], 6, 0, [&](int64_t i) { return f32_at(y, i); }, 100, 100);
  // bn_aggr: the mean and the population (divide by n) variance of the whole row. The variance
  // tolerance (~1.4e-4 relative here) is well below the 1e-3 gap to the sample variance.
  auto check_aggr = [&](const char* what, const HostTensor& out, int64_t n, auto&& at) {
    for (int j = 0; j < 2; ++j)
      check_within(fmt::format("{} {}", what, j ? "variance" : "mean"), 128,
                   [&](int64_t p) { return f32_at(out, 2 * p + j); },
                   [&](int64_t p) {
                     const Moments m = moments(at, p * n, (p + 1) * n, 1);
                     return j ? m.m2 / m.n : m.mean;
                   },
                   [&](int64_t p) {
                     const Moments m = moments(at, p * n, (p + 1) * n, 1);
                     return j ? m2_tol(m) / m.n : 2 * m.n * kEps32 * m.max_abs;
                   });
  };
  check_aggr("bn_aggr of three chunks", outs[1], N, [&](int64_t i) { return f32_at(x, i); });
  check_aggr("bn_aggr of one 3-D tile", outs[3], 100, [&](int64_t i) { return f32_at(y, i); });
}

TEST_CASE("instr: tensor_tensor_scan along the free dim, reverse flags, [P, 1] initial") {
  HostTensor d0 = uniform(DType::float32, {128, 64}, 140), d1 = uniform(DType::float32, {128, 64}, 141);
  HostTensor init = uniform(DType::float32, {128, 1}, 142);
  struct Case {
    nl::Op op0, op1;
    bool r0, r1, col;
  };
  const Case cases[] = {{nl::multiply, nl::add, false, false, false},   // r = d0 * r + d1, initial 0.5
                        {nl::subtract, nl::add, true, false, true},     // r = (r - d0) + d1
                        {nl::add, nl::subtract, false, true, true},     // r = d1 - (d0 + r)
                        {nl::subtract, nl::subtract, false, false, false},  // r = (d0 - r) - d1
                        {nl::maximum, nl::multiply, false, false, true}};
  auto outs = run(
      [&](Tensor d0, Tensor d1, Tensor init) {
        Tensor s0 = to_sbuf(d0), s1 = to_sbuf(d1), si = to_sbuf(init);
        std::vector<Tensor> r;
        for (const Case& c : cases) {
          Tensor d = nl::ndarray({128, 8, 8}, nl::float32, nl::sbuf);  // the scan runs over flattened free dims
          isa::tensor_tensor_scan(d, s0.reshape({128, 8, 8}), s1, c.col ? isa::Scalar(si) : isa::Scalar(0.5), c.op0,
                                  c.op1, c.r0, c.r1);
          r.push_back(to_hbm(d));
        }
        return r;
      },
      d0, d1, init);
  for (size_t k = 0; k < std::size(cases); ++k) {
    const Case& c = cases[k];
    std::vector<double> want(128 * 64);
    for (int64_t p = 0; p < 128; ++p) {
      float prev = c.col ? float(f32_at(init, p)) : 0.5f;
      for (int64_t f = 0; f < 64; ++f) {
        const float a = float(f32_at(d0, p * 64 + f)), b = float(f32_at(d1, p * 64 + f));
        const float t = float(c.r0 ? alu_ref(c.op0, prev, a) : alu_ref(c.op0, a, prev));
        prev = float(c.r1 ? alu_ref(c.op1, b, t) : alu_ref(c.op1, t, b));
        want[p * 64 + f] = prev;
      }
    }
    // Two fp32 operations per step in the documented order: exact.
    check_all(fmt::format("scan {} / {} case {}", c.op0.name, c.op1.name, k), 128 * 64,
              [&](int64_t i) { return f32_at(outs[k], i); }, [&](int64_t i) { return want[i]; });
  }
}

// =================================================================================================
// Predication and selection
// =================================================================================================

TEST_CASE("instr: tensor_copy_predicated with tile and scalar src, reverse_pred, several predicate dtypes") {
  HostTensor x = uniform(DType::float32, {128, 40}, 150), y = uniform(DType::float32, {128, 40}, 151);
  HostTensor pred = integers(DType::uint8, {128, 40}, 152, 0, 3);
  for (int64_t i = 0; i < pred.size(); i += 17) pred.set_int(i, 255);  // any nonzero is true
  HostTensor p16 = integers(DType::uint16, {128, 40}, 153, 0, 1);
  p16.set_int(5, 0x100);  // a nonzero whose low byte is zero
  HostTensor k = integers(DType::int32, {128, 40}, 154, INT32_MIN, INT32_MAX);
  HostTensor kd = integers(DType::int32, {128, 40}, 155, -9, 9);
  auto outs = run(
      [](Tensor x, Tensor y, Tensor pred, Tensor p16, Tensor k, Tensor kd) {
        Tensor sx = to_sbuf(x), sp = to_sbuf(pred), s16 = to_sbuf(p16), sk = to_sbuf(k);
        std::vector<Tensor> r;
        auto fresh_y = [&] { return to_sbuf(y); };  // dst is read-modify-write: start from y
        Tensor a = fresh_y();
        isa::tensor_copy_predicated(a, sx, sp);
        r.push_back(to_hbm(a));
        Tensor b = fresh_y();
        isa::tensor_copy_predicated(b, sx, sp, true);
        r.push_back(to_hbm(b));
        Tensor c = fresh_y();
        isa::tensor_copy_predicated(c, 7.5, sp);
        r.push_back(to_hbm(c));
        Tensor d = to_sbuf(kd);  // int32 bit copy under a uint16 predicate
        isa::tensor_copy_predicated(d, sk, s16);
        r.push_back(to_hbm(d));
        // Predicate made in the kernel: x > 0 as a uint8 mask (the usual idiom).
        Tensor mask = nl::ndarray({128, 40}, nl::uint8, nl::sbuf);
        isa::tensor_scalar(mask, sx, nl::greater, 0.0);
        Tensor e = fresh_y();
        isa::tensor_copy_predicated(e, sx, mask);
        r.push_back(to_hbm(e));
        return r;
      },
      x, y, pred, p16, k, kd);
  const int64_t n = x.size();
  auto X = [&](int64_t i) { return f32_at(x, i); };
  auto Y = [&](int64_t i) { return f32_at(y, i); };
  auto P = [&](int64_t i) { return int_at(pred, i) != 0; };
  auto got = [&](int j) { return [&, j](int64_t i) { return f32_at(outs[j], i); }; };
  check_all("tile src", n, got(0), [&](int64_t i) { return P(i) ? X(i) : Y(i); });
  check_all("reverse_pred", n, got(1), [&](int64_t i) { return P(i) ? Y(i) : X(i); });
  check_all("scalar src", n, got(2), [&](int64_t i) { return P(i) ? 7.5 : Y(i); });
  check_all("int32 under uint16 predicate", n, [&](int64_t i) { return double(int_at(outs[3], i)); },
            [&](int64_t i) { return double(int_at(p16, i) != 0 ? int_at(k, i) : int_at(kd, i)); });
  check_all("mask from a comparison", n, got(4), [&](int64_t i) { return X(i) > 0 ? X(i) : Y(i); });
}

TEST_CASE("instr: select_reduce selects, and max-reduces into reduce_res across reduce_cmd sequences") {
  HostTensor x = uniform(DType::float32, {128, 48}, 160, -5, 5), x2 = uniform(DType::float32, {128, 48}, 161, -5, 5);
  HostTensor pred = integers(DType::int8, {128, 48}, 162, -2, 2), pred2 = integers(DType::uint16, {128, 48}, 163, 0, 1);
  for (int64_t f = 0; f < 48; ++f) pred.set_int(3 * 48 + f, 0);  // a row with nothing selected
  HostTensor col = uniform(DType::float32, {128, 1}, 164, -1, 1);
  auto outs = run(
      [](Tensor x, Tensor x2, Tensor pred, Tensor pred2, Tensor col) {
        Tensor sx = to_sbuf(x), sx2 = to_sbuf(x2), sp = to_sbuf(pred), sp2 = to_sbuf(pred2), sc = to_sbuf(col);
        auto dst = [] { return nl::ndarray({128, 48}, nl::float32, nl::sbuf); };
        auto res = [] { return nl::ndarray({128, 1}, nl::float32, nl::sbuf); };
        std::vector<Tensor> r;
        Tensor d1 = dst(), r1 = res();
        isa::select_reduce(d1, sp, sx, -1e4, {.reduce_res = r1});  // reduce_res alone means reset_reduce
        Tensor d2 = dst(), r2 = res();
        isa::select_reduce(d2, sp, sx, sc, {.reduce_res = r2, .reverse_pred = true});
        // Accumulator sequence: reset_reduce (no read), reduce (read), reset (read), reduce (read).
        isa::select_reduce(dst(), sp, sx, -1e4, {.reduce_cmd = ReduceCmd::reset_reduce});
        Tensor r3 = res(), r4 = res(), r5 = res();
        isa::select_reduce(dst(), sp2, sx2, -1e4, {.reduce_res = r3, .reduce_cmd = ReduceCmd::reduce});
        isa::select_reduce(dst(), sp2, sx2, -1e4, {.reduce_res = r4, .reduce_cmd = ReduceCmd::reset});
        isa::select_reduce(dst(), sp2, sx2, sc, {.reduce_res = r5, .reduce_cmd = ReduceCmd::reduce});
        Tensor d6 = nl::ndarray({128, 48}, nl::bfloat16, nl::sbuf);  // fp32 selection rounded on write
        isa::select_reduce(d6, sp, sx, 0.3, {});
        for (const Tensor& t : {d1, r1, d2, r2, r3, r4, r5}) r.push_back(to_hbm(t));
        r.push_back(to_hbm(d6));
        return r;
      },
      x, x2, pred, pred2, col);
  auto X = [&](int64_t i) { return f32_at(x, i); };
  auto X2 = [&](int64_t i) { return f32_at(x2, i); };
  auto C = [&](int64_t p) { return f32_at(col, p); };
  auto sel1 = [&](int64_t i) { return int_at(pred, i) != 0 ? X(i) : -1e4; };
  auto sel2 = [&](int64_t i) { return int_at(pred, i) == 0 ? X(i) : C(i / 48); };
  auto sel3 = [&](int64_t i) { return int_at(pred2, i) != 0 ? X2(i) : -1e4; };
  auto sel5 = [&](int64_t i) { return int_at(pred2, i) != 0 ? X2(i) : C(i / 48); };
  auto rowmax = [](auto&& f, int64_t p) {
    double m = -kInf;
    for (int64_t j = 0; j < 48; ++j) m = std::max(m, double(f(p * 48 + j)));
    return m;
  };
  auto got = [&](int j) { return [&, j](int64_t i) { return f32_at(outs[j], i); }; };
  // Selection and max are exact.
  check_all("select", 128 * 48, got(0), sel1);
  check_all("reduce_res", 128, got(1), [&](int64_t p) { return rowmax(sel1, p); });
  check_all("reverse_pred with [P, 1] on_false", 128 * 48, got(2), sel2);
  check_all("reverse_pred reduce_res", 128, got(3), [&](int64_t p) { return rowmax(sel2, p); });
  check_all("reduce after reset_reduce", 128, got(4),
            [&](int64_t p) { return std::max(rowmax(sel1, p), rowmax(sel3, p)); });
  check_all("reset", 128, got(5), [](int64_t) { return -kInf; });
  check_all("reduce after reset", 128, got(6), [&](int64_t p) { return rowmax(sel5, p); });
  check_all("select into bf16", 128 * 48, [&](int64_t i) { return bf16_at(outs[7], i); },
            [&](int64_t i) { return round_format(int_at(pred, i) != 0 ? X(i) : double(0.3f), kBF16); });
}

TEST_CASE("instr: max8 (ties kept) and nc_find_index8 (duplicates matched to successive occurrences)") {
  // Few distinct values, so ties and duplicate maxima are everywhere.
  HostTensor x = integers(DType::int32, {128, 40}, 170, -6, 6);
  HostTensor xf(DType::float32, {128, 40});
  for (int64_t i = 0; i < x.size(); ++i) set_f32(xf, i, float(int_at(x, i)) * 0.5f);
  HostTensor y = uniform(DType::float32, {128, 4, 10}, 171);
  auto outs = run(
      [](Tensor xf, Tensor y) {
        Tensor sx = to_sbuf(xf), sy = to_sbuf(y);
        Tensor m = nl::ndarray({128, 8}, nl::float32, nl::sbuf);
        isa::max8(m, sx);
        Tensor idx = nl::ndarray({128, 8}, nl::uint32, nl::sbuf);
        isa::nc_find_index8(idx, sx, m);
        Tensor m3 = nl::ndarray({128, 8}, nl::float32, nl::sbuf);
        isa::max8(m3, sy);  // 3-D src: the free dims are flattened
        Tensor idx3 = nl::ndarray({128, 8}, nl::uint16, nl::sbuf);
        isa::nc_find_index8(idx3, sy, m3);
        // vals that are not the maxima: the first 8 elements of each row, reversed.
        Tensor vals = nl::ndarray({128, 8}, nl::float32, nl::sbuf);
        isa::tensor_copy(vals, sx(nl::all, nl::ds(0, 8)));
        Tensor rev = nl::ndarray({128, 8}, nl::float32, nl::sbuf);
        for (int j = 0; j < 8; ++j) isa::tensor_copy(rev(nl::all, nl::ds(j, 1)), vals(nl::all, nl::ds(7 - j, 1)));
        Tensor idx4 = nl::ndarray({128, 8}, nl::uint32, nl::sbuf);
        isa::nc_find_index8(idx4, sx, rev);
        return std::vector<Tensor>{to_hbm(m), to_hbm(idx), to_hbm(m3), to_hbm(idx3), to_hbm(idx4)};
      },
      xf, y);
  auto top8 = [](const HostTensor& t, int64_t p, int64_t n) {
    std::vector<double> v(n);
    for (int64_t j = 0; j < n; ++j) v[j] = f32_at(t, p * n + j);
    std::sort(v.begin(), v.end(), std::greater<>());
    v.resize(8);
    return v;
  };
  // For each value in order, the first index holding it that an earlier value has not taken.
  auto find8 = [](const HostTensor& t, int64_t p, int64_t n, const std::vector<double>& vals) {
    std::vector<bool> taken(n);
    std::vector<double> r;
    for (double v : vals) {
      int64_t j = 0;
      while (j < n && (taken[j] || f32_at(t, p * n + j) != v)) ++j;
      if (j == n) throw std::logic_error("find_index8 reference: value not present");
      taken[j] = true;
      r.push_back(double(j));
    }
    return r;
  };
  std::vector<double> want_m, want_i, want_m3, want_i3, want_i4;
  for (int64_t p = 0; p < 128; ++p) {
    auto m = top8(xf, p, 40), m3 = top8(y, p, 40);
    auto i = find8(xf, p, 40, m), i3 = find8(y, p, 40, m3);
    std::vector<double> firsts;
    for (int j = 7; j >= 0; --j) firsts.push_back(f32_at(xf, p * 40 + j));
    auto i4 = find8(xf, p, 40, firsts);
    want_m.insert(want_m.end(), m.begin(), m.end());
    want_i.insert(want_i.end(), i.begin(), i.end());
    want_m3.insert(want_m3.end(), m3.begin(), m3.end());
    want_i3.insert(want_i3.end(), i3.begin(), i3.end());
    want_i4.insert(want_i4.end(), i4.begin(), i4.end());
  }
  check_all("max8", 1024, [&](int64_t i) { return f32_at(outs[0], i); }, [&](int64_t i) { return want_m[i]; });
  check_all("find_index8 of max8", 1024, [&](int64_t i) { return double(int_at(outs[1], i)); },
            [&](int64_t i) { return want_i[i]; });
  check_all("max8 of a 3-D tile", 1024, [&](int64_t i) { return f32_at(outs[2], i); },
            [&](int64_t i) { return want_m3[i]; });
  check_all("find_index8 into uint16", 1024, [&](int64_t i) { return double(int_at(outs[3], i)); },
            [&](int64_t i) { return want_i3[i]; });
  check_all("find_index8 of other values", 1024, [&](int64_t i) { return double(int_at(outs[4], i)); },
            [&](int64_t i) { return want_i4[i]; });
}

TEST_CASE("instr: local_gather takes runs from each partition by its GpSimd core's indices") {
  HostTensor x = uniform(DType::float32, {32, 20}, 190);
  HostTensor idx = integers(DType::uint16, {32, 3}, 191, 0, 18);  // runs of 2 stay inside the row
  auto outs = run(
      [](Tensor x, Tensor idx) {
        Tensor gathered = nl::ndarray({32, 48 * 2}, nl::float32, nl::sbuf);
        isa::local_gather(gathered, to_sbuf(x), to_sbuf(idx), 2);  // every index of the core: 16 x 3
        return std::vector<Tensor>{to_hbm(gathered)};
      },
      x, idx);
  check_all("local_gather", 32 * 96, [&](int64_t i) { return f32_at(outs[0], i); }, [&](int64_t i) {
    const int64_t p = i / 96, j = i % 96 / 2, e = i % 2;
    const int64_t from = p / 16 * 16 + j % 16;  // the core's indices, partition dimension first
    return f32_at(x, p * 20 + int_at(idx, from * 3 + j / 16) + e);
  });
}

TEST_CASE("instr: nc_stream_shuffle, nc_match_replace8, nc_n_gather, nonzero_with_count, range_select, dma_compute") {
  HostTensor x = uniform(DType::float32, {64, 20}, 180);
  HostTensor sparse = integers(DType::int32, {32, 24}, 181, -2, 2);  // about 1 in 5 zero... and negatives
  HostTensor idx = integers(DType::uint32, {64, 9}, 182, 0, 19);
  std::vector<int32_t> lanes(32);
  for (int i = 0; i < 32; ++i) lanes[i] = i % 7 == 3 ? kShuffleKeepLane : (i * 11 + 5) % 32;
  auto outs = run(
      [&lanes](Tensor x, Tensor sparse, Tensor idx) {
        Tensor sx = to_sbuf(x);
        Tensor shuffled = nl::ndarray({64, 20}, nl::float32, nl::sbuf);
        isa::memset(shuffled, -7.0);
        isa::nc_stream_shuffle(shuffled, sx, lanes);
        Tensor top = nl::ndarray({64, 8}, nl::float32, nl::sbuf);
        isa::max8(top, sx);
        Tensor replaced = nl::ndarray({64, 20}, nl::float32, nl::sbuf);
        Tensor where = nl::ndarray({64, 8}, nl::uint32, nl::sbuf);
        isa::nc_match_replace8(replaced, sx, top, -100.0, where);
        Tensor gathered = nl::ndarray({64, 9}, nl::float32, nl::sbuf);
        isa::nc_n_gather(gathered, sx, to_sbuf(idx));
        Tensor nz = nl::ndarray({32, 25}, nl::int32, nl::sbuf);
        isa::memset(nz, 9);
        isa::nonzero_with_count(nz, to_sbuf(sparse), 10, -1);
        Tensor window = nl::ndarray({64, 20}, nl::float32, nl::sbuf);
        Tensor best = nl::ndarray({64, 1}, nl::float32, nl::sbuf);
        isa::range_select(window, sx, nl::greater_equal, nl::less, 3.0, 9.0,
                          {.reduce_res = best, .range_start = 2, .on_false_value = -1e30});
        Tensor sum = nl::ndarray({64, 20}, nl::float32, nl::shared_hbm);
        isa::dma_compute(sum, {x, x, sx});
        return std::vector<Tensor>{to_hbm(shuffled), to_hbm(replaced), to_hbm(where), to_hbm(gathered),
                                   to_hbm(nz), to_hbm(window), to_hbm(best), sum};
      },
      x, sparse, idx);
  check_all("nc_stream_shuffle", 64 * 20, [&](int64_t i) { return f32_at(outs[0], i); }, [&](int64_t i) {
    const int64_t p = i / 20, f = i % 20, lane = lanes[p % 32];
    return lane == kShuffleKeepLane ? -7.0 : f32_at(x, ((p / 32) * 32 + lane) * 20 + f);
  });
  // The top 8 of each row are distinct (random floats): each is replaced where it stands.
  for (int64_t p = 0; p < 64; ++p) {
    std::vector<std::pair<double, int64_t>> row;
    for (int64_t f = 0; f < 20; ++f) row.push_back({f32_at(x, p * 20 + f), f});
    std::sort(row.begin(), row.end(), [](auto a, auto b) { return a.first > b.first; });
    for (int i = 0; i < 8; ++i) {
      CHECK(int_at(outs[2], p * 8 + i) == row[i].second);
      CHECK(f32_at(outs[1], p * 20 + row[i].second) == -100.0);
    }
    for (int i = 8; i < 20; ++i) CHECK(f32_at(outs[1], p * 20 + row[i].second) == row[i].first);
  }
  check_all("nc_n_gather", 64 * 9, [&](int64_t i) { return f32_at(outs[3], i); },
            [&](int64_t i) { return f32_at(x, (i / 9) * 20 + int_at(idx, i)); });
  for (int64_t p = 0; p < 32; ++p) {
    std::vector<int64_t> want(25, 9);
    if (p % 16 == 0) {
      int64_t n = 0;
      for (int64_t f = 0; f < 24; ++f)
        if (int_at(sparse, p * 24 + f) != 0) want[n++] = f + 10;
      for (int64_t f = n; f < 24; ++f) want[f] = -1;
      want[24] = n;
    }
    for (int64_t f = 0; f < 25; ++f) CHECK(int_at(outs[4], p * 25 + f) == want[f]);
  }
  for (int64_t p = 0; p < 64; ++p) {
    double best = -kInf;
    for (int64_t f = 0; f < 20; ++f) {
      const bool keep = f + 2 >= 3 && f + 2 < 9;
      const double want = keep ? f32_at(x, p * 20 + f) : double(float(-1e30));
      CHECK(f32_at(outs[5], p * 20 + f) == want);
      best = std::max(best, want);
    }
    CHECK(f32_at(outs[6], p) == best);
  }
  check_all("dma_compute x + x + x", 64 * 20, [&](int64_t i) { return f32_at(outs[7], i); }, [&](int64_t i) {
    const float v = float(f32_at(x, i));
    return double((v + v) + v);
  });
}

TEST_CASE("instr: tensor_partition_reduce across partitions (add, max, average, bitwise)") {
  HostTensor x = uniform(DType::float32, {128, 24}, 180, -3, 3);
  HostTensor k = integers(DType::int32, {128, 24}, 181, INT32_MIN, INT32_MAX);
  HostTensor b = integers(DType::uint8, {128, 24}, 182, 0, 255);
  auto outs = run(
      [](Tensor x, Tensor k, Tensor b) {
        Tensor sx = to_sbuf(x), sk = to_sbuf(k), sb = to_sbuf(b);
        std::vector<Tensor> r;
        auto red = [&](const nl::Op& op, const Tensor& data) {
          Tensor d = nl::ndarray({1, data.shape()[1]}, data.dtype(), nl::sbuf);
          isa::tensor_partition_reduce(d, op, data);
          r.push_back(to_hbm(d));
        };
        red(nl::add, sx);
        red(nl::maximum, sx);
        red(nl::average, sx);
        red(nl::add, sx(nl::ds(32, 32), nl::all));  // a partition slice starting at 32
        red(nl::bitwise_or, sk);
        red(nl::bitwise_and, sk);
        red(nl::bitwise_or, sb);
        return r;
      },
      x, k, b);
  auto column = [&](int64_t f, int64_t p0, int64_t np) {
    double s = 0, a = 0, m = -kInf;
    for (int64_t p = p0; p < p0 + np; ++p) {
      const double v = f32_at(x, p * 24 + f);
      s += v, a += std::fabs(v), m = std::max(m, v);
    }
    return std::tuple{s, a, m};
  };
  // Sums over 128 fp32 values: error <= 128 * 2^-24 * sum|v|; max and bitwise folds are exact.
  check_within("add", 24, [&](int64_t f) { return f32_at(outs[0], f); },
               [&](int64_t f) { return std::get<0>(column(f, 0, 128)); },
               [&](int64_t f) { return 128 * kEps32 * std::get<1>(column(f, 0, 128)); });
  check_all("maximum", 24, [&](int64_t f) { return f32_at(outs[1], f); },
            [&](int64_t f) { return std::get<2>(column(f, 0, 128)); });
  check_within("average", 24, [&](int64_t f) { return f32_at(outs[2], f); },
               [&](int64_t f) { return std::get<0>(column(f, 0, 128)) / 128; },
               [&](int64_t f) { return 129 * kEps32 * std::get<1>(column(f, 0, 128)) / 128; });
  check_within("add over partitions [32, 64)", 24, [&](int64_t f) { return f32_at(outs[3], f); },
               [&](int64_t f) { return std::get<0>(column(f, 32, 32)); },
               [&](int64_t f) { return 32 * kEps32 * std::get<1>(column(f, 32, 32)); });
  auto fold = [&](const HostTensor& t, int64_t f, bool is_or) {
    uint32_t r = is_or ? 0u : ~0u;
    for (int64_t p = 0; p < 128; ++p) {
      const uint32_t v = uint32_t(int_at(t, p * 24 + f));
      r = is_or ? r | v : r & v;
    }
    return r;
  };
  check_all("bitwise_or int32", 24, [&](int64_t f) { return double(int_at(outs[4], f)); },
            [&](int64_t f) { return double(int32_t(fold(k, f, true))); });
  check_all("bitwise_and int32", 24, [&](int64_t f) { return double(int_at(outs[5], f)); },
            [&](int64_t f) { return double(int32_t(fold(k, f, false))); });
  check_all("bitwise_or uint8", 24, [&](int64_t f) { return double(int_at(outs[6], f)); },
            [&](int64_t f) { return double(fold(b, f, true)); });
}

// =================================================================================================
// Views and access patterns as operands
// =================================================================================================

TEST_CASE("instr: engine operands through strided, permuted, broadcast, reinterpreted and raw views") {
  HostTensor x = uniform(DType::float32, {128, 64}, 190, -4, 4);
  set_f32(x, 3, -0.0f);
  HostTensor c = uniform(DType::float32, {128, 1}, 191);
  HostTensor k = integers(DType::int32, {128, 16}, 192, INT32_MIN, INT32_MAX);
  auto outs = run(
      [](Tensor x, Tensor c, Tensor k) {
        Tensor sx = to_sbuf(x), sc = to_sbuf(c), sk = to_sbuf(k);
        std::vector<Tensor> r;
        // Strided free-dim slices: x[:, 0::2] - x[:, 1::2].
        Tensor d0 = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
        isa::tensor_tensor(d0, sx(nl::all, Slice{0, std::nullopt, 2}), sx(nl::all, Slice{1, std::nullopt, 2}),
                           nl::subtract);
        r.push_back(to_hbm(d0));
        // Permuted free dims: d1[p, a, b] = x[p, b * 8 + a].
        Tensor d1 = nl::ndarray({128, 8, 8}, nl::float32, nl::sbuf);
        isa::tensor_copy(d1, sx.reshape({128, 8, 8}).permute({0, 2, 1}));
        r.push_back(to_hbm(d1));
        // Stride-0 broadcast of a [P, 1] column as a full tile operand.
        Tensor d2 = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
        isa::tensor_tensor(d2, sx, sc.broadcast(1, 64), nl::multiply);
        r.push_back(to_hbm(d2));
        // fp32 bits as int32: clearing the sign bit is |x|, written back through an fp32 view.
        Tensor d3 = nl::ndarray({128, 64}, nl::int32, nl::sbuf);
        isa::tensor_scalar(d3, sx.view(nl::int32), nl::bitwise_and, 0x7fffffff);
        r.push_back(to_hbm(d3.view(nl::float32)));
        // int32 viewed as its little-endian bytes.
        Tensor d4 = nl::ndarray({128, 64}, nl::uint8, nl::sbuf);
        isa::tensor_copy(d4, sk.view(nl::uint8));
        r.push_back(to_hbm(d4));
        // Raw access pattern on SBUF storage: rows of 64 elements, odd columns.
        Tensor d5 = nl::ndarray({128, 32}, nl::float32, nl::sbuf);
        isa::tensor_copy(d5, sx.ap({{64, 128}, {2, 32}}, ApOptions{.offset = 1}));
        r.push_back(to_hbm(d5));
        // Writes through strided destination views interleave two sources.
        Tensor d6 = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
        isa::tensor_copy(d6(nl::all, Slice{0, std::nullopt, 2}), sx(nl::all, nl::ds(0, 32)));
        isa::activation(d6(nl::all, Slice{1, std::nullopt, 2}), nl::copy, sx(nl::all, nl::ds(32, 32)), {.scale = 2.0});
        r.push_back(to_hbm(d6));
        // Raw pattern on HBM for the DMA: a transposed read.
        Tensor d7 = nl::ndarray({64, 128}, nl::float32, nl::sbuf);
        isa::dma_copy(d7, x.ap({{1, 64}, {64, 128}}));
        r.push_back(to_hbm(d7));
        // A partition sub-range as an operand, written to another sub-range.
        Tensor d8 = nl::ndarray({128, 64}, nl::float32, nl::sbuf);
        isa::memset(d8, 0.0);
        isa::tensor_scalar(d8(nl::ds(64, 32), nl::all), sx(nl::ds(32, 32), nl::all), nl::add, 1.0);
        r.push_back(to_hbm(d8));
        return r;
      },
      x, c, k);
  auto X = [&](int64_t p, int64_t f) { return f32_at(x, p * 64 + f); };
  auto got = [&](int j) { return [&, j](int64_t i) { return f32_at(outs[j], i); }; };
  check_all("strided operands", 128 * 32, got(0),
            [&](int64_t i) { return double(float(X(i / 32, 2 * (i % 32))) - float(X(i / 32, 2 * (i % 32) + 1))); });
  check_all("permuted view", 128 * 64, got(1), [&](int64_t i) { return X(i / 64, (i % 8) * 8 + (i % 64) / 8); });
  check_all("broadcast column", 128 * 64, got(2),
            [&](int64_t i) { return double(float(X(i / 64, i % 64)) * float(f32_at(c, i / 64))); });
  check_all("bitwise on reinterpreted fp32", 128 * 64, got(3), [&](int64_t i) { return std::fabs(f32_at(x, i)); });
  check_all("int32 as bytes", 128 * 64, [&](int64_t i) { return double(int_at(outs[4], i)); },
            [&](int64_t i) { return double((uint32_t(int_at(k, i / 4)) >> (8 * (i % 4))) & 0xffu); });
  check_all("raw SBUF pattern", 128 * 32, got(5), [&](int64_t i) { return X(i / 32, 2 * (i % 32) + 1); });
  check_all("strided destinations", 128 * 64, got(6), [&](int64_t i) {
    const int64_t p = i / 64, f = i % 64;
    return f % 2 == 0 ? X(p, f / 2) : 2 * X(p, 32 + f / 2);
  });
  check_all("raw HBM pattern", 64 * 128, got(7), [&](int64_t i) { return X(i % 128, i / 128); });
  check_all("partition sub-ranges", 128 * 64, got(8), [&](int64_t i) {
    const int64_t p = i / 64;
    return p >= 64 && p < 96 ? double(float(X(p - 32, i % 64)) + 1.0f) : 0.0;
  });
}

TEST_CASE("instr: runtime offsets: scalar_offset from a 1x1 tensor, vector_offset gather and scatter") {
  HostTensor table = uniform(DType::float32, {16, 32}, 200);
  HostTensor start(DType::int32, {1, 1});
  start.set_int(0, 3);
  HostTensor col(DType::int32, {1, 1});
  col.set_int(0, 5);
  HostTensor rows = integers(DType::int32, {64, 1}, 201, 0, 15);  // with repeats
  HostTensor perm(DType::int32, {16, 1});
  {
    std::vector<int> pv(16);
    std::iota(pv.begin(), pv.end(), 0);
    std::shuffle(pv.begin(), pv.end(), std::mt19937(202));
    for (int i = 0; i < 16; ++i) perm.set_int(i, pv[i]);
  }
  auto outs = run(
      [](Tensor table, Tensor start, Tensor col, Tensor rows, Tensor perm) {
        Tensor s_start = to_sbuf(start), s_rows = to_sbuf(rows), s_perm = to_sbuf(perm);
        std::vector<Tensor> r;
        // Rows [3, 7): offset = 3 * (elements per row) from an SBUF 1x1 tensor.
        Tensor a = nl::ndarray({4, 32}, nl::float32, nl::sbuf);
        isa::dma_copy(a, table.ap({{32, 4}, {1, 32}}, ApOptions{.scalar_offset_tensor = s_start, .indirect_dim = 0}));
        r.push_back(to_hbm(a));
        // Column 5 of every row: indirect_dim 1 scales the offset by 1; the 1x1 tensor is in HBM.
        Tensor b = nl::ndarray({16, 1}, nl::float32, nl::sbuf);
        isa::dma_copy(b, table.ap({{32, 16}, {1, 1}}, ApOptions{.scalar_offset_tensor = col, .indirect_dim = 1}));
        r.push_back(to_hbm(b));
        // Gather: g[i, :] = table[rows[i], :].
        Tensor g = nl::ndarray({64, 32}, nl::float32, nl::sbuf);
        isa::dma_copy(g, table.ap({{32, 64}, {1, 32}}, ApOptions{.vector_offset = s_rows, .indirect_dim = 0}));
        r.push_back(to_hbm(g));
        // Scatter: out[perm[i], :] = table[i, :].
        Tensor t = to_sbuf(table);
        Tensor out = nl::ndarray({16, 32}, nl::float32, nl::shared_hbm);
        isa::dma_copy(out.ap({{32, 16}, {1, 32}}, ApOptions{.vector_offset = s_perm, .indirect_dim = 0}), t);
        r.push_back(out);
        return r;
      },
      table, start, col, rows, perm);
  auto T = [&](int64_t row, int64_t c) { return f32_at(table, row * 32 + c); };
  check_all("scalar_offset rows", 4 * 32, [&](int64_t i) { return f32_at(outs[0], i); },
            [&](int64_t i) { return T(3 + i / 32, i % 32); });
  check_all("scalar_offset column", 16, [&](int64_t i) { return f32_at(outs[1], i); },
            [&](int64_t i) { return T(i, 5); });
  check_all("gather", 64 * 32, [&](int64_t i) { return f32_at(outs[2], i); },
            [&](int64_t i) { return T(int_at(rows, i / 32), i % 32); });
  std::vector<double> scattered(16 * 32);
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t c = 0; c < 32; ++c) scattered[int_at(perm, i) * 32 + c] = T(i, c);
  check_all("scatter", 16 * 32, [&](int64_t i) { return f32_at(outs[3], i); }, [&](int64_t i) { return scattered[i]; });

  // An index past the end of the table is a run-time fault, reported as a KernelError.
  HostTensor bad = rows;
  bad.set_int(7, 16);
  auto gather = [](Tensor table, Tensor rows) {
    Tensor g = nl::ndarray({64, 32}, nl::float32, nl::sbuf);
    isa::dma_copy(g, table.ap({{32, 64}, {1, 32}}, ApOptions{.vector_offset = to_sbuf(rows), .indirect_dim = 0}));
    return to_hbm(g);
  };
  CHECK_THROWS_AS(test::run1(gather, table, bad), KernelError);
  bad.set_int(7, -1);
  CHECK_THROWS_AS(test::run1(gather, table, bad), KernelError);
}

// =================================================================================================
// Registers, runtime loops and device_print. The C++ API (nikki::isa) has no functions for these
// yet, so the instructions are appended to the IR directly through the kernel's builder.
// =================================================================================================


TEST_CASE("instr: registers and runtime loops (IR level)") {
  HostTensor x = uniform(DType::float32, {8, 16}, 210);
  HostTensor n(DType::int32, {1, 1});
  n.set_int(0, 5);
  auto outs = run(
      [](Tensor x, Tensor n) {
        KernelBuilder& b = x.builder();
        Tensor out = nl::ndarray({8, 16}, nl::float32, nl::shared_hbm);
        Tensor acc = nl::zeros({1, 16}, nl::float32);  // created before the loop: lives across iterations
        Tensor count = nl::zeros({1, 1}, nl::int32);
        Tensor sn = to_sbuf(n);
        const RegisterId upper = b.new_register(), i = b.new_register(), seven = b.new_register();
        test::append(Opcode::register_load, {Operand::reg_(upper), test::tensor_operand(sn)});
        // for i in [0, upper): out[i] = x[i]; acc += x[i]; count += 1
        const auto begin = static_cast<int32_t>(b.kernel().instructions.size());
        test::append(Opcode::loop_begin, {Operand::reg_(i), Operand::immediate(0), Operand::reg_(upper)},
               {}, RareAttributes{.step = 1, .jump = begin + 5});
        Tensor row = nl::ndarray({1, 16}, nl::float32, nl::sbuf);
        isa::dma_copy(row, x.ap({{16, 1}, {1, 16}}, ApOptions{.scalar_offset_register = i, .indirect_dim = 0}));
        isa::dma_copy(out.ap({{16, 1}, {1, 16}}, ApOptions{.scalar_offset_register = i, .indirect_dim = 0}), row);
        isa::tensor_tensor(acc, acc, row, nl::add);
        isa::tensor_scalar(count, count, nl::add, 1.0);
        test::append(Opcode::loop_end, {}, {}, RareAttributes{.jump = begin});
        // An empty range skips the body.
        const auto begin2 = static_cast<int32_t>(b.kernel().instructions.size());
        test::append(Opcode::loop_begin, {Operand::reg_(i), Operand::immediate(3), Operand::immediate(3)},
               {}, RareAttributes{.step = 1, .jump = begin2 + 2});
        isa::tensor_scalar(count, count, nl::add, 100.0);
        test::append(Opcode::loop_end, {}, {}, RareAttributes{.jump = begin2});
        // register_move of an immediate, register_store into a 1x1 tensor.
        Tensor stored = nl::ndarray({1, 1}, nl::int32, nl::sbuf);
        test::append(Opcode::register_move, {Operand::reg_(seven), Operand::immediate(7)});
        test::append(Opcode::register_store, {test::tensor_operand(stored), Operand::reg_(seven)});
        return std::make_tuple(out, to_hbm(acc), to_hbm(count), to_hbm(stored));
      },
      x, n);
  check_all("rows copied by the loop", 8 * 16, [&](int64_t i) { return f32_at(outs[0], i); },
            [&](int64_t i) { return i / 16 < 5 ? f32_at(x, i) : kNaN; });
  // Five fp32 additions in row order: exact to replay in fp32.
  check_all("accumulated across iterations", 16, [&](int64_t c) { return f32_at(outs[1], c); }, [&](int64_t c) {
    float s = 0;
    for (int r = 0; r < 5; ++r) s += float(f32_at(x, r * 16 + c));
    return double(s);
  });
  CHECK(int_at(outs[2], 0) == 5);
  CHECK(int_at(outs[3], 0) == 7);
}

TEST_CASE("instr: device_print writes a tile to stdout (IR level)") {
  HostTensor x(DType::float32, {2, 3});
  for (int i = 0; i < 6; ++i) set_f32(x, i, float(i + 1) * 0.5f);
  HostTensor k(DType::int32, {1, 4});
  for (int i = 0; i < 4; ++i) k.set_int(i, -i);
  std::fflush(stdout);
  const int saved = dup(fileno(stdout));
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture);
  dup2(fileno(capture), fileno(stdout));
  std::vector<HostTensor> outs;
  std::string error;
  try {
    outs = run(
        [](Tensor x, Tensor k) {
          Tensor sx = to_sbuf(x), sk = to_sbuf(k);
          test::append(Opcode::device_print, {test::tensor_operand(sx)}, {}, RareAttributes{.text = "x"});
          test::append(Opcode::device_print, {test::tensor_operand(sk)}, {}, RareAttributes{.text = "k"});
          return to_hbm(sx);
        },
        x, k);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::fflush(stdout);
  dup2(saved, fileno(stdout));
  close(saved);
  std::string text;
  std::rewind(capture);
  for (int ch; (ch = std::fgetc(capture)) != EOF;) text += char(ch);
  std::fclose(capture);
  REQUIRE(error.empty());
  CHECK(text == "x [2, 3]:\n[[0.5, 1, 1.5],\n [2, 2.5, 3]]\nk [1, 4]:\n[[0, -1, -2, -3]]\n");
  check_all("kernel output", 6, [&](int64_t i) { return f32_at(outs[0], i); }, [&](int64_t i) { return f32_at(x, i); });
}

TEST_CASE("instr: GpSimd int32 logical operators treat nonzero as true") {
  HostTensor a = integers(DType::int32, {64, 32}, 31, -3, 3), b = integers(DType::int32, {64, 32}, 32, -2, 2);
  auto outs = run(
      [](Tensor a, Tensor b) {
        Tensor sa = to_sbuf(a), sb = to_sbuf(b);
        std::vector<Tensor> r;
        for (const nl::Op& op : {nl::logical_and, nl::logical_or, nl::logical_xor}) {
          Tensor d = nl::ndarray({64, 32}, nl::int32, nl::sbuf);
          isa::tensor_tensor(d, sa, sb, op);  // int32 tiles: GpSimd's exact integer path
          r.push_back(to_hbm(d));
        }
        return r;
      },
      a, b);
  const char* names[] = {"logical_and", "logical_or", "logical_xor"};
  for (int k = 0; k < 3; ++k)
    check_all(names[k], a.size(), [&](int64_t i) { return double(int_at(outs[k], i)); }, [&](int64_t i) {
      const bool x = int_at(a, i) != 0, y = int_at(b, i) != 0;
      return double(k == 0 ? (x && y) : k == 1 ? (x || y) : (x != y));
    });
}
