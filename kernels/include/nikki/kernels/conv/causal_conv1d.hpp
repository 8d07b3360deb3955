// Depthwise causal conv1d (the short convolution of Mamba and Hyena blocks), with an optional
// fused SiLU and the previous tokens as an initial state (chunked prefill).
//
// Channels go on partitions and time along the free dim, as x [B, C, L] lies in memory, so every
// partition loads one contiguous run of a sequence. Each channel filters only itself, which is a
// sum over taps of diagonal matrices times shifted windows: the Tensor engine does it as K
// matmuls into one PSUM bank (stationary diag(w[:, k]), moving the window shifted by k), and
// ScalarE adds the bias and applies the SiLU while it moves the sums out of PSUM. One tap costs
// the Tensor engine one cycle per column at 2.4 GHz, so at K = 4 the kernel keeps pace with HBM
// (the element-wise engines would need ~2 cycles per tap and column at 0.96-1.2 GHz).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/conv/causal_conv1d_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* causal_conv1d_doc = R"(Depthwise causal conv1d (the Mamba / Hyena short convolution) with bias, state and optional SiLU.

Dimensions: x [B, C, L], weight [C, K], bias [C], initial_state [B, C, S] -> out [B, C, L];
            any B, C, L >= 1, 1 <= K <= 64, S >= 1.
Args:       x, weight, bias, initial_state: HBM tensors of one dtype, float32 / bfloat16 /
            float16 (zeros for no bias; zeros for no state, which is the zero padding).
            initial_state: the S tokens before x (chunked prefill); the last K - 1 are used,
            zeros before them when S < K - 1.
            silu: apply SiLU to the result.
Returns:    out, x's dtype.
Notes:      torch.nn.functional.conv1d(x, weight[:, None, :], bias, groups=C) on x left-padded
            with the state's last K - 1 tokens, then SiLU. Channels on partitions (tiles of 128
            channels per batch), time in column chunks of up to 4096 that reread the K - 1 tokens
            before them. Each 512-column piece is K TensorE matmuls accumulated in fp32 PSUM
            (stationary diag(weight[:, k]) in x's dtype, exact, moving the window shifted by k);
            ScalarE adds the bias and applies SiLU on the way out of PSUM, rounding once.
Pseudocode: z[b, c, t] = bias[c] + sum_k weight[c, k] * x[b, c, t - K + 1 + k]
            (x[b, c, t] for t < 0 is initial_state[b, c, S + t], zero before the state)
            out = silu(z) if silu else z)";

namespace conv {

/** The most taps of a depthwise causal conv1d: the short filters of Mamba and Hyena (K <= 8) with
 *  room to spare; K matmuls per piece and a [128, K, 128] stationary set per channel tile. */
inline constexpr int64_t kMaxCausalTaps = 64;
/** Columns of x per chunk in SBUF: long DMA runs (8 KiB of bf16 per partition). */
inline constexpr int64_t kMaxChunk = 4096;

/** The sizes of one causal conv1d call. */
struct CausalConvShape {
  int64_t B, C, L, K, S;
  int64_t history() const { return K - 1; }  // tokens each output looks back
};

inline std::string shape_dtype(const Tensor& t) { return t.shape().str() + " " + std::string(dtype_name(t.dtype())); }

inline CausalConvShape check_causal_conv1d(const ArgumentCheck& check, const Tensor& x, const Tensor& weight,
                                           const Tensor& bias, const Tensor& state) {
  const DType dt = x.dtype();
  check.require(x.ndim() == 3, "x must be 3-D [batch, channels, length], got " + x.shape().str(),
                "pass x as [B, C, L] (channels before time, as torch's conv1d takes it)");
  check.require(dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16,
                "x must be float32, bfloat16 or float16, got " + std::string(dtype_name(dt)));
  const int64_t B = x.shape()[0], C = x.shape()[1], L = x.shape()[2];
  check.require(weight.ndim() == 2 && weight.shape()[0] == C,
                "weight must be [channels, taps] with x's " + std::to_string(C) + " channels, got " +
                    weight.shape().str(),
                "pass the depthwise filter as [C, K] (torch's conv1d weight [C, 1, K] without its middle dim)");
  const int64_t K = weight.shape()[1];
  if (K > kMaxCausalTaps)
    check.fail("weight has " + std::to_string(K) + " taps, more than the limit",
               "at most " + std::to_string(kMaxCausalTaps) + " taps (K matmuls per piece and K diagonal tiles per "
               "128 channels)",
               "use a shorter filter, or the general conv1d with padding K - 1 for long ones");
  check.require(bias.shape() == Shape{C}, "bias must be [" + std::to_string(C) + "] (one per channel), got " +
                                               bias.shape().str(), "pass zeros for a convolution without bias");
  check.require(state.ndim() == 3 && state.shape()[0] == B && state.shape()[1] == C,
                "initial_state must be [" + std::to_string(B) + ", " + std::to_string(C) + ", S] (x's batch and "
                "channels), got " + state.shape().str(),
                "pass the tokens before x as [B, C, K - 1], or zeros for none");
  for (const Tensor* t : {&weight, &bias, &state})
    check.require(t->dtype() == dt, "'" + t->name() + "' must have x's dtype " + std::string(dtype_name(dt)) +
                                         ", got " + std::string(dtype_name(t->dtype())));
  return {B, C, L, K, state.shape()[2]};
}

/** A tile of channels [c0, c0 + p) and the diagonal stationaries of their taps. */
struct ChannelTile {
  int64_t c0, p;
};

inline std::vector<ChannelTile> channel_tiles(int64_t C, int64_t P) {
  std::vector<ChannelTile> tiles;
  for (int64_t c0 = 0; c0 < C; c0 += P) tiles.push_back({c0, std::min(P, C - c0)});
  return tiles;
}

/**
 * The maths shared by the forward and backward, an engine each: the diagonal stationaries of a
 * channel tile (identity times each tap's weight column) and the sum over taps on the Tensor
 * engine.
 */
struct DepthwiseTaps {
  /** identity[q, j] = (q == j), through an affine select over a tile of ones. */
  static void identity(const Tensor& eye, const Tensor& ones) {
    isa::memset(ones, 1.0, Engine::gpsimd);
    isa::affine_select(eye, {{-1, eye.shape()[1]}}, 1, ones, 0.0, nl::equal);
  }
  /** diag = identity * w (w: [p, 1] fp32, one weight per partition), on VectorE or ScalarE. */
  static void diagonal(const Tensor& diag, const Tensor& eye, const Tensor& w, Engine engine) {
    if (engine == Engine::scalar) isa::activation(diag, nl::copy, eye, {.scale = w});
    else isa::tensor_scalar(diag, eye, nl::multiply, w, {.engine = engine});
  }
  /** psum[:, j] = sum_k diag_k^T window[:, j + shift(k)]: one matmul per tap, accumulated. */
  template <class Shift>
  static void taps(const Tensor& psum, const Tensor& diags, const Tensor& window, int64_t j0, Shift&& shift) {
    const int64_t p = psum.shape()[0], n = psum.shape()[1], K = diags.shape()[1];
    for (int64_t k = 0; k < K; ++k)
      isa::nc_matmul(psum, diags(toolkit::first(p), k, toolkit::first(p)), window(nl::all, nl::ds(j0 + shift(k), n)),
                     {.accumulate = k > 0});
  }
};

/**
 * Records the loads that fill `dst` ([p, width]) with tokens t0 .. t0 + width - 1 of channels
 * [c0, c0 + p) of batch b of `x` [B, C, L]: the state's tokens for negative times (its last
 * column is t = -1), zeros before the state (or for every negative time without one) and from L on.
 */
inline void load_tokens(toolkit::TaskScheduler& sch, const Tensor& dst, const Tensor& x, const Tensor* state, int64_t b,
                        int64_t c0, int64_t t0) {
  const int64_t p = dst.shape()[0], width = dst.shape()[1];
  const int64_t L = x.shape()[2], S = state ? state->shape()[2] : 0, t1 = t0 + width;
  const auto span = [&](int64_t lo, int64_t hi) { return dst(nl::all, nl::ds(lo - t0, hi - lo)); };
  const Slice channels = nl::ds(c0, p);
  if (const int64_t hi = std::min(t1, -S); hi > t0) sch.add([&] { isa::memset(span(t0, hi), 0.0, Engine::gpsimd); });
  if (const int64_t lo = std::max(t0, -S), hi = std::min(t1, int64_t(0)); hi > lo)
    sch.add([&] { isa::dma_copy(span(lo, hi), (*state)(b, channels, nl::ds(S + lo, hi - lo))); });
  if (const int64_t lo = std::max(t0, int64_t(0)), hi = std::min(t1, L); hi > lo)
    sch.add([&] { isa::dma_copy(span(lo, hi), x(b, channels, nl::ds(lo, hi - lo))); });
  if (const int64_t lo = std::max(t0, L); t1 > lo) sch.add([&] { isa::memset(span(lo, t1), 0.0, Engine::gpsimd); });
}

/** The per-channel operands of a channel tile: weights and bias as fp32 columns, the diagonals. */
struct ChannelOperands {
  Tensor w, bias, diags;
};

/** Buffers for the per-channel operands of two channel tiles in flight. */
struct ChannelBuffers {
  toolkit::Ring w, bias, diags;
  Tensor ones, eye;

  ChannelBuffers(toolkit::Budget& budget, int64_t P, int64_t K, DType dt)
      : w(budget.sbuf_ring({P, K}, nl::float32, 2, "tap_weights")),
        bias(budget.sbuf_ring({P, 1}, nl::float32, 2, "bias_column")),
        diags(budget.sbuf_ring({P, K, P}, dt, 2, "tap_diagonals")),
        ones(budget.sbuf({P, P}, dt, "ones")),
        eye(budget.sbuf({P, P}, dt, "identity")) {}

  /** Records the identity (once per kernel). */
  void start(toolkit::TaskScheduler& sch) {
    sch.add([&] { DepthwiseTaps::identity(eye, ones); });
  }

  /** Records the loads of a channel tile's weights and bias and the construction of its diagonals. */
  ChannelOperands load(toolkit::TaskScheduler& sch, const ChannelTile& ct, const Tensor& weight,
                       const Tensor& bias_hbm) {
    using toolkit::first;
    const int64_t p = ct.p, K = weight.shape()[1];
    const ChannelOperands ops{w.next()(first(p), nl::all), bias.next()(first(p), nl::all), diags.next()};
    sch.add([&] { isa::dma_copy(ops.w, weight(nl::ds(ct.c0, p), nl::all)); });
    sch.add([&] { isa::dma_copy(ops.bias, bias_hbm(nl::ds(ct.c0, p)).reshape({p, 1})); });
    for (int64_t k = 0; k < K; ++k) {
      const Tensor d = ops.diags(first(p), k, first(p)), e = eye(first(p), first(p)), wk = ops.w(nl::all, nl::ds(k, 1));
      sch.add_any({[&] { DepthwiseTaps::diagonal(d, e, wk, Engine::vector); },
                   [&] { DepthwiseTaps::diagonal(d, e, wk, Engine::scalar); }});
    }
    return ops;
  }
};

}  // namespace conv

/** @brief out = silu?(causal depthwise conv1d of x); see causal_conv1d_doc. */
inline Tensor causal_conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& initial_state,
                            bool silu, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("causal_conv1d", x, loc);
  const conv::CausalConvShape s = conv::check_causal_conv1d(check, x, weight, bias, initial_state);
  const int64_t P = nl::tile_size().pmax, H = s.history(), piece = nl::tile_size().gemm_moving_fmax;
  const DType dt = x.dtype();
  Tensor out = nl::ndarray({s.B, s.C, s.L}, dt, nl::shared_hbm, "out");

  // Three windows and three output chunks in flight: one loading, one on the engines, one storing.
  constexpr int64_t kDepth = 3, kPsum = 4;
  toolkit::Budget budget(check);
  const int64_t W = std::min(s.L, conv::kMaxChunk);
  conv::ChannelBuffers channel(budget, P, s.K, dt);
  toolkit::Ring window_ring = budget.sbuf_ring({P, H + W}, dt, kDepth, "window");
  toolkit::Ring out_ring = budget.sbuf_ring({P, W}, dt, kDepth, "out_chunk");
  toolkit::Ring psum_ring = budget.psum_ring({P, piece}, nl::float32, kPsum, "taps_psum");

  toolkit::TaskScheduler sch;
  channel.start(sch);
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(s.L, W, piece);
  for (const conv::ChannelTile& ct : conv::channel_tiles(s.C, P)) {
    const int64_t p = ct.p;
    const conv::ChannelOperands ops = channel.load(sch, ct, weight, bias);
    for (int64_t b = 0; b < s.B; ++b)
      for (const toolkit::ColumnChunk& chunk : chunks) {
        const Tensor window = window_ring.next()(first(p), nl::ds(0, H + chunk.width));
        const Tensor o = out_ring.next()(first(p), nl::ds(0, chunk.width));
        conv::load_tokens(sch, window, x, &initial_state, b, ct.c0, chunk.c0 - H);
        for (int64_t j0 = 0; j0 < chunk.width; j0 += piece) {
          const int64_t n = std::min(piece, chunk.width - j0);
          const Tensor ps = psum_ring.next()(first(p), nl::ds(0, n));
          sch.add([&] { conv::DepthwiseTaps::taps(ps, ops.diags, window, j0, [](int64_t k) { return k; }); });
          sch.add([&] {
            isa::activation(o(nl::all, nl::ds(j0, n)), silu ? nl::silu : nl::copy, ps, {.bias = ops.bias});
          });
        }
        sch.add([&] { isa::dma_copy(out(b, nl::ds(ct.c0, p), nl::ds(chunk.c0, chunk.width)), o); });
      }
  }
  sch.run();
  return out;
}

namespace conv {

inline ExampleCase causal_case(int64_t B, int64_t C, int64_t L, int64_t K, int64_t S, DType dt, bool silu,
                               std::string label) {
  return ExampleCase{{spec({B, C, L}, dt), spec({C, K}, dt), spec({C}, dt), spec({B, C, S}, dt)},
                     {{"silu", silu ? 1.0 : 0.0}},
                     std::move(label)};
}

inline std::vector<ExampleCase> causal_examples() {
  return {causal_case(2, 130, 600, 4, 3, DType::bfloat16, true, "Mamba's K = 4 with SiLU: channel and length tails"),
          causal_case(1, 64, 100, 1, 1, DType::float32, false, "K = 1 (a per-channel scale), no activation"),
          causal_case(2, 20, 300, 64, 10, DType::float32, true, "K = 64 at its limit, a state shorter than K - 1"),
          causal_case(1, 4, 4500, 3, 2, DType::float32, false, "long rows: the history across column chunks"),
          causal_case(3, 5, 2, 5, 4, DType::float16, true, "fewer tokens than taps: mostly state"),
          causal_case(1, 256, 512, 8, 7, DType::bfloat16, false, "whole channel tiles and a whole piece")};
}

/** Mamba's short convolution at a realistic size: 4 sequences of 2048 tokens, 4096 channels. */
inline ExampleCase causal_benchmark() {
  return causal_case(4, 4096, 2048, 4, 3, DType::bfloat16, true, "B=4, C=4096, L=2048, K=4 bf16, SiLU");
}

/** A random problem: short filters mostly, sometimes up to the limit; states of any length. */
inline ExampleCase draw_causal_case(CaseRng& r) {
  const int64_t K = r.coin(0.8) ? r.uniform(1, 8) : r.uniform(9, kMaxCausalTaps);
  const int64_t S = r.coin() ? std::max<int64_t>(1, K - 1) : r.uniform(1, K + 2);
  const int64_t B = r.uniform(1, 3), C = r.size(1, 300), L = r.size(1, 1500, 512);
  return causal_case(B, C, L, K, S, r.pick({DType::float32, DType::bfloat16, DType::float16}), r.coin(), "drawn");
}

/** Sums of K products in fp32 PSUM, rounded once to the output dtype (16-bit outputs: the dtype's
 *  tolerance); K standard normal terms grow the sum like sqrt(K). */
inline Tolerance causal_tolerance(const ExampleCase& c) {
  const Tolerance t = dtype_tolerance(c.inputs[0].dtype);
  const double growth = std::max(1.0, std::sqrt(double(c.inputs[1].shape[1])) / 2);
  return {t.rtol, t.atol * growth};
}

}  // namespace conv

inline KernelInfo causal_conv1d_info() {
  return KernelInfo{
      .name = "causal_conv1d",
      .summary = "depthwise causal conv1d (Mamba / Hyena) with bias, initial state and optional SiLU",
      .doc = causal_conv1d_doc,
      .inputs = {"x", "weight", "bias", "initial_state"},
      .outputs = {"out"},
      .params = {{"silu", ParamKind::boolean, 0, "apply SiLU to the convolution"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "causal_conv1d_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{
                causal_conv1d(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.flag("silu"), Loc::current())};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::causal_conv1d(in[0], in[1], in[2], in[3], p.flag("silu"))};
          },
      .make_inputs = {},
      .examples = conv::causal_examples(),
      .draw = conv::draw_causal_case,
      .tolerance = conv::causal_tolerance,
      .benchmark = Benchmark{conv::causal_benchmark(), Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
