// Decode attention over a contiguous KV cache (token generation): a few new tokens per sequence
// attend to their sequence's cached keys and to each other, and their keys and values are written
// into the cache in place.
//
// The schedule (decode_common.hpp) streams the whole cache [S] of every kv head; this kernel's
// part is the chunk loads (a partition holds n consecutive cache rows: 4 KiB contiguous at
// D = 128 in bf16) and the cache writes: DMAs whose destination row is the length, a runtime
// offset read from the loaded lengths (scalar_offset), issued after the reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/decode_attention_reference.hpp"
#include "nikki/kernels/attention/decode_common.hpp"

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

/** @brief Checks the arguments of decode_attention and returns the problem's sizes. */
inline DecodeDims check_decode(const ArgumentCheck& check, const Tensor& q, const Tensor& k_cache,
                               const Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& lengths,
                               const Tensor& sinks, int64_t window) {
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
  check_decode_common(check, d, k_cache, v_cache, k, v, lengths, sinks, window);
  return d;
}

}  // namespace attention

/** @brief out of decode attention; k_cache and v_cache updated in place. See decode_attention_doc. */
inline Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k,
                               const Tensor& v, const Tensor& lengths, const Tensor& sinks,
                               std::optional<double> scale_opt = std::nullopt,
                               int64_t window = 0, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const ArgumentCheck check("decode_attention", q, loc);
  const attention::DecodeDims d = attention::check_decode(check, q, k_cache, v_cache, k, v, lengths, sinks, window);
  const int64_t P = nl::tile_size().pmax, D = d.D, T = d.T, S = d.S;
  attention::DecodeCacheReader reader{
      attention::decode_chunks(S, T, P, attention::decode_load_blocks(d)),
      [&](const Tensor& dst, const Tensor& cache, int64_t b, int64_t g, const attention::KeyChunk& c) {
        isa::dma_copy(dst, cache(b, g, nl::ds(c.c0, c.parts * c.n), nl::all).reshape_dim(0, {c.parts, c.n}));
      }};
  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  const attention::DecodeTiles tiles =
      attention::schedule_decode(sch, budget, d, q, k_cache, v_cache, k, v, lengths, sinks, scale_opt, window, reader);

  // The new tokens into the caches, at the runtime row lengths[b] of every kv head of sequence b.
  for (int64_t b = 0; b < d.B; ++b)
    for (const auto& [cache, fresh] : {std::pair{&k_cache, &k}, std::pair{&v_cache, &v}}) {
      const Tensor row = cache->ap({{S * D, d.Hkv}, {D, T}, {1, D}},
                                   ApOptions{.offset = b * d.Hkv * S * D,
                                             .scalar_offset_tensor = tiles.lengths(nl::ds(0, 1), nl::ds(b, 1)),
                                             .indirect_dim = 2});
      sch.add([&, row, fresh] { isa::dma_copy(row, (*fresh)(b)); });
    }
  sch.run();
  return tiles.out;
}

namespace attention {

/** @brief The parameters of both decode kernels. */
inline std::vector<ParamSpec> decode_params() {
  return {{"scale", ParamKind::optional_real, 0, "score multiplier; default 1 / sqrt(head_dim)"},
          {"window", ParamKind::integer, 0, "sliding window: token at i sees positions i - window < j <= i (0: none)"}};
}

/** @brief The gradient note of both decode kernels. */
inline constexpr const char* kDecodeGradient = "not differentiable (inference: it updates the KV cache in place)";

/** @brief A drawn case's options of both decode kernels: a window up to S, an explicit scale. */
inline void draw_decode_options(ExampleCase& c, int64_t S, CaseRng& r) {
  if (r.coin(0.3)) c.params.set("window", double(r.uniform(1, S)));
  if (r.coin(0.25)) c.params.set("scale", 0.02 + 0.5 * double(r.uniform(0, 100)) / 100.0);
}

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
  RefTensor lengths(c.inputs[5].shape), sinks = random_sinks(H, r);
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
  draw_decode_options(c, S, r);
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
      .params = attention::decode_params(),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16, DType::int32},
      .backward = "",
      .gradient = attention::kDecodeGradient,
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
