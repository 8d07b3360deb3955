// Element types of NKI tensors: names, sizes and classification.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nikki {

/** @brief Every element type NKI tensors can hold (nki.language dtypes). */
enum class DType : uint8_t {
  float32,
  bfloat16,
  float16,
  tfloat32,       // 1-8-10 format stored in 32 bits (low 13 mantissa bits zero)
  float8_e4m3,    // Neuron's legacy fp8: IEEE-style, has infinities
  float8_e4m3fn,  // OCP fp8: no infinities, one NaN pattern per sign
  float8_e5m2,
  int8,
  int16,
  int32,
  uint8,
  uint16,
  uint32,
  bool_,  // stored as one byte holding 0 or 1
};

inline constexpr int kNumDTypes = 14;

/** @brief Static facts about one dtype. */
struct DTypeInfo {
  std::string_view name;  // NKI spelling, e.g. "bfloat16"
  std::string_view short_name;  // compact spelling used by the IR text form, e.g. "bf16"
  uint8_t size;           // bytes per element
  bool is_float;
  bool is_signed;
};

inline constexpr std::array<DTypeInfo, kNumDTypes> kDTypeInfo = {{
    {"float32", "f32", 4, true, true},
    {"bfloat16", "bf16", 2, true, true},
    {"float16", "f16", 2, true, true},
    {"tfloat32", "tf32", 4, true, true},
    {"float8_e4m3", "f8e4m3", 1, true, true},
    {"float8_e4m3fn", "f8e4m3fn", 1, true, true},
    {"float8_e5m2", "f8e5m2", 1, true, true},
    {"int8", "i8", 1, false, true},
    {"int16", "i16", 2, false, true},
    {"int32", "i32", 4, false, true},
    {"uint8", "u8", 1, false, false},
    {"uint16", "u16", 2, false, false},
    {"uint32", "u32", 4, false, false},
    {"bool_", "bool", 1, false, false},
}};

constexpr const DTypeInfo& info(DType t) { return kDTypeInfo[static_cast<int>(t)]; }
constexpr uint32_t dtype_size(DType t) { return info(t).size; }
constexpr std::string_view dtype_name(DType t) { return info(t).name; }
constexpr bool is_float(DType t) { return info(t).is_float; }
constexpr bool is_integer(DType t) { return !info(t).is_float; }
constexpr bool is_fp8(DType t) {
  return t == DType::float8_e4m3 || t == DType::float8_e4m3fn || t == DType::float8_e5m2;
}

/** @brief Parses an NKI or compact dtype name ("bfloat16", "bf16", "bool", ...). */
constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kDTypeInfo[i].name == name || kDTypeInfo[i].short_name == name)
      return static_cast<DType>(i);
  }
  if (name == "bool") return DType::bool_;
  return std::nullopt;
}

}  // namespace nikki
