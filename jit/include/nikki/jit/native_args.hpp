// How a generated native routine is called: the run-time argument block the executor fills for
// one instruction (operand addresses, immediates, the engines' accumulators, PSUM flags and
// working memory) and the routine's signature. What a routine computes is fixed when it is
// generated (jit/native/op_desc.hpp, private to the code generator); this is all a caller needs.
//
// Plain structs only: the native routine library includes this header too and is compiled by
// clang to bitcode, so the layout must be identical under both compilers.
#pragma once

#include <cstdint>

namespace nikki::native {

/** @brief Operand slots of an instruction (the IR's kMaxSlots). */
inline constexpr int kSlots = 5;

/** @brief Run-time arguments of one instruction. */
struct OpArgs {
  uint8_t* base[kSlots];    // address of each tensor operand's first element
  double imm[kSlots];       // immediate operands
  float* scalar_acc;        // Scalar engine accumulators, one per partition
  float* vector_acc;        // Vector engine accumulators, one per partition
  uint8_t* psum_written;    // nc_matmul: "written by a matmul" flag of dst's first PSUM word
  int64_t psum_flag_pitch;  // flags per partition row
  float* scratch;           // at least kScratchFloats floats of working memory
};

/** @brief Working memory a routine may need (nc_matmul packs its operands: 128x128 + 2 x 128x512). */
inline constexpr int64_t kScratchFloats = 128 * 128 + 2 * 128 * 512;

/** @brief Signature of every generated routine. */
using Routine = void (*)(const OpArgs*);

}  // namespace nikki::native
