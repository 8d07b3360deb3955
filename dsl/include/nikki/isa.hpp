// nikki::isa — the C++ spelling of nki.isa in its current destination-passing form:
// every instruction writes `dst`, the first parameter. Parameter names and defaults follow NKI.
//
// These functions only record instructions; the hardware rules (buffers, partition limits,
// dtypes, shapes) are checked by the verifier when the kernel is compiled, with the same errors
// for C++ and Python kernels.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "nikki/nl.hpp"

namespace nikki::isa {

inline constexpr Engine unknown_engine = Engine::unknown;
inline constexpr Engine tensor_engine = Engine::tensor;
inline constexpr Engine vector_engine = Engine::vector;
inline constexpr Engine scalar_engine = Engine::scalar;
inline constexpr Engine gpsimd_engine = Engine::gpsimd;

/** @brief An operand that is either an immediate or a tensor (scale=, operand0=, ...). */
class Scalar {
 public:
  Scalar(double v) : value_(v) {}
  Scalar(float v) : value_(double(v)) {}
  Scalar(int v) : value_(double(v)) {}
  Scalar(int64_t v) : value_(double(v)) {}
  Scalar(Tensor t) : value_(std::move(t)) {}
  bool is_tensor() const { return std::holds_alternative<Tensor>(value_); }
  const Tensor& tensor() const { return std::get<Tensor>(value_); }
  double value() const { return std::get<double>(value_); }

 private:
  std::variant<double, Tensor> value_;
};

namespace detail {

/** @brief Collects operands of one instruction and appends it to their kernel. */
class Emitter {
 public:
  Emitter(Opcode op, const Tensor& anchor, const Loc& loc) {
    if (!anchor.valid())
      throw KernelError(fmt::format("{}: dst is an empty tensor handle", opcode_name(op)), SourceLocation::from(loc));
    builder_ = &anchor.builder();
    inst_.opcode = op;
    inst_.loc = builder_->location(loc);
  }
  Emitter& tensor(int slot, const Tensor& t) {
    check_same_kernel(slot, t);
    inst_.operands[slot] = builder_->operand(t.access());
    return *this;
  }
  Emitter& tensor(int slot, const std::optional<Tensor>& t) {
    if (t) tensor(slot, *t);
    return *this;
  }
  Emitter& scalar(int slot, const Scalar& s) {
    if (s.is_tensor()) return tensor(slot, s.tensor());
    inst_.operands[slot] = Operand::immediate(s.value());
    return *this;
  }
  Emitter& scalar(int slot, const std::optional<Scalar>& s) {
    if (s) scalar(slot, *s);
    return *this;
  }
  Emitter& imm(int slot, double v) {
    inst_.operands[slot] = Operand::immediate(v);
    return *this;
  }
  Emitter& engine(Engine e) {
    inst_.engine = e;
    return *this;
  }
  Attributes& attrs() { return inst_.attrs; }
  RareAttributes& rare() { return builder_->rare(inst_); }

  /** @brief The ALU role of an operator name, or an error naming the parameter. */
  AluOp alu(const nl::Op& op, const char* param) const {
    if (!op.has_alu())
      fail(fmt::format("{}={} is an activation function, not an ALU operator", param, op.name),
           "use an ALU operator such as nl.add, nl.multiply or nl.maximum");
    return op.alu_op();
  }
  /** @brief The activation role of an operator name, or an error naming the parameter. */
  ActFunc act(const nl::Op& op, const char* param) const {
    if (!op.has_act())
      fail(fmt::format("{}={} is an ALU operator, not an activation function", param, op.name),
           "use an activation function such as nl.exp, nl.copy or nl.gelu");
    return op.act_func();
  }
  [[noreturn]] void fail(std::string what, std::string hint) const {
    throw KernelError(fmt::format("{}: {}", opcode_name(inst_.opcode), what), builder_->source(inst_.loc),
                      std::string(opcode_name(inst_.opcode)), {}, std::move(hint));
  }

  void emit() { builder_->append(std::move(inst_)); }

 private:
  void check_same_kernel(int slot, const Tensor& t) const {
    if (!t.valid())
      fail(fmt::format("operand '{}' is an empty tensor handle", inst_.spec().slots[slot].name), {});
    if (&t.builder() != builder_)
      fail(fmt::format("operand '{}' (tensor '{}') belongs to a different kernel", inst_.spec().slots[slot].name,
                       t.name()),
           "tensors cannot be shared between kernels");
  }

  KernelBuilder* builder_ = nullptr;
  Instruction inst_;
};

}  // namespace detail

// --- data movement ------------------------------------------------------------------------

/** @brief Options of the DMA instructions. */
struct DmaOptions {
  /** Elements whose runtime address (a scalar_offset or vector_offset view) falls outside their
   *  tensor are not transferred (NKI oob_mode=skip); when false such an address is a runtime error. */
  bool oob_skip = false;
};

/** @brief Copies src to dst through a DMA queue; dtypes convert through fp32. */
inline void dma_copy(const Tensor& dst, const Tensor& src, const DmaOptions& o, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::dma_copy, dst, loc);
  e.attrs().oob_skip = o.oob_skip;
  e.tensor(0, dst).tensor(1, src).emit();
}
inline void dma_copy(const Tensor& dst, const Tensor& src, Loc loc = Loc::current()) { dma_copy(dst, src, {}, loc); }

/** @brief dst = srcs[0] + srcs[1] + ... (1 to 4 sources, in fp32) inside the DMA engines; a source
 * may be dst itself (read-modify-write). */
inline void dma_compute(const Tensor& dst, const std::vector<Tensor>& srcs, const DmaOptions& o,
                        Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::dma_compute, dst, loc);
  if (srcs.empty() || srcs.size() > size_t(kMaxSlots - 1))
    throw KernelError(fmt::format("dma_compute: {} sources; it combines 1 to {}", srcs.size(), kMaxSlots - 1),
                      SourceLocation::from(loc));
  e.attrs().op0 = AluOp::add;
  e.attrs().oob_skip = o.oob_skip;
  e.tensor(0, dst);
  for (size_t i = 0; i < srcs.size(); ++i) e.tensor(int(i) + 1, srcs[i]);
  e.emit();
}
inline void dma_compute(const Tensor& dst, const std::vector<Tensor>& srcs, Loc loc = Loc::current()) {
  dma_compute(dst, srcs, {}, loc);
}

/** @brief Element-wise copy on an engine (bit-exact when dtypes match). */
inline void tensor_copy(const Tensor& dst, const Tensor& src, Engine engine = unknown_engine,
                        Loc loc = Loc::current()) {
  detail::Emitter(Opcode::tensor_copy, dst, loc).tensor(0, dst).tensor(1, src).engine(engine).emit();
}

// --- element-wise -------------------------------------------------------------------------

/** @brief dst = op(data1, data2). */
inline void tensor_tensor(const Tensor& dst, const Tensor& data1, const Tensor& data2, const nl::Op& op,
                          Engine engine = unknown_engine, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_tensor, dst, loc);
  e.attrs().op0 = e.alu(op, "op");
  e.tensor(0, dst).tensor(1, data1).tensor(2, data2).engine(engine).emit();  // default: KernelBuilder::default_engine
}

/** @brief Optional parameters of tensor_scalar. */
struct TensorScalarOptions {
  bool reverse0 = false;
  std::optional<nl::Op> op1;
  std::optional<Scalar> operand1;
  bool reverse1 = false;
  Engine engine = unknown_engine;
};

/** @brief dst = (data op0 operand0) op1 operand1; reverse swaps an operator's operands. */
inline void tensor_scalar(const Tensor& dst, const Tensor& data, const nl::Op& op0, const Scalar& operand0,
                          const TensorScalarOptions& o = {}, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_scalar, dst, loc);
  e.attrs().op0 = e.alu(op0, "op0");
  e.attrs().reverse0 = o.reverse0;
  if (o.op1.has_value() != o.operand1.has_value())
    e.fail("op1 and operand1 must be given together", "pass both op1= and operand1=, or neither");
  if (o.op1) e.attrs().op1 = e.alu(*o.op1, "op1");
  e.attrs().reverse1 = o.reverse1;
  e.tensor(0, dst).tensor(1, data).scalar(2, operand0).scalar(3, o.operand1).engine(o.engine).emit();
}

/** @brief dst = (data op0 operand0) op1 operand1, where operand1 is a full tile. */
inline void scalar_tensor_tensor(const Tensor& dst, const Tensor& data, const nl::Op& op0, const Scalar& operand0,
                                 const nl::Op& op1, const Tensor& operand1, bool reverse0 = false,
                                 bool reverse1 = false, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::scalar_tensor_tensor, dst, loc);
  e.attrs().op0 = e.alu(op0, "op0");
  e.attrs().op1 = e.alu(op1, "op1");
  e.attrs().reverse0 = reverse0;
  e.attrs().reverse1 = reverse1;
  e.tensor(0, dst).tensor(1, data).scalar(2, operand0).tensor(3, operand1).emit();
}

/** @brief Optional parameters of activation. */
struct ActivationOptions {
  std::optional<Tensor> bias;  // [P, 1]
  Scalar scale = 1.0;          // immediate or [P, 1]
  std::optional<nl::Op> reduce_op;
  std::optional<Tensor> reduce_res;  // [P, 1]
  ReduceCmd reduce_cmd = ReduceCmd::idle;
};

/** @brief dst = op(data * scale + bias) on the Scalar engine, with an optional free-dim reduction. */
inline void activation(const Tensor& dst, const nl::Op& op, const Tensor& data, const ActivationOptions& o = {},
                       Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::activation, dst, loc);
  e.attrs().func = e.act(op, "op");
  if (o.reduce_op) e.attrs().reduce_op = e.alu(*o.reduce_op, "reduce_op");
  e.attrs().reduce_cmd = o.reduce_cmd;
  if (o.reduce_res && !o.reduce_op) e.fail("reduce_res needs reduce_op", "pass reduce_op=nl.add");
  if (o.reduce_res && o.reduce_cmd == ReduceCmd::idle) e.attrs().reduce_cmd = ReduceCmd::reset_reduce;
  e.tensor(0, dst).tensor(1, data).tensor(2, o.bias).scalar(3, o.scale).tensor(4, o.reduce_res).emit();
}

/** @brief activation followed by a free-dim reduction of its output into reduce_res ([P, 1]). */
inline void activation_reduce(const Tensor& dst, const nl::Op& op, const Tensor& data, const nl::Op& reduce_op,
                              const Tensor& reduce_res, std::optional<Tensor> bias = std::nullopt,
                              Scalar scale = 1.0, Loc loc = Loc::current()) {
  activation(dst, op, data,
             {.bias = std::move(bias), .scale = std::move(scale), .reduce_op = reduce_op, .reduce_res = reduce_res,
              .reduce_cmd = ReduceCmd::reset_reduce},
             loc);
}

/** @brief 1 / data on the Vector engine. */
inline void reciprocal(const Tensor& dst, const Tensor& data, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::reciprocal, dst, loc).tensor(0, dst).tensor(1, data).emit();
}

// --- reductions and scans -----------------------------------------------------------------

/** @brief Reduces `data` with `op` over the view dims listed in `axis` (never the partition dim). */
inline void tensor_reduce(const Tensor& dst, const nl::Op& op, const Tensor& data, std::vector<int> axis,
                          bool negate = false, bool keepdims = false, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_reduce, dst, loc);
  e.attrs().op0 = e.alu(op, "op");
  e.attrs().negate = negate;
  e.attrs().keepdims = keepdims;
  for (int a : axis) {
    int d = a < 0 ? a + data.ndim() : a;
    if (d < 0 || d >= data.ndim())
      e.fail(fmt::format("axis {} is out of range for data of rank {}", a, data.ndim()), {});
    e.attrs().axes |= 1u << d;
  }
  e.tensor(0, dst).tensor(1, data).emit();
}

/** @brief dst = data op0 operand0, and reduce_res = reduce_op over the free dims of dst. */
inline void tensor_scalar_reduce(const Tensor& dst, const Tensor& data, const nl::Op& op0, const Scalar& operand0,
                                 const nl::Op& reduce_op, const Tensor& reduce_res, bool reverse0 = false,
                                 Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_scalar_reduce, dst, loc);
  e.attrs().op0 = e.alu(op0, "op0");
  e.attrs().reduce_op = e.alu(reduce_op, "reduce_op");
  e.attrs().reverse0 = reverse0;
  e.tensor(0, dst).tensor(1, data).scalar(2, operand0).tensor(3, reduce_res).emit();
}

/** @brief Scan along the free dim: res[i] = (data0[i] op0 res[i-1]) op1 data1[i], res[-1] = initial. */
inline void tensor_tensor_scan(const Tensor& dst, const Tensor& data0, const Tensor& data1, const Scalar& initial,
                               const nl::Op& op0, const nl::Op& op1, bool reverse0 = false, bool reverse1 = false,
                               Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_tensor_scan, dst, loc);
  e.attrs().op0 = e.alu(op0, "op0");
  e.attrs().op1 = e.alu(op1, "op1");
  e.attrs().reverse0 = reverse0;
  e.attrs().reverse1 = reverse1;
  e.tensor(0, dst).tensor(1, data0).tensor(2, data1).scalar(3, initial).emit();
}

/** @brief Reduces across partitions (GpSimd). */
inline void tensor_partition_reduce(const Tensor& dst, const nl::Op& op, const Tensor& data,
                                    Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_partition_reduce, dst, loc);
  e.attrs().op0 = e.alu(op, "op");
  e.tensor(0, dst).tensor(1, data).emit();
}

// --- Tensor engine ------------------------------------------------------------------------

/** @brief Optional parameters of nc_matmul. */
struct MatmulOptions {
  bool is_stationary_onezero = false;
  bool is_moving_onezero = false;
  bool is_transpose = false;
  std::optional<bool> accumulate;  // nullopt: the first matmul into a PSUM location overwrites
};

/** @brief dst[m, n] (+)= sum_k stationary[k, m] * moving[k, n], accumulated in fp32 PSUM. */
inline void nc_matmul(const Tensor& dst, const Tensor& stationary, const Tensor& moving,
                      const MatmulOptions& o = {}, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::nc_matmul, dst, loc);
  e.attrs().accumulate = !o.accumulate ? Accumulate::automatic
                         : *o.accumulate ? Accumulate::accumulate
                                         : Accumulate::overwrite;
  e.attrs().is_transpose = o.is_transpose;
  e.attrs().is_stationary_onezero = o.is_stationary_onezero;
  e.attrs().is_moving_onezero = o.is_moving_onezero;
  e.tensor(0, dst).tensor(1, stationary).tensor(2, moving).emit();
}

/** @brief 2-D transpose (partition <-> free) on the Tensor engine (<= 128x128) or Vector engine (<= 32x32). */
inline void nc_transpose(const Tensor& dst, const Tensor& data, Engine engine = unknown_engine,
                         Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::nc_transpose, dst, loc);
  e.tensor(0, dst).tensor(1, data).engine(engine).emit();  // default: KernelBuilder::default_engine
}

// --- initialization and index generation --------------------------------------------------

/** @brief Fills dst with `value` (its type must suit dst's dtype). */
inline void memset(const Tensor& dst, double value, Engine engine = unknown_engine, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::memset, dst, loc).tensor(0, dst).imm(1, value).engine(engine).emit();
}

/** @brief dst[c, i...] = offset + c * channel_multiplier + sum(step_k * i_k), computed in int32. */
inline void iota(const Tensor& dst, std::vector<Dim> pattern, int64_t offset = 0, int64_t channel_multiplier = 0,
                 Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::iota, dst, loc);
  e.rare().pattern = std::move(pattern);
  e.rare().offset = offset;
  e.rare().channel_multiplier = channel_multiplier;
  e.tensor(0, dst).emit();
}

/** @brief dst = cmp_op(affine value, 0) ? on_true_tile : on_false_value (affine value as in iota). */
inline void affine_select(const Tensor& dst, std::vector<Dim> pattern, int64_t channel_multiplier,
                          const Tensor& on_true_tile, double on_false_value, const nl::Op& cmp_op = nl::equal,
                          int64_t offset = 0, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::affine_select, dst, loc);
  e.rare().pattern = std::move(pattern);
  e.rare().channel_multiplier = channel_multiplier;
  e.rare().offset = offset;
  e.attrs().cmp_op = e.alu(cmp_op, "cmp_op");
  e.tensor(0, dst).tensor(1, on_true_tile).imm(2, on_false_value).emit();
}

// --- statistics ---------------------------------------------------------------------------

/** @brief Per-partition statistics (count, mean, count*variance for the even and odd elements). */
inline void bn_stats(const Tensor& dst, const Tensor& data, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::bn_stats, dst, loc).tensor(0, dst).tensor(1, data).emit();
}

/** @brief Aggregates bn_stats outputs into (mean, variance) per partition. */
inline void bn_aggr(const Tensor& dst, const Tensor& data, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::bn_aggr, dst, loc).tensor(0, dst).tensor(1, data).emit();
}

// --- predication and selection ------------------------------------------------------------

/** @brief dst = predicate ? src : dst, element-wise (reverse_pred inverts the predicate). */
inline void tensor_copy_predicated(const Tensor& dst, const Scalar& src, const Tensor& predicate,
                                   bool reverse_pred = false, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::tensor_copy_predicated, dst, loc);
  e.attrs().reverse_pred = reverse_pred;
  e.tensor(0, dst).scalar(1, src).tensor(2, predicate).emit();
}

/** @brief Optional parameters of select_reduce. */
struct SelectReduceOptions {
  std::optional<Tensor> reduce_res;
  ReduceCmd reduce_cmd = ReduceCmd::idle;
  nl::Op reduce_op = nl::maximum;
  bool reverse_pred = false;
};

/** @brief dst = predicate ? on_true : on_false, with an optional reduction of dst into reduce_res. */
inline void select_reduce(const Tensor& dst, const Tensor& predicate, const Tensor& on_true, const Scalar& on_false,
                          const SelectReduceOptions& o = {}, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::select_reduce, dst, loc);
  e.attrs().reduce_op = e.alu(o.reduce_op, "reduce_op");
  e.attrs().reduce_cmd = o.reduce_cmd;
  if (o.reduce_res && o.reduce_cmd == ReduceCmd::idle) e.attrs().reduce_cmd = ReduceCmd::reset_reduce;
  e.attrs().reverse_pred = o.reverse_pred;
  e.tensor(0, dst).tensor(1, predicate).tensor(2, on_true).scalar(3, on_false).tensor(4, o.reduce_res).emit();
}

/** @brief The 8 largest values of each partition, in descending order. */
inline void max8(const Tensor& dst, const Tensor& src, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::max8, dst, loc).tensor(0, dst).tensor(1, src).emit();
}

/** @brief Index of the first occurrence of each of the 8 values `vals` in each partition of `data`. */
inline void nc_find_index8(const Tensor& dst, const Tensor& data, const Tensor& vals, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::nc_find_index8, dst, loc).tensor(0, dst).tensor(1, data).tensor(2, vals).emit();
}

/** @brief dst = data with the first occurrence of each of the 8 values `vals` replaced by `imm`;
 * their positions go to `dst_idx` when given. */
inline void nc_match_replace8(const Tensor& dst, const Tensor& data, const Tensor& vals, double imm,
                              const std::optional<Tensor>& dst_idx = std::nullopt, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::nc_match_replace8, dst, loc)
      .tensor(0, dst).tensor(1, data).tensor(2, vals).imm(3, imm).tensor(4, dst_idx).emit();
}

/** @brief Within each quadrant of 32 partitions, dst partition i = src partition shuffle_mask[i]
 * (kShuffleKeepLane leaves it unmodified). */
inline void nc_stream_shuffle(const Tensor& dst, const Tensor& src, std::vector<int32_t> shuffle_mask,
                              Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::nc_stream_shuffle, dst, loc);
  e.rare().lanes = std::move(shuffle_mask);
  e.tensor(0, dst).tensor(1, src).emit();
}

/** @brief Optional parameters of range_select. */
struct RangeSelectOptions {
  std::optional<Tensor> reduce_res;
  ReduceCmd reduce_cmd = ReduceCmd::idle;
  nl::Op reduce_op = nl::maximum;
  int64_t range_start = 0;
  double on_false_value = 0.0;
};

/** @brief dst[p, f] = on_true[p, f] where (f + range_start) comp_op0 bound0[p] and comp_op1
 * bound1[p], else on_false_value; optionally reduced into reduce_res (NeuronCore-v3+). */
inline void range_select(const Tensor& dst, const Tensor& on_true_tile, const nl::Op& comp_op0, const nl::Op& comp_op1,
                         const Scalar& bound0, const Scalar& bound1, const RangeSelectOptions& o = {},
                         Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::range_select, dst, loc);
  e.attrs().op0 = e.alu(comp_op0, "comp_op0");
  e.attrs().op1 = e.alu(comp_op1, "comp_op1");
  e.attrs().reduce_op = e.alu(o.reduce_op, "reduce_op");
  e.attrs().reduce_cmd = o.reduce_res && o.reduce_cmd == ReduceCmd::idle ? ReduceCmd::reset_reduce : o.reduce_cmd;
  e.rare().offset = o.range_start;
  e.rare().fill_value = o.on_false_value;
  e.tensor(0, dst).tensor(1, on_true_tile).scalar(2, bound0).scalar(3, bound1).tensor(4, o.reduce_res).emit();
}

/** @brief dst[p, j] = data[p, indices[p, j]] within each partition's flattened free elements (GpSimd). */
inline void nc_n_gather(const Tensor& dst, const Tensor& data, const Tensor& indices, Loc loc = Loc::current()) {
  detail::Emitter(Opcode::nc_n_gather, dst, loc).tensor(0, dst).tensor(1, data).tensor(2, indices).emit();
}

/** @brief Number of SBUF partitions one GpSimd core reads and writes (local_gather's groups). */
inline constexpr int64_t kPartitionsPerGpsimdCore = 16;

/**
 * @brief A gather within each GpSimd core's 16 partitions: the core flattens its 16 partitions of
 * `index` (uint16, partition dimension first), takes the first `num_valid_indices` of them, and
 * for every partition p of the core writes dst[p, j, e] = src_buffer[p, index_j + e] for
 * e < num_elem_per_idx (index_j counts elements of p's flattened free dims). dst has
 * num_valid_indices * num_elem_per_idx elements per partition; by default num_valid_indices is
 * every index of the core's slice.
 */
inline void local_gather(const Tensor& dst, const Tensor& src_buffer, const Tensor& index,
                         int64_t num_elem_per_idx = 1, std::optional<int64_t> num_valid_indices = std::nullopt,
                         Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::local_gather, dst, loc);
  e.rare().step = num_elem_per_idx;
  if (!num_valid_indices) {
    const Shape s = index.shape();
    const int64_t partitions = s.empty() || s[0] == 0 ? 1 : s[0];
    num_valid_indices = index.size() / partitions * kPartitionsPerGpsimdCore;
  }
  e.rare().offset = *num_valid_indices;
  e.tensor(0, dst).tensor(1, src_buffer).tensor(2, index).emit();
}

/** @brief On partitions 0, 16, ..., 112: the positions (+ index_offset) of src's nonzero elements,
 * padding_val for the rest, and the count last (GpSimd, NeuronCore-v3+). */
inline void nonzero_with_count(const Tensor& dst, const Tensor& src, int64_t index_offset = 0,
                               int64_t padding_val = -1, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::nonzero_with_count, dst, loc);
  e.rare().offset = index_offset;
  e.rare().fill_value = double(padding_val);
  e.tensor(0, dst).tensor(1, src).emit();
}

// --- where the program instances of a launch meet ---------------------------------------------

/** @brief Waits until the program instances `cores` of the launch (this one among them) have all
 * reached a core_barrier over the same cores, so that each sees the others' writes to shared HBM
 * (`data` names what they synchronize on). Instances outside the launch are not waited for. */
inline void core_barrier(const Tensor& data, const std::vector<int32_t>& cores, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::core_barrier, data, loc);
  e.rare().lanes = cores;
  e.engine(Engine::sync).tensor(0, data).emit();
}

/** @brief Sends src to program instance `send_to_rank`, whose dst receives it, and receives into dst
 * the src of instance `recv_from_rank`; each instance's n-th sendrecv meets its partners' n-th. */
inline void sendrecv(const Tensor& src, const Tensor& dst, int32_t send_to_rank, int32_t recv_from_rank,
                     int32_t pipe_id = 0, Loc loc = Loc::current()) {
  detail::Emitter e(Opcode::sendrecv, dst, loc);
  e.rare().lanes = {send_to_rank, recv_from_rank, pipe_id};
  e.engine(Engine::sync).tensor(0, dst).tensor(1, src).emit();
}

}  // namespace nikki::isa

// --- registers and runtime loops ------------------------------------------------------------

namespace nikki::isa {

/** @brief A 32-bit sequencer register (NKI VirtualRegister). */
struct Register {
  RegisterId id = -1;
  KernelBuilder* builder = nullptr;
};

/** @brief A register operand or an integer immediate. */
class RegisterOrInt {
 public:
  RegisterOrInt(int64_t v) : operand_(Operand::immediate(double(v))) {}
  RegisterOrInt(int v) : operand_(Operand::immediate(double(v))) {}
  RegisterOrInt(Register r) : operand_(Operand::reg_(r.id)) {}
  const Operand& operand() const { return operand_; }

 private:
  Operand operand_;
};

namespace detail {
inline Instruction control(Opcode op, KernelBuilder& b, const Loc& loc) {
  Instruction inst;
  inst.opcode = op;
  inst.engine = Engine::sync;
  inst.loc = b.location(loc);
  return inst;
}
}  // namespace detail

/** @brief A new register, optionally initialized. */
inline Register register_alloc(std::optional<int64_t> init = std::nullopt, Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  Register r{b.new_register(), &b};
  if (init) {
    Instruction inst = detail::control(Opcode::register_move, b, loc);
    inst.operands[0] = Operand::reg_(r.id);
    inst.operands[1] = Operand::immediate(double(*init));
    b.append(std::move(inst));
  }
  return r;
}

/** @brief dst = src (a register or an integer). */
inline void register_move(Register dst, RegisterOrInt src, Loc loc = Loc::current()) {
  Instruction inst = detail::control(Opcode::register_move, *dst.builder, loc);
  inst.operands[0] = Operand::reg_(dst.id);
  inst.operands[1] = src.operand();
  dst.builder->append(std::move(inst));
}

/** @brief dst = the value of a 1x1 tensor. */
inline void register_load(Register dst, const Tensor& src, Loc loc = Loc::current()) {
  Instruction inst = detail::control(Opcode::register_load, *dst.builder, loc);
  inst.operands[0] = Operand::reg_(dst.id);
  inst.operands[1] = dst.builder->operand(src.access());
  dst.builder->append(std::move(inst));
}

/** @brief Writes register src into a 1x1 tensor. */
inline void register_store(const Tensor& dst, Register src, Loc loc = Loc::current()) {
  Instruction inst = detail::control(Opcode::register_store, *src.builder, loc);
  inst.operands[0] = src.builder->operand(dst.access());
  inst.operands[1] = Operand::reg_(src.id);
  src.builder->append(std::move(inst));
}

}  // namespace nikki::isa

namespace nikki::nl {

/**
 * @brief A loop that runs on the device: `body(i)` is traced once and repeated at run time with
 * register i counting from lower to upper (exclusive) by step. State crosses iterations in tensors.
 */
template <class Body>
void fori_loop(isa::RegisterOrInt lower, isa::RegisterOrInt upper, Body&& body, int64_t step = 1,
               Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  if (step <= 0)
    throw KernelError(fmt::format("fori_loop step {} must be a positive compile-time integer", step),
                      b.source(b.location(loc)), "fori_loop", {}, {});
  isa::Register counter{b.new_register(), &b};
  Instruction begin = isa::detail::control(Opcode::loop_begin, b, loc);
  begin.operands[0] = Operand::reg_(counter.id);
  begin.operands[1] = lower.operand();
  begin.operands[2] = upper.operand();
  b.rare(begin).step = step;
  const auto begin_index = static_cast<int32_t>(b.kernel().instructions.size());
  b.append(std::move(begin));
  body(counter);
  Instruction end = isa::detail::control(Opcode::loop_end, b, loc);
  b.rare(end).jump = begin_index;
  const auto end_index = static_cast<int32_t>(b.kernel().instructions.size());
  b.append(std::move(end));
  b.set_jump(begin_index, end_index);
}

}  // namespace nikki::nl
