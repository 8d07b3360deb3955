// Layer normalization over the last axis, and its backward.
#pragma once

#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/norm/norm_cases.hpp"
#include "nikki/kernels/norm/row_norm_backward.hpp"
#include "nikki/kernels/norm/row_norm_forward.hpp"

namespace nikki::kernels {

inline constexpr const char* layernorm_doc = R"(Layer normalization over the last axis of a 2-D tensor (torch.nn.functional.layer_norm).

Dimensions: x [R, H], gamma [H], beta [H] -> out [R, H], mean [R], rstd [R]; any R and H.
Args:       x: HBM tensor, float32 / bfloat16 / float16.
            gamma, beta: the per-column scale and shift, float32 / bfloat16 / float16.
            eps: added to the variance inside the square root (default 1e-5).
Returns:    out in x's dtype; mean and rstd in float32 (saved for the backward).
Notes:      biased variance, as torch. Statistics come from bn_stats over chunks of
            bn_stats_fmax columns, merged by bn_aggr; everything is computed in fp32 and rounded
            once, on the store. The normalized rows are transposed on the TensorE so that gamma
            and beta become per-partition operands of one ScalarE activation per 128 columns.
            Partition q owns a contiguous block of rows, so each DMA moves whole rows (several
            per partition when R is large). Rows too wide to keep in SBUF are read twice.
Pseudocode: mean = sum(x, axis=1) / H; var = sum((x - mean)^2, axis=1) / H
            rstd = 1 / sqrt(var + eps); out = (x - mean) * rstd * gamma + beta)";

/** @brief {out, mean, rstd} = layernorm(x, gamma, beta); see layernorm_doc. */
inline std::vector<Tensor> layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5,
                                     Loc loc = Loc::current()) {
  return norm_detail::forward(norm_detail::Kind::layer, x, gamma, beta, eps, loc);
}

inline KernelInfo layernorm_info() {
  return KernelInfo{
      .name = "layernorm",
      .summary = "layer normalization over the last axis of a 2-D tensor",
      .doc = layernorm_doc,
      .inputs = {"x", "gamma", "beta"},
      .outputs = {"out", "mean", "rstd"},
      .params = {{"eps", ParamKind::real, 1e-5, "added to the variance inside the square root"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "layernorm_bwd",
      .saved_outputs = {"mean", "rstd"},
      .body = [](const KernelCall& c) { return layernorm(c.inputs[0], c.inputs[1], c.inputs[2], c.real("eps")); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::layernorm(in[0], in[1], in[2], p.real("eps"));
          },
      .make_inputs = {},
      .examples = {{{spec({300, 77}, DType::bfloat16), spec({77}, DType::bfloat16), spec({77}, DType::bfloat16)},
                    {},
                    "row and column tails"},
                   {{spec({1, 1}, DType::float32), spec({1}, DType::float32), spec({1}, DType::float32)}, {}, "tiny"},
                   {{spec({256, 600}, DType::float32), spec({600}, DType::float32), spec({600}, DType::float32)},
                    {{"eps", 1e-3}},
                    "two rows per partition, fp32"},
                   {{spec({2, 20000}, DType::bfloat16), spec({20000}, DType::bfloat16), spec({20000}, DType::bfloat16)},
                    {},
                    "wide rows"},
                   {{spec({2, 40000}, DType::bfloat16), spec({40000}, DType::float32), spec({40000}, DType::float32)},
                    {},
                    "rows too wide for SBUF, streamed"}},
      .draw = [](CaseRng& r) { return norm_detail::draw_case(r, norm_detail::Kind::layer, false); },
      .tolerance = {},
      .benchmark = Benchmark{norm_detail::benchmark_case(norm_detail::Kind::layer, false), Bound::hbm, {}, 0.70},
  };
}

inline constexpr const char* layernorm_bwd_doc = R"(Backward of layernorm over the last axis.

Dimensions: x [R, H], gamma [H], mean [R], rstd [R], grad_out [R, H]
            -> grad_x [R, H], grad_gamma [H], grad_beta [H].
Args:       x, gamma: the forward's inputs; mean, rstd: its saved outputs (float32);
            grad_out: the gradient of the loss with respect to out.
Returns:    grad_x in x's dtype; grad_gamma and grad_beta in gamma's dtype.
Notes:      two passes over each group of rows: the first computes xhat and g = grad_out * gamma,
            their row sums (ScalarE accumulators) and, on the TensorE, the column sums for
            grad_gamma and grad_beta, accumulated in fp32 PSUM across partitions and all rows
            (a matmul against a ones vector per 128 columns); the second forms grad_x. Computed
            in fp32; each output is rounded once.
Pseudocode: xhat = (x - mean) * rstd; g = grad_out * gamma
            grad_x = rstd * (g - mean(g, axis=1) - xhat * mean(g * xhat, axis=1))
            grad_gamma = sum(grad_out * xhat, axis=0); grad_beta = sum(grad_out, axis=0))";

/** @brief {grad_x, grad_gamma, grad_beta}; see layernorm_bwd_doc. */
inline std::vector<Tensor> layernorm_bwd(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                                         const Tensor& grad_out, Loc loc = Loc::current()) {
  return norm_detail::backward(norm_detail::Kind::layer, x, gamma, mean, rstd, grad_out, loc);
}

inline KernelInfo layernorm_bwd_info() {
  return KernelInfo{
      .name = "layernorm_bwd",
      .summary = "gradients of layer normalization over the last axis",
      .doc = layernorm_bwd_doc,
      .inputs = {"x", "gamma", "mean", "rstd", "grad_out"},
      .outputs = {"grad_x", "grad_gamma", "grad_beta"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) {
        return layernorm_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]);
      },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return reference::layernorm_backward(in[0], in[1], in[2], in[3], in[4]);
          },
      .make_inputs = [](const ExampleCase& c, CaseRng& r) { return norm_detail::backward_inputs(c, r, norm_detail::Kind::layer); },
      .examples = {{{spec({300, 77}, DType::bfloat16), spec({77}, DType::bfloat16), spec({300}, DType::float32),
                     spec({300}, DType::float32), spec({300, 77}, DType::bfloat16)},
                    {},
                    "row and column tails"},
                   {{spec({1, 1}, DType::float32), spec({1}, DType::float32), spec({1}, DType::float32),
                     spec({1}, DType::float32), spec({1, 1}, DType::float32)},
                    {},
                    "tiny"},
                   {{spec({256, 600}, DType::float32), spec({600}, DType::float32), spec({256}, DType::float32),
                     spec({256}, DType::float32), spec({256, 600}, DType::float32)},
                    {},
                    "two rows per partition, fp32"},
                   {{spec({2, 40000}, DType::bfloat16), spec({40000}, DType::bfloat16), spec({2}, DType::float32),
                     spec({2}, DType::float32), spec({2, 40000}, DType::bfloat16)},
                    {},
                    "rows too wide for SBUF, streamed"}},
      .draw = [](CaseRng& r) { return norm_detail::draw_case(r, norm_detail::Kind::layer, true); },
      .tolerance = {},
      .benchmark = Benchmark{norm_detail::benchmark_case(norm_detail::Kind::layer, true), Bound::hbm, {}, 0},
  };
}

}  // namespace nikki::kernels
