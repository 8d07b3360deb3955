// nikki::nl — the C++ spelling of nki.language: dtypes, buffers, operators, tensor creation,
// tile sizes and SPMD program ids.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "nikki/tensor.hpp"

namespace nikki::nl {

// --- dtypes -------------------------------------------------------------------------------
inline constexpr DType float32 = DType::float32;
inline constexpr DType bfloat16 = DType::bfloat16;
inline constexpr DType float16 = DType::float16;
inline constexpr DType tfloat32 = DType::tfloat32;
inline constexpr DType float8_e4m3 = DType::float8_e4m3;
inline constexpr DType float8_e4m3fn = DType::float8_e4m3fn;
inline constexpr DType float8_e5m2 = DType::float8_e5m2;
inline constexpr DType int8 = DType::int8;
inline constexpr DType int16 = DType::int16;
inline constexpr DType int32 = DType::int32;
inline constexpr DType uint8 = DType::uint8;
inline constexpr DType uint16 = DType::uint16;
inline constexpr DType uint32 = DType::uint32;
inline constexpr DType bool_ = DType::bool_;

// --- buffers ------------------------------------------------------------------------------
inline constexpr Buffer sbuf = Buffer::sbuf;
inline constexpr Buffer psum = Buffer::psum;
inline constexpr Buffer hbm = Buffer::hbm;
inline constexpr Buffer shared_hbm = Buffer::shared_hbm;
inline constexpr Buffer private_hbm = Buffer::private_hbm;

/**
 * @brief An NKI operator name such as nl.add or nl.exp. Some names are both an ALU operator and
 * an activation function (nl.abs, nl.square, nl.relu, nl.rsqrt, nl.reciprocal); each instruction
 * takes the role it needs and reports a clear error when the name has no such role.
 */
struct Op {
  std::string_view name;
  int8_t alu = -1;  // AluOp, or -1
  int8_t act = -1;  // ActFunc, or -1

  constexpr bool has_alu() const { return alu >= 0; }
  constexpr bool has_act() const { return act >= 0; }
  constexpr AluOp alu_op() const { return static_cast<AluOp>(alu); }
  constexpr ActFunc act_func() const { return static_cast<ActFunc>(act); }
};

namespace detail {
constexpr Op alu(AluOp op) { return {alu_op_name(op), static_cast<int8_t>(op), -1}; }
constexpr Op act(ActFunc f) { return {act_func_name(f), -1, static_cast<int8_t>(f)}; }
constexpr Op both(AluOp op, ActFunc f) {
  return {alu_op_name(op), static_cast<int8_t>(op), static_cast<int8_t>(f)};
}
}  // namespace detail

// ALU operators
inline constexpr Op add = detail::alu(AluOp::add);
inline constexpr Op subtract = detail::alu(AluOp::subtract);
inline constexpr Op multiply = detail::alu(AluOp::multiply);
inline constexpr Op divide = detail::alu(AluOp::divide);
inline constexpr Op maximum = detail::alu(AluOp::maximum);
inline constexpr Op minimum = detail::alu(AluOp::minimum);
inline constexpr Op power = detail::alu(AluOp::power);
inline constexpr Op mod = detail::alu(AluOp::mod);
inline constexpr Op fmod = detail::alu(AluOp::fmod);
inline constexpr Op abs_max = detail::alu(AluOp::abs_max);
inline constexpr Op abs_min = detail::alu(AluOp::abs_min);
inline constexpr Op equal = detail::alu(AluOp::equal);
inline constexpr Op not_equal = detail::alu(AluOp::not_equal);
inline constexpr Op greater = detail::alu(AluOp::greater);
inline constexpr Op greater_equal = detail::alu(AluOp::greater_equal);
inline constexpr Op less = detail::alu(AluOp::less);
inline constexpr Op less_equal = detail::alu(AluOp::less_equal);
inline constexpr Op logical_and = detail::alu(AluOp::logical_and);
inline constexpr Op logical_or = detail::alu(AluOp::logical_or);
inline constexpr Op logical_xor = detail::alu(AluOp::logical_xor);
inline constexpr Op bitwise_and = detail::alu(AluOp::bitwise_and);
inline constexpr Op bitwise_or = detail::alu(AluOp::bitwise_or);
inline constexpr Op bitwise_xor = detail::alu(AluOp::bitwise_xor);
inline constexpr Op left_shift = detail::alu(AluOp::left_shift);
inline constexpr Op right_shift = detail::alu(AluOp::right_shift);
inline constexpr Op invert = detail::alu(AluOp::invert);
inline constexpr Op negative = detail::alu(AluOp::negate);
inline constexpr Op average = detail::alu(AluOp::average);
// names that are both an ALU operator and an activation function
inline constexpr Op abs = detail::both(AluOp::abs, ActFunc::abs);
inline constexpr Op square = detail::both(AluOp::square, ActFunc::square);
inline constexpr Op relu = detail::both(AluOp::relu, ActFunc::relu);
inline constexpr Op rsqrt = detail::both(AluOp::rsqrt, ActFunc::rsqrt);
inline constexpr Op reciprocal = detail::both(AluOp::reciprocal, ActFunc::reciprocal);
// activation functions
inline constexpr Op copy = detail::act(ActFunc::copy);
inline constexpr Op identity = detail::act(ActFunc::copy);
inline constexpr Op sigmoid = detail::act(ActFunc::sigmoid);
inline constexpr Op gelu = detail::act(ActFunc::gelu);
inline constexpr Op gelu_dx = detail::act(ActFunc::gelu_dx);
inline constexpr Op gelu_apprx_tanh = detail::act(ActFunc::gelu_apprx_tanh);
inline constexpr Op gelu_apprx_sigmoid = detail::act(ActFunc::gelu_apprx_sigmoid);
inline constexpr Op gelu_apprx_sigmoid_dx = detail::act(ActFunc::gelu_apprx_sigmoid_dx);
inline constexpr Op silu = detail::act(ActFunc::silu);
inline constexpr Op silu_dx = detail::act(ActFunc::silu_dx);
inline constexpr Op tanh = detail::act(ActFunc::tanh);
inline constexpr Op softplus = detail::act(ActFunc::softplus);
inline constexpr Op mish = detail::act(ActFunc::mish);
inline constexpr Op erf = detail::act(ActFunc::erf);
inline constexpr Op erf_dx = detail::act(ActFunc::erf_dx);
inline constexpr Op exp = detail::act(ActFunc::exp);
inline constexpr Op log = detail::act(ActFunc::log);
inline constexpr Op sin = detail::act(ActFunc::sin);
inline constexpr Op arctan = detail::act(ActFunc::arctan);
inline constexpr Op sqrt = detail::act(ActFunc::sqrt);
inline constexpr Op sign = detail::act(ActFunc::sign);

// --- creation -----------------------------------------------------------------------------

/** @brief Uninitialized tensor (reads before writes see NaN / 4 sentinels). */
inline Tensor ndarray(const Shape& shape, DType dtype, Buffer buffer = sbuf, std::string_view name = {},
                      std::optional<Address> address = std::nullopt, Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  LocId l = b.location(loc);
  if (shape.empty())
    throw KernelError("nl.ndarray needs at least one dim", b.source(l), "ndarray", {},
                      "give the tensor a shape such as (128, 512)");
  for (int64_t e : shape)
    if (e < 1)
      throw KernelError(fmt::format("nl.ndarray shape {} has a non-positive extent", shape.str()), b.source(l),
                        "ndarray", "every extent must be >= 1", {});
  if (address && !is_on_chip(buffer))
    throw KernelError(fmt::format("address= is only meaningful for sbuf and psum tensors, not {}", buffer_name(buffer)),
                      b.source(l), "ndarray", {}, "drop address= for HBM tensors");
  StorageRole role = buffer == shared_hbm ? StorageRole::output : StorageRole::scratch;
  StorageId id = b.add_storage(name, buffer, dtype, shape, role, l, address);
  return Tensor(&b, full_view(id, dtype, shape));
}

/** @brief The target's tile-size constants (nl.tile_size). */
struct TileSize {
  int64_t pmax;
  int64_t psum_fmax;
  int64_t psum_bank_fmax;
  int64_t psum_bank_fmax_bytes;
  int64_t psum_num_banks;
  int64_t gemm_stationary_fmax;
  int64_t gemm_moving_fmax;
  int64_t bn_stats_fmax;
  int64_t sbuf_fmax_bytes;
  int64_t sbuf_fmax;
  int64_t sbuf_size_bytes;
};

inline TileSize tile_size_of(const TargetConfig& t) {
  return {.pmax = t.num_partitions,
          .psum_fmax = t.psum_bank_fp32_elems(),
          .psum_bank_fmax = t.psum_bank_fp32_elems(),
          .psum_bank_fmax_bytes = t.psum_bank_bytes,
          .psum_num_banks = t.psum_num_banks,
          .gemm_stationary_fmax = t.gemm_stationary_fmax,
          .gemm_moving_fmax = t.gemm_moving_fmax,
          .bn_stats_fmax = t.bn_stats_fmax,
          .sbuf_fmax_bytes = t.sbuf_bytes_per_partition,
          .sbuf_fmax = t.sbuf_bytes_per_partition / 4,
          .sbuf_size_bytes = int64_t(t.sbuf_physical_bytes_per_partition) * t.num_partitions};
}

/** @brief Tile sizes of the target of the kernel being traced. */
inline TileSize tile_size(Loc loc = Loc::current()) { return tile_size_of(KernelBuilder::current(loc).config()); }

/** @brief This program instance's coordinate along `axis` of the SPMD grid (0 without a grid). */
inline int64_t program_id(int axis = 0, Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  const ProgramGrid& g = b.grid();
  if (g.dims.empty() && axis == 0) return 0;
  if (axis < 0 || axis >= static_cast<int>(g.dims.size()))
    throw KernelError(fmt::format("program_id({}) is out of range for a launch grid of {} dims", axis, g.dims.size()),
                      b.source(b.location(loc)), "program_id", {}, "launch the kernel with a grid: kernel[g0, g1](...)");
  return g.program_ids[axis];
}

/** @brief Number of program instances along `axis` (1 without a grid). */
inline int64_t num_programs(int axis = 0, Loc loc = Loc::current()) {
  KernelBuilder& b = KernelBuilder::current(loc);
  const ProgramGrid& g = b.grid();
  if (g.dims.empty() && axis == 0) return 1;
  if (axis < 0 || axis >= static_cast<int>(g.dims.size()))
    throw KernelError(fmt::format("num_programs({}) is out of range for a launch grid of {} dims", axis, g.dims.size()),
                      b.source(b.location(loc)), "num_programs", {}, {});
  return g.dims[axis];
}

/** @brief Number of grid dims. */
inline int program_ndim(Loc loc = Loc::current()) {
  return static_cast<int>(KernelBuilder::current(loc).grid().dims.size());
}

/** @brief Slice [start, start + size) (nl.ds); an end past int64 stays out of bounds instead of wrapping. */
inline Slice ds(int64_t start, int64_t size) {
  return Slice{start, checked_add(start, size).value_or(std::numeric_limits<int64_t>::max()), 1};
}

/** @brief The whole dim (Python's ':'). */
inline constexpr Slice all{};

}  // namespace nikki::nl
