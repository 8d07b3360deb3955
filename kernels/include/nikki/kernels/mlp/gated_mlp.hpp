// The gated MLP of transformer feed-forward blocks (SwiGLU, GeGLU): the Tensor engine with its
// weights streamed once per block of tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/mlp/gated_blocks.hpp"
#include "nikki/kernels/mlp/gated_mlp_reference.hpp"
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
  const ArgumentCheck check("gated_mlp", in.at(0), loc);
  const std::vector<std::string> names{"x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"};
  const std::vector<int64_t> dims = mlp::check_operands(check, in, names);
  const Tensor &x = in[0], &w_gate = in[1], &w_up = in[2], &w_down = in[3];
  const Tensor &b_gate = in[4], &b_up = in[5], &b_down = in[6];
  const int64_t T = dims[0], H = dims[1], I = dims[2];
  const int64_t P = nl::tile_size().pmax;
  Tensor out = nl::ndarray({T, H}, x.dtype(), nl::shared_hbm, "out");

  // The block is the widest (up to four tiles of tokens) whose x^T and h^T fit with the
  // streaming tiles.
  toolkit::Budget budget(check);
  mlp::GatedBlocks blocks(budget, check, H, I, x.dtype(), act, std::min(4 * P, ceil_div(T, P) * P), P, true);
  toolkit::TaskScheduler sch;
  const int64_t TB = blocks.block();
  for (int64_t b0 = 0; b0 < T; b0 += TB) {
    const std::vector<toolkit::RowTile> tiles = toolkit::row_tiles(std::min(TB, T - b0), P);
    mlp::GatedBlocks::Io io{
        .load_rows =
            [&](const Tensor& rows, size_t i) {
              sch.add([&] { isa::dma_copy(rows, x(nl::ds(b0 + tiles[i].r0, tiles[i].p), nl::all)); });
            },
        .w_gate = mlp::static_blocks(w_gate),
        .w_up = mlp::static_blocks(w_up),
        .w_down = mlp::static_blocks(w_down),
        .b_gate = b_gate,
        .b_up = b_up,
        .b_down = b_down,
        .leave_psum = {},
        .store =
            [&](const Tensor& o, size_t i, int64_t c0) {
              sch.add([&] { isa::dma_copy(out(nl::ds(b0 + tiles[i].r0, tiles[i].p), nl::ds(c0, o.shape()[1])), o); });
            },
    };
    blocks.run(sch, tiles, io);
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
