// The forward of layernorm and rmsnorm. Per group of rows:
//   VectorE   bn_stats over chunks of bn_stats_fmax, bn_aggr per row        -> mean, var
//   GpSimd    rstd = rsqrt(var + eps) (rms: mean^2 + var + eps), nb = -mean * rstd
//   S or V    y = x * rstd + nb in fp32, a 512-column chunk at a time (fp32 x: (x - mean) * rstd)
//   TensorE   yT = transpose(y): the columns of x now lie on partitions, so gamma and beta are
//             per-partition scalars ...
//   S or V    ... and oT = yT * gamma + beta is one instruction per 128-column block (x's dtype)
//   TensorE   o = transpose(oT) into PSUM; S or V copies it to the output tile; one DMA stores it.
// The transposes cost TensorE time that is otherwise idle, and they spare the two full fp32
// tensor_tensor passes (x2 cycles each) a row-layout gamma/beta would need. The three passes
// marked "S or V" are the same instruction on either engine, so the task scheduler gives each to
// whichever frees first: the Scalar engine takes most of them while VectorE computes statistics.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/norm/row_norm.hpp"

namespace nikki::kernels::norm_detail {

/** The forward's maths, an instruction group per call: each call is one task, on one engine. */
struct ForwardMath {
  Kind kind;
  DType x_dtype;

  bool layer() const { return kind == Kind::layer; }
  bool subtracts_mean() const { return norm_detail::subtracts_mean(kind, x_dtype); }

  /** (count, mean, variance) of one row's chunk of at most bn_stats_fmax columns. */
  static void chunk_stats(const Tensor& stats, const Tensor& x) { isa::bn_stats(stats, x); }
  /** mean and variance of each row from its chunks' statistics. */
  static void aggregate(const Tensor& mean_var, const Tensor& stats) { isa::bn_aggr(mean_var, stats); }

  /** rstd and nb from bn_aggr's (mean, var), on GpSimd (idle otherwise; it has no tensor_scalar
   *  add, hence eps as a tile). `scratch` is [p, 2, k]. */
  void row_scalars(const RowScalars& r, const Tensor& mean_var, const Tensor& eps, const Tensor& zero,
                   const Tensor& scratch) const {
    const Tensor mean = mean_var(nl::all, nl::all, 0), var = mean_var(nl::all, nl::all, 1);
    const Tensor ve = scratch(nl::all, 0, nl::all), t = scratch(nl::all, 1, nl::all);
    if (layer()) {
      isa::tensor_copy(r.mean, mean, isa::gpsimd_engine);
      isa::tensor_tensor(ve, var, eps, nl::add, isa::gpsimd_engine);
    } else {
      // mean(x^2) = var + mean^2: both terms are non-negative, so no cancellation.
      isa::tensor_tensor(t, mean, mean, nl::multiply, isa::gpsimd_engine);
      isa::tensor_tensor(t, t, var, nl::add, isa::gpsimd_engine);
      isa::tensor_tensor(ve, t, eps, nl::add, isa::gpsimd_engine);
    }
    isa::tensor_scalar(r.rstd, ve, nl::rsqrt, 0.0, {.engine = isa::gpsimd_engine});
    if (layer()) {
      isa::tensor_tensor(t, zero, r.mean, nl::subtract, isa::gpsimd_engine);
      isa::tensor_tensor(r.nb, t, r.rstd, nl::multiply, isa::gpsimd_engine);
    }
  }

  void center(const Tensor& y, const Tensor& x, const RowScalars& r, Engine engine) const {
    norm_detail::center(kind, y, x, r, engine);
  }

  /** Transposes [p, w] in 128-column blocks into [128, blocks, p] (TensorE). */
  static void transpose(const Tensor& dst, const Tensor& src) {
    const int64_t P = nl::tile_size().pmax, p = src.shape()[0], w = src.shape()[1];
    for (int64_t b = 0; b * P < w; ++b) {
      const int64_t wb = std::min(P, w - b * P);
      isa::nc_transpose(dst(first(wb), b, first(p)), src(nl::all, nl::ds(b * P, wb)), isa::tensor_engine);
    }
  }
  /** The inverse: [128, blocks, p] back into [p, w] (TensorE). */
  static void transpose_back(const Tensor& dst, const Tensor& src) {
    const int64_t P = nl::tile_size().pmax, p = dst.shape()[0], w = dst.shape()[1];
    for (int64_t b = 0; b * P < w; ++b) {
      const int64_t wb = std::min(P, w - b * P);
      isa::nc_transpose(dst(nl::all, nl::ds(b * P, wb)), src(first(wb), b, first(p)), isa::tensor_engine);
    }
  }

  /** oT = yT * gamma + beta (rmsnorm: yT * gamma) in the transposed domain, for the w columns
   *  starting at block blk0: one instruction per 128-column block. */
  void affine(const Tensor& oT, const Tensor& yT, int64_t p, int64_t w, const ColumnBlocks& gamma,
              const ColumnBlocks* beta, int64_t blk0, Engine engine) const {
    const int64_t P = nl::tile_size().pmax;
    for (int64_t b = 0; b * P < w; ++b) {
      const int64_t wb = std::min(P, w - b * P);
      const Tensor dst = oT(first(wb), b, first(p)), src = yT(first(wb), b, first(p));
      if (beta)
        isa::tensor_scalar(dst, src, nl::multiply, gamma.block(blk0 + b, wb),
                           {.op1 = nl::add, .operand1 = beta->block(blk0 + b, wb), .engine = engine});
      // + 0 turns the -0 of a zero row element times a negative gamma into +0: the copy out of
      // PSUM keeps a -0 on VectorE but not on ScalarE (an activation adds its bias), and the
      // result must not depend on which engine the scheduler picks. (A second op is free.)
      else
        isa::tensor_scalar(dst, src, nl::multiply, gamma.block(blk0 + b, wb),
                           {.op1 = nl::add, .operand1 = 0.0, .engine = engine});
    }
  }
};

/**
 * @brief The forward of layernorm / rmsnorm: returns {out, mean, rstd} (layernorm) or
 * {out, rstd} (rmsnorm). With a residual, the rows normalized are sum = x + residual (rounded
 * to x's dtype, as an unfused add would), which is returned after out: {out, sum, rstd}. See the
 * file comment for the engine plan.
 */
inline std::vector<Tensor> forward(Kind kind, const Tensor& x, const Tensor& gamma, const std::optional<Tensor>& beta,
                                   double eps, Loc loc, const std::optional<Tensor>& residual = std::nullopt) {
  const ArgumentCheck check(residual ? std::string("add_") + kind_name(kind) : kind_name(kind), x, loc);
  if (beta) check_inputs(check, x, {&gamma, &*beta});
  else check_inputs(check, x, {&gamma});
  if (residual)
    check.require(residual->shape() == x.shape() && residual->dtype() == x.dtype(),
                  "residual must match x (" + std::string(dtype_name(x.dtype())) + x.shape().str() + "), got " +
                      std::string(dtype_name(residual->dtype())) + residual->shape().str(),
                  "pass the residual stream in x's shape and dtype");
  check.require(eps >= 0 && std::isfinite(eps), "eps must be a finite non-negative number");
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, R = x.shape()[0], H = x.shape()[1], F = ts.bn_stats_fmax, CW = chunk_width();
  const int64_t nst = ceil_div(H, F);
  const bool layer = kind == Kind::layer;
  const DType xd = x.dtype();
  const ForwardMath math{kind, xd};

  Tensor out = nl::ndarray({R, H}, xd, nl::shared_hbm, "out");
  std::optional<Tensor> mean_o;
  if (layer) mean_o = nl::ndarray({R}, nl::float32, nl::shared_hbm, "mean");
  Tensor rstd_o = nl::ndarray({R}, nl::float32, nl::shared_hbm, "rstd");
  std::optional<Tensor> sum_o;
  if (residual) sum_o = nl::ndarray({R, H}, xd, nl::shared_hbm, "sum");

  toolkit::Budget budget(check);
  const ColumnBlocks gamma_cols(budget, H, "gamma_cols");
  std::optional<ColumnBlocks> beta_cols;
  if (layer) beta_cols.emplace(budget, H, "beta_cols");

  // Tiles in flight: input groups (or segments) per the plan, three output tiles (filling,
  // waiting, storing), three chunks between the engines, two groups' statistics; per-row values
  // for every group in flight.
  constexpr int64_t kOut = 3, kChunks = 3, kStats = 2, kSlack = 8 * 1024, kLoadsAhead = 32 * 1024;
  const int64_t nstat = layer ? 2 : 1;
  struct Rings {
    RingShape x, res, out, y, oT, stats, mean_var, nb, scratch, consts, stage, tail;
    int64_t bytes() const {
      return total_bytes({&x, &res, &out, &y, &oT, &stats, &mean_var, &nb, &scratch, &consts, &stage, &tail});
    }
  };
  auto rings_for = [&](const Plan& pl) {
    const int64_t k = pl.k;
    Rings r;
    r.x = pl.resident ? RingShape{{P, k, H}, xd, pl.depth, "x_tile"} : RingShape{{P, pl.segment}, xd, pl.depth, "x_segment"};
    r.res = r.x;  // the residual's tiles, added into x's as they arrive
    r.res.depth = residual ? std::min<int64_t>(pl.depth, 2) : 0;
    r.res.name = "residual_tile";
    r.out = {{P, k, pl.segment}, xd, kOut, "out_tile"};
    r.y = {{P, CW}, nl::float32, kChunks, "y"};
    r.oT = {{P, CW / P, P}, xd, kChunks, "oT"};
    r.stats = {{P, k, nst * 6}, nl::float32, kStats, "bn_stats"};
    r.mean_var = {{P, k, 2}, nl::float32, kStats, "bn_aggr"};
    r.nb = {{P, k}, nl::float32, pl.depth + 1, "nb"};
    r.scratch = {{P, 2, k}, nl::float32, kStats, "row_scratch"};
    r.consts = {{P, 2, k}, nl::float32, 1, "eps_zero"};
    r.stage = {{P, nstat, std::max<int64_t>(1, StatStaging(R, P, k).cols)}, nl::float32, 2, "stats_stage"};
    r.tail = {{P, nstat}, nl::float32, 1, "tail_stats"};
    return r;
  };
  const Plan plan = plan_rows(
      budget, R, H, H * dtype_size(xd), [&](const Plan& pl) { return rings_for(pl).bytes() + kSlack; }, kLoadsAhead);
  const Rings shapes = rings_for(plan);
  toolkit::Ring x_ring = shapes.x.allocate(budget), out_ring = shapes.out.allocate(budget);
  toolkit::Ring res_ring = residual ? shapes.res.allocate(budget) : toolkit::Ring{};
  toolkit::Ring y_ring = shapes.y.allocate(budget), oT_ring = shapes.oT.allocate(budget);
  toolkit::Ring stats_ring = shapes.stats.allocate(budget), mv_ring = shapes.mean_var.allocate(budget);
  toolkit::Ring nb_ring = shapes.nb.allocate(budget), scratch_ring = shapes.scratch.allocate(budget);
  const Tensor consts = shapes.consts.allocate(budget).next(), tail = shapes.tail.allocate(budget).next();
  toolkit::Ring stage_ring = shapes.stage.allocate(budget);
  toolkit::Ring setup_psum = budget.psum_ring({P, P}, nl::float32, 1, "column_blocks_psum");
  toolkit::Ring yT_ring = budget.psum_ring({P, CW / P, P}, nl::float32, kChunks, "yT");
  toolkit::Ring o_ring = budget.psum_ring({P, CW}, xd, 4, "o");

  const std::vector<RowGroup> groups = row_groups(R, P, plan.k);
  const StatStaging staging(R, P, plan.k);
  const Tensor eps_t = consts(nl::all, 0, nl::all), zero_t = consts(nl::all, 1, nl::all);

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar;
  const Tensor setup = setup_psum.next();
  gamma_cols.load(sch, gamma, setup);
  if (layer) beta_cols->load(sch, *beta, setup);
  sch.add([&] { isa::memset(eps_t, eps, isa::gpsimd_engine); });
  if (layer) sch.add([&] { isa::memset(zero_t, 0.0, isa::gpsimd_engine); });

  Tensor stage;
  for (const RowGroup& G : groups) {
    const int64_t p = G.p, k = G.k;
    const Tensor x_rows = G.rows(x);
    // With a residual, sum = x + residual replaces x as it arrives (VectorE or GpSimd) and is
    // stored at once; streamed rows read the stored sum back for their second pass.
    const Tensor again_rows = residual ? G.rows(*sum_o) : x_rows;
    auto add_residual = [&](const Tensor& xs, const Tensor& res_rows, const Tensor& sum_rows) {
      const Tensor rs = res_ring.next();
      const Tensor rt = xs.ndim() == 3 ? rs(first(p), first(k), nl::ds(0, xs.shape()[2])) : rs(first(p), nl::ds(0, xs.shape()[1]));
      sch.add([&] { isa::dma_copy(rt, res_rows); });
      sch.add_any({[&] { isa::tensor_tensor(xs, xs, rt, nl::add, isa::vector_engine); },
                   [&] { isa::tensor_tensor(xs, xs, rt, nl::add, isa::gpsimd_engine); }});
      sch.add([&] { isa::dma_copy(sum_rows, xs); });
    };
    // Statistics: one bn_stats per row chunk, one bn_aggr per row. Whole rows are loaded once, in
    // pieces of at most one output segment per row (a store queued behind one huge load would
    // hold its output buffer for as long); streamed rows a segment at a time, read again below.
    const Tensor st = stats_ring.next()(first(p), first(k), all), mv = mv_ring.next()(first(p), first(k), all);
    Tensor xt;
    if (plan.resident) {
      xt = x_ring.next()(first(p), first(k), all);
      for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
        const auto cols = nl::ds(s0, std::min(plan.segment, H - s0));
        sch.add([&] { isa::dma_copy(xt(all, all, cols), x_rows(all, all, cols)); });
        if (residual) add_residual(xt(all, all, cols), G.rows(*residual)(all, all, cols), again_rows(all, all, cols));
      }
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t c = 0; c < nst; ++c)
          sch.add([&] { math.chunk_stats(st(all, j, nl::ds(c * 6, 6)), xt(all, j, nl::ds(c * F, std::min(F, H - c * F)))); });
        sch.add([&] { math.aggregate(mv(all, j, all), st(all, j, all)); });
      }
    } else {
      for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
        const int64_t sw = std::min(plan.segment, H - s0);
        const Tensor xs = x_ring.next()(first(p), nl::ds(0, sw));
        sch.add([&] { isa::dma_copy(xs, x_rows(all, 0, nl::ds(s0, sw))); });
        if (residual) add_residual(xs, G.rows(*residual)(all, 0, nl::ds(s0, sw)), again_rows(all, 0, nl::ds(s0, sw)));
        for (int64_t c = 0; c < sw; c += F)
          sch.add([&] { math.chunk_stats(st(all, 0, nl::ds((s0 + c) / F * 6, 6)), xs(all, nl::ds(c, std::min(F, sw - c)))); });
      }
      sch.add([&] { math.aggregate(mv(all, 0, all), st(all, 0, all)); });
    }

    // Per-row scalars: main-body groups write mean and rstd straight into the staging tile, which
    // is stored once it is full; the tail stores its own.
    RowScalars rows;
    if (G.tail) {
      if (layer) rows.mean = tail(first(p), nl::ds(0, 1));
      rows.rstd = tail(first(p), nl::ds(nstat - 1, 1));
    } else {
      if (staging.opens(G)) stage = stage_ring.next();
      if (layer) rows.mean = staging.columns(stage(all, 0, all), G);
      rows.rstd = staging.columns(stage(all, nstat - 1, all), G);
    }
    if (layer) rows.nb = nb_ring.next()(first(p), first(k));
    const Tensor scratch = scratch_ring.next()(first(p), all, first(k));
    sch.add([&] { math.row_scalars(rows, mv, eps_t(first(p), first(k)), zero_t(first(p), first(k)), scratch); });
    if (G.tail) {
      if (layer) sch.add([&] { isa::dma_copy(G.stats(*mean_o), rows.mean); });
      sch.add([&] { isa::dma_copy(G.stats(rstd_o), rows.rstd); });
    } else if (staging.closes(G)) {
      const auto width = first(staging.width(G));
      if (layer) sch.add([&] { isa::dma_copy(staging.hbm(*mean_o, G), stage(all, 0, width)); });
      sch.add([&] { isa::dma_copy(staging.hbm(rstd_o, G), stage(all, nstat - 1, width)); });
    }

    // Normalize and store, an output segment at a time.
    for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
      const int64_t sw = std::min(plan.segment, H - s0);
      const Tensor ot = out_ring.next()(first(p), first(k), nl::ds(0, sw));
      Tensor xs;
      if (!plan.resident) {
        xs = x_ring.next()(first(p), nl::ds(0, sw));
        sch.add([&] { isa::dma_copy(xs, again_rows(all, 0, nl::ds(s0, sw))); });
      }
      for (int64_t j = 0; j < k; ++j)
        for (int64_t c0 = s0; c0 < s0 + sw; c0 += CW) {
          const int64_t w = std::min(CW, s0 + sw - c0);
          const Tensor xc = plan.resident ? xt(all, j, nl::ds(c0, w)) : xs(all, nl::ds(c0 - s0, w));
          const Tensor y = y_ring.next()(first(p), nl::ds(0, w)), yT = yT_ring.next(), oT = oT_ring.next();
          const Tensor o = o_ring.next()(first(p), nl::ds(0, w)), dst = ot(all, j, nl::ds(c0 - s0, w));
          const RowScalars r = rows.row(j);
          // The same instruction on the Vector or the Scalar engine: whichever frees first.
          auto either = [&](auto step) { sch.add_any({[&] { step(vector); }, [&] { step(scalar); }}); };
          if (math.subtracts_mean()) sch.add([&] { math.center(y, xc, r, vector); });
          else either([&](Engine e) { math.center(y, xc, r, e); });
          sch.add([&] { math.transpose(yT, y); });
          const ColumnBlocks* bc = beta_cols ? &*beta_cols : nullptr;
          either([&](Engine e) { math.affine(oT, yT, p, w, gamma_cols, bc, c0 / P, e); });
          sch.add([&] { math.transpose_back(o, oT); });
          either([&](Engine e) { copy_out(dst, o, e); });
        }
      sch.add([&] { isa::dma_copy(G.rows(out)(all, all, nl::ds(s0, sw)), ot); });
    }
  }
  sch.run();
  std::vector<Tensor> result{out};
  if (residual) result.push_back(*sum_o);
  if (layer) result.push_back(*mean_o);
  result.push_back(rstd_o);
  return result;
}

}  // namespace nikki::kernels::norm_detail
