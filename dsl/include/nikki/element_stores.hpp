// How the engines store a value they produce, beyond numerics.hpp's conversions: integer results
// saturate to the destination dtype, and element copies keep the bits when the dtypes match.
//
// The one definition for both executors: the reference semantics (runtime/) call these per
// element, and the native routine library (jit/native/kernels.cpp, compiled to bitcode) calls the
// same functions, which fold to straight-line code once a routine's dtypes are constants.
#pragma once

#include <cstdint>
#include <cstring>

#include "nikki/dtype.hpp"
#include "nikki/numerics.hpp"

namespace nikki::numerics {

/**
 * @brief Writes integer `value` with the engines' cast rule: clamped to the range of an integer
 * dtype (bool_: [0, 1]), rounded like store_float to a float dtype.
 *
 * Unlike store_int (which keeps the low bits), this is how computed integers (iota values,
 * indices, counts, register stores) reach memory.
 */
inline void store_saturated(DType t, void* p, int64_t value) {
  if (is_float(t)) {
    store_float(t, p, static_cast<float>(value));
    return;
  }
  const int bits = 8 * static_cast<int>(dtype_size(t));
  const int64_t lo = info(t).is_signed ? -(int64_t(1) << (bits - 1)) : 0;
  const int64_t hi = t == DType::bool_           ? 1
                     : info(t).is_signed ? (int64_t(1) << (bits - 1)) - 1
                                         : (int64_t(1) << bits) - 1;
  store_int(t, p, value < lo ? lo : value > hi ? hi : value);
}

/** @brief Copies one element: bit-exact when the dtypes match (NaN payloads and -0 included),
 * else converted through fp32 (load_float, then store_float). */
inline void copy_element(DType dst_type, void* dst, DType src_type, const void* src) {
  if (dst_type == src_type) std::memcpy(dst, src, dtype_size(dst_type));
  else store_float(dst_type, dst, load_float(src_type, src));
}

}  // namespace nikki::numerics
