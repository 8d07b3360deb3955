// Flash attention forward (FlashAttention-2 tiling) with causal masking and grouped-query heads.
//
// Why the kernel looks the way it does (NeuronCore, trn2 cost model):
//
// - nc_matmul contracts over the partition dim, so S = Q K^T needs Q^T and K^T (head dim on
//   partitions) and P V needs P^T (keys on partitions). A transposing DMA moves one element per
//   descriptor, hundreds of times slower than a row copy, so every transpose runs on the Tensor
//   engine (128 cycles per 128x128 block) and is copied out of PSUM. The Tensor-engine work per
//   128x128 block is therefore QK^T + transpose(P) + PV: at most 2/3 of it is useful.
// - PSUM can only be read by the Vector and Scalar engines, which makes them the other
//   bottleneck. The scaled scores are copied to SBUF once (by whichever of the two finishes it
//   first), each row is halved twice by pairwise maxima (GpSimd, or the Vector engine when it is
//   free first), the Vector engine reduces the quarter to the row maximum, and the Scalar engine
//   computes exp from the SBUF copy. The running statistics (maximum, denominator, logsumexp) are
//   fp32, so scores of any magnitude that fp32 holds give finite results; the Vector engine has no
//   fast mode for fp32 reductions, hence the halvings.
// - V gets an extra column of ones, so the P V matmul also accumulates the softmax denominator
//   (the sum of the very probabilities the numerator used) with no reduction instruction.
// - The work is recorded as tasks, in the order the maths defines, and ordered by the toolkit's
//   task scheduler; tiles that several work items have in flight live in rings and arenas, whose
//   depths bound how far ahead the next items run.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/attention_common.hpp"
#include "nikki/kernels/attention/attention_reference.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"

namespace nikki::kernels {

inline constexpr const char* flash_attention_doc = R"(Scaled dot-product attention, FlashAttention-2 style, with attention sinks, soft-capping and a cached prefix.

Dimensions: q [B, H, S, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, D], sinks [H] -> out [B, H, S, D],
            lse [B, H, S]. D <= 128 (any size); any S and Skv (tails are smaller tiles);
            Hkv divides H (grouped query attention: query head h reads kv head h / (H / Hkv)).
Args:       q, k, v: HBM tensors of one dtype: float32, bfloat16 or float16.
            sinks: float32 [H], attention sinks (GPT-OSS): a learned logit per query head that
              joins the softmax denominator and its maximum but weighs no value; -inf for none
              (nikki.torch.flash_attention passes -inf when sinks is None).
            causal: mask key j from query i when j > i + prefix_len (without a prefix the mask is
              lower triangular aligned at the top left, as torch's
              scaled_dot_product_attention(is_causal=True): every query sees key 0, so no row is
              empty even when Skv < S).
            scale: multiplier of q k^T (default 1 / sqrt(D)).
            window: a sliding window (Mistral style; causal implied): key j is visible from query
              i when i + prefix_len - window < j <= i + prefix_len. 0 (the default) for none;
              needs Skv >= prefix_len + S.
            softcap: logit soft-capping (Gemma 2): the scaled scores s become
              softcap * tanh(s / softcap) before masking and softmax. 0 (the default) for none,
              else in [1e-6, 1e30]. Sinks are not capped.
            prefix_len: prefix caching: the first prefix_len rows of k and v are cached keys
              before the S active ones, so query i sits at key position i + prefix_len and the
              causal mask (and the window) are offset by it. 0 <= prefix_len <= Skv; needs causal
              or a window (without a mask a prefix changes nothing).
Returns:    out in q's dtype; lse = logsumexp of the scaled, capped, masked scores of each query
            and its head's sink, float32 (saved for the backward).
Notes:      One pass over the keys per 128-query tile, in chunks of up to 4096 keys, with an online
            softmax (running maximum, rescaled accumulator) across chunks. Scores, the running
            maximum, sums and the output accumulate in float32; the probabilities are rounded to
            the input dtype for the P V matmul, and the denominator sums those rounded
            probabilities (then the sink's exp(sink - max), in float32). In causal mode key chunks
            past the diagonal are skipped and only the diagonal block is masked; with a window,
            key tiles wholly before a query tile's window are skipped too (the work follows the
            visible keys) and the blocks crossing the window's start are masked. With a soft-cap
            the copy of the scores out of PSUM is the tanh (ScalarE only) and the cap's factor
            enters exp's scale. K and V of one kv head stay in SBUF: Skv is limited by the SBUF
            size (about 20k keys at D = 128 in bfloat16); exceeding it is a KernelError.
Pseudocode: s = scale * q @ k.T; if softcap: s = softcap * tanh(s / softcap)
            s = masked to -inf where j > i + prefix_len if causal, and where j <= i + prefix_len - window
            lse = logsumexp([s, sinks[h]], axis=-1); out = exp(s - lse) @ v)";

namespace attention {

/**
 * The forward's maths on one query tile and one chunk of keys, an instruction group at a time:
 * each call is one task of the schedule, on one engine. Tiles are views with the tile's query
 * rows on partitions.
 */
struct ForwardMath {
  double scale;
  /** > 0: the SBUF scores are tanh(scale * s / softcap), the capped scores in units of the cap;
   *  the cap's factor enters the row maxima (uncap_max) and exp's scale. */
  double softcap = 0;

  /** scores = q^T' k^T (one PSUM bank of keys). */
  void scores(const Tensor& s, const Tensor& qT, const Tensor& kT) const {
    isa::nc_matmul(s, qT, kT, {.accumulate = false});
  }
  /** sf = scale * s, out of PSUM, on `engine` (Vector or Scalar); with a soft-cap,
   *  tanh(scale * s / softcap) on the Scalar engine (the only one with tanh). */
  void scaled_copy(const Tensor& sf, const Tensor& s, Engine engine) const {
    if (softcap > 0) isa::activation(sf, nl::tanh, s, {.scale = scale / softcap});
    else isa::tensor_scalar(sf, s, nl::multiply, scale, {.engine = engine});
  }
  /** The value masked SBUF scores take: below every real one, its exp 0 after the cap's scale
   *  (-1e30 in score units), and finite when a row's maximum is taken over masked scores only. */
  double masked() const { return softcap > 0 ? -std::max(2.0, 1e30 / softcap) : -1e30; }
  /** A (negated) row maximum of capped SBUF scores, in score units: times the cap. */
  void uncap_max(const Tensor& neg_max) const {
    isa::tensor_scalar(neg_max, neg_max, nl::multiply, softcap, {.engine = isa::vector_engine});
  }
  /** half[c] = max(sf[c], sf[w - half + c]): halves each row for the row maximum (an odd width
   *  compares its middle column with itself), on `engine` (GpSimd or Vector). */
  static void half_max(const Tensor& half, const Tensor& sf, Engine engine) {
    const int64_t w = sf.shape()[1], h = (w + 1) / 2;
    isa::tensor_tensor(half, sf(nl::all, nl::ds(0, h)), sf(nl::all, nl::ds(w - h, h)), nl::maximum, engine);
  }
  /** neg_max = -max over the row of `halves`. */
  static void neg_row_max(const Tensor& neg_max, const Tensor& halves) {
    isa::tensor_reduce(neg_max, nl::maximum, halves, {1}, /*negate=*/true);
  }
  /** The running (negated) maximum after a chunk: min of the previous one and the chunk's. */
  static void running_max(const Tensor& cur, const Tensor& prev, const Tensor& chunk) {
    isa::tensor_tensor(cur, prev, chunk, nl::minimum, isa::gpsimd_engine);
  }
  /** The first chunk's (negated) maximum with the sink's logit in it, on the Vector engine right
   *  after the row maximum: exp waits for it, and GpSimd's queue is long with halvings. */
  static void include_sink(const Tensor& neg_max, const Tensor& chunk, const Tensor& neg_sink) {
    isa::tensor_tensor(neg_max, chunk, neg_sink, nl::minimum, isa::vector_engine);
  }
  /** alpha = exp(max_prev - max_cur), the correction of what was accumulated before the chunk. */
  static void correction(const Tensor& alpha, const Tensor& prev, const Tensor& cur) {
    isa::activation(alpha, nl::exp, prev, {.bias = cur, .scale = -1.0});
  }
  /** acc *= alpha (numerator and denominator columns alike). */
  static void rescale(const Tensor& acc, const Tensor& alpha) {
    isa::activation(acc, nl::copy, acc, {.scale = alpha});
  }
  /** p = exp(sf - max) (exp(softcap * sf - max) with a cap), rounded to the probabilities' dtype. */
  void probabilities(const Tensor& p, const Tensor& sf, const Tensor& neg_max) const {
    isa::activation(p, nl::exp, sf, {.bias = neg_max, .scale = softcap > 0 ? softcap : 1.0});
  }
  /** e = exp(sink - max): the sink's term of the denominator (0 for a -inf sink). */
  static void sink_weight(const Tensor& e, const Tensor& sink, const Tensor& neg_max) {
    isa::activation(e, nl::exp, sink, {.bias = neg_max});
  }
  /** 1 / (the denominator + e), the denominator in PSUM, on `engine` (Vector or Scalar). */
  static void reciprocal_with_sink(const Tensor& recip, const Tensor& denominator, const Tensor& e, Engine engine) {
    if (engine == Engine::scalar) isa::activation(recip, nl::reciprocal, denominator, {.bias = e});
    else
      isa::tensor_scalar(recip, denominator, nl::add, e,
                         {.op1 = nl::power, .operand1 = -1.0, .engine = isa::vector_engine});
  }
  /** lse = log(the denominator + e) (Scalar engine), then lse += max (GpSimd). */
  static void log_denominator_with_sink(const Tensor& lse, const Tensor& denominator, const Tensor& e) {
    isa::activation(lse, nl::log, denominator, {.bias = e});
  }
  /** 1 / the denominator, on `engine`. */
  static void reciprocal(const Tensor& recip, const Tensor& denominator, Engine engine) {
    if (engine == Engine::scalar) isa::activation(recip, nl::reciprocal, denominator);
    else isa::reciprocal(recip, denominator);
  }
  /** out = numerator / denominator, on `engine`. */
  static void normalize(const Tensor& out, const Tensor& numerator, const Tensor& recip, Engine engine) {
    if (engine == Engine::scalar) isa::activation(out, nl::copy, numerator, {.scale = recip});
    else isa::tensor_scalar(out, numerator, nl::multiply, recip, {.engine = isa::vector_engine});
  }
  static void add_max(const Tensor& lse, const Tensor& neg_max) {
    isa::tensor_tensor(lse, lse, neg_max, nl::subtract, isa::gpsimd_engine);
  }
};

}  // namespace attention

/** @brief (out, lse) = flash_attention(q, k, v, sinks); see flash_attention_doc. */
inline std::vector<Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                                           bool causal = false, std::optional<double> scale_opt = std::nullopt,
                                           int64_t window = 0, double softcap = 0, int64_t prefix_len = 0,
                                           Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using attention::first;
  using toolkit::Arena;
  using toolkit::Ring;
  const ArgumentCheck check("flash_attention", q, loc);
  const attention::Dims d = attention::check_qkv(check, q, k, v);
  attention::check_sinks(check, sinks, d.H, "pass -inf for heads without a sink (nikki.torch.flash_attention does when sinks is None)");
  const attention::AttentionOptions opt = attention::check_options(check, d, causal, window, prefix_len, softcap);
  causal = opt.causal;
  const int64_t prefix = opt.prefix;  // query i sits at key position i + prefix
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, D = d.D, D1 = d.D + 1, S = d.S, Skv = d.Skv;
  const DType dt = d.dtype;
  const int64_t es = dtype_size(dt);
  const attention::ForwardMath m{scale_opt.value_or(1.0 / std::sqrt(double(D))), softcap};
  const int64_t bank = ts.psum_bank_fmax;                  // fp32 elements of one PSUM bank
  const int64_t tpb = ts.psum_bank_fmax_bytes / (P * es);  // transposed 128-blocks per bank
  const int64_t nkt = ceil_div(Skv, P);                    // key tiles per head
  // Keys are prepared in groups of a QK matmul's width (half a bank of transposes), so the first
  // scores of a head wait for four key tiles, not eight.
  const int64_t kgroup = std::max<int64_t>(1, bank / P);

  Tensor out = nl::ndarray({d.B, d.H, S, D}, dt, nl::shared_hbm, "out");
  Tensor lse = nl::ndarray({d.B, d.H, S}, nl::float32, nl::shared_hbm, "lse");

  // --- SBUF plan: K^T and V of a kv head stay resident (two kv heads overlap at a boundary); the
  // key chunk C is the largest that leaves room for the working tiles.
  toolkit::Budget budget(check);
  const int64_t resident = 2 * (Skv * es + nkt * D1 * es);
  constexpr int64_t kSf = 3, kSh = 2, kPr = 2, kPt = 2, kRows = 8, kTiles = 8, kSmall = 32;
  auto working = [&](int64_t C) {
    return resident + kSf * C * 4 + kSh * (C / 2 + C / 4 + 2) * 4 + kPr * C * es + kPt * C * es +
           (kRows * kgroup + kTiles) * 2 * D * es + kTiles * (D + P) * es + 4 * kSmall * 4 + 2 * d.H * 4;
  };
  const std::optional<int64_t> chunk_keys = budget.largest({4096, 2048, 1024, 512}, working);
  if (!chunk_keys)
    check.fail("K and V of one kv head (Skv = " + std::to_string(Skv) + ", D = " + std::to_string(D) + ", " +
                   std::string(dtype_name(dt)) + ") do not fit in SBUF",
               "K^T and V of a kv head are kept in SBUF: about " + std::to_string(resident / 1024) +
                   " KiB per partition needed, " + std::to_string(budget.sbuf_capacity() / 1024) + " KiB available",
               "split the keys across calls (e.g. ring attention) or use a shorter sequence");
  const int64_t C = *chunk_keys;
  budget.reserve_sbuf(working(C), "flash attention's resident keys and working tiles");

  // --- PSUM (8 banks): scores, transposes (Q and K have their own bank, so preparing the next
  // tile never waits for the P transposes of the current one), output accumulators [pq, D + 1]
  // packed several to a bank.
  Ring s_ring = budget.psum_ring({P, bank}, nl::float32, 2, "scores_psum");
  Ring t_ring = budget.psum_ring({P, tpb, P}, dt, 3, "transpose_psum");
  Ring prep_ring = budget.psum_ring({P, kgroup, P}, dt, tpb / kgroup, "prep_transpose_psum");
  Ring o_ring = budget.psum_ring({P, D1}, nl::float32, 2 * (bank / D1), "out_psum");
  // --- SBUF working tiles. Per-item tiles are spans of arenas: narrow causal items share the
  // space of one wide one.
  Arena sf_ar(nl::ndarray({P, kSf * C}, nl::float32, nl::sbuf, "scores"));
  Arena sh_ar(nl::ndarray({P, kSh * (C / 2 + C / 4 + 2)}, nl::float32, nl::sbuf, "half_max"));
  Arena p_ar(nl::ndarray({P, kPr * C}, dt, nl::sbuf, "probs"));
  Arena pt_ar(nl::ndarray({P, kPt * (C / P), P}, dt, nl::sbuf, "probs_T"));
  // K and Q rows are staged in one tensor, claimed by one tiny write first: the JIT fills a
  // tensor with sentinels at its first access, and every later access waits for that one.
  Tensor row_stage = nl::ndarray({P, kRows * kgroup + kTiles, 2 * D}, dt, nl::sbuf, "row_stage");
  std::vector<Tensor> krow_slots, qrow_slots;
  for (int64_t s = 0; s < kRows; ++s) krow_slots.push_back(row_stage(nl::all, nl::ds(s * kgroup, kgroup), nl::all));
  for (int64_t s = 0; s < kTiles; ++s) qrow_slots.push_back(row_stage(nl::all, kRows * kgroup + s, nl::all));
  Ring krow_ring(krow_slots), qrow_ring(qrow_slots);
  Ring qT_ring(nl::ndarray({D, kTiles, P}, dt, nl::sbuf, "qT"));
  Ring otile_ring(nl::ndarray({P, kTiles, D}, dt, nl::sbuf, "out_tile"));
  auto columns = [&](const char* name) {
    Tensor t = nl::ndarray({P, kSmall}, nl::float32, nl::sbuf, name);
    std::vector<Tensor> slots;
    for (int64_t s = 0; s < kSmall; ++s) slots.push_back(t(nl::all, nl::ds(s, 1)));
    return Ring(slots);
  };
  Ring max_ring = columns("neg_max"), alpha_ring = columns("rescale"), stat_ring = columns("row_stats");
  Ring sink_ring = columns("sink_terms");
  // Every query head's sink logit on every partition, and negated (the running maximum is).
  const Tensor sink_cols = nl::ndarray({P, d.H}, nl::float32, nl::sbuf, "sinks");
  const Tensor neg_sinks = nl::ndarray({P, d.H}, nl::float32, nl::sbuf, "neg_sinks");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  sch.add([&] { isa::memset(row_stage(all, all, nl::ds(0, 1)), 0.0, isa::gpsimd_engine); });
  sch.add([&] { isa::dma_copy(sink_cols, sinks.reshape({1, d.H}).broadcast(0, P)); });
  sch.add([&] { isa::activation(neg_sinks, nl::copy, sink_cols, {.scale = -1.0}); });

  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t g = 0; g < d.Hkv; ++g) {
      // Resident K^T [D, Skv] and V with a column of ones [P, key tile, D + 1].
      Tensor kT = nl::ndarray({D, Skv}, dt, nl::sbuf, "kT");
      Tensor vx = nl::ndarray({P, nkt, D1}, dt, nl::sbuf, "v_ones");
      sch.add([&] { isa::memset(vx(all, all, nl::ds(D, 1)), 1.0, isa::gpsimd_engine); });
      int64_t loaded = 0;
      // K rows -> transposes -> K^T, and V rows, a group of key tiles at a time.
      auto load_keys = [&](int64_t upto) {
        for (int64_t j0 = loaded; j0 < upto; j0 += kgroup) {
          const int64_t j1 = std::min(upto, j0 + kgroup);
          const Tensor stage = krow_ring.next();
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t pk = std::min(P, Skv - j * P);
            sch.add([&] { attention::load_rows(stage(all, j - j0, all), k(b, g, nl::ds(j * P, pk), all)); });
          }
          const Tensor kt_psum = prep_ring.next();
          sch.add([&] {
            for (int64_t j = j0; j < j1; ++j)
              attention::transpose_rows(kt_psum(first(D), j - j0, all), stage(all, j - j0, all), std::min(P, Skv - j * P),
                                        D);
          });
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t pk = std::min(P, Skv - j * P);
            sch.add([&] { isa::dma_copy(vx(first(pk), j, nl::ds(0, D)), v(b, g, nl::ds(j * P, pk), all)); });
          }
          sch.add([&] {
            attention::copy_transposed_rows(kT(all, nl::ds(j0 * P, std::min(Skv, j1 * P) - j0 * P)),
                                            kt_psum(first(D), all, all), j1 - j0, std::min(P, Skv - (j1 - 1) * P));
          });
        }
        loaded = std::max(loaded, upto);
      };

      for (int64_t h = g * d.G; h < (g + 1) * d.G; ++h)
        for (int64_t q0 = 0; q0 < S; q0 += P) {
          const int64_t pq = std::min(P, S - q0), qpos = q0 + prefix;  // the tile's first query's key position
          const int64_t kv_end = causal ? std::min(Skv, qpos + pq) : Skv;
          // With a sliding window, key tiles wholly before the first query's window are skipped.
          const int64_t kv_begin = window > 0 ? std::max<int64_t>(0, qpos - window + 1) / P * P : 0;
          // Q rows -> transpose -> Q^T.
          const Tensor qrow = qrow_ring.next(), q_psum = prep_ring.next(), qT = qT_ring.next();
          sch.add([&] { attention::load_rows(qrow, q(b, h, nl::ds(q0, pq), all)); });
          sch.add([&] { attention::transpose_rows(q_psum(first(D), 0, all), qrow, pq, D); });
          sch.add([&] { attention::copy_transposed_rows(qT(all, first(pq)), q_psum(first(D), nl::ds(0, 1), all), 1, pq); });
          const Tensor acc = o_ring.next()(first(pq), all);  // [pq, D + 1]: numerator | denominator
          Tensor neg_max;

          // The kernel's last query tile takes its keys in short chunks: nothing follows it to
          // overlap with, and a short chunk's softmax finishes sooner.
          const bool final_tile = b == d.B - 1 && h == d.H - 1 && q0 + P >= S;
          const int64_t chunk = final_tile ? std::min<int64_t>(C, 2 * bank) : C;
          for (int64_t c0 = kv_begin; c0 < kv_end; c0 += chunk) {
            const int64_t cw = std::min(chunk, kv_end - c0);
            const bool first_chunk = c0 == kv_begin;
            load_keys(std::min(nkt, ceil_div(ceil_div(c0 + cw, P), kgroup) * kgroup));

            // Scores, one PSUM bank of keys at a time: matmul, scaled copy to SBUF, the diagonal
            // block's mask, and the pairwise maximum that halves each row for the reduction.
            const Tensor sf = sf_ar.next(cw)(first(pq), all);
            const int64_t last_off = ((cw - 1) / bank) * bank;
            const int64_t width = last_off / 2 + (std::min(bank, cw - last_off) + 1) / 2;
            const Tensor halves = sh_ar.next(width)(first(pq), all);
            for (int64_t c = c0; c < c0 + cw; c += bank) {
              const int64_t w = std::min(bank, c0 + cw - c), off = c - c0;
              const Tensor s = s_ring.next()(first(pq), nl::ds(0, w));
              const Tensor sfw = sf(all, nl::ds(off, w));
              sch.add([&] { m.scores(s, qT(all, first(pq)), kT(all, nl::ds(c, w))); });
              if (softcap > 0) sch.add([&] { m.scaled_copy(sfw, s, scalar); });
              else sch.add_any({[&] { m.scaled_copy(sfw, s, vector); }, [&] { m.scaled_copy(sfw, s, scalar); }});
              const int64_t lo = std::max(qpos, c), hi = c + w;  // keys after the diagonal: only its block
              if (causal && hi - 1 > qpos)
                sch.add([&] { attention::mask_after_diagonal(sf(all, nl::ds(lo - c0, hi - lo)), qpos, lo, m.masked()); });
              // Keys some query's window starts after: before the key position qpos + pq - window.
              const int64_t wend = std::min(hi, qpos + pq - window);
              if (window > 0 && c < wend)
                sch.add([&] { attention::mask_before_window(sf(all, nl::ds(off, wend - c)), qpos, c, window, m.masked()); });
              const Tensor half = halves(all, nl::ds(off / 2, (w + 1) / 2));
              sch.add_any({[&] { m.half_max(half, sfw, gpsimd); }, [&] { m.half_max(half, sfw, vector); }});
            }
            // GpSimd halves the halves once more, so the Vector engine's fp32 reduction (it has no
            // fast mode for fp32) reads a quarter of the row. The running maximum is kept
            // negated: it is the bias of exp.
            const Tensor quarters = sh_ar.next((width + 1) / 2)(first(pq), all);
            sch.add_any({[&] { m.half_max(quarters, halves, gpsimd); }, [&] { m.half_max(quarters, halves, vector); }});
            const Tensor chunk_max = max_ring.next()(first(pq), all);
            sch.add([&] { m.neg_row_max(chunk_max, quarters); });
            if (softcap > 0) sch.add([&] { m.uncap_max(chunk_max); });
            Tensor alpha;
            if (first_chunk) {  // the sink's logit joins the maximum
              neg_max = max_ring.next()(first(pq), all);
              sch.add([&] { m.include_sink(neg_max, chunk_max, neg_sinks(first(pq), nl::ds(h, 1))); });
            } else {
              const Tensor prev = neg_max;
              neg_max = max_ring.next()(first(pq), all);
              alpha = alpha_ring.next()(first(pq), all);
              sch.add([&] { m.running_max(neg_max, prev, chunk_max); });
              sch.add([&] { m.correction(alpha, prev, neg_max); });
              sch.add([&] { m.rescale(acc, alpha); });
            }

            // exp, transposes of P and P V, one PSUM bank of transposes at a time.
            const Tensor p = p_ar.next(cw)(first(pq), all);
            const Tensor pT = pt_ar.next(ceil_div(cw, P));
            for (int64_t off = 0; off < cw; off += tpb * P) {
              const int64_t w = std::min(tpb * P, cw - off);
              sch.add([&] { m.probabilities(p(all, nl::ds(off, w)), sf(all, nl::ds(off, w)), neg_max); });
              const int64_t b0 = off / P, b1 = ceil_div(off + w, P);
              const Tensor t = t_ring.next();
              sch.add([&] {
                for (int64_t blk = b0; blk < b1; ++blk) {
                  const int64_t wk = std::min(P, cw - blk * P);
                  isa::nc_transpose(t(first(wk), blk - b0, first(pq)), p(all, nl::ds(blk * P, wk)));
                }
              });
              auto copy_pT = [&](Engine e) {
                const int64_t full = std::min(b1, cw / P) - b0;
                if (full > 0) attention::copy_out(pT(all, nl::ds(b0, full), first(pq)), t(all, nl::ds(0, full), first(pq)), e);
                if (b0 + full < b1) {
                  const int64_t wk = cw - (b1 - 1) * P;
                  attention::copy_out(pT(first(wk), b1 - 1, first(pq)), t(first(wk), b1 - 1 - b0, first(pq)), e);
                }
              };
              sch.add_any({[&] { copy_pT(vector); }, [&] { copy_pT(scalar); }});
              sch.add([&] {
                for (int64_t blk = b0; blk < b1; ++blk) {
                  const int64_t wk = std::min(P, cw - blk * P);
                  isa::nc_matmul(acc, pT(first(wk), blk, first(pq)), vx(first(wk), c0 / P + blk, all),
                                 {.accumulate = !(first_chunk && blk == 0)});
                }
              });
            }
          }
          // The sink's term joins the denominator; out = numerator / denominator and lse =
          // log(denominator) + max.
          const Tensor sink_e = sink_ring.next()(first(pq), all);
          const Tensor recip = stat_ring.next()(first(pq), all), tile_lse = stat_ring.next()(first(pq), all);
          const Tensor o_tile = otile_ring.next()(first(pq), all);
          const Tensor numerator = acc(all, nl::ds(0, D)), denominator = acc(all, nl::ds(D, 1));
          sch.add([&] { m.sink_weight(sink_e, sink_cols(first(pq), nl::ds(h, 1)), neg_max); });
          sch.add_any({[&] { m.reciprocal_with_sink(recip, denominator, sink_e, vector); },
                       [&] { m.reciprocal_with_sink(recip, denominator, sink_e, scalar); }});
          sch.add_any({[&] { m.normalize(o_tile, numerator, recip, vector); },
                       [&] { m.normalize(o_tile, numerator, recip, scalar); }});
          sch.add([&] { isa::dma_copy(out(b, h, nl::ds(q0, pq), all), o_tile); });
          sch.add([&] { m.log_denominator_with_sink(tile_lse, denominator, sink_e); });
          sch.add([&] { m.add_max(tile_lse, neg_max); });
          sch.add([&] { isa::dma_copy(lse(b, h, nl::ds(q0, pq)), tile_lse); });
        }
    }
  sch.run();
  return {out, lse};
}

namespace attention {

/** @brief q, k, v, sinks specs of one attention problem. */
inline std::vector<TensorSpec> problem(int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t Skv, int64_t D, DType t) {
  return {spec({B, H, S, D}, t), spec({B, Hkv, Skv, D}, t), spec({B, Hkv, Skv, D}, t), spec({H}, DType::float32)};
}

/** @brief Sinks [H] of a prefill case: none (-inf on every head, what the torch wrapper passes
 *  without sinks) a third of the time, decode's mix of -inf and 2 N(0, 1) logits a third, and a
 *  third with some heads' sinks far above every score (30 to 60, or 1e4: the sink takes nearly
 *  all the weight). */
inline RefTensor prefill_sinks(int64_t H, CaseRng& r) {
  const int64_t mode = r.uniform(0, 2);
  if (mode == 1) return random_sinks(H, r);
  RefTensor sinks(Shape{H});
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kind = mode == 0 ? 0 : r.uniform(0, 3);
    sinks[h] = kind == 0   ? -INFINITY
               : kind == 1 ? round_to(DType::float32, 2 * r.normal())
               : kind == 2 ? double(r.uniform(30, 60))
                           : 1e4;
  }
  return sinks;
}

/** @brief Forward inputs: standard normal q, k and v (q eight times larger with a soft-cap, so
 *  that scores go well past the cap), and prefill_sinks. */
inline std::vector<RefTensor> forward_inputs(const ExampleCase& c, CaseRng& r) {
  const bool capped = c.params.find("softcap").value_or(0) != 0;
  std::vector<RefTensor> in{random_input(c.inputs[0], r, capped ? 8.0 : 1.0), random_input(c.inputs[1], r),
                            random_input(c.inputs[2], r)};
  in.push_back(prefill_sinks(c.inputs[0].shape[1], r));
  return in;
}

/** @brief A case's options as the references take them. */
inline AttentionOptions options_of(const ParamValues& p) {
  return {p.flag("causal") || p.integer("window") > 0, p.integer("window"), p.integer("prefix_len"), p.real("softcap")};
}

/** @brief A random attention problem: batch, grouped-query ratios, lengths with tails (equal
 *  lengths more often, as in self-attention), head dims, causal, an explicit scale, a window, a
 *  soft-cap and a cached prefix (its length a multiple of 128 or one off now and then). */
inline ExampleCase draw_problem(CaseRng& r) {
  const int64_t B = r.uniform(1, 2), Hkv = r.uniform(1, 3), G = r.pick<int64_t>({1, 1, 2, 3, 4});
  const int64_t S = r.size(1, 700);
  const int64_t prefix = r.coin(0.25) ? r.size(0, 300) : 0;
  int64_t Skv = prefix > 0 ? (r.coin(0.7) ? prefix + S : r.size(prefix, prefix + S + 100))
                           : (r.coin(0.6) ? S : r.size(1, 700));
  const int64_t D = r.pick<int64_t>({16, 32, 40, 64, 64, 72, 80, 96, 100, 128, 128});
  const DType t = r.pick({DType::float32, DType::bfloat16, DType::float16});
  Params params;
  params.set("causal", prefix > 0 || r.coin() ? 1.0 : 0.0);  // a prefix offsets the causal mask
  if (prefix > 0) params.set("prefix_len", double(prefix));
  if (r.coin(0.25)) params.set("scale", 0.02 + 0.5 * double(r.uniform(0, 100)) / 100.0);
  if (r.coin(0.25)) {  // a sliding window needs a key per query after the prefix
    params.set("window", double(r.uniform(1, prefix + S + 20)));
    Skv = std::max(Skv, prefix + S);
  }
  if (r.coin(0.25)) params.set("softcap", r.pick({1.0, 5.0, 20.0, 50.0}));
  return ExampleCase{problem(B, G * Hkv, Hkv, S, Skv, D, t), params, "drawn"};
}

/** @brief The estimates' shape: B = 1, H = 4, S = 4096, D = 128, bf16. */
inline ExampleCase benchmark_problem(bool causal) {
  ExampleCase c{problem(1, 4, 4, 4096, 4096, 128, DType::bfloat16), {},
                causal ? "B=1 H=4 S=4096 D=128 bf16, causal" : "B=1 H=4 S=4096 D=128 bf16"};
  c.params.set("causal", causal ? 1.0 : 0.0);
  return c;
}

/** @brief FLOPs of the attention maths (Q K^T and P V) in the forward, halved when causal. */
inline double forward_flops(const ExampleCase& c) {
  const Shape &q = c.inputs[0].shape, &k = c.inputs[1].shape;
  const double f = 4.0 * double(q[0] * q[1]) * double(q[2]) * double(k[2]) * double(q[3]);
  return c.params.find("causal").value_or(0) != 0 ? f / 2 : f;
}

/** @brief The parameters of flash_attention and its backward. */
inline std::vector<ParamSpec> flash_params() {
  return {{"causal", ParamKind::boolean, 0, "mask keys after the query's position i + prefix_len"},
          {"scale", ParamKind::optional_real, 0, "score multiplier; default 1 / sqrt(head_dim)"},
          {"window", ParamKind::integer, 0, "sliding window: query i sees keys i + prefix_len - window < j (0: none)"},
          {"softcap", ParamKind::real, 0, "logit soft-cap: scores s -> softcap * tanh(s / softcap) (0: none)"},
          {"prefix_len", ParamKind::integer, 0, "cached keys before the active ones: query i sits at key i + prefix_len"}};
}

}  // namespace attention

inline KernelInfo flash_attention_info() {
  using attention::problem;
  const DType f32 = DType::float32, bf16 = DType::bfloat16;
  return KernelInfo{
      .name = "flash_attention",
      .summary = "scaled dot-product attention (causal, grouped query, sinks, soft-cap, prefix) with its logsumexp",
      .doc = flash_attention_doc,
      .inputs = {"q", "k", "v", "sinks"},
      .outputs = {"out", "lse"},
      .params = attention::flash_params(),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "flash_attention_bwd",
      .saved_outputs = {"lse"},
      .body =
          [](const KernelCall& c) {
            return flash_attention(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.flag("causal"),
                                   c.optional_real("scale"), c.integer("window"), c.real("softcap"),
                                   c.integer("prefix_len"));
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::attention_forward(in[0], in[1], in[2], in[3], p.optional_real("scale"),
                                                attention::options_of(p));
          },
      .make_inputs = attention::forward_inputs,
      .examples = {{problem(1, 2, 1, 200, 330, 64, f32), {}, "grouped query heads, query and key tails"},
                   {problem(1, 1, 1, 330, 200, 128, bf16), Params{{"causal", 1.0}}, "causal, fewer keys than queries"},
                   {problem(2, 2, 2, 1, 70, 64, bf16), {}, "one query (decode shape)"},
                   {problem(1, 1, 1, 129, 129, 96, f32), Params{{"causal", 1.0}, {"scale", 0.3}},
                    "odd head dim, explicit scale"},
                   {problem(1, 4, 2, 333, 333, 128, f32), Params{{"causal", 1.0}}, "grouped query heads, causal, tails"},
                   {problem(1, 2, 1, 700, 750, 64, bf16), Params{{"window", 200.0}},
                    "sliding window: key tiles before it skipped, both edges masked"},
                   {problem(1, 1, 1, 300, 300, 32, f32), Params{{"window", 1.0}}, "window of one key"},
                   {problem(1, 4, 2, 300, 300, 80, f32), Params{{"causal", 1.0}, {"softcap", 5.0}},
                    "soft-cap 5 over scores far past it, causal, head dim 80"},
                   {problem(1, 2, 2, 260, 460, 128, bf16), Params{{"causal", 1.0}, {"prefix_len", 200.0}},
                    "a cached prefix of 200 keys (not a multiple of 128), causal"},
                   {problem(1, 4, 1, 200, 530, 64, f32),
                    Params{{"window", 150.0}, {"prefix_len", 330.0}, {"softcap", 20.0}, {"scale", 0.2}},
                    "prefix, window and soft-cap together: the prefix's first keys fall out of every window"}},
      .draw = attention::draw_problem,
      .tolerance = {},
      .benchmark = Benchmark{attention::benchmark_problem(false), Bound::tensor_engine, attention::forward_flops, 0.60},
  };
}

}  // namespace nikki::kernels
