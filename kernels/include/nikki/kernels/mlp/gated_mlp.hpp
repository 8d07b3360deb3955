// The gated MLP of transformer feed-forward blocks (SwiGLU, GeGLU): the Tensor engine with its
// weights streamed once per block of tokens.
#pragma once

#include <algorithm>
#include <cmath>
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

inline constexpr const char* gated_mlp_fp8_doc = R"(Gated MLP with fp8 weights and per-column dequantization scales.

Dimensions: x [T, H], w_gate [H, I], w_up [H, I], w_down [I, H], gate_scale [I], up_scale [I],
            down_scale [H], b_gate [I], b_up [I], b_down [H] -> out [T, H]; any T, H, I >= 1.
Args:       x and the biases: HBM tensors of one dtype, bfloat16 or float16 (TensorE pairs fp8
            with 16-bit operands only; zero biases for none). w_gate, w_up, w_down: fp8 of one format, float8_e4m3fn (OCP, as
            torch quantizes), Neuron's float8_e4m3 or float8_e5m2. gate_scale, up_scale,
            down_scale: float32 scales of each weight's output columns (w = w_fp8 * scale).
            activation: 0 silu (SwiGLU), 1 gelu (erf form), 2 gelu with the tanh approximation.
Returns:    out, x's dtype.
Notes:      gated_mlp's schedule with the weights streamed as fp8 (half the HBM bytes of bf16)
            and multiplied on TensorE against x^T and h^T in x's dtype, accumulating in fp32
            PSUM; each accumulator is scaled by its columns' scales (VectorE) as it leaves PSUM,
            then the bias is added. trn2's TensorE reads float8_e4m3 (max 240): e4m3fn weights
            are read as e4m3, which has the same bits for every value within +-240, so quantize
            to +-240 (amax / 240 scales). Inference only.
Pseudocode: g = (x @ w_gate.float()) * gate_scale + b_gate
            u = (x @ w_up.float()) * up_scale + b_up
            h = act(g) * u                                           # rounded to x's dtype
            out = (h @ w_down.float()) * down_scale + b_down)";

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

namespace mlp {

/** Checks gated_mlp_fp8's operands (x, w_gate, w_up, w_down, gate_scale, up_scale, down_scale,
 *  b_gate, b_up, b_down); returns {T, H, I}. */
inline std::vector<int64_t> check_fp8_operands(const ArgumentCheck& check, const std::vector<Tensor>& in,
                                               const std::vector<std::string>& names) {
  const Tensor& x = in[0];
  check.require(x.ndim() == 2, "expected a 2-D tensor x, got " + x.shape().str(), "reshape x to [tokens, hidden]");
  check.require(x.dtype() == DType::bfloat16 || x.dtype() == DType::float16,
                "x is " + std::string(dtype_name(x.dtype())) +
                    ": TensorE multiplies fp8 weights with bfloat16 or float16 activations (float32 operands pair "
                    "only with float32)",
                "cast x to bfloat16, or dequantize the weights and call gated_mlp");
  const int64_t T = x.shape()[0], H = x.shape()[1];
  check.require(in[1].ndim() == 2 && in[1].shape()[0] == H,
                "w_gate must be [H, I] with H = " + std::to_string(H) + " (x's last dim), got " + in[1].shape().str(),
                "pass the gate projection as [hidden, intermediate] (torch's Linear.weight transposed)");
  const int64_t I = in[1].shape()[1];
  const std::vector<Shape> want{{T, H}, {H, I}, {H, I}, {I, H}, {I}, {I}, {H}, {I}, {I}, {H}};
  for (size_t i = 0; i < in.size(); ++i) {
    check.require(in[i].shape() == want[i], "'" + names[i] + "' must have shape " + want[i].str() + ", got " +
                                                in[i].shape().str(),
                  "x [T, H], w_gate and w_up [H, I], w_down [I, H], gate_scale and up_scale [I], down_scale [H], "
                  "b_gate and b_up [I], b_down [H]");
    const DType d = in[i].dtype();
    const bool weight = i >= 1 && i <= 3, scale = i >= 4 && i <= 6;
    if (weight)
      check.require(is_fp8(d) && d == in[1].dtype(),
                    "'" + names[i] + "' is " + std::string(dtype_name(d)) + "; the weights are fp8 of one format" +
                        (i > 1 ? " (w_gate is " + std::string(dtype_name(in[1].dtype())) + ")" : std::string()),
                    "quantize the weights to float8_e4m3fn, float8_e4m3 or float8_e5m2 with per-column scales, or "
                    "call gated_mlp for 16/32-bit weights");
    else if (scale)
      check.require(d == DType::float32, "'" + names[i] + "' is " + std::string(dtype_name(d)) + ", not float32",
                    "pass the dequantization scales as float32");
    else
      check.require(d == x.dtype(), "'" + names[i] + "' is " + std::string(dtype_name(d)) + " but x is " +
                                        std::string(dtype_name(x.dtype())),
                    "pass the biases in x's dtype");
  }
  return {T, H, I};
}

/** The dense gated MLP's operands as its schedule reads them; scales with fp8 weights only. */
struct DenseOperands {
  Tensor x, w_gate, w_up, w_down, b_gate, b_up, b_down;
  std::optional<Tensor> s_gate, s_up, s_down;
};

/** The dense gated MLP over blocks of up to 512 tokens (gated_mlp_doc's schedule). */
inline Tensor dense_gated_mlp(const ArgumentCheck& check, const DenseOperands& op, reference::GateActivation act) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const Tensor& x = op.x;
  const int64_t T = x.shape()[0], H = x.shape()[1], I = op.w_gate.shape()[1];
  const int64_t P = nl::tile_size().pmax;
  Tensor out = nl::ndarray({T, H}, x.dtype(), nl::shared_hbm, "out");
  // fp8 weights stream as TensorE reads them (e4m3fn's bits as e4m3).
  auto weight = [](const Tensor& w) { return static_blocks(toolkit::as_tensor_engine_fp8(w)); };
  auto scale = [](const std::optional<Tensor>& s) {
    return s ? std::optional<ColumnBlock>(static_columns(*s)) : std::nullopt;
  };

  // The block is the widest (up to four tiles of tokens) whose x^T and h^T fit with the
  // streaming tiles.
  toolkit::Budget budget(check);
  GatedBlocks blocks(budget, check, H, I, x.dtype(), act, std::min(4 * P, ceil_div(T, P) * P), P, true,
                     op.w_gate.dtype());
  toolkit::TaskScheduler sch;
  const int64_t TB = blocks.block();
  for (int64_t b0 = 0; b0 < T; b0 += TB) {
    const std::vector<toolkit::RowTile> tiles = toolkit::row_tiles(std::min(TB, T - b0), P);
    GatedBlocks::Io io{
        .load_rows =
            [&](const Tensor& rows, size_t i) {
              sch.add([&] { isa::dma_copy(rows, x(nl::ds(b0 + tiles[i].r0, tiles[i].p), nl::all)); });
            },
        .w_gate = weight(op.w_gate),
        .w_up = weight(op.w_up),
        .w_down = weight(op.w_down),
        .b_gate = op.b_gate,
        .b_up = op.b_up,
        .b_down = op.b_down,
        .s_gate = scale(op.s_gate),
        .s_up = scale(op.s_up),
        .s_down = scale(op.s_down),
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

}  // namespace mlp

/** @brief out = gated MLP of x; see gated_mlp_doc. Operands: x, w_gate, w_up, w_down, b_gate,
 *  b_up, b_down. */
inline Tensor gated_mlp(const std::vector<Tensor>& in, reference::GateActivation act, Loc loc = Loc::current()) {
  const ArgumentCheck check("gated_mlp", in.at(0), loc);
  mlp::check_operands(check, in, {"x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down"});
  return mlp::dense_gated_mlp(check, {in[0], in[1], in[2], in[3], in[4], in[5], in[6]}, act);
}

/** @brief out = gated MLP of x with fp8 weights; see gated_mlp_fp8_doc. Operands: x, w_gate, w_up,
 *  w_down, gate_scale, up_scale, down_scale, b_gate, b_up, b_down. */
inline Tensor gated_mlp_fp8(const std::vector<Tensor>& in, reference::GateActivation act, Loc loc = Loc::current()) {
  const ArgumentCheck check("gated_mlp_fp8", in.at(0), loc);
  mlp::check_fp8_operands(check, in,
                          {"x", "w_gate", "w_up", "w_down", "gate_scale", "up_scale", "down_scale", "b_gate", "b_up",
                           "b_down"});
  return mlp::dense_gated_mlp(check, {in[0], in[1], in[2], in[3], in[7], in[8], in[9], in[4], in[5], in[6]}, act);
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

inline ExampleCase mlp_fp8_case(int64_t T, int64_t H, int64_t I, DType d, DType w, reference::GateActivation act,
                                std::string label) {
  const DType f = DType::float32;
  return ExampleCase{{spec({T, H}, d), spec({H, I}, w), spec({H, I}, w), spec({I, H}, w), spec({I}, f), spec({I}, f),
                      spec({H}, f), spec({I}, d), spec({I}, d), spec({H}, d)},
                     Params{{"activation", double(int(act))}},
                     std::move(label)};
}

/** Quantized as a trained layer's weights are: fp8 values of magnitude up to ~100 (inside e4m3's
 *  +-240) whose per-column scales, ~1 / (32 sqrt(fan_in)) and all positive, restore
 *  N(0, 1 / fan_in) weights; x standard normal, biases N(0, 0.1). */
inline std::vector<RefTensor> mlp_fp8_inputs(const ExampleCase& c, CaseRng& r) {
  const int64_t H = c.inputs[0].shape[1], I = c.inputs[1].shape[1];
  const std::vector<double> scale{1, 32, 32, 32, 1, 1, 1, 0.1, 0.1, 0.1};
  std::vector<RefTensor> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) in.push_back(random_input(c.inputs[i], r, scale[i]));
  for (size_t i : {4, 5, 6}) {
    const double fan_in = double(i == 6 ? I : H);
    for (double& v : in[i].data) v = round_to(DType::float32, toolkit::drawn_fp8_scale(v, fan_in));
  }
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

inline KernelInfo gated_mlp_fp8_info() {
  using mlp::mlp_fp8_case;
  using reference::GateActivation;
  const DType bf16 = DType::bfloat16, e4m3fn = DType::float8_e4m3fn;
  return KernelInfo{
      .name = "gated_mlp_fp8",
      .summary = "gated MLP with fp8 weights and per-column scales: act((x @ w_gate) * s_gate + b_gate) * ((x @ "
                 "w_up) * s_up + b_up) @ w_down * s_down + b_down",
      .doc = gated_mlp_fp8_doc,
      .inputs = {"x", "w_gate", "w_up", "w_down", "gate_scale", "up_scale", "down_scale", "b_gate", "b_up", "b_down"},
      .outputs = {"out"},
      .params = {{"activation", ParamKind::integer, 0, "the gate's activation: 0 silu, 1 gelu, 2 gelu (tanh form)"}},
      .dtypes = {DType::float8_e4m3fn, DType::float8_e4m3, DType::float8_e5m2, DType::bfloat16, DType::float16,
                 DType::float32},
      .backward = "",
      .gradient = "none: an inference kernel (fp8 weights are not trained through it)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{gated_mlp_fp8(c.inputs, GateActivation(c.integer("activation")))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            const reference::ColumnScales scales{in[4], in[5], in[6]};
            return std::vector<RefTensor>{reference::gated_mlp(in[0], in[1], in[2], in[3], in[7], in[8], in[9],
                                                               GateActivation(p.integer("activation")), &scales)};
          },
      .make_inputs = mlp::mlp_fp8_inputs,
      .examples = {mlp_fp8_case(1, 8, 16, bf16, e4m3fn, GateActivation::silu, "one token (decode), tiny"),
                   mlp_fp8_case(5, 130, 129, bf16, DType::float8_e4m3, GateActivation::gelu_tanh,
                                "Neuron's e4m3, H and I tails, gelu tanh"),
                   mlp_fp8_case(130, 200, 300, DType::float16, DType::float8_e5m2, GateActivation::gelu,
                                "e5m2 weights, fp16 x, token tail"),
                   mlp_fp8_case(600, 256, 640, bf16, e4m3fn, GateActivation::silu, "two token blocks, SwiGLU")},
      .draw =
          [](CaseRng& r) {
            return mlp_fp8_case(r.size(1, 700), r.size(1, 400), r.size(1, 700, 512),
                                r.pick({DType::bfloat16, DType::float16}),
                                r.pick({DType::float8_e4m3fn, DType::float8_e4m3, DType::float8_e5m2}),
                                r.pick({GateActivation::silu, GateActivation::gelu, GateActivation::gelu_tanh}),
                                "drawn");
          },
      .tolerance =
          [](const ExampleCase& c) {
            // The fp8 products are exact and sum in fp32; as gated_mlp's, h is rounded to x's
            // dtype before the down projection, besides the output's rounding.
            return dtype_tolerance(c.inputs[0].dtype);
          },
      .benchmark =
          Benchmark{mlp_fp8_case(8, 4096, 14336, bf16, e4m3fn, GateActivation::silu,
                                 "T=8 (decode) H=4096 I=14336, bf16 x, e4m3fn weights"),
                    Bound::hbm,
                    {},
                    0.70,
                    [](const ExampleCase& c) {  // the weights once, their scales, x and out
                      const double T = double(c.inputs[0].shape[0]), H = double(c.inputs[0].shape[1]),
                                   I = double(c.inputs[1].shape[1]);
                      return 3 * H * I + 4 * (2 * I + H) + 2 * (2 * T * H + 2 * I + H);
                    }},
  };
}

}  // namespace nikki::kernels
