// General conv1d (torch.nn.functional.conv1d: stride, padding, dilation, groups) with bias and a
// fused SiLU or GELU, on the Tensor engine as a sum over taps of matmuls.
//
// Input channels go on partitions (the contraction), time along the free dim. For each tap k the
// transposed weights W[:, :, k]^T [C_in, C_out] are a stationary, and the moving operand is the
// input window shifted by k * dilation and read every stride-th column; the taps and the 128-channel
// tiles of C_in accumulate in one PSUM bank per 512 outputs, and ScalarE adds the bias and applies
// the activation on the way out. The weights are transposed once per block of output channels
// (TensorE transposes) and stay in SBUF while every batch and column chunk streams past them.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/conv/causal_conv1d.hpp"
#include "nikki/kernels/conv/conv1d_reference.hpp"
#include "nikki/kernels/mlp/transposed_rows.hpp"

namespace nikki::kernels {

inline constexpr const char* conv1d_doc = R"(conv1d (torch.nn.functional.conv1d) with stride, padding, dilation, groups, bias and a fused SiLU or GELU.

Dimensions: x [B, C_in, L], weight [C_out, C_in / groups, K], bias [C_out] -> out [B, C_out, L_out],
            L_out = (L + 2 * padding - dilation * (K - 1) - 1) / stride + 1 >= 1; 1 <= K <= 64.
Args:       x, weight, bias: HBM tensors of one dtype, float32 / bfloat16 / float16 (zeros for no
            bias). stride, dilation >= 1; padding >= 0 zeros on both ends; groups divides C_in and
            C_out. activation: 0 none, 1 SiLU, 2 GELU (erf form, torch's default).
Returns:    out, x's dtype.
Notes:      For each group, C_in on partitions in tiles of 128: out[:, piece] = sum over input
            tiles and taps of W_k^T @ x[:, window shifted by k * dilation, every stride-th column],
            TensorE matmuls accumulated in one fp32 PSUM bank per 512 outputs and output tile of
            128 channels; ScalarE adds the bias and applies the activation as it moves the sums
            out, rounding once. The weights of a block of output tiles are transposed once
            (TensorE) and stay in SBUF; the input is read once per block. Small C_in / groups
            (depthwise) use few PE rows: correct but slow, causal_conv1d is the depthwise kernel.
            The transposed weights of one output tile take C_in / groups * K elements per
            partition, twice: beyond ~37000 (bf16; half that in fp32) SBUF is too small and the
            call fails with a KernelError. conv1d_bwd is its backward.
Pseudocode: out[b, o, t] = act(bias[o] + sum_{i, k} weight[o, i, k] * x_pad[b, g(o) * C_in / groups + i,
                                                                     t * stride + k * dilation])
            (x_pad: x with `padding` zeros on both ends; g(o) = o / (C_out / groups)))";

namespace conv {

/** Taps of the general conv1d: the moving window spans (K - 1) * dilation + 1 columns per piece. */
inline constexpr int64_t kMaxConvTaps = 64;

/** The sizes of one conv1d call. */
struct Conv1dShape {
  int64_t B, Cin, L, Cout, K, cig, cog, Lout;
};

inline Conv1dShape check_conv1d(const ArgumentCheck& check, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const reference::Conv1dGeometry& g, int64_t activation) {
  const DType dt = x.dtype();
  check.require(x.ndim() == 3, "x must be 3-D [batch, channels, length], got " + x.shape().str());
  check.require(dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16,
                "x must be float32, bfloat16 or float16, got " + std::string(dtype_name(dt)));
  const int64_t B = x.shape()[0], Cin = x.shape()[1], L = x.shape()[2];
  check.require(weight.ndim() == 3, "weight must be 3-D [C_out, C_in / groups, K], got " + weight.shape().str());
  const int64_t Cout = weight.shape()[0], K = weight.shape()[2];
  check.require(g.groups >= 1, "groups must be at least 1, got " + std::to_string(g.groups));
  if (Cin % g.groups != 0 || Cout % g.groups != 0)
    check.fail("groups = " + std::to_string(g.groups) + " does not divide x's " + std::to_string(Cin) +
                   " input channels and weight's " + std::to_string(Cout) + " output channels",
               "each group convolves C_in / groups inputs into C_out / groups outputs",
               "use a number of groups that divides both channel counts");
  check.require(weight.shape()[1] * g.groups == Cin,
                "weight must be [C_out, C_in / groups, K] = [" + std::to_string(Cout) + ", " +
                    std::to_string(Cin / g.groups) + ", K] for x's " + std::to_string(Cin) + " channels and groups = " +
                    std::to_string(g.groups) + ", got " + weight.shape().str());
  if (K > kMaxConvTaps)
    check.fail("weight has " + std::to_string(K) + " taps, more than the limit",
               "at most " + std::to_string(kMaxConvTaps) + " taps", "split a longer filter into several convolutions");
  check.require(g.stride >= 1 && g.dilation >= 1 && g.padding >= 0,
                "stride and dilation must be at least 1 and padding at least 0, got stride = " +
                    std::to_string(g.stride) + ", dilation = " + std::to_string(g.dilation) + ", padding = " +
                    std::to_string(g.padding));
  const int64_t Lout = g.out_length(L, K);
  check.require(L + 2 * g.padding >= g.dilation * (K - 1) + 1,
                "the dilated filter spans " + std::to_string(g.dilation * (K - 1) + 1) +
                    " columns, more than the padded input's " + std::to_string(L + 2 * g.padding),
                "pad the input or use a shorter filter");
  check.require(bias.shape() == Shape{Cout},
                "bias must be [" + std::to_string(Cout) + "] (one per output channel), got " + bias.shape().str(),
                "pass zeros for a convolution without bias");
  for (const Tensor* t : {&weight, &bias})
    check.require(t->dtype() == dt, "'" + t->name() + "' must have x's dtype " + std::string(dtype_name(dt)) +
                                         ", got " + std::string(dtype_name(t->dtype())));
  check.require(activation >= 0 && activation <= 2,
                "activation must be 0 (none), 1 (SiLU) or 2 (GELU), got " + std::to_string(activation));
  return {B, Cin, L, Cout, K, Cin / g.groups, Cout / g.groups, Lout};
}

inline nl::Op conv_activation(int64_t activation) {
  return activation == 1 ? nl::silu : activation == 2 ? nl::gelu : nl::copy;
}

/** A block of output-channel tiles of one group: tiles [first_tile, first_tile + tiles) of a
 *  partition's worth of channels each. */
struct OutputBlock {
  int64_t group, first_tile, tiles;
  /** The first output channel of the block's tile j. */
  int64_t first_channel(const Conv1dShape& s, int64_t j) const {
    return group * s.cog + (first_tile + j) * nl::tile_size().pmax;
  }
  /** The channels of tile j (a whole tile, or the group's tail). */
  int64_t rows(const Conv1dShape& s, int64_t j) const {
    return std::min(nl::tile_size().pmax, s.cog - (first_tile + j) * nl::tile_size().pmax);
  }
};

/** Input channels of a group's tile i (a whole tile, or the tail). */
inline int64_t input_rows(const Conv1dShape& s, int64_t i) {
  return std::min(nl::tile_size().pmax, s.cig - i * nl::tile_size().pmax);
}

/**
 * Records the transposition of a block's weights into wT ([128, input tiles, K, block columns]:
 * W[:, :, k]^T with input channels on partitions, one TensorE transpose per input tile, tap and
 * output tile, each copied out on VectorE or ScalarE) and the load of its biases as fp32 columns
 * (bias_cols [128, block tiles]).
 */
inline void transpose_weights(toolkit::TaskScheduler& sch, toolkit::Ring& raw_ring, toolkit::Ring& transposes,
                              const Tensor& wT, const Tensor& bias_cols, const Tensor& weight, const Tensor& bias,
                              const Conv1dShape& s, const OutputBlock& block) {
  using toolkit::first;
  const int64_t P = wT.shape()[0], nci = wT.shape()[1];
  for (int64_t j = 0; j < block.tiles; ++j) {
    const int64_t co0 = block.first_channel(s, j), pco = block.rows(s, j);
    sch.add([&] { isa::dma_copy(bias_cols(first(pco), nl::ds(j, 1)), bias(nl::ds(co0, pco)).reshape({pco, 1})); });
    for (int64_t i = 0; i < nci; ++i) {
      const int64_t pci = input_rows(s, i);
      const Tensor raw = raw_ring.next()(first(pco), first(pci), nl::all);
      sch.add([&] { isa::dma_copy(raw, weight(nl::ds(co0, pco), nl::ds(i * P, pci), nl::all)); });
      for (int64_t k = 0; k < s.K; ++k) {
        const Tensor tp = transposes.next()(first(pci), first(pco));
        const Tensor dst = wT(first(pci), i, k, nl::ds(j * P, pco));
        sch.add([&] { isa::nc_transpose(tp, raw(nl::all, nl::all, k), Engine::tensor); });
        sch.add_any({[&] { mlp::copy_from_psum(dst, tp, Engine::vector); },
                     [&] { mlp::copy_from_psum(dst, tp, Engine::scalar); }});
      }
    }
  }
}

/** Records the loads of a group's input window for the outputs of `chunk` into xw ([128, input
 *  tiles, window]): x_pad from column chunk.c0 * stride, zeros in the padding. */
inline void load_window(toolkit::TaskScheduler& sch, const Tensor& xw, const Tensor& x, const Conv1dShape& s,
                        const reference::Conv1dGeometry& g, int64_t b, int64_t grp,
                        const toolkit::ColumnChunk& chunk) {
  const int64_t span = (s.K - 1) * g.dilation + 1, width = (chunk.width - 1) * g.stride + span;
  for (int64_t i = 0; i < xw.shape()[1]; ++i)
    load_tokens(sch, xw(toolkit::first(input_rows(s, i)), i, nl::ds(0, width)), x, nullptr, b,
                grp * s.cig + i * nl::tile_size().pmax, chunk.c0 * g.stride - g.padding);
}

/** ps ([p, n] PSUM) = the pre-activation sums of output tile j of a block for the n outputs from
 *  j0 of a chunk: one matmul per input tile and tap, accumulated. */
inline void conv_taps(const Tensor& ps, const Tensor& wT, const Tensor& xw, const Conv1dShape& s,
                      const reference::Conv1dGeometry& g, int64_t j, int64_t j0) {
  using toolkit::first;
  const int64_t pco = ps.shape()[0], n = ps.shape()[1], P = wT.shape()[0];
  for (int64_t i = 0; i < wT.shape()[1]; ++i)
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t c = j0 * g.stride + k * g.dilation, pci = input_rows(s, i);
      isa::nc_matmul(ps, wT(first(pci), i, k, nl::ds(j * P, pco)),
                     xw(first(pci), i, Slice{c, c + (n - 1) * g.stride + 1, g.stride}), {.accumulate = i > 0 || k > 0});
    }
}

}  // namespace conv

/** @brief out = act(conv1d(x, weight) + bias); see conv1d_doc. */
inline Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, const reference::Conv1dGeometry& g,
                     int64_t activation, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("conv1d", x, loc);
  const conv::Conv1dShape s = conv::check_conv1d(check, x, weight, bias, g, activation);
  const int64_t P = nl::tile_size().pmax, piece = nl::tile_size().gemm_moving_fmax;
  const DType dt = x.dtype();
  const int64_t es = dtype_size(dt);
  const int64_t nci = ceil_div(s.cig, P), nco = ceil_div(s.cog, P), span = (s.K - 1) * g.dilation + 1;
  Tensor out = nl::ndarray({s.B, s.Cout, s.Lout}, dt, nl::shared_hbm, "out");

  // Weights of a block of output tiles stay in SBUF (double-buffered across blocks); the rest goes
  // to the input windows and output chunks, three of each in flight.
  constexpr int64_t kDepth = 3, kPsum = 4, kTransposes = 2;
  toolkit::Budget budget(check);
  toolkit::Ring raw_ring = budget.sbuf_ring({P, P, s.K}, dt, 2, "weight_rows");
  toolkit::Ring bias_ring = budget.sbuf_ring({P, nco}, nl::float32, 2, "bias_columns");
  const int64_t per_out_tile = nci * s.K * P * es;
  const int64_t smallest_chunk = kDepth * (nci * (127 * g.stride + span) + 128) * es;
  const int64_t cob = std::clamp<int64_t>((budget.sbuf_free() - smallest_chunk) / (2 * per_out_tile), 1, nco);
  toolkit::Ring w_ring = budget.sbuf_ring({P, nci, s.K, cob * P}, dt, 2, "weights_transposed");
  const auto window = [&](int64_t outputs) { return (outputs - 1) * g.stride + span; };
  const int64_t Wo = std::min(s.Lout, budget.largest({2048, 1024, 512, 256, 128}, [&](int64_t w) {
    return kDepth * (nci * window(w) + w) * es;
  }).value_or(128));
  toolkit::Ring x_ring = budget.sbuf_ring({P, nci, window(Wo)}, dt, kDepth, "input_window");
  toolkit::Ring out_ring = budget.sbuf_ring({P, Wo}, dt, kDepth, "out_chunk");
  toolkit::Ring psum_ring = budget.psum_ring({P, piece}, nl::float32, kPsum, "conv_psum");
  toolkit::Ring transpose_ring = budget.psum_ring({P, P}, dt, kTransposes, "weight_transpose");

  toolkit::TaskScheduler sch;
  const nl::Op act = conv::conv_activation(activation);
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(s.Lout, Wo, piece);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t cb0 = 0; cb0 < nco; cb0 += cob) {
      const conv::OutputBlock block{grp, cb0, std::min(cob, nco - cb0)};
      const Tensor wT = w_ring.next(), bias_cols = bias_ring.next();
      conv::transpose_weights(sch, raw_ring, transpose_ring, wT, bias_cols, weight, bias, s, block);
      for (int64_t b = 0; b < s.B; ++b)
        for (const toolkit::ColumnChunk& chunk : chunks) {
          const Tensor xw = x_ring.next();
          conv::load_window(sch, xw, x, s, g, b, grp, chunk);
          for (int64_t j = 0; j < block.tiles; ++j) {
            const int64_t co0 = block.first_channel(s, j), pco = block.rows(s, j);
            const Tensor o = out_ring.next()(first(pco), nl::ds(0, chunk.width));
            for (int64_t j0 = 0; j0 < chunk.width; j0 += piece) {
              const int64_t n = std::min(piece, chunk.width - j0);
              const Tensor ps = psum_ring.next()(first(pco), nl::ds(0, n));
              sch.add([&] { conv::conv_taps(ps, wT, xw, s, g, j, j0); });
              const Tensor bias_col = bias_cols(first(pco), nl::ds(j, 1));
              sch.add([&] { isa::activation(o(nl::all, nl::ds(j0, n)), act, ps, {.bias = bias_col}); });
            }
            sch.add([&] { isa::dma_copy(out(b, nl::ds(co0, pco), nl::ds(chunk.c0, chunk.width)), o); });
          }
        }
    }
  sch.run();
  return out;
}

namespace conv {

inline ExampleCase conv1d_case(Shape x, Shape w, DType dt, Params params, std::string label) {
  return ExampleCase{{spec(x, dt), spec(w, dt), spec({w[0]}, dt)}, std::move(params), std::move(label)};
}

inline reference::Conv1dGeometry conv1d_geometry(const ParamValues& p) {
  return {p.integer("stride"), p.integer("padding"), p.integer("dilation"), p.integer("groups")};
}

inline std::vector<ExampleCase> conv1d_examples() {
  const DType f32 = DType::float32, bf16 = DType::bfloat16;
  return {conv1d_case({2, 130, 300}, {70, 130, 3}, bf16, {{"padding", 1}, {"activation", 1}},
                      "'same' padding, K = 3, SiLU: two input tiles, channel and length tails"),
          conv1d_case({1, 64, 100}, {32, 64, 1}, f32, {}, "K = 1 (pointwise), no activation"),
          conv1d_case({1, 40, 257}, {20, 20, 5}, f32, {{"stride", 2}, {"dilation", 2}, {"groups", 2}, {"padding", 3},
                                                      {"activation", 2}},
                      "stride 2, dilation 2, two groups, GELU"),
          conv1d_case({2, 16, 50}, {16, 1, 4}, f32, {{"groups", 16}, {"padding", 2}}, "depthwise: groups = channels"),
          conv1d_case({1, 8, 200}, {8, 8, 64}, bf16, {{"activation", 1}}, "K = 64 at its limit"),
          conv1d_case({1, 20, 2500}, {140, 20, 3}, bf16, {{"padding", 1}, {"stride", 1}},
                      "long rows in column chunks, two output tiles")};
}

inline ExampleCase draw_conv1d_case(CaseRng& r) {
  const int64_t groups = r.pick<int64_t>({1, 1, 2, 3}), cig = r.size(1, 150), cog = r.size(1, 150);
  const int64_t K = r.coin(0.9) ? r.uniform(1, 7) : r.uniform(8, kMaxConvTaps);
  const int64_t stride = r.uniform(1, 3), dilation = r.coin(0.7) ? 1 : r.uniform(2, 3), padding = r.uniform(0, K);
  const int64_t L = std::max(r.size(1, 900, 512), dilation * (K - 1) + 1 - 2 * padding);
  Params p{{"stride", double(stride)}, {"padding", double(padding)}, {"dilation", double(dilation)},
           {"groups", double(groups)}, {"activation", double(r.uniform(0, 2))}};
  return conv1d_case({r.uniform(1, 2), cig * groups, L}, {cog * groups, cig, K},
                     r.pick({DType::float32, DType::bfloat16, DType::float16}), p, "drawn");
}

/** fp32 sums of C_in / groups * K products: their rounding grows like the square root of the count. */
inline Tolerance conv1d_tolerance(const ExampleCase& c) {
  const Tolerance t = dtype_tolerance(c.inputs[0].dtype);
  const double terms = double(c.inputs[1].shape[1] * c.inputs[1].shape[2]);
  return {t.rtol, t.atol * std::max(1.0, std::sqrt(terms) / 4)};
}

}  // namespace conv

inline KernelInfo conv1d_info() {
  return KernelInfo{
      .name = "conv1d",
      .summary = "conv1d with stride, padding, dilation, groups, bias and a fused SiLU or GELU",
      .doc = conv1d_doc,
      .inputs = {"x", "weight", "bias"},
      .outputs = {"out"},
      .params = {{"stride", ParamKind::integer, 1, "step between outputs, in input columns"},
                 {"padding", ParamKind::integer, 0, "zeros added at both ends of each row"},
                 {"dilation", ParamKind::integer, 1, "step between taps, in input columns"},
                 {"groups", ParamKind::integer, 1, "channel groups convolved separately"},
                 {"activation", ParamKind::integer, 0, "0: none, 1: SiLU, 2: GELU (erf)"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "conv1d_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{conv1d(c.inputs[0], c.inputs[1], c.inputs[2], conv::conv1d_geometry(c),
                                              c.integer("activation"), Loc::current())};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::conv1d(in[0], in[1], in[2], conv::conv1d_geometry(p),
                                                            reference::ConvActivation(p.integer("activation")))};
          },
      .make_inputs = {},
      .examples = conv::conv1d_examples(),
      .draw = conv::draw_conv1d_case,
      .tolerance = conv::conv1d_tolerance,
      .benchmark =
          Benchmark{conv::conv1d_case({8, 512, 4096}, {512, 512, 3}, DType::bfloat16, {{"padding", 1}},
                                      "B=8, C_in=C_out=512, L=4096, K=3 bf16"),
                    Bound::tensor_engine,
                    [](const ExampleCase& c) {
                      const Shape &x = c.inputs[0].shape, &w = c.inputs[1].shape;
                      return 2.0 * double(x[0] * x[2] * w[0] * w[1] * w[2]);  // stride 1, 'same' padding
                    },
                    0.70},
  };
}

}  // namespace nikki::kernels
