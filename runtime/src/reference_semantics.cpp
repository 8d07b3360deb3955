// The reference semantics of nikki's instructions: what each does to a Machine's state, one
// element at a time, in the order that fixes every rounding step. The native routines
// (jit/native/kernels.cpp) must give the same bits; docs/numerics.md describes the rules.
#include "reference_semantics.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nikki/activation.hpp"
#include "nikki/alu.hpp"
#include "nikki/element_stores.hpp"
#include "nikki/numerics.hpp"
#include "nikki/reduction_order.hpp"

namespace nikki::runtime::reference {

// --- accumulators and folds (shared with the sanitizer's shadow) -----------------------------

void apply_reduce_cmd(ReduceCmd cmd, AluOp op, float identity, std::vector<float>& acc, int64_t p, float partial,
                      bool has_partial) {
  switch (cmd) {
    case ReduceCmd::idle: break;
    case ReduceCmd::reset: acc[p] = identity; break;
    case ReduceCmd::reduce:
    case ReduceCmd::load_reduce:
      if (has_partial) acc[p] = alu_apply(op, acc[p], partial);
      break;
    case ReduceCmd::reset_reduce: acc[p] = has_partial ? canonical_nan(partial) : identity; break;
  }
}

int64_t reduce_run(const Kernel& k, const Instruction& inst) {
  const AccessPattern ap = k.view(inst, 1);
  int first = ap.rank;
  for (int d = 1; d < ap.rank; ++d)
    if (inst.attrs.axes & (1u << d)) {
      first = d;
      break;
    }
  int64_t run = 1;
  for (int d = first; d < ap.rank; ++d) run *= ap.dims[d].count;
  return run;
}

std::vector<int64_t> affine_values(const RareAttributes& at, int64_t c, int64_t free) {
  std::vector<int64_t> values(free), idx(at.pattern.size(), 0);
  for (int64_t f = 0; f < free; ++f) {
    int64_t v = at.offset + c * at.channel_multiplier;
    for (size_t d = 0; d < idx.size(); ++d) v += at.pattern[d].stride * idx[d];
    values[f] = static_cast<int32_t>(static_cast<uint32_t>(v));
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < at.pattern[d].count) break;
      idx[d] = 0;
    }
  }
  return values;
}

namespace {

// --- operands and folds ------------------------------------------------------------------

/** The value of a register-or-immediate operand. */
int64_t scalar_value(const Machine& m, const Operand& o) {
  return o.is_reg() ? m.reg(o.reg()) : static_cast<int64_t>(o.imm());
}

/** Value of a scalar-or-vector operand for partition p (fp32). */
float per_partition(const Operand& o, const Elements& e, int64_t p) {
  return o.is_tensor() ? e.get(p, 0) : static_cast<float>(o.imm());
}

/** Folds `values` with `op` left to right (the first element is the initial value). */
float fold(AluOp op, const std::vector<float>& values) {
  float r = values[0];
  for (size_t i = 1; i < values.size(); ++i) r = alu_apply(op, r, values[i]);
  return r;
}

int64_t fold_bits(AluOp op, const std::vector<int64_t>& values, int bits) {
  int64_t r = values[0];
  for (size_t i = 1; i < values.size(); ++i) r = alu_apply_bits(op, r, values[i], bits);
  return r;
}

// --- data movement: DMA, copies, transposes, shuffles, gathers -----------------------------------

void exec_copy(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), src = m.operand(inst, 1);
  for (int64_t i = 0; i < dst.size(); ++i)
    if (dst.ptr[i] && src.ptr[i]) numerics::copy_element(dst.dtype, dst.ptr[i], src.dtype, src.ptr[i]);  // null: skipped
}

/** dst = fold of the sources with reduce_op, element by element in order, in fp32: a source
 * that is dst itself (read-modify-write) sees the writes of earlier elements, so repeated
 * scatter indices accumulate. */
void exec_dma_compute(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0);
  std::vector<Elements> srcs;
  for (int slot = 1; slot < kMaxSlots && inst.operands[slot].is_tensor(); ++slot) srcs.push_back(m.operand(inst, slot));
  for (int64_t i = 0; i < dst.size(); ++i) {
    if (!dst.ptr[i]) continue;
    bool skipped = false;
    float acc = 0.0f;
    for (size_t k = 0; k < srcs.size() && !skipped; ++k) {
      if (!srcs[k].ptr[i]) {
        skipped = true;
        break;
      }
      const float v = numerics::load_float(srcs[k].dtype, srcs[k].ptr[i]);
      acc = k == 0 ? v : alu_apply(inst.attrs.op0, acc, v);
    }
    if (!skipped) numerics::store_float(dst.dtype, dst.ptr[i], acc);
  }
}

void exec_copy_predicated(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), src = m.optional_operand(inst, 1), pred = m.operand(inst, 2);
  const bool scalar_src = inst.operands[1].is_imm();
  for (int64_t i = 0; i < dst.size(); ++i) {
    const bool take = (numerics::load_int(pred.dtype, pred.ptr[i]) != 0) != inst.attrs.reverse_pred;
    if (!take) continue;
    if (scalar_src) numerics::store_float(dst.dtype, dst.ptr[i], static_cast<float>(inst.operands[1].imm()));
    else numerics::copy_element(dst.dtype, dst.ptr[i], src.dtype, src.ptr[i]);
  }
}

void exec_transpose(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  const int64_t size = dtype_size(dst.dtype);
  for (int64_t p = 0; p < data.partitions; ++p)
    for (int64_t f = 0; f < data.free; ++f) std::memcpy(dst.at(f, p), data.at(p, f), size);
}

/** Each quadrant of 32 partitions: dst lane i = src lane lanes[i] (255 keeps dst). */
void exec_stream_shuffle(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), src = m.operand(inst, 1);
  const int64_t quadrant = m.config().partition_quadrant, row_bytes = src.free * dtype_size(src.dtype);
  std::vector<uint8_t> rows(size_t(src.partitions * row_bytes));  // read every source row first (in place)
  for (int64_t p = 0; p < src.partitions; ++p)
    for (int64_t f = 0; f < src.free; ++f)
      std::memcpy(&rows[(p * src.free + f) * dtype_size(src.dtype)], src.at(p, f), dtype_size(src.dtype));
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const int32_t lane = m.kernel().rare(inst).lanes[p % quadrant];
    if (lane == kShuffleKeepLane) continue;
    const int64_t from = (p / quadrant) * quadrant + lane;
    if (from >= src.partitions)
      m.runtime_fault(inst, fmt::format("shuffle_mask sends lane {} to partition {}, but src has {} partitions", lane,
                                      p, src.partitions),
                    "keep shuffle_mask entries below the number of partitions of a quadrant");
    for (int64_t f = 0; f < dst.free; ++f)
      std::memcpy(dst.at(p, f), &rows[(from * src.free + f) * dtype_size(src.dtype)], dtype_size(dst.dtype));
  }
}

/** dst[p, j] = data[p, indices[p, j]] over each partition's flattened free elements. */
void exec_n_gather(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1), indices = m.operand(inst, 2);
  for (int64_t p = 0; p < dst.partitions; ++p)
    for (int64_t j = 0; j < dst.free; ++j) {
      const int64_t i = indices.get_int(p, j);
      if (i < 0 || i >= data.free)
        m.runtime_fault(inst, fmt::format("index {} (partition {}, position {}) is outside the {} elements of data", i,
                                        p, j, data.free),
                      "gather indices address the flattened free elements of each data partition");
      numerics::copy_element(dst.dtype, dst.at(p, j), data.dtype, data.at(p, i));
    }
}

/** Per GpSimd core of 16 partitions: its indices, flattened partition first, each the start of a
 *  run of num_elem_per_idx elements that every partition of the core copies from its own row. */
void exec_local_gather(Machine& m, const Instruction& inst) {
  constexpr int64_t group = 16;
  Elements dst = m.operand(inst, 0), src = m.operand(inst, 1), index = m.operand(inst, 2);
  const RareAttributes& a = m.kernel().rare(inst);
  const int64_t per_index = a.step, valid = a.offset;
  for (int64_t core = 0; core < src.partitions / group; ++core)
    for (int64_t j = 0; j < valid; ++j) {
      const int64_t from_partition = core * group + j % group;
      const int64_t start = index.get_int(from_partition, j / group);
      if (start + per_index > src.free)
        m.runtime_fault(inst, fmt::format("index {} (partition {}, position {}) reads elements {}..{} of the {} "
                                          "elements of a src_buffer partition", start, from_partition, j / group,
                                          start, start + per_index - 1, src.free),
                        "local_gather indices address the flattened free elements of each src_buffer partition");
      for (int64_t p = core * group; p < (core + 1) * group; ++p)
        for (int64_t e = 0; e < per_index; ++e)
          numerics::copy_element(dst.dtype, dst.at(p, j * per_index + e), src.dtype, src.at(p, start + e));
    }
}

// --- element-wise arithmetic: ALU operators and activation functions -----------------------------

void exec_tensor_tensor(Machine& m, const Instruction& inst) {
  const AluOp op = inst.attrs.op0;
  Elements dst = m.operand(inst, 0), a = m.operand(inst, 1), b = m.operand(inst, 2);
  auto int32_like = [](DType d) { return d == DType::int32 || d == DType::uint32; };
  if (is_bitvec_op(op)) {
    const int bits = 8 * int(dtype_size(a.dtype));
    for (int64_t i = 0; i < dst.size(); ++i)
      numerics::store_int(dst.dtype, dst.ptr[i],
                          alu_apply_bits(op, numerics::load_int(a.dtype, a.ptr[i]),
                                         numerics::load_int(b.dtype, b.ptr[i]), bits));
  } else if (inst.engine == Engine::gpsimd && int32_like(dst.dtype) && int32_like(a.dtype) && int32_like(b.dtype) &&
             op != AluOp::power) {
    for (int64_t i = 0; i < dst.size(); ++i)
      numerics::store_int(dst.dtype, dst.ptr[i],
                          alu_apply_int(op, numerics::load_int(a.dtype, a.ptr[i]),
                                        numerics::load_int(b.dtype, b.ptr[i])));
  } else {
    for (int64_t i = 0; i < dst.size(); ++i)
      numerics::store_float(dst.dtype, dst.ptr[i],
                            alu_apply(op, numerics::load_float(a.dtype, a.ptr[i]),
                                      numerics::load_float(b.dtype, b.ptr[i])));
  }
}

void exec_tensor_scalar(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  Elements op0v = m.optional_operand(inst, 2), op1v = m.optional_operand(inst, 3);
  const Operand &o0 = inst.operands[2], &o1 = inst.operands[3];
  const bool two = !o1.is_none();
  // reverse swaps an operator's operands; a unary operator has only the tensor operand (its
  // scalar operand is ignored), so reverse leaves it applied to the tensor value.
  auto swap = [](AluOp op, bool reverse) { return reverse && !is_unary_op(op); };
  if (is_bitvec_op(at.op0)) {
    const int bits = 8 * int(dtype_size(data.dtype));
    auto int_operand = [&](const Operand& o, const Elements& e, int64_t p) {
      return o.is_tensor() ? e.get_int(p, 0) : static_cast<int64_t>(o.imm());
    };
    for (int64_t p = 0; p < dst.partitions; ++p)
      for (int64_t f = 0; f < dst.free; ++f) {
        int64_t x = data.get_int(p, f), s0 = int_operand(o0, op0v, p);
        int64_t r = swap(at.op0, at.reverse0) ? alu_apply_bits(at.op0, s0, x, bits)
                                              : alu_apply_bits(at.op0, x, s0, bits);
        if (two) {
          int64_t s1 = int_operand(o1, op1v, p);
          r = swap(at.op1, at.reverse1) ? alu_apply_bits(at.op1, s1, r, bits) : alu_apply_bits(at.op1, r, s1, bits);
        }
        dst.set_int(p, f, r);
      }
    return;
  }
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const float s0 = per_partition(o0, op0v, p);
    const float s1 = two ? per_partition(o1, op1v, p) : 0.0f;
    for (int64_t f = 0; f < dst.free; ++f) {
      const float x = data.get(p, f);
      float r = swap(at.op0, at.reverse0) ? alu_apply(at.op0, s0, x) : alu_apply(at.op0, x, s0);
      if (two) r = swap(at.op1, at.reverse1) ? alu_apply(at.op1, s1, r) : alu_apply(at.op1, r, s1);
      dst.set(p, f, r);
    }
  }
}

void exec_scalar_tensor_tensor(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1), s0v = m.optional_operand(inst, 2),
           other = m.operand(inst, 3);
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const float s0 = per_partition(inst.operands[2], s0v, p);
    for (int64_t f = 0; f < dst.free; ++f) {
      const float x = data.get(p, f), y = other.get(p, f);
      float r = at.reverse0 ? alu_apply(at.op0, s0, x) : alu_apply(at.op0, x, s0);
      r = at.reverse1 ? alu_apply(at.op1, y, r) : alu_apply(at.op1, r, y);
      dst.set(p, f, r);
    }
  }
}

void exec_reciprocal(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  for (int64_t i = 0; i < dst.size(); ++i)
    numerics::store_float(dst.dtype, dst.ptr[i], 1.0f / numerics::load_float(data.dtype, data.ptr[i]));
}

void exec_activation(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1), bias = m.optional_operand(inst, 2),
           scale = m.optional_operand(inst, 3), res = m.optional_operand(inst, 4);
  const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const float b = inst.operands[2].is_tensor() ? bias.get(p, 0) : 0.0f;
    const float s = per_partition(inst.operands[3], scale, p);
    float sum = 0.0f;
    for (int64_t f = 0; f < dst.free; ++f) {
      const float y = activation_apply(at.func, std::fma(data.get(p, f), s, b));
      dst.set(p, f, y);
      if (reducing) sum = f == 0 ? y : sum + y;
    }
    apply_reduce_cmd(at.reduce_cmd, AluOp::add, 0.0f, m.scalar_acc(), p, sum, reducing);
    if (inst.operands[4].is_tensor()) res.set(p, 0, m.scalar_acc()[p]);
  }
}

void exec_scan(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), d0 = m.operand(inst, 1), d1 = m.operand(inst, 2),
           init = m.optional_operand(inst, 3);
  for (int64_t p = 0; p < dst.partitions; ++p) {
    float prev = per_partition(inst.operands[3], init, p);
    for (int64_t f = 0; f < dst.free; ++f) {
      const float a = d0.get(p, f), b = d1.get(p, f);
      float t = at.reverse0 ? alu_apply(at.op0, prev, a) : alu_apply(at.op0, a, prev);
      prev = at.reverse1 ? alu_apply(at.op1, b, t) : alu_apply(at.op1, t, b);
      dst.set(p, f, prev);
    }
  }
}

// --- reductions and statistics -------------------------------------------------------------------

void exec_tensor_reduce(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  const int64_t run = reduce_run(m.kernel(), inst);
  const int bits = 8 * int(dtype_size(data.dtype));
  for (int64_t p = 0; p < dst.partitions; ++p)
    for (int64_t o = 0; o < dst.free; ++o) {
      if (is_bitvec_op(at.op0)) {
        std::vector<int64_t> v(run);
        for (int64_t i = 0; i < run; ++i) v[i] = data.get_int(p, o * run + i);
        dst.set_int(p, o, fold_bits(at.op0, v, bits));
      } else {
        // fp32 folds take nikki's reduction order (pairwise for add), shared with the native routine
        std::vector<float> v(run);
        for (int64_t i = 0; i < run; ++i) v[i] = data.get(p, o * run + i);
        const float r = reduction::fold(at.op0, run, [&](int64_t lo, int64_t, float*) { return v.data() + lo; });
        dst.set(p, o, at.negate ? -r : r);
      }
    }
}

void exec_tensor_scalar_reduce(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1), s0v = m.optional_operand(inst, 2),
           res = m.optional_operand(inst, 3);
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const float s0 = per_partition(inst.operands[2], s0v, p);
    std::vector<float> v(dst.free);
    for (int64_t f = 0; f < dst.free; ++f) {
      v[f] = alu_apply(at.op0, data.get(p, f), s0);
      dst.set(p, f, v[f]);
    }
    m.vector_acc()[p] = fold(at.reduce_op, v);
    if (inst.operands[3].is_tensor()) res.set(p, 0, m.vector_acc()[p]);
  }
}

void exec_partition_reduce(Machine& m, const Instruction& inst) {
  const AluOp op = inst.attrs.op0;
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  const int bits = 8 * int(dtype_size(data.dtype));
  for (int64_t f = 0; f < data.free; ++f) {
    if (is_bitvec_op(op)) {
      int64_t r = data.get_int(0, f);
      for (int64_t p = 1; p < data.partitions; ++p) r = alu_apply_bits(op, r, data.get_int(p, f), bits);
      dst.set_int(0, f, r);
    } else {
      const AluOp fold_op = op == AluOp::average ? AluOp::add : op;
      float r = data.get(0, f);
      for (int64_t p = 1; p < data.partitions; ++p) r = alu_apply(fold_op, r, data.get(p, f));
      if (op == AluOp::average) r /= static_cast<float>(data.partitions);
      dst.set(0, f, r);
    }
  }
}

void exec_bn_stats(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  for (int64_t p = 0; p < data.partitions; ++p) {
    // Welford's running mean and sum of squared deviations, separately over even and odd elements.
    float count[2] = {0, 0}, mean[2] = {0, 0}, m2[2] = {0, 0};
    for (int64_t f = 0; f < data.free; ++f) {
      const int lane = f & 1;
      const float x = data.get(p, f);
      count[lane] += 1.0f;
      const float delta = x - mean[lane];
      mean[lane] += delta / count[lane];
      m2[lane] += delta * (x - mean[lane]);
    }
    const float out[6] = {count[0], mean[0], m2[0], count[1], mean[1], m2[1]};
    for (int i = 0; i < 6; ++i) dst.set(p, i, canonical_nan(out[i]));
  }
}

void exec_bn_aggr(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1);
  for (int64_t p = 0; p < data.partitions; ++p) {
    // Chan et al.'s pairwise merge of (count, mean, M2) triples, in order.
    float n = 0, mean = 0, m2 = 0;
    for (int64_t i = 0; i + 2 < data.free; i += 3) {
      const float nb = data.get(p, i), mb = data.get(p, i + 1), m2b = data.get(p, i + 2);
      if (nb == 0) continue;
      const float total = n + nb;
      const float delta = mb - mean;
      mean += delta * (nb / total);
      m2 += m2b + delta * delta * (n * nb / total);
      n = total;
    }
    dst.set(p, 0, canonical_nan(mean));
    dst.set(p, 1, n > 0 ? canonical_nan(m2 / n) : std::numeric_limits<float>::quiet_NaN());
  }
}

// --- selection and search ------------------------------------------------------------------------

void exec_select_reduce(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), pred = m.operand(inst, 1), on_true = m.operand(inst, 2),
           on_false = m.optional_operand(inst, 3), res = m.optional_operand(inst, 4);
  const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const float fv = per_partition(inst.operands[3], on_false, p);
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t f = 0; f < dst.free; ++f) {
      const bool take = (pred.get_int(p, f) != 0) != at.reverse_pred;
      const float v = take ? on_true.get(p, f) : fv;
      dst.set(p, f, v);
      best = alu_apply(AluOp::maximum, best, v);
    }
    apply_reduce_cmd(at.reduce_cmd, AluOp::maximum, -std::numeric_limits<float>::infinity(), m.vector_acc(), p, best,
                     reducing);
    if (inst.operands[4].is_tensor()) res.set(p, 0, m.vector_acc()[p]);
  }
}

/** Keeps element f of each partition where (f + range_start) comp_op0 bound0 and comp_op1
 * bound1 hold, else fill_value; reduces the results with reduce_op into the accumulators. */
void exec_range_select(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0), on_true = m.operand(inst, 1), b0 = m.optional_operand(inst, 2),
           b1 = m.optional_operand(inst, 3), res = m.optional_operand(inst, 4);
  const bool reducing = at.reduce_cmd == ReduceCmd::reduce || at.reduce_cmd == ReduceCmd::reset_reduce;
  const RareAttributes& rare = m.kernel().rare(inst);
  const float fill = static_cast<float>(rare.fill_value);
  for (int64_t p = 0; p < dst.partitions; ++p) {
    const float bound0 = per_partition(inst.operands[2], b0, p), bound1 = per_partition(inst.operands[3], b1, p);
    float best = 0.0f;
    for (int64_t f = 0; f < dst.free; ++f) {
      const float position = static_cast<float>(f + rare.offset);
      const bool keep = alu_apply(at.op0, position, bound0) != 0.0f && alu_apply(at.op1, position, bound1) != 0.0f;
      const float v = keep ? on_true.get(p, f) : fill;
      dst.set(p, f, v);
      best = f == 0 ? v : alu_apply(at.reduce_op, best, v);
    }
    apply_reduce_cmd(at.reduce_cmd, at.reduce_op, fill, m.vector_acc(), p, best, reducing && dst.free > 0);
    if (inst.operands[4].is_tensor()) res.set(p, 0, m.vector_acc()[p]);
  }
}

void exec_max8(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), src = m.operand(inst, 1);
  for (int64_t p = 0; p < src.partitions; ++p) {
    std::vector<float> v(src.free);
    for (int64_t f = 0; f < src.free; ++f) v[f] = src.get(p, f);
    // Descending and stable; NaN never outranks a number.
    std::stable_sort(v.begin(), v.end(), [](float a, float b) {
      if (std::isnan(a)) return false;
      if (std::isnan(b)) return true;
      return a > b;
    });
    for (int i = 0; i < 8; ++i) dst.set(p, i, v[i]);
  }
}

void exec_find_index8(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1), vals = m.operand(inst, 2);
  for (int64_t p = 0; p < data.partitions; ++p) {
    std::vector<bool> used(data.free, false);
    for (int i = 0; i < 8; ++i) {
      const float want = vals.get(p, i);
      int64_t found = 0xFFFFFFFFll;
      for (int64_t f = 0; f < data.free; ++f)
        if (!used[f] && data.get(p, f) == want) {
          found = f;
          used[f] = true;
          break;
        }
      numerics::store_saturated(dst.dtype, dst.at(p, i), found);
    }
  }
}

/** Replaces, per partition, the first not yet matched occurrence of each of the 8 values with
 * imm (vals taken from the last to the first, as the hardware pairs duplicate values); dst_idx
 * gets each value's position (all ones when absent). */
void exec_match_replace8(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), data = m.operand(inst, 1), vals = m.operand(inst, 2),
           idx = m.optional_operand(inst, 4);
  const float imm = static_cast<float>(inst.operands[3].imm());
  for (int64_t p = 0; p < data.partitions; ++p) {
    std::vector<float> row(data.free);
    for (int64_t f = 0; f < data.free; ++f) row[f] = data.get(p, f);
    std::vector<bool> matched(data.free, false);
    std::array<int64_t, 8> where;
    where.fill(0xFFFFFFFFll);
    for (int i = 7; i >= 0; --i) {
      const float want = vals.get(p, i);
      for (int64_t f = 0; f < data.free; ++f)
        if (!matched[f] && row[f] == want) {
          matched[f] = true;
          where[i] = f;
          break;
        }
    }
    for (int64_t f = 0; f < data.free; ++f) dst.set(p, f, matched[f] ? imm : row[f]);
    if (inst.operands[4].is_tensor())
      for (int i = 0; i < 8; ++i) numerics::store_saturated(idx.dtype, idx.at(p, i), where[i]);
  }
}

/** On the first partition of each GpSimd core's group: the positions (+ index_offset) of the
 * nonzero elements, then padding_val, then their count in the last element. */
void exec_nonzero_with_count(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0), src = m.operand(inst, 1);
  const int64_t group = m.config().gpsimd_core_partitions;
  for (int64_t p = 0; p < src.partitions; p += group) {
    int64_t n = 0;
    for (int64_t f = 0; f < src.free; ++f) {
      const bool nonzero = is_float(src.dtype) ? src.get(p, f) != 0.0f : src.get_int(p, f) != 0;
      if (nonzero) numerics::store_saturated(dst.dtype, dst.at(p, n++), f + m.kernel().rare(inst).offset);
    }
    for (int64_t f = n; f < src.free; ++f)
      numerics::store_saturated(dst.dtype, dst.at(p, f), static_cast<int64_t>(m.kernel().rare(inst).fill_value));
    numerics::store_saturated(dst.dtype, dst.at(p, src.free), n);
  }
}

// --- fills and affine patterns -------------------------------------------------------------------

void exec_memset(Machine& m, const Instruction& inst) {
  Elements dst = m.operand(inst, 0);
  const double v = inst.operands[1].imm();
  for (uint8_t* p : dst.ptr) {
    if (is_float(dst.dtype)) numerics::store_float(dst.dtype, p, static_cast<float>(v));
    else numerics::store_saturated(dst.dtype, p, static_cast<int64_t>(v));
  }
}

void exec_affine(Machine& m, const Instruction& inst) {
  const Attributes& at = inst.attrs;
  Elements dst = m.operand(inst, 0);
  Elements on_true = inst.opcode == Opcode::affine_select ? m.operand(inst, 1) : Elements{};
  for (int64_t c = 0; c < dst.partitions; ++c) {
    const std::vector<int64_t> values = affine_values(m.kernel().rare(inst), c, dst.free);
    for (int64_t f = 0; f < dst.free; ++f) {
      if (inst.opcode == Opcode::iota) {
        numerics::store_saturated(dst.dtype, dst.at(c, f), values[f]);
      } else if (alu_apply_int(at.cmp_op, values[f], 0)) {
        numerics::copy_element(dst.dtype, dst.at(c, f), on_true.dtype, on_true.at(c, f));
      } else {
        dst.set(c, f, static_cast<float>(inst.operands[2].imm()));
      }
    }
  }
}

// --- tensor engine -------------------------------------------------------------------------------

void exec_matmul(Machine& machine, const Instruction& inst) {
  Elements dst = machine.operand(inst, 0), st = machine.operand(inst, 1), mv = machine.operand(inst, 2);
  const int64_t K = st.partitions, M = st.free, N = mv.free;
  const Accumulate mode = inst.attrs.accumulate;
  // Transpose mode (nc_transpose on the tensor engine: data stationary, identity moving) is
  // bit-accurate: where moving column n is a unit vector (a single 1, zeros elsewhere), dst[m, n]
  // is stationary[k, m] passed through unchanged (-0 and NaN payloads included).
  std::vector<int64_t> unit(inst.attrs.is_transpose ? N : 0, -1);
  for (int64_t n = 0; n < static_cast<int64_t>(unit.size()); ++n)
    for (int64_t kk = 0; kk < K; ++kk) {
      const float b = mv.get(kk, n);
      if (b == 0.0f) continue;
      unit[n] = b == 1.0f && unit[n] == -1 ? kk : -2;
      if (unit[n] == -2) break;
    }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float partial = 0.0f;
      if (inst.attrs.is_transpose && unit[n] >= 0) {
        numerics::copy_element(dst.dtype, dst.at(m, n), st.dtype, st.at(unit[n], m));
        continue;
      }
      if (inst.attrs.is_transpose) {
        // Other moving tiles: products with a zero factor are skipped, so a NaN or Inf moves
        // through an identity-like operand instead of poisoning the whole row.
        for (int64_t kk = 0; kk < K; ++kk) {
          const float a = st.get(kk, m), b = mv.get(kk, n);
          if (a != 0.0f && b != 0.0f) partial = std::fma(a, b, partial);
        }
        dst.set(m, n, canonical_nan(partial));
        continue;
      }
      for (int64_t kk = 0; kk < K; ++kk) partial = std::fma(st.get(kk, m), mv.get(kk, n), partial);
      uint8_t* out = dst.at(m, n);
      uint8_t& written = machine.psum_written(out);
      const bool accumulate = mode == Accumulate::accumulate || (mode == Accumulate::automatic && written);
      dst.set(m, n, canonical_nan(accumulate ? dst.get(m, n) + partial : partial));
      written = 1;
    }
}

// --- debugging -----------------------------------------------------------------------------------

void exec_device_print(Machine& m, const Instruction& inst) {
  Elements src = m.operand(inst, 0);
  std::string out = fmt::format("{} {}:\n[", m.kernel().rare(inst).text, m.kernel().view(inst, 0).shape().str());
  for (int64_t p = 0; p < src.partitions; ++p) {
    out += p ? ",\n [" : "[";
    for (int64_t f = 0; f < src.free; ++f) {
      if (is_float(src.dtype)) out += fmt::format("{}{}", f ? ", " : "", src.get(p, f));
      else out += fmt::format("{}{}", f ? ", " : "", src.get_int(p, f));
    }
    out += "]";
  }
  out += "]\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

// --- dispatch, registers and control flow --------------------------------------------------------

void execute(Machine& m, const Instruction& inst, size_t& pc) {
  switch (inst.opcode) {
    case Opcode::dma_copy:
    case Opcode::tensor_copy: return exec_copy(m, inst);
    case Opcode::tensor_tensor: return exec_tensor_tensor(m, inst);
    case Opcode::tensor_scalar: return exec_tensor_scalar(m, inst);
    case Opcode::scalar_tensor_tensor: return exec_scalar_tensor_tensor(m, inst);
    case Opcode::activation: return exec_activation(m, inst);
    case Opcode::tensor_reduce: return exec_tensor_reduce(m, inst);
    case Opcode::tensor_scalar_reduce: return exec_tensor_scalar_reduce(m, inst);
    case Opcode::nc_matmul: return exec_matmul(m, inst);
    case Opcode::nc_transpose: return exec_transpose(m, inst);
    case Opcode::memset: return exec_memset(m, inst);
    case Opcode::iota:
    case Opcode::affine_select: return exec_affine(m, inst);
    case Opcode::bn_stats: return exec_bn_stats(m, inst);
    case Opcode::bn_aggr: return exec_bn_aggr(m, inst);
    case Opcode::tensor_tensor_scan: return exec_scan(m, inst);
    case Opcode::reciprocal: return exec_reciprocal(m, inst);
    case Opcode::tensor_copy_predicated: return exec_copy_predicated(m, inst);
    case Opcode::select_reduce: return exec_select_reduce(m, inst);
    case Opcode::max8: return exec_max8(m, inst);
    case Opcode::nc_find_index8: return exec_find_index8(m, inst);
    case Opcode::tensor_partition_reduce: return exec_partition_reduce(m, inst);
    case Opcode::nc_stream_shuffle: return exec_stream_shuffle(m, inst);
    case Opcode::nc_match_replace8: return exec_match_replace8(m, inst);
    case Opcode::range_select: return exec_range_select(m, inst);
    case Opcode::nc_n_gather: return exec_n_gather(m, inst);
    case Opcode::local_gather: return exec_local_gather(m, inst);
    case Opcode::nonzero_with_count: return exec_nonzero_with_count(m, inst);
    case Opcode::dma_compute: return exec_dma_compute(m, inst);
    case Opcode::register_move:
      m.reg(inst.operands[0].reg()) = scalar_value(m, inst.operands[1]);
      return;
    case Opcode::register_load: {
      Elements src = m.operand(inst, 1);
      m.reg(inst.operands[0].reg()) = is_integer(src.dtype) ? src.get_int(0, 0) : std::llrint(src.get(0, 0));
      return;
    }
    case Opcode::register_store: {
      Elements dst = m.operand(inst, 0);
      numerics::store_saturated(dst.dtype, dst.ptr[0], m.reg(inst.operands[1].reg()));
      return;
    }
    case Opcode::loop_begin: {
      const int64_t lower = scalar_value(m, inst.operands[1]), upper = scalar_value(m, inst.operands[2]);
      m.reg(inst.operands[0].reg()) = lower;
      if (lower >= upper) pc = static_cast<size_t>(m.kernel().rare(inst).jump);  // skip the body
      return;
    }
    case Opcode::loop_end: {
      const Instruction& begin = m.kernel().instructions[m.kernel().rare(inst).jump];
      int64_t& counter = m.reg(begin.operands[0].reg());
      counter += m.kernel().rare(begin).step;
      if (counter < scalar_value(m, begin.operands[2])) pc = static_cast<size_t>(m.kernel().rare(inst).jump);
      return;
    }
    case Opcode::device_print: return exec_device_print(m, inst);
    case Opcode::core_barrier:
    case Opcode::sendrecv:
      // Executors stop at these and the launch completes them (runtime/launch.hpp).
      internal_check(false, "a meeting instruction reached the reference semantics");
  }
}

}  // namespace nikki::runtime::reference
