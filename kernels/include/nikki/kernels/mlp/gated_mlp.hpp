// The gated MLP of transformer feed-forward blocks (SwiGLU, GeGLU): the Tensor engine with its
// weights streamed once per block of tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/mlp/gated_mlp_reference.hpp"
#include "nikki/kernels/mlp/transposed_rows.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* gated_mlp_doc = R"(Gated MLP: (act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down.

Dimensions: x [T, H], w_gate [H, I], w_up [H, I], w_down [I, H], b_gate [I], b_up [I],
            b_down [H] -> out [T, H]; any T, H, I >= 1 (I up to what a block of tokens' hidden
            activations leave of SBUF: I <= ~50K at bf16).
Args:       x, weights and biases: HBM tensors of one dtype, float32 / bfloat16 / float16 (pass
            zero biases for a bias-free MLP). activation: 0 silu (SwiGLU), 1 gelu (erf form),
            2 gelu with the tanh approximation.
Returns:    out, x's dtype.
Notes:      Tokens go in blocks of up to 512 (4 tiles of 128); each block reads every weight
            once, so the weights stream from HBM ceil(T / 512) times (once for decode, T <= 8).
            A block's x is transposed on TensorE (x^T, H on partitions). Gate and up
            projections take x^T tiles as the stationary operand and 512 columns of a weight
            row slab as the moving one, accumulating over H in fp32 PSUM; the bias is added as
            the accumulator leaves PSUM (VectorE), the activation runs on ScalarE, the product
            h = act(g) * u is rounded to the input dtype and transposed back on TensorE into
            h^T (I on partitions), which stays in SBUF for the down projection: h^T tiles
            stationary, 512 columns of w_down moving, accumulated over I, plus b_down on the
            way out. Weight slabs are [128 rows, 512 columns] for four tiles of tokens (1 KiB
            runs at bf16) and up to 2048 columns for one (decode: 4 KiB runs, the accumulators of
            four PSUM banks), several in flight, so the next slabs load while this one is used.
Pseudocode: for each block B of <= 512 tokens:
              xT = transpose(x[B])                                   # [H, |B|]
              for each 512-column chunk C of I:
                g = xT.T @ w_gate[:, C] + b_gate[C]; u = xT.T @ w_up[:, C] + b_up[C]
                hT[C] = transpose(act(g) * u)                        # rounded to x's dtype
              for each 512-column chunk D of H:
                out[B, D] = hT.T @ w_down[:, D] + b_down[D])";

namespace mlp {

/** The gate's activation on ScalarE for a GateActivation. */
inline nl::Op activation_op(reference::GateActivation act) {
  switch (act) {
    case reference::GateActivation::gelu: return nl::gelu;
    case reference::GateActivation::gelu_tanh: return nl::gelu_apprx_tanh;
    default: return nl::silu;
  }
}

/** Checks the MLP's operands; returns {T, H, I}. */
inline std::vector<int64_t> check_operands(const ArgumentCheck& check, const std::vector<Tensor>& in,
                                           const std::vector<std::string>& names) {
  const Tensor& x = in[0];
  check.require(x.ndim() == 2 && is_float(x.dtype()),
                "expected a 2-D float tensor x, got " + std::string(dtype_name(x.dtype())) + x.shape().str(),
                "reshape x to [tokens, hidden]");
  const int64_t T = x.shape()[0], H = x.shape()[1];
  check.require(in[1].ndim() == 2 && in[1].shape()[0] == H,
                "w_gate must be [H, I] with H = " + std::to_string(H) + " (x's last dim), got " + in[1].shape().str(),
                "pass the gate projection as [hidden, intermediate] (torch's Linear.weight transposed)");
  const int64_t I = in[1].shape()[1];
  const std::vector<Shape> want{{T, H}, {H, I}, {H, I}, {I, H}, {I}, {I}, {H}};
  for (size_t i = 0; i < in.size(); ++i) {
    check.require(in[i].shape() == want[i], "'" + names[i] + "' must have shape " + want[i].str() + ", got " +
                                                in[i].shape().str(),
                  "x [T, H], w_gate and w_up [H, I], w_down [I, H], b_gate and b_up [I], b_down [H]");
    check.require(in[i].dtype() == x.dtype(), "'" + names[i] + "' is " + std::string(dtype_name(in[i].dtype())) +
                                                  " but x is " + std::string(dtype_name(x.dtype())),
                  "pass every operand in one dtype");
  }
  return {T, H, I};
}

}  // namespace mlp

/** @brief out = gated MLP of x; see gated_mlp_doc. Operands: x, w_gate, w_up, w_down, b_gate,
 *  b_up, b_down. */
inline Tensor gated_mlp(const std::vector<Tensor>& in, reference::GateActivation act, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("gated_mlp", in.at(0), loc);
  const std::vector<std::string> names{"x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
  const std::vector<int64_t> dims = mlp::check_operands(check, in, names);
  const Tensor &x = in[0], &w_gate = in[1], &w_up = in[2], &w_down = in[3];
  const Tensor &b_gate = in[4], &b_up = in[5], &b_down = in[6];
  const int64_t T = dims[0], H = dims[1], I = dims[2];
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, bank = ts.psum_bank_fmax;  // 128 partitions, 512 fp32 per bank
  const DType dt = x.dtype();
  const int64_t es = dtype_size(dt);
  const int64_t nH = ceil_div(H, P), nI = ceil_div(I, P);
  const int64_t tpb = ts.psum_bank_fmax_bytes / (P * es);  // 128-wide transposes per PSUM bank
  const nl::Op act_op = mlp::activation_op(act);
  Tensor out = nl::ndarray({T, H}, dt, nl::shared_hbm, "out");

  // --- SBUF: x^T and h^T of a block of tokens stay resident (the weights stream past them); the
  // block is the widest that fits with the streaming tiles. A weight slab spans as many PSUM
  // banks of columns as leave the accumulators of the block's tiles in four banks: one bank for
  // four tiles of tokens (prefill), four (2048 columns, 4 KiB runs at bf16) for one (decode).
  constexpr int64_t kSlabBanks = 16, kRows = 2, kWork = 2, kGates = 5, kUps = 2, kBiases = 4;
  auto spans_for = [&](int64_t block) { return std::max<int64_t>(1, 4 / ceil_div(block, P)); };
  auto footprint = [&](int64_t block) {
    const int64_t spans = spans_for(block), slabs = std::max<int64_t>(4, kSlabBanks / spans);
    return (nH + nI) * block * es + (slabs + kBiases) * spans * bank * es + kRows * H * es +
           (kGates + kUps) * bank * 4 + 2 * kWork * bank * es;
  };
  toolkit::Budget budget(check);
  const int64_t max_block = std::min(4 * P, ceil_div(T, P) * P);
  std::optional<int64_t> fit;
  for (int64_t block = max_block; block >= P && !fit; block -= P)
    if (budget.fits(footprint(block))) fit = block;
  if (!fit)
    check.fail("x^T and h^T of 128 tokens (H = " + std::to_string(H) + ", I = " + std::to_string(I) + ", " +
                   std::string(dtype_name(dt)) + ") do not fit in SBUF",
               "a block of tokens keeps x^T [H, 128] and h^T [I, 128] on chip: " +
                   std::to_string(footprint(P) / 1024) + " KiB per partition needed, " +
                   std::to_string(budget.sbuf_capacity() / 1024) + " KiB available",
               "split I into parts and sum their outputs (the down projection is linear in h)");
  const int64_t TB = *fit, spans = spans_for(TB), CW = spans * bank;
  Tensor xT = budget.sbuf({P, nH, TB}, dt, "x_T");
  Tensor hT = budget.sbuf({P, nI, TB}, dt, "h_T");
  toolkit::Ring slab_ring = budget.sbuf_ring({P, CW}, dt, std::max<int64_t>(4, kSlabBanks / spans), "weight_slab");
  toolkit::Ring row_ring = budget.sbuf_ring({P, H}, dt, kRows, "x_rows");
  toolkit::Ring bias_ring = budget.sbuf_ring({P, CW}, dt, kBiases, "bias_rows");
  toolkit::Ring gate_ring = budget.sbuf_ring({P, bank}, nl::float32, kGates, "gate");
  toolkit::Ring up_ring = budget.sbuf_ring({P, bank}, nl::float32, kUps, "up");
  toolkit::Ring h_ring = budget.sbuf_ring({P, bank}, dt, kWork, "h");
  toolkit::Ring o_ring = budget.sbuf_ring({P, bank}, dt, kWork, "out_tile");
  // --- PSUM (8 banks): six fp32 accumulators [128, 512] and two banks of transposes.
  toolkit::Ring acc_ring = budget.psum_ring({P, bank}, nl::float32, 6, "accumulator");
  toolkit::Ring tr_ring = budget.psum_ring({P, tpb, P}, dt, 2, "transposes");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, gpsimd = Engine::gpsimd;
  auto bias_rows = [&](const Tensor& bias, int64_t c0, int64_t w) {
    const Tensor b = bias_ring.next()(all, nl::ds(0, w));
    sch.add([&] { isa::dma_copy(b, bias(nl::ds(c0, w)).expand_dim(0).broadcast(0, P)); });
    return b;
  };

  for (int64_t b0 = 0; b0 < T; b0 += TB) {
    const int64_t nb = std::min(TB, T - b0);
    const std::vector<toolkit::RowTile> tiles = toolkit::row_tiles(nb, P);
    // x^T of the block: rows -> TensorE transposes (a bank at a time) -> x^T.
    for (const toolkit::RowTile& rt : tiles) {
      const int64_t pt = rt.p, t0 = rt.r0;
      const Tensor rows = row_ring.next()(first(pt), all);
      sch.add([&] { isa::dma_copy(rows, x(nl::ds(b0 + t0, pt), all)); });
      mlp::transpose_rows(sch, tr_ring, xT(all, all, nl::ds(t0, pt)), rows);
    }
    // accs[i * spans + s] = sum over k of stationary_T[k, tile i]^T @ weight[k, c0 + 512 s ...]:
    // the weight's rows stream in slabs of w columns, each read by every tile of the block.
    auto accumulate = [&](const Tensor& weight, const Tensor& stationary_T, int64_t K, int64_t c0, int64_t w) {
      std::vector<Tensor> accs;
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s < spans; ++s) accs.push_back(acc_ring.next());
      for (int64_t k = 0; k < ceil_div(K, P); ++k) {
        const int64_t pk = std::min(P, K - k * P);
        const Tensor slab = slab_ring.next()(first(pk), nl::ds(0, w));
        sch.add([&] { isa::dma_copy(slab, weight(nl::ds(k * P, pk), nl::ds(c0, w))); });
        sch.add([&] {
          for (size_t i = 0; i < tiles.size(); ++i)
            for (int64_t s = 0; s * bank < w; ++s) {
              const int64_t ws = std::min(bank, w - s * bank);
              isa::nc_matmul(accs[i * spans + s](first(tiles[i].p), nl::ds(0, ws)),
                             stationary_T(first(pk), k, nl::ds(tiles[i].r0, tiles[i].p)), slab(nl::all, nl::ds(s * bank, ws)),
                             {.accumulate = k > 0});
            }
        });
      }
      return accs;
    };
    // Gate and up, a slab's columns of I at a time; h^T by TensorE transposes.
    for (int64_t c0 = 0; c0 < I; c0 += CW) {
      const int64_t w = std::min(CW, I - c0);
      const Tensor bg = bias_rows(b_gate, c0, w), bu = bias_rows(b_up, c0, w);
      const std::vector<Tensor> g_acc = accumulate(w_gate, xT, H, c0, w);
      std::vector<Tensor> gates(g_acc.size());
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * bank < w; ++s) {
          const int64_t pt = tiles[i].p, ws = std::min(bank, w - s * bank);
          const Tensor g = gate_ring.next()(first(pt), nl::ds(0, ws)), acc = g_acc[i * spans + s](first(pt), nl::ds(0, ws));
          sch.add([&] { isa::tensor_tensor(g, acc, bg(first(pt), nl::ds(s * bank, ws)), nl::add); });
          sch.add([&] { isa::activation(g, act_op, g); });
          gates[i * spans + s] = g;
        }
      const std::vector<Tensor> u_acc = accumulate(w_up, xT, H, c0, w);
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * bank < w; ++s) {
          const int64_t pt = tiles[i].p, t0 = tiles[i].r0, ws = std::min(bank, w - s * bank);
          const Tensor u = up_ring.next()(first(pt), nl::ds(0, ws)), h = h_ring.next()(first(pt), nl::ds(0, ws));
          const Tensor acc = u_acc[i * spans + s](first(pt), nl::ds(0, ws)), gate = gates[i * spans + s];
          sch.add([&] { isa::tensor_tensor(u, acc, bu(first(pt), nl::ds(s * bank, ws)), nl::add); });
          sch.add_any({[&] { isa::tensor_tensor(h, gate, u, nl::multiply, gpsimd); },
                       [&] { isa::tensor_tensor(h, gate, u, nl::multiply, vector); }});
          mlp::transpose_rows(sch, tr_ring, hT(all, nl::ds((c0 + s * bank) / P, ceil_div(ws, P)), nl::ds(t0, pt)), h);
        }
    }
    // Down, a slab's columns of H at a time, b_down added on the way out of PSUM.
    for (int64_t c0 = 0; c0 < H; c0 += CW) {
      const int64_t w = std::min(CW, H - c0);
      const Tensor bd = bias_rows(b_down, c0, w);
      const std::vector<Tensor> accs = accumulate(w_down, hT, I, c0, w);
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * bank < w; ++s) {
          const int64_t pt = tiles[i].p, t0 = tiles[i].r0, ws = std::min(bank, w - s * bank);
          const Tensor o = o_ring.next()(first(pt), nl::ds(0, ws)), acc = accs[i * spans + s](first(pt), nl::ds(0, ws));
          sch.add([&] { isa::tensor_tensor(o, acc, bd(first(pt), nl::ds(s * bank, ws)), nl::add); });
          sch.add([&] { isa::dma_copy(out(nl::ds(b0 + t0, pt), nl::ds(c0 + s * bank, ws)), o); });
        }
    }
  }
  sch.run();
  return out;
}

namespace mlp {

inline ExampleCase mlp_case(int64_t T, int64_t H, int64_t I, DType d, reference::GateActivation act,
                            std::string label) {
  return ExampleCase{{spec({T, H}, d), spec({H, I}, d), spec({H, I}, d), spec({I, H}, d), spec({I}, d), spec({I}, d),
                      spec({H}, d)},
                     Params{{"activation", double(int(act))}},
                     std::move(label)};
}

/** Inputs at the scale of a trained layer: x standard normal, each weight N(0, 1 / fan_in), biases
 *  N(0, 0.1), so that every stage has values of magnitude ~1. */
inline std::vector<RefTensor> mlp_inputs(const ExampleCase& c, CaseRng& r) {
  const int64_t H = c.inputs[0].shape[1], I = c.inputs[1].shape[1];
  const std::vector<double> scale{1.0, 1 / std::sqrt(double(H)), 1 / std::sqrt(double(H)), 1 / std::sqrt(double(I)),
                                  0.1, 0.1, 0.1};
  std::vector<RefTensor> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) in.push_back(random_input(c.inputs[i], r, scale[i]));
  return in;
}

}  // namespace mlp

inline KernelInfo gated_mlp_info() {
  using mlp::mlp_case;
  using reference::GateActivation;
  return KernelInfo{
      .name = "gated_mlp",
      .summary = "gated MLP (SwiGLU / GeGLU): (act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down",
      .doc = gated_mlp_doc,
      .inputs = {"x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"},
      .outputs = {"out"},
      .params = {{"activation", ParamKind::integer, 0, "the gate's activation: 0 silu, 1 gelu, 2 gelu (tanh form)"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "grad of x, every weight and bias by nikki.torch: the six products on the matmul kernel (gate "
                  "and up recomputed), the element-wise steps in torch (fp32); no backward kernel yet",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{gated_mlp(c.inputs, GateActivation(c.integer("activation")))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::gated_mlp(in[0], in[1], in[2], in[3], in[4], in[5], in[6],
                                                               GateActivation(p.integer("activation")))};
          },
      .make_inputs = mlp::mlp_inputs,
      .examples = {mlp_case(1, 8, 16, DType::float32, GateActivation::silu, "one token (decode), tiny"),
                   mlp_case(5, 130, 129, DType::float32, GateActivation::gelu_tanh, "H and I tails, gelu tanh"),
                   mlp_case(130, 200, 300, DType::bfloat16, GateActivation::gelu, "token, H and I tails, gelu"),
                   mlp_case(600, 256, 640, DType::bfloat16, GateActivation::silu, "two token blocks, SwiGLU")},
      .draw =
          [](CaseRng& r) {
            return mlp_case(r.size(1, 700), r.size(1, 400), r.size(1, 700, 512),
                            r.pick({DType::float32, DType::bfloat16, DType::float16}),
                            r.pick({GateActivation::silu, GateActivation::gelu, GateActivation::gelu_tanh}), "drawn");
          },
      .tolerance =
          [](const ExampleCase& c) {
            // fp32: sums over H and I and the activation's fp32 evaluation; 16-bit: h is rounded
            // to the dtype before the down projection, besides the output's rounding.
            return c.inputs[0].dtype == DType::float32 ? Tolerance{1e-4, 1e-4} : dtype_tolerance(c.inputs[0].dtype);
          },
      .benchmark =
          Benchmark{mlp_case(4096, 4096, 14336, DType::bfloat16, GateActivation::silu, "T=4096 H=4096 I=14336 bf16"),
                    Bound::tensor_engine,
                    [](const ExampleCase& c) {
                      const double T = double(c.inputs[0].shape[0]), H = double(c.inputs[0].shape[1]),
                                   I = double(c.inputs[1].shape[1]);
                      return 6 * T * H * I;
                    },
                    0.85},
  };
}

}  // namespace nikki::kernels
