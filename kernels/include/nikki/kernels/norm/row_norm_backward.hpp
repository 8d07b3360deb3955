// The backward of layernorm and rmsnorm:
//
//   xhat = (x - mean) * rstd  (rmsnorm: x * rstd),  g = grad_out * gamma
//   grad_x = rstd * (g - mean_h(g) - xhat * mean_h(g * xhat))   (rmsnorm: no mean_h(g) term)
//   grad_gamma = sum_r grad_out * xhat,  grad_beta = sum_r grad_out
//
// Each group of rows takes two passes over its columns, a 512-column chunk at a time.
//   Pass 1  S or V   xhat (the forward's centring)
//           V or G   g = grad_out * gamma
//           S        the row sums of g and of g * xhat (activation accumulators)
//           G or V   g * xhat and grad_out * xhat
//           TensorE  the column sums (grad_gamma, grad_beta): a matmul against a ones vector per
//                    128 columns accumulates them in fp32 PSUM across partitions and all rows, at
//                    no cost to the other engines, rounded once on the final store.
//   Pass 2  V        u = g - xhat * mean_h(g * xhat)
//           S or V   grad_x = u * rstd - rstd * mean_h(g)
// xhat and g stay in SBUF between the passes when they fit, else pass 2 recomputes them; rows too
// wide for SBUF are streamed through it twice. Steps marked with two engines are the same
// instruction on either, and the task scheduler gives each to whichever frees first.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "nikki/kernels/norm/row_norm.hpp"

namespace nikki::kernels::norm_detail {

/** The backward's maths, an instruction group per call: each call is one task, on one engine. */
struct BackwardMath {
  Kind kind;
  int64_t H;

  bool layer() const { return kind == Kind::layer; }

  /** The per-row values of a main-body stage or the tail, loaded: nb = -mean * rstd (GpSimd). */
  static void shift_of_mean(const Tensor& nb, const Tensor& mean, const Tensor& rstd, const Tensor& zero) {
    isa::tensor_tensor(nb, zero, mean, nl::subtract, isa::gpsimd_engine);
    isa::tensor_tensor(nb, nb, rstd, nl::multiply, isa::gpsimd_engine);
  }
  /** g = grad_out * gamma: on the Vector engine as (grad_out - 0) * gamma, the form it runs at one
   *  element per cycle from 16-bit inputs; on GpSimd as a product. The same bits either way. */
  static void scaled_grad(const Tensor& g, const Tensor& dy, const Tensor& gamma, Engine engine) {
    if (engine == Engine::vector) isa::scalar_tensor_tensor(g, dy, nl::subtract, 0.0, nl::multiply, gamma);
    else isa::tensor_tensor(g, dy, gamma, nl::multiply, engine);
  }
  /** sum = the row sums of t (ScalarE's accumulator; `discard` takes the unused elementwise copy). */
  static void row_sum(const Tensor& sum, const Tensor& t, const Tensor& discard) {
    isa::activation(discard, nl::copy, t, {.reduce_op = nl::add, .reduce_res = sum});
  }
  static void product(const Tensor& dst, const Tensor& a, const Tensor& b, Engine engine) {
    isa::tensor_tensor(dst, a, b, nl::multiply, engine);
  }
  /** Per-row coefficients from the chunks' row sums ([p, k, chunks]): c2 = mean_h(g * xhat) and
   *  shift = -rstd * mean_h(g) (VectorE). `scratch` is [p, k]. */
  void coefficients(const Tensor& c2, const Tensor& shift, const Tensor& sum_g, const Tensor& sum_gxhat,
                    const Tensor& rstd, const Tensor& scratch) const {
    isa::tensor_reduce(scratch, nl::add, sum_gxhat, {2});
    isa::tensor_scalar(c2, scratch, nl::multiply, 1.0 / double(H), {.engine = isa::vector_engine});
    if (!layer()) return;
    isa::tensor_reduce(scratch, nl::add, sum_g, {2});
    isa::tensor_scalar(scratch, scratch, nl::multiply, -1.0 / double(H), {.engine = isa::vector_engine});
    isa::tensor_tensor(shift, scratch, rstd, nl::multiply, isa::vector_engine);
  }
  /** u = g - xhat * c2 (VectorE). */
  static void residual(const Tensor& u, const Tensor& xhat, const Tensor& g, const Tensor& c2) {
    isa::scalar_tensor_tensor(u, xhat, nl::multiply, c2, nl::subtract, g, /*reverse0=*/false, /*reverse1=*/true);
  }
  /** grad_x = u * rstd + shift (rmsnorm: u * rstd), for one row ([p, 1] scalars). */
  void grad_x(const Tensor& dst, const Tensor& u, const Tensor& rstd, const Tensor& shift, Engine engine) const {
    if (layer()) isa::tensor_scalar(dst, u, nl::multiply, rstd, {.op1 = nl::add, .operand1 = shift, .engine = engine});
    else isa::tensor_scalar(dst, u, nl::multiply, rstd, {.engine = engine});
  }
};

/**
 * @brief Column sums over all rows accumulated in PSUM by the TensorE: for every 128-column
 * block, data[rows, block]^T @ ones[rows, 1] adds the block's column sums into one PSUM column.
 * Accumulating there, across partitions and row groups at once, costs no Vector/Scalar/GpSimd
 * time and keeps the sums in fp32 until the one rounding of the final store.
 */
class ColumnSums {
 public:
  ColumnSums(toolkit::Budget& budget, int64_t H, DType out_dtype, const std::string& name) : H_(H) {
    const int64_t P = nl::tile_size().pmax, per_tile = nl::tile_size().psum_bank_fmax;
    const int64_t nblk = ceil_div(H, P), full = H / P;
    toolkit::Ring acc = budget.psum_ring({P, per_tile}, nl::float32, ceil_div(nblk, per_tile), name);
    for (int64_t b0 = 0; b0 < nblk; b0 += per_tile)
      acc_.push_back(acc.next()(first(std::min(H, P)), nl::ds(0, std::min(per_tile, nblk - b0))));
    if (full > 0) {
      cols_ = budget.sbuf({P, std::min(full, per_tile)}, nl::float32, name + "_cols");
      rows_ = budget.sbuf({std::min(full, P), P}, out_dtype, name + "_rows");
    }
    if (H % P) last_ = budget.sbuf({H % P, 1}, out_dtype, name + "_last");
  }

  /** @brief Adds the column sums of data [p, w] (columns [c0, c0 + w), c0 a multiple of 128). */
  void add(const Tensor& data, const Tensor& ones, int64_t c0) const {
    const int64_t P = nl::tile_size().pmax, per_tile = nl::tile_size().psum_bank_fmax;
    const int64_t w = data.shape()[1];
    for (int64_t b = 0; b * P < w; ++b) {
      const int64_t wb = std::min(P, w - b * P), blk = c0 / P + b;
      isa::nc_matmul(acc_[blk / per_tile](first(wb), nl::ds(blk % per_tile, 1)), data(nl::all, nl::ds(b * P, wb)), ones);
    }
  }

  /** @brief Records the stores of the sums, rounded to out's dtype, to out [H]; `psum` is a
   *  [P, P] fp32 PSUM tile for the transposes. */
  void store(toolkit::TaskScheduler& sch, const Tensor& out, const Tensor& psum) const {
    const int64_t P = nl::tile_size().pmax, per_tile = nl::tile_size().psum_bank_fmax;
    const int64_t full = H_ / P, rem = H_ % P;
    for (size_t t = 0; t < acc_.size(); ++t) {
      const int64_t b0 = int64_t(t) * per_tile, n = acc_[t].shape()[1];
      const int64_t nfull = std::max<int64_t>(0, std::min(n, full - b0));
      if (nfull > 0) {
        // [128, blocks] -> [blocks, 128]: each block becomes one contiguous row of the output.
        const Tensor cols = cols_(nl::all, first(nfull));
        sch.add([&] { isa::tensor_copy(cols, acc_[t](nl::all, first(nfull)), isa::vector_engine); });
        for (int64_t r0 = 0; r0 < nfull; r0 += P) {
          const int64_t nr = std::min(P, nfull - r0);
          const Tensor tp = psum(first(nr), nl::all), rows = rows_(first(nr), nl::all);
          sch.add([&] { isa::nc_transpose(tp, cols(nl::all, nl::ds(r0, nr)), isa::tensor_engine); });
          sch.add([&] { isa::tensor_copy(rows, tp, isa::vector_engine); });
          sch.add([&] { isa::dma_copy(out(nl::ds((b0 + r0) * P, nr * P)).reshape({nr, P}), rows); });
        }
      }
      if (rem && full >= b0 && full < b0 + n) {
        sch.add([&] { isa::tensor_copy(last_, acc_[t](first(rem), nl::ds(full - b0, 1)), isa::vector_engine); });
        sch.add([&] { isa::dma_copy(out(nl::ds(full * P, rem)).reshape({rem, 1}), last_); });
      }
    }
  }

 private:
  int64_t H_;
  std::vector<Tensor> acc_;
  Tensor cols_, rows_, last_;
};

/** @brief Where the backward writes its row gradients when the caller gives them (HBM views
 *  [R, H] of its own outputs, e.g. a [B, S, H] output's rows); new outputs otherwise. */
struct BackwardInto {
  std::optional<Tensor> grad_x, grad_residual;
};

/**
 * @brief The backward of layernorm / rmsnorm: {grad_x, grad_gamma, grad_beta} (layernorm) or
 * {grad_x, grad_gamma} (rmsnorm). With grad_sum (the backward of a residual add fused before
 * the norm, whose normalized rows x are then the sum), grad_sum is added to grad_x, which is
 * the gradient of both addends: {grad_x, grad_residual, grad_gamma}. See the file comment for
 * the engine plan.
 */
inline std::vector<Tensor> backward(Kind kind, const Tensor& x, const Tensor& gamma, const std::optional<Tensor>& mean,
                                    const Tensor& rstd, const Tensor& dy, Loc loc,
                                    const std::optional<Tensor>& grad_sum = std::nullopt,
                                    const BackwardInto& into = {}) {
  const ArgumentCheck check((grad_sum ? std::string("add_") : std::string()) + kind_name(kind) + "_bwd", x, loc);
  if (grad_sum)
    check.require(grad_sum->shape() == x.shape() && grad_sum->dtype() == x.dtype(),
                  "grad_sum must match sum (" + std::string(dtype_name(x.dtype())) + x.shape().str() + "), got " +
                      std::string(dtype_name(grad_sum->dtype())) + grad_sum->shape().str());
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
  const int64_t P = nl::tile_size().pmax, CW = chunk_width(), nch = ceil_div(H, CW);
  const bool layer = kind == Kind::layer;
  const DType xd = x.dtype(), dd = dy.dtype(), gd = gamma.dtype();
  const BackwardMath math{kind, H};

  Tensor grad_x = into.grad_x ? *into.grad_x : nl::ndarray({R, H}, xd, nl::shared_hbm, "grad_x");
  std::optional<Tensor> grad_residual;
  if (grad_sum) grad_residual = into.grad_residual ? *into.grad_residual : nl::ndarray({R, H}, xd, nl::shared_hbm, "grad_residual");
  Tensor grad_gamma = nl::ndarray({H}, gd, nl::shared_hbm, "grad_gamma");
  std::optional<Tensor> grad_beta;
  if (layer) grad_beta = nl::ndarray({H}, gd, nl::shared_hbm, "grad_beta");

  toolkit::Budget budget(check);
  const ColumnSums dgamma(budget, H, gd, "grad_gamma_acc");
  std::optional<ColumnSums> dbeta;
  if (layer) dbeta.emplace(budget, H, gd, "grad_beta_acc");
  toolkit::Ring setup_psum = budget.psum_ring({P, P}, nl::float32, 1, "column_sums_psum");

  // Tiles in flight: input groups (or segments) per the plan; xhat and g of two groups when kept
  // between the passes; three output tiles; chunk temporaries between the engines.
  constexpr int64_t kOut = 3, kChunks = 3, kProducts = 4, kSlack = 8 * 1024;
  struct Rings {
    RingShape x, dy, gamma, cache, out, dsum, xhat, g, prod, u, discard, sums, coef, stage, tail;
    int64_t bytes() const {
      return total_bytes(
          {&x, &dy, &gamma, &cache, &out, &dsum, &xhat, &g, &prod, &u, &discard, &sums, &coef, &stage, &tail});
    }
  };
  auto rings_for = [&](const Plan& pl, bool cached) {
    const int64_t k = pl.k;
    Rings r;
    if (pl.resident) {
      r.x = {{P, k, H}, xd, pl.depth, "x_tile"};
      r.dy = {{P, k, H}, dd, pl.depth, "dy_tile"};
      r.gamma = {{P, H}, gd, 1, "gamma_rows"};
    } else {
      r.x = {{P, pl.segment}, xd, pl.depth, "x_segment"};
      r.dy = {{P, pl.segment}, dd, pl.depth, "dy_segment"};
      r.gamma = {{P, pl.segment}, gd, pl.depth, "gamma_segment"};
    }
    // The kept xhat and g: [P, 2, k, H] per group.
    r.cache = {{P, cached ? 2 * k * H : 1}, nl::float32, cached ? 2 : 1, "xhat_g"};
    r.out = {{P, k, pl.segment}, xd, kOut, "grad_x_tile"};
    r.dsum = {{P, k, pl.segment}, xd, grad_sum ? 2 : 0, "grad_sum_tile"};
    r.xhat = {{P, CW}, nl::float32, cached ? 1 : kChunks, "xhat"};
    r.g = {{P, CW}, nl::float32, cached ? 1 : kChunks, "g"};
    r.prod = {{P, CW}, nl::float32, kProducts, "product"};
    r.u = {{P, CW}, nl::float32, kChunks, "u"};
    r.discard = {{P, CW}, nl::bfloat16, 2, "discard"};
    r.sums = {{P, 2, k, nch}, nl::float32, 2, "row_sums"};
    r.coef = {{P, 3, k}, nl::float32, pl.depth + 1, "coefficients"};
    r.stage = {{P, 3, std::max<int64_t>(1, StatStaging(R, P, k).cols)}, nl::float32, 2, "stats_stage"};
    r.tail = {{P, 3}, nl::float32, 1, "tail_stats"};
    return r;
  };
  const int64_t resident_row = H * (dtype_size(xd) + dtype_size(dd));
  Plan plan = plan_rows(budget, R, H, resident_row, [&](const Plan& pl) { return rings_for(pl, true).bytes() + kSlack; });
  const bool cached = plan.resident;
  if (!cached)
    plan = plan_rows(budget, R, H, resident_row, [&](const Plan& pl) { return rings_for(pl, false).bytes() + kSlack; });
  const Rings shapes = rings_for(plan, cached);
  toolkit::Ring x_ring = shapes.x.allocate(budget), dy_ring = shapes.dy.allocate(budget);
  toolkit::Ring gamma_ring = shapes.gamma.allocate(budget), cache_ring = shapes.cache.allocate(budget);
  toolkit::Ring out_ring = shapes.out.allocate(budget), xhat_ring = shapes.xhat.allocate(budget);
  toolkit::Ring dsum_ring = grad_sum ? shapes.dsum.allocate(budget) : toolkit::Ring{};
  toolkit::Ring g_ring = shapes.g.allocate(budget), prod_ring = shapes.prod.allocate(budget);
  toolkit::Ring u_ring = shapes.u.allocate(budget), discard_ring = shapes.discard.allocate(budget);
  toolkit::Ring sums_ring = shapes.sums.allocate(budget), coef_ring = shapes.coef.allocate(budget);
  toolkit::Ring stage_ring = shapes.stage.allocate(budget);
  const Tensor tail = shapes.tail.allocate(budget).next();
  const Tensor ones = budget.sbuf({P, 1}, nl::float32, "ones");
  const Tensor ones_dy = dd == DType::float32 ? ones : budget.sbuf({P, 1}, dd, "ones_dy");
  const Tensor zero = budget.sbuf({P, std::max<int64_t>(1, StatStaging(R, P, plan.k).cols)}, nl::float32, "zero");

  const std::vector<RowGroup> groups = row_groups(R, P, plan.k);
  const StatStaging staging(R, P, plan.k);

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  sch.add([&] { isa::memset(ones, 1.0, isa::gpsimd_engine); });
  if (dd != DType::float32) sch.add([&] { isa::memset(ones_dy, 1.0, isa::gpsimd_engine); });
  if (layer) sch.add([&] { isa::memset(zero, 0.0, isa::gpsimd_engine); });
  Tensor gamma_rows;
  if (plan.resident) {
    // gamma on every partition (a stride-0 partition DMA).
    gamma_rows = gamma_ring.next();
    sch.add([&] { isa::dma_copy(gamma_rows, gamma.reshape({1, H}).broadcast(0, P)); });
  }

  Tensor stage;
  for (const RowGroup& G : groups) {
    const int64_t p = G.p, k = G.k;
    const Tensor x_rows = G.rows(x), dy_rows = G.rows(dy);

    // The per-row values: main-body groups read them from a stage of up to 512 rows per
    // partition, loaded once; the tail loads its own.
    RowScalars rows;
    {
      Tensor st;
      if (G.tail) st = tail(first(p), all).reshape_dim(1, {3, 1});
      else if (staging.opens(G)) stage = stage_ring.next();
      const int64_t n = G.tail ? 1 : staging.width(G);
      if (!G.tail) st = stage(all, all, first(n));
      const Tensor s_rstd = st(all, 0, all), s_mean = st(all, 1, all), s_nb = st(all, 2, all);
      if (G.tail || staging.opens(G)) {
        auto hbm = [&](const Tensor& t) { return G.tail ? G.stats(t) : staging.hbm(t, G); };
        sch.add([&] { isa::dma_copy(s_rstd, hbm(rstd)); });
        if (layer) {
          sch.add([&] { isa::dma_copy(s_mean, hbm(*mean)); });
          sch.add([&] { math.shift_of_mean(s_nb, s_mean, s_rstd, zero(first(p), first(n))); });
        }
      }
      auto cols = [&](const Tensor& t) { return G.tail ? t : staging.columns(t, G); };
      rows.rstd = cols(s_rstd);
      if (layer) {
        rows.mean = cols(s_mean);
        rows.nb = cols(s_nb);
      }
    }

    // Where the passes read their chunks: the resident group, or segments streamed per pass.
    Tensor xt, dyt;
    if (plan.resident) {
      xt = x_ring.next()(first(p), first(k), all);
      dyt = dy_ring.next()(first(p), first(k), all);
      for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
        const auto c = nl::ds(s0, std::min(plan.segment, H - s0));
        sch.add([&] { isa::dma_copy(xt(all, all, c), x_rows(all, all, c)); });
        sch.add([&] { isa::dma_copy(dyt(all, all, c), dy_rows(all, all, c)); });
      }
    }
    struct Segment {
      Tensor x, dy, gamma;  // [p, sw]
      int64_t s0 = 0;
    };
    auto load_segment = [&](int64_t s0) {
      const int64_t sw = std::min(plan.segment, H - s0);
      Segment s{x_ring.next()(first(p), nl::ds(0, sw)), dy_ring.next()(first(p), nl::ds(0, sw)),
                gamma_ring.next()(first(p), nl::ds(0, sw)), s0};
      sch.add([&] { isa::dma_copy(s.x, x_rows(all, 0, nl::ds(s0, sw))); });
      sch.add([&] { isa::dma_copy(s.dy, dy_rows(all, 0, nl::ds(s0, sw))); });
      sch.add([&] { isa::dma_copy(s.gamma, gamma(nl::ds(s0, sw)).reshape({1, sw}).broadcast(0, p)); });
      return s;
    };
    struct Chunk {
      Tensor x, dy, gamma;  // [p, w]
    };
    auto chunk = [&](const Segment& s, int64_t j, int64_t c0, int64_t w) {
      if (plan.resident) return Chunk{xt(all, j, nl::ds(c0, w)), dyt(all, j, nl::ds(c0, w)), gamma_rows(first(p), nl::ds(c0, w))};
      const auto c = nl::ds(c0 - s.s0, w);
      return Chunk{s.x(all, c), s.dy(all, c), s.gamma(all, c)};
    };
    // xhat and g of one chunk, into the kept tiles or into temporaries.
    const Tensor kept = cached ? cache_ring.next()(first(p), first(2 * k * H)).reshape_dim(1, {2, k, H}) : Tensor{};
    auto xhat_and_g = [&](const Chunk& c, int64_t j, int64_t c0, int64_t w) {
      const Tensor xh = cached ? kept(all, 0, j, nl::ds(c0, w)) : xhat_ring.next()(first(p), nl::ds(0, w));
      const Tensor g = cached ? kept(all, 1, j, nl::ds(c0, w)) : g_ring.next()(first(p), nl::ds(0, w));
      const RowScalars r = rows.row(j);
      if (subtracts_mean(kind, xd)) sch.add([&] { center(kind, xh, c.x, r, vector); });
      else sch.add_any({[&] { center(kind, xh, c.x, r, vector); }, [&] { center(kind, xh, c.x, r, scalar); }});
      sch.add_any({[&] { math.scaled_grad(g, c.dy, c.gamma, vector); }, [&] { math.scaled_grad(g, c.dy, c.gamma, gpsimd); }});
      return std::pair{xh, g};
    };

    // Pass 1: xhat, g, their row sums and the column sums.
    const Tensor sums = sums_ring.next()(first(p), all, first(k), all);
    const Tensor sum_g = sums(all, 0, all, all), sum_gxhat = sums(all, 1, all, all);
    Segment seg;
    for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
      if (!plan.resident) seg = load_segment(s0);
      const int64_t sw = std::min(plan.segment, H - s0);
      for (int64_t j = 0; j < k; ++j)
        for (int64_t c0 = s0; c0 < s0 + sw; c0 += CW) {
          const int64_t w = std::min(CW, s0 + sw - c0), ci = c0 / CW;
          const Chunk c = chunk(seg, j, c0, w);
          const std::pair<Tensor, Tensor> xg = xhat_and_g(c, j, c0, w);
          const Tensor xh = xg.first, g = xg.second;
          const Tensor discard = discard_ring.next()(first(p), nl::ds(0, w));
          const Tensor gxhat = prod_ring.next()(first(p), nl::ds(0, w)), dyxhat = prod_ring.next()(first(p), nl::ds(0, w));
          if (layer) sch.add([&] { math.row_sum(sum_g(all, j, nl::ds(ci, 1)), g, discard); });
          sch.add_any({[&] { math.product(gxhat, g, xh, gpsimd); }, [&] { math.product(gxhat, g, xh, vector); }});
          sch.add([&] { math.row_sum(sum_gxhat(all, j, nl::ds(ci, 1)), gxhat, gxhat); });
          sch.add_any({[&] { math.product(dyxhat, c.dy, xh, gpsimd); }, [&] { math.product(dyxhat, c.dy, xh, vector); }});
          sch.add([&] { dgamma.add(dyxhat, ones(first(p), all), c0); });
          if (layer) sch.add([&] { dbeta->add(c.dy, ones_dy(first(p), all), c0); });
        }
    }
    const Tensor coef = coef_ring.next()(first(p), all, first(k));
    const Tensor c2 = coef(all, 0, all), shift = coef(all, 1, all);
    sch.add([&] { math.coefficients(c2, shift, sum_g, sum_gxhat, rows.rstd, coef(all, 2, all)); });

    // Pass 2: grad_x, an output segment at a time.
    for (int64_t s0 = 0; s0 < H; s0 += plan.segment) {
      const int64_t sw = std::min(plan.segment, H - s0);
      if (!plan.resident) seg = load_segment(s0);
      const Tensor ot = out_ring.next()(first(p), first(k), nl::ds(0, sw));
      for (int64_t j = 0; j < k; ++j)
        for (int64_t c0 = s0; c0 < s0 + sw; c0 += CW) {
          const int64_t w = std::min(CW, s0 + sw - c0);
          Tensor xh, g;
          if (cached) {
            xh = kept(all, 0, j, nl::ds(c0, w));
            g = kept(all, 1, j, nl::ds(c0, w));
          } else {
            std::tie(xh, g) = xhat_and_g(chunk(seg, j, c0, w), j, c0, w);
          }
          const Tensor u = u_ring.next()(first(p), nl::ds(0, w)), dst = ot(all, j, nl::ds(c0 - s0, w));
          const Tensor rs = rows.rstd(all, nl::ds(j, 1)), sh = shift(all, nl::ds(j, 1));
          sch.add([&] { math.residual(u, xh, g, c2(all, nl::ds(j, 1))); });
          sch.add_any({[&] { math.grad_x(dst, u, rs, sh, vector); }, [&] { math.grad_x(dst, u, rs, sh, scalar); }});
        }
      if (grad_sum) {
        // The gradient through the norm plus the one that reached the sum directly, for both addends.
        const Tensor gs = dsum_ring.next()(first(p), first(k), nl::ds(0, sw));
        sch.add([&] { isa::dma_copy(gs, G.rows(*grad_sum)(all, all, nl::ds(s0, sw))); });
        sch.add_any({[&] { isa::tensor_tensor(ot, ot, gs, nl::add, isa::vector_engine); },
                     [&] { isa::tensor_tensor(ot, ot, gs, nl::add, isa::gpsimd_engine); }});
        sch.add([&] { isa::dma_copy(G.rows(*grad_residual)(all, all, nl::ds(s0, sw)), ot); });
      }
      sch.add([&] { isa::dma_copy(G.rows(grad_x)(all, all, nl::ds(s0, sw)), ot); });
    }
  }
  const Tensor setup = setup_psum.next();
  dgamma.store(sch, grad_gamma, setup);
  if (dbeta) dbeta->store(sch, *grad_beta, setup);
  sch.run();
  std::vector<Tensor> result{grad_x};
  if (grad_sum) result.push_back(*grad_residual);
  result.push_back(grad_gamma);
  if (layer) result.push_back(*grad_beta);
  return result;
}

}  // namespace nikki::kernels::norm_detail
