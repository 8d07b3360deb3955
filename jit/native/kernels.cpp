// nikki's native kernel library. Compiled to LLVM bitcode at build time (clang, -ffp-contract=off)
// and specialized per instruction template by the JIT: every entry point takes a constant OpDesc,
// so after inlining the opcode and dtype switches fold away and the remaining loops have constant
// trip counts and strides, which LLVM vectorizes for the host CPU.
//
// Numerics must match the reference interpreter bit for bit: both use nikki/numerics.hpp,
// nikki/element_stores.hpp, nikki/alu.hpp and nikki/activation.hpp for element conversions,
// stores and operators, and nikki/reduction_order.hpp for tensor_reduce's fold; the loops here
// keep the interpreter's order of every rounding step (sequential folds per partition, fused
// multiply-adds in increasing k for matmul). Accumulating routines read and update the engines'
// per-partition accumulators (OpArgs::scalar_acc / vector_acc) exactly as the reference does, so
// reduce_cmd sequences carry across instructions whichever executor ran each one.
//
// Loop shapes: element-wise routines walk partitions, then the free dims (innermost vectorizes;
// when the operands cannot overlap harmfully, independent() lets the routine declare that loop's
// iterations independent, so LLVM vectorizes it without run-time alias checks). Routines folding
// along a partition's row either fold one row at a time in an order that vectorizes along the row
// (tensor_reduce: reduction_order.hpp), run partitions innermost (tensor_reduce with bitvec
// operators: the sequential fold vectorizes across partitions), fold rows kLanes partitions at a
// time through transposed blocks (for_row_blocks, fold_rows: one vector operation per step of
// kLanes sequential folds; activation and tensor_scalar_reduce with reduce, select_reduce,
// bn_stats, and tensor_reduce of short rows), or walk chunks of rows too short for a block with
// every partition's fold in turn (iterate_chunks: the element-wise part vectorizes along the
// chunk, the independent folds overlap). Partitions never interact, and engine operands of one
// instruction cover the same or disjoint partitions, so reordering partitions never changes a
// result.
#include <cstring>
#include <type_traits>
#include <utility>

#include "nikki/activation.hpp"
#include "nikki/alu.hpp"
#include "nikki/element_stores.hpp"
#include "nikki/numerics.hpp"
#include "nikki/reduction_order.hpp"
#include "op_desc.hpp"
#include "operand_overlap.hpp"

#define NK_INLINE __attribute__((always_inline)) inline
#define NK_ENTRY extern "C" __attribute__((always_inline))
// Entries copy their OpArgs to a local first: stores through the operands' byte pointers could
// alias the caller's OpArgs, which would otherwise force a reload of every base address after
// every store and keep loops from vectorizing.
#define NK_LOCAL_ARGS                  \
  const OpArgs nk_local_args = *args; \
  const OpArgs* const a = &nk_local_args

namespace nikki::native {
namespace {

NK_INLINE DType dtype_of(const OpDesc* d, int slot) { return static_cast<DType>(d->view[slot].dtype); }

/** Byte offset of a slot's element at an iteration point (for the affine pattern pseudo-operand:
 * its value). Irregular slots decompose their flattened free index into their own dims; the
 * divisors are descriptor constants, so this folds to multiplications and shifts. */
NK_INLINE int64_t offset_of(const OpDesc* d, int slot, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
  const int64_t* s = d->view[slot].stride;
  if (!(d->irregular & (1 << slot))) return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3] + i4 * s[4];
  const IrregularView& v = d->irr[slot];
  int64_t f = i0 * v.flat[0] + i1 * v.flat[1] + i2 * v.flat[2] + i3 * v.flat[3] + i4 * v.flat[4];
  int64_t off = i0 * s[0];
  for (int k = kIterDims - 1; k >= 0; --k) {
    off += (f % v.count[k]) * v.stride[k];
    f /= v.count[k];
  }
  return off;
}

NK_INLINE uint8_t* address(const OpDesc* d, const OpArgs* a, int slot, int64_t i0, int64_t i1, int64_t i2,
                           int64_t i3, int64_t i4) {
  return a->base[slot] + offset_of(d, slot, i0, i1, i2, i3, i4);
}

NK_INLINE float load(const OpDesc* d, int slot, const uint8_t* p) { return numerics::load_float(dtype_of(d, slot), p); }
NK_INLINE void store(const OpDesc* d, int slot, uint8_t* p, float v) { numerics::store_float(dtype_of(d, slot), p, v); }
NK_INLINE int64_t load_int(const OpDesc* d, int slot, const uint8_t* p) {
  return numerics::load_int(dtype_of(d, slot), p);
}
NK_INLINE void store_int(const OpDesc* d, int slot, uint8_t* p, int64_t v) {
  numerics::store_int(dtype_of(d, slot), p, v);
}

/** Calls f(i0..i4) over the iteration space, innermost dim last. */
template <class F>
NK_INLINE void iterate(const OpDesc* d, F&& f) {
  for (int64_t i0 = 0; i0 < d->count[0]; ++i0)
    for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
      for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
        for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
          for (int64_t i4 = 0; i4 < d->count[4]; ++i4) f(i0, i1, i2, i3, i4);
}

/** A scalar-or-tensor operand's fp32 value at an iteration point (tensors may be [P, 1] views; an
 * absent operand reads as its immediate, 0, as in the reference). */
NK_INLINE float operand_value(const OpDesc* d, const OpArgs* a, int slot, int64_t i0, int64_t i1, int64_t i2,
                              int64_t i3, int64_t i4) {
  if (d->slot_kind[slot] != kSlotTensor) return static_cast<float>(a->imm[slot]);
  return load(d, slot, address(d, a, slot, i0, i1, i2, i3, i4));
}

NK_INLINE float apply(AluOp op, bool reverse, float x, float s) {
  // reverse swaps an operator's operands; unary operators have only their tensor operand
  return (reverse && !is_unary_op(op)) ? alu_apply(op, s, x) : alu_apply(op, x, s);
}

NK_INLINE int64_t apply_bits(AluOp op, bool reverse, int64_t x, int64_t s, int bits) {
  return (reverse && !is_unary_op(op)) ? alu_apply_bits(op, s, x, bits) : alu_apply_bits(op, x, s, bits);
}

/** Copies the element of slot 1 at `src` to slot 0's element at `dst` (bit-exact when the dtypes
 * match, through fp32 otherwise: numerics::copy_element). */
NK_INLINE void copy_element(const OpDesc* d, uint8_t* dst, const uint8_t* src) {
  numerics::copy_element(dtype_of(d, 0), dst, dtype_of(d, 1), src);
}

/** Calls f(i1..i4) over the free dims of the iteration space (`count`), innermost dim last. */
template <class F>
NK_INLINE void iterate_free(const int64_t* count, F&& f) {
  for (int64_t i1 = 0; i1 < count[1]; ++i1)
    for (int64_t i2 = 0; i2 < count[2]; ++i2)
      for (int64_t i3 = 0; i3 < count[3]; ++i3)
        for (int64_t i4 = 0; i4 < count[4]; ++i4) f(i1, i2, i3, i4);
}

/** Elements of the innermost dim a folding routine handles per partition at a time. */
inline constexpr int64_t kChunk = 64;

/**
 * For routines that fold each partition's elements in order: calls f(p, i1, i2, i3, j0, len,
 * start) for chunks [j0, j0 + len) of the innermost dim, every partition of a chunk before the
 * next chunk (start: the partition's first chunk). Within a chunk the element-wise work
 * vectorizes along the row, and the partitions' sequential folds are independent of each other.
 */
template <class F>
NK_INLINE void iterate_chunks(const OpDesc* d, F&& f) {
  const int64_t n = d->count[4];
  for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
    for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
      for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
        for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
          const int64_t len = n - j0 < kChunk ? n - j0 : kChunk;
          const bool start = (i1 | i2 | i3 | j0) == 0;
          for (int64_t p = 0; p < d->count[0]; ++p) f(p, i1, i2, i3, j0, len, start);
        }
}

/** Calls f(i1, i2, i3, j0, len) for one partition's chunks in order, until f returns false. */
template <class F>
NK_INLINE void iterate_row_chunks(const OpDesc* d, F&& f) {
  const int64_t n = d->count[4];
  for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
    for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
      for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
        for (int64_t j0 = 0; j0 < n; j0 += kChunk)
          if (!f(i1, i2, i3, j0, n - j0 < kChunk ? n - j0 : kChunk)) return;
}

/** Calls f(k, o1..o4) over the fixed-size output space (out_count), k the flattened free index. */
template <class F>
NK_INLINE void iterate_out(const OpDesc* d, F&& f) {
  int64_t k = 0;
  iterate_free(d->out_count, [&](int64_t o1, int64_t o2, int64_t o3, int64_t o4) { f(k++, o1, o2, o3, o4); });
}

/** The accumulator update of a reduce command (the reference interpreter's apply_reduce_cmd). */
NK_INLINE void apply_reduce_cmd(ReduceCmd cmd, AluOp op, float identity, float& acc, float partial, bool has_partial) {
  switch (cmd) {
    case ReduceCmd::idle: break;
    case ReduceCmd::reset: acc = identity; break;
    case ReduceCmd::reduce:
    case ReduceCmd::load_reduce:
      if (has_partial) acc = alu_apply(op, acc, partial);
      break;
    case ReduceCmd::reset_reduce: acc = has_partial ? canonical_nan(partial) : identity; break;
  }
}

// --- loops whose iterations may run in any order ----------------------------------------------

/** Calls f(i0, i1..i4) over the free dims of partition i0, innermost dim last. */
template <class F>
NK_INLINE void iterate_row(const OpDesc* d, int64_t i0, F&& f) {
  for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
    for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
      for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
        for (int64_t i4 = 0; i4 < d->count[4]; ++i4) f(i0, i1, i2, i3, i4);
}

/** iterate_row with the innermost loop's iterations declared independent of each other, for
 * operands independent() accepted: LLVM then vectorizes without checking at run time whether a
 * store may feed a later load (its check also rejects an exact in-place update, the common case). */
template <class F>
NK_INLINE void iterate_row_parallel(const OpDesc* d, int64_t i0, F&& f) {
  for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
    for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
      for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
#pragma clang loop vectorize(assume_safety)
        for (int64_t i4 = 0; i4 < d->count[4]; ++i4) f(i0, i1, i2, i3, i4);
}

template <bool kParallel, class F>
NK_INLINE void for_row(const OpDesc* d, int64_t i0, F&& f) {
  if constexpr (kParallel) iterate_row_parallel(d, i0, f);
  else iterate_row(d, i0, f);
}

/** Calls body(std::true_type) when `parallel`, else body(std::false_type): the two
 * instantiations are the routine with and without independent inner loops. */
template <class Body>
NK_INLINE void dispatch_parallel(bool parallel, Body&& body) {
  if (parallel) body(std::true_type{});
  else body(std::false_type{});
}

/**
 * Whether a routine may process the elements of `dst` and of the tensor slots in `srcs` in any
 * order within a partition (operand_overlap.hpp). With a verdict from the template builder the
 * descriptor decides and LLVM folds the test away, and with it one of dispatch_parallel's loops.
 */
NK_INLINE bool independent(const OpDesc* d, const OpArgs* a, int dst, uint32_t srcs) {
  uint32_t hazards;
  if (d->flags & kFlagStaticOverlap) {
    hazards = d->static_hazards;  // computed for dst = 0, the destination of every caller
  } else {
    intptr_t base[kSlots];
    for (int s = 0; s < kSlots; ++s) base[s] = reinterpret_cast<intptr_t>(a->base[s]);
    hazards = overlap_hazards(d, dst, base);
  }
  return (hazards & (kHazardDst | srcs)) == 0;
}

// --- sequential folds of many partitions at once ----------------------------------------------

typedef float lanes_v __attribute__((ext_vector_type(16)));
inline constexpr int64_t kLanes = 16;  // partitions folded together, elements per step of each

template <int H, size_t... J>
NK_INLINE lanes_v interleave_lo(lanes_v x, lanes_v y, std::index_sequence<J...>) {
  return __builtin_shufflevector(x, y, ((J & H) == 0 ? int(J) : int(J) - H + 16)...);
}
template <int H, size_t... J>
NK_INLINE lanes_v interleave_hi(lanes_v x, lanes_v y, std::index_sequence<J...>) {
  return __builtin_shufflevector(x, y, ((J & H) == 0 ? int(J) + H : int(J) + 16)...);
}

/**
 * Where a block transpose keeps its 16 vectors between stages. In registers (the stages unrolled)
 * suits routines whose per-element work is light: tensor_scalar_reduce's multiply and sum on
 * [128, 2048] fp32 took 137 us through memory, 85-99 us in registers. Routines with heavy
 * per-element work (activation's polynomials, bn_stats' divisions) need the registers for that:
 * in registers made them 8-12% slower.
 */
enum class Transpose { in_memory, in_registers };

/** One stage of a 16 x 16 transpose: swaps the H x H off-diagonal blocks of every 2H x 2H block. */
template <int H>
NK_INLINE void transpose_pair(lanes_v (&r)[kLanes], int i) {
  const lanes_v x = r[i], y = r[i + H];
  r[i] = interleave_lo<H>(x, y, std::make_index_sequence<kLanes>());
  r[i + H] = interleave_hi<H>(x, y, std::make_index_sequence<kLanes>());
}
template <int H, Transpose kWhere>
NK_INLINE void transpose_stage(lanes_v (&r)[kLanes]) {
  if constexpr (kWhere == Transpose::in_registers) {
#pragma clang loop unroll(full)
    for (int i = 0; i < kLanes; ++i)
      if (!(i & H)) transpose_pair<H>(r, i);
  } else {
    for (int i = 0; i < kLanes; ++i)
      if (!(i & H)) transpose_pair<H>(r, i);
  }
}

/** kLanes elements of kLanes rows (`stride` floats apart) transposed: element j of every row in
 * cols[j]. */
template <Transpose kWhere>
NK_INLINE void transpose_block(const float* rows, int64_t stride, lanes_v (&cols)[kLanes]) {
  for (int l = 0; l < kLanes; ++l) std::memcpy(&cols[l], rows + l * stride, sizeof(lanes_v));
  transpose_stage<8, kWhere>(cols);
  transpose_stage<4, kWhere>(cols);
  transpose_stage<2, kWhere>(cols);
  transpose_stage<1, kWhere>(cols);
}

/**
 * Folds elements 0..len of every lane's row into acc[l] (cols: a transposed block, element j of
 * every lane in cols[j]), each lane's elements in order, with acc = fold(acc, element); an
 * unseeded fold takes its first element as it is. Each step of the kLanes independent sequential
 * folds is one vector operation.
 */
template <class Fold>
NK_INLINE void fold_block(Fold&& fold, float (&acc)[kLanes], bool& seeded, const lanes_v (&cols)[kLanes],
                          int64_t len) {
  float col[kLanes][kLanes];
  std::memcpy(col, cols, sizeof(col));
  int64_t j = 0;
  if (!seeded) {
    for (int l = 0; l < kLanes; ++l) acc[l] = col[0][l];
    seeded = true;
    j = 1;
  }
  for (; j < len; ++j)
    for (int l = 0; l < kLanes; ++l) acc[l] = fold(acc[l], col[j][l]);
}

/** Rows at least this long are folded kLanes partitions at a time (fold_rows); shorter ones
 * partition by partition, where a transposed block would be mostly empty. */
inline constexpr int64_t kFoldRowMin = 8;

/** Elements of a row values() computes per call in for_row_blocks by default: a few vectors'
 * worth, so that the call's own work is spread over them (activation with reduce on [128, 2048]:
 * 235 -> 205 us against chunks of kLanes). */
inline constexpr int64_t kRowChunk = 4 * kLanes;

/**
 * Walks every partition's row kLanes partitions at a time, for folds that carry state along a
 * row. For each block of partitions p0 .. p0 + lanes: begin(p0, lanes), then for chunks of up to
 * kChunkLen (a multiple of kLanes) elements of each row (dims 1..3 as in iterate, dim 4 in chunks, in order)
 * values(p, i1, i2, i3, j0, len, out) for each partition of the block, which computes elements
 * [j0, j0 + len) of p's row into out[0..len) and writes whatever the instruction writes for them;
 * then, kLanes elements at a time, block(cols, len) with those elements of every lane transposed
 * (element j of every lane in cols[j], j < len; lanes past the last partition hold zeros); finally
 * end(p0, lanes).
 */
template <int64_t kChunkLen = kRowChunk, Transpose kWhere = Transpose::in_memory, class Begin, class Values,
          class Block, class End>
NK_INLINE void for_row_blocks(const OpDesc* d, Begin&& begin, Values&& values, Block&& block, End&& end) {
  static_assert(kChunkLen % kLanes == 0);
  const int64_t P = d->count[0], n = d->count[4];
  const int64_t outer[3] = {d->count[1], d->count[2], d->count[3]};
  // Zeroed once per call, not per block: the rows of a partial last block that values() does not
  // fill keep zeros or an earlier block's values, which block() folds in lanes nobody reads.
  float rows[kLanes][kChunkLen] = {};
  for (int64_t p0 = 0; p0 < P; p0 += kLanes) {
    const int64_t lanes = P - p0 < kLanes ? P - p0 : kLanes;
    begin(p0, lanes);
    for (int64_t i1 = 0; i1 < outer[0]; ++i1)
      for (int64_t i2 = 0; i2 < outer[1]; ++i2)
        for (int64_t i3 = 0; i3 < outer[2]; ++i3)
          for (int64_t j0 = 0; j0 < n; j0 += kChunkLen) {
            const int64_t len = n - j0 < kChunkLen ? n - j0 : kChunkLen;
            for (int64_t l = 0; l < lanes; ++l) {
              if (len == kChunkLen) values(p0 + l, i1, i2, i3, j0, kChunkLen, rows[l]);  // a constant trip count
              else values(p0 + l, i1, i2, i3, j0, len, rows[l]);
            }
            for (int64_t s = 0; s < len; s += kLanes) {
              lanes_v cols[kLanes];
              transpose_block<kWhere>(&rows[0][s], kChunkLen, cols);
              if (len - s >= kLanes) block(cols, kLanes);  // a constant trip count
              else block(cols, len - s);
            }
          }
    end(p0, lanes);
  }
}

/**
 * The fold of every partition's row of fp32 values, kLanes partitions at a time (for_row_blocks):
 * start(p) for each partition of a block, values as for for_row_blocks, then done(p, acc) with the
 * row's fold (acc = fold(acc, v) from `init` when `seeded`, else from the first element).
 */
template <Transpose kWhere = Transpose::in_memory, class Fold, class Start, class Values, class Done>
NK_INLINE void fold_rows(const OpDesc* d, Fold&& fold, bool seeded0, float init, Start&& start, Values&& values,
                         Done&& done) {
  float acc[kLanes];
  bool seeded = seeded0;
  for_row_blocks<kRowChunk, kWhere>(
      d,
      [&](int64_t p0, int64_t lanes) {
        for (int64_t l = 0; l < lanes; ++l) start(p0 + l);
        for (int l = 0; l < kLanes; ++l) acc[l] = init;
        seeded = seeded0;
      },
      values, [&](const lanes_v (&cols)[kLanes], int64_t len) { fold_block(fold, acc, seeded, cols, len); },
      [&](int64_t p0, int64_t lanes) {
        for (int64_t l = 0; l < lanes; ++l) done(p0 + l, acc[l]);
      });
}

/** Whether alu_apply(op, r, v) is NaN for every v once r is NaN: a left fold with such an operator
 * can leave the NaN canonicalization to its end (fold_step, fold_result). */
NK_INLINE bool nan_persists(AluOp op) {
  switch (op) {
    case AluOp::bypass:
    case AluOp::add:
    case AluOp::subtract:
    case AluOp::multiply:
    case AluOp::divide:
    case AluOp::maximum:
    case AluOp::minimum:
    case AluOp::abs_max:
    case AluOp::abs_min:
    case AluOp::mod:
    case AluOp::fmod:
    case AluOp::average: return true;
    default: return false;  // power (NaN^0 = 1), comparisons, logical operators
  }
}

/**
 * One step r = alu_apply(op, r, v) of a left fold whose result goes through fold_result. With an
 * operator under which a NaN persists, canonicalizing once at the end gives the bits of
 * canonicalizing every step, and keeps the NaN test off the fold's chain of dependent operations.
 */
NK_INLINE float fold_step(AluOp op, float r, float v) {
  return nan_persists(op) ? alu_apply_raw(op, r, v) : alu_apply(op, r, v);
}
/** The result of a fold of at least two elements made with fold_step. */
NK_INLINE float fold_result(float r) { return r != r ? __builtin_nanf("") : r; }

/** Runs f(j) for j in [0, len), the iterations declared independent when kParallel. */
template <bool kParallel, class F>
NK_INLINE void for_chunk(int64_t len, F&& f) {
  if constexpr (kParallel) {
#pragma clang loop vectorize(assume_safety)
    for (int64_t j = 0; j < len; ++j) f(j);
  } else {
    for (int64_t j = 0; j < len; ++j) f(j);
  }
}

}  // namespace

// --- copies (dma_copy, tensor_copy) ------------------------------------------------------------

NK_ENTRY void nk_copy(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  // Unordered when src and dst share no byte out of step: a converting copy then vectorizes too.
  dispatch_parallel(independent(d, a, 0, 0b10), [&](auto par) {
    for (int64_t i0 = 0; i0 < d->count[0]; ++i0)
      for_row<decltype(par)::value>(d, i0, [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
        uint8_t* dst = address(d, a, 0, p, i1, i2, i3, i4);
        const uint8_t* src = address(d, a, 1, p, i1, i2, i3, i4);
        copy_element(d, dst, src);
      });
  });
}

// --- element-wise ------------------------------------------------------------------------------

NK_ENTRY void nk_tensor_tensor(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op = static_cast<AluOp>(d->op0);
  auto element = [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    const uint8_t* x = address(d, a, 1, i0, i1, i2, i3, i4);
    const uint8_t* y = address(d, a, 2, i0, i1, i2, i3, i4);
    if (is_bitvec_op(op)) store_int(d, 0, dst, alu_apply_bits(op, load_int(d, 1, x), load_int(d, 2, y), d->bits));
    else if (d->flags & kFlagGpsimdInt) store_int(d, 0, dst, alu_apply_int(op, load_int(d, 1, x), load_int(d, 2, y)));
    else store(d, 0, dst, alu_apply(op, load(d, 1, x), load(d, 2, y)));
  };
  dispatch_parallel(independent(d, a, 0, 0b110), [&](auto parallel) {
    for (int64_t p = 0; p < d->count[0]; ++p) for_row<decltype(parallel)::value>(d, p, element);
  });
}

NK_ENTRY void nk_tensor_scalar(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op0 = static_cast<AluOp>(d->op0), op1 = static_cast<AluOp>(d->op1);
  const bool r0 = d->flags & kFlagReverse0, r1 = d->flags & kFlagReverse1;
  const bool two = d->slot_kind[3] != kSlotNone;
  if (is_bitvec_op(op0)) {
    // The reference reads the integer operands at every element (a dst overlapping one changes it).
    iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
      auto s_int = [&](int slot) {
        return d->slot_kind[slot] == kSlotImm ? static_cast<int64_t>(a->imm[slot])
                                              : load_int(d, slot, address(d, a, slot, i0, i1, i2, i3, i4));
      };
      int64_t r = apply_bits(op0, r0, load_int(d, 1, address(d, a, 1, i0, i1, i2, i3, i4)), s_int(2), d->bits);
      if (two) r = apply_bits(op1, r1, r, s_int(3), d->bits);
      store_int(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), r);
    });
    return;
  }
  dispatch_parallel(independent(d, a, 0, 0b10), [&](auto parallel) {
    for (int64_t p = 0; p < d->count[0]; ++p) {
      // the reference reads a partition's fp32 operands once, before its elements
      const float s0 = operand_value(d, a, 2, p, 0, 0, 0, 0);
      const float s1 = two ? operand_value(d, a, 3, p, 0, 0, 0, 0) : 0.0f;
      for_row<decltype(parallel)::value>(d, p, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
        float r = apply(op0, r0, load(d, 1, address(d, a, 1, i0, i1, i2, i3, i4)), s0);
        if (two) r = apply(op1, r1, r, s1);
        store(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), r);
      });
    }
  });
}

NK_ENTRY void nk_scalar_tensor_tensor(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op0 = static_cast<AluOp>(d->op0), op1 = static_cast<AluOp>(d->op1);
  const bool r0 = d->flags & kFlagReverse0, r1 = d->flags & kFlagReverse1;
  dispatch_parallel(independent(d, a, 0, 0b1010), [&](auto parallel) {
    for (int64_t p = 0; p < d->count[0]; ++p) {
      const float s0 = operand_value(d, a, 2, p, 0, 0, 0, 0);  // once per partition, as the reference
      for_row<decltype(parallel)::value>(d, p, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
        float r = apply(op0, r0, load(d, 1, address(d, a, 1, i0, i1, i2, i3, i4)), s0);
        const float y = load(d, 3, address(d, a, 3, i0, i1, i2, i3, i4));
        r = r1 ? alu_apply(op1, y, r) : alu_apply(op1, r, y);
        store(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), r);
      });
    }
  });
}

NK_ENTRY void nk_reciprocal(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  dispatch_parallel(independent(d, a, 0, 0b10), [&](auto parallel) {
    for (int64_t p = 0; p < d->count[0]; ++p)
      for_row<decltype(parallel)::value>(d, p, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
        store(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), 1.0f / load(d, 1, address(d, a, 1, i0, i1, i2, i3, i4)));
      });
  });
}

NK_ENTRY void nk_memset(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const DType t = dtype_of(d, 0);
  const int64_t size = dtype_size(t);
  uint8_t pattern[4];
  // integer fill values saturate to the dtype's range (the verifier rejects out-of-range ones)
  if (is_float(t)) numerics::store_float(t, pattern, static_cast<float>(a->imm[1]));
  else numerics::store_saturated(t, pattern, static_cast<int64_t>(a->imm[1]));
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    std::memcpy(address(d, a, 0, i0, i1, i2, i3, i4), pattern, size);
  });
}

// --- activation (Scalar engine) ----------------------------------------------------------------

/**
 * activation: y = f(fma(x, scale, bias)) per element, scale and bias read once per partition.
 * With reduce, the accumulator update takes the left-to-right fp32 sum of the partition's y
 * (before rounding to dst), computed kLanes partitions at a time when rows are long enough.
 */
NK_ENTRY void nk_activation(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const ActFunc func = static_cast<ActFunc>(d->func);
  const ReduceCmd cmd = static_cast<ReduceCmd>(d->reduce_cmd);
  const bool reducing = cmd == ReduceCmd::reduce || cmd == ReduceCmd::reset_reduce;
  auto bias_of = [&](int64_t p) {
    return d->slot_kind[2] == kSlotTensor ? load(d, 2, address(d, a, 2, p, 0, 0, 0, 0)) : 0.0f;
  };
  auto scale_of = [&](int64_t p) { return operand_value(d, a, 3, p, 0, 0, 0, 0); };
  auto finish = [&](int64_t p, float sum) {
    apply_reduce_cmd(cmd, AluOp::add, 0.0f, a->scalar_acc[p], sum, reducing);
    if (d->slot_kind[4] == kSlotTensor) store(d, 4, address(d, a, 4, p, 0, 0, 0, 0), a->scalar_acc[p]);
  };
  const bool parallel = independent(d, a, 0, 0b10);
  if (reducing && d->count[4] >= kFoldRowMin) {
    float bias[kMaxPartitions], scale[kMaxPartitions];
    dispatch_parallel(parallel, [&](auto par) {
      fold_rows(
          d, [](float acc, float y) { return acc + y; }, false, 0.0f,
          [&](int64_t p) { bias[p] = bias_of(p), scale[p] = scale_of(p); },
          [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, float* out) {
            const float b = bias[p], s = scale[p];
            for_chunk<decltype(par)::value>(len, [&](int64_t j) {
              const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
              const float y = activation_apply(func, __builtin_fmaf(x, s, b));
              store(d, 0, address(d, a, 0, p, i1, i2, i3, j0 + j), y);
              out[j] = y;
            });
          },
          finish);
    });
    return;
  }
  dispatch_parallel(parallel && !reducing, [&](auto par) {
    for (int64_t p = 0; p < d->count[0]; ++p) {
      const float bias = bias_of(p), scale = scale_of(p);
      float sum = 0.0f;
      bool first = true;
      for_row<decltype(par)::value>(d, p, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
        const float x = load(d, 1, address(d, a, 1, i0, i1, i2, i3, i4));
        const float y = activation_apply(func, __builtin_fmaf(x, scale, bias));
        store(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), y);
        if (reducing) {
          sum = first ? y : sum + y;
          first = false;
        }
      });
      finish(p, sum);
    }
  });
}

// --- reductions --------------------------------------------------------------------------------

/** tensor_reduce with a bitvec operator: the integer bits fold left to right, the first element
 * seeding the fold. Partitions are independent, so the partition loop is innermost: the fold
 * order per partition stays sequential while the loop vectorizes across partitions. */
NK_INLINE void tensor_reduce_bits(const OpDesc* d, const OpArgs* a, AluOp op) {
  const int64_t P = d->count[0];
  int64_t acc[kMaxPartitions];
  // Kept dims are 1..reduce_from-1, reduced dims reduce_from..4; dst strides on reduced dims are 0.
  for (int64_t i1 = 0; i1 < (d->reduce_from > 1 ? d->count[1] : 1); ++i1)
    for (int64_t i2 = 0; i2 < (d->reduce_from > 2 ? d->count[2] : 1); ++i2)
      for (int64_t i3 = 0; i3 < (d->reduce_from > 3 ? d->count[3] : 1); ++i3) {
        bool first = true;
        for (int64_t j1 = 0; j1 < (d->reduce_from <= 1 ? d->count[1] : 1); ++j1)
          for (int64_t j2 = 0; j2 < (d->reduce_from <= 2 ? d->count[2] : 1); ++j2)
            for (int64_t j3 = 0; j3 < (d->reduce_from <= 3 ? d->count[3] : 1); ++j3)
              for (int64_t j4 = 0; j4 < d->count[4]; ++j4) {
                const int64_t k1 = d->reduce_from > 1 ? i1 : j1, k2 = d->reduce_from > 2 ? i2 : j2,
                              k3 = d->reduce_from > 3 ? i3 : j3;
                for (int64_t p = 0; p < P; ++p) {
                  const int64_t v = load_int(d, 1, address(d, a, 1, p, k1, k2, k3, j4));
                  acc[p] = first ? v : alu_apply_bits(op, acc[p], v, d->bits);
                }
                first = false;
              }
        for (int64_t p = 0; p < P; ++p) store_int(d, 0, address(d, a, 0, p, i1, i2, i3, 0), acc[p]);
      }
}

/** Iteration indices (k[1..4]) of element `flat` of a tensor_reduce run: the reduced dims
 * reduce_from..4 flattened, innermost last; the kept dims' indices are left as they are. */
NK_INLINE void run_position(const OpDesc* d, int64_t flat, int64_t (&k)[kIterDims]) {
  for (int dim = kIterDims - 1; dim >= d->reduce_from; --dim) {
    k[dim] = flat % d->count[dim];
    flat /= d->count[dim];
  }
}

/** Rows at most this long, in a 2-D view, are reduced kLanes partitions at a time
 * (tensor_reduce_rows); longer ones one row at a time. Measured per [128, n] fp32 instruction,
 * blocks vs rows: max 0.5 vs 0.8-1.1 us at n = 16, 2.4 vs 3.3-4.2 at 64, 4.3-4.5 vs 4.1-4.7 at 128;
 * add 1.8-2.6 vs 2.7 at 64 but 4.7 vs 3.9 at 128 (the blocks fold one dependent vector operation
 * per column, while reduction::fold keeps many independent lanes per row). */
inline constexpr int64_t kReduceRowMax = 64;

/**
 * tensor_reduce of short rows (a 2-D view: only dim 4 reduced, kFoldRowMin..kReduceRowMax
 * elements), kLanes partitions at a time through transposed blocks: on such rows the per-row work
 * of reduction::fold (a call, combining its lanes) costs more than the elements. The folds are
 * reduction::fold's step for step: add's single block_sum (accumulator c % 8 takes column c
 * below the last whole step of 8, the accumulators' tree, the remaining columns in order, a NaN
 * canonicalized at the end), and the left-to-right alu_apply fold for every other operator (which
 * the any-order max and min reproduce exactly).
 */
NK_INLINE void tensor_reduce_rows(const OpDesc* d, const OpArgs* a, AluOp op, bool negate) {
  auto values = [&](int64_t p, int64_t, int64_t, int64_t, int64_t j0, int64_t len, float* out) {
    for (int64_t j = 0; j < len; ++j) out[j] = load(d, 1, address(d, a, 1, p, 0, 0, 0, j0 + j));
  };
  auto done = [&](int64_t p, float r) { store(d, 0, address(d, a, 0, p, 0, 0, 0, 0), negate ? -r : r); };
  if (op != AluOp::add) {
    fold_rows<Transpose::in_registers>(
        d, [op](float acc, float v) { return fold_step(op, acc, v); }, false, 0.0f, [](int64_t) {}, values,
        [&](int64_t p, float r) { done(p, fold_result(r)); });
    return;
  }
  constexpr int64_t kAcc = reduction::kSumLanes;
  const int64_t whole = d->count[4] - d->count[4] % kAcc;  // columns the accumulators take
  lanes_v acc[kAcc], sum;
  int64_t c = 0;  // the next column of the block's rows
  for_row_blocks<kRowChunk, Transpose::in_registers>(
      d, [&](int64_t, int64_t) { c = 0; }, values,
      [&](const lanes_v (&cols)[kLanes], int64_t len) {
        for (int64_t j = 0; j < len; ++j, ++c) {
          if (c < kAcc) {
            acc[c] = cols[j];
          } else if (c < whole) {
            acc[c % kAcc] += cols[j];
          } else {
            if (c == whole) sum = reduction::combine_accumulators(acc);
            sum += cols[j];
          }
        }
      },
      [&](int64_t p0, int64_t lanes) {
        if (c == whole) sum = reduction::combine_accumulators(acc);  // no columns past the last whole step
        for (int64_t l = 0; l < lanes; ++l) done(p0 + l, fold_result(sum[l]));
      });
}

/**
 * tensor_reduce: each output element folds its run (the reduced dims reduce_from..4 flattened,
 * innermost last) in nikki's reduction order, nikki/reduction_order.hpp; the reference interpreter
 * calls the same reduction::fold, so only the way elements are fetched differs. Fast path: when
 * the reduced dims of an aligned fp32 source are one contiguous stretch, the fold reads the row in
 * place; otherwise fetched elements are converted into a block buffer, a segment of the innermost
 * dim at a time (a plain strided loop, which vectorizes for contiguous bf16 and fp32), or element
 * by element for an irregular source.
 */
NK_ENTRY void nk_tensor_reduce(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op = static_cast<AluOp>(d->op0);
  if (is_bitvec_op(op)) return tensor_reduce_bits(d, a, op);
  const bool negate = d->flags & kFlagNegate;
  if (d->reduce_from <= 4 && d->count[1] * d->count[2] * d->count[3] == 1 && d->count[4] >= kFoldRowMin &&
      d->count[4] <= kReduceRowMax && d->count[0] >= kLanes / 2)
    return tensor_reduce_rows(d, a, op, negate);
  const int from = d->reduce_from;
  const int64_t* stride = d->view[1].stride;
  const int64_t size = dtype_size(dtype_of(d, 1));
  const bool regular = !(d->irregular & (1 << 1));
  int64_t run = 1;
  bool in_place = regular && dtype_of(d, 1) == DType::float32;
  for (int dim = kIterDims - 1; dim >= from; --dim) {
    // contiguous: each reduced dim steps over exactly the dims inside it
    in_place = in_place && (d->count[dim] == 1 || stride[dim] == run * size);
    run *= d->count[dim];
  }
  for (int64_t i1 = 0; i1 < (from > 1 ? d->count[1] : 1); ++i1)
    for (int64_t i2 = 0; i2 < (from > 2 ? d->count[2] : 1); ++i2)
      for (int64_t i3 = 0; i3 < (from > 3 ? d->count[3] : 1); ++i3)
        for (int64_t p = 0; p < d->count[0]; ++p) {
          // the run's first element (reduced indices 0; dst strides on reduced dims are 0)
          const uint8_t* row = address(d, a, 1, p, i1, i2, i3, 0);
          // read in place only at fp32 alignment (any other address is copied through load())
          const bool aligned = (reinterpret_cast<uintptr_t>(row) & (alignof(float) - 1)) == 0;
          const float r = reduction::fold(op, run, [&](int64_t lo, int64_t len, float* buf) -> const float* {
            if (in_place && aligned) return reinterpret_cast<const float*>(row) + lo;
            int64_t k[kIterDims] = {p, i1, i2, i3, 0};
            if (!regular) {
              for (int64_t i = 0; i < len; ++i) {
                run_position(d, lo + i, k);
                buf[i] = load(d, 1, address(d, a, 1, k[0], k[1], k[2], k[3], k[4]));
              }
              return buf;
            }
            for (int64_t got = 0; got < len;) {
              run_position(d, lo + got, k);
              const int64_t seg = len - got < d->count[4] - k[4] ? len - got : d->count[4] - k[4];
              const uint8_t* src = address(d, a, 1, k[0], k[1], k[2], k[3], k[4]);
              for (int64_t i = 0; i < seg; ++i) buf[got + i] = load(d, 1, src + i * stride[4]);
              got += seg;
            }
            return buf;
          });
          store(d, 0, address(d, a, 0, p, i1, i2, i3, 0), negate ? -r : r);
        }
}

/**
 * tensor_scalar_reduce: dst = op0(data, operand0), and reduce_op folds each partition's fp32
 * results (before rounding to dst) left to right into the Vector engine accumulator and
 * reduce_res.
 */
NK_ENTRY void nk_tensor_scalar_reduce(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op = static_cast<AluOp>(d->op0), rop = static_cast<AluOp>(d->reduce_op);
  const int64_t P = d->count[0];
  float s0[kMaxPartitions], acc[kMaxPartitions];
  auto finish = [&](int64_t p, float r) {
    a->vector_acc[p] = r;
    if (d->slot_kind[3] == kSlotTensor) store(d, 3, address(d, a, 3, p, 0, 0, 0, 0), r);
  };
  if (d->count[4] >= kFoldRowMin) {
    dispatch_parallel(independent(d, a, 0, 0b10), [&](auto par) {
      fold_rows<Transpose::in_registers>(
          d, [rop](float r, float v) { return fold_step(rop, r, v); }, false, 0.0f,
          [&](int64_t p) { s0[p] = operand_value(d, a, 2, p, 0, 0, 0, 0); },
          [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, float* out) {
            for_chunk<decltype(par)::value>(len, [&](int64_t j) {
              const float v = alu_apply(op, load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j)), s0[p]);
              store(d, 0, address(d, a, 0, p, i1, i2, i3, j0 + j), v);
              out[j] = v;
            });
          },
          [&](int64_t p, float r) { finish(p, fold_result(r)); });
    });
    return;
  }
  for (int64_t p = 0; p < P; ++p) s0[p] = operand_value(d, a, 2, p, 0, 0, 0, 0);
  iterate_chunks(d, [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, bool start) {
    float v[kChunk];
    for (int64_t j = 0; j < len; ++j) {
      v[j] = alu_apply(op, load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j)), s0[p]);
      store(d, 0, address(d, a, 0, p, i1, i2, i3, j0 + j), v[j]);
    }
    float r = start ? v[0] : alu_apply(rop, acc[p], v[0]);
    for (int64_t j = 1; j < len; ++j) r = alu_apply(rop, r, v[j]);
    acc[p] = r;
  });
  for (int64_t p = 0; p < P; ++p) finish(p, acc[p]);
}

/** tensor_tensor_scan: res = op1(op0(data0, res), data1) along the flattened free dims, from the
 * initial value; the running value stays fp32 (each dst write rounds a copy of it). */
NK_ENTRY void nk_scan(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op0 = static_cast<AluOp>(d->op0), op1 = static_cast<AluOp>(d->op1);
  const bool r0 = d->flags & kFlagReverse0, r1 = d->flags & kFlagReverse1;
  const int64_t P = d->count[0];
  float prev[kMaxPartitions];
  for (int64_t p = 0; p < P; ++p) prev[p] = operand_value(d, a, 3, p, 0, 0, 0, 0);
  iterate_chunks(d, [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, bool) {
    float r = prev[p];
    for (int64_t j = 0; j < len; ++j) {
      const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
      const float y = load(d, 2, address(d, a, 2, p, i1, i2, i3, j0 + j));
      const float t = r0 ? alu_apply(op0, r, x) : alu_apply(op0, x, r);
      r = r1 ? alu_apply(op1, y, t) : alu_apply(op1, t, y);
      store(d, 0, address(d, a, 0, p, i1, i2, i3, j0 + j), r);
    }
    prev[p] = r;
  });
}

// --- predication and selection -----------------------------------------------------------------

namespace {
/** tensor_copy_predicated on T-sized elements that copy bit for bit: every element is rewritten,
 * unselected ones with the bits they had, so the loop vectorizes as a blend. */
template <class T>
NK_INLINE void copy_predicated_bits(const OpDesc* d, const OpArgs* a, const uint8_t* pattern) {
  const bool reverse = d->flags & kFlagReversePred;
  T fill;
  if (pattern) std::memcpy(&fill, pattern, sizeof(T));
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    const bool take = (load_int(d, 2, address(d, a, 2, i0, i1, i2, i3, i4)) != 0) != reverse;
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    T old, v;
    std::memcpy(&old, dst, sizeof(T));
    if (pattern) v = fill;
    else std::memcpy(&v, address(d, a, 1, i0, i1, i2, i3, i4), sizeof(T));
    const T out = take ? v : old;
    std::memcpy(dst, &out, sizeof(T));
  });
}
}  // namespace

/** tensor_copy_predicated: dst = src (a tile, or an immediate rounded to dst) where the predicate
 * is nonzero (zero with reverse_pred); other elements keep their bits. */
NK_ENTRY void nk_copy_predicated(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const bool reverse = d->flags & kFlagReversePred;
  const bool scalar_src = d->slot_kind[1] == kSlotImm;
  const int64_t size = dtype_size(dtype_of(d, 0));
  if (scalar_src || d->view[0].dtype == d->view[1].dtype) {
    uint8_t pattern[4];
    if (scalar_src) store(d, 0, pattern, static_cast<float>(a->imm[1]));
    const uint8_t* p = scalar_src ? pattern : nullptr;
    if (size == 1) return copy_predicated_bits<uint8_t>(d, a, p);
    if (size == 2) return copy_predicated_bits<uint16_t>(d, a, p);
    if (size == 4) return copy_predicated_bits<uint32_t>(d, a, p);
  }
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    const bool take = (load_int(d, 2, address(d, a, 2, i0, i1, i2, i3, i4)) != 0) != reverse;
    if (!take) return;
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    if (scalar_src) store(d, 0, dst, static_cast<float>(a->imm[1]));
    else copy_element(d, dst, address(d, a, 1, i0, i1, i2, i3, i4));
  });
}

/** select_reduce: dst = predicate ? on_true : on_false, and the maximum of each partition's fp32
 * selections updates the Vector engine accumulator per reduce_cmd (then reduce_res). */
NK_ENTRY void nk_select_reduce(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const bool reverse = d->flags & kFlagReversePred;
  const ReduceCmd cmd = static_cast<ReduceCmd>(d->reduce_cmd);
  const bool reducing = cmd == ReduceCmd::reduce || cmd == ReduceCmd::reset_reduce;
  const int64_t P = d->count[0];
  constexpr float kNegInf = -__builtin_inff();
  float on_false[kMaxPartitions], best[kMaxPartitions];
  auto finish = [&](int64_t p, float m) {
    apply_reduce_cmd(cmd, AluOp::maximum, kNegInf, a->vector_acc[p], m, reducing);
    if (d->slot_kind[4] == kSlotTensor) store(d, 4, address(d, a, 4, p, 0, 0, 0, 0), a->vector_acc[p]);
  };
  // the selection of one element (the on_true value is read either way: the loop vectorizes)
  auto select = [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    const bool take = (load_int(d, 1, address(d, a, 1, p, i1, i2, i3, i4)) != 0) != reverse;
    const float t = load(d, 2, address(d, a, 2, p, i1, i2, i3, i4));
    const float v = take ? t : on_false[p];
    store(d, 0, address(d, a, 0, p, i1, i2, i3, i4), v);
    return v;
  };
  if (d->count[4] >= kFoldRowMin) {
    dispatch_parallel(independent(d, a, 0, 0b110), [&](auto par) {
      fold_rows<Transpose::in_registers>(
          d, [](float m, float v) { return fold_step(AluOp::maximum, m, v); }, true, kNegInf,
          [&](int64_t p) { on_false[p] = operand_value(d, a, 3, p, 0, 0, 0, 0); },
          [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, float* out) {
            for_chunk<decltype(par)::value>(len, [&](int64_t j) { out[j] = select(p, i1, i2, i3, j0 + j); });
          },
          [&](int64_t p, float m) { finish(p, fold_result(m)); });
    });
    return;
  }
  for (int64_t p = 0; p < P; ++p) {
    on_false[p] = operand_value(d, a, 3, p, 0, 0, 0, 0);
    best[p] = kNegInf;
  }
  iterate_chunks(d, [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, bool) {
    float v[kChunk];
    for (int64_t j = 0; j < len; ++j) v[j] = select(p, i1, i2, i3, j0 + j);
    float m = best[p];
    for (int64_t j = 0; j < len; ++j) m = alu_apply(AluOp::maximum, m, v[j]);
    best[p] = m;
  });
  for (int64_t p = 0; p < P; ++p) finish(p, best[p]);
}

// --- index generation ------------------------------------------------------------------------

/**
 * iota / affine_select: the affine value offset + channel_multiplier * partition + sum(step *
 * pattern index) — the pattern pseudo-operand in the last slot — wrapped to int32 (the 64-bit sum
 * is exact, as in the reference). iota writes it (saturating to integer dtypes); affine_select
 * copies on_true where cmp_op(value, 0) holds and writes on_false elsewhere.
 */
NK_INLINE void affine(const OpDesc* d, const OpArgs* a, bool iota) {
  const AluOp cmp = static_cast<AluOp>(d->cmp_op);
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    const int64_t v = static_cast<int32_t>(static_cast<uint32_t>(d->offset + offset_of(d, kSlots - 1, i0, i1, i2, i3, i4)));
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    if (iota) numerics::store_saturated(dtype_of(d, 0), dst, v);
    else if (alu_apply_int(cmp, v, 0)) copy_element(d, dst, address(d, a, 1, i0, i1, i2, i3, i4));
    else store(d, 0, dst, static_cast<float>(a->imm[2]));
  });
}

NK_ENTRY void nk_iota(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  affine(d, a, true);
}
NK_ENTRY void nk_affine_select(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  affine(d, a, false);
}

// --- statistics --------------------------------------------------------------------------------

/**
 * bn_stats: Welford's running (count, mean, M2) over the even and the odd elements of each
 * partition's flattened free dims, written as 6 values. The counts are the same for every
 * partition (exact small integers), so they are kept once.
 */
NK_ENTRY void nk_bn_stats(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  // kLanes partitions at a time, rows of any length: each element's update (a division on the
  // chain through the mean) is one vector operation for all of them, instead of one latency-bound
  // chain each. Chunks of kLanes elements: the loads of the next chunk then overlap the divisions'
  // latency (longer chunks were 20% slower on [128, 512]).
  lanes_v mean[2], m2[2];
  float count[2];
  int64_t f;  // flattened index of the next chunk's first element: its parity picks the lane
  for_row_blocks<kLanes>(
      d,
      [&](int64_t, int64_t) {
        mean[0] = mean[1] = m2[0] = m2[1] = lanes_v(0.0f);
        count[0] = count[1] = 0.0f;
        f = 0;
      },
      [&](int64_t p, int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len, float* out) {
        for (int64_t j = 0; j < len; ++j) out[j] = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
      },
      [&](const lanes_v (&x)[kLanes], int64_t len) {
        for (int64_t j = 0; j < len; ++j) {
          const int lane = int((f + j) & 1);
          count[lane] += 1.0f;
          const lanes_v delta = x[j] - mean[lane];
          mean[lane] += delta / count[lane];
          m2[lane] += delta * (x[j] - mean[lane]);
        }
        f += len;
      },
      [&](int64_t p0, int64_t lanes) {
        for (int64_t l = 0; l < lanes; ++l) {
          const float out[6] = {count[0], mean[0][l], m2[0][l], count[1], mean[1][l], m2[1][l]};
          iterate_out(d, [&](int64_t k, int64_t o1, int64_t o2, int64_t o3, int64_t o4) {
            if (k < 6) store(d, 0, address(d, a, 0, p0 + l, o1, o2, o3, o4), canonical_nan(out[k]));
          });
        }
      });
}

/** bn_aggr: Chan et al.'s merge of the (count, mean, M2) triples of each partition in order, then
 * (mean, M2 / count) — NaN variance for an empty total. */
NK_ENTRY void nk_bn_aggr(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const int64_t P = d->count[0];
  float n[kMaxPartitions], mean[kMaxPartitions], m2[kMaxPartitions], nb[kMaxPartitions], mb[kMaxPartitions];
  for (int64_t p = 0; p < P; ++p) n[p] = mean[p] = m2[p] = 0.0f;
  int64_t f = 0;
  iterate_free(d->count, [&](int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    const int64_t phase = f % 3;
    for (int64_t p = 0; p < P; ++p) {
      const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, i4));
      if (phase == 0) {
        nb[p] = x;
      } else if (phase == 1) {
        mb[p] = x;
      } else if (nb[p] != 0) {
        const float m2b = x;
        const float total = n[p] + nb[p];
        const float delta = mb[p] - mean[p];
        mean[p] += delta * (nb[p] / total);
        m2[p] += m2b + delta * delta * (n[p] * nb[p] / total);
        n[p] = total;
      }
    }
    ++f;
  });
  for (int64_t p = 0; p < P; ++p) {
    const float out[2] = {canonical_nan(mean[p]), n[p] > 0 ? canonical_nan(m2[p] / n[p]) : __builtin_nanf("")};
    iterate_out(d, [&](int64_t k, int64_t o1, int64_t o2, int64_t o3, int64_t o4) {
      if (k < 2) store(d, 0, address(d, a, 0, p, o1, o2, o3, o4), out[k]);
    });
  }
}

// --- top-8 -----------------------------------------------------------------------------------

namespace {
/** max8's order: a outranks b when it is larger; a NaN outranks nothing and every number outranks
 * a NaN; equal values (and +-0) keep their order of appearance. */
NK_INLINE bool outranks(float a, float b) { return !__builtin_isnan(a) && (__builtin_isnan(b) || a > b); }
}  // namespace

/**
 * max8: the first 8 elements of each partition's values stably sorted in descending order (what
 * the reference's stable_sort gives), by insertion into a sorted top-8 that a later element
 * enters only when it strictly outranks an entry. Once 8 values are held, a chunk whose elements
 * all fail to outrank the 8th (a vectorized test) cannot change them and is skipped.
 */
NK_ENTRY void nk_max8(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  for (int64_t p = 0; p < d->count[0]; ++p) {
    float top[8] = {};
    int filled = 0;  // elements seen, up to 8: entries [0, filled) hold values
    iterate_row_chunks(d, [&](int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len) {
      if (filled == 8) {
        const float last = top[7];
        const bool last_nan = __builtin_isnan(last);
        int hits = 0;  // elements outranking the 8th (written without branches, so it vectorizes)
        for (int64_t j = 0; j < len; ++j) {
          const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
          hits += int(!__builtin_isnan(x) & (last_nan | (x > last)));
        }
        if (hits == 0) return true;
      }
      for (int64_t j = 0; j < len; ++j) {
        const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
        if (filled == 8 && !outranks(x, top[7])) continue;  // enters nowhere
        bool enter[8];
        for (int k = 0; k < 8; ++k) enter[k] = k >= filled || outranks(x, top[k]);
        for (int k = 7; k > 0; --k)
          if (enter[k]) top[k] = enter[k - 1] ? top[k - 1] : x;
        if (enter[0]) top[0] = x;
        filled = filled < 8 ? filled + 1 : 8;
      }
      return true;
    });
    iterate_out(d, [&](int64_t k, int64_t o1, int64_t o2, int64_t o3, int64_t o4) {
      if (k < 8) store(d, 0, address(d, a, 0, p, o1, o2, o3, o4), top[k]);
    });
  }
}

/**
 * nc_find_index8: for each of the 8 values in order, the index of its first occurrence in the
 * partition's flattened data not already taken by an earlier value (0xFFFFFFFF when none). One
 * pass over the data gives each element to the first value still looking for it: equal values
 * (a class under ==, NaN matching nothing) then take successive occurrences, as in the
 * reference's search per value. Chunks without any match (a vectorized test) are skipped, and
 * the pass ends once every value is found.
 */
NK_ENTRY void nk_find_index8(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  for (int64_t p = 0; p < d->count[0]; ++p) {
    float active[8];  // the values still looking (NaN once found: it matches nothing)
    uint32_t found[8];
    int remaining = 0;
    iterate_out(d, [&](int64_t k, int64_t o1, int64_t o2, int64_t o3, int64_t o4) {
      if (k >= 8) return;
      active[k] = load(d, 2, address(d, a, 2, p, o1, o2, o3, o4));
      found[k] = kNone;
      remaining += !__builtin_isnan(active[k]);
    });
    uint32_t f0 = 0;
    iterate_row_chunks(d, [&](int64_t i1, int64_t i2, int64_t i3, int64_t j0, int64_t len) {
      if (remaining == 0) return false;
      int hits = 0;  // elements equal to a value still looking (without branches: it vectorizes)
      for (int64_t j = 0; j < len; ++j) {
        const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
        hits += int((x == active[0]) | (x == active[1]) | (x == active[2]) | (x == active[3]) | (x == active[4]) |
                    (x == active[5]) | (x == active[6]) | (x == active[7]));
      }
      if (hits) {
        for (int64_t j = 0; j < len; ++j) {
          const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, j0 + j));
          for (int k = 0; k < 8; ++k)
            if (x == active[k]) {
              found[k] = f0 + uint32_t(j);
              active[k] = __builtin_nanf("");
              --remaining;
              break;
            }
        }
      }
      f0 += uint32_t(len);
      return true;
    });
    iterate_out(d, [&](int64_t k, int64_t o1, int64_t o2, int64_t o3, int64_t o4) {
      if (k < 8) numerics::store_saturated(dtype_of(d, 0), address(d, a, 0, p, o1, o2, o3, o4), int64_t(found[k]));
    });
  }
}

// --- across partitions (GpSimd) ----------------------------------------------------------------

/**
 * tensor_partition_reduce: dst[0, f] = data[0, f] op data[1, f] op ... in partition order (average
 * sums, then divides by the partition count). The innermost free dim is processed in blocks so
 * the fold over partitions vectorizes along the free dim.
 */
NK_ENTRY void nk_partition_reduce(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const AluOp op = static_cast<AluOp>(d->op0);
  const bool bitvec = is_bitvec_op(op);
  const AluOp fold_op = op == AluOp::average ? AluOp::add : op;
  const int64_t P = d->count[0], n = d->count[4];
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  int64_t acc_bits[kBlock];
  for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
    for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
      for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
        for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
          const int64_t len = n - j0 < kBlock ? n - j0 : kBlock;
          for (int64_t p = 0; p < P; ++p)
            for (int64_t j = 0; j < len; ++j) {
              const uint8_t* x = address(d, a, 1, p, i1, i2, i3, j0 + j);
              if (bitvec) {
                const int64_t v = load_int(d, 1, x);
                acc_bits[j] = p == 0 ? v : alu_apply_bits(op, acc_bits[j], v, d->bits);
              } else {
                const float v = load(d, 1, x);
                acc[j] = p == 0 ? v : alu_apply(fold_op, acc[j], v);
              }
            }
          for (int64_t j = 0; j < len; ++j) {
            uint8_t* dst = address(d, a, 0, 0, i1, i2, i3, j0 + j);
            if (bitvec) store_int(d, 0, dst, acc_bits[j]);
            else store(d, 0, dst, op == AluOp::average ? acc[j] / static_cast<float>(P) : acc[j]);
          }
        }
}

// --- Tensor engine -----------------------------------------------------------------------------

namespace {
typedef float v16 __attribute__((ext_vector_type(16)));

NK_INLINE v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
NK_INLINE void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
}  // namespace

/**
 * nc_matmul: dst[m, n] (+)= sum over k of stationary[k, m] * moving[k, n]. Each output element is a
 * chain of fused multiply-adds in increasing k from 0 (as in the interpreter), computed 16 columns
 * at a time with 8 x 32 register tiles over operands first converted to fp32. The result then
 * overwrites or accumulates into PSUM per the accumulate mode and the per-word "written" flags; a
 * NaN result is the canonical NaN, as in the reference (which NaN the fma chain passes on depends
 * on the compiler's operand order).
 */
/**
 * nc_matmul in transpose mode (is_transpose): where moving column n is a unit vector (a single 1,
 * zeros elsewhere) dst[m, n] is stationary[k, m] moved bit for bit; other columns sum the products
 * without a zero factor. Either way dst is written, never accumulated, and the PSUM "written"
 * flags are left alone, as in the reference.
 */
NK_INLINE void matmul_transpose_mode(const OpDesc* d, const OpArgs* a) {
  const int64_t K = d->mm_k, M = d->mm_m, N = d->mm_n;
  for (int64_t n = 0; n < N; ++n) {
    int64_t unit = -1;
    for (int64_t k = 0; k < K; ++k) {
      const float b = load(d, 2, address(d, a, 2, k, n, 0, 0, 0));
      if (b == 0.0f) continue;
      unit = b == 1.0f && unit == -1 ? k : -2;
      if (unit == -2) break;
    }
    for (int64_t m = 0; m < M; ++m) {
      uint8_t* out = address(d, a, 0, m, n, 0, 0, 0);
      if (unit >= 0) {
        copy_element(d, out, address(d, a, 1, unit, m, 0, 0, 0));
        continue;
      }
      float partial = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float x = load(d, 1, address(d, a, 1, k, m, 0, 0, 0)), y = load(d, 2, address(d, a, 2, k, n, 0, 0, 0));
        if (x != 0.0f && y != 0.0f) partial = __builtin_fmaf(x, y, partial);
      }
      store(d, 0, out, canonical_nan(partial));
    }
  }
}

NK_ENTRY void nk_matmul(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  if (d->flags & kFlagIsTranspose) return matmul_transpose_mode(d, a);
  const int64_t K = d->mm_k, M = d->mm_m, N = d->mm_n;
  // Operands packed into fp32: A[k][m] from stationary, B[k][n] from moving, C[m][n] partial sums.
  float* A = a->scratch;
  float* B = A + K * M;
  float* C = B + K * N;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t m = 0; m < M; ++m) A[k * M + m] = load(d, 1, address(d, a, 1, k, m, 0, 0, 0));
    for (int64_t n = 0; n < N; ++n) B[k * N + n] = load(d, 2, address(d, a, 2, k, n, 0, 0, 0));
  }
  const int64_t N32 = N / 32 * 32, M8 = M / 8 * 8;
  for (int64_t m0 = 0; m0 < M8; m0 += 8) {
    for (int64_t n0 = 0; n0 < N32; n0 += 32) {
      v16 c[8][2];
      for (int i = 0; i < 8; ++i) c[i][0] = c[i][1] = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const v16 b0 = load16(&B[k * N + n0]), b1 = load16(&B[k * N + n0 + 16]);
        for (int i = 0; i < 8; ++i) {
          const v16 av = A[k * M + m0 + i];
          c[i][0] = __builtin_elementwise_fma(av, b0, c[i][0]);
          c[i][1] = __builtin_elementwise_fma(av, b1, c[i][1]);
        }
      }
      for (int i = 0; i < 8; ++i) {
        store16(&C[(m0 + i) * N + n0], c[i][0]);
        store16(&C[(m0 + i) * N + n0 + 16], c[i][1]);
      }
    }
  }
  // Edges: rows below M8 and columns past N32, one element at a time in the same order.
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = (m < M8 ? N32 : 0); n < N; ++n) {
      float partial = 0.0f;
      for (int64_t k = 0; k < K; ++k) partial = __builtin_fmaf(A[k * M + m], B[k * N + n], partial);
      C[m * N + n] = partial;
    }
  const Accumulate mode = static_cast<Accumulate>(d->accumulate);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      uint8_t* out = address(d, a, 0, m, n, 0, 0, 0);
      uint8_t& written = a->psum_written[m * a->psum_flag_pitch + (out - a->base[0] - m * d->view[0].stride[0]) / 4];
      const bool accumulate = mode == Accumulate::accumulate || (mode == Accumulate::automatic && written);
      store(d, 0, out, canonical_nan(accumulate ? load(d, 0, out) + C[m * N + n] : C[m * N + n]));
      written = 1;
    }
}

/** nc_transpose: dst[f, p] = data[p, f], bit for bit. Each partition of dst is a row apart in
 * memory, so element by element every write lands on another row; blocks of kTransposeBlock x
 * kTransposeBlock elements write whole runs of each dst row instead. Tiles that share bytes
 * (an in-place transpose) keep the reference's order. */
inline constexpr int64_t kTransposeBlock = 16;

NK_ENTRY void nk_transpose(const OpDesc* d, const OpArgs* args) {
  NK_LOCAL_ARGS;
  const int64_t size = dtype_size(dtype_of(d, 1));
  const int64_t P = d->count[0], F = d->count[1];
  auto copy = [&](int64_t p, int64_t f) {
    std::memcpy(address(d, a, 0, f, p, 0, 0, 0), address(d, a, 1, p, f, 0, 0, 0), size);
  };
  // byte ranges of the two views: a 2-D view's extremes are among its four corners
  auto range = [&](int slot, int64_t rows, int64_t cols, const uint8_t*& lo, const uint8_t*& hi) {
    const uint8_t* corners[4] = {address(d, a, slot, 0, 0, 0, 0, 0), address(d, a, slot, rows - 1, 0, 0, 0, 0),
                                 address(d, a, slot, 0, cols - 1, 0, 0, 0),
                                 address(d, a, slot, rows - 1, cols - 1, 0, 0, 0)};
    lo = hi = corners[0];
    for (const uint8_t* c : corners) lo = c < lo ? c : lo, hi = c > hi ? c : hi;
    hi += size;
  };
  const uint8_t *dst_lo, *dst_hi, *src_lo, *src_hi;
  range(0, F, P, dst_lo, dst_hi);
  range(1, P, F, src_lo, src_hi);
  const bool disjoint = dst_hi <= src_lo || src_hi <= dst_lo;
  if (!disjoint) {
    for (int64_t p = 0; p < P; ++p)
      for (int64_t f = 0; f < F; ++f) copy(p, f);
    return;
  }
  for (int64_t p0 = 0; p0 < P; p0 += kTransposeBlock)
    for (int64_t f0 = 0; f0 < F; f0 += kTransposeBlock) {
      const int64_t p1 = p0 + kTransposeBlock < P ? p0 + kTransposeBlock : P;
      const int64_t f1 = f0 + kTransposeBlock < F ? f0 + kTransposeBlock : F;
      for (int64_t f = f0; f < f1; ++f)
        for (int64_t p = p0; p < p1; ++p) copy(p, f);
    }
}

}  // namespace nikki::native
