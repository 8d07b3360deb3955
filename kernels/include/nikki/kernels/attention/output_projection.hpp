// The attention block's output projection, out = attn @ w_o + bias + residual, and its backward.
//
// Both are matrix products on the Tensor engine, built on the library's matmul: the forward adds
// bias and residual to the fp32 accumulators before the one rounding (matmul's epilogue). The
// backward needs two products with different contractions:
// - grad_w_o = attn^T @ grad_out contracts over the tokens, which are attn's rows: attn is
//   already the K-major (stationary) operand, so its tiles load with no transposes at all;
// - grad_attn = grad_out @ w_o^T contracts over w_o's columns: w_o is transposed once on the
//   Tensor engine into an HBM scratch [N, K] (it is read once per row block afterwards), while
//   matmul transposes grad_out's rows on chip as usual.
// grad_bias is the column sums of grad_out (a product with a column of ones, K-major, on the
// Tensor engine) and grad_residual is grad_out itself (one HBM-to-HBM copy).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "nikki/kernels/attention/attention_common.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/matmul/matmul_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* output_projection_doc = R"(Attention output projection with bias and residual: attn @ w_o + bias + residual.

Dimensions: attn [B, S, K] (K = heads * head_dim), w_o [K, N], bias [N], residual [B, S, N]
            -> out [B, S, N]; any sizes (edge tiles take the tails).
Args:       attn: the attention output with the heads concatenated, float32 / bfloat16 / float16.
            w_o: the projection weight in the [in, out] layout (torch.nn.Linear's weight
              transposed); bias, residual: added (pass zeros for none). One dtype for all four.
Returns:    out in attn's dtype.
Notes:      matmul's schedule (row blocks of up to 512 tokens, w_o streamed in chunks, attn
            transposed on chip once per block). The products accumulate in fp32 PSUM; residual
            and bias are added to the fp32 sums as they leave PSUM, and the result is rounded
            once (torch rounds the product, then each addition, in 16-bit dtypes).
Pseudocode: out = attn.reshape(B * S, K) @ w_o + bias + residual.reshape(B * S, N))";

inline constexpr const char* output_projection_bwd_doc = R"(Backward of output_projection.

Dimensions: attn [B, S, K], w_o [K, N], grad_out [B, S, N] -> grad_attn [B, S, K],
            grad_w_o [K, N], grad_bias [N], grad_residual [B, S, N].
Args:       attn, w_o: the forward's inputs; grad_out: the gradient of the loss with respect to
            out. One dtype.
Returns:    the four gradients in that dtype.
Notes:      grad_w_o takes attn as the K-major operand of the Tensor engine as it lies in HBM (no
            transposes); grad_attn reads w_o^T from an HBM scratch written by Tensor-engine
            transposes of w_o. Every product accumulates in fp32 and is rounded once.
Pseudocode: grad_attn = grad_out @ w_o.T; grad_w_o = attn.T @ grad_out (tokens flattened)
            grad_bias = grad_out.sum(tokens); grad_residual = grad_out)";

namespace attention {

/** @brief Checks output_projection's operands; returns (M tokens, K, N). */
inline std::array<int64_t, 3> check_projection(const ArgumentCheck& check, const Tensor& attn, const Tensor& w_o) {
  check.require(attn.ndim() == 3, "attn must be 3-D [batch, seq, heads * head_dim], got " + attn.shape().str(),
                "merge the heads: attn.transpose(1, 2).reshape(B, S, H * D)");
  check.require(w_o.ndim() == 2 && w_o.shape()[0] == attn.shape()[2],
                "w_o must be [K, N] with K = attn's last dim " + std::to_string(attn.shape()[2]) + ", got " +
                    w_o.shape().str(),
                "pass the weight as [in, out] (torch.nn.Linear's weight.T)");
  const DType t = attn.dtype();
  check.require(t == DType::float32 || t == DType::bfloat16 || t == DType::float16,
                "attn must be float32, bfloat16 or float16, got " + std::string(dtype_name(t)));
  check.require(w_o.dtype() == t, "w_o must have attn's dtype " + std::string(dtype_name(t)) + ", got " +
                                      std::string(dtype_name(w_o.dtype())));
  return {attn.shape()[0] * attn.shape()[1], attn.shape()[2], w_o.shape()[1]};
}

/**
 * @brief dst [C, R] (HBM) = src [R, C] (HBM) transposed on the Tensor engine: blocks of 4 x 4
 * 128-tiles, each loaded as 4 row runs, transposed into one PSUM tile per 128 columns, copied
 * out (Vector or Scalar engine) and stored as rows of 512.
 */
inline void transpose_into(const ArgumentCheck& check, const Tensor& dst, const Tensor& src) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const int64_t P = nl::tile_size().pmax, R = src.shape()[0], C = src.shape()[1];
  const DType dt = src.dtype();
  constexpr int64_t kTiles = 4;  // 128-tiles per block side
  const int64_t side = kTiles * P;
  toolkit::Budget budget(check);
  toolkit::Ring stage_ring = budget.sbuf_ring({P, kTiles, side}, dt, 3, "transpose_rows");
  toolkit::Ring out_ring = budget.sbuf_ring({P, side}, dt, 4, "transposed_rows");
  toolkit::Ring psum_ring = budget.psum_ring({P, kTiles, P}, dt, 4, "transpose_psum");
  toolkit::TaskScheduler sch;
  for (int64_t r0 = 0; r0 < R; r0 += side)
    for (int64_t c0 = 0; c0 < C; c0 += side) {
      const int64_t rr = std::min(side, R - r0), cc = std::min(side, C - c0);
      const int64_t rtiles = ceil_div(rr, P), ctiles = ceil_div(cc, P);
      const Tensor stage = stage_ring.next();
      for (int64_t i = 0; i < rtiles; ++i) {
        const int64_t pr = std::min(P, rr - i * P);
        sch.add([&] { isa::dma_copy(stage(first(pr), i, nl::ds(0, cc)), src(nl::ds(r0 + i * P, pr), nl::ds(c0, cc))); });
      }
      for (int64_t j = 0; j < ctiles; ++j) {
        const int64_t pc = std::min(P, cc - j * P);
        const Tensor ps = psum_ring.next(), o = out_ring.next();
        sch.add([&] {
          for (int64_t i = 0; i < rtiles; ++i) {
            const int64_t pr = std::min(P, rr - i * P);
            isa::nc_transpose(ps(first(pc), i, first(pr)), stage(first(pr), i, nl::ds(j * P, pc)));
          }
        });
        // Columns of full row tiles, then the last (partial) one.
        auto evacuate = [&](Engine e) {
          const int64_t full = rr / P;
          if (full > 0)
            attention::copy_out(o(first(pc), nl::ds(0, full * P)).reshape_dim(1, {full, P}), ps(first(pc), nl::ds(0, full), nl::all), e);
          if (full < rtiles)
            attention::copy_out(o(first(pc), nl::ds(full * P, rr - full * P)), ps(first(pc), full, first(rr - full * P)), e);
        };
        sch.add_any({[&] { evacuate(Engine::vector); }, [&] { evacuate(Engine::scalar); }});
        sch.add([&] { isa::dma_copy(dst(nl::ds(c0 + j * P, pc), nl::ds(r0, rr)), o(first(pc), nl::ds(0, rr))); });
      }
    }
  sch.run();
}

/**
 * @brief sums [N] = the column sums of rows [M, N] (HBM), in fp32 on the Tensor engine and rounded
 * once: ones^T @ rows, with the ones [M, 1] K-major (matmul's stationary operand as it loads).
 */
inline void column_sums(const Tensor& sums, const Tensor& rows, Loc loc) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const int64_t P = nl::tile_size().pmax, M = rows.shape()[0], N = rows.shape()[1];
  const DType dt = rows.dtype();
  Tensor ones = nl::ndarray({M, 1}, dt, nl::hbm, "ones");
  {
    const int64_t cols = ceil_div(M, P);
    Tensor ones_tile = nl::ndarray({P, cols}, dt, nl::sbuf, "ones_tile");
    isa::memset(ones_tile, 1.0, isa::gpsimd_engine);
    if (const int64_t full = M / P; full > 0)
      isa::dma_copy(ones(nl::ds(0, full * P), 0).reshape({P, full}), ones_tile(nl::all, nl::ds(0, full)));
    if (M % P > 0) isa::dma_copy(ones(nl::ds(M / P * P, M % P), nl::all), ones_tile(nl::ds(0, M % P), nl::ds(0, 1)));
  }
  matmul(ones, rows, MatmulOptions{.a_transposed = true, .out = sums.reshape({1, N})}, loc);
}

}  // namespace attention

/** @brief out = attn @ w_o + bias + residual; see output_projection_doc. */
inline Tensor output_projection(const Tensor& attn, const Tensor& w_o, const Tensor& bias, const Tensor& residual,
                                Loc loc = Loc::current()) {
  const ArgumentCheck check("output_projection", attn, loc);
  const auto [M, K, N] = attention::check_projection(check, attn, w_o);
  const int64_t B = attn.shape()[0], S = attn.shape()[1];
  check.require(bias.shape() == Shape{N} && bias.dtype() == attn.dtype(),
                "bias must be [" + std::to_string(N) + "] " + std::string(dtype_name(attn.dtype())) + ", got " +
                    bias.shape().str() + " " + std::string(dtype_name(bias.dtype())));
  check.require(residual.shape() == Shape{B, S, N} && residual.dtype() == attn.dtype(),
                "residual must be [" + std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(N) + "] " +
                    std::string(dtype_name(attn.dtype())) + ", got " + residual.shape().str() + " " +
                    std::string(dtype_name(residual.dtype())));
  Tensor out = nl::ndarray({B, S, N}, attn.dtype(), nl::shared_hbm, "out");
  matmul(attn.reshape({M, K}), w_o,
         MatmulOptions{.bias = bias, .residual = residual.reshape({M, N}), .out = out.reshape({M, N})}, loc);
  return out;
}

/** @brief {grad_attn, grad_w_o, grad_bias, grad_residual}; see output_projection_bwd_doc. */
inline std::vector<Tensor> output_projection_bwd(const Tensor& attn, const Tensor& w_o, const Tensor& grad_out,
                                                 Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const ArgumentCheck check("output_projection_bwd", attn, loc);
  const auto [M, K, N] = attention::check_projection(check, attn, w_o);
  const int64_t B = attn.shape()[0], S = attn.shape()[1];
  const DType dt = attn.dtype();
  check.require(grad_out.shape() == Shape{B, S, N} && grad_out.dtype() == dt,
                "grad_out must be [" + std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(N) + "] " +
                    std::string(dtype_name(dt)) + ", got " + grad_out.shape().str() + " " +
                    std::string(dtype_name(grad_out.dtype())));
  Tensor grad_attn = nl::ndarray({B, S, K}, dt, nl::shared_hbm, "grad_attn");
  Tensor grad_w_o = nl::ndarray({K, N}, dt, nl::shared_hbm, "grad_w_o");
  Tensor grad_bias = nl::ndarray({N}, dt, nl::shared_hbm, "grad_bias");
  Tensor grad_residual = nl::ndarray({B, S, N}, dt, nl::shared_hbm, "grad_residual");
  const Tensor g2 = grad_out.reshape({M, N});

  isa::dma_copy(grad_residual, grad_out);
  // w_o^T first: its transposes and stores overlap the weight gradient's products.
  Tensor w_t = nl::ndarray({N, K}, dt, nl::hbm, "w_o_transposed");
  attention::transpose_into(check, w_t, w_o);
  matmul(attn.reshape({M, K}), g2, MatmulOptions{.a_transposed = true, .out = grad_w_o}, loc);
  attention::column_sums(grad_bias, g2, loc);
  matmul(g2, w_t, MatmulOptions{.out = grad_attn.reshape({M, K})}, loc);
  return {grad_attn, grad_w_o, grad_bias, grad_residual};
}

namespace attention {

inline ExampleCase projection_case(bool backward, int64_t B, int64_t S, int64_t K, int64_t N, DType t,
                                   std::string label) {
  std::vector<TensorSpec> in{spec({B, S, K}, t), spec({K, N}, t)};
  if (backward) {
    in.push_back(spec({B, S, N}, t));
  } else {
    in.push_back(spec({N}, t));
    in.push_back(spec({B, S, N}, t));
  }
  return ExampleCase{std::move(in), {}, std::move(label)};
}

inline std::vector<ExampleCase> projection_examples(bool backward) {
  const DType f32 = DType::float32, bf16 = DType::bfloat16, f16 = DType::float16;
  return {projection_case(backward, 1, 3, 64, 40, f32, "a few tokens, narrow"),
          projection_case(backward, 2, 100, 200, 130, bf16, "batch, tails in every dim"),
          projection_case(backward, 1, 130, 256, 520, bf16, "two column tiles"),
          projection_case(backward, 2, 300, 96, 64, f16, "several row tiles, one k tile"),
          projection_case(backward, 1, 2, 40000, 3, f32, "large K: blocks summed through HBM, then the epilogue")};
}

inline ExampleCase draw_projection(CaseRng& r, bool backward) {
  return projection_case(backward, r.uniform(1, 2), r.size(1, 400), r.size(1, 600), r.size(1, 700, 512),
                         r.pick({DType::float32, DType::bfloat16, DType::float16}), "drawn");
}

/** @brief Useful FLOPs: 2 M K N per product (one forward, two backward; the column sums and the
 *  transposes of the backward are not counted). */
inline double projection_flops(const ExampleCase& c, int64_t products) {
  const Shape& a = c.inputs[0].shape;
  return 2.0 * double(products) * double(a[0] * a[1]) * double(a[2]) * double(c.inputs[1].shape[1]);
}

}  // namespace attention

namespace reference {

/** @brief attn [B, S, K] @ w_o [K, N] + bias + residual. */
inline RefTensor output_projection(const RefTensor& attn, const RefTensor& w_o, const RefTensor& bias,
                                   const RefTensor& residual) {
  const int64_t M = attn.shape[0] * attn.shape[1], K = attn.shape[2], N = w_o.shape[1];
  RefTensor a2(Shape{M, K});
  a2.data = attn.data;
  RefTensor out = matmul(a2, w_o);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) out[m * N + n] += bias[n] + residual[m * N + n];
  out.shape = residual.shape;
  return out;
}

/** @brief (grad_attn, grad_w_o, grad_bias, grad_residual) of output_projection. */
inline std::vector<RefTensor> output_projection_backward(const RefTensor& attn, const RefTensor& w_o,
                                                         const RefTensor& grad_out) {
  const int64_t M = attn.shape[0] * attn.shape[1], K = attn.shape[2], N = w_o.shape[1];
  RefTensor grad_attn(attn.shape), grad_w(w_o.shape), grad_bias(Shape{N});
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const double g = grad_out[m * N + n];
      grad_bias[n] += g;
      for (int64_t k = 0; k < K; ++k) {
        grad_attn[m * K + k] += g * w_o[k * N + n];
        grad_w[k * N + n] += attn[m * K + k] * g;
      }
    }
  return {grad_attn, grad_w, grad_bias, grad_out};
}

}  // namespace reference

inline KernelInfo output_projection_info() {
  return KernelInfo{
      .name = "output_projection",
      .summary = "attention output projection attn @ w_o + bias + residual",
      .doc = output_projection_doc,
      .inputs = {"attn", "w_o", "bias", "residual"},
      .outputs = {"out"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "output_projection_bwd",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{output_projection(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3])};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::output_projection(in[0], in[1], in[2], in[3])};
          },
      .make_inputs = {},
      .examples = attention::projection_examples(false),
      .draw = [](CaseRng& r) { return attention::draw_projection(r, false); },
      .tolerance = {},
      .benchmark = Benchmark{attention::projection_case(false, 1, 4096, 4096, 4096, DType::bfloat16,
                                                        "[1, 4096, 4096] @ [4096, 4096] bf16"),
                             Bound::tensor_engine, [](const ExampleCase& c) { return attention::projection_flops(c, 1); },
                             0.70},
  };
}

inline KernelInfo output_projection_bwd_info() {
  return KernelInfo{
      .name = "output_projection_bwd",
      .summary = "gradients of the attention output projection",
      .doc = output_projection_bwd_doc,
      .inputs = {"attn", "w_o", "grad_out"},
      .outputs = {"grad_attn", "grad_w_o", "grad_bias", "grad_residual"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return output_projection_bwd(c.inputs[0], c.inputs[1], c.inputs[2]); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return reference::output_projection_backward(in[0], in[1], in[2]);
          },
      .make_inputs = {},
      .examples = attention::projection_examples(true),
      .draw = [](CaseRng& r) { return attention::draw_projection(r, true); },
      .tolerance = {},
      .benchmark = Benchmark{attention::projection_case(true, 1, 4096, 4096, 4096, DType::bfloat16,
                                                        "[1, 4096, 4096] @ [4096, 4096] bf16"),
                             Bound::tensor_engine, [](const ExampleCase& c) { return attention::projection_flops(c, 2); },
                             0.70},
  };
}

}  // namespace nikki::kernels
