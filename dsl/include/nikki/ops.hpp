// The operator vocabularies of NKI instructions: ALU operators (nl.add, nl.maximum, ...),
// activation functions (nl.exp, nl.gelu, ...), reduce commands, memory buffers.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nikki {

/** @brief Where a tensor lives (nki.language buffers). */
enum class Buffer : uint8_t { hbm, shared_hbm, private_hbm, sbuf, psum };

inline constexpr std::string_view buffer_name(Buffer b) {
  constexpr std::array<std::string_view, 5> names = {"hbm", "shared_hbm", "private_hbm", "sbuf", "psum"};
  return names[static_cast<int>(b)];
}
inline constexpr bool is_hbm(Buffer b) { return b == Buffer::hbm || b == Buffer::shared_hbm || b == Buffer::private_hbm; }
inline constexpr bool is_on_chip(Buffer b) { return b == Buffer::sbuf || b == Buffer::psum; }

/**
 * @brief ALU operators of the Vector/Scalar/GpSimd engines (NKI's operator table).
 * Arithmetic operators compute in fp32; bitvec operators act on integer bit patterns.
 */
enum class AluOp : uint8_t {
  bypass,  // no operation: passes the first operand through (NKI op1=None)
  add, subtract, multiply, divide, maximum, minimum, power, mod, fmod, abs_max, abs_min,
  equal, not_equal, greater, greater_equal, less, less_equal,
  logical_and, logical_or, logical_xor,
  bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift, arith_shift_right,
  // unary operators (the second operand is ignored)
  invert, abs, square, relu, rsqrt, reciprocal, negate,
  average,  // only as a tensor_partition_reduce operator
};
inline constexpr int kNumAluOps = static_cast<int>(AluOp::average) + 1;

inline constexpr std::array<std::string_view, kNumAluOps> kAluOpNames = {
    "bypass", "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "mod", "fmod",
    "abs_max", "abs_min", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
    "left_shift", "right_shift", "arith_shift_right", "invert", "abs", "square", "relu", "rsqrt",
    "reciprocal", "negate", "average"};

inline constexpr std::string_view alu_op_name(AluOp op) { return kAluOpNames[static_cast<int>(op)]; }
inline constexpr std::optional<AluOp> alu_op_from_name(std::string_view name) {
  for (int i = 0; i < kNumAluOps; ++i)
    if (kAluOpNames[i] == name) return static_cast<AluOp>(i);
  return std::nullopt;
}
inline constexpr bool is_bitvec_op(AluOp op) {
  return op == AluOp::bitwise_and || op == AluOp::bitwise_or || op == AluOp::bitwise_xor ||
         op == AluOp::left_shift || op == AluOp::right_shift || op == AluOp::arith_shift_right ||
         op == AluOp::invert;
}
inline constexpr bool is_unary_op(AluOp op) {
  return op == AluOp::invert || op == AluOp::abs || op == AluOp::square || op == AluOp::relu ||
         op == AluOp::rsqrt || op == AluOp::reciprocal || op == AluOp::negate;
}
/** @brief Operators NKI allows as reductions (the "legal reduction op" column). */
inline constexpr bool is_reduce_op(AluOp op) {
  return op == AluOp::add || op == AluOp::subtract || op == AluOp::multiply ||
         op == AluOp::maximum || op == AluOp::minimum || op == AluOp::bitwise_and ||
         op == AluOp::bitwise_or || op == AluOp::bitwise_xor || op == AluOp::logical_and ||
         op == AluOp::logical_or || op == AluOp::logical_xor || op == AluOp::abs_max ||
         op == AluOp::abs_min;
}

/** @brief ScalarE activation functions (nisa.activation op=). */
enum class ActFunc : uint8_t {
  copy, square, sigmoid, relu, gelu, gelu_dx, gelu_apprx_tanh, gelu_apprx_sigmoid,
  gelu_apprx_sigmoid_dx, silu, silu_dx, tanh, softplus, mish, erf, erf_dx, exp, log, sin,
  arctan, sqrt, rsqrt, reciprocal, sign, abs,
};
inline constexpr int kNumActFuncs = static_cast<int>(ActFunc::abs) + 1;

inline constexpr std::array<std::string_view, kNumActFuncs> kActFuncNames = {
    "copy", "square", "sigmoid", "relu", "gelu", "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid",
    "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "tanh", "softplus", "mish", "erf", "erf_dx", "exp",
    "log", "sin", "arctan", "sqrt", "rsqrt", "reciprocal", "sign", "abs"};

inline constexpr std::string_view act_func_name(ActFunc f) { return kActFuncNames[static_cast<int>(f)]; }
inline constexpr std::optional<ActFunc> act_func_from_name(std::string_view name) {
  for (int i = 0; i < kNumActFuncs; ++i)
    if (kActFuncNames[i] == name) return static_cast<ActFunc>(i);
  if (name == "identity") return ActFunc::copy;
  return std::nullopt;
}

/** @brief Accumulator control of activation / select_reduce (nisa.reduce_cmd). */
enum class ReduceCmd : uint8_t { idle, reset, reduce, reset_reduce, load_reduce };
inline constexpr std::string_view reduce_cmd_name(ReduceCmd c) {
  constexpr std::array<std::string_view, 5> names = {"idle", "reset", "reduce", "reset_reduce", "load_reduce"};
  return names[static_cast<int>(c)];
}

/** @brief nc_matmul's accumulate flag: None (auto), False, True. */
enum class Accumulate : uint8_t { automatic, overwrite, accumulate };
inline constexpr std::string_view accumulate_name(Accumulate a) {
  constexpr std::array<std::string_view, 3> names = {"auto", "false", "true"};
  return names[static_cast<int>(a)];
}

}  // namespace nikki
