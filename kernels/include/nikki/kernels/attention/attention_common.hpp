// What the attention kernels share: the problem's dimensions and argument checks, and the
// staging of row tiles that are transposed on chip.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "nikki/kernels/attention/attention_reference.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels::attention {

/** @brief Sizes of one attention problem: q [B, H, S, D], k and v [B, Hkv, Skv, D], G = H / Hkv. */
struct Dims {
  int64_t B = 0, H = 0, Hkv = 0, S = 0, Skv = 0, D = 0, G = 0;
  DType dtype = DType::float32;
};

/** @brief Checks q, k and v of an attention kernel and returns the problem's sizes. */
inline Dims check_qkv(const ArgumentCheck& check, const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t pmax = nl::tile_size().pmax;
  for (const Tensor* t : {&q, &k, &v})
    if (t->ndim() != 4)
      check.fail("q, k and v must be 4-D [batch, heads, seq, head_dim], got " + t->name() + " " + t->shape().str());
  Dims d;
  d.B = q.shape()[0];
  d.H = q.shape()[1];
  d.S = q.shape()[2];
  d.D = q.shape()[3];
  d.Hkv = k.shape()[1];
  d.Skv = k.shape()[2];
  d.dtype = q.dtype();
  if (k.shape()[0] != d.B || k.shape()[3] != d.D || v.shape() != k.shape())
    check.fail("k " + k.shape().str() + " and v " + v.shape().str() +
               " must both be [B, Hkv, Skv, D] with q's B and D (q is " + q.shape().str() + ")");
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

using toolkit::first;

/** @brief A PSUM -> SBUF copy on the Vector engine, or on the Scalar engine (as an activation:
 *  trn1's Scalar engine has no tensor_copy). */
inline void copy_out(const Tensor& dst, const Tensor& src, Engine engine) {
  if (engine == Engine::scalar) isa::activation(dst, nl::copy, src);
  else isa::tensor_copy(dst, src, isa::vector_engine);
}

/*
 * Row tiles that get transposed on chip (Q, K, dO, V) are loaded two rows per partition: a DMA
 * descriptor per 2 * D contiguous elements instead of per row (a third less DMA time at D = 128),
 * and the two [64, D] transposes cost what one [128, D] transpose costs. Partition p, half r holds
 * row 2p + r; the copy out of PSUM puts the columns back in row order. A partial tile (n < 128
 * rows) uses one row per partition.
 */

/** @brief Loads rows [n, D] of HBM into `stage` ([P, 2 * D]). */
inline void load_rows(const Tensor& stage, const Tensor& src) {
  const int64_t n = src.shape()[0], D = src.shape()[1], P = stage.shape()[0];
  if (n == P) isa::dma_copy(stage(nl::ds(0, P / 2), nl::all), src.reshape({P / 2, 2 * D}));
  else isa::dma_copy(stage(nl::ds(0, n), nl::ds(0, D)), src);
}

/** @brief Transposes staged rows into `dst` ([D, P] in PSUM; columns in the staged order). */
inline void transpose_rows(const Tensor& dst, const Tensor& stage, int64_t n, int64_t D) {
  const int64_t P = stage.shape()[0];
  if (n == P) {
    for (int64_t r = 0; r < 2; ++r)
      isa::nc_transpose(dst(nl::ds(0, D), nl::ds(r * P / 2, P / 2)), stage(nl::ds(0, P / 2), nl::ds(r * D, D)));
  } else {
    isa::nc_transpose(dst(nl::ds(0, D), nl::ds(0, n)), stage(nl::ds(0, n), nl::ds(0, D)));
  }
}

/** @brief Copies `tiles` transposed staged tiles ([D, tiles, P] in PSUM) to row order in `dst`
 *  ([D, columns]); the last tile has `last` rows. */
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

/**
 * @brief Causal mask of one block of scores: entry (i, j) of `block` (rows at key positions q0..,
 * keys lo..) keeps its value when key lo + j <= position q0 + i, and becomes `masked` otherwise.
 */
inline void mask_after_diagonal(const Tensor& block, int64_t q0, int64_t lo, double masked) {
  const int64_t w = block.shape()[1];
  isa::affine_select(block, {{-1, w}}, 1, block, masked, nl::greater_equal, q0 - lo);
}

/**
 * @brief Sliding-window mask of one block of scores: entry (i, j) of `block` (rows at key
 * positions q0.., keys lo..) keeps its value when key lo + j > position q0 + i - window, and
 * becomes `masked` otherwise.
 */
inline void mask_before_window(const Tensor& block, int64_t q0, int64_t lo, int64_t window, double masked) {
  const int64_t w = block.shape()[1];
  isa::affine_select(block, {{1, w}}, -1, block, masked, nl::greater_equal, window - 1 - q0 + lo);
}

using reference::AttentionOptions;

/** @brief The smallest soft-cap taken: below it every capped score is within 1e-6 of 0, and the
 *  masked scores (-1e30 / softcap before the cap's scale) would leave fp32. */
inline constexpr double kMinSoftcap = 1e-6;
/** @brief The largest soft-cap taken (twice it must stay an fp32 number). */
inline constexpr double kMaxSoftcap = 1e30;

/**
 * @brief Checks flash attention's options (the forward's and the backward's) against the problem
 * and returns them, causal when a window implies it: window >= 0; 0 <= prefix <= Skv, and a
 * prefix needs a mask to offset; with a window, a key per query after the prefix (every query
 * then sees one); softcap 0 or in [1e-6, 1e30].
 */
inline AttentionOptions check_options(const ArgumentCheck& check, const Dims& d, bool causal, int64_t window,
                                      int64_t prefix, double softcap) {
  if (window < 0) check.fail("window must be >= 0 (0: no sliding window), got " + std::to_string(window));
  if (prefix < 0) check.fail("prefix_len must be >= 0 (0: no cached prefix), got " + std::to_string(prefix));
  if (prefix > d.Skv)
    check.fail("prefix_len = " + std::to_string(prefix) + " is longer than the Skv = " + std::to_string(d.Skv) + " keys",
               "the first prefix_len rows of k and v are the cached prefix, the rest the active keys",
               "pass k and v with the prefix's rows first, then those of the S queries");
  if (prefix > 0 && !causal && window == 0)
    check.fail("prefix_len = " + std::to_string(prefix) + " offsets the causal mask, but the call is not causal",
               "without a mask every query sees every key, so a prefix changes nothing",
               "pass causal=True (query i then sees keys j <= i + prefix_len), or prefix_len=0");
  if (window > 0 && d.Skv < prefix + d.S)
    check.fail(prefix == 0 ? "a sliding window needs at least as many keys as queries, got S = " + std::to_string(d.S) +
                                 " queries and Skv = " + std::to_string(d.Skv) + " keys"
                           : "a sliding window needs a key per query after the prefix, got prefix_len = " +
                                 std::to_string(prefix) + ", S = " + std::to_string(d.S) + " queries and Skv = " +
                                 std::to_string(d.Skv) + " keys",
               "with a window, query i sees keys i + prefix_len - window < j <= i + prefix_len: Skv >= prefix_len + S, "
               "or queries past the last key would see none",
               "pad the keys, or drop the window for this call");
  if (!(softcap == 0 || (softcap >= kMinSoftcap && softcap <= kMaxSoftcap)))
    check.fail("softcap must be 0 (no soft-capping) or a number in [1e-06, 1e+30], got " + fmt::format("{}", softcap),
               "scores s become softcap * tanh(s / softcap); Gemma 2 uses 50");
  return {causal || window > 0, window, prefix, softcap};
}

/** @brief Checks attention sinks: float32 [H], one logit per query head (-inf: none). `limit`
 *  says how a caller passes no sink. */
inline void check_sinks(const ArgumentCheck& check, const Tensor& sinks, int64_t H, const std::string& limit) {
  if (sinks.ndim() != 1 || sinks.shape()[0] != H || sinks.dtype() != DType::float32)
    check.fail("sinks must be float32 [" + std::to_string(H) + "] (one logit per query head), got " +
                   std::string(dtype_name(sinks.dtype())) + sinks.shape().str(),
               limit);
}

/** @brief Sinks [H]: twice a standard normal logit on about two heads in three, -inf (none) on
 *  the others. */
inline RefTensor random_sinks(int64_t H, CaseRng& r) {
  RefTensor sinks(Shape{H});
  for (int64_t h = 0; h < H; ++h)
    sinks[h] = r.uniform(0, 2) == 0 ? -INFINITY : round_to(DType::float32, 2 * r.normal());
  return sinks;
}

}  // namespace nikki::kernels::attention
