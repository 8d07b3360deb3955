// Element numerics of NKI: fp32 <-> every storage dtype, with NKI's rounding, overflow and NaN
// rules.
//
// NeuronCore engines compute in fp32 and every write rounds to the destination dtype. This header
// is the single definition of that rounding for nikki: the reference interpreter calls it per
// element and the JIT calls the same functions (or inlines the same bit manipulations), so both
// executors agree bit for bit.
//
// Float formats are handled by integer bit manipulation, so results do not depend on the host's
// floating-point environment (rounding mode, flush-to-zero, -ffast-math). The integer dtypes use
// the host's conversions: int -> float rounds to nearest even under the default environment, and
// float -> int truncates values already clamped into range.
//
// Rules, with their sources (URLs are the Neuron SDK documentation, file paths are in the
// aws-neuron/aws-neuron-sdk repository):
//
// * Rounding: round to nearest, ties to even, for every float format. "The NeuronCore v2 performs
//   a Round-to-Nearest (RNE) algorithm with ties to Even by default" (about-neuron/arch/
//   neuron-features/data-types.rst; rounding-modes.rst says all generations support RNE).
//   Stochastic rounding (NEURON_RT_STOCHASTIC_ROUNDING_EN=1) is not modelled.
// * Subnormals are kept in every format, in and out; nothing flushes to zero. The NKI docs say
//   nothing about flushing, and ml_dtypes (which the NKI CPU simulator stores low-precision
//   tensors in, nki/guides/nki_simulator.rst "Precise Floating-Point Mode") keeps them.
// * Overflow and special values follow the ml_dtypes type each NKI dtype maps to, because the
//   NKI docs give only the bit layouts (nki/api/nki.api.shared.rst) and the simulator's results
//   are what NKI users compare against:
//     bfloat16      -> ml_dtypes.bfloat16      IEEE-like: overflow -> inf
//     float16       -> numpy.float16           IEEE binary16: overflow -> inf
//     float8_e4m3   -> ml_dtypes.float8_e4m3   bias 7, IEEE-like with inf (S.1111.000) and NaN
//                      (S.1111.mmm, mmm != 0), max finite 240; overflow -> inf. The legacy NKI
//                      page defines `nki.language.float8_e4m3 = dtype(float8_e4m3)` (https://
//                      awsdocs-neuron.readthedocs-hosted.com/en/latest/general/nki/api/generated/
//                      nki.language.float8_e4m3.html) and nki-library's torch references use 240
//                      as its max (core/output_projection/.../output_projection_cte_torch.py).
//     float8_e4m3fn -> ml_dtypes.float8_e4m3fn OCP: "no inf, NaN represented by 0bS111'1111"
//                      (nki.language.float8_e4m3fn page), max finite 448; overflow and inf -> NaN.
//     float8_e5m2   -> ml_dtypes.float8_e5m2   bias 15, IEEE-like, max finite 57344; overflow ->
//                      inf.
//     tfloat32      -> (no ml_dtypes type; NKI's legacy dtype is an opaque 4-byte void) fp32
//                      with the mantissa rounded to 10 bits, IEEE-like: overflow -> inf.
//   None of these saturate. Kernels that need saturation clamp before the cast, as nki-library's
//   fp8 torch references do (output_projection_cte_torch.py clamps to +-240 for float8_e4m3).
// * NaN: every NaN written to a narrower float format becomes the canonical quiet NaN of that
//   format with the input's sign: bf16 S.11111111.1000000 (0x7fc0), fp16 0x7e00, tf32 0x7fc00000,
//   e4m3 0x7c, e4m3fn 0x7f, e5m2 0x7e (each | sign). This is exactly what ml_dtypes produces for
//   its types;
//   numpy.float16 instead keeps payload bits, which only differs in which NaN comes out. Reading
//   bf16 and fp16 NaNs widens their payload exactly (as ml_dtypes and numpy do); reading an fp8
//   NaN gives the fp32 quiet NaN 0x7fc00000 with its sign (as ml_dtypes does). fp32 stores keep
//   all bits.
// * Float -> integer: the NKI docs read for this do not specify rounding, overflow or NaN. (The
//   newer docs have a "Type Casting" section, https://awsdocs-neuron.readthedocs-hosted.com/en/
//   v2.33.1/nki/api/nki.api.shared.html, that was not available in full; check this choice
//   against it.) nikki truncates toward zero, saturates to the destination range and maps NaN to 0:
//     - truncation is what the NKI CPU simulator does: it casts results with numpy
//       `result.astype(dst_np_dtype)` (nki/backends/simulator/activation.py, quoted in
//       https://github.com/aws-neuron/aws-neuron-sdk/issues/1308);
//     - numpy leaves out-of-range and NaN casts undefined (x86 gives INT32_MIN); the same issue
//       reports INT32_MAX results too (simulator and trn1 together), which x86 numpy does not
//       produce and a saturating converter does, so nikki saturates (negative values to
//       unsigned types give 0) and picks 0 for NaN, as LLVM's fptosi.sat and Rust's `as` do.
//   bool_ ("boolean stored as uint8") stores v != 0, so NaN is true, as numpy's astype(bool).
// * Integer -> fp32 reads round like an ordinary cast (int32/uint32 above 2^24 round to nearest
//   even).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "nikki/dtype.hpp"

namespace nikki::numerics {

/** @brief The IEEE-754 bit pattern of an fp32 value. */
constexpr uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }

/** @brief The fp32 value of a bit pattern. */
constexpr float bits_float(uint32_t bits) { return std::bit_cast<float>(bits); }

namespace detail {

inline constexpr uint32_t kF32SignMask = 0x8000'0000u;
inline constexpr uint32_t kF32AbsMask = 0x7fff'ffffu;
inline constexpr uint32_t kF32Inf = 0x7f80'0000u;
inline constexpr uint32_t kF32QuietNaN = 0x7fc0'0000u;

/** @brief x / 2^shift rounded to nearest, ties to even (1 <= shift <= 31, no overflow for
 * x < 2^31). */
constexpr uint32_t shift_right_rne(uint32_t x, uint32_t shift) {
  const uint32_t half_minus_one = (1u << (shift - 1)) - 1u;
  const uint32_t lsb = (x >> shift) & 1u;
  return (x + half_minus_one + lsb) >> shift;
}

/** @brief Rounds an fp32 bit pattern to nearest even at bit kDroppedBits, clearing the bits
 * below it.
 *
 * Works across the whole fp32 range with one addition: a carry out of the mantissa bumps the
 * exponent, which is exactly the next binade, and a carry out of the largest finite binade lands
 * on the infinity pattern, which is IEEE overflow. NaN must be handled by the caller.
 */
template <int kDroppedBits>
constexpr uint32_t round_f32_bits_rne(uint32_t bits) {
  constexpr uint32_t kMask = (1u << kDroppedBits) - 1u;
  const uint32_t lsb = (bits >> kDroppedBits) & 1u;
  return (bits + (kMask >> 1) + lsb) & ~kMask;
}

/** @brief The shape of a small binary float format stored in the low bits of an integer. */
struct SmallFloatFormat {
  int exp_bits;
  int man_bits;
  int bias;
  // IEEE-like: the all-ones exponent holds inf (mantissa 0) and NaNs. Otherwise ("fn" formats)
  // only the all-ones pattern is NaN and the rest of that binade is finite.
  bool has_inf;
  // Reading a NaN widens its payload (numpy float16) instead of giving the canonical fp32 quiet
  // NaN (ml_dtypes float8).
  bool widen_nan_payload;
};

inline constexpr SmallFloatFormat kFp16{5, 10, 15, true, true};
inline constexpr SmallFloatFormat kE4M3{4, 3, 7, true, false};
inline constexpr SmallFloatFormat kE4M3FN{4, 3, 7, false, false};
inline constexpr SmallFloatFormat kE5M2{5, 2, 15, true, false};

/** @brief fp32 -> small format, RNE, with the format's overflow and NaN rules (see file top). */
template <SmallFloatFormat F>
constexpr uint32_t encode_small(float value) {
  constexpr uint32_t kBits = uint32_t(F.exp_bits + F.man_bits);  // without the sign
  constexpr uint32_t kDropped = uint32_t(23 - F.man_bits);
  constexpr uint32_t kRebias = uint32_t(127 - F.bias) << 23;
  // fp32 biased exponent of the format's smallest normal.
  constexpr uint32_t kMinNormalExp = uint32_t(127 - F.bias + 1);
  constexpr uint32_t kInfCode = ((1u << F.exp_bits) - 1u) << F.man_bits;
  constexpr uint32_t kAllOnes = (1u << kBits) - 1u;
  constexpr uint32_t kNaNCode = F.has_inf ? kInfCode | (1u << (F.man_bits - 1)) : kAllOnes;
  // What an input past the largest finite value becomes (codes above it are out of range).
  constexpr uint32_t kOverflowCode = F.has_inf ? kInfCode : kNaNCode;

  const uint32_t bits = float_bits(value);
  const uint32_t sign = (bits >> 31) << kBits;
  const uint32_t abs = bits & kF32AbsMask;
  const uint32_t exp = abs >> 23;

  // Normal results: subtracting the rebias turns fp32 bits into the format's bits followed by
  // the dropped ones, so a single RNE shift rounds and carries into the exponent as needed.
  const uint32_t normal = shift_right_rne(abs - kRebias, kDropped);
  // Subnormal results: shift the full significand further right by how far the exponent is
  // below the smallest normal. fp32 subnormals (exp 0, no implicit bit) are far below every
  // target's range and round to zero; the shift is capped where everything rounds to zero.
  const uint32_t significand = (abs & 0x7f'ffffu) | (exp != 0 ? 0x80'0000u : 0u);
  const uint32_t below = kMinNormalExp - (exp < kMinNormalExp ? exp : kMinNormalExp);
  const uint32_t shift = kDropped + below < 25u ? kDropped + below : 25u;
  const uint32_t subnormal = shift_right_rne(significand, shift);

  uint32_t code = exp >= kMinNormalExp ? normal : subnormal;
  code = code > kOverflowCode ? kOverflowCode : code;  // also catches +-inf inputs
  code = abs > kF32Inf ? kNaNCode : code;
  return sign | code;
}

/** @brief Small format -> fp32 bit pattern (exact). */
template <SmallFloatFormat F>
constexpr uint32_t decode_small_bits(uint32_t code) {
  constexpr uint32_t kBits = uint32_t(F.exp_bits + F.man_bits);
  constexpr uint32_t kManMask = (1u << F.man_bits) - 1u;
  constexpr uint32_t kExpMax = (1u << F.exp_bits) - 1u;
  constexpr uint32_t kShift = uint32_t(23 - F.man_bits);

  const uint32_t sign = ((code >> kBits) & 1u) << 31;
  const uint32_t exp = (code >> F.man_bits) & kExpMax;
  const uint32_t man = code & kManMask;

  const bool is_nan = exp == kExpMax && (F.has_inf ? man != 0 : man == kManMask);
  if (is_nan) return sign | (F.widen_nan_payload ? kF32Inf | (man << kShift) : kF32QuietNaN);
  if (F.has_inf && exp == kExpMax) return sign | kF32Inf;
  if (exp != 0) return sign | ((exp + uint32_t(127 - F.bias)) << 23) | (man << kShift);
  if (man == 0) return sign;
  // Subnormal: every format here has its subnormals inside fp32's normal range, so normalize.
  const uint32_t top = uint32_t(31 - std::countl_zero(man));  // position of the leading 1
  const uint32_t lift = uint32_t(F.man_bits) - top;
  const uint32_t fp32_exp = uint32_t(127 - F.bias + 1) - lift;
  return sign | (fp32_exp << 23) | (((man << lift) & kManMask) << kShift);
}

/** @brief All 256 decoded values of an 8-bit format, as fp32 bit patterns. */
template <SmallFloatFormat F>
inline constexpr auto kDecodeTable8 = [] {
  struct Table {
    uint32_t bits[256];
  } table{};
  for (uint32_t code = 0; code < 256; ++code) table.bits[code] = decode_small_bits<F>(code);
  return table;
}();

/** @brief Float -> integer type I: truncate toward zero, saturate, NaN -> 0 (see file top). */
template <class I>
constexpr I int_from_float(float value) {
  using Limits = std::numeric_limits<I>;
  // Both bounds are exact in fp32: 0 or -2^(n-1), and 2^n or 2^(n-1) (one past the maximum).
  constexpr float kLow = float(Limits::min());
  constexpr float kPastHigh = float(Limits::max()) + 1.0f;
  // Narrow types convert through int32 (one cvttss2si on x86); 32-bit ones need int64 room for
  // the clamped one-past-the-maximum value.
  using Wide = std::conditional_t<(sizeof(I) < 4), int32_t, int64_t>;
  const bool is_nan = (float_bits(value) & kF32AbsMask) > kF32Inf;  // immune to -ffast-math
  float clamped = is_nan ? 0.0f : value;
  clamped = clamped < kLow ? kLow : clamped;
  clamped = clamped < kPastHigh ? clamped : kPastHigh;
  const Wide truncated = static_cast<Wide>(clamped);
  return static_cast<I>(truncated > Wide(Limits::max()) ? Wide(Limits::max()) : truncated);
}

}  // namespace detail

// --------------------------------------------------------------------------------------------
// Per-format conversions. `*_from_float` rounds an fp32 value into the format; `*_to_float`
// widens exactly.
// --------------------------------------------------------------------------------------------

/** @brief fp32 -> bfloat16 bits: RNE, overflow -> +-inf, NaN -> 0x7fc0 | sign. */
constexpr uint16_t bf16_from_float(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & detail::kF32AbsMask) > detail::kF32Inf)
    return uint16_t(((bits >> 16) & 0x8000u) | 0x7fc0u);
  return uint16_t(detail::round_f32_bits_rne<16>(bits) >> 16);
}

/** @brief bfloat16 bits -> fp32 (exact; NaN payloads are kept). */
constexpr float bf16_to_float(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }

/** @brief fp32 -> float16 bits: RNE, overflow -> +-inf, NaN -> 0x7e00 | sign. */
constexpr uint16_t fp16_from_float(float value) {
  return uint16_t(detail::encode_small<detail::kFp16>(value));
}

/** @brief float16 bits -> fp32 (exact; NaN payloads are kept, as numpy does). */
constexpr float fp16_to_float(uint16_t bits) {
  return bits_float(detail::decode_small_bits<detail::kFp16>(bits));
}

/**
 * @brief fp32 -> tfloat32, returned as the fp32 value it stores (low 13 bits zero).
 *
 * RNE to 10 mantissa bits over the full fp32 exponent range (subnormals included); overflow ->
 * +-inf; NaN -> 0x7fc00000 | sign.
 */
constexpr float tf32_round(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & detail::kF32AbsMask) > detail::kF32Inf)
    return bits_float((bits & detail::kF32SignMask) | detail::kF32QuietNaN);
  return bits_float(detail::round_f32_bits_rne<13>(bits));
}

/** @brief fp32 -> float8_e4m3 (Neuron legacy, max 240, has inf): RNE, overflow -> +-inf (0x78),
 * NaN -> 0x7c | sign. */
constexpr uint8_t fp8_e4m3_from_float(float value) {
  return uint8_t(detail::encode_small<detail::kE4M3>(value));
}

/** @brief float8_e4m3 bits -> fp32 (exact; NaN -> fp32 quiet NaN with the sign). */
constexpr float fp8_e4m3_to_float(uint8_t bits) {
  return bits_float(detail::kDecodeTable8<detail::kE4M3>.bits[bits]);
}

/** @brief fp32 -> float8_e4m3fn (OCP, max 448, no inf): RNE, overflow and +-inf -> NaN
 * (0x7f | sign), NaN -> 0x7f | sign. */
constexpr uint8_t fp8_e4m3fn_from_float(float value) {
  return uint8_t(detail::encode_small<detail::kE4M3FN>(value));
}

/** @brief float8_e4m3fn bits -> fp32 (exact; 0x7f/0xff -> fp32 quiet NaN with the sign). */
constexpr float fp8_e4m3fn_to_float(uint8_t bits) {
  return bits_float(detail::kDecodeTable8<detail::kE4M3FN>.bits[bits]);
}

/** @brief fp32 -> float8_e5m2 (max 57344, has inf): RNE, overflow -> +-inf (0x7c), NaN -> 0x7e |
 * sign. */
constexpr uint8_t fp8_e5m2_from_float(float value) {
  return uint8_t(detail::encode_small<detail::kE5M2>(value));
}

/** @brief float8_e5m2 bits -> fp32 (exact; NaN -> fp32 quiet NaN with the sign). */
constexpr float fp8_e5m2_to_float(uint8_t bits) {
  return bits_float(detail::kDecodeTable8<detail::kE5M2>.bits[bits]);
}

// Float -> integer conversions: truncate toward zero, saturate to the type's range, NaN -> 0.

/** @brief fp32 -> int8: truncate toward zero, saturate to [-128, 127], NaN -> 0. */
constexpr int8_t int8_from_float(float value) { return detail::int_from_float<int8_t>(value); }
/** @brief fp32 -> int16: truncate toward zero, saturate, NaN -> 0. */
constexpr int16_t int16_from_float(float value) { return detail::int_from_float<int16_t>(value); }
/** @brief fp32 -> int32: truncate toward zero, saturate (>= 2^31 -> INT32_MAX), NaN -> 0. */
constexpr int32_t int32_from_float(float value) { return detail::int_from_float<int32_t>(value); }
/** @brief fp32 -> uint8: truncate toward zero, saturate (negative -> 0), NaN -> 0. */
constexpr uint8_t uint8_from_float(float value) { return detail::int_from_float<uint8_t>(value); }
/** @brief fp32 -> uint16: truncate toward zero, saturate (negative -> 0), NaN -> 0. */
constexpr uint16_t uint16_from_float(float value) {
  return detail::int_from_float<uint16_t>(value);
}
/** @brief fp32 -> uint32: truncate toward zero, saturate (>= 2^32 -> UINT32_MAX), NaN -> 0. */
constexpr uint32_t uint32_from_float(float value) {
  return detail::int_from_float<uint32_t>(value);
}
/** @brief fp32 -> bool_ byte: 1 if value != 0 (NaN included), else 0 (+-0). */
constexpr uint8_t bool_from_float(float value) {
  return (float_bits(value) & detail::kF32AbsMask) != 0 ? 1 : 0;
}

// --------------------------------------------------------------------------------------------
// Generic element access by dtype. The templates serve code specialised per dtype (the JIT, and
// interpreter loops that hoist the dtype switch); the DType overloads dispatch at run time.
// `p` needs no alignment. Integer elements are host (little-endian) order, like NKI's.
// --------------------------------------------------------------------------------------------

namespace detail {

template <class T>
inline T load_raw(const void* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <class T>
inline void store_raw(void* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

}  // namespace detail

/** @brief Reads one element of dtype T as the fp32 value the engines compute with. */
template <DType T>
inline float load_float(const void* p) {
  using detail::load_raw;
  if constexpr (T == DType::float32 || T == DType::tfloat32) return load_raw<float>(p);
  else if constexpr (T == DType::bfloat16) return bf16_to_float(load_raw<uint16_t>(p));
  else if constexpr (T == DType::float16) return fp16_to_float(load_raw<uint16_t>(p));
  else if constexpr (T == DType::float8_e4m3) return fp8_e4m3_to_float(load_raw<uint8_t>(p));
  else if constexpr (T == DType::float8_e4m3fn) return fp8_e4m3fn_to_float(load_raw<uint8_t>(p));
  else if constexpr (T == DType::float8_e5m2) return fp8_e5m2_to_float(load_raw<uint8_t>(p));
  else if constexpr (T == DType::int8) return float(load_raw<int8_t>(p));
  else if constexpr (T == DType::int16) return float(load_raw<int16_t>(p));
  else if constexpr (T == DType::int32) return float(load_raw<int32_t>(p));
  else if constexpr (T == DType::uint8) return float(load_raw<uint8_t>(p));
  else if constexpr (T == DType::uint16) return float(load_raw<uint16_t>(p));
  else if constexpr (T == DType::uint32) return float(load_raw<uint32_t>(p));
  else if constexpr (T == DType::bool_) return load_raw<uint8_t>(p) != 0 ? 1.0f : 0.0f;
  else static_assert(T != T, "unhandled dtype");
}

/** @brief Writes fp32 `value` as one element of dtype T, with T's rounding, overflow and NaN
 * rules (see the top of this file). */
template <DType T>
inline void store_float(void* p, float value) {
  using detail::store_raw;
  if constexpr (T == DType::float32) store_raw<float>(p, value);
  else if constexpr (T == DType::tfloat32) store_raw<float>(p, tf32_round(value));
  else if constexpr (T == DType::bfloat16) store_raw<uint16_t>(p, bf16_from_float(value));
  else if constexpr (T == DType::float16) store_raw<uint16_t>(p, fp16_from_float(value));
  else if constexpr (T == DType::float8_e4m3) store_raw<uint8_t>(p, fp8_e4m3_from_float(value));
  else if constexpr (T == DType::float8_e4m3fn)
    store_raw<uint8_t>(p, fp8_e4m3fn_from_float(value));
  else if constexpr (T == DType::float8_e5m2) store_raw<uint8_t>(p, fp8_e5m2_from_float(value));
  else if constexpr (T == DType::int8) store_raw<int8_t>(p, int8_from_float(value));
  else if constexpr (T == DType::int16) store_raw<int16_t>(p, int16_from_float(value));
  else if constexpr (T == DType::int32) store_raw<int32_t>(p, int32_from_float(value));
  else if constexpr (T == DType::uint8) store_raw<uint8_t>(p, uint8_from_float(value));
  else if constexpr (T == DType::uint16) store_raw<uint16_t>(p, uint16_from_float(value));
  else if constexpr (T == DType::uint32) store_raw<uint32_t>(p, uint32_from_float(value));
  else if constexpr (T == DType::bool_) store_raw<uint8_t>(p, bool_from_float(value));
  else static_assert(T != T, "unhandled dtype");
}

/** @brief The fp32 value read back after store_float<T>(value), without touching memory. */
template <DType T>
inline float round_to(float value) {
  if constexpr (T == DType::float32) return value;
  else if constexpr (T == DType::tfloat32) return tf32_round(value);
  else if constexpr (T == DType::bfloat16) return bf16_to_float(bf16_from_float(value));
  else if constexpr (T == DType::float16) return fp16_to_float(fp16_from_float(value));
  else if constexpr (T == DType::float8_e4m3) return fp8_e4m3_to_float(fp8_e4m3_from_float(value));
  else if constexpr (T == DType::float8_e4m3fn)
    return fp8_e4m3fn_to_float(fp8_e4m3fn_from_float(value));
  else if constexpr (T == DType::float8_e5m2) return fp8_e5m2_to_float(fp8_e5m2_from_float(value));
  else if constexpr (T == DType::int8) return float(int8_from_float(value));
  else if constexpr (T == DType::int16) return float(int16_from_float(value));
  else if constexpr (T == DType::int32) return float(int32_from_float(value));
  else if constexpr (T == DType::uint8) return float(uint8_from_float(value));
  else if constexpr (T == DType::uint16) return float(uint16_from_float(value));
  else if constexpr (T == DType::uint32) return float(uint32_from_float(value));
  else if constexpr (T == DType::bool_) return float(bool_from_float(value));
  else static_assert(T != T, "unhandled dtype");
}

/**
 * @brief Reads one element of dtype T as an integer, for bitvec operators (NKI treats their
 * inputs as bit patterns).
 *
 * Integers are sign- or zero-extended; bool_ gives 0 or 1 (any nonzero byte is true). Float
 * dtypes give their raw bit pattern zero-extended (fp32/tf32: 32 bits, bf16/fp16: 16, fp8: 8).
 */
template <DType T>
inline int64_t load_int(const void* p) {
  using detail::load_raw;
  if constexpr (T == DType::int8) return load_raw<int8_t>(p);
  else if constexpr (T == DType::int16) return load_raw<int16_t>(p);
  else if constexpr (T == DType::int32) return load_raw<int32_t>(p);
  else if constexpr (T == DType::bool_) return load_raw<uint8_t>(p) != 0 ? 1 : 0;
  else if constexpr (dtype_size(T) == 1) return load_raw<uint8_t>(p);
  else if constexpr (dtype_size(T) == 2) return load_raw<uint16_t>(p);
  else return load_raw<uint32_t>(p);
}

/**
 * @brief Writes integer `value` into one element of dtype T, keeping its low bits (two's-
 * complement wrap to the width, no saturation).
 *
 * bool_ keeps the lowest bit, so bitwise NOT of a bool is logical NOT. Float dtypes receive the
 * low bits as a raw bit pattern, unrounded (a tf32 element may then have nonzero low mantissa
 * bits; it reads back as that fp32 value).
 */
template <DType T>
inline void store_int(void* p, int64_t value) {
  using detail::store_raw;
  const auto bits = static_cast<uint64_t>(value);
  if constexpr (T == DType::bool_) store_raw<uint8_t>(p, uint8_t(bits & 1u));
  else if constexpr (dtype_size(T) == 1) store_raw<uint8_t>(p, uint8_t(bits));
  else if constexpr (dtype_size(T) == 2) store_raw<uint16_t>(p, uint16_t(bits));
  else store_raw<uint32_t>(p, uint32_t(bits));
}

namespace detail {

/** @brief Calls f.template operator()<T>() for the run-time dtype t. */
template <class F>
inline decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::float32: return f.template operator()<DType::float32>();
    case DType::bfloat16: return f.template operator()<DType::bfloat16>();
    case DType::float16: return f.template operator()<DType::float16>();
    case DType::tfloat32: return f.template operator()<DType::tfloat32>();
    case DType::float8_e4m3: return f.template operator()<DType::float8_e4m3>();
    case DType::float8_e4m3fn: return f.template operator()<DType::float8_e4m3fn>();
    case DType::float8_e5m2: return f.template operator()<DType::float8_e5m2>();
    case DType::int8: return f.template operator()<DType::int8>();
    case DType::int16: return f.template operator()<DType::int16>();
    case DType::int32: return f.template operator()<DType::int32>();
    case DType::uint8: return f.template operator()<DType::uint8>();
    case DType::uint16: return f.template operator()<DType::uint16>();
    case DType::uint32: return f.template operator()<DType::uint32>();
    case DType::bool_: return f.template operator()<DType::bool_>();
  }
  // Only reachable with a value outside the enum; treat it like fp32 rather than invoke UB.
  return f.template operator()<DType::float32>();
}

}  // namespace detail

/** @brief Reads one element of dtype t as fp32 (see load_float<T>). */
inline float load_float(DType t, const void* p) {
  return detail::dispatch(t, [p]<DType T>() { return load_float<T>(p); });
}

/** @brief Writes fp32 `value` as one element of dtype t (see store_float<T>). */
inline void store_float(DType t, void* p, float value) {
  detail::dispatch(t, [p, value]<DType T>() { store_float<T>(p, value); });
}

/** @brief The fp32 value read back after store_float(t, p, value). */
inline float round_to(DType t, float value) {
  return detail::dispatch(t, [value]<DType T>() { return round_to<T>(value); });
}

/** @brief Reads one element of dtype t as an integer or raw bit pattern (see load_int<T>). */
inline int64_t load_int(DType t, const void* p) {
  return detail::dispatch(t, [p]<DType T>() { return load_int<T>(p); });
}

/** @brief Writes the low bits of `value` into one element of dtype t (see store_int<T>). */
inline void store_int(DType t, void* p, int64_t value) {
  detail::dispatch(t, [p, value]<DType T>() { store_int<T>(p, value); });
}

}  // namespace nikki::numerics
