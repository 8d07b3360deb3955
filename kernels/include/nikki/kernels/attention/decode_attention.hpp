// Decode attention over a contiguous KV cache (token generation): a few new tokens per sequence
// attend to their sequence's cached keys and to each other, and their keys and values are written
// into the cache in place.
//
// Why the kernel looks the way it does (NeuronCore, trn2 cost model):
//
// - The lengths are runtime values: one compiled kernel serves every length. The kernel streams
//   the whole cache [S_max] of every kv head and masks the positions at or past the sequence's
//   length with an additive mask, built on chip from an iota of positions compared with the
//   loaded lengths (per batch row, a few Vector-engine instructions over [128, S_max / 128 x T]).
//   The cost: HBM traffic is the whole cache whatever the lengths (the roofline of a full cache);
//   a short sequence reads positions it does not use.
// - The new tokens' keys and values are taken from k and v directly (a last block of T keys with
//   the causal mask among the new tokens), so the cache reads never wait for the cache writes;
//   the writes are DMAs whose destination row is the length, a runtime offset read from the
//   loaded lengths (scalar_offset), issued at the end.
// - With T <= 8 new tokens, a kv head has only G x T query rows. Scores are therefore computed
//   transposed, keys on partitions: S^T [128 keys, G T] per key block = K^T-block as stationary
//   times Q^T as moving. Every engine instruction of the softmax then covers 128 partitions, and
//   S^T is directly the stationary operand of the P V matmul (no transpose of P). Keys need the
//   head dim on partitions: K blocks are transposed on the Tensor engine and copied out of PSUM.
// - K and V are loaded in chunks of up to 16 key blocks, partition p holding 16 consecutive rows
//   (4 KiB contiguous per partition at D = 128 in bf16, where a DMA's per-descriptor overhead is
//   small); block i of a chunk is then the keys c0 + 16 p + i, and the masks use the same
//   numbering. A chunk's K blocks are transposed a PSUM bank (8 blocks) at a time.
// - The softmax maximum of a query row spans partitions: a free-dim max over the key blocks, a
//   GpSimd partition reduce to [1, G T], and a ones-matmul broadcasts it back to 128 partitions.
//   The denominator is a free-dim sum of the (rounded) probabilities over the key blocks and a
//   matmul with a column of ones over the partitions; V stays contiguous in SBUF (a column of
//   ones beside it would make its DMA a descriptor per row).
// - Attention sinks (a logit per query head in the denominator): the sink row [1, G T] joins the
//   maximum, its exp is added to the denominator by a one-row matmul; -inf means no sink.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/attention_common.hpp"
#include "nikki/kernels/attention/decode_attention_reference.hpp"
#include "nikki/kernels/attention/flash_attention.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"

namespace nikki::kernels {

inline constexpr const char* decode_attention_doc = R"(Decode (token generation) attention over a contiguous KV cache, with the cache updated in place.

Dimensions: q [B, H, T, D], k_cache [B, Hkv, S, D], v_cache [B, Hkv, S, D], k [B, Hkv, T, D],
            v [B, Hkv, T, D], lengths [B], sinks [H] -> out [B, H, T, D]. T <= 8 new tokens per sequence;
            D <= 128; Hkv divides H (query head h reads kv head h / (H / Hkv)); G x T <= 128
            with G = H / Hkv; S up to what SBUF holds (a kv head's scores stay on chip: about
            S x G x T x 12 / 128 bytes per partition in bf16; S = 32k at G x T = 32).
Args:       q, k_cache, v_cache, k, v: HBM tensors of one dtype: float32, bfloat16 or float16.
            k, v: the new tokens' keys and values; written into the caches at positions
              lengths[b] .. lengths[b] + T - 1 of sequence b (in place).
            lengths: int32 [B], the number of cached positions of each sequence before this call
              (runtime values: one compiled kernel serves every length); lengths[b] + T <= S
              (a length outside 0 .. S - T is a KernelError of the cache write at run time).
            scale: multiplier of q k^T (default 1 / sqrt(D)).
            sinks: float32 [H], attention sinks (GPT-OSS): a learned logit per query head that
              joins the softmax denominator (weighs no value); -inf for none (nikki.torch's
              decode_attention passes -inf when sinks is None).
            window: a sliding window: new token t (position lengths[b] + t) sees positions j with
              lengths[b] + t - window < j <= lengths[b] + t. 0 (the default) for none.
Returns:    out in q's dtype; k_cache and v_cache are updated in place.
Notes:      Names and semantics after nki-library's attention_tkg (contiguous cache, keys not
            transposed). The kernel reads the whole cache of every kv head (S positions whatever
            the lengths) and masks positions at or past lengths[b]; cached entries past the length
            must be finite (a zero-initialized cache is), since their values meet zero
            probabilities in the P V matmul. Scores, the maximum, the sums and the output
            accumulate in float32; the probabilities are rounded to the input dtype for the P V
            matmul, and the denominator sums those rounded probabilities.
Pseudocode: k_cache[b, :, len_b : len_b + T] = k[b]; v_cache[b, :, len_b : len_b + T] = v[b]
            s = scale * q[b, h] @ k_cache[b, g, : len_b + T].T, masked to -inf where
              j > len_b + t (and j <= len_b + t - window)
            p = softmax([s, sinks[h]]) without its last column (the sink's)
            out[b, h] = p @ v_cache[b, g, : len_b + T])";

namespace attention {

/** @brief The most new tokens per sequence decode_attention takes. */
inline constexpr int64_t kMaxDecodeTokens = 8;

/** @brief Sizes of one decode problem. */
struct DecodeDims {
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0, D = 0, G = 0;
  DType dtype = DType::float32;
  int64_t rows() const { return G * T; }  // query rows of one kv head
};

/** @brief Checks the arguments of decode_attention and returns the problem's sizes. */
inline DecodeDims check_decode(const ArgumentCheck& check, const Tensor& q, const Tensor& k_cache,
                               const Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& lengths,
                               const Tensor& sinks, int64_t window) {
  const int64_t pmax = nl::tile_size().pmax;
  for (const Tensor* t : {&q, &k_cache, &v_cache, &k, &v})
    if (t->ndim() != 4)
      check.fail("q, k_cache, v_cache, k and v must be 4-D, got " + t->name() + " " + t->shape().str(),
                 "q is [B, H, T, D], the caches [B, Hkv, S, D], k and v [B, Hkv, T, D]");
  DecodeDims d;
  d.B = q.shape()[0];
  d.H = q.shape()[1];
  d.T = q.shape()[2];
  d.D = q.shape()[3];
  d.Hkv = k_cache.shape()[1];
  d.S = k_cache.shape()[2];
  d.dtype = q.dtype();
  if (k_cache.shape()[0] != d.B || k_cache.shape()[3] != d.D || v_cache.shape() != k_cache.shape())
    check.fail("k_cache " + k_cache.shape().str() + " and v_cache " + v_cache.shape().str() +
               " must both be [B, Hkv, S, D] with q's B and D (q is " + q.shape().str() + ")");
  const Shape new_kv{d.B, d.Hkv, d.T, d.D};
  if (k.shape() != new_kv || v.shape() != new_kv)
    check.fail("k " + k.shape().str() + " and v " + v.shape().str() + " must both be " + new_kv.str() +
               " (the new tokens' keys and values: the caches' B, Hkv and D, q's T)");
  if (d.H % d.Hkv != 0)
    check.fail("q has " + std::to_string(d.H) + " heads, which is not a multiple of the " + std::to_string(d.Hkv) +
                   " kv heads of the cache",
               "grouped query attention needs Hkv to divide H");
  d.G = d.H / d.Hkv;
  if (d.T > kMaxDecodeTokens)
    check.fail("q has T = " + std::to_string(d.T) + " new tokens per sequence",
               "decode_attention takes at most " + std::to_string(kMaxDecodeTokens) + " new tokens per call",
               "use flash_attention for prefill, or split the new tokens over several calls");
  if (d.D > pmax)
    check.fail("head dim " + std::to_string(d.D) + " is too large",
               "head_dim <= " + std::to_string(pmax) + ": the head dim is the contraction (partition) dim of Q K^T",
               "split the heads, or use head_dim 64 or 128");
  if (d.rows() > pmax)
    check.fail(std::to_string(d.G) + " query heads per kv head times T = " + std::to_string(d.T) +
                   " new tokens is " + std::to_string(d.rows()) + " query rows per kv head",
               "G x T <= " + std::to_string(pmax) + ": the query rows of a kv head are one matmul's columns",
               "decode fewer tokens per call");
  const DType t = q.dtype();
  if (t != DType::float32 && t != DType::bfloat16 && t != DType::float16)
    check.fail(std::string("dtype ") + std::string(dtype_name(t)) + " is not supported",
               "q, k_cache, v_cache, k and v are float32, bfloat16 or float16");
  for (const Tensor* x : {&k_cache, &v_cache, &k, &v})
    if (x->dtype() != t)
      check.fail("q, k_cache, v_cache, k and v must have one dtype, got q " + std::string(dtype_name(t)) + " and " +
                 x->name() + " " + std::string(dtype_name(x->dtype())));
  if (lengths.ndim() != 1 || lengths.shape()[0] != d.B || lengths.dtype() != DType::int32)
    check.fail("lengths must be int32 [" + std::to_string(d.B) + "] (one cache length per sequence), got " +
                   std::string(dtype_name(lengths.dtype())) + lengths.shape().str(),
               "lengths are runtime values the kernel loads as int32",
               "pass lengths.to(torch.int32) with one entry per sequence");
  if (sinks.ndim() != 1 || sinks.shape()[0] != d.H || sinks.dtype() != DType::float32)
    check.fail("sinks must be float32 [" + std::to_string(d.H) + "] (one logit per query head), got " +
                   std::string(dtype_name(sinks.dtype())) + sinks.shape().str(),
               "pass -inf for heads without a sink (nikki.torch.decode_attention does when sinks is None)");
  if (window < 0) check.fail("window must be >= 0 (0: no sliding window), got " + std::to_string(window));
  return d;
}

/** @brief A chunk of keys loaded at once: `parts` partitions of `n` consecutive keys each, from
 *  key c0 (key c0 + n p + i is block i's partition p); its blocks are the slots s0 .. s0 + n - 1
 *  of the scores. */
struct KeyChunk {
  int64_t c0 = 0, n = 1, parts = 0, s0 = 0;
  bool fresh = false;  // the new tokens' keys (from k and v), not the cache's
};

/** @brief The cache's chunks (up to `nmax` blocks of 128 keys, then a partial block), then the
 *  new tokens' block. */
inline std::vector<KeyChunk> decode_chunks(int64_t S, int64_t T, int64_t P, int64_t nmax) {
  std::vector<KeyChunk> chunks;
  int64_t c0 = 0, slot = 0;
  while (S - c0 >= P) {
    const int64_t n = std::min(nmax, (S - c0) / P);
    chunks.push_back({c0, n, P, slot, false});
    c0 += n * P;
    slot += n;
  }
  if (c0 < S) chunks.push_back({c0, 1, S - c0, slot++, false});
  chunks.push_back({0, 1, T, slot, true});
  return chunks;
}

/** @brief A masked score: it stays below any real score after scaling, and exp of it minus the
 *  maximum is 0. */
inline constexpr double kMaskedScore = -1.0e30;

/** The decode maths, an instruction group at a time (each call one task, on one engine). */
struct DecodeMath {
  double scale;

  /** mask = -1e30 where pos >= len (the cache past the sequence's length), else 0. */
  static void length_mask(const Tensor& mask, const Tensor& pos, const Tensor& len) {
    isa::tensor_scalar(mask, pos, nl::greater_equal, len, {.op1 = nl::multiply, .operand1 = kMaskedScore});
  }
  /** mask = -1e30 where pos - t <= bound (before the window), else 0. */
  static void window_mask(const Tensor& mask, const Tensor& pos_minus_t, const Tensor& bound) {
    isa::tensor_scalar(mask, pos_minus_t, nl::less_equal, bound, {.op1 = nl::multiply, .operand1 = kMaskedScore});
  }
  static void combine_masks(const Tensor& mask, const Tensor& other) {
    isa::tensor_tensor(mask, mask, other, nl::minimum, isa::vector_engine);
  }
  /** sf = scale * s + mask, out of PSUM. */
  void masked_scores(const Tensor& sf, const Tensor& s, const Tensor& mask) const {
    isa::scalar_tensor_tensor(sf, s, nl::multiply, scale, nl::add, mask);
  }
  /** colmax[p, r] = max over the key blocks of sf[p, block, r]. */
  static void block_max(const Tensor& colmax, const Tensor& sf_blocks) {
    isa::tensor_reduce(colmax, nl::maximum, sf_blocks.permute({0, 2, 1}), {2});
  }
  /** The row maximum across partitions, [1, rows]. */
  static void partition_max(const Tensor& rowmax, const Tensor& colmax) {
    isa::tensor_partition_reduce(rowmax, nl::maximum, colmax);
  }
  /** bc[p, r] = rowmax[r] on every partition: ones [1, P] as stationary. */
  static void broadcast(const Tensor& bc, const Tensor& ones, const Tensor& rowmax) {
    isa::nc_matmul(bc, ones, rowmax, {.accumulate = false});
  }
  /** sf -= the row maximum (broadcast over the blocks), on `engine` (GpSimd or Vector). */
  static void subtract_max(const Tensor& sf_blocks, const Tensor& max_blocks, Engine engine) {
    isa::tensor_tensor(sf_blocks, sf_blocks, max_blocks, nl::subtract, engine);
  }
  static void probabilities(const Tensor& p, const Tensor& sf) { isa::activation(p, nl::exp, sf); }
  /** The row maximum including the sink's logit (a -inf sink leaves it). */
  static void include_sink(const Tensor& rowmax, const Tensor& sink) {
    isa::tensor_tensor(rowmax, rowmax, sink, nl::maximum, isa::gpsimd_engine);
  }
  /** e = exp(sink - max), the sink's weight in the denominator (0 for a -inf sink). */
  static void sink_difference(const Tensor& e, const Tensor& sink, const Tensor& rowmax) {
    isa::tensor_tensor(e, sink, rowmax, nl::subtract, isa::gpsimd_engine);
  }
  static void sink_weight(const Tensor& e) { isa::activation(e, nl::exp, e); }
  /** denominator[r] += e[r]: e as stationary [1, rows], times one. */
  static void add_sink(const Tensor& den, const Tensor& e, const Tensor& one) {
    isa::nc_matmul(den, e, one, {.accumulate = true});
  }
  /** colsum[p, r] = sum over the key blocks of the rounded probabilities. */
  static void block_sum(const Tensor& colsum, const Tensor& p_blocks) {
    isa::tensor_reduce(colsum, nl::add, p_blocks.permute({0, 2, 1}), {2});
  }
  /** denominator[r] = sum over partitions of colsum[:, r]: colsum as stationary, ones as moving. */
  static void denominator(const Tensor& den, const Tensor& colsum, const Tensor& ones_column) {
    isa::nc_matmul(den, colsum, ones_column, {.accumulate = false});
  }
};

}  // namespace attention

/** @brief out of decode attention; k_cache and v_cache updated in place. See decode_attention_doc. */
inline Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
                               const Tensor& v, const Tensor& lengths, const Tensor& sinks,
                               std::optional<double> scale_opt = std::nullopt,
                               int64_t window = 0, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using attention::first;
  using toolkit::Ring;
  const ArgumentCheck check("decode_attention", q, loc);
  const attention::DecodeDims d = attention::check_decode(check, q, k_cache, v_cache, k, v, lengths, sinks, window);
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, D = d.D, D1 = d.D + 1, T = d.T, S = d.S, G = d.G, R = d.rows(), B = d.B;
  const DType dt = d.dtype, f32 = nl::float32;
  const int64_t es = dtype_size(dt);
  const attention::DecodeMath m{scale_opt.value_or(1.0 / std::sqrt(double(D)))};
  const int64_t bank = ts.psum_bank_fmax;                  // fp32 elements of one PSUM bank
  const int64_t tpb = ts.psum_bank_fmax_bytes / (P * es);  // transposed 128-blocks per bank
  const int64_t nmax = std::max<int64_t>(1, std::min(tpb, bank / R));
  // K and V rows are loaded two banks of transposes at a time: 16 rows per partition at D = 128
  // in bf16 (4 KiB, where a DMA's per-descriptor overhead is small).
  const int64_t nload = 2 * nmax;
  const std::vector<attention::KeyChunk> chunks = attention::decode_chunks(S, T, P, nload);
  const int64_t NS = chunks.back().s0 + 1, NSc = NS - 1;  // score slots: the cache's blocks, then the new one

  Tensor out = nl::ndarray({B, d.H, T, D}, dt, nl::shared_hbm, "out");

  // --- SBUF: a kv head's scores (fp32) and probabilities stay until its P V; K and V chunks,
  // K^T and the small tiles go through rings.
  constexpr int64_t kSf = 2, kPr = 2, kStage = 4, kV = 6, kKT = 3, kSmall = 2;
  toolkit::Budget budget(check);
  budget.reserve_sbuf(kSf * NS * R * 4 + kPr * NS * R * es, "decode attention's scores of one kv head (S = " +
                                                                 std::to_string(S) + " cache positions)",
                      "split the cache across calls, or use a shorter cache");
  Ring sf_ring = Ring::sbuf({P, NS * R}, f32, kSf, "scores");
  Ring p_ring = Ring::sbuf({P, NS * R}, dt, kPr, "probs");
  Ring stage_ring = budget.sbuf_ring({P, nload, D}, dt, kStage, "k_rows");
  Ring v_ring = budget.sbuf_ring({P, nload, D}, dt, kV, "v_rows");
  Ring kT_ring = budget.sbuf_ring({P, nmax, P}, dt, kKT, "kT");
  Ring qrow_ring = budget.sbuf_ring({P, D}, dt, kSmall, "q_rows");
  Ring qT_ring = budget.sbuf_ring({P, R}, dt, kSmall, "qT");
  Ring mask_ring = budget.sbuf_ring({P, NSc, T}, f32, kSmall, "mask");
  Ring wmask_ring = budget.sbuf_ring({P, NSc, T}, f32, kSmall, "window_mask");
  Ring colmax_ring = budget.sbuf_ring({P, R}, f32, kSmall, "block_max");
  Ring rowmax_ring = budget.sbuf_ring({P, R}, f32, 2 * kSmall, "row_max");
  Ring colsum_ring = budget.sbuf_ring({P, R}, f32, kSmall, "block_sum");
  Ring recip_ring = budget.sbuf_ring({P, 1}, f32, kSmall, "recip");
  Ring otile_ring = budget.sbuf_ring({P, D}, dt, kSmall, "out_tile");
  const Tensor pos = budget.sbuf({P, NSc, T}, f32, "positions");             // c0 + n p + i, over t
  const Tensor pos_minus_t = budget.sbuf({P, NSc, T}, f32, "positions_t");  // the same minus t
  const Tensor fresh_mask = budget.sbuf({P, T}, f32, "new_token_mask");
  const Tensor fresh_tmp = budget.sbuf({P, T}, f32, "new_token_window");
  const Tensor lens_i = budget.sbuf({P, B}, nl::int32, "lengths");
  const Tensor lens_f = budget.sbuf({P, B}, f32, "lengths_f");
  const Tensor window_bound = budget.sbuf({P, B}, f32, "window_bound");
  const Tensor ones = budget.sbuf({1, P}, f32, "ones");
  const Tensor ones_column = budget.sbuf({P, 1}, f32, "ones_column");
  const Tensor sink_rows = budget.sbuf({1, d.H * T}, f32, "sinks");  // sinks[h] at h T + t
  Ring sink_ring = budget.sbuf_ring({1, R}, f32, kSmall, "sink_weight");

  // --- PSUM: K^T (and Q^T) transposes, scores, the broadcast maximum, the output accumulators.
  Ring t_ring = budget.psum_ring({P, nmax * P}, dt, 3, "transpose_psum");
  Ring s_ring = budget.psum_ring({P, nmax * R}, f32, 2, "scores_psum");
  Ring bc_ring = budget.psum_ring({P, R}, f32, 2, "max_psum");
  Ring acc_ring = budget.psum_ring({P, D1}, f32, 2, "out_psum");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;

  // --- Once: lengths on every partition, positions, the new tokens' causal mask, ones.
  sch.add([&] { isa::dma_copy(lens_i, lengths.reshape({1, B}).broadcast(0, P)); });
  sch.add([&] { isa::tensor_copy(lens_f, lens_i, isa::vector_engine); });
  if (window > 0) sch.add([&] { isa::tensor_scalar(window_bound, lens_f, nl::subtract, double(window)); });
  sch.add([&] { isa::memset(ones, 1.0, isa::gpsimd_engine); });
  sch.add([&] { isa::memset(ones_column, 1.0, isa::gpsimd_engine); });
  sch.add([&] { isa::dma_copy(sink_rows.reshape_dim(1, {d.H, T}), sinks.reshape({1, d.H, 1}).broadcast(2, T)); });
  for (const attention::KeyChunk& c : chunks) {
    if (c.fresh) continue;
    sch.add([&] { isa::iota(pos(all, nl::ds(c.s0, c.n), all), {{1, c.n}, {0, T}}, c.c0, c.n); });
    if (window > 0) sch.add([&] { isa::iota(pos_minus_t(all, nl::ds(c.s0, c.n), all), {{1, c.n}, {-1, T}}, c.c0, c.n); });
  }
  // New token p (partition) against new token t: masked when p > t, or p <= t - window.
  sch.add([&] { isa::iota(fresh_tmp, {{-1, T}}, 0, 1); });
  sch.add([&] { isa::tensor_scalar(fresh_mask, fresh_tmp, nl::greater, 0.0, {.op1 = nl::multiply, .operand1 = attention::kMaskedScore}); });
  if (window > 0) {
    sch.add([&] { isa::tensor_scalar(fresh_tmp, fresh_tmp, nl::less_equal, double(-window), {.op1 = nl::multiply, .operand1 = attention::kMaskedScore}); });
    sch.add([&] { m.combine_masks(fresh_mask, fresh_tmp); });
  }

  // The rows of a chunk as [parts, n, D]: from the cache, or the new tokens' from k or v.
  auto chunk_rows = [&](const Tensor& cache, const Tensor& fresh, int64_t b, int64_t g, const attention::KeyChunk& c) {
    if (c.fresh) return fresh(b, g).reshape_dim(0, {T, 1});
    return cache(b, g, nl::ds(c.c0, c.parts * c.n), all).reshape_dim(0, {c.parts, c.n});
  };
  // [p, n, T] -> [p, n, G, T]: a mask shared by the G query heads of a kv head.
  auto over_heads = [&](const Tensor& mask3) { return mask3.reshape_dim(2, {1, T}).broadcast(2, G); };

  for (int64_t b = 0; b < B; ++b) {
    const Tensor mask = mask_ring.next();
    sch.add([&] { m.length_mask(mask, pos, lens_f(all, nl::ds(b, 1))); });
    if (window > 0) {
      const Tensor wmask = wmask_ring.next();
      sch.add([&] { m.window_mask(wmask, pos_minus_t, window_bound(all, nl::ds(b, 1))); });
      sch.add([&] { m.combine_masks(mask, wmask); });
    }
    for (int64_t g = 0; g < d.Hkv; ++g) {
      // Q rows of the kv head's G query heads -> Q^T [D, G T].
      const Tensor qrow = qrow_ring.next(), q_psum = t_ring.next(), qT = qT_ring.next();
      sch.add([&] { isa::dma_copy(qrow(first(R), all), q(b, nl::ds(g * G, G), all, all).reshape({R, D})); });
      sch.add([&] { isa::nc_transpose(q_psum(first(D), first(R)), qrow(first(R), all)); });
      sch.add_any({[&] { attention::copy_out(qT(first(D), all), q_psum(first(D), first(R)), vector); },
                   [&] { attention::copy_out(qT(first(D), all), q_psum(first(D), first(R)), scalar); }});

      // Scores S^T [keys, G T], a chunk at a time: K rows -> K^T -> matmuls -> masked copy.
      const Tensor sf = sf_ring.next();
      for (const attention::KeyChunk& c : chunks) {
        const Tensor stage = stage_ring.next();
        sch.add([&] { isa::dma_copy(stage(first(c.parts), nl::ds(0, c.n), all), chunk_rows(k_cache, k, b, g, c)); });
        // A partial block's missing keys: masked scores, so they weigh nothing in the softmax.
        if (c.parts < P) sch.add([&] { isa::memset(sf(all, nl::ds(c.s0 * R, c.n * R)), attention::kMaskedScore, isa::gpsimd_engine); });
        // A PSUM bank of transposes at a time (nmax blocks of the chunk).
        for (int64_t i0 = 0; i0 < c.n; i0 += nmax) {
          const int64_t w = std::min(nmax, c.n - i0);
          const Tensor kt_psum = t_ring.next().reshape_dim(1, {nmax, P}), kT = kT_ring.next(), s = s_ring.next();
          sch.add([&] {
            for (int64_t i = 0; i < w; ++i)
              isa::nc_transpose(kt_psum(first(D), i, first(c.parts)), stage(first(c.parts), i0 + i, all));
          });
          const Tensor kT_w = kT(first(D), nl::ds(0, w), first(c.parts)), kt_w = kt_psum(first(D), nl::ds(0, w), first(c.parts));
          sch.add_any({[&] { attention::copy_out(kT_w, kt_w, vector); }, [&] { attention::copy_out(kT_w, kt_w, scalar); }});
          sch.add([&] {
            for (int64_t i = 0; i < w; ++i)
              isa::nc_matmul(s(first(c.parts), nl::ds(i * R, R)), kT(first(D), i, first(c.parts)), qT(first(D), all),
                             {.accumulate = false});
          });
          const Tensor mask4 = c.fresh ? over_heads(fresh_mask(first(c.parts), all).reshape_dim(1, {1, T}))
                                       : over_heads(mask(first(c.parts), nl::ds(c.s0 + i0, w), all));
          sch.add([&] {
            m.masked_scores(sf(first(c.parts), nl::ds((c.s0 + i0) * R, w * R)).reshape_dim(1, {w, G, T}),
                            s(first(c.parts), nl::ds(0, w * R)).reshape_dim(1, {w, G, T}), mask4);
          });
        }
      }

      // Softmax over keys on partitions and blocks: the row maximum, exp.
      const Tensor blocks = sf.reshape_dim(1, {NS, R});
      const Tensor colmax = colmax_ring.next(), rowmax = rowmax_ring.next()(first(1), all), bc = bc_ring.next();
      sch.add([&] { m.block_max(colmax, blocks); });
      sch.add([&] { m.partition_max(rowmax, colmax); });
      const Tensor sink = sink_rows(all, nl::ds(g * R, R)), sink_e = sink_ring.next();
      sch.add([&] { m.include_sink(rowmax, sink); });
      sch.add([&] { m.sink_difference(sink_e, sink, rowmax); });
      sch.add([&] { m.sink_weight(sink_e); });
      sch.add([&] { m.broadcast(bc, ones, rowmax); });
      // The maximum to SBUF, so that GpSimd can subtract it (and no read of PSUM is too wide).
      const Tensor rowmax_all = rowmax_ring.next();
      sch.add_any({[&] { attention::copy_out(rowmax_all, bc, vector); }, [&] { attention::copy_out(rowmax_all, bc, scalar); }});
      const Tensor max_blocks = rowmax_all.reshape_dim(1, {1, R}).broadcast(1, NS);
      sch.add_any({[&] { m.subtract_max(blocks, max_blocks, gpsimd); }, [&] { m.subtract_max(blocks, max_blocks, vector); }});
      const Tensor p = p_ring.next();
      sch.add([&] { m.probabilities(p, sf); });

      // P V, a chunk of V at a time, and the denominator.
      const Tensor acc = acc_ring.next()(first(R), all);
      for (const attention::KeyChunk& c : chunks) {
        const Tensor vx = v_ring.next();
        sch.add([&] { isa::dma_copy(vx(first(c.parts), nl::ds(0, c.n), all), chunk_rows(v_cache, v, b, g, c)); });
        sch.add([&] {
          for (int64_t i = 0; i < c.n; ++i)
            isa::nc_matmul(acc(all, nl::ds(0, D)), p(first(c.parts), nl::ds((c.s0 + i) * R, R)), vx(first(c.parts), i, all),
                           {.accumulate = !(c.s0 == 0 && i == 0)});
        });
      }
      const Tensor colsum = colsum_ring.next();
      sch.add([&] { m.block_sum(colsum, p.reshape_dim(1, {NS, R})); });
      sch.add([&] { m.denominator(acc(all, nl::ds(D, 1)), colsum, ones_column); });
      sch.add([&] { m.add_sink(acc(all, nl::ds(D, 1)), sink_e, ones_column(first(1), all)); });
      const Tensor recip = recip_ring.next()(first(R), all), o_tile = otile_ring.next()(first(R), all);
      const Tensor numerator = acc(all, nl::ds(0, D)), denominator = acc(all, nl::ds(D, 1));
      sch.add_any({[&] { attention::ForwardMath::reciprocal(recip, denominator, vector); },
                   [&] { attention::ForwardMath::reciprocal(recip, denominator, scalar); }});
      sch.add_any({[&] { attention::ForwardMath::normalize(o_tile, numerator, recip, vector); },
                   [&] { attention::ForwardMath::normalize(o_tile, numerator, recip, scalar); }});
      sch.add([&] { isa::dma_copy(out(b, nl::ds(g * G, G), all, all).reshape({R, D}), o_tile); });
    }
  }

  // The new tokens into the caches, at the runtime row lengths[b] of every kv head of sequence b.
  for (int64_t b = 0; b < B; ++b)
    for (const auto& [cache, fresh] : {std::pair{&k_cache, &k}, std::pair{&v_cache, &v}}) {
      const Tensor row = cache->ap({{S * D, d.Hkv}, {D, T}, {1, D}},
                                   ApOptions{.offset = b * d.Hkv * S * D,
                                             .scalar_offset_tensor = lens_i(nl::ds(0, 1), nl::ds(b, 1)),
                                             .indirect_dim = 2});
      sch.add([&, row, fresh] { isa::dma_copy(row, (*fresh)(b)); });
    }
  sch.run();
  return out;
}

namespace attention {

/** @brief q, k_cache, v_cache, k, v, lengths, sinks specs of one decode problem. */
inline std::vector<TensorSpec> decode_problem(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S, int64_t D,
                                              DType t) {
  return {spec({B, H, T, D}, t),   spec({B, Hkv, S, D}, t), spec({B, Hkv, S, D}, t),
          spec({B, Hkv, T, D}, t), spec({B, Hkv, T, D}, t), spec({B}, DType::int32), spec({H}, DType::float32)};
}

/** @brief Standard normal q, caches and new tokens; lengths from 0 to S - T, with the first
 *  sequence at 0 and the last at S - T when B > 1 (the edges), the others random; a sink of
 *  twice a standard normal logit on about two heads in three, -inf (none) on the others. */
inline std::vector<RefTensor> decode_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in;
  for (size_t i = 0; i < 5; ++i) in.push_back(random_input(c.inputs[i], r));
  const int64_t B = c.inputs[0].shape[0], H = c.inputs[0].shape[1], T = c.inputs[0].shape[2], S = c.inputs[1].shape[2];
  RefTensor lengths(c.inputs[5].shape), sinks(c.inputs[6].shape);
  for (int64_t h = 0; h < H; ++h)
    sinks[h] = r.uniform(0, 2) == 0 ? -INFINITY : round_to(DType::float32, 2 * r.normal());
  for (int64_t b = 0; b < B; ++b) lengths[b] = double(r.uniform(0, S - T));
  if (B > 1) {
    lengths[0] = 0;
    lengths[B - 1] = double(S - T);
  }
  in.push_back(lengths);
  in.push_back(sinks);
  return in;
}

/** @brief A random decode problem: batches, grouped-query ratios, T, cache sizes with tails,
 *  head dims, a window, an explicit scale. */
inline ExampleCase draw_decode(CaseRng& r) {
  const int64_t B = r.uniform(1, 3), Hkv = r.uniform(1, 3), G = r.pick<int64_t>({1, 1, 2, 4});
  const int64_t T = r.pick<int64_t>({1, 1, 2, 3, 8});
  const int64_t S = std::max(T, r.size(1, 2500));
  const int64_t D = r.pick<int64_t>({32, 64, 64, 100, 128, 128});
  const DType t = r.pick({DType::float32, DType::bfloat16, DType::float16});
  ExampleCase c{decode_problem(B, G * Hkv, Hkv, T, S, D, t), {}, "drawn"};
  if (r.coin(0.3)) c.params.set("window", double(r.uniform(1, S)));
  if (r.coin(0.25)) c.params.set("scale", 0.02 + 0.5 * double(r.uniform(0, 100)) / 100.0);
  return c;
}

}  // namespace attention

inline KernelInfo decode_attention_info() {
  using attention::decode_problem;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "decode_attention",
      .summary = "decode attention over a KV cache with runtime lengths; writes the new keys and values in place",
      .doc = decode_attention_doc,
      .inputs = {"q", "k_cache", "v_cache", "k", "v", "lengths", "sinks"},
      .outputs = {"out"},
      .params = {{"scale", ParamKind::optional_real, 0, "score multiplier; default 1 / sqrt(head_dim)"},
                 {"window", ParamKind::integer, 0, "sliding window: token at i sees positions i - window < j <= i (0: none)"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16, DType::int32},
      .backward = "",
      .gradient = "not differentiable (inference: it updates the KV cache in place)",
      .saved_outputs = {},
      .updated_inputs = {"k_cache", "v_cache"},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{decode_attention(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3],
                                                        c.inputs[4], c.inputs[5], c.inputs[6], c.optional_real("scale"),
                                                        c.integer("window"))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::decode_attention(in[0], in[1], in[2], in[3], in[4], in[5], in[6], p.optional_real("scale"),
                                               p.integer("window"));
          },
      .make_inputs = attention::decode_inputs,
      .examples = {{decode_problem(3, 4, 2, 1, 300, 64, f32), {}, "one token, lengths 0, random and S - 1, GQA 2, tail block"},
                   {decode_problem(2, 2, 2, 4, 256, 128, bf16), {}, "four tokens, no GQA, whole blocks"},
                   {decode_problem(2, 8, 2, 3, 1600, 128, bf16), Params{{"window", 200.0}},
                    "window, GQA 4, a chunk of 12 blocks (two banks of transposes) and a tail"},
                   {decode_problem(1, 2, 1, 8, 40, 64, DType::float16), Params{{"scale", 0.3}, {"window", 3.0}},
                    "eight tokens, a cache shorter than a block, window shorter than T"},
                   {decode_problem(2, 3, 3, 2, 130, 32, f32), Params{{"window", 1.0}}, "window of one: each token sees itself"}},
      .draw = attention::draw_decode,
      .tolerance = {},
      .benchmark = Benchmark{ExampleCase{decode_problem(8, 32, 8, 1, 4096, 128, bf16), {},
                                         "B=8 H=32 Hkv=8 T=1 S=4096 D=128 bf16, full cache"},
                             Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
