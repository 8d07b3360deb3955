// Backward of the depthwise causal conv1d: the gradients of x, the taps, the bias and the initial
// state, through the fused SiLU.
//
// Same layout as the forward (channels on partitions, time in column chunks). With SiLU the
// pre-activation is recomputed (K matmuls, as in the forward) rather than saved, so the forward
// writes nothing but its output. grad_x is the same depthwise filter run backwards in time (K
// matmuls over grad's window shifted the other way); the tap and bias gradients are per-channel
// dot products along time, which no matmul does without wasting the PE array (a channel only
// meets itself), so they run on the element-wise engines: a product per tap and a row sum into
// fp32, spread over VectorE, GpSimd and ScalarE.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/conv/causal_conv1d.hpp"
#include "nikki/kernels/mlp/transposed_rows.hpp"

namespace nikki::kernels {

inline constexpr const char* causal_conv1d_bwd_doc = R"(Backward of causal_conv1d: gradients of x, weight, bias and initial_state, through the SiLU.

Dimensions: x [B, C, L], weight [C, K], bias [C], initial_state [B, C, S], grad_out [B, C, L]
            -> grad_x [B, C, L], grad_weight [C, K], grad_bias [C], grad_initial_state [B, C, S].
Args:       the forward's inputs and silu flag; grad_out: the gradient of the loss with respect to
            causal_conv1d's out, x's dtype.
Returns:    the four gradients, x's dtype (grad_initial_state is zero before its last K - 1 tokens).
Notes:      With SiLU, z is recomputed (K TensorE matmuls per 512 columns, as in the forward) and
            g = grad_out * silu'(z) is formed as ScalarE moves z out of PSUM (silu_dx with the bias)
            and rounded to x's dtype (as a 16-bit autograd would). grad_x[t] = sum_k weight[k] *
            g[t + K - 1 - k]: K TensorE matmuls over g's window (grad_initial_state is the same sum
            at the state's times). grad_weight[c, k] = sum over batch and time of g * x shifted by
            k - K + 1 and grad_bias[c] = sum of g: per-channel dot products, each product in x's
            dtype (VectorE or GpSimd) and its row sum in fp32 (VectorE and ScalarE's accumulator in
            turn), accumulated in fp32 over chunks and batches and rounded once.
Pseudocode: g = grad_out * silu'(z) if silu else grad_out          (z: the forward's pre-activation)
            grad_x[b, c, t] = sum_k weight[c, k] * g[b, c, t + K - 1 - k]   (g = 0 beyond L)
            grad_weight[c, k] = sum_{b, t} g[b, c, t] * x[b, c, t - K + 1 + k]  (x before 0: the state)
            grad_bias[c] = sum_{b, t} g[b, c, t]
            grad_initial_state[b, c, S + t] = grad_x's sum at time t < 0)";

namespace conv {

/** Columns per chunk of the backward: it keeps x's window, g's window and grad_x's chunk in flight. */
inline constexpr int64_t kMaxBackwardChunk = 2048;

/** The element-wise steps of the backward, an engine each. */
struct CausalConvGrad {
  /** slope = silu'(z + bias), as ScalarE moves z out of PSUM. */
  static void silu_slope(const Tensor& slope, const Tensor& z, const Tensor& bias) {
    isa::activation(slope, nl::silu_dx, z, {.bias = bias});
  }
  /** dst = a * b on VectorE or GpSimd, rounded to dst's dtype. */
  static void multiply(const Tensor& dst, const Tensor& a, const Tensor& b, Engine engine) {
    isa::tensor_tensor(dst, a, b, nl::multiply, engine);
  }
  /** sum = a + b on VectorE or GpSimd. */
  static void add(const Tensor& sum, const Tensor& a, const Tensor& b, Engine engine) {
    isa::tensor_tensor(sum, a, b, nl::add, engine);
  }
  /** col ([p, 1] fp32) = the row sums of data, on VectorE or in ScalarE's accumulator (whose
   *  element-wise output, an exact copy, goes to `scratch`). */
  static void row_sum(const Tensor& col, const Tensor& data, const Tensor& scratch, Engine engine) {
    if (engine == Engine::scalar) isa::activation_reduce(scratch, nl::copy, data, nl::add, col);
    else isa::tensor_reduce(col, nl::add, data, {1});
  }
};

}  // namespace conv

/** @brief (grad_x, grad_weight, grad_bias, grad_initial_state) of causal_conv1d; see causal_conv1d_bwd_doc. */
inline std::vector<Tensor> causal_conv1d_bwd(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                             const Tensor& initial_state, const Tensor& grad_out, bool silu,
                                             Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using conv::CausalConvGrad;
  using toolkit::first;
  const ArgumentCheck check("causal_conv1d_bwd", x, loc);
  const conv::CausalConvShape s = conv::check_causal_conv1d(check, x, weight, bias, initial_state);
  check.require(grad_out.shape() == x.shape() && grad_out.dtype() == x.dtype(),
                "grad_out must have x's shape and dtype " + conv::shape_dtype(x) + ", got " +
                    conv::shape_dtype(grad_out));
  const int64_t P = nl::tile_size().pmax, H = s.history(), K = s.K, piece = nl::tile_size().gemm_moving_fmax;
  const DType dt = x.dtype();
  const int64_t es = dtype_size(dt);
  std::vector<Tensor> outs{nl::ndarray({s.B, s.C, s.L}, dt, nl::shared_hbm, "grad_x"),
                           nl::ndarray({s.C, K}, dt, nl::shared_hbm, "grad_weight"),
                           nl::ndarray({s.C}, dt, nl::shared_hbm, "grad_bias"),
                           nl::ndarray({s.B, s.C, s.S}, dt, nl::shared_hbm, "grad_initial_state")};
  const Tensor &grad_x = outs[0], &grad_weight = outs[1], &grad_bias = outs[2], &grad_state = outs[3];

  // Three of each window in flight (loading, on the engines, storing), two tap products.
  constexpr int64_t kDepth = 3, kProducts = 2, kPsum = 4;
  toolkit::Budget budget(check);
  conv::ChannelBuffers channel(budget, P, K, dt);
  const int64_t fixed = kDepth * piece * es + 2 * kDepth * (K + 1) * 4;  // slopes, partial and running sums
  const int64_t W = std::min(s.L, *budget.largest({conv::kMaxBackwardChunk, 1024, 512}, [&](int64_t w) {
    return fixed + (3 * kDepth * (w + 2 * H) + kProducts * w) * es;
  }));
  toolkit::Ring x_ring = budget.sbuf_ring({P, W + 2 * H}, dt, kDepth, "x_window");
  toolkit::Ring g_ring = budget.sbuf_ring({P, W + 2 * H}, dt, kDepth, "grad_window");
  toolkit::Ring gx_ring = budget.sbuf_ring({P, W + H}, dt, kDepth, "grad_x_chunk");
  toolkit::Ring prod_ring = budget.sbuf_ring({P, W}, dt, kProducts, "tap_products");
  toolkit::Ring slope_ring = budget.sbuf_ring({P, piece}, dt, kDepth, "silu_slope");
  toolkit::Ring part_ring = budget.sbuf_ring({P, K + 1}, nl::float32, kDepth, "chunk_sums");
  toolkit::Ring acc_ring = budget.sbuf_ring({P, K + 1}, nl::float32, 2, "channel_sums");
  toolkit::Ring psum_ring = budget.psum_ring({P, piece}, nl::float32, kPsum, "taps_psum");
  // Zeros for the state's tokens before its last K - 1 (they reach no output).
  const int64_t unused_state = std::max<int64_t>(0, s.S - H), zero_width = std::min(unused_state, W);
  const Tensor zeros = zero_width > 0 ? budget.sbuf({P, zero_width}, dt, "zeros") : Tensor();

  toolkit::TaskScheduler sch;
  channel.start(sch);
  if (zero_width > 0) sch.add([&] { isa::memset(zeros, 0.0, Engine::gpsimd); });
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(s.L, W, piece);
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  for (const conv::ChannelTile& ct : conv::channel_tiles(s.C, P)) {
    const int64_t p = ct.p;
    const Slice channels = nl::ds(ct.c0, p);
    const conv::ChannelOperands ops = channel.load(sch, ct, weight, bias);
    const Tensor acc = acc_ring.next()(first(p), nl::all);
    sch.add([&] { isa::memset(acc, 0.0, Engine::gpsimd); });
    for (int64_t b = 0; b < s.B; ++b)
      for (const toolkit::ColumnChunk& chunk : chunks) {
        const int64_t c0 = chunk.c0, w = chunk.width;
        const int64_t E = c0 == 0 ? std::min(H, s.S) : 0;  // the state's times the first chunk also covers
        const int64_t g_end = std::min(c0 + w + H, s.L);   // g is zero from L on
        // x's tokens [c0 - H, c0 + w + H); g's [c0 - E, c0 + w + H), zero before 0 and from L.
        const Tensor xw = x_ring.next()(first(p), nl::ds(0, w + 2 * H));
        const Tensor gw = g_ring.next()(first(p), nl::ds(0, E + w + H));
        conv::load_tokens(sch, xw, x, &initial_state, b, ct.c0, c0 - H);
        conv::load_tokens(sch, gw, grad_out, nullptr, b, ct.c0, c0 - E);
        if (silu)
          for (int64_t j0 = 0; j0 < g_end - c0; j0 += piece) {
            const int64_t n = std::min(piece, g_end - c0 - j0);
            const Tensor ps = psum_ring.next()(first(p), nl::ds(0, n));
            const Tensor slope = slope_ring.next()(first(p), nl::ds(0, n));
            const Tensor g = gw(nl::all, nl::ds(E + j0, n));
            sch.add([&] { conv::DepthwiseTaps::taps(ps, ops.diags, xw, j0, [](int64_t k) { return k; }); });
            sch.add([&] { CausalConvGrad::silu_slope(slope, ps, ops.bias); });
            sch.add_any({[&] { CausalConvGrad::multiply(g, g, slope, vector); },
                         [&] { CausalConvGrad::multiply(g, g, slope, gpsimd); }});
          }
        // Per-channel sums of this chunk: g times each tap's shifted x, then g itself.
        const Tensor part = part_ring.next()(first(p), nl::all), g = gw(nl::all, nl::ds(E, w));
        for (int64_t k = 0; k <= K; ++k) {
          const Tensor prod = prod_ring.next()(first(p), nl::ds(0, w)), col = part(nl::all, nl::ds(k, 1));
          const Tensor summed = k < K ? prod : g;
          if (k < K) {
            const Tensor xk = xw(nl::all, nl::ds(k, w));
            sch.add_any({[&] { CausalConvGrad::multiply(prod, g, xk, vector); },
                         [&] { CausalConvGrad::multiply(prod, g, xk, gpsimd); }});
          }
          // The engines sum in different orders: a fixed engine per sum keeps the bits independent
          // of the schedule (alternating spreads them over VectorE and ScalarE).
          sch.add([&] { CausalConvGrad::row_sum(col, summed, prod, k % 2 == 0 ? vector : scalar); });
        }
        sch.add_any({[&] { CausalConvGrad::add(acc, acc, part, vector); },
                     [&] { CausalConvGrad::add(acc, acc, part, gpsimd); }});
        // grad_x over times [c0 - E, c0 + w): g's window read the other way.
        const Tensor gx = gx_ring.next()(first(p), nl::ds(0, E + w));
        for (int64_t j0 = 0; j0 < E + w; j0 += piece) {
          const int64_t n = std::min(piece, E + w - j0);
          const Tensor ps = psum_ring.next()(first(p), nl::ds(0, n)), dst = gx(nl::all, nl::ds(j0, n));
          sch.add([&] { conv::DepthwiseTaps::taps(ps, ops.diags, gw, j0, [H](int64_t k) { return H - k; }); });
          sch.add_any({[&] { mlp::copy_from_psum(dst, ps, vector); }, [&] { mlp::copy_from_psum(dst, ps, scalar); }});
        }
        sch.add([&] { isa::dma_copy(grad_x(b, channels, nl::ds(c0, w)), gx(nl::all, nl::ds(E, w))); });
        if (E > 0)
          sch.add([&] { isa::dma_copy(grad_state(b, channels, nl::ds(s.S - E, E)), gx(nl::all, nl::ds(0, E))); });
        if (c0 == 0)
          for (int64_t z0 = 0; z0 < unused_state; z0 += zero_width) {
            const int64_t zw = std::min(zero_width, unused_state - z0);
            sch.add([&] { isa::dma_copy(grad_state(b, channels, nl::ds(z0, zw)), zeros(first(p), nl::ds(0, zw))); });
          }
      }
    sch.add([&] { isa::dma_copy(grad_weight(channels, nl::all), acc(nl::all, nl::ds(0, K))); });
    sch.add([&] { isa::dma_copy(grad_bias(channels).reshape({p, 1}), acc(nl::all, nl::ds(K, 1))); });
  }
  sch.run();
  return outs;
}

namespace conv {

inline ExampleCase causal_bwd_case(ExampleCase forward) {
  const TensorSpec& x = forward.inputs[0];
  forward.inputs.push_back(spec(x.shape, x.dtype));
  return forward;
}

/** grad_weight and grad_bias sum B * L products, each rounded to x's dtype: errors grow like
 *  sqrt(B * L) roundings of one product (16-bit: 2^-9 relative each). */
inline Tolerance causal_bwd_tolerance(const ExampleCase& c) {
  const Tolerance t = causal_tolerance(c);
  const Shape& x = c.inputs[0].shape;
  return widened_for_sums(t, double(x[0] * x[2]), 2);
}

}  // namespace conv

inline KernelInfo causal_conv1d_bwd_info() {
  std::vector<ExampleCase> examples;
  for (const ExampleCase& c : conv::causal_examples()) examples.push_back(conv::causal_bwd_case(c));
  return KernelInfo{
      .name = "causal_conv1d_bwd",
      .summary = "gradients of causal_conv1d: x, weight, bias and initial_state, through the SiLU",
      .doc = causal_conv1d_bwd_doc,
      .inputs = {"x", "weight", "bias", "initial_state", "grad_out"},
      .outputs = {"grad_x", "grad_weight", "grad_bias", "grad_initial_state"},
      .params = {{"silu", ParamKind::boolean, 0, "the forward's silu flag"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return causal_conv1d_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4], c.flag("silu"),
                                     Loc::current());
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::causal_conv1d_bwd(in[0], in[1], in[2], in[3], in[4], p.flag("silu"));
          },
      .make_inputs = {},
      .examples = examples,
      .draw = [](CaseRng& r) { return conv::causal_bwd_case(conv::draw_causal_case(r)); },
      .tolerance = conv::causal_bwd_tolerance,
      .benchmark = Benchmark{conv::causal_bwd_case(conv::causal_benchmark()), Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
