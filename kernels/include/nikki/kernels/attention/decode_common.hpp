// The maths and the schedule decode_attention (contiguous KV cache) and paged_decode_attention
// (KV cache in blocks) share: both attend a few new tokens per sequence to S cache positions and
// the new tokens themselves; they differ only in where a chunk of cache rows comes from and where
// the new rows go.
//
// Why the schedule looks the way it does (NeuronCore, trn2 cost model):
//
// - The lengths are runtime values: one compiled kernel serves every length. The kernels stream
//   the whole cache (S positions) of every kv head and mask the positions at or past the sequence's
//   length with an additive mask, built on chip from an iota of positions compared with the
//   loaded lengths (per batch row, a few Vector-engine instructions over [128, S / 128 x T]).
//   The cost: HBM traffic is the whole cache whatever the lengths (the roofline of a full cache);
//   a short sequence reads positions it does not use.
// - The new tokens' keys and values are taken from k and v directly (a last block of T keys with
//   the causal mask among the new tokens), so the cache reads never wait for the cache writes;
//   the writes (each kernel's own) are DMAs at runtime offsets, issued after the reads.
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
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/attention_common.hpp"
#include "nikki/kernels/attention/flash_attention.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"

namespace nikki::kernels::attention {

/** @brief The most new tokens per sequence decode_attention takes. */
inline constexpr int64_t kMaxDecodeTokens = 8;

/** @brief Sizes of one decode problem. */
struct DecodeDims {
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0, D = 0, G = 0;
  DType dtype = DType::float32;
  int64_t rows() const { return G * T; }  // query rows of one kv head
};

/**
 * @brief Checks the arguments both decode kernels share (the new tokens, GQA, sizes, dtypes,
 * lengths, sinks, window) once `d` holds B, H, Hkv, T, D and the dtype; sets d.G.
 */
inline void check_decode_common(const ArgumentCheck& check, DecodeDims& d, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& lengths,
                                const Tensor& sinks, int64_t window) {
  const int64_t pmax = nl::tile_size().pmax;
  const Shape new_kv{d.B, d.Hkv, d.T, d.D};
  if (k.shape() != new_kv || v.shape() != new_kv)
    check.fail("k " + k.shape().str() + " and v " + v.shape().str() + " must both be " + new_kv.str() +
               " (the new tokens' keys and values: q's B and T, the caches' Hkv and D)");
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
  const DType t = d.dtype;
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
  check_sinks(check, sinks, d.H, "pass -inf for heads without a sink (nikki.torch.decode_attention does when sinks is None)");
  if (window < 0) check.fail("window must be >= 0 (0: no sliding window), got " + std::to_string(window));
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


/** @brief 128-key blocks of one PSUM bank of K transposes (and of scores, G T columns each). */
inline int64_t decode_transpose_blocks(const DecodeDims& d) {
  const nl::TileSize ts = nl::tile_size();
  const int64_t transposes = ts.psum_bank_fmax_bytes / (ts.pmax * dtype_size(d.dtype));
  return std::max<int64_t>(1, std::min(transposes, ts.psum_bank_fmax / d.rows()));
}

/** @brief Most 128-key blocks of a chunk: K and V rows are loaded two banks of transposes at a
 *  time (16 rows per partition at D = 128 in bf16: 4 KiB, where a DMA's per-descriptor overhead
 *  is small). */
inline int64_t decode_load_blocks(const DecodeDims& d) { return 2 * decode_transpose_blocks(d); }

/** @brief How a decode kernel reads its cache. */
struct DecodeCacheReader {
  std::vector<KeyChunk> chunks;  // the cache's chunks (key c0 + n p + i in block i, partition p), then the new tokens'
  /** Emits the DMAs of chunk c's rows of `cache` (k_cache or v_cache) for sequence b and kv head
   *  g into dst [c.parts, c.n, D]. */
  std::function<void(const Tensor& dst, const Tensor& cache, int64_t b, int64_t g, const KeyChunk& c)> load;
};

/** @brief What the shared schedule leaves a decode kernel: its output and the lengths on chip. */
struct DecodeTiles {
  Tensor out;      // [B, H, T, D] in HBM
  Tensor lengths;  // int32 [P, B] in SBUF: lengths[b] on every partition
};

/**
 * @brief Records the tasks of decode attention (scores, masks, softmax with sinks, P V) for every
 * sequence and kv head on `sch`, reading the cache through `reader`; the caller adds the cache
 * writes and runs the scheduler.
 */
inline DecodeTiles schedule_decode(toolkit::TaskScheduler& sch, toolkit::Budget& budget, const DecodeDims& d,
                                   const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
                                   const Tensor& v, const Tensor& lengths, const Tensor& sinks,
                                   std::optional<double> scale_opt, int64_t window, const DecodeCacheReader& reader) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::Ring;
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, D = d.D, D1 = d.D + 1, T = d.T, G = d.G, R = d.rows(), B = d.B;
  const DType dt = d.dtype, f32 = nl::float32;
  const int64_t es = dtype_size(dt);
  const DecodeMath m{scale_opt.value_or(1.0 / std::sqrt(double(D)))};
  const int64_t nmax = decode_transpose_blocks(d), nload = decode_load_blocks(d);
  const std::vector<KeyChunk>& chunks = reader.chunks;
  const int64_t NS = chunks.back().s0 + 1, NSc = NS - 1;  // score slots: the cache's blocks, then the new one

  Tensor out = nl::ndarray({B, d.H, T, D}, dt, nl::shared_hbm, "out");

  // --- SBUF: a kv head's scores (fp32) and probabilities stay until its P V; K and V chunks,
  // K^T and the small tiles go through rings.
  constexpr int64_t kSf = 2, kPr = 2, kStage = 4, kV = 6, kKT = 3, kSmall = 2;
  budget.reserve_sbuf(kSf * NS * R * 4 + kPr * NS * R * es, "decode attention's scores of one kv head (S = " +
                                                                 std::to_string(d.S) + " cache positions)",
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

  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;

  // --- Once: lengths on every partition, positions, the new tokens' causal mask, ones.
  sch.add([&] { isa::dma_copy(lens_i, lengths.reshape({1, B}).broadcast(0, P)); });
  sch.add([&] { isa::tensor_copy(lens_f, lens_i, isa::vector_engine); });
  if (window > 0) sch.add([&] { isa::tensor_scalar(window_bound, lens_f, nl::subtract, double(window)); });
  sch.add([&] { isa::memset(ones, 1.0, isa::gpsimd_engine); });
  sch.add([&] { isa::memset(ones_column, 1.0, isa::gpsimd_engine); });
  sch.add([&] { isa::dma_copy(sink_rows.reshape_dim(1, {d.H, T}), sinks.reshape({1, d.H, 1}).broadcast(2, T)); });
  for (const KeyChunk& c : chunks) {
    if (c.fresh) continue;
    sch.add([&] { isa::iota(pos(all, nl::ds(c.s0, c.n), all), {{1, c.n}, {0, T}}, c.c0, c.n); });
    if (window > 0) sch.add([&] { isa::iota(pos_minus_t(all, nl::ds(c.s0, c.n), all), {{1, c.n}, {-1, T}}, c.c0, c.n); });
  }
  // New token p (partition) against new token t: masked when p > t, or p <= t - window.
  sch.add([&] { isa::iota(fresh_tmp, {{-1, T}}, 0, 1); });
  sch.add([&] { isa::tensor_scalar(fresh_mask, fresh_tmp, nl::greater, 0.0, {.op1 = nl::multiply, .operand1 = kMaskedScore}); });
  if (window > 0) {
    sch.add([&] { isa::tensor_scalar(fresh_tmp, fresh_tmp, nl::less_equal, double(-window), {.op1 = nl::multiply, .operand1 = kMaskedScore}); });
    sch.add([&] { m.combine_masks(fresh_mask, fresh_tmp); });
  }

  // The rows of a chunk into [parts, n, D]: from the cache, or the new tokens' from k or v.
  auto load_rows = [&](const Tensor& dst, const Tensor& cache, const Tensor& fresh, int64_t b, int64_t g,
                       const KeyChunk& c) {
    if (c.fresh) isa::dma_copy(dst, fresh(b, g).reshape_dim(0, {T, 1}));
    else reader.load(dst, cache, b, g, c);
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
      sch.add_any({[&] { copy_out(qT(first(D), all), q_psum(first(D), first(R)), vector); },
                   [&] { copy_out(qT(first(D), all), q_psum(first(D), first(R)), scalar); }});

      // Scores S^T [keys, G T], a chunk at a time: K rows -> K^T -> matmuls -> masked copy.
      const Tensor sf = sf_ring.next();
      for (const KeyChunk& c : chunks) {
        const Tensor stage = stage_ring.next();
        sch.add([&] { load_rows(stage(first(c.parts), nl::ds(0, c.n), all), k_cache, k, b, g, c); });
        // A partial block's missing keys: masked scores, so they weigh nothing in the softmax.
        if (c.parts < P) sch.add([&] { isa::memset(sf(all, nl::ds(c.s0 * R, c.n * R)), kMaskedScore, isa::gpsimd_engine); });
        // A PSUM bank of transposes at a time (nmax blocks of the chunk).
        for (int64_t i0 = 0; i0 < c.n; i0 += nmax) {
          const int64_t w = std::min(nmax, c.n - i0);
          const Tensor kt_psum = t_ring.next().reshape_dim(1, {nmax, P}), kT = kT_ring.next(), s = s_ring.next();
          sch.add([&] {
            for (int64_t i = 0; i < w; ++i)
              isa::nc_transpose(kt_psum(first(D), i, first(c.parts)), stage(first(c.parts), i0 + i, all));
          });
          const Tensor kT_w = kT(first(D), nl::ds(0, w), first(c.parts)), kt_w = kt_psum(first(D), nl::ds(0, w), first(c.parts));
          sch.add_any({[&] { copy_out(kT_w, kt_w, vector); }, [&] { copy_out(kT_w, kt_w, scalar); }});
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
      sch.add_any({[&] { copy_out(rowmax_all, bc, vector); }, [&] { copy_out(rowmax_all, bc, scalar); }});
      const Tensor max_blocks = rowmax_all.reshape_dim(1, {1, R}).broadcast(1, NS);
      sch.add_any({[&] { m.subtract_max(blocks, max_blocks, gpsimd); }, [&] { m.subtract_max(blocks, max_blocks, vector); }});
      const Tensor p = p_ring.next();
      sch.add([&] { m.probabilities(p, sf); });

      // P V, a chunk of V at a time, and the denominator.
      const Tensor acc = acc_ring.next()(first(R), all);
      for (const KeyChunk& c : chunks) {
        const Tensor vx = v_ring.next();
        sch.add([&] { load_rows(vx(first(c.parts), nl::ds(0, c.n), all), v_cache, v, b, g, c); });
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
      sch.add_any({[&] { ForwardMath::reciprocal(recip, denominator, vector); },
                   [&] { ForwardMath::reciprocal(recip, denominator, scalar); }});
      sch.add_any({[&] { ForwardMath::normalize(o_tile, numerator, recip, vector); },
                   [&] { ForwardMath::normalize(o_tile, numerator, recip, scalar); }});
      sch.add([&] { isa::dma_copy(out(b, nl::ds(g * G, G), all, all).reshape({R, D}), o_tile); });
    }
  }

  return {out, lens_i};
}

}  // namespace nikki::kernels::attention
