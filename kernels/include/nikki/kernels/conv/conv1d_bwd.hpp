// Backward of the general conv1d: grad_x, grad_weight and grad_bias through the fused activation,
// for every stride, padding, dilation and groups, on the Tensor engine.
//
// Two passes over the data, each a sum of matmuls like the forward:
//  1. Per block of output tiles, the weight gradient: grad_weight[:, :, k] = g @ x_pad shifted by k,
//     a contraction over time. TensorE transposes 128-step tiles of g and, for each tap, of the
//     input window read every stride-th column (time onto partitions), then g^T tiles are the
//     stationaries and the shifted x^T tiles the moving operands, accumulated in PSUM over a chunk
//     and added into an fp32 SBUF sum; grad_bias is g^T times a column of ones. With an
//     activation the pre-activation is recomputed here (the forward's matmuls), g = grad_out *
//     act'(z) is rounded to the dtype and kept in an HBM scratch for pass 2.
//  2. Per block of input tiles, grad_x: the transposed convolution of g. An input position q
//     (padded coordinates) of residue r = q mod stride is reached by the taps k with
//     k * dilation = r (mod stride), from output q / stride + (r - k * dilation) / stride; so per
//     residue the sum over output tiles and its taps of W[:, :, k] (its natural [C_out, C_in]
//     layout is the stationary) times g's window is one PSUM accumulation, copied out to every
//     stride-th column. Residues no tap reaches (stride > the filter's span) are zeros.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/conv/conv1d.hpp"

namespace nikki::kernels {

inline constexpr const char* conv1d_bwd_doc = R"(Backward of conv1d: grad_x, grad_weight and grad_bias through the fused SiLU or GELU.

Dimensions: x [B, C_in, L], weight [C_out, C_in / groups, K], bias [C_out], grad_out [B, C_out, L_out]
            -> grad_x [B, C_in, L], grad_weight [C_out, C_in / groups, K], grad_bias [C_out];
            L_out as conv1d's; 1 <= K <= 64.
Args:       x, weight, bias, stride, padding, dilation, groups, activation: the forward's; grad_out:
            the gradient of the loss with respect to conv1d's out, x's dtype.
Returns:    the three gradients, x's dtype.
Notes:      Pass 1, per block of output-channel tiles: with an activation, z is recomputed (the
            forward's matmuls) and g = grad_out * act'(z) (ScalarE's silu_dx / gelu_dx, VectorE or
            GpSimd product) is rounded to the dtype and kept in an HBM scratch; TensorE transposes
            128-step tiles of g and of the input window for each tap (time on partitions), and
            grad_weight[:, :, k] accumulates g^T x_k^T products in fp32 PSUM per chunk, added into
            fp32 SBUF sums; grad_bias likewise against a column of ones. Pass 2, per block of
            input-channel tiles: grad_x is the transposed convolution, per residue of the input
            position modulo stride a PSUM accumulation of W[:, :, k] (natural layout) times g's
            window over the output tiles and the taps that reach it, copied to every stride-th
            column; positions no tap reaches get zeros. Sums are fp32 and rounded once. The
            weight gradient of a block takes C_in / groups * K fp32 sums per output tile and
            partition; SBUF bounds it (a KernelError names the plan that does not fit).
Pseudocode: g = grad_out * act'(z)   (z: the forward's pre-activation; g = grad_out without activation)
            grad_bias[o] = sum_{b, t} g[b, o, t]
            grad_weight[o, i, k] = sum_{b, t} g[b, o, t] * x_pad[b, g(o) * C_in / groups + i, t * stride + k * dilation]
            grad_x = x_pad's gradient without the padding: grad_x_pad[b, c, t * stride + k * dilation]
                     += sum_{o in c's group} weight[o, c - group start, k] * g[b, o, t])";

namespace conv {

/** The element-wise steps of conv1d's backward, an engine each. */
struct Conv1dGrad {
  /** slope = act'(z + bias) as ScalarE moves z out of PSUM. */
  static void slope(const Tensor& slope, const Tensor& z, const Tensor& bias, int64_t activation) {
    isa::activation(slope, activation == 1 ? nl::silu_dx : nl::gelu_dx, z, {.bias = bias});
  }
  /** g *= slope, on VectorE or GpSimd, rounded to g's dtype. */
  static void scale(const Tensor& g, const Tensor& slope, Engine engine) {
    isa::tensor_tensor(g, g, slope, nl::multiply, engine);
  }
  /** sums += psum: VectorE adds a PSUM chunk into the fp32 SBUF sums. */
  static void accumulate(const Tensor& sums, const Tensor& psum) {
    isa::tensor_tensor(sums, sums, psum, nl::add, Engine::vector);
  }
};

/** How pass 1 covers a group: blocks of `tiles` output tiles, chunks of `width` outputs. */
struct WeightGradPlan {
  int64_t tiles = 1, width = 128;
};

/** How pass 2 covers a group: blocks of `tiles` input tiles, chunks of `positions` padded input
 *  positions (a multiple of the stride). */
struct InputGradPlan {
  int64_t tiles = 1, positions = 128;
};

}  // namespace conv

/** @brief (grad_x, grad_weight, grad_bias) of conv1d; see conv1d_bwd_doc. */
inline std::vector<Tensor> conv1d_bwd(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& grad_out,
                                      const reference::Conv1dGeometry& g, int64_t activation,
                                      Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using conv::Conv1dGrad;
  using toolkit::first;
  const ArgumentCheck check("conv1d_bwd", x, loc);
  const conv::Conv1dShape s = conv::check_conv1d(check, x, weight, bias, g, activation);
  const Shape out_shape{s.B, s.Cout, s.Lout};
  check.require(grad_out.shape() == out_shape && grad_out.dtype() == x.dtype(),
                "grad_out must be conv1d's out, " + out_shape.str() + " " + std::string(dtype_name(x.dtype())) +
                    " (L_out from L, stride, padding, dilation and K), got " + conv::shape_dtype(grad_out));
  const int64_t P = nl::tile_size().pmax, piece = nl::tile_size().gemm_moving_fmax;
  const DType dt = x.dtype();
  const int64_t es = dtype_size(dt), K = s.K, S = g.stride, D = g.dilation;
  const int64_t nci = ceil_div(s.cig, P), nco = ceil_div(s.cog, P), span = (K - 1) * D + 1;
  const bool act = activation != 0;
  std::vector<Tensor> outs{nl::ndarray({s.B, s.Cin, s.L}, dt, nl::shared_hbm, "grad_x"),
                           nl::ndarray({s.Cout, s.cig, K}, dt, nl::shared_hbm, "grad_weight"),
                           nl::ndarray({s.Cout}, dt, nl::shared_hbm, "grad_bias")};
  const Tensor &grad_x = outs[0], &grad_weight = outs[1], &grad_bias = outs[2];
  // g after the activation's slope, written by pass 1 and read by pass 2.
  const Tensor g_hbm = act ? nl::ndarray(out_shape, dt, nl::hbm, "g") : grad_out;

  // Pass 1 keeps per block: the fp32 weight-gradient sums, the transposed weights (with an
  // activation), x's windows and g's chunks three deep, and the time-major tiles of two chunks.
  // Pass 2: the natural weights of its input tiles, g's windows and grad_x's chunks.
  constexpr int64_t kDepth = 3, kChunks = 2;
  const int64_t Mg = (K - 1) * D / S;  // outputs before a chunk's first one that reach its positions
  const auto steps = [&](int64_t width) { return ceil_div(width, P); };
  const auto pass1 = [&](const conv::WeightGradPlan& p) {
    const int64_t cols = p.tiles * P, window = (p.width - 1) * S + span;
    int64_t bytes = kDepth * (nci * window + p.tiles * p.width) * es            // x windows, g chunks
                    + kChunks * steps(p.width) * (K * s.cig + cols) * es        // x_k^T and g^T tiles
                    + p.tiles * (K * s.cig + 1) * 4 + 2 * s.cig * K * es + es;  // sums, staging, ones
    if (act) bytes += 2 * (nci * K * cols + P * K) * es + 2 * p.tiles * 4 + kDepth * piece * es;
    return bytes;
  };
  const auto pass2 = [&](const conv::InputGradPlan& p) {
    return (nco * p.tiles * P * K + kDepth * (nco * (Mg + p.positions / S + 1) + p.positions)) * es;
  };
  toolkit::Budget budget(check);
  conv::WeightGradPlan plan1;
  conv::InputGradPlan plan2;
  {
    // The widest chunks and blocks that fit: pass 1 first (its chunks amortize the PSUM flushes,
    // its blocks the input transposes), then pass 2 in what is left.
    const int64_t positions = std::max<int64_t>(S, 1024 / S * S);
    const conv::InputGradPlan least2{1, positions};
    bool found = false;
    for (int64_t tiles = nco; tiles >= 1 && !found; tiles = tiles == 1 ? 0 : ceil_div(tiles, 2))
      for (int64_t width : {1024, 512, 256, 128})
        if (budget.fits(pass1({tiles, width}) + pass2(least2))) {
          plan1 = {tiles, width};
          found = true;
          break;
        }
    for (int64_t tiles = nci; tiles >= 1; tiles = tiles == 1 ? 0 : ceil_div(tiles, 2))
      if (budget.fits(pass1(plan1) + pass2({tiles, positions}))) {
        plan2 = {tiles, positions};
        break;
      }
  }
  const int64_t W = std::min(plan1.width, ((s.Lout + P - 1) / P) * P), T = steps(W), cob = plan1.tiles;
  const int64_t cols = cob * P, window = (W - 1) * S + span;
  toolkit::Ring x_ring = budget.sbuf_ring({P, nci, window}, dt, kDepth, "input_window");
  toolkit::Ring g_ring = budget.sbuf_ring({P, cob, W}, dt, kDepth, "g_chunk");
  toolkit::Ring xT_ring = budget.sbuf_ring({P, T, K, s.cig}, dt, kChunks, "input_time_major");
  toolkit::Ring gT_ring = budget.sbuf_ring({P, T, cols}, dt, kChunks, "g_time_major");
  const Tensor sums = budget.sbuf({P, cob, K, s.cig}, nl::float32, "weight_grad_sums");
  const Tensor bias_sums = budget.sbuf({P, cob}, nl::float32, "bias_grad_sums");
  toolkit::Ring wout_ring = budget.sbuf_ring({P, s.cig, K}, dt, 2, "weight_grad_rows");
  const Tensor ones = budget.sbuf({P, 1}, dt, "ones");
  toolkit::Ring raw_ring, w_ring, bias_ring, slope_ring;
  if (act) {
    raw_ring = budget.sbuf_ring({P, P, K}, dt, 2, "weight_rows");
    w_ring = budget.sbuf_ring({P, nci, K, cols}, dt, 2, "weights_transposed");
    bias_ring = budget.sbuf_ring({P, cob}, nl::float32, 2, "bias_columns");
    slope_ring = budget.sbuf_ring({P, piece}, dt, kDepth, "activation_slope");
  }
  const int64_t Wq = plan2.positions, cib = std::min(plan2.tiles * P, s.cig), Gw = Mg + Wq / S + 1;
  toolkit::Ring wn_ring = budget.sbuf_ring({P, nco, cib, K}, dt, 1, "weights");
  toolkit::Ring ge_ring = budget.sbuf_ring({P, nco, Gw}, dt, kDepth, "g_window");
  toolkit::Ring gx_ring = budget.sbuf_ring({P, Wq}, dt, kDepth, "grad_x_chunk");
  toolkit::Ring z_ring = act ? budget.psum_ring({P, piece}, nl::float32, 2, "preactivation_psum") : toolkit::Ring{};
  toolkit::Ring tr_ring = budget.psum_ring({P, piece}, dt, dt == DType::float32 ? 2 : 4, "transposes");
  toolkit::Ring gw_ring = budget.psum_ring({P, piece}, nl::float32, 2, "weight_grad_psum");
  toolkit::Ring gx_psum = budget.psum_ring({P, piece}, nl::float32, budget.psum_banks_free(), "grad_x_psum");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  const auto copy_out = [&](const Tensor& dst, const Tensor& src) {
    sch.add_any({[&] { mlp::copy_from_psum(dst, src, vector); }, [&] { mlp::copy_from_psum(dst, src, scalar); }});
  };
  sch.add([&] { isa::memset(ones, 1.0, gpsimd); });

  // Pass 1: the weight and bias gradients (and g with an activation), per block of output tiles.
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(s.Lout, W, P);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t cb0 = 0; cb0 < nco; cb0 += cob) {
      const conv::OutputBlock block{grp, cb0, std::min(cob, nco - cb0)};
      Tensor wT, bias_cols;
      if (act) {
        wT = w_ring.next();
        bias_cols = bias_ring.next();
        conv::transpose_weights(sch, raw_ring, tr_ring, wT, bias_cols, weight, bias, s, block);
      }
      sch.add([&] { isa::memset(sums, 0.0, gpsimd); });
      sch.add([&] { isa::memset(bias_sums, 0.0, gpsimd); });
      for (int64_t b = 0; b < s.B; ++b)
        for (const toolkit::ColumnChunk& chunk : chunks) {
          const int64_t w = chunk.width, nT = steps(w);
          const Tensor xw = x_ring.next(), gt = g_ring.next(), xT = xT_ring.next(), gT = gT_ring.next();
          conv::load_window(sch, xw, x, s, g, b, grp, chunk);
          for (int64_t j = 0; j < block.tiles; ++j) {
            const int64_t co0 = block.first_channel(s, j), pco = block.rows(s, j);
            const Tensor gj = gt(first(pco), j, nl::ds(0, w));
            sch.add([&] { isa::dma_copy(gj, grad_out(b, nl::ds(co0, pco), nl::ds(chunk.c0, w))); });
            if (!act) continue;
            for (int64_t j0 = 0; j0 < w; j0 += piece) {
              const int64_t n = std::min(piece, w - j0);
              const Tensor ps = z_ring.next()(first(pco), nl::ds(0, n)), gp = gj(all, nl::ds(j0, n));
              const Tensor slope = slope_ring.next()(first(pco), nl::ds(0, n));
              sch.add([&] { conv::conv_taps(ps, wT, xw, s, g, j, j0); });
              sch.add([&] { Conv1dGrad::slope(slope, ps, bias_cols(first(pco), nl::ds(j, 1)), activation); });
              sch.add_any({[&] { Conv1dGrad::scale(gp, slope, vector); }, [&] { Conv1dGrad::scale(gp, slope, gpsimd); }});
            }
            sch.add([&] { isa::dma_copy(g_hbm(b, nl::ds(co0, pco), nl::ds(chunk.c0, w)), gj); });
          }
          // Time onto partitions: g's output tiles and, per tap, the input tiles read every
          // stride-th column, up to four 128-wide transposes per PSUM tile and copy.
          for (int64_t u = 0; u < nT; ++u) {
            const int64_t nt = std::min(P, w - u * P);
            for (int64_t j0 = 0; j0 < block.tiles; j0 += piece / P) {
              const int64_t jn = std::min(piece / P, block.tiles - j0);
              const int64_t width = (jn - 1) * P + block.rows(s, j0 + jn - 1);
              const Tensor tp = tr_ring.next()(first(nt), nl::ds(0, width));
              sch.add([&] {
                for (int64_t j = j0; j < j0 + jn; ++j)
                  isa::nc_transpose(tp(all, nl::ds((j - j0) * P, block.rows(s, j))),
                                    gt(first(block.rows(s, j)), j, nl::ds(u * P, nt)), Engine::tensor);
              });
              copy_out(gT(first(nt), u, nl::ds(j0 * P, width)), tp);
            }
            for (int64_t k = 0; k < K; ++k)
              for (int64_t i0 = 0; i0 < nci; i0 += piece / P) {
                const int64_t in = std::min(piece / P, nci - i0);
                const int64_t width = (in - 1) * P + conv::input_rows(s, i0 + in - 1);
                const Tensor tp = tr_ring.next()(first(nt), nl::ds(0, width));
                const int64_t c = u * P * S + k * D;
                sch.add([&] {
                  for (int64_t i = i0; i < i0 + in; ++i)
                    isa::nc_transpose(tp(all, nl::ds((i - i0) * P, conv::input_rows(s, i))),
                                      xw(first(conv::input_rows(s, i)), i, Slice{c, c + (nt - 1) * S + 1, S}),
                                      Engine::tensor);
                });
                copy_out(xT(first(nt), u, k, nl::ds(i0 * P, width)), tp);
              }
          }
          // grad_weight[:, :, k] and grad_bias: sums over the chunk's steps in PSUM, then into SBUF.
          for (int64_t j = 0; j < block.tiles; ++j) {
            const int64_t pco = block.rows(s, j);
            const auto g_steps = [&](int64_t u) { return gT(first(std::min(P, w - u * P)), u, nl::ds(j * P, pco)); };
            for (int64_t k = 0; k < K; ++k)
              for (int64_t c0 = 0; c0 < s.cig; c0 += piece) {
                const int64_t cw = std::min(piece, s.cig - c0);
                const Tensor ps = gw_ring.next()(first(pco), nl::ds(0, cw));
                sch.add([&] {
                  for (int64_t u = 0; u < nT; ++u)
                    isa::nc_matmul(ps, g_steps(u), xT(first(std::min(P, w - u * P)), u, k, nl::ds(c0, cw)),
                                   {.accumulate = u > 0});
                });
                sch.add([&] { Conv1dGrad::accumulate(sums(first(pco), j, k, nl::ds(c0, cw)), ps); });
              }
            const Tensor ps = gw_ring.next()(first(pco), nl::ds(0, 1));
            sch.add([&] {
              for (int64_t u = 0; u < nT; ++u)
                isa::nc_matmul(ps, g_steps(u), ones(first(std::min(P, w - u * P)), all), {.accumulate = u > 0});
            });
            sch.add([&] { Conv1dGrad::accumulate(bias_sums(first(pco), nl::ds(j, 1)), ps); });
          }
        }
      // The block's sums, rounded to the dtype in grad_weight's [C_out, C_in / groups, K] order.
      for (int64_t j = 0; j < block.tiles; ++j) {
        const int64_t co0 = block.first_channel(s, j), pco = block.rows(s, j);
        const Tensor rows = wout_ring.next()(first(pco), all, all);
        sch.add_any({[&] { isa::tensor_copy(rows.permute({0, 2, 1}), sums(first(pco), j, all, all), gpsimd); },
                     [&] { isa::tensor_copy(rows.permute({0, 2, 1}), sums(first(pco), j, all, all), vector); }});
        sch.add([&] { isa::dma_copy(grad_weight(nl::ds(co0, pco), all, all), rows); });
      }
      for (int64_t j = 0; j < block.tiles; ++j) {
        const int64_t co0 = block.first_channel(s, j), pco = block.rows(s, j);
        const Tensor col = wout_ring.next()(first(pco), 0, nl::ds(0, 1));
        sch.add([&] { isa::tensor_copy(col, bias_sums(first(pco), nl::ds(j, 1)), gpsimd); });
        sch.add([&] { isa::dma_copy(grad_bias(nl::ds(co0, pco)).reshape({pco, 1}), col); });
      }
    }

  // Pass 2: grad_x, per block of input tiles and chunk of padded positions [qa, qb).
  const int64_t q_start = g.padding / S * S, q_end = g.padding + s.L;
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t ib0 = 0; ib0 < nci; ib0 += plan2.tiles) {
      const int64_t ibn = std::min(plan2.tiles, nci - ib0), ci_first = ib0 * P;
      const int64_t width = std::min(ibn * P, s.cig - ci_first);
      const Tensor wn = wn_ring.next();
      for (int64_t j = 0; j < nco; ++j) {
        const int64_t co0 = grp * s.cog + j * P, pco = std::min(P, s.cog - j * P);
        sch.add([&] {
          isa::dma_copy(wn(first(pco), j, nl::ds(0, width), all), weight(nl::ds(co0, pco), nl::ds(ci_first, width), all));
        });
      }
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t qa = q_start; qa < q_end; qa += Wq) {
          const int64_t qb = std::min(q_end, qa + Wq), m_a = qa / S, gcols = Mg + ceil_div(qb - qa, S);
          const Tensor ge = ge_ring.next();
          for (int64_t j = 0; j < nco; ++j)
            conv::load_tokens(sch, ge(first(std::min(P, s.cog - j * P)), j, nl::ds(0, gcols)), g_hbm, nullptr, b,
                              grp * s.cog + j * P, m_a - Mg);
          for (int64_t i = ib0; i < ib0 + ibn; ++i) {
            const int64_t pci = conv::input_rows(s, i), ci_local = (i - ib0) * P;
            const Tensor gx = gx_ring.next()(first(pci), nl::ds(0, qb - qa));
            for (int64_t r = 0; r < S && r < qb - qa; ++r) {
              const int64_t M = ceil_div(qb - qa - r, S);
              const auto every_stride = [&](int64_t p0, int64_t n) {
                return gx(all, Slice{p0 * S + r, (p0 + n - 1) * S + r + 1, S});
              };
              std::vector<int64_t> taps;
              for (int64_t k = 0; k < K; ++k)
                if (k * D % S == r) taps.push_back(k);
              if (taps.empty()) {
                sch.add([&] { isa::memset(every_stride(0, M), 0.0, gpsimd); });
                continue;
              }
              for (int64_t p0 = 0; p0 < M; p0 += piece) {
                const int64_t n = std::min(piece, M - p0);
                const Tensor ps = gx_psum.next()(first(pci), nl::ds(0, n));
                sch.add([&] {
                  bool first_product = true;
                  for (int64_t j = 0; j < nco; ++j) {
                    const int64_t pco = std::min(P, s.cog - j * P);
                    for (int64_t k : taps) {
                      const int64_t from = p0 + (r - k * D) / S + Mg;
                      isa::nc_matmul(ps, wn(first(pco), j, nl::ds(ci_local, pci), k),
                                     ge(first(pco), j, nl::ds(from, n)), {.accumulate = !first_product});
                      first_product = false;
                    }
                  }
                });
                copy_out(every_stride(p0, n), ps);
              }
            }
            const int64_t lo = std::max(qa, g.padding), hi = std::min(qb, q_end);
            if (hi > lo)
              sch.add([&] {
                isa::dma_copy(grad_x(b, nl::ds(grp * s.cig + i * P, pci), nl::ds(lo - g.padding, hi - lo)),
                              gx(all, nl::ds(lo - qa, hi - lo)));
              });
          }
        }
    }
  sch.run();
  return outs;
}

namespace conv {

inline ExampleCase conv1d_bwd_case(ExampleCase forward) {
  const TensorSpec &x = forward.inputs[0], &w = forward.inputs[1];
  const auto param = [&](const char* name, double fallback) {
    return static_cast<int64_t>(forward.params.find(name).value_or(fallback));
  };
  const reference::Conv1dGeometry g{param("stride", 1), param("padding", 0), param("dilation", 1), param("groups", 1)};
  forward.inputs.push_back(spec({x.shape[0], w.shape[0], g.out_length(x.shape[2], w.shape[2])}, x.dtype));
  return forward;
}

/** A drawn case that also reaches the backward's particular paths: depthwise groups, a stride
 *  longer than the filter (positions no tap reaches) and long dilations. */
inline ExampleCase draw_conv1d_bwd_case(CaseRng& r) {
  if (r.coin(0.7)) return conv1d_bwd_case(draw_conv1d_case(r));
  const int64_t C = r.size(1, 40), K = r.uniform(1, 4), stride = r.uniform(K + 1, K + 4), dilation = r.uniform(1, 3);
  const bool depthwise = r.coin();
  const int64_t groups = depthwise ? C : 1, L = std::max(r.size(1, 700, 128), dilation * (K - 1) + 1);
  Params p{{"stride", double(stride)}, {"padding", double(r.uniform(0, 2))}, {"dilation", double(dilation)},
           {"groups", double(groups)}, {"activation", double(r.uniform(0, 2))}};
  return conv1d_bwd_case(conv1d_case({r.uniform(1, 2), C, L}, {depthwise ? C : r.size(1, 140), depthwise ? 1 : C, K},
                                     r.pick({DType::float32, DType::bfloat16, DType::float16}), p,
                                     depthwise ? "drawn depthwise, stride > K" : "drawn, stride > K"));
}

/** grad_weight and grad_bias are fp32 sums of B * L_out products, grad_x of C_out / groups * K:
 *  relative to the largest gradient their rounding grows like the square root of the count (fp32
 *  sums of tens of thousands of terms pass 1e-5). 16-bit results are dominated by their own
 *  rounding and by g's (rounded to the dtype after the slope, as autograd in that dtype does). */
inline Tolerance conv1d_bwd_tolerance(const ExampleCase& c) {
  const Tolerance t = dtype_tolerance(c.inputs[0].dtype);
  const Shape &x = c.inputs[0].shape, &w = c.inputs[1].shape, &gout = c.inputs[3].shape;
  const double terms = std::max(double(gout[0] * gout[2]), double(w[0] * w[2]) / double(x[1] / w[1]));
  return {t.rtol, t.atol * std::max(1.0, std::sqrt(terms) / 64)};
}

}  // namespace conv

inline KernelInfo conv1d_bwd_info() {
  KernelInfo forward = conv1d_info();
  std::vector<ExampleCase> examples;
  for (const ExampleCase& c : forward.examples) examples.push_back(conv::conv1d_bwd_case(c));
  examples.push_back(conv::conv1d_bwd_case(conv::conv1d_case(
      {2, 6, 41}, {6, 1, 3}, DType::float32, {{"groups", 6}, {"stride", 5}, {"padding", 1}, {"activation", 1}},
      "depthwise, stride 5 > K = 3: positions no tap reaches")));
  examples.push_back(conv::conv1d_bwd_case(conv::conv1d_case(
      {1, 130, 1300}, {260, 130, 4}, DType::bfloat16, {{"stride", 3}, {"dilation", 2}, {"padding", 4}, {"activation", 2}},
      "stride 3, dilation 2, GELU: residues with different taps, channel and length tails")));
  return KernelInfo{
      .name = "conv1d_bwd",
      .summary = "gradients of conv1d: x, weight and bias, through the fused SiLU or GELU",
      .doc = conv1d_bwd_doc,
      .inputs = {"x", "weight", "bias", "grad_out"},
      .outputs = {"grad_x", "grad_weight", "grad_bias"},
      .params = forward.params,
      .dtypes = forward.dtypes,
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return conv1d_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], conv::conv1d_geometry(c),
                              c.integer("activation"), Loc::current());
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::conv1d_bwd(in[0], in[1], in[2], in[3], conv::conv1d_geometry(p),
                                         reference::ConvActivation(p.integer("activation")));
          },
      .make_inputs = {},
      .examples = examples,
      .draw = conv::draw_conv1d_bwd_case,
      .tolerance = conv::conv1d_bwd_tolerance,
      .benchmark =
          Benchmark{conv::conv1d_bwd_case(forward.benchmark->shape), Bound::tensor_engine,
                    [](const ExampleCase& c) {
                      // grad_x and grad_weight, each the forward's FLOPs (stride 1, 'same' padding).
                      const Shape &x = c.inputs[0].shape, &w = c.inputs[1].shape;
                      return 4.0 * double(x[0] * x[2] * w[0] * w[1] * w[2]);
                    },
                    0.70},
  };
}

}  // namespace nikki::kernels
