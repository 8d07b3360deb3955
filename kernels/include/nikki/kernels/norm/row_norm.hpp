// The machinery layernorm and rmsnorm share: rows mapped to partitions in large DMA-friendly
// groups, a software pipeline that overlaps the engines, and the forward and backward bodies.
//
// Forward, per group of rows (VectorE computes the statistics, ScalarE, TensorE and VectorE the
// output, GpSimd the per-row scalars):
//   VectorE  bn_stats over chunks of bn_stats_fmax, bn_aggr per row        -> mean, var
//   GpSimd   rstd = rsqrt(var + eps) (rms: mean^2 + var + eps), nb = -mean*rstd
//   ScalarE  y = x*rstd + nb (fp32), one column chunk at a time (fp32 x: VectorE (x - mean)*rstd)
//   TensorE  yT = transpose(y): columns of x now lie on partitions, so gamma and beta are
//            per-partition scalars ...
//   ScalarE  ... and oT = yT*gamma + beta is one activation per 128-column block (x's dtype)
//   TensorE  o = transpose(oT) into PSUM; VectorE copies it to the output tile; one DMA stores it.
// The transposes cost TensorE time that is otherwise idle, and they spare VectorE the two full
// fp32 tensor_tensor passes (x2 cycles each) a row-layout gamma/beta would need: that is what
// keeps VectorE (statistics) and ScalarE (normalize + affine) under the DMA time per row.
//
// Rows: partition q owns the contiguous rows [q*Rp, (q+1)*Rp) of the first 128*Rp rows
// (Rp = R / 128), so one DMA moves k whole rows per partition as one contiguous run each, and
// each partition's mean/rstd are contiguous in HBM. The last R % 128 rows form one tail group of
// one row per partition.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::norm_detail {

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

/** @brief Emits two step lists in program order, merged in proportion to their lengths. */
using Steps = std::vector<std::function<void()>>;
inline void interleave(const Steps& a, const Steps& b) {
  const size_t na = a.size(), nb = b.size();
  size_t ia = 0, ib = 0;
  while (ia < na || ib < nb) {
    if (ib >= nb || (ia < na && ia * nb <= ib * na)) a[ia++]();
    else b[ib++]();
  }
}

/**
 * @brief gamma (and beta) of shape [H] laid out for the transposed domain: column b of the
 * [min(H, 128), ceil(H / 128)] fp32 tile holds elements [128 b, 128 b + 128), one per partition.
 * Whole blocks are loaded as contiguous rows and turned around on the TensorE; a DMA whose every
 * element is its own descriptor would cost H descriptors instead.
 */
inline Tensor column_blocks(const Tensor& v, const std::string& name) {
  const int64_t H = v.shape()[0];
  const int64_t P = nl::tile_size().pmax;
  const int64_t full = H / P, rem = H % P, nblk = full + (rem ? 1 : 0);
  Tensor cols = nl::ndarray({std::min(H, P), nblk}, nl::float32, nl::sbuf, name);
  for (int64_t b0 = 0; b0 < full; b0 += P) {
    const int64_t n = std::min(P, full - b0);
    Tensor rows = nl::ndarray({n, P}, nl::float32, nl::sbuf, name + "_rows");
    isa::dma_copy(rows, v(nl::ds(b0 * P, n * P)).reshape({n, P}));
    Tensor t = nl::ndarray({P, n}, nl::float32, nl::psum, name + "_t");
    isa::nc_transpose(t, rows, isa::tensor_engine);
    isa::tensor_copy(cols(nl::all, nl::ds(b0, n)), t, isa::vector_engine);
  }
  if (rem) isa::dma_copy(cols(nl::ds(0, rem), nl::ds(full, 1)), v(nl::ds(full * P, rem)).reshape({rem, 1}));
  return cols;
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

/** @brief How a kernel tiles: rows per partition per group, and how far the pipeline runs ahead. */
struct Plan {
  int64_t k = 1;          // rows per partition per group
  int lookahead = 0;      // groups whose statistics run ahead of the group being normalized
  bool resident = true;   // whole rows stay in SBUF; else x is streamed twice per group
  int64_t segment = 0;    // columns per output store (and per streamed input segment)
};

/**
 * @brief Picks the tiling from the SBUF capacity. `row_bytes` is what one row of the resident
 * inputs takes per partition, `other_bytes(k, segment)` what every other tile takes. Groups of
 * >= 8 KiB per partition keep the per-descriptor DMA overhead to a few percent; lookahead 2 needs
 * four input tiles in flight (normalizing, waiting, in statistics, loading), which wide rows
 * cannot always afford, so they get less, and rows too wide for two tiles are streamed.
 */
inline Plan plan_rows(int64_t R, int64_t H, int64_t row_bytes,
                      const std::function<int64_t(int64_t k, int64_t segment)>& other_bytes, int max_lookahead,
                      int64_t streamed_bytes_per_column) {
  const nl::TileSize ts = nl::tile_size();
  const int64_t rp = std::max<int64_t>(R / ts.pmax, 1);
  Plan plan;
  plan.segment = std::min<int64_t>(H, 4096);
  // At most one staging tile of per-row statistics (512 rows per partition) per group.
  const int64_t want_k = std::max<int64_t>(1, std::min<int64_t>({rp, int64_t(512), ceil_div(8 * 1024, row_bytes)}));
  for (int la = max_lookahead; la >= 0; --la)
    for (int64_t k = want_k; k >= 1; --k)
      if ((la + 2) * k * row_bytes + other_bytes(k, plan.segment) <= ts.sbuf_fmax_bytes) {
        plan.k = k;
        plan.lookahead = la;
        return plan;
      }
  // Streamed: as many columns per segment as the live segment tiles leave room for, in whole
  // bn_stats and transpose chunks.
  plan.k = 1;
  plan.lookahead = 0;
  plan.resident = false;
  const int64_t unit = std::lcm(ts.bn_stats_fmax, ts.psum_bank_fmax);
  const int64_t room = (ts.sbuf_fmax_bytes - 64 * 1024) / streamed_bytes_per_column;
  plan.segment = std::min<int64_t>(H, std::max<int64_t>(unit, std::min<int64_t>(8192, room / unit * unit)));
  return plan;
}

/** @brief Per-row statistics of one group, in SBUF. */
struct GroupStats {
  Tensor mean;  // [p, k] fp32 (layernorm); views into the staging tile for main groups
  Tensor rstd;  // [p, k] fp32
  Tensor nb;    // [p, k] fp32: -mean * rstd (layernorm)
};

/**
 * @brief Staging tiles for the saved statistics: main groups write their columns, and one DMA
 * per partition run stores up to `cols` rows per partition at once (a DMA per group would pay the
 * per-descriptor overhead for every 4-byte element run).
 */
class StatStage {
 public:
  StatStage(int64_t partitions, int64_t rows_per_partition, std::vector<Tensor> outputs)
      : partitions_(partitions), rows_(rows_per_partition), outputs_(std::move(outputs)) {
    cols_ = std::min<int64_t>(rows_, 512);
  }
  /** @brief Views [p, k] of each staged statistic for a main-body group (opens a new stage if needed). */
  std::vector<Tensor> views(const RowGroup& g) {
    if (!open_ || g.j0 + g.k > start_ + cols_) {
      flush();
      start_ = g.j0;
      tiles_.clear();
      for (size_t i = 0; i < outputs_.size(); ++i)
        tiles_.push_back(nl::ndarray({partitions_, std::min(cols_, rows_ - start_)}, nl::float32, nl::sbuf,
                                     outputs_[i].name() + "_stage"));
      open_ = true;
    }
    end_ = g.j0 + g.k;
    std::vector<Tensor> v;
    for (const Tensor& t : tiles_) v.push_back(t(nl::all, nl::ds(g.j0 - start_, g.k)));
    return v;
  }
  void flush() {
    if (!open_) return;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const Tensor& o = outputs_[i];
      Tensor hbm = o(nl::ds(0, partitions_ * rows_)).reshape({partitions_, rows_});
      isa::dma_copy(hbm(nl::all, nl::ds(start_, end_ - start_)), tiles_[i](nl::all, nl::ds(0, end_ - start_)));
    }
    open_ = false;
  }

 private:
  int64_t partitions_, rows_, cols_ = 0, start_ = 0, end_ = 0;
  bool open_ = false;
  std::vector<Tensor> outputs_;
  std::vector<Tensor> tiles_;
};

/**
 * @brief Stores each finished output tile only after the next one has been written once, so two
 * output tiles are live together and the allocator gives them different buffers: the engines
 * fill one while the DMA drains the other.
 */
class DelayedStores {
 public:
  void first_write_done() {
    if (pending_) pending_();
    pending_ = nullptr;
  }
  void finished(std::function<void()> store) {
    if (pending_) pending_();
    pending_ = std::move(store);
  }
  void flush() { first_write_done(); }

 private:
  std::function<void()> pending_;
};

/** @brief The column chunk (<= 512 columns: one PSUM bank of fp32) transposed at a time. */
inline int64_t chunk_width() { return nl::tile_size().psum_bank_fmax; }

/**
 * @brief y = (x - mean) * rstd into fp32 (rmsnorm: x * rstd). 16-bit inputs take one ScalarE
 * activation x * rstd + nb (nb = -mean * rstd); its error, about 2^-24 |mean| rstd, is far below
 * the output's rounding. fp32 inputs subtract first (VectorE tensor_scalar), as torch does, so
 * rows whose mean is large against their spread keep every bit.
 */
inline void center(const Tensor& y, const Tensor& xs, const Tensor& rstd, const Tensor& mean, const Tensor& nb) {
  if (!mean.valid()) {
    isa::activation(y, nl::copy, xs, {.scale = rstd});
  } else if (xs.dtype() == DType::float32) {
    isa::tensor_scalar(y, xs, nl::subtract, mean, {.op1 = nl::multiply, .operand1 = rstd, .engine = isa::vector_engine});
  } else {
    isa::activation(y, nl::copy, xs, {.bias = nb, .scale = rstd});
  }
}

/**
 * @brief The normalize-and-affine of one [p, w] chunk of rows, split in two steps for the
 * pipeline: y (ScalarE) and its transpose, then the per-column affine and the transpose back.
 * Emitting y of chunk c+1 before the affine of chunk c keeps ScalarE busy while TensorE works.
 */
struct ChunkNormalizer {
  Kind kind;
  DType out_dtype;
  Tensor gcol, bcol;  // [min(H,128), nblk] fp32; bcol invalid for rmsnorm

  struct State {
    Tensor yT;
    int64_t p = 0, w = 0, col0 = 0;
  };

  State transform(const Tensor& xs, const Tensor& rstd, const Tensor& mean, const Tensor& nb, int64_t col0) const {
    const int64_t P = nl::tile_size().pmax;
    const int64_t p = xs.shape()[0], w = xs.shape()[1], nblk = ceil_div(w, P);
    Tensor y = nl::ndarray({p, w}, nl::float32, nl::sbuf, "y");
    center(y, xs, rstd, mean, nb);
    State s{nl::ndarray({std::min(w, P), nblk, p}, nl::float32, nl::psum, "yT"), p, w, col0};
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t wb = std::min(P, w - b * P);
      isa::nc_transpose(s.yT(nl::ds(0, wb), b, nl::all), y(nl::all, nl::ds(b * P, wb)), isa::tensor_engine);
    }
    return s;
  }

  void affine(const State& s, const Tensor& dst) const {
    const int64_t P = nl::tile_size().pmax;
    const int64_t nblk = ceil_div(s.w, P);
    Tensor oT = nl::ndarray({std::min(s.w, P), nblk, s.p}, out_dtype, nl::sbuf, "oT");
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t wb = std::min(P, s.w - b * P), blk = s.col0 / P + b;
      Tensor scale = gcol(nl::ds(0, wb), nl::ds(blk, 1));
      if (kind == Kind::layer)
        isa::activation(oT(nl::ds(0, wb), b, nl::all), nl::copy, s.yT(nl::ds(0, wb), b, nl::all),
                        {.bias = bcol(nl::ds(0, wb), nl::ds(blk, 1)), .scale = scale});
      else
        isa::activation(oT(nl::ds(0, wb), b, nl::all), nl::copy, s.yT(nl::ds(0, wb), b, nl::all), {.scale = scale});
    }
    Tensor o = nl::ndarray({s.p, s.w}, out_dtype, nl::psum, "o");
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t wb = std::min(P, s.w - b * P);
      isa::nc_transpose(o(nl::all, nl::ds(b * P, wb)), oT(nl::ds(0, wb), b, nl::all), isa::tensor_engine);
    }
    isa::tensor_copy(dst, o, isa::vector_engine);
  }
};

/**
 * @brief The forward of layernorm / rmsnorm: returns {out, mean, rstd} (layernorm) or
 * {out, rstd} (rmsnorm). See the file comment for the engine plan.
 */
inline std::vector<Tensor> forward(Kind kind, const Tensor& x, const Tensor& gamma, const std::optional<Tensor>& beta,
                                   double eps, Loc loc) {
  const std::string kname = kind_name(kind);
  const ArgumentCheck check(kname, x, loc);
  if (beta) check_inputs(check, x, {&gamma, &*beta});
  else check_inputs(check, x, {&gamma});
  check.require(eps >= 0 && std::isfinite(eps), "eps must be a finite non-negative number");
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, R = x.shape()[0], H = x.shape()[1], F = ts.bn_stats_fmax;
  const int64_t CW = chunk_width();
  const bool layer = kind == Kind::layer;

  Tensor out = nl::ndarray({R, H}, x.dtype(), nl::shared_hbm, "out");
  std::optional<Tensor> mean_o;
  if (layer) mean_o = nl::ndarray({R}, nl::float32, nl::shared_hbm, "mean");
  Tensor rstd_o = nl::ndarray({R}, nl::float32, nl::shared_hbm, "rstd");

  const ChunkNormalizer norm{kind, x.dtype(), column_blocks(gamma, "gamma_cols"),
                             layer ? column_blocks(*beta, "beta_cols") : Tensor{}};

  const int64_t xb = dtype_size(x.dtype()), nblk = ceil_div(H, P);
  const int64_t nst = ceil_div(H, F);
  Plan plan = plan_rows(R, H, H * xb, [&](int64_t k, int64_t seg) {
    return 4 * k * seg * xb                        // output tiles (two sites)
           + 2 * CW * 4 + 2 * CW * xb                // y and oT chunk tiles
           + 3 * k * (nst * 6 + 2 + 8) * 4            // bn_stats, bn_aggr and per-row scalars
           + 2 * 2 * std::min<int64_t>(R / P, 512) * 4  // staged mean and rstd
           + 2 * (nblk + P) * 4 + 2 * k * 4          // gamma/beta columns, eps and zero
           + 8 * 1024;                               // slack for placement
  }, 2, /*streamed: three x segments per pass and four output segments live*/ 10 * xb);
  const std::vector<RowGroup> groups = row_groups(R, P, plan.k);
  const int64_t ng = static_cast<int64_t>(groups.size());

  // Constant per-row operands of the GpSimd scalar math (it has no tensor_scalar add).
  Tensor eps_t = nl::ndarray({P, plan.k}, nl::float32, nl::sbuf, "eps");
  isa::memset(eps_t, eps, isa::gpsimd_engine);
  Tensor zero_t;
  if (layer) {
    zero_t = nl::ndarray({P, plan.k}, nl::float32, nl::sbuf, "zero");
    isa::memset(zero_t, 0.0, isa::gpsimd_engine);
  }

  std::vector<Tensor> staged_outputs;
  if (layer) staged_outputs.push_back(*mean_o);
  staged_outputs.push_back(rstd_o);
  StatStage stage(P, R / P, staged_outputs);

  std::vector<Tensor> xt(ng);
  std::vector<GroupStats> stats(ng);

  // Input tiles cycle through three allocation sites (two buffers each), enough for lookahead 2.
  auto new_x_tile = [&](int64_t g, const Shape& shape) {
    switch (g % 3) {
      case 0: return nl::ndarray(shape, x.dtype(), nl::sbuf, "x_tile");
      case 1: return nl::ndarray(shape, x.dtype(), nl::sbuf, "x_tile");
      default: return nl::ndarray(shape, x.dtype(), nl::sbuf, "x_tile");
    }
  };
  // Loads go in pieces of at most one output segment per row: the DMA bandwidth serves transfers
  // in order, and a store queued behind one huge load would hold its output buffer for as long.
  auto load = [&](int64_t g) {
    const RowGroup& G = groups[g];
    xt[g] = new_x_tile(g, {G.p, G.k, H});
    const Tensor src = G.rows(x);
    for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
      const int64_t sw = std::min(plan.segment, H - s0);
      isa::dma_copy(xt[g](nl::all, nl::all, nl::ds(s0, sw)), src(nl::all, nl::all, nl::ds(s0, sw)));
    }
  };

  // The per-row scalars from bn_aggr's (mean, var): GpSimd, which is otherwise idle.
  auto row_scalars = [&](int64_t g, const Tensor& mv) {
    const RowGroup& G = groups[g];
    GroupStats& s = stats[g];
    if (G.tail) {
      if (layer) s.mean = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "mean_tail");
      s.rstd = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "rstd_tail");
    } else {
      std::vector<Tensor> v = stage.views(G);
      if (layer) s.mean = v[0];
      s.rstd = v.back();
    }
    Tensor mean = mv(nl::all, nl::all, 0), var = mv(nl::all, nl::all, 1);
    Tensor eps_g = eps_t(nl::ds(0, G.p), nl::ds(0, G.k));
    Tensor ve = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "var_eps");
    if (layer) {
      isa::tensor_copy(s.mean, mean, isa::gpsimd_engine);
      isa::tensor_tensor(ve, var, eps_g, nl::add, isa::gpsimd_engine);
    } else {
      // mean(x^2) = var + mean^2: both terms are non-negative, so no cancellation.
      Tensor m2 = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "mean_sq");
      isa::tensor_tensor(m2, mean, mean, nl::multiply, isa::gpsimd_engine);
      isa::tensor_tensor(m2, m2, var, nl::add, isa::gpsimd_engine);
      isa::tensor_tensor(ve, m2, eps_g, nl::add, isa::gpsimd_engine);
    }
    isa::tensor_scalar(s.rstd, ve, nl::rsqrt, 0.0, {.engine = isa::gpsimd_engine});
    if (layer) {
      Tensor neg = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "neg_mean");
      isa::tensor_tensor(neg, zero_t(nl::ds(0, G.p), nl::ds(0, G.k)), s.mean, nl::subtract, isa::gpsimd_engine);
      s.nb = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "nb");
      isa::tensor_tensor(s.nb, neg, s.rstd, nl::multiply, isa::gpsimd_engine);
    }
    if (G.tail) {
      if (layer) isa::dma_copy(G.stats(*mean_o), s.mean);
      isa::dma_copy(G.stats(rstd_o), s.rstd);
    }
  };

  // Statistics steps of group g over its resident tile: one bn_stats per chunk, bn_aggr per row.
  auto stats_steps = [&](int64_t g) {
    const RowGroup& G = groups[g];
    Steps steps;
    Tensor st = nl::ndarray({G.p, G.k, nst * 6}, nl::float32, nl::sbuf, "bn_stats");
    Tensor mv = nl::ndarray({G.p, G.k, 2}, nl::float32, nl::sbuf, "bn_aggr");
    const Tensor xg = xt[g];
    for (int64_t j = 0; j < G.k; ++j) {
      for (int64_t c = 0; c < nst; ++c)
        steps.push_back([=] {
          isa::bn_stats(st(nl::all, j, nl::ds(c * 6, 6)), xg(nl::all, j, nl::ds(c * F, std::min(F, H - c * F))));
        });
      steps.push_back([=] { isa::bn_aggr(mv(nl::all, j, nl::all), st(nl::all, j, nl::all)); });
    }
    steps.push_back([=, &row_scalars] { row_scalars(g, mv); });
    return steps;
  };

  DelayedStores stores;

  // Normalize steps of group g: output segments, rows, column chunks; y of the next chunk is
  // emitted before the affine of the current one.
  auto norm_steps = [&](int64_t g, std::function<Tensor(int64_t j, int64_t c0, int64_t w)> x_chunk) {
    const RowGroup& G = groups[g];
    Steps steps;
    struct Item {
      int64_t seg0, segw, j, c0, w;
    };
    std::vector<Item> items;
    for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
      const int64_t sw = std::min(plan.segment, H - s0);
      for (int64_t j = 0; j < G.k; ++j)
        for (int64_t c0 = s0; c0 < s0 + sw; c0 += CW) items.push_back({s0, sw, j, c0, std::min(CW, s0 + sw - c0)});
    }
    auto states = std::make_shared<std::vector<ChunkNormalizer::State>>(items.size());
    auto seg_tile = std::make_shared<Tensor>();
    const GroupStats* s = &stats[g];  // filled by the statistics steps, which run first
    auto first = [=](size_t i) {
      const Item& it = items[i];
      Tensor mean, nb;
      if (layer) {
        mean = s->mean(nl::all, nl::ds(it.j, 1));
        nb = s->nb(nl::all, nl::ds(it.j, 1));
      }
      (*states)[i] = norm.transform(x_chunk(it.j, it.c0, it.w), s->rstd(nl::all, nl::ds(it.j, 1)), mean, nb, it.c0);
    };
    auto second = [=, &stores](size_t i) {
      const Item& it = items[i];
      const bool seg_start = it.j == 0 && it.c0 == it.seg0;
      // Two allocation sites, alternating, give four output buffers: a store may wait behind
      // a load for a while before it frees its tile.
      if (seg_start)
        *seg_tile = (it.seg0 / plan.segment + g) % 2 ? nl::ndarray({G.p, G.k, it.segw}, x.dtype(), nl::sbuf, "out_tile")
                                                     : nl::ndarray({G.p, G.k, it.segw}, x.dtype(), nl::sbuf, "out_tile");
      norm.affine((*states)[i], (*seg_tile)(nl::all, it.j, nl::ds(it.c0 - it.seg0, it.w)));
      if (seg_start) stores.first_write_done();
      const bool seg_end = it.j == G.k - 1 && it.c0 + it.w == it.seg0 + it.segw;
      if (seg_end) {
        Tensor tile = *seg_tile;
        Tensor dst = G.rows(out)(nl::all, nl::all, nl::ds(it.seg0, it.segw));
        stores.finished([tile, dst] { isa::dma_copy(dst, tile); });
      }
    };
    steps.push_back([=] { first(0); });
    for (size_t i = 0; i < items.size(); ++i)
      steps.push_back([=] {
        if (i + 1 < items.size()) first(i + 1);
        second(i);
      });
    return steps;
  };

  if (plan.resident) {
    const int la = plan.lookahead;
    for (int64_t g = 0; g < std::min<int64_t>(ng, la + 1); ++g) load(g);
    for (int64_t g = 0; g < std::min<int64_t>(ng, la); ++g)
      for (auto& step : stats_steps(g)) step();
    for (int64_t g = 0; g < ng; ++g) {
      if (g + la + 1 < ng) load(g + la + 1);
      Steps a = g + la < ng ? stats_steps(g + la) : Steps{};
      if (la == 0) {  // the statistics of this very group come first
        for (auto& step : a) step();
        a.clear();
      }
      const Tensor xg = xt[g];
      Steps b = norm_steps(g, [xg](int64_t j, int64_t c0, int64_t w) { return xg(nl::all, j, nl::ds(c0, w)); });
      interleave(a, b);
      xt[g] = Tensor{};
    }
  } else {
    // Rows too wide to keep: read each group twice, once for the statistics, once to normalize.
    const int64_t SW = plan.segment;
    for (int64_t g = 0; g < ng; ++g) {
      const RowGroup& G = groups[g];
      const Tensor xh = G.rows(x);
      Tensor st = nl::ndarray({G.p, G.k, nst * 6}, nl::float32, nl::sbuf, "bn_stats");
      Tensor mv = nl::ndarray({G.p, G.k, 2}, nl::float32, nl::sbuf, "bn_aggr");
      const int64_t nseg = ceil_div(H, SW);
      // Each segment is loaded while the one before it is being read.
      auto segment = [&](int64_t si, const char* name) {
        const int64_t sw = std::min(SW, H - si * SW);
        Tensor xs = nl::ndarray({G.p, sw}, x.dtype(), nl::sbuf, name);
        isa::dma_copy(xs, xh(nl::all, 0, nl::ds(si * SW, sw)));
        return xs;
      };
      Tensor next = segment(0, "x_stats_segment");
      for (int64_t si = 0; si < nseg; ++si) {
        Tensor xs = next;
        if (si + 1 < nseg) next = segment(si + 1, "x_stats_segment");
        const int64_t s0 = si * SW, sw = std::min(SW, H - s0);
        for (int64_t c0 = 0; c0 < sw; c0 += F)
          isa::bn_stats(st(nl::all, 0, nl::ds((s0 + c0) / F * 6, 6)), xs(nl::all, nl::ds(c0, std::min(F, sw - c0))));
      }
      isa::bn_aggr(mv(nl::all, 0, nl::all), st(nl::all, 0, nl::all));
      row_scalars(g, mv);
      auto segs = std::make_shared<std::vector<Tensor>>();
      Steps b = norm_steps(g, [=](int64_t, int64_t c0, int64_t w) {
        const int64_t si = c0 / SW;
        while (static_cast<int64_t>(segs->size()) <= std::min(si + 1, nseg - 1)) {
          const int64_t s0 = static_cast<int64_t>(segs->size()) * SW, sw = std::min(SW, H - s0);
          Tensor xs = nl::ndarray({G.p, sw}, x.dtype(), nl::sbuf, "x_segment");
          isa::dma_copy(xs, xh(nl::all, 0, nl::ds(s0, sw)));
          segs->push_back(xs);
        }
        return (*segs)[si](nl::all, nl::ds(c0 - si * SW, w));
      });
      for (auto& step : b) step();
    }
  }
  stores.flush();
  stage.flush();
  std::vector<Tensor> result{out};
  if (layer) result.push_back(*mean_o);
  result.push_back(rstd_o);
  return result;
}


/** @brief A [P, w] tile holding v[c0 : c0 + w] on every partition (a stride-0 partition DMA). */
inline Tensor broadcast_rows(const Tensor& v, int64_t partitions, int64_t c0, int64_t w, const char* name) {
  Tensor t = nl::ndarray({partitions, w}, v.dtype(), nl::sbuf, name);
  isa::dma_copy(t, v(nl::ds(c0, w)).reshape({1, w}).broadcast(0, partitions));
  return t;
}

/**
 * @brief The per-row inputs of the backward (rstd, mean) staged like the forward's outputs: one
 * DMA loads up to 512 rows per partition; layernorm also derives nb = -mean * rstd there.
 */
class StatLoad {
 public:
  struct Views {
    Tensor rstd, mean, nb;  // [p, k]; mean and nb invalid for rmsnorm
  };
  StatLoad(int64_t partitions, int64_t rows_per_partition, const std::optional<Tensor>& mean, Tensor rstd)
      : partitions_(partitions), rows_(rows_per_partition), mean_(mean), rstd_(std::move(rstd)) {
    cols_ = std::min<int64_t>(rows_, 512);
  }
  Views views(const RowGroup& g) {
    if (g.tail) return load(g.stats(rstd_), mean_ ? g.stats(*mean_) : Tensor{}, g.p, 1);
    if (!open_ || g.j0 + g.k > start_ + cols_) {
      start_ = g.j0;
      const int64_t n = std::min(cols_, rows_ - start_);
      auto stage = [&](const Tensor& t) {
        return t(nl::ds(0, partitions_ * rows_)).reshape({partitions_, rows_})(nl::all, nl::ds(start_, n));
      };
      stage_ = load(stage(rstd_), mean_ ? stage(*mean_) : Tensor{}, partitions_, n);
      open_ = true;
    }
    auto cols = [&](const Tensor& t) { return t.valid() ? t(nl::all, nl::ds(g.j0 - start_, g.k)) : Tensor{}; };
    return {cols(stage_.rstd), cols(stage_.mean), cols(stage_.nb)};
  }

 private:
  static Views load(const Tensor& rstd_hbm, const Tensor& mean_hbm, int64_t p, int64_t n) {
    Views v;
    v.rstd = nl::ndarray({p, n}, nl::float32, nl::sbuf, "rstd_stage");
    isa::dma_copy(v.rstd, rstd_hbm);
    if (!mean_hbm.valid()) return v;
    v.mean = nl::ndarray({p, n}, nl::float32, nl::sbuf, "mean_stage");
    isa::dma_copy(v.mean, mean_hbm);
    Tensor zero = nl::ndarray({p, n}, nl::float32, nl::sbuf, "zero");
    isa::memset(zero, 0.0, isa::gpsimd_engine);
    Tensor neg = nl::ndarray({p, n}, nl::float32, nl::sbuf, "neg_mean");
    isa::tensor_tensor(neg, zero, v.mean, nl::subtract, isa::gpsimd_engine);
    v.nb = nl::ndarray({p, n}, nl::float32, nl::sbuf, "nb_stage");
    isa::tensor_tensor(v.nb, neg, v.rstd, nl::multiply, isa::gpsimd_engine);
    return v;
  }

  int64_t partitions_, rows_, cols_ = 0, start_ = 0;
  bool open_ = false;
  std::optional<Tensor> mean_;
  Tensor rstd_;
  Views stage_;
};

/**
 * @brief Column sums over all rows accumulated in PSUM by the TensorE: for every 128-column
 * block, data[rows, block]^T @ ones[rows, 1] adds the block's column sums into one PSUM column.
 * Accumulating there, across partitions and row groups at once, costs no Vector/Scalar/GpSimd
 * time and keeps the sums in fp32 until the one rounding of the final store.
 */
class ColumnSums {
 public:
  ColumnSums(int64_t H, const std::string& name) : H_(H) {
    const int64_t P = nl::tile_size().pmax, per_tile = nl::tile_size().psum_bank_fmax;
    const int64_t nblk = ceil_div(H, P);
    for (int64_t b0 = 0; b0 < nblk; b0 += per_tile)
      acc_.push_back(nl::ndarray({std::min(H, P), std::min(per_tile, nblk - b0)}, nl::float32, nl::psum, name));
  }
  /** @brief Adds the column sums of data [p, w] (columns [c0, c0 + w), c0 a multiple of 128). */
  void add(const Tensor& data, const Tensor& ones, int64_t c0) {
    const int64_t P = nl::tile_size().pmax, per_tile = nl::tile_size().psum_bank_fmax;
    const int64_t w = data.shape()[1];
    for (int64_t b = 0; b * P < w; ++b) {
      const int64_t wb = std::min(P, w - b * P), blk = c0 / P + b;
      isa::nc_matmul(acc_[blk / per_tile](nl::ds(0, wb), nl::ds(blk % per_tile, 1)), data(nl::all, nl::ds(b * P, wb)),
                     ones);
    }
  }
  /** @brief Rounds the sums to `out`'s dtype and stores them to out [H]. */
  void store(const Tensor& out) const {
    const int64_t P = nl::tile_size().pmax, per_tile = nl::tile_size().psum_bank_fmax, H = H_;
    const int64_t full = H / P, rem = H % P;
    for (size_t t = 0; t < acc_.size(); ++t) {
      const int64_t b0 = int64_t(t) * per_tile, n = acc_[t].shape()[1];
      const int64_t nfull = std::max<int64_t>(0, std::min(n, full - b0));
      if (nfull > 0) {
        // [128, blocks] -> [blocks, 128]: each block becomes one contiguous row of the output.
        Tensor cols = nl::ndarray({P, nfull}, nl::float32, nl::sbuf, "colsum_cols");
        isa::tensor_copy(cols, acc_[t](nl::all, nl::ds(0, nfull)), isa::vector_engine);
        for (int64_t r0 = 0; r0 < nfull; r0 += P) {
          const int64_t nr = std::min(P, nfull - r0);
          Tensor tp = nl::ndarray({nr, P}, nl::float32, nl::psum, "colsum_t");
          isa::nc_transpose(tp, cols(nl::all, nl::ds(r0, nr)), isa::tensor_engine);
          Tensor rows = nl::ndarray({nr, P}, out.dtype(), nl::sbuf, "colsum_rows");
          isa::tensor_copy(rows, tp, isa::vector_engine);
          isa::dma_copy(out(nl::ds((b0 + r0) * P, nr * P)).reshape({nr, P}), rows);
        }
      }
      if (rem && full >= b0 && full < b0 + n) {
        Tensor last = nl::ndarray({rem, 1}, out.dtype(), nl::sbuf, "colsum_last");
        isa::tensor_copy(last, acc_[t](nl::ds(0, rem), nl::ds(full - b0, 1)), isa::vector_engine);
        isa::dma_copy(out(nl::ds(full * P, rem)).reshape({rem, 1}), last);
      }
    }
  }

 private:
  int64_t H_;
  std::vector<Tensor> acc_;
};

/**
 * @brief The backward of layernorm / rmsnorm: {grad_x, grad_gamma, grad_beta} (layernorm) or
 * {grad_x, grad_gamma} (rmsnorm).
 *
 *   xhat = (x - mean) * rstd  (rmsnorm: x * rstd),  g = grad_out * gamma
 *   grad_x = rstd * (g - mean_h(g) - xhat * mean_h(g * xhat))   (rmsnorm: no mean_h(g) term)
 *   grad_gamma = sum_r grad_out * xhat,  grad_beta = sum_r grad_out
 *
 * Each group of rows takes two passes over its columns. Pass 1: ScalarE xhat, VectorE g (one
 * scalar_tensor_tensor from the 16-bit inputs), GpSimd g * xhat and grad_out * xhat, ScalarE the
 * row sums (activation accumulators), TensorE the column sums (grad_gamma, grad_beta) into PSUM.
 * Pass 2: VectorE g - xhat * c2, ScalarE the scale by rstd and the shift. Pass 1 of the next group
 * is interleaved with pass 2 of this one. xhat and g stay in SBUF between the passes when they
 * fit, else pass 2 recomputes them.
 */
inline std::vector<Tensor> backward(Kind kind, const Tensor& x, const Tensor& gamma, const std::optional<Tensor>& mean,
                                    const Tensor& rstd, const Tensor& dy, Loc loc) {
  const std::string kname = std::string(kind_name(kind)) + "_bwd";
  const ArgumentCheck check(kname, x, loc);
  check_inputs(check, x, {&gamma});
  check.require(dy.ndim() == 2 && dy.shape() == x.shape(),
                "grad_out must have x's shape " + x.shape().str() + ", got " + dy.shape().str());
  check.require(is_norm_float(dy.dtype()), "grad_out must be float32, bfloat16 or float16");
  const int64_t R = x.shape()[0], H = x.shape()[1];
  for (const Tensor* t : {mean ? &*mean : nullptr, &rstd}) {
    if (!t) continue;
    check.require(t->ndim() == 1 && t->shape()[0] == R,
                  "'" + t->name() + "' must have shape [" + std::to_string(R) + "], got " + t->shape().str());
    check.require(is_norm_float(t->dtype()), "'" + t->name() + "' must be a float tensor");
  }
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, CW = chunk_width();
  const bool layer = kind == Kind::layer;
  const int64_t xb = dtype_size(x.dtype()), db = dtype_size(dy.dtype()), gb = dtype_size(gamma.dtype());
  const int64_t nch_max = ceil_div(H, CW);

  Tensor grad_x = nl::ndarray({R, H}, x.dtype(), nl::shared_hbm, "grad_x");
  Tensor grad_gamma = nl::ndarray({H}, gamma.dtype(), nl::shared_hbm, "grad_gamma");
  std::optional<Tensor> grad_beta;
  if (layer) grad_beta = nl::ndarray({H}, gamma.dtype(), nl::shared_hbm, "grad_beta");

  auto other = [&](bool cached) {
    return [=](int64_t k, int64_t seg) {
      return (cached ? 2 * k * H * 8 : 0)            // xhat and g of two groups
             + H * gb                                  // gamma on every partition
             + 4 * k * seg * xb                        // output tiles (two sites)
             + 6 * CW * 4 + CW * 2                     // chunk temporaries
             + 2 * k * (2 * nch_max + 4) * 4           // row-sum partials and coefficients
             + 3 * std::min<int64_t>(R / P, 512) * 4 * 2  // staged rstd, mean, nb
             + 8 * 1024;
    };
  };
  // Streamed: up to three segments of x, grad_out and gamma live, and four output segments.
  const int64_t streamed = 3 * (xb + db + gb) + 4 * xb + 6 * 4;
  Plan plan = plan_rows(R, H, H * (xb + db), other(true), 1, streamed);
  const bool cached = plan.resident && plan.lookahead == 1;
  if (!cached) plan = plan_rows(R, H, H * (xb + db), other(false), 1, streamed);
  const std::vector<RowGroup> groups = row_groups(R, P, plan.k);
  const int64_t ng = static_cast<int64_t>(groups.size());

  Tensor ones_f = nl::ndarray({P, 1}, nl::float32, nl::sbuf, "ones");
  isa::memset(ones_f, 1.0, isa::gpsimd_engine);
  Tensor ones_dy = ones_f;
  if (dy.dtype() != DType::float32) {
    ones_dy = nl::ndarray({P, 1}, dy.dtype(), nl::sbuf, "ones_dy");
    isa::memset(ones_dy, 1.0, isa::gpsimd_engine);
  }
  // Activation outputs nobody reads: only the accumulated row sums are wanted.
  Tensor junk = nl::ndarray({P, CW}, nl::bfloat16, nl::sbuf, "discard");
  ColumnSums dgamma(H, "grad_gamma_acc");
  std::optional<ColumnSums> dbeta;
  if (layer) dbeta.emplace(H, "grad_beta_acc");
  Tensor gamma_all;
  if (plan.resident) gamma_all = broadcast_rows(gamma, P, 0, H, "gamma_rows");
  StatLoad stat_load(P, R / P, mean, rstd);

  struct GroupState {
    Tensor x, dy;           // resident inputs [p, k, H] (resident mode)
    Tensor rstd, mean, nb;  // [p, k]
    Tensor xhat, g;         // cached [p, k, H] fp32
    Tensor s1, s2;          // row-sum partials [p, k, nch]
    Tensor c2, shift;       // [p, k]: mean_h(g * xhat), -rstd * mean_h(g)
  };
  std::vector<GroupState> st(ng);

  // Input tiles: two allocation sites, two buffers each (lookahead 1 needs three in flight).
  auto load = [&](int64_t g) {
    const RowGroup& G = groups[g];
    GroupState& s = st[g];
    s.x = g % 2 ? nl::ndarray({G.p, G.k, H}, x.dtype(), nl::sbuf, "x_tile")
                : nl::ndarray({G.p, G.k, H}, x.dtype(), nl::sbuf, "x_tile");
    s.dy = g % 2 ? nl::ndarray({G.p, G.k, H}, dy.dtype(), nl::sbuf, "dy_tile")
                 : nl::ndarray({G.p, G.k, H}, dy.dtype(), nl::sbuf, "dy_tile");
    const Tensor xs = G.rows(x), ds = G.rows(dy);
    for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
      const int64_t sw = std::min(plan.segment, H - s0);
      isa::dma_copy(s.x(nl::all, nl::all, nl::ds(s0, sw)), xs(nl::all, nl::all, nl::ds(s0, sw)));
      isa::dma_copy(s.dy(nl::all, nl::all, nl::ds(s0, sw)), ds(nl::all, nl::all, nl::ds(s0, sw)));
    }
  };

  // Where pass 1 and pass 2 read their chunks: resident tiles, or streamed segments.
  struct Chunks {
    std::function<Tensor(int64_t j, int64_t c0, int64_t w)> x, dy, gamma;
  };
  auto resident_chunks = [&](int64_t g) {
    const Tensor xt = st[g].x, dyt = st[g].dy, ga = gamma_all;
    const int64_t p = groups[g].p;
    return Chunks{[=](int64_t j, int64_t c0, int64_t w) { return xt(nl::all, j, nl::ds(c0, w)); },
                  [=](int64_t j, int64_t c0, int64_t w) { return dyt(nl::all, j, nl::ds(c0, w)); },
                  [=](int64_t, int64_t c0, int64_t w) { return ga(nl::ds(0, p), nl::ds(c0, w)); }};
  };
  auto streamed_chunks = [&](int64_t g) {
    // One group row (k = 1); segments of x, grad_out and gamma, each loaded one segment ahead.
    const RowGroup G = groups[g];
    const int64_t SW = plan.segment, nseg = ceil_div(H, SW);
    struct Segs {
      std::vector<Tensor> x, dy, gamma;
    };
    auto segs = std::make_shared<Segs>();
    const Tensor xh = G.rows(x), dh = G.rows(dy), gam = gamma;
    auto ensure = [=](int64_t si) {
      while (static_cast<int64_t>(segs->x.size()) <= std::min(si + 1, nseg - 1)) {
        const int64_t s0 = static_cast<int64_t>(segs->x.size()) * SW, sw = std::min(SW, H - s0);
        Tensor xs = nl::ndarray({G.p, sw}, xh.dtype(), nl::sbuf, "x_segment");
        isa::dma_copy(xs, xh(nl::all, 0, nl::ds(s0, sw)));
        Tensor ds = nl::ndarray({G.p, sw}, dh.dtype(), nl::sbuf, "dy_segment");
        isa::dma_copy(ds, dh(nl::all, 0, nl::ds(s0, sw)));
        segs->x.push_back(xs);
        segs->dy.push_back(ds);
        segs->gamma.push_back(broadcast_rows(gam, G.p, s0, sw, "gamma_segment"));
      }
    };
    auto pick = [=](std::vector<Tensor> Segs::*which) {
      return [=](int64_t, int64_t c0, int64_t w) {
        const int64_t si = c0 / SW;
        ensure(si);
        return ((*segs).*which)[si](nl::all, nl::ds(c0 - si * SW, w));
      };
    };
    return Chunks{pick(&Segs::x), pick(&Segs::dy), pick(&Segs::gamma)};
  };

  struct Item {
    int64_t j, c0, w, ci;
  };
  auto items_of = [&](const RowGroup& G) {
    std::vector<Item> items;
    for (int64_t j = 0; j < G.k; ++j)
      for (int64_t c0 = 0, ci = 0; c0 < H; c0 += CW, ++ci) items.push_back({j, c0, std::min(CW, H - c0), ci});
    return items;
  };

  // xhat and g of one chunk, into the cache or into fresh temporaries.
  auto xhat_and_g = [&](int64_t g, const Chunks& ch, const Item& it, Tensor* xhat, Tensor* gg) {
    const RowGroup& G = groups[g];
    const GroupState& s = st[g];
    *xhat = cached ? s.xhat(nl::all, it.j, nl::ds(it.c0, it.w)) : nl::ndarray({G.p, it.w}, nl::float32, nl::sbuf, "xhat");
    *gg = cached ? s.g(nl::all, it.j, nl::ds(it.c0, it.w)) : nl::ndarray({G.p, it.w}, nl::float32, nl::sbuf, "g");
    auto row = [&](const Tensor& t) { return t.valid() ? t(nl::all, nl::ds(it.j, 1)) : Tensor{}; };
    center(*xhat, ch.x(it.j, it.c0, it.w), row(s.rstd), row(s.mean), row(s.nb));
    // (dy - 0) * gamma: the form VectorE runs at one element per cycle from 16-bit inputs.
    isa::scalar_tensor_tensor(*gg, ch.dy(it.j, it.c0, it.w), nl::subtract, 0.0, nl::multiply, ch.gamma(it.j, it.c0, it.w));
  };

  // Pass 1 of group g: per chunk A (xhat, g), then B (products, row sums, column sums) one chunk
  // later so that no engine waits on the chunk it has just handed over.
  auto pass1 = [&](int64_t g, const Chunks& ch) {
    const RowGroup G = groups[g];
    GroupState& s = st[g];
    const StatLoad::Views v = stat_load.views(G);
    s.rstd = v.rstd;
    s.mean = v.mean;
    s.nb = v.nb;
    if (cached) {
      s.xhat = nl::ndarray({G.p, G.k, H}, nl::float32, nl::sbuf, "xhat_rows");
      s.g = nl::ndarray({G.p, G.k, H}, nl::float32, nl::sbuf, "g_rows");
    }
    const int64_t nch = ceil_div(H, CW);
    if (layer) s.s1 = nl::ndarray({G.p, G.k, nch}, nl::float32, nl::sbuf, "row_sum_g");
    s.s2 = nl::ndarray({G.p, G.k, nch}, nl::float32, nl::sbuf, "row_sum_gxhat");
    const std::vector<Item> items = items_of(G);
    auto tiles = std::make_shared<std::vector<std::pair<Tensor, Tensor>>>(items.size());
    Steps steps;
    auto A = [=, &xhat_and_g](size_t i) {
      xhat_and_g(g, ch, items[i], &(*tiles)[i].first, &(*tiles)[i].second);
    };
    auto B = [=, &st, &dgamma, &dbeta](size_t i) {
      const Item& it = items[i];
      const GroupState& s = st[g];
      const auto& [xhat, gg] = (*tiles)[i];
      const Tensor junk_c = junk(nl::ds(0, G.p), nl::ds(0, it.w));
      if (layer)
        isa::activation(junk_c, nl::copy, gg, {.reduce_op = nl::add, .reduce_res = s.s1(nl::all, it.j, nl::ds(it.ci, 1))});
      Tensor prod = nl::ndarray({G.p, it.w}, nl::float32, nl::sbuf, "g_xhat");
      isa::tensor_tensor(prod, gg, xhat, nl::multiply, isa::gpsimd_engine);
      isa::activation(junk_c, nl::copy, prod, {.reduce_op = nl::add, .reduce_res = s.s2(nl::all, it.j, nl::ds(it.ci, 1))});
      const Tensor dyc = ch.dy(it.j, it.c0, it.w);
      Tensor q = nl::ndarray({G.p, it.w}, nl::float32, nl::sbuf, "dy_xhat");
      isa::tensor_tensor(q, dyc, xhat, nl::multiply, isa::gpsimd_engine);
      dgamma.add(q, ones_f(nl::ds(0, G.p), nl::all), it.c0);
      if (dbeta) dbeta->add(dyc, ones_dy(nl::ds(0, G.p), nl::all), it.c0);
    };
    steps.push_back([=] { A(0); });
    for (size_t i = 0; i < items.size(); ++i)
      steps.push_back([=] {
        if (i + 1 < items.size()) A(i + 1);
        B(i);
      });
    // Per-row coefficients: c2 = mean_h(g * xhat); shift = -rstd * mean_h(g).
    steps.push_back([=, &st] {
      GroupState& s = st[g];
      Tensor t2 = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "sum_gxhat");
      isa::tensor_reduce(t2, nl::add, s.s2, {2});
      s.c2 = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "c2");
      isa::tensor_scalar(s.c2, t2, nl::multiply, 1.0 / double(H));
      if (layer) {
        Tensor t1 = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "sum_g");
        isa::tensor_reduce(t1, nl::add, s.s1, {2});
        isa::tensor_scalar(t1, t1, nl::multiply, -1.0 / double(H));
        s.shift = nl::ndarray({G.p, G.k}, nl::float32, nl::sbuf, "shift");
        isa::tensor_tensor(s.shift, t1, s.rstd, nl::multiply, isa::gpsimd_engine);
      }
    });
    return steps;
  };

  DelayedStores stores;
  // Pass 2 of group g: u = g - xhat * c2 (VectorE), grad_x = u * rstd + shift (ScalarE).
  auto pass2 = [&](int64_t g, const Chunks& ch) {
    const RowGroup G = groups[g];
    const std::vector<Item> items = items_of(G);
    auto us = std::make_shared<std::vector<Tensor>>(items.size());
    auto seg_tile = std::make_shared<Tensor>();
    Steps steps;
    auto U = [=, &st, &xhat_and_g](size_t i) {
      const Item& it = items[i];
      const GroupState& s = st[g];
      Tensor xhat, gg;
      if (cached) {
        xhat = s.xhat(nl::all, it.j, nl::ds(it.c0, it.w));
        gg = s.g(nl::all, it.j, nl::ds(it.c0, it.w));
      } else {
        xhat_and_g(g, ch, it, &xhat, &gg);
      }
      Tensor u = nl::ndarray({G.p, it.w}, nl::float32, nl::sbuf, "u");
      isa::scalar_tensor_tensor(u, xhat, nl::multiply, s.c2(nl::all, nl::ds(it.j, 1)), nl::subtract, gg,
                                /*reverse0=*/false, /*reverse1=*/true);
      (*us)[i] = u;
    };
    auto D = [=, &st, &stores](size_t i) {
      const Item& it = items[i];
      const GroupState& s = st[g];
      const int64_t seg0 = it.c0 / plan.segment * plan.segment, segw = std::min(plan.segment, H - seg0);
      const bool seg_start = it.j == 0 && it.c0 == seg0;
      if (seg_start)
        *seg_tile = (seg0 / plan.segment + g) % 2 ? nl::ndarray({G.p, G.k, segw}, x.dtype(), nl::sbuf, "grad_x_tile")
                                                  : nl::ndarray({G.p, G.k, segw}, x.dtype(), nl::sbuf, "grad_x_tile");
      const Tensor dst = (*seg_tile)(nl::all, it.j, nl::ds(it.c0 - seg0, it.w));
      const Tensor rs = s.rstd(nl::all, nl::ds(it.j, 1));
      if (layer) isa::activation(dst, nl::copy, (*us)[i], {.bias = s.shift(nl::all, nl::ds(it.j, 1)), .scale = rs});
      else isa::activation(dst, nl::copy, (*us)[i], {.scale = rs});
      if (seg_start) stores.first_write_done();
      if (it.j == G.k - 1 && it.c0 + it.w == seg0 + segw) {
        const Tensor tile = *seg_tile, hbm = G.rows(grad_x)(nl::all, nl::all, nl::ds(seg0, segw));
        stores.finished([tile, hbm] { isa::dma_copy(hbm, tile); });
      }
    };
    // Output segments are finished row by row: order the items segment-major.
    std::vector<size_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return items[a].c0 / plan.segment < items[b].c0 / plan.segment;
    });
    steps.push_back([=] { U(order[0]); });
    for (size_t n = 0; n < order.size(); ++n)
      steps.push_back([=] {
        if (n + 1 < order.size()) U(order[n + 1]);
        D(order[n]);
      });
    return steps;
  };

  if (plan.resident) {
    const int la = plan.lookahead;
    for (int64_t g = 0; g < std::min<int64_t>(ng, la + 1); ++g) load(g);
    for (int64_t g = 0; g < std::min<int64_t>(ng, la); ++g)
      for (auto& step : pass1(g, resident_chunks(g))) step();
    for (int64_t g = 0; g < ng; ++g) {
      if (g + la + 1 < ng) load(g + la + 1);
      Steps a = g + la < ng ? pass1(g + la, resident_chunks(g + la)) : Steps{};
      if (la == 0) {
        for (auto& step : a) step();
        a.clear();
      }
      interleave(a, pass2(g, resident_chunks(g)));
      st[g] = GroupState{};
    }
  } else {
    for (int64_t g = 0; g < ng; ++g) {
      for (auto& step : pass1(g, streamed_chunks(g))) step();
      for (auto& step : pass2(g, streamed_chunks(g))) step();
      st[g] = GroupState{};
    }
  }
  stores.flush();
  dgamma.store(grad_gamma);
  if (dbeta) dbeta->store(*grad_beta);
  std::vector<Tensor> result{grad_x, grad_gamma};
  if (layer) result.push_back(*grad_beta);
  return result;
}

}  // namespace nikki::kernels::norm_detail
