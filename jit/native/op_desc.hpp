// The contract between nikki's code generator and its native kernel library.
//
// The library (kernels.cpp) is compiled to LLVM bitcode at build time. For every distinct
// instruction template the code generator emits a constant OpDesc describing the instruction
// (opcode, operators, dtypes, iteration space, byte strides) and a wrapper that calls the
// library entry with it; LLVM inlines the entry, folds the constant descriptor into it and
// vectorizes the loops that remain, so each template becomes its own specialized routine.
// Addresses, immediates and accumulator state arrive at run time in OpArgs (the public
// nikki/jit/native_args.hpp: all the runtime needs to call a routine).
//
// Plain structs only: this header is compiled by both g++ (the compiler side) and clang (the
// bitcode side), so its layout must be identical in both.
#pragma once

#include <cstdint>

#include "nikki/jit/native_args.hpp"

namespace nikki::native {

inline constexpr int kIterDims = 5;  // partition dim + up to 4 free dims

/** @brief An operand as the kernel iterates it: dtype and byte stride along each iteration dim. */
struct ViewDesc {
  int32_t dtype;
  int32_t reserved;
  int64_t stride[kIterDims];
};

enum SlotKind : int32_t { kSlotNone = 0, kSlotTensor = 1, kSlotImm = 2 };

enum Flags : int32_t {
  kFlagReverse0 = 1,
  kFlagReverse1 = 2,
  kFlagNegate = 4,
  kFlagReversePred = 8,
  kFlagIsTranspose = 16,
  kFlagGpsimdInt = 32,  // tensor_tensor on GpSimd with 32-bit integer tiles: exact integer arithmetic
  kFlagStaticOverlap = 64,  // static_hazards holds the overlap verdict (every operand is on chip)
};

/**
 * @brief An operand whose dims do not nest with the iteration space's ("irregular"): element
 * (i0..i4) is its flattened index f = sum(i_k * flat[k]) decomposed into its own dims (count,
 * byte stride; innermost last, unused dims count 1), plus i0 * view.stride[0] (the partition
 * stride of engine operands, whose flat[0] is 0).
 */
struct IrregularView {
  int64_t flat[kIterDims];
  int64_t count[kIterDims];
  int64_t stride[kIterDims];
};

/** @brief One instruction template. Iteration dim 0 is the partition dim of engine operands.
 *
 * Most opcodes pair every tensor operand element by element over one iteration space (count, with
 * each slot's byte strides in view[slot].stride; [P, 1] operands have stride 0 along the free
 * dims; slots in the `irregular` bit set are addressed through irr[slot] instead along the free
 * dims). Opcodes whose output has a fixed small free size of its own (bn_stats, bn_aggr, max8,
 * nc_find_index8) iterate the data over `count` and their fixed-size operands (the `out_slots`
 * bit set) over the second space `out_count` (dim 0 unused: the partitions are count[0]).
 * iota / affine_select describe their affine pattern as a pseudo-operand in slot kSlots - 1 whose
 * "strides" are value steps (dim 0: channel_multiplier). */
struct OpDesc {
  int32_t opcode;
  int32_t engine;
  int32_t op0, op1, func, reduce_op, reduce_cmd, cmp_op, accumulate, flags;
  int32_t reduce_from;  // tensor_reduce: iteration dims >= reduce_from are reduced
  int32_t bits;         // bit width of the data dtype, for bitvec operators
  int64_t count[kIterDims];
  int32_t slot_kind[kSlots];
  int32_t out_slots;  // bit set of slots iterated over out_count
  ViewDesc view[kSlots];
  // nc_matmul: dst[m, n] (+)= sum_k stationary[k, m] * moving[k, n]
  int64_t mm_k, mm_m, mm_n;
  int64_t offset;  // iota / affine_select: value = offset + pattern pseudo-operand offset, wrapped to int32
  int64_t out_count[kIterDims];
  int32_t irregular;  // bit set of slots addressed through irr
  uint32_t static_hazards;  // with kFlagStaticOverlap: overlap_hazards(desc, 0, addresses)
  IrregularView irr[kSlots];
};

// No padding anywhere: both compilers must agree on every field's offset.
static_assert(sizeof(IrregularView) == 3 * kIterDims * 8);
static_assert(sizeof(OpDesc) == 432 + kSlots * sizeof(IrregularView));

/** @brief Largest partition count a routine keeps per-partition state for on its stack; the
 * template builder leaves instructions over more partitions to the reference semantics. */
inline constexpr int64_t kMaxPartitions = 128;

}  // namespace nikki::native
