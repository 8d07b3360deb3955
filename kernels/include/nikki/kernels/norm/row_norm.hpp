// What layernorm and rmsnorm share, forward and backward: rows mapped onto partitions in large
// DMA-friendly groups, the plan that sizes the groups and rings against SBUF, gamma (and beta)
// laid out for the transposed domain, and the staging of the per-row statistics in HBM.
//
// Rows: partition q owns the contiguous rows [q*Rp, (q+1)*Rp) of the first 128*Rp rows
// (Rp = R / 128), so one DMA moves k whole rows per partition as one contiguous run each, and each
// partition's mean/rstd are contiguous in HBM: up to 512 rows per partition of them move in one
// DMA. The last R % 128 rows form one tail group of one row per partition.
//
// The kernels (row_norm_forward.hpp, row_norm_backward.hpp) record their work as tasks of the
// toolkit's task scheduler; every tile several groups or chunks have in flight is a slot of a ring
// allocated up front, and the plan decides the rings' depths.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels::norm_detail {

using toolkit::first;

enum class Kind { layer, rms };

inline const char* kind_name(Kind k) { return k == Kind::layer ? "layernorm" : "rmsnorm"; }

/** @brief A group of rows processed together: p partitions x k rows per partition. */
struct RowGroup {
  int64_t p = 0;
  int64_t k = 0;
  int64_t j0 = 0;       // first row of the group within each partition's block (main body)
  bool tail = false;    // one row per partition: rows [main_rows, main_rows + p)
  int64_t main_rows = 0;
  int64_t rows_per_partition = 0;
  int64_t partitions = 0;

  /** @brief The [p, k, H] HBM view of this group's rows of an [R, H] tensor. */
  Tensor rows(const Tensor& t) const {
    const int64_t H = t.shape()[1];
    if (tail) return t(nl::ds(main_rows, p), nl::all).reshape({p, 1, H});
    return t(nl::ds(0, main_rows), nl::all)
        .reshape({partitions, rows_per_partition, H})(nl::all, nl::ds(j0, k), nl::all);
  }
  /** @brief The [p, k] HBM view of this group's entries of an [R] tensor. */
  Tensor stats(const Tensor& t) const {
    if (tail) return t(nl::ds(main_rows, p)).reshape({p, 1});
    return t(nl::ds(0, main_rows)).reshape({partitions, rows_per_partition})(nl::all, nl::ds(j0, k));
  }
};

/** @brief The groups covering rows [0, R): main-body groups of k rows per partition, then the tail. */
inline std::vector<RowGroup> row_groups(int64_t R, int64_t P, int64_t k) {
  std::vector<RowGroup> groups;
  const int64_t rp = R / P, main_rows = rp * P;
  for (int64_t j0 = 0; j0 < rp; j0 += k)
    groups.push_back({P, std::min(k, rp - j0), j0, false, main_rows, rp, P});
  if (R > main_rows) groups.push_back({R - main_rows, 1, 0, true, main_rows, rp, P});
  return groups;
}

inline bool is_norm_float(DType d) { return d == DType::float32 || d == DType::bfloat16 || d == DType::float16; }

/** @brief Checks x [R, H] and the per-column vectors [H]. */
inline void check_inputs(const ArgumentCheck& check, const Tensor& x, std::initializer_list<const Tensor*> vectors) {
  check.require(x.ndim() == 2, "x must be 2-D [R, H], got shape " + x.shape().str(),
                "flatten the leading dims into rows: x.reshape(-1, H)");
  check.require(is_norm_float(x.dtype()),
                "x must be float32, bfloat16 or float16, got " + std::string(dtype_name(x.dtype())));
  const int64_t H = x.shape()[1];
  for (const Tensor* v : vectors) {
    check.require(v->ndim() == 1 && v->shape()[0] == H,
                  "'" + v->name() + "' must have shape [" + std::to_string(H) + "], got " + v->shape().str());
    check.require(is_norm_float(v->dtype()), "'" + v->name() + "' must be float32, bfloat16 or float16, got " +
                                                 std::string(dtype_name(v->dtype())));
  }
}

/** @brief The column chunk (one PSUM bank of fp32: 512 columns) a transpose or a row sum covers. */
inline int64_t chunk_width() { return nl::tile_size().psum_bank_fmax; }

/** @brief A ring a kernel will allocate, described before allocating so plans can be sized. */
struct RingShape {
  Shape tile;  // [partitions, ...]
  DType dtype = DType::float32;
  int64_t depth = 1;
  std::string name;

  int64_t bytes() const { return depth * tile.num_elements() / tile[0] * dtype_size(dtype); }
  toolkit::Ring allocate(toolkit::Budget& budget) const { return budget.sbuf_ring(tile, dtype, depth, name); }
};

/** @brief Per-partition bytes of a set of rings. */
inline int64_t total_bytes(std::initializer_list<const RingShape*> rings) {
  int64_t b = 0;
  for (const RingShape* r : rings) b += r->bytes();
  return b;
}

/** @brief How a kernel covers x: rows per group, tiles in flight, and output segments. */
struct Plan {
  int64_t k = 1;          // rows per partition per group
  int64_t depth = 2;      // input tiles in flight: whole groups (resident) or segments (streamed)
  bool resident = true;   // whole rows stay in SBUF; else each group reads x twice, a segment at a time
  int64_t segment = 0;    // columns per output store (and per streamed input segment)
};

/**
 * @brief Picks the plan whose rings fit `budget`: `footprint(plan)` is what the kernel's rings
 * take for it. Groups of >= 8 KiB per partition keep the per-descriptor DMA overhead to a few
 * percent; deeper rings let loads run further ahead, which matters more than bigger groups, so
 * depth is given up last. `loads_ahead_bytes` (0: no limit) caps what the loads ahead hold per
 * partition beyond double buffering: once two groups of that size keep the DMA queues busy, more
 * loads queued ahead only hold back the stores, and the last stores then drain alone at the
 * end. Rows too wide for two whole tiles are streamed: as wide a segment as fits, in whole
 * bn_stats and transpose chunks.
 */
template <class Footprint>
Plan plan_rows(const toolkit::Budget& budget, int64_t R, int64_t H, int64_t row_bytes, Footprint&& footprint,
               int64_t loads_ahead_bytes = 0) {
  const nl::TileSize ts = nl::tile_size();
  const int64_t rp = std::max<int64_t>(R / ts.pmax, 1);
  // At most one staging tile of per-row statistics (512 rows per partition) per group.
  const int64_t want_k = std::max<int64_t>(1, std::min<int64_t>({rp, int64_t(512), ceil_div(8 * 1024, row_bytes)}));
  Plan plan;
  plan.segment = std::min<int64_t>(H, 4096);
  for (int64_t depth : {4, 3, 2})
    for (int64_t k = want_k; k >= 1; k = k > 8 ? k / 2 : k - 1) {
      if (depth > 2 && loads_ahead_bytes > 0 && depth * k * row_bytes > loads_ahead_bytes) continue;
      plan.k = k;
      plan.depth = depth;
      if (budget.fits(footprint(plan))) return plan;
    }
  plan.k = 1;
  plan.depth = 3;
  plan.resident = false;
  const int64_t unit = std::lcm(ts.bn_stats_fmax, ts.psum_bank_fmax);
  for (plan.segment = std::min<int64_t>(ceil_div(H, unit) * unit, 8192); plan.segment > unit; plan.segment -= unit)
    if (budget.fits(footprint(plan))) break;
  return plan;
}

/** @brief The HBM view [P, n] of an [R] statistic's main-body entries j0 .. j0 + n of every partition. */
inline Tensor stat_columns(const Tensor& t, int64_t partitions, int64_t rows_per_partition, int64_t j0, int64_t n) {
  return t(nl::ds(0, partitions * rows_per_partition)).reshape({partitions, rows_per_partition})(nl::all,
                                                                                                   nl::ds(j0, n));
}

/**
 * @brief Where each group's per-row statistics live in SBUF: main-body groups share staging tiles
 * of up to 512 rows per partition (one DMA per partition run moves them, where a DMA per group
 * would pay the per-descriptor overhead for every 4-byte run), the tail group has its own.
 */
struct StatStaging {
  int64_t partitions = 0, rows_per_partition = 0;
  int64_t cols = 0;  // rows per partition of one stage, a multiple of the group size

  StatStaging(int64_t R, int64_t P, int64_t k)
      : partitions(P), rows_per_partition(R / P),
        cols(std::min(R / P, std::max<int64_t>(k, int64_t(512) / k * k))) {}

  /** @brief Whether group g starts a stage (its first group). */
  bool opens(const RowGroup& g) const { return !g.tail && g.j0 % cols == 0; }
  /** @brief Whether group g ends a stage (its last group). */
  bool closes(const RowGroup& g) const {
    return !g.tail && ((g.j0 + g.k) % cols == 0 || g.j0 + g.k == rows_per_partition);
  }
  /** @brief The first row per partition of g's stage and how many it holds. */
  int64_t start(const RowGroup& g) const { return g.j0 / cols * cols; }
  int64_t width(const RowGroup& g) const { return std::min(cols, rows_per_partition - start(g)); }
  /** @brief The [p, k] columns of group g within its stage tile. */
  Tensor columns(const Tensor& stage, const RowGroup& g) const { return stage(nl::all, nl::ds(g.j0 - start(g), g.k)); }
  /** @brief The HBM entries of an [R] statistic that g's stage holds, as [P, width]. */
  Tensor hbm(const Tensor& t, const RowGroup& g) const {
    return stat_columns(t, partitions, rows_per_partition, start(g), width(g));
  }
};

/** @brief Per-row values of a group, [p, k] fp32 (mean and nb only for layernorm). */
struct RowScalars {
  Tensor mean, rstd, nb;
  /** @brief The [p, 1] values of the group's row j. */
  RowScalars row(int64_t j) const {
    auto col = [&](const Tensor& t) { return t.valid() ? t(nl::all, nl::ds(j, 1)) : Tensor{}; };
    return {col(mean), col(rstd), col(nb)};
  }
};

/** @brief Whether rows are centred by subtracting the mean first: fp32 rows, as torch does, so
 *  rows whose mean is large against their spread keep every bit. 16-bit rows take x * rstd + nb,
 *  whose error (about 2^-24 |mean| rstd) is far below the output's rounding, and which the Scalar
 *  engine can run too. */
inline bool subtracts_mean(Kind kind, DType x_dtype) { return kind == Kind::layer && x_dtype == DType::float32; }

/** @brief y = (x - mean) * rstd into fp32 (rmsnorm: x * rstd), for one row ([p, 1] scalars), on
 *  the Vector engine or (unless subtracts_mean) the Scalar engine: the same instruction and bits. */
inline void center(Kind kind, const Tensor& y, const Tensor& x, const RowScalars& r, Engine engine) {
  if (kind == Kind::rms) isa::tensor_scalar(y, x, nl::multiply, r.rstd, {.engine = engine});
  else if (subtracts_mean(kind, x.dtype()))
    isa::tensor_scalar(y, x, nl::subtract, r.mean, {.op1 = nl::multiply, .operand1 = r.rstd, .engine = engine});
  else isa::tensor_scalar(y, x, nl::multiply, r.rstd, {.op1 = nl::add, .operand1 = r.nb, .engine = engine});
}

/** @brief dst = src out of PSUM on the Vector or the Scalar engine (as an activation: trn1's Scalar
 *  engine has no tensor_copy). */
inline void copy_out(const Tensor& dst, const Tensor& src, Engine engine) {
  if (engine == Engine::scalar) isa::activation(dst, nl::copy, src);
  else isa::tensor_copy(dst, src, isa::vector_engine);
}

/**
 * @brief gamma (and beta) of shape [H] laid out for the transposed domain: column b of the
 * [min(H, 128), ceil(H / 128)] fp32 tile holds elements [128 b, 128 b + 128), one per partition.
 * Whole blocks are loaded as contiguous rows and turned around on the TensorE; a DMA whose every
 * element is its own descriptor would cost H descriptors instead. Records the work as tasks.
 */
class ColumnBlocks {
 public:
  /** Reserves the transposed tile and the staging it needs. */
  ColumnBlocks(toolkit::Budget& budget, int64_t H, const std::string& name) : H_(H) {
    const int64_t P = nl::tile_size().pmax;
    cols_ = budget.sbuf({std::min(H, P), ceil_div(H, P)}, nl::float32, name);
    if (H >= P) rows_ = budget.sbuf({std::min(H / P, P), P}, nl::float32, name + "_rows");
  }
  /** Loads v [H] into the columns; `psum` is a [P, >= min(H / 128, 128)] fp32 PSUM tile. */
  void load(toolkit::TaskScheduler& sch, const Tensor& v, const Tensor& psum) const {
    const int64_t P = nl::tile_size().pmax;
    const int64_t full = H_ / P, rem = H_ % P;
    for (int64_t b0 = 0; b0 < full; b0 += P) {
      const int64_t n = std::min(P, full - b0);
      const Tensor rows = rows_(first(n), nl::all), t = psum(nl::all, first(n));
      sch.add([&] { isa::dma_copy(rows, v(nl::ds(b0 * P, n * P)).reshape({n, P})); });
      sch.add([&] { isa::nc_transpose(t, rows, isa::tensor_engine); });
      sch.add([&] { isa::tensor_copy(cols_(nl::all, nl::ds(b0, n)), t, isa::vector_engine); });
    }
    if (rem)
      sch.add([&] { isa::dma_copy(cols_(first(rem), nl::ds(full, 1)), v(nl::ds(full * P, rem)).reshape({rem, 1})); });
  }
  /** @brief The [w, 1] column of block `blk` (columns [128 blk, 128 blk + w)). */
  Tensor block(int64_t blk, int64_t w) const { return cols_(first(w), nl::ds(blk, 1)); }

 private:
  int64_t H_;
  Tensor cols_, rows_;
};

}  // namespace nikki::kernels::norm_detail
