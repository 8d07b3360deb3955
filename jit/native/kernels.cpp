// nikki's native kernel library. Compiled to LLVM bitcode at build time (clang, -ffp-contract=off)
// and specialized per instruction template by the JIT: every entry point takes a constant OpDesc,
// so after inlining the opcode and dtype switches fold away and the remaining loops have constant
// trip counts and strides, which LLVM vectorizes for the host CPU.
//
// Numerics must match the reference interpreter bit for bit: both use nikki/numerics.hpp,
// nikki/alu.hpp and nikki/activation.hpp for element conversions and operators, and the loops
// here keep the interpreter's order of every rounding step (sequential folds per partition,
// fused multiply-adds in increasing k for matmul).
#include <cstring>

#include "nikki/activation.hpp"
#include "nikki/alu.hpp"
#include "nikki/numerics.hpp"
#include "op_desc.hpp"

#define NK_INLINE __attribute__((always_inline)) inline
#define NK_ENTRY extern "C" __attribute__((always_inline))

namespace nikki::native {
namespace {

NK_INLINE DType dtype_of(const OpDesc* d, int slot) { return static_cast<DType>(d->view[slot].dtype); }

NK_INLINE uint8_t* address(const OpDesc* d, const OpArgs* a, int slot, int64_t i0, int64_t i1, int64_t i2,
                           int64_t i3, int64_t i4) {
  const int64_t* s = d->view[slot].stride;
  return a->base[slot] + i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3] + i4 * s[4];
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

/** A scalar-or-tensor operand's fp32 value at an iteration point (tensors may be [P, 1] views). */
NK_INLINE float operand_value(const OpDesc* d, const OpArgs* a, int slot, int64_t i0, int64_t i1, int64_t i2,
                              int64_t i3, int64_t i4) {
  if (d->slot_kind[slot] == kSlotImm) return static_cast<float>(a->imm[slot]);
  return load(d, slot, address(d, a, slot, i0, i1, i2, i3, i4));
}

NK_INLINE float apply(AluOp op, bool reverse, float x, float s) {
  // reverse swaps an operator's operands; unary operators have only their tensor operand
  return (reverse && !is_unary_op(op)) ? alu_apply(op, s, x) : alu_apply(op, x, s);
}

NK_INLINE int64_t apply_bits(AluOp op, bool reverse, int64_t x, int64_t s, int bits) {
  return (reverse && !is_unary_op(op)) ? alu_apply_bits(op, s, x, bits) : alu_apply_bits(op, x, s, bits);
}

}  // namespace

// --- copies (dma_copy, tensor_copy) ------------------------------------------------------------

NK_ENTRY void nk_copy(const OpDesc* d, const OpArgs* a) {
  const bool same = d->view[0].dtype == d->view[1].dtype;
  const int64_t size = dtype_size(dtype_of(d, 0));
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    const uint8_t* src = address(d, a, 1, i0, i1, i2, i3, i4);
    if (same) std::memcpy(dst, src, size);
    else store(d, 0, dst, load(d, 1, src));
  });
}

// --- element-wise ------------------------------------------------------------------------------

NK_ENTRY void nk_tensor_tensor(const OpDesc* d, const OpArgs* a) {
  const AluOp op = static_cast<AluOp>(d->op0);
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    const uint8_t* x = address(d, a, 1, i0, i1, i2, i3, i4);
    const uint8_t* y = address(d, a, 2, i0, i1, i2, i3, i4);
    if (is_bitvec_op(op)) store_int(d, 0, dst, alu_apply_bits(op, load_int(d, 1, x), load_int(d, 2, y), d->bits));
    else if (d->flags & kFlagGpsimdInt) store_int(d, 0, dst, alu_apply_int(op, load_int(d, 1, x), load_int(d, 2, y)));
    else store(d, 0, dst, alu_apply(op, load(d, 1, x), load(d, 2, y)));
  });
}

NK_ENTRY void nk_tensor_scalar(const OpDesc* d, const OpArgs* a) {
  const AluOp op0 = static_cast<AluOp>(d->op0), op1 = static_cast<AluOp>(d->op1);
  const bool r0 = d->flags & kFlagReverse0, r1 = d->flags & kFlagReverse1;
  const bool two = d->slot_kind[3] != kSlotNone;
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    uint8_t* dst = address(d, a, 0, i0, i1, i2, i3, i4);
    const uint8_t* x = address(d, a, 1, i0, i1, i2, i3, i4);
    if (is_bitvec_op(op0)) {
      auto s_int = [&](int slot) {
        return d->slot_kind[slot] == kSlotImm ? static_cast<int64_t>(a->imm[slot])
                                              : load_int(d, slot, address(d, a, slot, i0, i1, i2, i3, i4));
      };
      int64_t r = apply_bits(op0, r0, load_int(d, 1, x), s_int(2), d->bits);
      if (two) r = apply_bits(op1, r1, r, s_int(3), d->bits);
      store_int(d, 0, dst, r);
    } else {
      float r = apply(op0, r0, load(d, 1, x), operand_value(d, a, 2, i0, i1, i2, i3, i4));
      if (two) r = apply(op1, r1, r, operand_value(d, a, 3, i0, i1, i2, i3, i4));
      store(d, 0, dst, r);
    }
  });
}

NK_ENTRY void nk_scalar_tensor_tensor(const OpDesc* d, const OpArgs* a) {
  const AluOp op0 = static_cast<AluOp>(d->op0), op1 = static_cast<AluOp>(d->op1);
  const bool r0 = d->flags & kFlagReverse0, r1 = d->flags & kFlagReverse1;
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    float r = apply(op0, r0, load(d, 1, address(d, a, 1, i0, i1, i2, i3, i4)),
                    operand_value(d, a, 2, i0, i1, i2, i3, i4));
    const float y = load(d, 3, address(d, a, 3, i0, i1, i2, i3, i4));
    r = r1 ? alu_apply(op1, y, r) : alu_apply(op1, r, y);
    store(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), r);
  });
}

NK_ENTRY void nk_reciprocal(const OpDesc* d, const OpArgs* a) {
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    store(d, 0, address(d, a, 0, i0, i1, i2, i3, i4), 1.0f / load(d, 1, address(d, a, 1, i0, i1, i2, i3, i4)));
  });
}

NK_ENTRY void nk_memset(const OpDesc* d, const OpArgs* a) {
  const DType t = dtype_of(d, 0);
  const int64_t size = dtype_size(t);
  uint8_t pattern[4];
  if (is_float(t)) {
    numerics::store_float(t, pattern, static_cast<float>(a->imm[1]));
  } else {
    // integer fill values saturate to the dtype's range (the verifier rejects out-of-range ones)
    int64_t v = static_cast<int64_t>(a->imm[1]);
    const int bits = 8 * static_cast<int>(size);
    const int64_t lo = info(t).is_signed ? -(int64_t(1) << (bits - 1)) : 0;
    const int64_t hi = t == DType::bool_ ? 1 : info(t).is_signed ? (int64_t(1) << (bits - 1)) - 1 : (int64_t(1) << bits) - 1;
    numerics::store_int(t, pattern, v < lo ? lo : v > hi ? hi : v);
  }
  iterate(d, [&](int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t i4) {
    std::memcpy(address(d, a, 0, i0, i1, i2, i3, i4), pattern, size);
  });
}

// --- activation (Scalar engine) ----------------------------------------------------------------

NK_ENTRY void nk_activation(const OpDesc* d, const OpArgs* a) {
  const ActFunc func = static_cast<ActFunc>(d->func);
  const ReduceCmd cmd = static_cast<ReduceCmd>(d->reduce_cmd);
  const bool reducing = cmd == ReduceCmd::reduce || cmd == ReduceCmd::reset_reduce;
  for (int64_t p = 0; p < d->count[0]; ++p) {
    const float bias = d->slot_kind[2] == kSlotTensor ? load(d, 2, address(d, a, 2, p, 0, 0, 0, 0)) : 0.0f;
    const float scale = operand_value(d, a, 3, p, 0, 0, 0, 0);
    float sum = 0.0f;
    bool first = true;
    for (int64_t i1 = 0; i1 < d->count[1]; ++i1)
      for (int64_t i2 = 0; i2 < d->count[2]; ++i2)
        for (int64_t i3 = 0; i3 < d->count[3]; ++i3)
          for (int64_t i4 = 0; i4 < d->count[4]; ++i4) {
            const float x = load(d, 1, address(d, a, 1, p, i1, i2, i3, i4));
            const float y = activation_apply(func, __builtin_fmaf(x, scale, bias));
            store(d, 0, address(d, a, 0, p, i1, i2, i3, i4), y);
            if (reducing) {
              sum = first ? y : sum + y;
              first = false;
            }
          }
    float& acc = a->scalar_acc[p];
    switch (cmd) {
      case ReduceCmd::idle: break;
      case ReduceCmd::reset: acc = 0.0f; break;
      case ReduceCmd::reduce:
      case ReduceCmd::load_reduce: acc = acc + sum; break;
      case ReduceCmd::reset_reduce: acc = sum; break;
    }
    if (d->slot_kind[4] == kSlotTensor) store(d, 4, address(d, a, 4, p, 0, 0, 0, 0), acc);
  }
}

// --- reductions --------------------------------------------------------------------------------

/** tensor_reduce: dims >= reduce_from are folded left to right, the first element seeding the fold.
 * Partitions are independent, so the partition loop is innermost: the fold order per partition
 * stays sequential while the loop vectorizes across partitions. */
NK_ENTRY void nk_tensor_reduce(const OpDesc* d, const OpArgs* a) {
  const AluOp op = static_cast<AluOp>(d->op0);
  const bool negate = d->flags & kFlagNegate;
  const int64_t P = d->count[0];
  float acc[128];
  int64_t acc_bits[128];
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
                  const uint8_t* x = address(d, a, 1, p, k1, k2, k3, j4);
                  if (is_bitvec_op(op)) {
                    const int64_t v = load_int(d, 1, x);
                    acc_bits[p] = first ? v : alu_apply_bits(op, acc_bits[p], v, d->bits);
                  } else {
                    const float v = load(d, 1, x);
                    acc[p] = first ? v : alu_apply(op, acc[p], v);
                  }
                }
                first = false;
              }
        for (int64_t p = 0; p < P; ++p) {
          uint8_t* dst = address(d, a, 0, p, i1, i2, i3, 0);
          if (is_bitvec_op(op)) store_int(d, 0, dst, acc_bits[p]);
          else store(d, 0, dst, negate ? -acc[p] : acc[p]);
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
 * overwrites or accumulates into PSUM per the accumulate mode and the per-word "written" flags.
 */
NK_ENTRY void nk_matmul(const OpDesc* d, const OpArgs* a) {
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
      store(d, 0, out, accumulate ? load(d, 0, out) + C[m * N + n] : C[m * N + n]);
      written = 1;
    }
}

/** nc_transpose: dst[f, p] = data[p, f], bit for bit. */
NK_ENTRY void nk_transpose(const OpDesc* d, const OpArgs* a) {
  const int64_t size = dtype_size(dtype_of(d, 1));
  for (int64_t p = 0; p < d->count[0]; ++p)
    for (int64_t f = 0; f < d->count[1]; ++f)
      std::memcpy(a->base[0] + f * d->view[0].stride[0] + p * d->view[0].stride[1],
                  a->base[1] + p * d->view[1].stride[0] + f * d->view[1].stride[1], size);
}

}  // namespace nikki::native
