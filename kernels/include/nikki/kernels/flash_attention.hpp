// Flash attention (FlashAttention-2 tiling) forward and backward, with causal masking and grouped
// query attention.
//
// Why the kernels look the way they do (NeuronCore, trn2 cost model):
//
// - nc_matmul contracts over the partition dim, so S = Q K^T needs Q^T and K^T (head dim on
//   partitions) and P V needs P^T (keys on partitions). A transposing DMA moves one element per
//   descriptor, hundreds of times slower than a row copy, so every transpose runs on the Tensor
//   engine (128 cycles per 128x128 block) and is copied out of PSUM. The forward's Tensor-engine
//   work per 128x128 block is therefore QK^T + transpose(P) + PV: at most 2/3 of it is useful.
// - PSUM can only be read by the Vector and Scalar engines, which makes them the other
//   bottleneck. The forward copies the scaled scores to SBUF once (Vector, 2x mode), the GpSimd
//   engine halves each row by a pairwise maximum, the Vector engine reduces the half to the row
//   maximum in its fast bf16 mode, and the Scalar engine computes exp from the SBUF copy. The
//   maximum is taken of bf16-rounded scores (and kept in bf16, the bias of exp): it only has to
//   be close to the true maximum for exp to stay in range, and the logsumexp is computed with the
//   same value, so results do not depend on its rounding. Every other read of PSUM (scores, P^T,
//   the output and its denominator) goes to whichever of the Vector and Scalar engines finishes
//   it first: per 128x128 block the two carry about 270 ns of work against the Tensor engine's
//   160 ns, so they stay within a few percent of it only if neither idles.
// - V gets an extra column of ones, so the P V matmul also accumulates the softmax denominator
//   (the sum of the very probabilities the numerator used) with no reduction instruction.
// - Work is ordered by a list scheduler run at trace time (task_scheduler.hpp) over
//   (head, query tile, key chunk) items. Tiles that several items have in flight live in rings
//   and arenas carved out of one tensor; the scheduler's byte-range hazards make a slot wait only
//   for its own previous readers.
// - The DMA queues share one bandwidth in the order transfers are issued, and the first causal
//   tiles (a few key tiles each) need more loads than Tensor work: each load is issued in the
//   order its data is needed (estimated Tensor time), and the K and Q row staging shares one
//   tensor so that its first loads do not wait for one another.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nikki/kernels/argument_check.hpp"
#include "nikki/kernels/library.hpp"
#include "nikki/kernels/task_scheduler.hpp"

namespace nikki::kernels {

namespace flash_detail {

using scheduling::Arena;
using scheduling::Ring;
using scheduling::Scheduler;
using scheduling::Unit;

/** The first n partitions (or elements) of a dim. */
inline auto rows(int64_t n) { return nl::ds(0, n); }
/** Task lists joined: a task's dependencies gathered from several places. */
inline std::vector<int> cat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/** Sizes shared by the forward and the backward. */
struct Dims {
  int64_t B = 0, H = 0, Hkv = 0, S = 0, Skv = 0, D = 0, G = 0;
  DType dtype = DType::float32;
};

inline std::string shape_str(const Tensor& t) { return t.shape().str(); }

inline Dims check_qkv(const ArgumentCheck& check, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pmax) {
  for (const Tensor* t : {&q, &k, &v})
    if (t->ndim() != 4)
      check.fail("q, k and v must be 4-D [batch, heads, seq, head_dim], got " + t->name() + " " + shape_str(*t));
  Dims d;
  d.B = q.shape()[0];
  d.H = q.shape()[1];
  d.S = q.shape()[2];
  d.D = q.shape()[3];
  d.Hkv = k.shape()[1];
  d.Skv = k.shape()[2];
  d.dtype = q.dtype();
  if (k.shape()[0] != d.B || k.shape()[3] != d.D || v.shape() != k.shape())
    check.fail("k " + shape_str(k) + " and v " + shape_str(v) +
               " must both be [B, Hkv, Skv, D] with q's B and D (q is " + shape_str(q) + ")");
  if (d.H % d.Hkv != 0)
    check.fail("q has " + std::to_string(d.H) + " heads, which is not a multiple of the " + std::to_string(d.Hkv) +
                   " kv heads",
               "grouped query attention needs Hkv to divide H");
  d.G = d.H / d.Hkv;
  if (d.D > pmax)
    check.fail("head dim " + std::to_string(d.D) + " is too large",
               "head_dim <= " + std::to_string(pmax) + ": the head dim is the contraction (partition) dim of Q K^T",
               "split the heads, or use head_dim 64 or 128");
  const DType t = q.dtype();
  if (t != DType::float32 && t != DType::bfloat16 && t != DType::float16)
    check.fail(std::string("dtype ") + std::string(dtype_name(t)) + " is not supported",
               "q, k and v are float32, bfloat16 or float16");
  if (k.dtype() != t || v.dtype() != t)
    check.fail("q, k and v must have one dtype, got " + std::string(dtype_name(t)) + ", " +
               std::string(dtype_name(k.dtype())) + ", " + std::string(dtype_name(v.dtype())));
  return d;
}

/** PSUM -> SBUF copy on the Vector engine, or on the Scalar engine (as activation: trn1's
 *  Scalar engine has no tensor_copy). */
inline void copy(const Tensor& dst, const Tensor& src, bool on_scalar) {
  if (on_scalar) isa::activation(dst, nl::copy, src);
  else isa::tensor_copy(dst, src, isa::vector_engine);
}

/*
 * Row tiles that get transposed on chip (Q, K, dO, V of the backward) are loaded two rows per
 * partition: a DMA descriptor per 2 * D contiguous elements instead of per row (a third less DMA
 * time at D = 128), and the two [64, D] transposes cost what one [128, D] transpose costs. Partition
 * p, half r holds row 2p + r; the copy out of PSUM puts the columns back in row order. A partial
 * tile (n < 128 rows) uses one row per partition.
 */
/** Loads rows [n, D] of HBM into `stage` ([P, 2 * D]). */
inline void load_rows(const Tensor& stage, const Tensor& src) {
  const int64_t n = src.shape()[0], D = src.shape()[1], P = stage.shape()[0];
  if (n == P) isa::dma_copy(stage(nl::ds(0, P / 2), nl::all), src.reshape({P / 2, 2 * D}));
  else isa::dma_copy(stage(nl::ds(0, n), nl::ds(0, D)), src);
}
/** Transposes staged rows into `dst` ([D, P] in PSUM; columns in the staged order). */
inline void transpose_rows(const Tensor& dst, const Tensor& stage, int64_t n, int64_t D) {
  const int64_t P = stage.shape()[0];
  if (n == P) {
    for (int64_t r = 0; r < 2; ++r)
      isa::nc_transpose(dst(nl::ds(0, D), nl::ds(r * P / 2, P / 2)), stage(nl::ds(0, P / 2), nl::ds(r * D, D)));
  } else {
    isa::nc_transpose(dst(nl::ds(0, D), nl::ds(0, n)), stage(nl::ds(0, n), nl::ds(0, D)));
  }
}
inline double row_load_ns(const Scheduler& sch, int64_t n, int64_t row_bytes) {
  return n == sch.partitions() ? sch.dma(n * row_bytes, n / 2) : sch.dma(n * row_bytes, n);
}
inline double rows_transpose_ns(const Scheduler& sch, int64_t n, int64_t D) {
  return n == sch.partitions() ? 2 * sch.transpose(n / 2, D) : sch.transpose(n, D);
}
/** Copies `tiles` transposed tiles ([D, tiles, P] in PSUM) to row order in `dst` ([D, cols]);
 *  the last tile has `last` rows. */
inline void copy_transposed_rows(const Tensor& dst, const Tensor& src, int64_t tiles, int64_t last) {
  const int64_t P = src.shape()[2];
  const int64_t full = last == P ? tiles : tiles - 1;
  if (full > 0) {
    Tensor d = dst(nl::all, nl::ds(0, full * P)).reshape_dim(1, {full, P / 2, 2}).permute({0, 1, 3, 2});
    isa::tensor_copy(d, src(nl::all, nl::ds(0, full), nl::all).reshape_dim(2, {2, P / 2}), isa::vector_engine);
  }
  if (full < tiles)
    isa::tensor_copy(dst(nl::all, nl::ds(full * P, last)), src(nl::all, full, nl::ds(0, last)), isa::vector_engine);
}

}  // namespace flash_detail

inline constexpr const char* flash_attention_doc = R"(Scaled dot-product attention, FlashAttention-2 style.

Dimensions: q [B, H, S, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, D] -> out [B, H, S, D],
            lse [B, H, S]. D <= 128 (any size); any S and Skv (tails are smaller tiles);
            Hkv divides H (grouped query attention: query head h reads kv head h / (H / Hkv)).
Args:       q, k, v: HBM tensors of one dtype: float32, bfloat16 or float16.
            causal: mask key j from query i when j > i (the mask is lower triangular aligned at
              the top left, as torch's scaled_dot_product_attention(is_causal=True): every query
              sees key 0, so no row is empty even when Skv < S).
            scale: multiplier of q k^T (default 1 / sqrt(D)).
Returns:    out in q's dtype; lse = logsumexp of the scaled, masked scores of each query, float32
            (saved for the backward).
Notes:      One pass over the keys per 128-query tile, in chunks of up to 4096 keys, with an online
            softmax (running maximum, rescaled accumulator) across chunks. Scores, sums and the
            output accumulate in float32; the running maximum is of bfloat16-rounded scores (it
            only offsets exp, and lse uses the same value); the probabilities are rounded to the
            input dtype for the P V matmul, and the denominator sums those rounded probabilities. In causal
            mode key chunks past the diagonal are skipped and only the diagonal block is masked.
            K and V of one kv head stay in SBUF: Skv is limited by the SBUF size (about 20k keys
            at D = 128 in bfloat16); exceeding it is a KernelError.
Pseudocode: s = scale * q @ k.T (masked to -inf where j > i if causal)
            lse = logsumexp(s, axis=-1); out = exp(s - lse) @ v)";

/** @brief (out, lse) = flash_attention(q, k, v); see flash_attention_doc. */
inline std::vector<Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                           std::optional<double> scale_opt = std::nullopt, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using flash_detail::Arena;
  using flash_detail::Ring;
  const ArgumentCheck check("flash_attention", q, loc);
  const nl::TileSize ts = nl::tile_size();
  const flash_detail::Dims d = flash_detail::check_qkv(check, q, k, v, ts.pmax);
  const int64_t P = ts.pmax, D = d.D, D1 = d.D + 1, S = d.S, Skv = d.Skv;
  const DType dt = d.dtype;
  const int64_t ds = dtype_size(dt);
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  const int64_t bank = ts.psum_bank_fmax;                      // fp32 elements of one PSUM bank
  const int64_t tpb = ts.psum_bank_fmax_bytes / (P * ds);      // transposed 128-blocks per bank
  const int64_t nkt = ceil_div(Skv, P);                            // key tiles per head

  Tensor out = nl::ndarray({d.B, d.H, S, D}, dt, nl::shared_hbm, "out");
  Tensor lse = nl::ndarray({d.B, d.H, S}, nl::float32, nl::shared_hbm, "lse");

  // --- SBUF plan: K^T and V of a kv head stay resident (two kv heads overlap at a boundary); the
  // key chunk C is the largest that leaves room for the working rings.
  const int64_t sbuf = ts.sbuf_fmax_bytes;
  const int64_t resident = 2 * (Skv * ds + nkt * D1 * ds);
  constexpr int64_t kSf = 3, kSh = 2, kPr = 2, kPt = 2, kRows = 8, kTiles = 8, kSmall = 32;
  auto working = [&](int64_t C) {
    return kSf * C * 4 + kSh * (C / 2) * 2 + kPr * C * ds + kPt * C * ds + kRows * 4 * 2 * D * ds + kTiles * D * ds +
           kTiles * (2 * D * ds + P * ds) + 3 * kSmall * 4;
  };
  int64_t C = 4096;
  while (C > 512 && resident + working(C) > sbuf) C /= 2;
  if (resident + working(C) > sbuf)
    check.fail("K and V of one kv head (Skv = " + std::to_string(Skv) + ", D = " + std::to_string(D) + ", " +
                   std::string(dtype_name(dt)) + ") do not fit in SBUF",
               "K^T and V of a kv head are kept in SBUF: about " + std::to_string(resident / 1024) +
                   " KiB per partition needed, " + std::to_string(sbuf / 1024) + " KiB available",
               "split the keys across calls (e.g. ring attention) or use a shorter sequence");

  // --- rings. PSUM (8 banks): scores, transposes, output accumulators.
  // Q and K transposes have their own bank, so that preparing the next tile never waits for the
  // P transposes of the current one.
  const int64_t n_s = 2, n_t = 3, n_o = 2;
  Ring s_ring(nl::ndarray({P, n_s, bank}, nl::float32, nl::psum, "scores_psum"), n_s);
  Ring t_ring(nl::ndarray({P, n_t, tpb, P}, dt, nl::psum, "transpose_psum"), n_t);
  // Keys are prepared in groups of a QK matmul's width (half a bank of transposes), so the first
  // scores of a head wait for four key tiles, not eight.
  const int64_t kgroup = std::max<int64_t>(1, bank / P);
  Ring prep_ring(nl::ndarray({P, tpb / kgroup, kgroup, P}, dt, nl::psum, "prep_transpose_psum"), tpb / kgroup);
  // Output accumulators [pq, D + 1] are packed several to a bank (a matmul stays within a bank).
  const int64_t per_bank = bank / D1;
  Ring o_ring(nl::ndarray({P, n_o, bank}, nl::float32, nl::psum, "out_psum"), n_o * per_bank);
  // Per-item working tiles are spans of arenas: narrow causal items share the space of one wide one.
  Arena sf_ar(nl::ndarray({P, kSf * C}, nl::float32, nl::sbuf, "scores"), kSf * C);
  Arena sh_ar(nl::ndarray({P, kSh * (C / 2 + 1)}, nl::bfloat16, nl::sbuf, "half_max"), kSh * (C / 2 + 1));
  Arena p_ar(nl::ndarray({P, kPr * C}, dt, nl::sbuf, "probs"), kPr * C);
  Arena pt_ar(nl::ndarray({P, kPt * (C / P), P}, dt, nl::sbuf, "probs_T"), kPt * (C / P));
  // K and Q rows are staged in one tensor: see the memset below.
  Tensor row_stage = nl::ndarray({P, kRows * kgroup + kTiles, 2 * D}, dt, nl::sbuf, "row_stage");
  Ring krow_ring(row_stage(nl::all, nl::ds(0, kRows * kgroup), nl::all).reshape_dim(1, {kRows, kgroup}), kRows);
  Ring qrow_ring(row_stage(nl::all, nl::ds(kRows * kgroup, kTiles), nl::all), kTiles);
  Ring qT_ring(nl::ndarray({D, kTiles, P}, dt, nl::sbuf, "qT"), kTiles);
  Ring otile_ring(nl::ndarray({P, kTiles, D}, dt, nl::sbuf, "out_tile"), kTiles);
  Ring nm_ring(nl::ndarray({P, kSmall}, nl::bfloat16, nl::sbuf, "neg_max"), kSmall);
  Ring alpha_ring(nl::ndarray({P, kSmall}, nl::float32, nl::sbuf, "rescale"), kSmall);
  Ring stat_ring(nl::ndarray({P, kSmall}, nl::float32, nl::sbuf, "row_stats"), kSmall);

  const TargetConfig& target = KernelBuilder::current(std::source_location::current()).config();
  flash_detail::Scheduler sch(target);
  using U = flash_detail::Unit;
  const bool wide = dt == DType::float32;
  const auto all = nl::all;
  using flash_detail::cat;
  using flash_detail::rows;
  auto eng = [&](U u, double cycles, int64_t free) { return sch.engine(u, cycles, free); };
  // The first instruction on a scratch tensor also fills all of it with sentinels, so every later
  // access waits for it. A one-element memset takes that role for the row staging: the first K
  // and Q loads then become ready together, and go in the order they are issued, instead of all
  // waiting for the very first one.
  const int stage_fill = sch.add(U::gpsimd, eng(U::gpsimd, 1, 1), {}, 0, [&row_stage] {
    isa::memset(row_stage(nl::all, 0, nl::ds(0, 1)), 0.0, isa::gpsimd_engine);
  });
  for (Ring* r : {&krow_ring, &qrow_ring})
    for (int64_t s = 0; s < r->n; ++s) r->use(s, stage_fill);

  // DMA transfers share one bandwidth in the order they are issued. A transfer's priority (the
  // scheduler's order among the transfers that are ready) is the estimated time its data is first
  // needed: the Tensor-engine work emitted before that point, in ns. So the K rows of a chunk's
  // scores go before its V, the next tile's Q before the current tile's last V, and a tile's
  // outputs after the loads needed before its end.
  double tensor_ns = 0;
  auto need = [](double ns) { return int64_t(std::llround(ns)); };
  struct {
    double t0 = 0, bank_ns = 0, block_ns = 0;  // start, scores per bank, P^T and P V per key tile
    int64_t c0 = 0, banks = 0;
  } emitting;  // the chunk being emitted, for the need times of the keys it loads
  // The next tile's Q is needed when the latest chunk's scores are done: the Tensor engine goes
  // on to the next tile while the chunk's softmax runs.
  double scores_done_ns = 0;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t g = 0; g < d.Hkv; ++g) {
      // Resident K^T [D, Skv] and V with a column of ones [P, key tile, D + 1].
      Tensor kT = nl::ndarray({D, Skv}, dt, nl::sbuf, "kT");
      Tensor vx = nl::ndarray({P, nkt, D1}, dt, nl::sbuf, "v_ones");
      const int ones = sch.add(U::gpsimd, eng(U::gpsimd, double(nkt), nkt), {}, 0,
                               [=] { isa::memset(vx(all, all, nl::ds(D, 1)), 1.0, isa::gpsimd_engine); });
      std::vector<int> k_ready(size_t(nkt), -1), v_ready(size_t(nkt), -1);
      int64_t loaded = 0;
      auto load_keys = [&](int64_t upto) {  // K rows -> transposes -> K^T; V rows
        for (int64_t j0 = loaded; j0 < upto; j0 += kgroup) {
          const int64_t j1 = std::min(upto, j0 + kgroup);
          auto [kr, kr_prev] = krow_ring.take();
          std::vector<int> dmas;
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t pk = std::min(P, Skv - j * P);
            const int64_t k_need = need(emitting.t0 + double(std::max<int64_t>(0, j0 * P - emitting.c0) / bank) * emitting.bank_ns);
            const int dk = sch.add(U::dma, flash_detail::row_load_ns(sch, pk, D * ds), kr_prev, k_need, [=, &krow_ring] {
              flash_detail::load_rows(krow_ring.t(all, kr, j - j0, all), k(b, g, nl::ds(j * P, pk), all));
            });
            krow_ring.use(kr, dk);
            dmas.push_back(dk);
          }
          auto [ts_, t_prev] = prep_ring.take();
          double tr_ns = 0;
          for (int64_t j = j0; j < j1; ++j) tr_ns += flash_detail::rows_transpose_ns(sch, std::min(P, Skv - j * P), D);
          tensor_ns += tr_ns;
          const int tr = sch.add(U::tensor, tr_ns, cat(dmas, t_prev), 0, [=, &krow_ring, &prep_ring] {
            for (int64_t j = j0; j < j1; ++j)
              flash_detail::transpose_rows(prep_ring.t(rows(D), ts_, j - j0, all), krow_ring.t(all, kr, j - j0, all),
                                           std::min(P, Skv - j * P), D);
          });
          krow_ring.use(kr, tr);
          prep_ring.use(ts_, tr);
          // V is needed only by P V: its loads are issued after the K rows that the scores need
          // first (the DMA engines' bandwidth is shared, so issue order is arrival order).
          for (int64_t j = j0; j < j1; ++j) {
            const int64_t pk = std::min(P, Skv - j * P);
            const int64_t v_need = need(emitting.t0 + double(emitting.banks) * emitting.bank_ns +
                                        double(std::max<int64_t>(0, j - emitting.c0 / P) + 1) * emitting.block_ns);
            v_ready[size_t(j)] = sch.add(U::dma, sch.dma(pk * D * ds, pk), {ones, tr}, v_need, [=] {
              isa::dma_copy(vx(rows(pk), j, nl::ds(0, D)), v(b, g, nl::ds(j * P, pk), all));
            });
          }
          const int cp = sch.add(U::vector, eng(U::vector, sch.vector_stream_cycles((j1 - j0) * P), (j1 - j0) * P), {tr}, 0,
                                 [=, &prep_ring] {
                                   flash_detail::copy_transposed_rows(kT(all, nl::ds(j0 * P, std::min(Skv, j1 * P) - j0 * P)),
                                                                      prep_ring.t(rows(D), ts_, all, all), j1 - j0,
                                                                      std::min(P, Skv - (j1 - 1) * P));
                                 });
          prep_ring.use(ts_, cp);
          for (int64_t j = j0; j < j1; ++j) k_ready[size_t(j)] = cp;
        }
        loaded = std::max(loaded, upto);
      };

      for (int64_t h = g * d.G; h < (g + 1) * d.G; ++h)
        for (int64_t q0 = 0; q0 < S; q0 += P) {
          const int64_t pq = std::min(P, S - q0);
          const int64_t kv_end = causal ? std::min(Skv, q0 + pq) : Skv;
          // Q rows -> transpose -> Q^T.
          auto [qr, qr_prev] = qrow_ring.take();
          const int dq = sch.add(U::dma, flash_detail::row_load_ns(sch, pq, D * ds), qr_prev, need(scores_done_ns),
                                 [=, &qrow_ring] {
            flash_detail::load_rows(qrow_ring.t(all, qr, all), q(b, h, nl::ds(q0, pq), all));
          });
          qrow_ring.use(qr, dq);
          auto [tq, tq_prev] = prep_ring.take();
          tensor_ns += flash_detail::rows_transpose_ns(sch, pq, D);
          const int trq = sch.add(U::tensor, flash_detail::rows_transpose_ns(sch, pq, D), cat({dq}, tq_prev), 0,
                                  [=, &qrow_ring, &prep_ring] {
                                    flash_detail::transpose_rows(prep_ring.t(rows(D), tq, 0, all), qrow_ring.t(all, qr, all),
                                                                 pq, D);
                                  });
          qrow_ring.use(qr, trq);
          prep_ring.use(tq, trq);
          auto [qs, qs_prev] = qT_ring.take();
          const int qcp = sch.add(U::vector, eng(U::vector, sch.vector_stream_cycles(pq), pq), cat({trq}, qs_prev), 0,
                                  [=, &qT_ring, &prep_ring] {
                                    flash_detail::copy_transposed_rows(qT_ring.t(all, qs, rows(pq)),
                                                                       prep_ring.t(rows(D), tq, nl::ds(0, 1), all), 1, pq);
                                  });
          prep_ring.use(tq, qcp);
          qT_ring.use(qs, qcp);
          auto [os, os_prev] = o_ring.take();
          int last_pv = -1, nm_task = -1;
          int64_t nm_slot = -1;

          // The kernel's last query tile takes its keys in short chunks: nothing follows it to
          // overlap with, and a short chunk's softmax finishes sooner.
          const bool final_tile = b == d.B - 1 && h == d.H - 1 && q0 + P >= S;
          const int64_t chunk = final_tile ? std::min<int64_t>(C, 2 * bank) : C;
          for (int64_t c0 = 0; c0 < kv_end; c0 += chunk) {
            const int64_t cw = std::min(chunk, kv_end - c0);
            const bool first = c0 == 0, last = c0 + cw == kv_end;
            // Keys are prepared a scores matmul's width at a time: a causal tile needs one more
            // key tile than the previous.
            emitting.t0 = tensor_ns;
            emitting.c0 = c0;
            emitting.banks = ceil_div(cw, bank);
            emitting.bank_ns = sch.matmul(pq, std::min(bank, cw), wide);
            emitting.block_ns = sch.transpose(pq, P) + sch.matmul(pq, D1, wide);
            load_keys(std::min(nkt, ceil_div(ceil_div(c0 + cw, P), kgroup) * kgroup));

            // Scores: one matmul per PSUM bank, a scaled copy to SBUF, the diagonal mask, and a
            // pairwise maximum that halves each row for the reduction.
            auto [sf, sf_prev] = sf_ar.take(cw);
            const int64_t last_off = ((cw - 1) / bank) * bank;
            const int64_t width = last_off / 2 + (std::min(bank, cw - last_off) + 1) / 2;
            auto [sh, sh_prev] = sh_ar.take(width);
            std::vector<int> halves, sf_writes;
            for (int64_t c = c0; c < c0 + cw; c += bank) {
              const int64_t w = std::min(bank, c0 + cw - c), off = c - c0;
              auto [sb, sb_prev] = s_ring.take();
              std::vector<int> deps = cat({qcp}, sb_prev);
              for (int64_t j = c / P; j < ceil_div(c + w, P); ++j) deps.push_back(k_ready[size_t(j)]);
              tensor_ns += sch.matmul(pq, w, wide);
              const int qk = sch.add(U::tensor, sch.matmul(pq, w, wide), deps, 0, [=, &qT_ring, &s_ring] {
                isa::nc_matmul(s_ring.t(rows(pq), sb, nl::ds(0, w)), qT_ring.t(all, qs, rows(pq)), kT(all, nl::ds(c, w)),
                               {.accumulate = false});  // ring slots are reused: never accumulate
              });
              qT_ring.use(qs, qk);
              s_ring.use(sb, qk);
              int last_write = sch.add_flexible(
                  {{U::vector, eng(U::vector, sch.vector_stream_cycles(w), w)}, {U::scalar, eng(U::scalar, double(w), w)}},
                  cat({qk}, sf_prev), 0, [=, &sf_ar, &s_ring](U unit) {
                    isa::tensor_scalar(sf_ar.t(rows(pq), nl::ds(sf + off, w)), s_ring.t(rows(pq), sb, nl::ds(0, w)),
                                       nl::multiply, scale,
                                       {.engine = unit == U::scalar ? isa::scalar_engine : isa::vector_engine});
                  });
              s_ring.use(sb, last_write);
              sf_ar.use(sf, last_write);
              // Keys after the diagonal: only the block straddling it needs a mask.
              const int64_t lo = std::max(q0, c), hi = c + w;
              if (causal && hi - 1 > q0) {
                last_write = sch.add(U::gpsimd, eng(U::gpsimd, double(target.gpsimd_start_cycles + hi - lo), hi - lo),
                                     {last_write}, 0, [=, &sf_ar] {
                                       Tensor blk = sf_ar.t(rows(pq), nl::ds(sf + lo - c0, hi - lo));
                                       isa::affine_select(blk, {{-1, hi - lo}}, 1, blk, -1.0e30, nl::greater_equal,
                                                          q0 - lo);
                                     });
                sf_ar.use(sf, last_write);
              }
              sf_writes.push_back(last_write);
              const int64_t half = (w + 1) / 2;  // an odd width compares its middle column with itself
              const int hm = sch.add(U::gpsimd, eng(U::gpsimd, 2.0 * double(half), half), cat({last_write}, sh_prev),
                                     0, [=, &sf_ar, &sh_ar] {
                                       isa::tensor_tensor(sh_ar.t(rows(pq), nl::ds(sh + off / 2, half)),
                                                          sf_ar.t(rows(pq), nl::ds(sf + off, half)),
                                                          sf_ar.t(rows(pq), nl::ds(sf + off + w - half, half)),
                                                          nl::maximum, isa::gpsimd_engine);
                                     });
              sf_ar.use(sf, hm);
              sh_ar.use(sh, hm);
              halves.push_back(hm);
            }

            scores_done_ns = tensor_ns;
            // Running maximum, kept negated (it is the bias of exp) and in bfloat16 (the fast
            // reduction's output): a chunk's maximum is the running one for the first chunk, the
            // minimum of the negated maxima after it.
            auto [mc, mc_prev] = nm_ring.take();
            const int red = sch.add(U::vector, eng(U::vector, sch.vector_stream_cycles(width), width), cat(halves, mc_prev), 0,
                                    [=, &sh_ar, &nm_ring] {
                                      isa::tensor_reduce(nm_ring.t(rows(pq), nl::ds(mc, 1)), nl::maximum,
                                                         sh_ar.t(rows(pq), nl::ds(sh + 0, width)), {1}, true);
                                    });
            sh_ar.use(sh, red);
            nm_ring.use(mc, red);
            int nmt = red;
            int64_t nms = mc;
            int alpha = -1;
            int64_t al = 0;
            if (!first) {
              auto [cur, cur_prev] = nm_ring.take();
              const int64_t prev_slot = nm_slot;
              nms = cur;
              nmt = sch.add(U::gpsimd, eng(U::gpsimd, 2, 1), cat({red, nm_task}, cur_prev), 0, [=, &nm_ring] {
                isa::tensor_tensor(nm_ring.t(rows(pq), nl::ds(cur, 1)), nm_ring.t(rows(pq), nl::ds(prev_slot, 1)),
                                   nm_ring.t(rows(pq), nl::ds(mc, 1)), nl::minimum, isa::gpsimd_engine);
              });
              for (int64_t slot : {mc, cur, prev_slot}) nm_ring.use(slot, nmt);
              auto [al_, al_prev] = alpha_ring.take();
              al = al_;
              alpha = sch.add(U::scalar, eng(U::scalar, 1, 1), cat({nmt}, al_prev), 0, [=, &alpha_ring, &nm_ring] {
                isa::activation(alpha_ring.t(rows(pq), nl::ds(al, 1)), nl::exp, nm_ring.t(rows(pq), nl::ds(prev_slot, 1)),
                                {.bias = nm_ring.t(rows(pq), nl::ds(cur, 1)), .scale = -1.0});
              });
              alpha_ring.use(al, alpha);
              nm_ring.use(prev_slot, alpha);
              nm_ring.use(cur, alpha);
            }
            nm_task = nmt;
            nm_slot = nms;

            // exp, transposes of P, and P V, one PSUM bank of transposes at a time.
            auto [pr, pr_prev] = p_ar.take(cw);
            auto [pt, pt_prev] = pt_ar.take(ceil_div(cw, P));
            const int64_t group = tpb * P;
            int rescale = -1;
            if (!first) {
              rescale = sch.add(U::scalar, eng(U::scalar, double(D1), D1), {alpha, last_pv}, 0,
                                [=, &o_ring, &alpha_ring] {
                                  Tensor o = o_ring.t(rows(pq), os / per_bank, nl::ds((os % per_bank) * D1 + 0, D1));
                                  isa::activation(o, nl::copy, o, {.scale = alpha_ring.t(rows(pq), nl::ds(al, 1))});
                                });
              alpha_ring.use(al, rescale);
              o_ring.use(os, rescale);
            }
            for (int64_t off = 0; off < cw; off += group) {
              const int64_t w = std::min(group, cw - off);
              const int ex = sch.add(U::scalar, eng(U::scalar, double(w), w), cat(cat(sf_writes, {nmt}), pr_prev), 0,
                                     [=, &p_ar, &sf_ar, &nm_ring] {
                                       isa::activation(p_ar.t(rows(pq), nl::ds(pr + off, w)), nl::exp,
                                                       sf_ar.t(rows(pq), nl::ds(sf + off, w)),
                                                       {.bias = nm_ring.t(rows(pq), nl::ds(nms, 1))});
                                     });
              p_ar.use(pr, ex);
              sf_ar.use(sf, ex);
              nm_ring.use(nms, ex);
              const int64_t b0 = off / P, b1 = ceil_div(off + w, P);
              auto [tp, tp_prev] = t_ring.take();
              double tr_ns = 0;
              for (int64_t blk = b0; blk < b1; ++blk) tr_ns += sch.transpose(pq, std::min(P, cw - blk * P));
              tensor_ns += tr_ns;
              const int tr = sch.add(U::tensor, tr_ns, cat({ex}, tp_prev), 0, [=, &t_ring, &p_ar] {
                for (int64_t blk = b0; blk < b1; ++blk) {
                  const int64_t wk = std::min(P, cw - blk * P);
                  isa::nc_transpose(t_ring.t(rows(wk), tp, blk - b0, rows(pq)), p_ar.t(rows(pq), nl::ds(pr + blk * P, wk)));
                }
              });
              t_ring.use(tp, tr);
              p_ar.use(pr, tr);
              // The copy out of PSUM goes to whichever of the Vector (2x mode) and Scalar engines
              // finishes it first.
              const int64_t n = (b1 - b0) * pq;
              const int cp = sch.add_flexible(
                  {{U::vector, eng(U::vector, sch.vector_stream_cycles(n), n)}, {U::scalar, eng(U::scalar, double(n), n)}},
                  cat({tr}, pt_prev), 0, [=, &t_ring, &pt_ar](U unit) {
                    const bool on_scalar = unit == U::scalar;
                    const int64_t full = std::min(b1, cw / P) - b0;
                    if (full > 0)
                      flash_detail::copy(pt_ar.t(all, nl::ds(pt + b0, full), rows(pq)),
                                         t_ring.t(all, tp, nl::ds(0, full), rows(pq)), on_scalar);
                    if (b0 + full < b1) {
                      const int64_t wk = cw - (b1 - 1) * P;
                      flash_detail::copy(pt_ar.t(rows(wk), pt + b1 - 1, rows(pq)),
                                         t_ring.t(rows(wk), tp, b1 - 1 - b0, rows(pq)), on_scalar);
                    }
                  });
              t_ring.use(tp, cp);
              pt_ar.use(pt, cp);
              std::vector<int> deps = {cp, first && off == 0 ? -1 : last_pv, rescale};
              if (first && off == 0) deps = cat(deps, os_prev);
              for (int64_t blk = b0; blk < b1; ++blk) deps.push_back(v_ready[size_t(c0 / P + blk)]);
              deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
              double pv_ns = 0;
              for (int64_t blk = b0; blk < b1; ++blk) pv_ns += sch.matmul(pq, D1, wide);
              tensor_ns += pv_ns;
              last_pv = sch.add(U::tensor, pv_ns, deps, 0, [=, &o_ring, &pt_ar] {
                for (int64_t blk = b0; blk < b1; ++blk) {
                  const int64_t wk = std::min(P, cw - blk * P);
                  isa::nc_matmul(o_ring.t(rows(pq), os / per_bank, nl::ds((os % per_bank) * D1 + 0, D1)), pt_ar.t(rows(wk), pt + blk, rows(pq)),
                                 vx(rows(wk), c0 / P + blk, all), {.accumulate = !(first && blk == 0)});
                }
              });
              pt_ar.use(pt, last_pv);
              o_ring.use(os, last_pv);
            }

            if (!last) continue;
            // out = O / l and lse = log(l) - neg_max, from the column of ones.
            auto [si, si_prev] = stat_ring.take();
            auto [li, li_prev] = stat_ring.take();
            auto [ot, ot_prev] = otile_ring.take();
            // The two reads of the accumulator go to whichever of the Vector and Scalar engines
            // finishes them first.
            const Tensor o_acc = o_ring.t(rows(pq), os / per_bank, nl::ds((os % per_bank) * D1 + 0, D));
            const Tensor l_acc = o_ring.t(rows(pq), os / per_bank, nl::ds((os % per_bank) * D1 + D, 1));
            const Tensor recip = stat_ring.t(rows(pq), nl::ds(si, 1));
            const int rc = sch.add_flexible({{U::vector, eng(U::vector, 8, 1)}, {U::scalar, eng(U::scalar, 1, 1)}},
                                            cat({last_pv}, si_prev), 0, [=](U unit) {
                                              if (unit == U::scalar) isa::activation(recip, nl::reciprocal, l_acc);
                                              else isa::reciprocal(recip, l_acc);
                                            });
            const Tensor o_tile = otile_ring.t(rows(pq), ot, all);
            const int oc = sch.add_flexible(
                {{U::vector, eng(U::vector, sch.vector_stream_cycles(D), D)}, {U::scalar, eng(U::scalar, double(D), D)}},
                cat({rc}, ot_prev), 0, [=](U unit) {
                  if (unit == U::scalar) isa::activation(o_tile, nl::copy, o_acc, {.scale = recip});
                  else isa::tensor_scalar(o_tile, o_acc, nl::multiply, recip, {.engine = isa::vector_engine});
                });
            const int64_t out_need = need(tensor_ns);  // outputs wait for nothing: after the loads
            const int so = sch.add(U::dma, sch.dma(pq * D * ds, pq), {oc}, out_need, [=, &otile_ring] {
              isa::dma_copy(out(b, h, nl::ds(q0, pq), all), otile_ring.t(rows(pq), ot, all));
            });
            const int lg = sch.add(U::scalar, eng(U::scalar, 1, 1), cat({last_pv}, li_prev), 0,
                                   [=, &stat_ring, &o_ring] {
                                     isa::activation(stat_ring.t(rows(pq), nl::ds(li, 1)), nl::log, l_acc);
                                   });
            const int sb = sch.add(U::gpsimd, eng(U::gpsimd, 2, 1), {lg, nmt}, 0, [=, &stat_ring, &nm_ring] {
              Tensor t = stat_ring.t(rows(pq), nl::ds(li, 1));
              isa::tensor_tensor(t, t, nm_ring.t(rows(pq), nl::ds(nms, 1)), nl::subtract, isa::gpsimd_engine);
            });
            const int sl = sch.add(U::dma, sch.dma(pq * 4, pq), {sb}, out_need, [=, &stat_ring] {
              isa::dma_copy(lse(b, h, nl::ds(q0, pq)), stat_ring.t(rows(pq), nl::ds(li, 1)));
            });
            for (int t : {rc, oc}) stat_ring.use(si, t);
            for (int t : {lg, sb, sl}) stat_ring.use(li, t);
            for (int t : {rc, oc, lg}) o_ring.use(os, t);
            otile_ring.use(ot, oc);
            otile_ring.use(ot, so);
            nm_ring.use(nms, sb);
          }
        }
    }
  sch.run();
  return {out, lse};
}

inline constexpr const char* flash_attention_bwd_doc = R"(Backward of flash_attention (FlashAttention-2).

Dimensions: q [B, H, S, D], k, v [B, Hkv, Skv, D], out [B, H, S, D], lse [B, H, S],
            grad_out [B, H, S, D] -> grad_q [B, H, S, D], grad_k, grad_v [B, Hkv, Skv, D].
Args:       q, k, v, causal, scale: as given to the forward; out and lse: the forward's outputs;
            grad_out: the gradient of the loss with respect to out.
Returns:    grad_q, grad_k, grad_v in q's dtype. Grouped query attention sums grad_k and grad_v
            over the query heads that share a kv head. Keys no query sees (causal, Skv > S) get 0.
Notes:      Key groups of 512 (256 for float32) are the outer loop: their grad_k and grad_v
            accumulate in PSUM over every query tile, while grad_q accumulates in SBUF in float32
            (when all query tiles of a kv head do not fit in SBUF, they are processed in passes and
            grad_k / grad_v accumulate in SBUF across passes). P is recomputed from lse; dS is
            rounded to the input dtype for its three matmuls; everything accumulates in float32.
Pseudocode: p = exp(scale * q @ k.T - lse) (0 where masked); di = sum(grad_out * out, axis=-1)
            dp = grad_out @ v.T; ds = p * (dp - di)
            grad_v = p.T @ grad_out; grad_q = scale * ds @ k; grad_k = scale * ds.T @ q)";

/** @brief (grad_q, grad_k, grad_v) of flash_attention; see flash_attention_bwd_doc. */
inline std::vector<Tensor> flash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                               const Tensor& lse, const Tensor& dout, bool causal = false,
                                               std::optional<double> scale_opt = std::nullopt,
                                               Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using flash_detail::Arena;
  using flash_detail::Ring;
  using U = flash_detail::Unit;
  const ArgumentCheck check("flash_attention_bwd", q, loc);
  const nl::TileSize ts = nl::tile_size();
  const flash_detail::Dims d = flash_detail::check_qkv(check, q, k, v, ts.pmax);
  for (const Tensor* t : {&o, &dout})
    if (t->shape() != q.shape() || t->dtype() != q.dtype())
      check.fail(t->name() + " " + t->shape().str() + " " + std::string(dtype_name(t->dtype())) +
                 " must have q's shape and dtype " + q.shape().str() + " " + std::string(dtype_name(q.dtype())));
  if (lse.shape() != Shape{d.B, d.H, d.S} || lse.dtype() != DType::float32)
    check.fail("lse " + lse.shape().str() + " " + std::string(dtype_name(lse.dtype())) +
               " must be float32 [B, H, S] = " + Shape{d.B, d.H, d.S}.str());
  const int64_t P = ts.pmax, D = d.D, S = d.S, Skv = d.Skv;
  const DType dt = d.dtype;
  const int64_t ds = dtype_size(dt);
  const bool wide = dt == DType::float32;
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  const int64_t bank_bytes = ts.psum_bank_fmax_bytes, banks = ts.psum_num_banks;
  // Key groups: the scores and dP of a group fill one PSUM bank each.
  const int64_t Wg = std::min<int64_t>(ts.psum_bank_fmax, (bank_bytes / (P * ds)) / 2 * P);
  const int64_t nkg = Wg / P;
  const int64_t nkt = ceil_div(Skv, P), ngroups = ceil_div(Skv, Wg);

  Tensor dq = nl::ndarray({d.B, d.H, S, D}, dt, nl::shared_hbm, "grad_q");
  Tensor dk = nl::ndarray({d.B, d.Hkv, Skv, D}, dt, nl::shared_hbm, "grad_k");
  Tensor dv = nl::ndarray({d.B, d.Hkv, Skv, D}, dt, nl::shared_hbm, "grad_v");

  // --- PSUM: scores + dP (two slots), the grad_k / grad_v accumulators of a key group, dQ
  // partial products, and the rest for transposes.
  auto banks_of = [&](int64_t bytes) { return ceil_div(bytes, bank_bytes); };
  const int64_t sdp_banks = 2 * banks_of(2 * Wg * 4), acc_banks = banks_of(2 * nkg * D * 4), dq_banks = 1;
  const int64_t t_banks = banks - sdp_banks - acc_banks - dq_banks;
  internal_check(t_banks >= 1, "flash attention backward PSUM plan");
  const int64_t t_slot_bytes = nkg * P * ds;
  const int64_t n_t = t_banks * (bank_bytes / t_slot_bytes), n_dq = bank_bytes / (D * 4);
  Ring sdp_ring(nl::ndarray({P, 2, 2, banks_of(2 * Wg * 4) * bank_bytes / 8}, nl::float32, nl::psum, "scores_dp_psum"),
                2);
  Ring acc_ring(nl::ndarray({P, 2, nkg, D}, nl::float32, nl::psum, "grad_kv_psum"), 1);
  Ring dq_ring(nl::ndarray({P, n_dq, D}, nl::float32, nl::psum, "grad_q_psum"), n_dq);
  Ring t_ring(nl::ndarray({P, n_t, nkg, P}, dt, nl::psum, "transpose_psum"), n_t);

  // --- SBUF: per pass, the query side of its tiles stays resident; key groups and per-item
  // tiles rotate.
  constexpr int64_t kKv = 3, kRows = 4, kWork = 4;
  const int64_t sbuf = ts.sbuf_fmax_bytes;
  const int64_t per_tile = 2 * P * ds + 2 * D * ds + 2 * 4 + D * 4;  // Q^T|dO^T, Q, dO, stats, dQ sum
  const int64_t working = kKv * (nkg * D * ds + 2 * Wg * ds + nkg * 2 * D * ds) + kRows * (D * ds + D * 4) +
                          3 * kWork * Wg * ds + kWork * nkg * P * ds + 4 * D * ds + 2 * 2 * nkg * D * ds + 64;
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

  Ring kv_ring(nl::ndarray({P, kKv, nkg, D}, dt, nl::sbuf, "k_rows"), kKv);  // one slot index for the three
  Tensor kvT = nl::ndarray({D, kKv, 2, Wg}, dt, nl::sbuf, "kT_vT");
  Tensor v_rows = nl::ndarray({P, kKv, nkg, 2 * D}, dt, nl::sbuf, "v_rows");
  Ring orow_ring(nl::ndarray({P, kRows, D}, dt, nl::sbuf, "out_rows"), kRows);
  Ring prod_ring(nl::ndarray({P, kRows, D}, nl::float32, nl::sbuf, "out_dout"), kRows);
  Arena p_ar(nl::ndarray({P, kWork * Wg}, dt, nl::sbuf, "probs"), kWork * Wg);
  Arena dpm_ar(nl::ndarray({P, kWork * Wg}, dt, nl::sbuf, "dp_minus_di"), kWork * Wg);
  Arena ds_ar(nl::ndarray({P, kWork * Wg}, dt, nl::sbuf, "dscores"), kWork * Wg);
  Arena dst_ar(nl::ndarray({P, kWork * nkg, P}, dt, nl::sbuf, "dscores_T"), kWork * nkg);
  Ring dqo_ring(nl::ndarray({P, 4, D}, dt, nl::sbuf, "grad_q_tile"), 4);
  Ring kvo_ring(nl::ndarray({P, 4, 2, D}, dt, nl::sbuf, "grad_kv_tile"), 4);
  Tensor zero = nl::ndarray({P, 1}, nl::float32, nl::sbuf, "zero");

  const TargetConfig& target = KernelBuilder::current(std::source_location::current()).config();
  flash_detail::Scheduler sch(target);
  const auto all = nl::all;
  using flash_detail::cat;
  using flash_detail::rows;
  auto eng = [&](U u, double cycles, int64_t free) { return sch.engine(u, cycles, free); };
  auto copy_choices = [&](int64_t n) {  // a PSUM -> SBUF copy: Vector (2x mode) or Scalar
    return std::vector<std::pair<U, double>>{{U::vector, eng(U::vector, sch.vector_stream_cycles(n), n)},
                                             {U::scalar, eng(U::scalar, double(n), n)}};
  };
  const int zero_set = sch.add(U::gpsimd, eng(U::gpsimd, 1, 1), {}, 0, [=] { isa::memset(zero, 0.0, isa::gpsimd_engine); });

  // Rows of key tile t that some query sees (the rest get zero gradients).
  auto valid_rows = [&](int64_t t) {
    const int64_t wk = std::min(P, Skv - t * P);
    return causal ? std::clamp<int64_t>(S - t * P, 0, wk) : wk;
  };
  int64_t prio = 0;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t g = 0; g < d.Hkv; ++g) {
      struct QTile {
        int64_t h, q0, pq, slot;
        int last_group = -1;
        bool prepared = false;
        int qdoT = -1, qn = -1, don = -1, dq_last = -1;
        std::vector<int> stats;  // -lse and -Di written
        bool dq_started = false;
      };
      std::vector<QTile> tiles;
      for (int64_t h = g * d.G; h < (g + 1) * d.G; ++h)
        for (int64_t q0 = 0; q0 < S; q0 += P) {
          const int64_t pq = std::min(P, S - q0);
          const int64_t last_group = causal ? std::min(ngroups - 1, (q0 + pq - 1) / Wg) : ngroups - 1;
          tiles.push_back(QTile{h, q0, pq, 0, int(last_group)});
        }
      Tensor kacc, vacc;  // grad_k / grad_v sums across passes
      std::vector<bool> sum_ready(size_t(nkt), false);
      std::vector<int> sum_last(2 * size_t(nkt), -1);  // last task that wrote each sum tile
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
          qt.qn = sch.add(U::dma, sch.dma(pq * D * ds, pq), {}, prio, [=] {
            isa::dma_copy(qn(rows(pq), i, all), q(b, h, nl::ds(q0, pq), all));
          });
          qt.don = sch.add(U::dma, sch.dma(pq * D * ds, pq), {}, prio, [=] {
            isa::dma_copy(don(rows(pq), i, all), dout(b, h, nl::ds(q0, pq), all));
          });
          auto [orr, orr_prev] = orow_ring.take();
          const int od = sch.add(U::dma, sch.dma(pq * D * ds, pq), orr_prev, prio, [=, &orow_ring] {
            isa::dma_copy(orow_ring.t(rows(pq), orr, all), o(b, h, nl::ds(q0, pq), all));
          });
          orow_ring.use(orr, od);
          const int ld = sch.add(U::dma, sch.dma(pq * 4, pq), {}, prio, [=] {
            isa::dma_copy(stats(rows(pq), i, nl::ds(0, 1)), lse(b, h, nl::ds(q0, pq)));
          });
          const int nl_ = sch.add(U::gpsimd, eng(U::gpsimd, 2, 1), {ld, zero_set}, prio, [=] {
            Tensor t = stats(rows(pq), i, nl::ds(0, 1));
            isa::tensor_tensor(t, zero(rows(pq), all), t, nl::subtract, isa::gpsimd_engine);
          });
          auto [pr, pr_prev] = prod_ring.take();
          const int pd = sch.add(U::gpsimd, eng(U::gpsimd, 2.0 * double(D), D), cat({od, qt.don}, pr_prev), prio,
                                 [=, &prod_ring, &orow_ring] {
                                   isa::tensor_tensor(prod_ring.t(rows(pq), pr, all), don(rows(pq), i, all),
                                                      orow_ring.t(rows(pq), orr, all), nl::multiply, isa::gpsimd_engine);
                                 });
          orow_ring.use(orr, pd);
          prod_ring.use(pr, pd);
          const int di = sch.add(U::vector, eng(U::vector, double(D), D), {pd}, prio, [=, &prod_ring] {
            isa::tensor_reduce(stats(rows(pq), i, nl::ds(1, 1)), nl::add, prod_ring.t(rows(pq), pr, all), {1}, true);
          });
          prod_ring.use(pr, di);
          qt.stats = {nl_, di};
          auto [ts_, t_prev] = t_ring.take();
          const int tr = sch.add(U::tensor, 2 * sch.transpose(pq, D), cat({qt.qn, qt.don}, t_prev), prio,
                                 [=, &t_ring] {
                                   isa::nc_transpose(t_ring.t(rows(D), ts_, 0, rows(pq)), qn(rows(pq), i, all));
                                   isa::nc_transpose(t_ring.t(rows(D), ts_, 1, rows(pq)), don(rows(pq), i, all));
                                 });
          t_ring.use(ts_, tr);
          qt.qdoT = sch.add_flexible(copy_choices(2 * pq), {tr}, prio, [=, &t_ring](U u) {
            flash_detail::copy(qdoT(all, i, all, rows(pq)), t_ring.t(rows(D), ts_, nl::ds(0, 2), rows(pq)),
                               u == U::scalar);
          });
          t_ring.use(ts_, qt.qdoT);
          qt.prepared = true;
        };

        for (int64_t j = 0; j < ngroups; ++j) {
          const int64_t g0 = j * Wg, wg = std::min(Wg, Skv - g0), ntile = ceil_div(wg, P);
          std::vector<int64_t> visible;
          for (int64_t t = p0; t < p1; ++t)
            if (!causal || tiles[size_t(t)].q0 + tiles[size_t(t)].pq - 1 >= g0) visible.push_back(t);
          if (visible.empty()) continue;

          // Key group: K rows (the dQ matmul's moving operand), K^T and V^T.
          auto [kv, kv_prev] = kv_ring.take();
          std::vector<int> kdma, vdma;
          for (int64_t t = 0; t < ntile; ++t) {
            const int64_t wk = std::min(P, wg - t * P), r0 = g0 + t * P;
            const int dk_ = sch.add(U::dma, sch.dma(wk * D * ds, wk), kv_prev, prio, [=, &kv_ring] {
              isa::dma_copy(kv_ring.t(rows(wk), kv, t, all), k(b, g, nl::ds(r0, wk), all));
            });
            kv_ring.use(kv, dk_);
            kdma.push_back(dk_);
            const int dv_ = sch.add(U::dma, flash_detail::row_load_ns(sch, wk, D * ds), kv_prev, prio, [=] {
              flash_detail::load_rows(v_rows(all, kv, t, all), v(b, g, nl::ds(r0, wk), all));
            });
            kv_ring.use(kv, dv_);
            vdma.push_back(dv_);
          }
          auto [tk, tk_prev] = t_ring.take();
          double trk_ns = 0, trv_ns = 0;
          for (int64_t t = 0; t < ntile; ++t) {
            trk_ns += sch.transpose(std::min(P, wg - t * P), D);
            trv_ns += flash_detail::rows_transpose_ns(sch, std::min(P, wg - t * P), D);
          }
          const int trk = sch.add(U::tensor, trk_ns, cat(kdma, tk_prev), prio, [=, &t_ring, &kv_ring] {
            for (int64_t t = 0; t < ntile; ++t) {
              const int64_t wk = std::min(P, wg - t * P);
              isa::nc_transpose(t_ring.t(rows(D), tk, t, rows(wk)), kv_ring.t(rows(wk), kv, t, all));
            }
          });
          t_ring.use(tk, trk);
          kv_ring.use(kv, trk);
          const int ckt = sch.add_flexible(copy_choices(wg), {trk}, prio, [=, &t_ring](U u) {
            const int64_t full = wg / P;
            if (full > 0)
              flash_detail::copy(kvT(all, kv, 0, nl::ds(0, full * P)), t_ring.t(rows(D), tk, nl::ds(0, full), all),
                                 u == U::scalar);
            if (full < ntile)
              flash_detail::copy(kvT(all, kv, 0, nl::ds(full * P, wg - full * P)),
                                 t_ring.t(rows(D), tk, full, rows(wg - full * P)), u == U::scalar);
          });
          t_ring.use(tk, ckt);
          kv_ring.use(kv, ckt);
          auto [tv, tv_prev] = t_ring.take();
          const int trv = sch.add(U::tensor, trv_ns, cat(vdma, tv_prev), prio, [=, &t_ring] {
            for (int64_t t = 0; t < ntile; ++t)
              flash_detail::transpose_rows(t_ring.t(rows(D), tv, t, all), v_rows(all, kv, t, all),
                                           std::min(P, wg - t * P), D);
          });
          t_ring.use(tv, trv);
          kv_ring.use(kv, trv);
          const int cvt = sch.add(U::vector, eng(U::vector, sch.vector_stream_cycles(wg), wg), {trv}, prio, [=, &t_ring] {
            flash_detail::copy_transposed_rows(kvT(all, kv, 1, nl::ds(0, wg)), t_ring.t(rows(D), tv, all, all), ntile,
                                               wg - (ntile - 1) * P);
          });
          t_ring.use(tv, cvt);
          kv_ring.use(kv, cvt);

          // grad_k / grad_v of the group accumulate in PSUM over the pass's query tiles.
          auto [ac, ac_prev] = acc_ring.take();
          std::vector<bool> started(size_t(nkg), false);
          std::vector<int> last_acc(2 * size_t(nkg), -1);

          for (int64_t ti : visible) {
            QTile& qt = tiles[size_t(ti)];
            if (!qt.prepared) prepare(qt);
            const int64_t q0 = qt.q0, pq = qt.pq, i = qt.slot;
            const int64_t wkv = causal ? std::min(wg, q0 + pq - g0) : wg, nb = ceil_div(wkv, P);
            // Scores and dP = dO V^T.
            auto [sd, sd_prev] = sdp_ring.take();
            const int mm = sch.add(U::tensor, 2 * sch.matmul(pq, wkv, wide), cat({qt.qdoT, ckt, cvt}, sd_prev), prio,
                                   [=, &sdp_ring] {
                                     for (int64_t r = 0; r < 2; ++r)
                                       isa::nc_matmul(sdp_ring.t(rows(pq), sd, r, nl::ds(0, wkv)),
                                                      qdoT(all, i, r, rows(pq)), kvT(all, kv, r, nl::ds(0, wkv)),
                                                      {.accumulate = false});
                                   });
            sdp_ring.use(sd, mm);
            kv_ring.use(kv, mm);
            // P = exp(scale * s - lse), 0 after the diagonal.
            auto [pp, pp_prev] = p_ar.take(wkv);
            const int ex = sch.add(U::scalar, eng(U::scalar, double(wkv), wkv), cat(cat({mm}, qt.stats), pp_prev), prio,
                                   [=, &sdp_ring, &p_ar] {
                                     isa::activation(p_ar.t(rows(pq), nl::ds(pp, wkv)), nl::exp,
                                                     sdp_ring.t(rows(pq), sd, 0, nl::ds(0, wkv)),
                                                     {.bias = stats(rows(pq), i, nl::ds(0, 1)), .scale = scale});
                                   });
            sdp_ring.use(sd, ex);
            p_ar.use(pp, ex);
            int p_ready = ex;
            const int64_t lo = std::max(q0, g0), hi = g0 + wkv;
            if (causal && hi - 1 > q0) {
              p_ready = sch.add(U::gpsimd, eng(U::gpsimd, double(target.gpsimd_start_cycles + hi - lo), hi - lo), {ex},
                                prio, [=, &p_ar] {
                                  Tensor blk = p_ar.t(rows(pq), nl::ds(pp + lo - g0, hi - lo));
                                  isa::affine_select(blk, {{-1, hi - lo}}, 1, blk, 0.0, nl::greater_equal, q0 - lo);
                                });
              p_ar.use(pp, p_ready);
            }
            // dS = P * (dP - Di).
            auto [dm, dm_prev] = dpm_ar.take(wkv);
            const int dpm = sch.add_flexible(
                {{U::vector, eng(U::vector, sch.vector_stream_cycles(wkv), wkv)}, {U::scalar, eng(U::scalar, double(wkv), wkv)}},
                cat(cat({mm}, qt.stats), dm_prev), prio, [=, &sdp_ring, &dpm_ar](U u) {
                  isa::tensor_scalar(dpm_ar.t(rows(pq), nl::ds(dm, wkv)), sdp_ring.t(rows(pq), sd, 1, nl::ds(0, wkv)),
                                     nl::add, stats(rows(pq), i, nl::ds(1, 1)),
                                     {.engine = u == U::scalar ? isa::scalar_engine : isa::vector_engine});
                });
            sdp_ring.use(sd, dpm);
            dpm_ar.use(dm, dpm);
            auto [dsx, ds_prev] = ds_ar.take(wkv);
            const double fast = dt == DType::bfloat16 ? 1.0 : 2.0;
            const int dS = sch.add_flexible(
                {{U::gpsimd, eng(U::gpsimd, fast * double(wkv), wkv)},
                 {U::vector, eng(U::vector, fast * sch.vector_stream_cycles(wkv), wkv)}},
                cat({p_ready, dpm}, ds_prev), prio, [=, &p_ar, &dpm_ar, &ds_ar](U u) {
                  isa::tensor_tensor(ds_ar.t(rows(pq), nl::ds(dsx, wkv)), p_ar.t(rows(pq), nl::ds(pp, wkv)),
                                     dpm_ar.t(rows(pq), nl::ds(dm, wkv)), nl::multiply,
                                     u == U::gpsimd ? isa::gpsimd_engine : isa::vector_engine);
                });
            p_ar.use(pp, dS);
            dpm_ar.use(dm, dS);
            ds_ar.use(dsx, dS);
            // grad_v += P^T dO and grad_k += dS^T Q, per key tile.
            for (int64_t r = 0; r < 2; ++r) {
              std::vector<int> deps = {r == 0 ? p_ready : dS, r == 0 ? qt.don : qt.qn};
              for (int64_t t = 0; t < nb; ++t) {
                deps.push_back(last_acc[size_t(r * nkg + t)]);
                if (!started[size_t(t)]) deps = cat(deps, ac_prev);
              }
              std::vector<bool> fresh(static_cast<size_t>(nb), false);
              for (int64_t t = 0; t < nb; ++t) fresh[size_t(t)] = !started[size_t(t)];
              const int ga = sch.add(U::tensor, double(nb) * sch.matmul(P, D, wide), deps, prio,
                                     [=, &acc_ring, &p_ar, &ds_ar] {
                                       for (int64_t t = 0; t < nb; ++t) {
                                         const int64_t wk = std::min(P, wkv - t * P);
                                         const Tensor lhs = r == 0 ? p_ar.t(rows(pq), nl::ds(pp + t * P, wk))
                                                                   : ds_ar.t(rows(pq), nl::ds(dsx + t * P, wk));
                                         const Tensor rhs = r == 0 ? don(rows(pq), i, all) : qn(rows(pq), i, all);
                                         isa::nc_matmul(acc_ring.t(rows(wk), 1 - r, t, all), lhs, rhs,
                                                        {.accumulate = !fresh[size_t(t)]});
                                       }
                                     });
              acc_ring.use(ac, ga);
              (r == 0 ? p_ar : ds_ar).use(r == 0 ? pp : dsx, ga);
              for (int64_t t = 0; t < nb; ++t) last_acc[size_t(r * nkg + t)] = ga;
            }
            for (int64_t t = 0; t < nb; ++t) started[size_t(t)] = true;
            // grad_q += dS K (over this group's keys), via dS^T.
            auto [tt, tt_prev] = t_ring.take();
            double tr_ns = 0;
            for (int64_t t = 0; t < nb; ++t) tr_ns += sch.transpose(pq, std::min(P, wkv - t * P));
            const int trd = sch.add(U::tensor, tr_ns, cat({dS}, tt_prev), prio, [=, &t_ring, &ds_ar] {
              for (int64_t t = 0; t < nb; ++t) {
                const int64_t wk = std::min(P, wkv - t * P);
                isa::nc_transpose(t_ring.t(rows(wk), tt, t, rows(pq)), ds_ar.t(rows(pq), nl::ds(dsx + t * P, wk)));
              }
            });
            t_ring.use(tt, trd);
            ds_ar.use(dsx, trd);
            auto [dT, dT_prev] = dst_ar.take(nb);
            const int cdt = sch.add_flexible(copy_choices(nb * pq), cat({trd}, dT_prev), prio,
                                             [=, &t_ring, &dst_ar](U u) {
                                               const int64_t full = wkv / P;
                                               if (full > 0)
                                                 flash_detail::copy(dst_ar.t(all, nl::ds(dT, full), rows(pq)),
                                                                    t_ring.t(all, tt, nl::ds(0, full), rows(pq)),
                                                                    u == U::scalar);
                                               if (full < nb)
                                                 flash_detail::copy(dst_ar.t(rows(wkv - full * P), dT + full, rows(pq)),
                                                                    t_ring.t(rows(wkv - full * P), tt, full, rows(pq)),
                                                                    u == U::scalar);
                                             });
            t_ring.use(tt, cdt);
            dst_ar.use(dT, cdt);
            auto [qp, qp_prev] = dq_ring.take();
            const int dqm = sch.add(U::tensor, double(nb) * sch.matmul(pq, D, wide), cat({cdt}, qp_prev), prio,
                                    [=, &dq_ring, &dst_ar, &kv_ring] {
                                      for (int64_t t = 0; t < nb; ++t) {
                                        const int64_t wk = std::min(P, wkv - t * P);
                                        isa::nc_matmul(dq_ring.t(rows(pq), qp, all), dst_ar.t(rows(wk), dT + t, rows(pq)),
                                                       kv_ring.t(rows(wk), kv, t, all), {.accumulate = t > 0});
                                      }
                                    });
            dq_ring.use(qp, dqm);
            dst_ar.use(dT, dqm);
            kv_ring.use(kv, dqm);
            const bool first_dq = !qt.dq_started;
            qt.dq_started = true;
            const int dqa = first_dq
                                ? sch.add_flexible(copy_choices(D), {dqm}, prio,
                                                   [=, &dq_ring](U u) {
                                                     flash_detail::copy(dqacc(rows(pq), i, all),
                                                                        dq_ring.t(rows(pq), qp, all), u == U::scalar);
                                                   })
                                : sch.add(U::vector, eng(U::vector, double(D), D), {dqm, qt.dq_last}, prio,
                                          [=, &dq_ring] {
                                            isa::tensor_tensor(dqacc(rows(pq), i, all), dqacc(rows(pq), i, all),
                                                               dq_ring.t(rows(pq), qp, all), nl::add,
                                                               isa::vector_engine);
                                          });
            dq_ring.use(qp, dqa);
            qt.dq_last = dqa;
            if (j == qt.last_group) {  // grad_q of the tile is complete
              auto [qo, qo_prev] = dqo_ring.take();
              const int cv = sch.add(U::scalar, eng(U::scalar, double(D), D), cat({dqa}, qo_prev), prio,
                                     [=, &dqo_ring] {
                                       isa::activation(dqo_ring.t(rows(pq), qo, all), nl::copy, dqacc(rows(pq), i, all),
                                                       {.scale = scale});
                                     });
              const int st = sch.add(U::dma, sch.dma(pq * D * ds, pq), {cv}, prio, [=, &dqo_ring] {
                isa::dma_copy(dq(b, qt.h, nl::ds(q0, pq), all), dqo_ring.t(rows(pq), qo, all));
              });
              dqo_ring.use(qo, cv);
              dqo_ring.use(qo, st);
            }
            ++prio;
          }

          // End of the group: grad_k = scale * sum, grad_v = sum, or the pass's sums added to the
          // SBUF sums. Keys past the last query (causal, Skv > S) are in no item: those rows of
          // the sums were never written, and their gradients are 0.
          std::vector<int> acc_done;
          for (int x : last_acc)
            if (x >= 0) acc_done.push_back(x);
          for (int64_t t = 0; t < ntile; ++t) {
            if (!started[size_t(t)]) continue;
            const int64_t gt = g0 / P + t, wk = std::min(P, wg - t * P), rv = valid_rows(gt);
            touched[size_t(gt)] = true;
            if (n_passes == 1) {
              auto [ko, ko_prev] = kvo_ring.take();
              for (int64_t r = 0; r < 2; ++r) {  // r = 0: grad_k, 1: grad_v
                const int zf = rv < wk ? sch.add(U::gpsimd, eng(U::gpsimd, double(D), D), ko_prev, prio,
                                                 [=, &kvo_ring] {
                                                   isa::memset(kvo_ring.t(rows(wk), ko, r, all), 0.0, isa::gpsimd_engine);
                                                 })
                                       : -1;
                const int cv = sch.add_flexible(copy_choices(D), cat(cat(acc_done, ko_prev), {zf}), prio,
                                                [=, &acc_ring, &kvo_ring](U u) {
                                                  const Tensor dst = kvo_ring.t(rows(rv), ko, r, all);
                                                  const Tensor src = acc_ring.t(rows(rv), r, t, all);
                                                  if (u == U::scalar)
                                                    isa::activation(dst, nl::copy, src, {.scale = r == 0 ? scale : 1.0});
                                                  else
                                                    isa::tensor_scalar(dst, src, nl::multiply, r == 0 ? scale : 1.0,
                                                                       {.engine = isa::vector_engine});
                                                });
                acc_ring.use(ac, cv);
                kvo_ring.use(ko, cv);
                const int st = sch.add(U::dma, sch.dma(wk * D * ds, wk), {cv}, prio, [=, &kvo_ring] {
                  isa::dma_copy((r == 0 ? dk : dv)(b, g, nl::ds(gt * P, wk), all), kvo_ring.t(rows(wk), ko, r, all));
                });
                kvo_ring.use(ko, st);
              }
            } else {
              const bool init = !sum_ready[size_t(gt)];
              for (int64_t r = 0; r < 2; ++r) {
                const Tensor& sum = r == 0 ? kacc : vacc;
                const int add = sch.add(U::vector, eng(U::vector, double(D), D),
                                        cat(acc_done, {sum_last[size_t(2 * gt + r)]}), prio, [=, &acc_ring] {
                                          const Tensor dst = sum(rows(rv), gt, all);
                                          if (init) isa::tensor_copy(dst, acc_ring.t(rows(rv), r, t, all), isa::vector_engine);
                                          else
                                            isa::tensor_tensor(dst, dst, acc_ring.t(rows(rv), r, t, all), nl::add,
                                                               isa::vector_engine);
                                        });
                acc_ring.use(ac, add);
                sum_last[size_t(2 * gt + r)] = add;
              }
              sum_ready[size_t(gt)] = true;
            }
          }
        }
      }
      // Keys that no query sees, and with several passes the sums: write them out.
      for (int64_t gt = 0; gt < nkt; ++gt) {
        if (touched[size_t(gt)] && n_passes == 1) continue;
        const int64_t wk = std::min(P, Skv - gt * P), rv = touched[size_t(gt)] ? valid_rows(gt) : 0;
        auto [ko, ko_prev] = kvo_ring.take();
        for (int64_t r = 0; r < 2; ++r) {
          const int zf = rv < wk ? sch.add(U::gpsimd, eng(U::gpsimd, double(D), D), ko_prev, prio,
                                           [=, &kvo_ring] {
                                             isa::memset(kvo_ring.t(rows(wk), ko, r, all), 0.0, isa::gpsimd_engine);
                                           })
                                 : -1;
          const int cv = rv == 0 ? zf
                                 : sch.add(U::scalar, eng(U::scalar, double(D), D),
                                           cat(ko_prev, {zf, sum_last[size_t(2 * gt + r)]}), prio, [=, &kvo_ring] {
                                             isa::activation(kvo_ring.t(rows(rv), ko, r, all), nl::copy,
                                                             (r == 0 ? kacc : vacc)(rows(rv), gt, all),
                                                             {.scale = r == 0 ? scale : 1.0});
                                           });
          kvo_ring.use(ko, cv);
          const int st = sch.add(U::dma, sch.dma(wk * D * ds, wk), {cv}, prio, [=, &kvo_ring] {
            isa::dma_copy((r == 0 ? dk : dv)(b, g, nl::ds(gt * P, wk), all), kvo_ring.t(rows(wk), ko, r, all));
          });
          kvo_ring.use(ko, st);
        }
      }
    }
  sch.run();
  return {dq, dk, dv};
}

namespace flash_detail {
/** q, k, v specs of one attention problem. */
inline std::vector<TensorSpec> problem(int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t Skv, int64_t D, DType t) {
  return {spec({B, H, S, D}, t), spec({B, Hkv, Skv, D}, t), spec({B, Hkv, Skv, D}, t)};
}
}  // namespace flash_detail

inline KernelInfo flash_attention_info() {
  using flash_detail::problem;
  return KernelInfo{
      .name = "flash_attention",
      .summary = "scaled dot-product attention (causal, grouped query) with its logsumexp",
      .doc = flash_attention_doc,
      .inputs = {"q", "k", "v"},
      .outputs = {"out", "lse"},
      .params = {{"causal", ParamKind::boolean, 0, "mask keys after the query (top-left aligned)"},
                 {"scale", ParamKind::optional_real, 0, "score multiplier; default 1 / sqrt(head_dim)"}},
      .backward = "flash_attention_bwd",
      .saved_outputs = {"lse"},
      .body =
          [](const KernelCall& c) {
            return flash_attention(c.inputs[0], c.inputs[1], c.inputs[2], c.flag("causal"), c.optional_real("scale"));
          },
      .examples = {{problem(1, 2, 1, 200, 330, 64, DType::float32), {}, "grouped query heads, query and key tails"},
                   {problem(1, 1, 1, 330, 200, 128, DType::bfloat16), Params{{"causal", 1.0}},
                    "causal, fewer keys than queries"},
                   {problem(2, 2, 2, 1, 70, 64, DType::bfloat16), {}, "one query (decode shape)"},
                   {problem(1, 1, 1, 129, 129, 96, DType::float32), Params{{"causal", 1.0}, {"scale", 0.3}},
                    "odd head dim, explicit scale"}},
  };
}

inline KernelInfo flash_attention_bwd_info() {
  // Inputs q, k, v, out, lse, grad_out of one attention problem.
  auto problem = [](int64_t H, int64_t Hkv, int64_t S, int64_t Skv, int64_t D, DType t) {
    std::vector<TensorSpec> specs = flash_detail::problem(1, H, Hkv, S, Skv, D, t);
    specs.push_back(specs[0]);
    specs.push_back(spec({1, H, S}, DType::float32));
    specs.push_back(specs[0]);
    return specs;
  };
  return KernelInfo{
      .name = "flash_attention_bwd",
      .summary = "gradients of flash_attention with respect to q, k and v",
      .doc = flash_attention_bwd_doc,
      .inputs = {"q", "k", "v", "out", "lse", "grad_out"},
      .outputs = {"grad_q", "grad_k", "grad_v"},
      .params = {{"causal", ParamKind::boolean, 0, "mask keys after the query (top-left aligned)"},
                 {"scale", ParamKind::optional_real, 0, "score multiplier; default 1 / sqrt(head_dim)"}},
      .backward = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return flash_attention_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4], c.inputs[5],
                                       c.flag("causal"), c.optional_real("scale"));
          },
      .examples = {{problem(2, 1, 200, 330, 64, DType::float32), {}, "grouped query heads, tails"},
                   {problem(1, 1, 330, 200, 128, DType::bfloat16), Params{{"causal", 1.0}},
                    "causal, fewer keys than queries"},
                   {problem(1, 1, 129, 129, 96, DType::float32), Params{{"causal", 1.0}, {"scale", 0.3}},
                    "odd head dim, explicit scale"}},
  };
}

}  // namespace nikki::kernels
