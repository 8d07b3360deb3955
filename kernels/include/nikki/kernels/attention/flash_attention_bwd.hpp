// Flash attention backward (FlashAttention-2): grad_q, grad_k and grad_v from the forward's
// inputs, output and logsumexp.
//
// Key groups of a PSUM bank's width are the outer loop: their grad_k and grad_v accumulate in
// PSUM over every query tile that sees them, while grad_q accumulates in SBUF in fp32. The query
// side of the tiles (Q, dO, their transposes, -lse and -Di) stays resident for a pass over the key
// groups; when all query tiles of a kv head do not fit, they are processed in several passes and
// grad_k / grad_v are summed in SBUF across passes. P is recomputed from lse. The work is recorded
// as tasks in the order the maths defines and ordered by the toolkit's task scheduler.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/attention_common.hpp"
#include "nikki/kernels/attention/flash_attention.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"

namespace nikki::kernels {

inline constexpr const char* flash_attention_bwd_doc = R"(Backward of flash_attention (FlashAttention-2).

Dimensions: q [B, H, S, D], k, v [B, Hkv, Skv, D], sinks [H], out [B, H, S, D], lse [B, H, S],
            grad_out [B, H, S, D] -> grad_q [B, H, S, D], grad_k, grad_v [B, Hkv, Skv, D],
            grad_sinks [H].
Args:       q, k, v, sinks, causal, scale, window, softcap, prefix_len: as given to the forward;
            out and lse: the forward's outputs; grad_out: the gradient of the loss with respect to out.
Returns:    grad_q, grad_k, grad_v in q's dtype, grad_sinks float32. Grouped query attention sums
            grad_k and grad_v over the query heads that share a kv head. Keys no query sees
            (causal with Skv > prefix_len + S, or a prefix's keys before every window) get 0; so
            does a -inf sink.
Notes:      Key groups of 512 (256 for float32) are the outer loop: their grad_k and grad_v
            accumulate in PSUM over every query tile, while grad_q accumulates in SBUF in float32
            (when all query tiles of a kv head do not fit in SBUF, they are processed in passes and
            grad_k / grad_v accumulate in SBUF across passes). P is recomputed from lse (which
            holds the sink); dS is rounded to the input dtype for its three matmuls; everything
            accumulates in float32. With a soft-cap the tanh of the scores is recomputed too, and
            dS carries its derivative 1 - tanh^2. grad_sinks sums -p_sink * Di over the batch and
            the queries, p_sink = exp(sink - lse), in float32.
Pseudocode: s = scale * q @ k.T; t = tanh(s / softcap) and s = softcap * t if softcap
            p = exp(s - lse) (0 where masked); di = sum(grad_out * out, axis=-1)
            dp = grad_out @ v.T; ds = p * (dp - di) * (1 - t^2 if softcap else 1)
            grad_v = p.T @ grad_out; grad_q = scale * ds @ k; grad_k = scale * ds.T @ q
            grad_sinks[h] = -sum over b, i of exp(sinks[h] - lse[b, h, i]) * di[b, h, i])";

namespace attention {

/** The backward's maths on one query tile and one key group, a task (one engine) per call. */
struct BackwardMath {
  double scale;
  double softcap = 0;  // > 0: the scores are capped (see the forward)

  /** p = exp(scale * s - lse), from the scores in PSUM and -lse. */
  void probabilities(const Tensor& p, const Tensor& s, const Tensor& neg_lse) const {
    isa::activation(p, nl::exp, s, {.bias = neg_lse, .scale = scale});
  }
  /** With a soft-cap: t = tanh(scale * s / softcap) out of PSUM, then p = exp(softcap * t - lse). */
  void capped_scores(const Tensor& t, const Tensor& s) const {
    isa::activation(t, nl::tanh, s, {.scale = scale / softcap});
  }
  void capped_probabilities(const Tensor& p, const Tensor& t, const Tensor& neg_lse) const {
    isa::activation(p, nl::exp, t, {.bias = neg_lse, .scale = softcap});
  }
  /** The cap's derivative folded into p: t2 = t * t (GpSimd or Vector), then pd = (1 - t2) p. */
  static void square(const Tensor& t2, const Tensor& t, Engine engine) {
    isa::tensor_tensor(t2, t, t, nl::multiply, engine);
  }
  static void cap_derivative(const Tensor& pd, const Tensor& t2, const Tensor& p) {
    isa::scalar_tensor_tensor(pd, t2, nl::subtract, 1.0, nl::multiply, p, /*reverse0=*/true);
  }
  /** The sink's gradient of a query tile, added to the head's column of sums:
   *  sum += exp(sink - lse) * (-Di), the exp on the Scalar engine, the product-sum on Vector. */
  static void sink_probability(const Tensor& p_sink, const Tensor& sink, const Tensor& neg_lse) {
    isa::activation(p_sink, nl::exp, sink, {.bias = neg_lse});
  }
  static void add_sink_gradient(const Tensor& sum, const Tensor& p_sink, const Tensor& neg_di) {
    isa::scalar_tensor_tensor(sum, p_sink, nl::multiply, neg_di, nl::add, sum);
  }
  /** dp - Di, out of PSUM, on `engine` (Vector or Scalar). */
  static void dp_minus_di(const Tensor& dst, const Tensor& dp, const Tensor& neg_di, Engine engine) {
    isa::tensor_scalar(dst, dp, nl::add, neg_di, {.engine = engine});
  }
  /** dS = P * (dP - Di), on `engine` (GpSimd or Vector). */
  static void dscores(const Tensor& ds, const Tensor& p, const Tensor& dpm, Engine engine) {
    isa::tensor_tensor(ds, p, dpm, nl::multiply, engine);
  }
  /** -Di = -rowsum(dO * O): the product on GpSimd, then the negated sum on the Vector engine. */
  static void out_product(const Tensor& prod, const Tensor& dout, const Tensor& o) {
    isa::tensor_tensor(prod, dout, o, nl::multiply, isa::gpsimd_engine);
  }
  static void neg_row_sum(const Tensor& neg_di, const Tensor& prod) {
    isa::tensor_reduce(neg_di, nl::add, prod, {1}, /*negate=*/true);
  }
  /** -lse, on GpSimd (zero minus lse). */
  static void negate(const Tensor& t, const Tensor& zero) { isa::tensor_tensor(t, zero, t, nl::subtract, isa::gpsimd_engine); }
};

}  // namespace attention

/** @brief (grad_q, grad_k, grad_v, grad_sinks) of flash_attention; see flash_attention_bwd_doc. */
inline std::vector<Tensor> flash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                                               const Tensor& o, const Tensor& lse, const Tensor& dout,
                                               bool causal = false, std::optional<double> scale_opt = std::nullopt,
                                               int64_t window = 0, double softcap = 0, int64_t prefix_len = 0,
                                               Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using attention::first;
  using toolkit::Arena;
  using toolkit::Ring;
  const ArgumentCheck check("flash_attention_bwd", q, loc);
  const attention::Dims d = attention::check_qkv(check, q, k, v);
  attention::check_sinks(check, sinks, d.H, "the forward's sinks (-inf for heads without one)");
  const attention::AttentionOptions opt = attention::check_options(check, d, causal, window, prefix_len, softcap);
  causal = opt.causal;
  const int64_t prefix = opt.prefix;  // query i sits at key position i + prefix
  for (const Tensor* t : {&o, &dout})
    if (t->shape() != q.shape() || t->dtype() != q.dtype())
      check.fail(t->name() + " " + t->shape().str() + " " + std::string(dtype_name(t->dtype())) +
                 " must have q's shape and dtype " + q.shape().str() + " " + std::string(dtype_name(q.dtype())));
  if (lse.shape() != Shape{d.B, d.H, d.S} || lse.dtype() != DType::float32)
    check.fail("lse " + lse.shape().str() + " " + std::string(dtype_name(lse.dtype())) +
               " must be float32 [B, H, S] = " + Shape{d.B, d.H, d.S}.str());
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, D = d.D, S = d.S, Skv = d.Skv;
  const DType dt = d.dtype;
  const int64_t es = dtype_size(dt);
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  const attention::BackwardMath m{scale, softcap};
  const int64_t bank_bytes = ts.psum_bank_fmax_bytes;
  // Key groups: the scores and dP of a group fill one PSUM bank each.
  const int64_t Wg = std::min<int64_t>(ts.psum_bank_fmax, (bank_bytes / (P * es)) / 2 * P);
  const int64_t nkg = Wg / P;
  const int64_t nkt = ceil_div(Skv, P), ngroups = ceil_div(Skv, Wg);

  Tensor dq = nl::ndarray({d.B, d.H, S, D}, dt, nl::shared_hbm, "grad_q");
  Tensor dk = nl::ndarray({d.B, d.Hkv, Skv, D}, dt, nl::shared_hbm, "grad_k");
  Tensor dv = nl::ndarray({d.B, d.Hkv, Skv, D}, dt, nl::shared_hbm, "grad_v");
  Tensor dsinks = nl::ndarray({d.H}, nl::float32, nl::shared_hbm, "grad_sinks");

  // --- PSUM: scores + dP (two slots), the grad_k / grad_v accumulators of a key group, dQ
  // partial products, and the rest for transposes.
  // The grad_k / grad_v accumulators of a group's key tiles: [key tile rows, D] blocks (r = 0:
  // grad_k, 1: grad_v), packed so that none crosses a bank (a matmul accumulates within one).
  const int64_t sdp_banks = ceil_div(2 * Wg * 4, bank_bytes);
  const int64_t acc_banks = toolkit::Budget::psum_banks({P, D}, nl::float32, 2 * nkg);
  const int64_t t_banks = ts.psum_num_banks - 2 * sdp_banks - acc_banks - 1;
  internal_check(t_banks >= 1, "flash attention backward PSUM plan");
  Ring sdp_ring(nl::ndarray({P, 2, 2, sdp_banks * bank_bytes / 8}, nl::float32, nl::psum, "scores_dp_psum"));
  const Ring acc_blocks = Ring::psum({P, D}, nl::float32, 2 * nkg, "grad_kv_psum");
  auto acc = [&](int64_t rows, int64_t r, int64_t t) { return acc_blocks.slot(r * nkg + t)(first(rows), nl::all); };
  Ring dq_ring(nl::ndarray({P, bank_bytes / (D * 4), D}, nl::float32, nl::psum, "grad_q_psum"));
  Ring t_ring(nl::ndarray({P, t_banks * (bank_bytes / (nkg * P * es)), nkg, P}, dt, nl::psum, "transpose_psum"));

  // --- SBUF: per pass, the query side of its tiles stays resident; key groups and per-item
  // tiles rotate.
  constexpr int64_t kKv = 3, kRows = 4, kWork = 4;
  const int64_t sbuf = ts.sbuf_fmax_bytes;
  const int64_t per_tile = 2 * P * es + 2 * D * es + 2 * 4 + D * 4;  // Q^T|dO^T, Q, dO, stats, dQ sum
  const int64_t working = kKv * (nkg * D * es + 2 * Wg * es + nkg * 2 * D * es) + kRows * (D * es + D * 4) +
                          3 * kWork * Wg * es + kWork * nkg * P * es + 4 * D * es + 2 * 2 * nkg * D * es + 64 +
                          (softcap > 0 ? kWork * Wg * 4 : 0) + 2 * d.H * 4 + kRows * 4;
  const int64_t kv_acc = 2 * nkt * D * 4;  // grad_k / grad_v sums across passes
  const int64_t total_tiles = d.G * ceil_div(S, P);
  int64_t per_pass = (sbuf - working) / (2 * per_tile);
  if (per_pass < total_tiles) per_pass = (sbuf - working - kv_acc) / (2 * per_tile);
  if (per_pass < 1)
    check.fail("the key sums of one kv head (Skv = " + std::to_string(Skv) + ", D = " + std::to_string(D) +
                   ") do not fit in SBUF",
               "grad_k and grad_v of a kv head accumulate in SBUF across passes: " + std::to_string(kv_acc / 1024) +
                   " KiB per partition",
               "use a shorter key sequence per call");
  const int64_t n_passes = ceil_div(total_tiles, per_pass);

  // K rows, K^T | V^T and V rows of a key group share one slot index.
  Tensor k_rows = nl::ndarray({P, kKv, nkg, D}, dt, nl::sbuf, "k_rows");
  Tensor kvT = nl::ndarray({D, kKv, 2, Wg}, dt, nl::sbuf, "kT_vT");
  Tensor v_rows = nl::ndarray({P, kKv, nkg, 2 * D}, dt, nl::sbuf, "v_rows");
  int64_t kv_slot = 0;
  Ring orow_ring(nl::ndarray({P, kRows, D}, dt, nl::sbuf, "out_rows"));
  Ring prod_ring(nl::ndarray({P, kRows, D}, nl::float32, nl::sbuf, "out_dout"));
  Arena p_ar(nl::ndarray({P, kWork * Wg}, dt, nl::sbuf, "probs"));
  Arena dpm_ar(nl::ndarray({P, kWork * Wg}, dt, nl::sbuf, "dp_minus_di"));
  Arena ds_ar(nl::ndarray({P, kWork * Wg}, dt, nl::sbuf, "dscores"));
  Arena dst_ar(nl::ndarray({P, kWork * nkg, P}, dt, nl::sbuf, "dscores_T"));
  Ring dqo_ring(nl::ndarray({P, 4, D}, dt, nl::sbuf, "grad_q_tile"));
  Ring kvo_ring(nl::ndarray({P, 4, 2, D}, dt, nl::sbuf, "grad_kv_tile"));
  Tensor zero = nl::ndarray({P, 1}, nl::float32, nl::sbuf, "zero");
  // With a soft-cap: tanh of the scores, then (1 - tanh^2) p in its place.
  std::optional<Arena> cap_ar;
  if (softcap > 0) cap_ar.emplace(nl::ndarray({P, kWork * Wg}, nl::float32, nl::sbuf, "capped_scores"));
  // Every query head's sink logit on every partition, and per partition the sums of its gradient.
  const Tensor sink_cols = nl::ndarray({P, d.H}, nl::float32, nl::sbuf, "sinks");
  const Tensor sink_sums = nl::ndarray({P, d.H}, nl::float32, nl::sbuf, "grad_sinks_sum");
  Ring psink_ring(nl::ndarray({P, kRows, 1}, nl::float32, nl::sbuf, "sink_probability"));

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  sch.add([&] { isa::memset(zero, 0.0, isa::gpsimd_engine); });
  sch.add([&] { isa::dma_copy(sink_cols, sinks.reshape({1, d.H}).broadcast(0, P)); });
  sch.add([&] { isa::memset(sink_sums, 0.0, isa::gpsimd_engine); });
  // A PSUM -> SBUF copy, scaled, on the Vector or the Scalar engine: whichever finishes first.
  auto scaled_copy = [&](const Tensor& dst, const Tensor& src, double factor) {
    sch.add_any({[&] { isa::tensor_scalar(dst, src, nl::multiply, factor, {.engine = isa::vector_engine}); },
                 [&] { isa::activation(dst, nl::copy, src, {.scale = factor}); }});
  };

  // Rows of key tile t that some query sees (the rest get zero gradients).
  auto valid_rows = [&](int64_t t) {
    const int64_t wk = std::min(P, Skv - t * P);
    return causal ? std::clamp<int64_t>(S + prefix - t * P, 0, wk) : wk;
  };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t g = 0; g < d.Hkv; ++g) {
      struct QTile {
        int64_t h, q0, pq, last_group, slot = 0;
        bool prepared = false, dq_started = false;
      };
      std::vector<QTile> tiles;
      for (int64_t h = g * d.G; h < (g + 1) * d.G; ++h)
        for (int64_t q0 = 0; q0 < S; q0 += P) {
          const int64_t pq = std::min(P, S - q0);
          tiles.push_back(QTile{h, q0, pq, causal ? std::min(ngroups - 1, (q0 + prefix + pq - 1) / Wg) : ngroups - 1});
        }
      Tensor kacc, vacc;  // grad_k / grad_v sums across passes
      std::vector<bool> summed(size_t(nkt), false);
      if (n_passes > 1) {
        kacc = nl::ndarray({P, nkt, D}, nl::float32, nl::sbuf, "grad_k_sum");
        vacc = nl::ndarray({P, nkt, D}, nl::float32, nl::sbuf, "grad_v_sum");
      }
      std::vector<bool> touched(size_t(nkt), false);  // by any pass
      for (int64_t p0 = 0; p0 < int64_t(tiles.size()); p0 += per_pass) {
        const int64_t p1 = std::min<int64_t>(int64_t(tiles.size()), p0 + per_pass), nt = p1 - p0;
        Tensor qdoT = nl::ndarray({D, nt, 2, P}, dt, nl::sbuf, "qT_doutT");
        Tensor qn = nl::ndarray({P, nt, D}, dt, nl::sbuf, "q_rows");
        Tensor don = nl::ndarray({P, nt, D}, dt, nl::sbuf, "dout_rows");
        Tensor stats = nl::ndarray({P, nt, 2}, nl::float32, nl::sbuf, "neg_lse_di");  // -lse, -Di
        Tensor dqacc = nl::ndarray({P, nt, D}, nl::float32, nl::sbuf, "grad_q_sum");
        for (int64_t t = p0; t < p1; ++t) tiles[size_t(t)].slot = t - p0;

        // Query side of a tile: rows, Q^T and dO^T, -lse and -Di = -rowsum(dO * O).
        auto prepare = [&](QTile& qt) {
          const int64_t h = qt.h, q0 = qt.q0, pq = qt.pq, i = qt.slot;
          const Tensor orow = orow_ring.next()(first(pq), all), prod = prod_ring.next()(first(pq), all);
          const Tensor neg_lse = stats(first(pq), i, nl::ds(0, 1)), neg_di = stats(first(pq), i, nl::ds(1, 1));
          sch.add([&] { isa::dma_copy(qn(first(pq), i, all), q(b, h, nl::ds(q0, pq), all)); });
          sch.add([&] { isa::dma_copy(don(first(pq), i, all), dout(b, h, nl::ds(q0, pq), all)); });
          sch.add([&] { isa::dma_copy(orow, o(b, h, nl::ds(q0, pq), all)); });
          sch.add([&] { isa::dma_copy(neg_lse, lse(b, h, nl::ds(q0, pq))); });
          sch.add([&] { m.negate(neg_lse, zero(first(pq), all)); });
          sch.add([&] { m.out_product(prod, don(first(pq), i, all), orow); });
          sch.add([&] { m.neg_row_sum(neg_di, prod); });
          const Tensor p_sink = psink_ring.next()(first(pq), all);
          sch.add([&] { m.sink_probability(p_sink, sink_cols(first(pq), nl::ds(h, 1)), neg_lse); });
          sch.add([&] { m.add_sink_gradient(sink_sums(first(pq), nl::ds(h, 1)), p_sink, neg_di); });
          const Tensor tq = t_ring.next();
          sch.add([&] {
            isa::nc_transpose(tq(first(D), 0, first(pq)), qn(first(pq), i, all));
            isa::nc_transpose(tq(first(D), 1, first(pq)), don(first(pq), i, all));
          });
          sch.add_any({[&] { attention::copy_out(qdoT(all, i, all, first(pq)), tq(first(D), nl::ds(0, 2), first(pq)), vector); },
                       [&] { attention::copy_out(qdoT(all, i, all, first(pq)), tq(first(D), nl::ds(0, 2), first(pq)), scalar); }});
          qt.prepared = true;
        };

        for (int64_t j = 0; j < ngroups; ++j) {
          const int64_t g0 = j * Wg, wg = std::min(Wg, Skv - g0), ntile = ceil_div(wg, P);
          std::vector<int64_t> visible;
          for (int64_t t = p0; t < p1; ++t) {
            // Causal: the tile's last query reaches the group; window: the group reaches the
            // tile's first query's window.
            const int64_t qpos = tiles[size_t(t)].q0 + prefix;
            if ((!causal || qpos + tiles[size_t(t)].pq - 1 >= g0) && (window == 0 || g0 + wg - 1 > qpos - window))
              visible.push_back(t);
          }
          if (visible.empty()) continue;

          // Key group: K rows (the dQ matmul's moving operand), K^T and V^T.
          const int64_t kv = kv_slot++ % kKv;
          for (int64_t t = 0; t < ntile; ++t) {
            const int64_t wk = std::min(P, wg - t * P), r0 = g0 + t * P;
            sch.add([&] { isa::dma_copy(k_rows(first(wk), kv, t, all), k(b, g, nl::ds(r0, wk), all)); });
            sch.add([&] { attention::load_rows(v_rows(all, kv, t, all), v(b, g, nl::ds(r0, wk), all)); });
          }
          const Tensor tk = t_ring.next();
          sch.add([&] {
            for (int64_t t = 0; t < ntile; ++t) {
              const int64_t wk = std::min(P, wg - t * P);
              isa::nc_transpose(tk(first(D), t, first(wk)), k_rows(first(wk), kv, t, all));
            }
          });
          auto copy_kT = [&](Engine e) {
            const int64_t full = wg / P;
            if (full > 0) attention::copy_out(kvT(all, kv, 0, nl::ds(0, full * P)), tk(first(D), nl::ds(0, full), all), e);
            if (full < ntile)
              attention::copy_out(kvT(all, kv, 0, nl::ds(full * P, wg - full * P)), tk(first(D), full, first(wg - full * P)),
                                  e);
          };
          sch.add_any({[&] { copy_kT(vector); }, [&] { copy_kT(scalar); }});
          const Tensor tv = t_ring.next();
          sch.add([&] {
            for (int64_t t = 0; t < ntile; ++t)
              attention::transpose_rows(tv(first(D), t, all), v_rows(all, kv, t, all), std::min(P, wg - t * P), D);
          });
          sch.add([&] {
            attention::copy_transposed_rows(kvT(all, kv, 1, nl::ds(0, wg)), tv(first(D), all, all), ntile,
                                            wg - (ntile - 1) * P);
          });

          // grad_k / grad_v of the group accumulate in PSUM over the pass's query tiles.
          std::vector<bool> started(size_t(nkg), false);
          for (int64_t ti : visible) {
            QTile& qt = tiles[size_t(ti)];
            if (!qt.prepared) prepare(qt);
            const int64_t q0 = qt.q0, pq = qt.pq, i = qt.slot, qpos = q0 + prefix;
            // Causal: the keys up to the tile's last query, rounded up to whole key tiles (the
            // mask zeroes P past the diagonal), so that the first query tile to reach a key tile
            // writes all its rows of the grad_k / grad_v sums: later ones accumulate onto them.
            const int64_t wkv = causal ? std::min(wg, ceil_div(qpos + pq - g0, P) * P) : wg, nb = ceil_div(wkv, P);
            const Tensor neg_lse = stats(first(pq), i, nl::ds(0, 1)), neg_di = stats(first(pq), i, nl::ds(1, 1));
            // Scores and dP = dO V^T.
            const Tensor sdp = sdp_ring.next();
            const Tensor s = sdp(first(pq), 0, nl::ds(0, wkv)), dp = sdp(first(pq), 1, nl::ds(0, wkv));
            sch.add([&] {
              for (int64_t r = 0; r < 2; ++r)
                isa::nc_matmul(sdp(first(pq), r, nl::ds(0, wkv)), qdoT(all, i, r, first(pq)), kvT(all, kv, r, nl::ds(0, wkv)),
                               {.accumulate = false});
            });
            // P = exp(scale * s - lse) (with a cap, from the recomputed tanh), 0 where masked.
            const Tensor p = p_ar.next(wkv)(first(pq), all);
            Tensor capped;
            if (softcap > 0) {
              capped = cap_ar->next(wkv)(first(pq), all);
              sch.add([&] { m.capped_scores(capped, s); });
              sch.add([&] { m.capped_probabilities(p, capped, neg_lse); });
            } else {
              sch.add([&] { m.probabilities(p, s, neg_lse); });
            }
            const int64_t lo = std::max(qpos, g0), hi = g0 + wkv;
            if (causal && hi - 1 > qpos)
              sch.add([&] { attention::mask_after_diagonal(p(all, nl::ds(lo - g0, hi - lo)), qpos, lo, 0.0); });
            const int64_t wend = std::min(hi, qpos + pq - window);  // keys some query's window starts after
            if (window > 0 && g0 < wend)
              sch.add([&] { attention::mask_before_window(p(all, nl::ds(0, wend - g0)), qpos, g0, window, 0.0); });
            // dS = P * (dP - Di), with a cap times 1 - tanh^2.
            const Tensor dpm = dpm_ar.next(wkv)(first(pq), all), dS = ds_ar.next(wkv)(first(pq), all);
            sch.add_any({[&] { m.dp_minus_di(dpm, dp, neg_di, vector); }, [&] { m.dp_minus_di(dpm, dp, neg_di, scalar); }});
            if (softcap > 0) {
              sch.add_any({[&] { m.square(capped, capped, gpsimd); }, [&] { m.square(capped, capped, vector); }});
              sch.add([&] { m.cap_derivative(capped, capped, p); });
            }
            const Tensor pd = softcap > 0 ? capped : p;
            sch.add_any({[&] { m.dscores(dS, pd, dpm, gpsimd); }, [&] { m.dscores(dS, pd, dpm, vector); }});
            // grad_v += P^T dO and grad_k += dS^T Q, per key tile.
            for (int64_t r = 0; r < 2; ++r)
              sch.add([&] {
                for (int64_t t = 0; t < nb; ++t) {
                  const int64_t wk = std::min(P, wkv - t * P);
                  const Tensor lhs = (r == 0 ? p : dS)(all, nl::ds(t * P, wk));
                  const Tensor rhs = (r == 0 ? don : qn)(first(pq), i, all);
                  isa::nc_matmul(acc(wk, 1 - r, t), lhs, rhs, {.accumulate = bool(started[size_t(t)])});
                }
              });
            for (int64_t t = 0; t < nb; ++t) started[size_t(t)] = true;
            // grad_q += dS K (over this group's keys), via dS^T.
            const Tensor tt = t_ring.next();
            sch.add([&] {
              for (int64_t t = 0; t < nb; ++t) {
                const int64_t wk = std::min(P, wkv - t * P);
                isa::nc_transpose(tt(first(wk), t, first(pq)), dS(all, nl::ds(t * P, wk)));
              }
            });
            const Tensor dsT = dst_ar.next(nb);
            auto copy_dsT = [&](Engine e) {
              const int64_t full = wkv / P;
              if (full > 0) attention::copy_out(dsT(all, nl::ds(0, full), first(pq)), tt(all, nl::ds(0, full), first(pq)), e);
              if (full < nb)
                attention::copy_out(dsT(first(wkv - full * P), full, first(pq)), tt(first(wkv - full * P), full, first(pq)),
                                    e);
            };
            sch.add_any({[&] { copy_dsT(vector); }, [&] { copy_dsT(scalar); }});
            const Tensor dq_part = dq_ring.next()(first(pq), all);
            sch.add([&] {
              for (int64_t t = 0; t < nb; ++t) {
                const int64_t wk = std::min(P, wkv - t * P);
                isa::nc_matmul(dq_part, dsT(first(wk), t, first(pq)), k_rows(first(wk), kv, t, all), {.accumulate = t > 0});
              }
            });
            const Tensor dq_sum = dqacc(first(pq), i, all);
            if (!qt.dq_started) {
              sch.add_any({[&] { attention::copy_out(dq_sum, dq_part, vector); },
                           [&] { attention::copy_out(dq_sum, dq_part, scalar); }});
              qt.dq_started = true;
            } else {
              sch.add([&] { isa::tensor_tensor(dq_sum, dq_sum, dq_part, nl::add, isa::vector_engine); });
            }
            if (j == qt.last_group) {  // grad_q of the tile is complete
              const Tensor dq_tile = dqo_ring.next()(first(pq), all);
              sch.add([&] { isa::activation(dq_tile, nl::copy, dq_sum, {.scale = scale}); });
              sch.add([&] { isa::dma_copy(dq(b, qt.h, nl::ds(q0, pq), all), dq_tile); });
            }
          }

          // End of the group: grad_k = scale * sum, grad_v = sum, or the pass's sums added to the
          // SBUF sums. Keys past the last query (causal, Skv > S) are in no item: those rows of
          // the sums were never written, and their gradients are 0.
          for (int64_t t = 0; t < ntile; ++t) {
            if (!started[size_t(t)]) continue;
            const int64_t gt = g0 / P + t, wk = std::min(P, wg - t * P), rv = valid_rows(gt);
            touched[size_t(gt)] = true;
            if (n_passes == 1) {
              const Tensor kvo = kvo_ring.next();
              for (int64_t r = 0; r < 2; ++r) {  // r = 0: grad_k, 1: grad_v
                if (rv < wk) sch.add([&] { isa::memset(kvo(first(wk), r, all), 0.0, isa::gpsimd_engine); });
                scaled_copy(kvo(first(rv), r, all), acc(rv, r, t), r == 0 ? scale : 1.0);
                sch.add([&] { isa::dma_copy((r == 0 ? dk : dv)(b, g, nl::ds(gt * P, wk), all), kvo(first(wk), r, all)); });
              }
            } else {
              for (int64_t r = 0; r < 2; ++r)
                sch.add([&] {
                  const Tensor sum = (r == 0 ? kacc : vacc)(first(rv), gt, all);
                  if (!summed[size_t(gt)]) isa::tensor_copy(sum, acc(rv, r, t), isa::vector_engine);
                  else isa::tensor_tensor(sum, sum, acc(rv, r, t), nl::add, isa::vector_engine);
                });
              summed[size_t(gt)] = true;
            }
          }
        }
      }
      // Keys that no query sees, and with several passes the sums: write them out.
      for (int64_t gt = 0; gt < nkt; ++gt) {
        if (touched[size_t(gt)] && n_passes == 1) continue;
        const int64_t wk = std::min(P, Skv - gt * P), rv = touched[size_t(gt)] ? valid_rows(gt) : 0;
        const Tensor kvo = kvo_ring.next();
        for (int64_t r = 0; r < 2; ++r) {
          if (rv < wk) sch.add([&] { isa::memset(kvo(first(wk), r, all), 0.0, isa::gpsimd_engine); });
          if (rv > 0)
            sch.add([&] {
              isa::activation(kvo(first(rv), r, all), nl::copy, (r == 0 ? kacc : vacc)(first(rv), gt, all),
                              {.scale = r == 0 ? scale : 1.0});
            });
          sch.add([&] { isa::dma_copy((r == 0 ? dk : dv)(b, g, nl::ds(gt * P, wk), all), kvo(first(wk), r, all)); });
        }
      }
    }
  // grad_sinks: the per-partition sums of every head summed over the partitions.
  const Tensor sink_grad = nl::ndarray({1, d.H}, nl::float32, nl::sbuf, "grad_sinks_row");
  sch.add([&] { isa::tensor_partition_reduce(sink_grad, nl::add, sink_sums); });
  sch.add([&] { isa::dma_copy(dsinks.reshape({1, d.H}), sink_grad); });
  sch.run();
  return {dq, dk, dv, dsinks};
}

namespace attention {

/** @brief Inputs q, k, v, sinks, out, lse, grad_out of one attention problem. */
inline std::vector<TensorSpec> backward_problem(const std::vector<TensorSpec>& qkv) {
  std::vector<TensorSpec> specs = qkv;
  const Shape& q = qkv[0].shape;
  specs.push_back(qkv[0]);
  specs.push_back(spec({q[0], q[1], q[2]}, DType::float32));
  specs.push_back(qkv[0]);
  return specs;
}

/** @brief Backward inputs: q, k, v and sinks as the forward's examples draw them, random
 *  grad_out, with out (rounded to q's dtype) and lse (fp32) from the forward's reference, as the
 *  forward kernel gives them. */
inline std::vector<RefTensor> backward_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in = forward_inputs(c, r);
  const std::vector<ParamSpec> specs = flash_params();
  const ParamValues p{specs, c.params};
  std::vector<RefTensor> f = reference::attention_forward(in[0], in[1], in[2], in[3], p.optional_real("scale"), options_of(p));
  for (double& x : f[0].data) x = round_to(c.inputs[4].dtype, x);
  for (double& x : f[1].data) x = round_to(DType::float32, x);
  in.push_back(f[0]);
  in.push_back(f[1]);
  in.push_back(random_input(c.inputs[6], r));
  return in;
}

}  // namespace attention

inline KernelInfo flash_attention_bwd_info() {
  const DType f32 = DType::float32, bf16 = DType::bfloat16;
  auto problem = [](int64_t H, int64_t Hkv, int64_t S, int64_t Skv, int64_t D, DType t) {
    return attention::backward_problem(attention::problem(1, H, Hkv, S, Skv, D, t));
  };
  return KernelInfo{
      .name = "flash_attention_bwd",
      .summary = "gradients of flash_attention with respect to q, k, v and the sinks",
      .doc = flash_attention_bwd_doc,
      .inputs = {"q", "k", "v", "sinks", "out", "lse", "grad_out"},
      .outputs = {"grad_q", "grad_k", "grad_v", "grad_sinks"},
      .params = attention::flash_params(),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return flash_attention_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4], c.inputs[5],
                                       c.inputs[6], c.flag("causal"), c.optional_real("scale"), c.integer("window"),
                                       c.real("softcap"), c.integer("prefix_len"));
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::attention_backward(in[0], in[1], in[2], in[3], in[4], in[6], p.optional_real("scale"),
                                                 attention::options_of(p));
          },
      .make_inputs = attention::backward_inputs,
      .examples = {{problem(2, 1, 200, 330, 64, f32), {}, "grouped query heads, tails"},
                   {problem(1, 1, 330, 200, 128, bf16), Params{{"causal", 1.0}}, "causal, fewer keys than queries"},
                   {problem(1, 1, 129, 129, 96, f32), Params{{"causal", 1.0}, {"scale", 0.3}},
                    "odd head dim, explicit scale"},
                   {problem(4, 2, 333, 333, 128, f32), Params{{"causal", 1.0}}, "grouped query heads, causal, tails"},
                   {problem(2, 1, 300, 300, 100, bf16), {},
                    "head dim 100: grad_k / grad_v blocks packed so none crosses a PSUM bank"},
                   {problem(2, 1, 700, 750, 64, bf16), Params{{"window", 200.0}},
                    "sliding window: key groups before it skipped, both edges masked"},
                   {problem(4, 2, 300, 300, 80, f32), Params{{"causal", 1.0}, {"softcap", 5.0}},
                    "soft-cap 5 over scores far past it: dS carries 1 - tanh^2"},
                   {problem(2, 2, 260, 460, 128, bf16), Params{{"causal", 1.0}, {"prefix_len", 200.0}},
                    "a cached prefix of 200 keys (not a multiple of 128), causal"},
                   {problem(4, 1, 200, 530, 64, f32),
                    Params{{"window", 150.0}, {"prefix_len", 330.0}, {"softcap", 20.0}, {"scale", 0.2}},
                    "prefix, window and soft-cap: keys before every window get zero gradients"}},
      .draw =
          [](CaseRng& r) {
            ExampleCase c = attention::draw_problem(r);
            c.inputs = attention::backward_problem(c.inputs);
            return c;
          },
      .tolerance = {},
      .benchmark = Benchmark{{attention::backward_problem(attention::benchmark_problem(false).inputs),
                              attention::benchmark_problem(false).params, "B=1 H=4 S=4096 D=128 bf16"},
                             Bound::tensor_engine,
                             [](const ExampleCase& c) { return 2.5 * attention::forward_flops(c); },
                             0.50},
  };
}

}  // namespace nikki::kernels
