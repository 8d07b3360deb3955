// The fused q/k/v projection of an attention block: optional residual add, optional RMSNorm or
// LayerNorm, x_norm @ w_qkv + bias, split into q, k, v in the [B, heads, S, D] layout attention
// takes, q and k rotated by RoPE. One pass over the tokens, Tensor-engine bound for prefill and
// bound by reading w_qkv for decode.
//
// Tokens (the B * S rows of x) go in blocks of up to four 128-row tiles. Per row tile, the norm
// family's maths: bn_stats / bn_aggr statistics (VectorE), rstd (GpSimd), y = x * rstd + nb in
// fp32 (Scalar or Vector), transposed on TensorE, so that gamma and beta are per-partition
// scalars of the instruction (Scalar or Vector) that writes x_norm^T, the hidden dim on
// partitions, straight into the stationary operand of the projection. The weight streams past the
// resident x_norm^T in slabs of its rows (one DMA per 128 rows): 512 columns for four row tiles
// (prefill), up to four PSUM banks of columns for one (decode: 4 KiB runs). Column chunks are
// whole heads, at most one PSUM bank each, so each accumulator holds whole heads of its tokens:
// VectorE adds the bias as it leaves PSUM (rounding once to x's dtype, as torch's projection),
// rope's maths rotates the q and k heads in place (Vector and GpSimd), and one DMA per q, k or v
// run of heads and per run of sequences stores them into [B, heads, S, D].
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/qkv_common.hpp"
#include "nikki/kernels/mlp/transposed_rows.hpp"
#include "nikki/kernels/norm/row_norm_forward.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* qkv_doc = R"(Fused q/k/v projection: norm(x) @ w_qkv + bias, split into heads, rope on q and k.

Dimensions: x [B, S, H], w_qkv [H, I], bias [I], gamma [H], beta [H], cos and sin [S, r],
            [B, S, r] or [1, S, r] -> q [B, Hq, S, D], k [B, Hkv, S, D], v [B, Hkv, S, D],
            mean [B * S], rstd [B * S]; I = (Hq + 2 Hkv) * D, D <= 512, r even <= D; any B, S, H
            (H up to what a block of tokens' x_norm^T leaves of SBUF: ~24K at bf16).
Args:       x: the hidden states, float32 / bfloat16 / float16; w_qkv: [H, I] in x's dtype, the q,
              k and v weights side by side (each Linear weight transposed: w_qkv = cat(Wq.T, Wk.T,
              Wv.T, dim=1)); bias: [I] in x's dtype (zeros for none).
            gamma, beta: the norm's weight and bias (any float dtype); ignored by the norms that do
              not use them (beta by rmsnorm, both by norm 0).
            cos, sin: rotary tables as rope takes them, one row per position of x (per sequence
              when [B, S, r]: decode passes each sequence's positions); ignored without rope.
            q_heads, kv_heads: Hq and Hkv (required). norm: 0 none, 1 rmsnorm, 2 layernorm. eps:
              the norm's epsilon. rope: rotate q and k. interleaved: rope's pair layout.
Returns:    q, k, v in x's dtype; mean and rstd of each token row (fp32; 0 and 1 where the norm
            has none), saved for the backward.
Notes:      one pass over the tokens: the norm's statistics and x_norm^T (the hidden dim on
            partitions) are computed per block of up to 512 tokens and stay on chip as the
            projection's stationary operand while w_qkv streams past in slabs (512 columns per
            128 rows for prefill, 2048 for decode). Products accumulate in fp32 PSUM over H; bias
            is added as they leave PSUM and the sums are rounded once to x's dtype (as torch's
            linear); rope then rotates the q and k heads of each tile in place with rope's maths
            (products rounded to x's dtype when the tables have it, as torch computes the
            formula). x_norm is rounded to x's dtype once, after gamma and beta (torch's rms_norm
            in 16-bit dtypes also rounds x * rstd before gamma: one unit in the last place).
Pseudocode: xn = norm(x.reshape(B * S, H)) * gamma (+ beta)          # none: xn = x
            rows = (xn @ w_qkv + bias).reshape(B, S, Hq + 2 Hkv, D).transpose(1, 2)
            q, k, v = rows.split([Hq, Hkv, Hkv], dim=1)
            q, k = rope(q, cos, sin), rope(k, cos, sin)               # when rope)";

inline constexpr const char* add_qkv_doc = R"(Residual add fused with the q/k/v projection: sum = x + residual, then qkv on the sum.

Dimensions: x [B, S, H], residual [B, S, H], w_qkv [H, I], bias [I], gamma [H], beta [H], cos and
            sin [S, r], [B, S, r] or [1, S, r] -> q [B, Hq, S, D], k [B, Hkv, S, D],
            v [B, Hkv, S, D], sum [B, S, H], mean [B * S], rstd [B * S]; as qkv.
Args:       x, residual: of one shape and dtype (the previous layer's output and the residual
            stream); the rest as qkv.
Returns:    q, k, v and sum (the next residual) in x's dtype; mean and rstd (fp32) of each row of
            the sum, saved for the backward.
Notes:      qkv's kernel with the add folded into its loads: the residual's row tile arrives
            beside x's, one VectorE or GpSimd add forms the sum in place, rounded to x's dtype as
            an unfused add would, and it is stored at once; the norm and the projection then run
            on it exactly as in qkv.
Pseudocode: sum = x + residual
            q, k, v = qkv(sum, w_qkv, bias, gamma, beta, cos, sin))";

namespace attention {

/** @brief The forward of qkv (residual: add_qkv): {q, k, v[, sum], mean, rstd}; see qkv_doc. */
inline std::vector<Tensor> qkv_forward(const ArgumentCheck& check, const Tensor& x, const std::optional<Tensor>& residual,
                                       const Tensor& w, const Tensor& bias, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& cos, const Tensor& sin, const reference::QkvConfig& cfg) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const QkvDims d = check_qkv(check, x, "x", w, gamma, beta, cos, sin, cfg);
  const DType dt = x.dtype();
  if (residual) require_tensor(check, *residual, "residual", x.shape(), dt, "pass the residual stream in x's shape and dtype");
  require_tensor(check, bias, "bias", Shape{d.I}, dt, "pass zeros for a projection without bias");
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, bank = ts.psum_bank_fmax, F = ts.bn_stats_fmax, CW = norm_detail::chunk_width();
  const int64_t es = dtype_size(dt), nH = ceil_div(d.H, P), nst = ceil_div(d.H, F);
  const std::optional<norm_detail::Kind> kind = norm_kind(cfg);
  const bool rope = cfg.rope;
  const DType table_dt = cos.dtype(), cd = table_dt == dt ? dt : DType::float32;  // rope's product dtype

  Tensor q = nl::ndarray({d.B, d.Hq, d.S, d.D}, dt, nl::shared_hbm, "q");
  Tensor k = nl::ndarray({d.B, d.Hkv, d.S, d.D}, dt, nl::shared_hbm, "k");
  Tensor v = nl::ndarray({d.B, d.Hkv, d.S, d.D}, dt, nl::shared_hbm, "v");
  std::optional<Tensor> sum;
  if (residual) sum = nl::ndarray(x.shape(), dt, nl::shared_hbm, "sum");
  Tensor mean = nl::ndarray({d.M}, nl::float32, nl::shared_hbm, "mean");
  Tensor rstd = nl::ndarray({d.M}, nl::float32, nl::shared_hbm, "rstd");
  const Tensor outputs[3] = {q, k, v};
  const Tensor x2 = x.reshape({d.M, d.H});

  // Column chunks of whole heads, one PSUM bank each; a slab spans `spans` chunks.
  const int64_t hb = bank / d.D, CWb = hb * d.D;
  auto spans_for = [&](int64_t block) { return std::max<int64_t>(1, 4 / ceil_div(block, P)); };
  constexpr int64_t kRows = 2, kY = 3, kStats = 2, kOut = 4, kProducts = 2, kSlack = 8 * 1024;
  const int64_t r = std::max<int64_t>(d.r, 2);
  auto slabs_for = [&](int64_t spans) { return std::max<int64_t>(4, 16 / spans); };
  // SBUF per partition of a plan: x_norm^T (double-buffered when it fits), the rows, the weight
  // slabs, the resident bias rows, the output tiles, the norm's and rope's temporaries.
  auto footprint = [&](int64_t block, int64_t xT_depth) {
    const int64_t spans = spans_for(block), tiles = ceil_div(block, P);
    int64_t bytes = xT_depth * nH * block * es + kRows * d.H * es * (residual ? 2 : 1) +
                    slabs_for(spans) * spans * CWb * es + d.I * es + kOut * CWb * es + kSlack;
    if (kind) bytes += kY * CW * 4 + kStats * (nst * 6 + 2 + 4) * 4 + 2 * (nH * 4 + P * 4);
    if (rope) bytes += 2 * kProducts * hb * r * dtype_size(cd) + 2 * tiles * r * (2 * dtype_size(table_dt) + dtype_size(cd));
    return bytes;
  };
  toolkit::Budget budget(check);
  int64_t TB = 0, xT_depth = 1;
  for (int64_t depth : {2, 1}) {
    for (int64_t block = std::min(4 * P, ceil_div(d.M, P) * P); block >= P && TB == 0; block -= P)
      if (budget.fits(footprint(block, depth))) TB = block, xT_depth = depth;
    if (TB > 0) break;
  }
  if (TB == 0)
    check.fail("a block of 128 tokens of x (H = " + std::to_string(d.H) + ", " + dtype_text(x) +
                   ") does not fit in SBUF with the projection's tiles",
               "x_norm^T of 128 tokens and two rows of x take " + std::to_string(footprint(P, 1) / 1024) +
                   " KiB per partition, SBUF holds " + std::to_string(budget.sbuf_capacity() / 1024) + " KiB",
               "use a 16-bit dtype or a smaller hidden size");
  const int64_t spans = spans_for(TB), SW = spans * CWb;
  toolkit::Ring xT_ring = budget.sbuf_ring({P, nH, TB}, dt, xT_depth, "x_norm_T");
  toolkit::Ring row_ring = budget.sbuf_ring({P, d.H}, dt, kRows, "x_rows");
  toolkit::Ring res_ring = residual ? budget.sbuf_ring({P, d.H}, dt, kRows, "residual_rows") : toolkit::Ring{};
  toolkit::Ring slab_ring = budget.sbuf_ring({P, SW}, dt, slabs_for(spans), "w_qkv_slab");
  const Tensor bias_rows = budget.sbuf({P, d.I}, dt, "bias_rows");
  toolkit::Ring out_ring = budget.sbuf_ring({P, CWb}, dt, kOut, "qkv_tile");
  // The norm's tiles: fp32 chunks, per-row statistics, gamma (and beta) as columns of x_norm^T.
  toolkit::Ring y_ring, stats_ring, mv_ring, scalars_ring;
  std::optional<norm_detail::ColumnBlocks> gamma_cols, beta_cols;
  if (kind) {
    y_ring = budget.sbuf_ring({P, CW}, nl::float32, kY, "y");
    stats_ring = budget.sbuf_ring({P, 1, nst * 6}, nl::float32, kStats, "bn_stats");
    mv_ring = budget.sbuf_ring({P, 1, 2}, nl::float32, kStats, "bn_aggr");
    scalars_ring = budget.sbuf_ring({P, 6}, nl::float32, kStats, "row_scalars");  // mean rstd nb | scratch (2)
    gamma_cols.emplace(budget, d.H, "gamma_cols");
    if (*kind == norm_detail::Kind::layer) beta_cols.emplace(budget, d.H, "beta_cols");
  }
  const Tensor consts = budget.sbuf({P, 3}, nl::float32, "eps_zero_one");
  // Rope's tiles: the products of a chunk's heads, a row tile's tables (cos, sin and the partner
  // sine T) for the tiles of two blocks.
  toolkit::Ring a_ring, m_ring, cos_ring, sin_ring, t_ring;
  if (rope) {
    a_ring = budget.sbuf_ring({P, hb, d.r}, cd, kProducts, "x_cos");
    m_ring = budget.sbuf_ring({P, hb, d.r}, cd, kProducts, "x_partner_sin");
    const int64_t tables = 2 * (TB / P);
    cos_ring = budget.sbuf_ring({P, 1, d.r}, table_dt, tables, "cos");
    sin_ring = budget.sbuf_ring({P, 1, d.r}, table_dt, tables, "sin");
    t_ring = budget.sbuf_ring({P, 1, d.r}, cd, tables, "partner_sin");
  }
  // PSUM: six fp32 accumulators (a bank each) and two banks of transposes (x_norm^T's fp32 chunks,
  // or x's rows in its dtype without a norm).
  toolkit::Ring acc_ring = budget.psum_ring({P, bank}, nl::float32, 6, "accumulator");
  toolkit::Ring tr_ring = kind ? budget.psum_ring({P, CW / P, P}, nl::float32, 2, "y_T")
                               : budget.psum_ring({P, ts.psum_bank_fmax_bytes / (P * es), P}, dt, 2, "x_T_psum");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  const Tensor eps_t = consts(all, nl::ds(0, 1)), zero_t = consts(all, nl::ds(1, 1)), one_t = consts(all, nl::ds(2, 1));
  sch.add([&] { isa::memset(eps_t, cfg.eps, isa::gpsimd_engine); });
  sch.add([&] { isa::memset(zero_t, 0.0, isa::gpsimd_engine); });
  sch.add([&] { isa::memset(one_t, 1.0, isa::gpsimd_engine); });
  sch.add([&] { isa::dma_copy(bias_rows, bias.expand_dim(0).broadcast(0, P)); });
  if (kind) {
    const Tensor setup = acc_ring.next();
    gamma_cols->load(sch, gamma, setup);
    if (beta_cols) beta_cols->load(sch, beta, setup);
  }
  const norm_detail::ForwardMath norm_math{kind.value_or(norm_detail::Kind::rms), dt};
  const RopeMath rope_math{d.r, cfg.interleaved, false};
  auto either = [&](auto step) { sch.add_any({[&] { step(vector); }, [&] { step(scalar); }}); };

  // x_norm^T [H on partitions, tokens] of one row tile, its mean and rstd stored.
  auto prepare_rows = [&](const Tensor& xT, const toolkit::RowTile& rt, int64_t row0) {
    const int64_t p = rt.p;
    const Tensor rows = row_ring.next()(first(p), all);
    sch.add([&] { isa::dma_copy(rows, x2(nl::ds(row0, p), all)); });
    if (residual) {
      const Tensor res = res_ring.next()(first(p), all);
      sch.add([&] { isa::dma_copy(res, residual->reshape({d.M, d.H})(nl::ds(row0, p), all)); });
      sch.add_any({[&] { isa::tensor_tensor(rows, rows, res, nl::add, isa::vector_engine); },
                   [&] { isa::tensor_tensor(rows, rows, res, nl::add, isa::gpsimd_engine); }});
      sch.add([&] { isa::dma_copy(sum->reshape({d.M, d.H})(nl::ds(row0, p), all), rows); });
    }
    const Tensor mean_rows = mean(nl::ds(row0, p)).reshape({p, 1}), rstd_rows = rstd(nl::ds(row0, p)).reshape({p, 1});
    const Tensor xT_rows = xT(all, all, nl::ds(rt.r0, p));
    if (!kind) {
      sch.add([&] { isa::dma_copy(mean_rows, zero_t(first(p), all)); });
      sch.add([&] { isa::dma_copy(rstd_rows, one_t(first(p), all)); });
      mlp::transpose_rows(sch, tr_ring, xT_rows, rows);
      return;
    }
    const bool layer = *kind == norm_detail::Kind::layer;
    const Tensor st = stats_ring.next()(first(p), 0, all), mv = mv_ring.next()(first(p), all, all);
    const Tensor sc = scalars_ring.next()(first(p), all);
    const norm_detail::RowScalars rs{sc(all, nl::ds(0, 1)), sc(all, nl::ds(1, 1)), sc(all, nl::ds(2, 1))};
    for (int64_t c = 0; c < nst; ++c)
      sch.add([&] { norm_math.chunk_stats(st(all, nl::ds(c * 6, 6)), rows(all, nl::ds(c * F, std::min(F, d.H - c * F)))); });
    sch.add([&] { norm_math.aggregate(mv(all, 0, all), st); });
    sch.add([&] {
      norm_math.row_scalars(rs, mv, eps_t(first(p), all), zero_t(first(p), all), sc(all, nl::ds(3, 2)).expand_dim(2));
    });
    sch.add([&] { isa::dma_copy(mean_rows, layer ? rs.mean : zero_t(first(p), all)); });
    sch.add([&] { isa::dma_copy(rstd_rows, rs.rstd); });
    for (int64_t c0 = 0; c0 < d.H; c0 += CW) {
      const int64_t wc = std::min(CW, d.H - c0);
      const Tensor y = y_ring.next()(first(p), nl::ds(0, wc)), yT = tr_ring.next();
      const Tensor xc = rows(all, nl::ds(c0, wc)), oT = xT_rows(all, nl::ds(c0 / P, ceil_div(wc, P)), all);
      if (norm_math.subtracts_mean()) sch.add([&] { norm_math.center(y, xc, rs, vector); });
      else either([&](Engine e) { norm_math.center(y, xc, rs, e); });
      sch.add([&] { norm_math.transpose(yT, y); });
      either([&](Engine e) {
        norm_math.affine(oT, yT, p, wc, *gamma_cols, beta_cols ? &*beta_cols : nullptr, c0 / P, e);
      });
    }
  };

  // A row tile's rotary tables: cos and sin rows [p, 1, r] by piece, T from sin (ScalarE).
  struct Tables {
    Tensor cos, T;
  };
  auto load_tables = [&](const toolkit::RowTile& rt, int64_t row0) {
    const int64_t p = rt.p;
    const Tables t{cos_ring.next()(first(p), all, all), t_ring.next()(first(p), all, all)};
    const Tensor s = sin_ring.next()(first(p), all, all);
    for (const RowPiece& pc : row_pieces(row0, p, d.S)) {
      const auto part = nl::ds(pc.part, pc.rows());
      sch.add([&] { isa::dma_copy(t.cos(part, all, all), piece_table(cos, pc, d.B)); });
      sch.add([&] { isa::dma_copy(s(part, all, all), piece_table(sin, pc, d.B)); });
    }
    sch.add([&] { rope_math.partner_sine(t.T, s); });
    return t;
  };

  // Bias, rope and the stores of one accumulator: heads [h0, h0 + nh) of a row tile.
  auto finish = [&](const Tensor& acc, const toolkit::RowTile& rt, int64_t row0, int64_t col0, int64_t ws,
                    const Tables* tables) {
    const int64_t p = rt.p, h0 = col0 / d.D, nh = ws / d.D;
    const Tensor t = out_ring.next()(first(p), nl::ds(0, ws));
    sch.add([&] { isa::tensor_tensor(t, acc(first(p), nl::ds(0, ws)), bias_rows(first(p), nl::ds(col0, ws)), nl::add); });
    const int64_t rotated = tables ? std::clamp<int64_t>(d.Hq + d.Hkv - h0, 0, nh) : 0;
    if (rotated > 0) {
      const Tensor xh = t.reshape_dim(1, {nh, d.D})(all, nl::ds(0, rotated), all);
      const Tensor a = a_ring.next()(first(p), nl::ds(0, rotated), all), m = m_ring.next()(first(p), nl::ds(0, rotated), all);
      const Tensor ct = tables->cos.broadcast(1, rotated), tt = tables->T.broadcast(1, rotated);
      sch.add_any({[&] { rope_math.products(a, xh, ct, vector); }, [&] { rope_math.products(a, xh, ct, gpsimd); }});
      sch.add_any({[&] { rope_math.products(m, xh, tt, vector); }, [&] { rope_math.products(m, xh, tt, gpsimd); }});
      for (int64_t j : {0, 1})
        sch.add_any({[&] { rope_math.combine(xh, a, m, j, vector); }, [&] { rope_math.combine(xh, a, m, j, gpsimd); }});
    }
    for (const HeadRun& run : head_runs(d, h0, nh))
      for (const RowPiece& pc : row_pieces(row0, p, d.S))
        sch.add([&] {
          isa::dma_copy(piece_heads(outputs[run.section], pc, run.head, run.count),
                        t(nl::ds(pc.part, pc.rows()), nl::ds(run.offset * d.D, run.count * d.D)));
        });
  };

  for (int64_t b0 = 0; b0 < d.M; b0 += TB) {
    const int64_t nb = std::min(TB, d.M - b0);
    const std::vector<toolkit::RowTile> tiles = toolkit::row_tiles(nb, P);
    const Tensor xT = xT_ring.next();
    std::vector<Tables> tables;
    for (const toolkit::RowTile& rt : tiles) {
      prepare_rows(xT, rt, b0 + rt.r0);
      if (rope) tables.push_back(load_tables(rt, b0 + rt.r0));
    }
    for (int64_t c0 = 0; c0 < d.I; c0 += SW) {
      const int64_t wcols = std::min(SW, d.I - c0);
      std::vector<Tensor> accs;
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s < spans; ++s) accs.push_back(acc_ring.next());
      for (int64_t kt = 0; kt < nH; ++kt) {
        const int64_t pk = std::min(P, d.H - kt * P);
        const Tensor slab = slab_ring.next()(first(pk), nl::ds(0, wcols));
        sch.add([&] { isa::dma_copy(slab, w(nl::ds(kt * P, pk), nl::ds(c0, wcols))); });
        sch.add([&] {
          for (size_t i = 0; i < tiles.size(); ++i)
            for (int64_t s = 0; s * CWb < wcols; ++s) {
              const int64_t ws = std::min(CWb, wcols - s * CWb);
              isa::nc_matmul(accs[i * spans + s](first(tiles[i].p), nl::ds(0, ws)),
                             xT(first(pk), kt, nl::ds(tiles[i].r0, tiles[i].p)), slab(all, nl::ds(s * CWb, ws)),
                             {.accumulate = kt > 0});
            }
        });
      }
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * CWb < wcols; ++s)
          finish(accs[i * spans + s], tiles[i], b0 + tiles[i].r0, c0 + s * CWb, std::min(CWb, wcols - s * CWb),
                 rope ? &tables[i] : nullptr);
    }
  }
  sch.run();
  std::vector<Tensor> result{q, k, v};
  if (sum) result.push_back(*sum);
  result.push_back(mean);
  result.push_back(rstd);
  return result;
}

}  // namespace attention

/** @brief {q, k, v, mean, rstd} = qkv(x, ...); see qkv_doc. */
inline std::vector<Tensor> qkv(const Tensor& x, const Tensor& w_qkv, const Tensor& bias, const Tensor& gamma,
                               const Tensor& beta, const Tensor& cos, const Tensor& sin, const reference::QkvConfig& config,
                               Loc loc = Loc::current()) {
  return attention::qkv_forward(ArgumentCheck("qkv", x, loc), x, std::nullopt, w_qkv, bias, gamma, beta, cos, sin, config);
}

/** @brief {q, k, v, sum, mean, rstd} = add_qkv(x, residual, ...); see add_qkv_doc. */
inline std::vector<Tensor> add_qkv(const Tensor& x, const Tensor& residual, const Tensor& w_qkv, const Tensor& bias,
                                   const Tensor& gamma, const Tensor& beta, const Tensor& cos, const Tensor& sin,
                                   const reference::QkvConfig& config, Loc loc = Loc::current()) {
  return attention::qkv_forward(ArgumentCheck("add_qkv", x, loc), x, residual, w_qkv, bias, gamma, beta, cos, sin, config);
}

namespace attention {

/** @brief The registration of qkv (residual: add_qkv). */
inline KernelInfo qkv_forward_info(bool residual) {
  std::vector<std::string> inputs{"x", "w_qkv", "bias", "gamma", "beta", "cos", "sin"};
  std::vector<std::string> outputs{"q", "k", "v", "mean", "rstd"};
  if (residual) {
    inputs.insert(inputs.begin() + 1, "residual");
    outputs.insert(outputs.begin() + 3, "sum");
  }
  return KernelInfo{
      .name = residual ? "add_qkv" : "qkv",
      .summary = residual ? "residual add fused with the q/k/v projection (norm, bias, rope), returning the sum"
                          : "fused q/k/v projection: optional RMSNorm / LayerNorm, bias, rope on q and k, heads split",
      .doc = residual ? add_qkv_doc : qkv_doc,
      .inputs = inputs,
      .outputs = outputs,
      .params = qkv_params(false),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = residual ? "add_qkv_bwd" : "qkv_bwd",
      .gradient = "",
      .saved_outputs = {"mean", "rstd"},
      .body =
          [residual](const KernelCall& c) {
            const reference::QkvConfig cfg = qkv_config(c);
            const std::vector<Tensor>& in = c.inputs;
            if (residual) return add_qkv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], cfg);
            return qkv(in[0], in[1], in[2], in[3], in[4], in[5], in[6], cfg);
          },
      .reference =
          [residual](const std::vector<RefTensor>& in, const ParamValues& p) {
            const size_t o = residual ? 1 : 0;
            return reference::qkv(in[0], residual ? &in[1] : nullptr, in[1 + o], in[2 + o], in[3 + o], in[4 + o],
                                  in[5 + o], in[6 + o], qkv_config(p));
          },
      .make_inputs = [residual](const ExampleCase& c, CaseRng& r) { return qkv_inputs(c, r, false, residual); },
      .examples = qkv_examples(false, residual),
      .draw = [residual](CaseRng& r) { return draw_qkv(r, false, residual); },
      .tolerance = {},
      .benchmark = Benchmark{qkv_case(qkv_benchmark_problem(), false, residual,
                                      "B=1 S=4096 H=4096 Hq=32 Hkv=8 D=128 bf16, rmsnorm, rope"),
                             Bound::tensor_engine, [](const ExampleCase& c) { return qkv_flops(c, 1); }, 0.70},
  };
}

}  // namespace attention

inline KernelInfo qkv_info() { return attention::qkv_forward_info(false); }
inline KernelInfo add_qkv_info() { return attention::qkv_forward_info(true); }

}  // namespace nikki::kernels
