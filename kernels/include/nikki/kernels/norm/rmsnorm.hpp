// Root-mean-square normalization over the last axis, and its backward.
#pragma once

#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/norm/norm_cases.hpp"
#include "nikki/kernels/norm/row_norm_backward.hpp"
#include "nikki/kernels/norm/row_norm_forward.hpp"

namespace nikki::kernels {

inline constexpr const char* rmsnorm_doc = R"(RMS normalization over the last axis of a 2-D tensor (torch.nn.functional.rms_norm).

Dimensions: x [R, H], gamma [H] -> out [R, H], rstd [R]; any R and H.
Args:       x: HBM tensor, float32 / bfloat16 / float16.
            gamma: the per-column scale, float32 / bfloat16 / float16.
            eps: added to the mean square inside the square root (default 1e-6).
Returns:    out in x's dtype; rstd in float32 (saved for the backward).
Notes:      the mean square is var + mean^2 of bn_stats/bn_aggr (two non-negative terms, so no
            cancellation). Computed in fp32 and rounded once, on the store (torch rounds x * rstd
            to x's dtype before the gamma product, so 16-bit results may differ from torch's by
            one unit in the last place). Same engine plan as layernorm: gamma is applied in the
            transposed domain, one ScalarE activation per 128 columns.
Pseudocode: rstd = 1 / sqrt(sum(x^2, axis=1) / H + eps); out = x * rstd * gamma)";

/** @brief {out, rstd} = rmsnorm(x, gamma); see rmsnorm_doc. */
inline std::vector<Tensor> rmsnorm(const Tensor& x, const Tensor& gamma, double eps = 1e-6, Loc loc = Loc::current()) {
  return norm_detail::forward(norm_detail::Kind::rms, x, gamma, std::nullopt, eps, loc);
}

inline KernelInfo rmsnorm_info() {
  return KernelInfo{
      .name = "rmsnorm",
      .summary = "RMS normalization over the last axis of a 2-D tensor",
      .doc = rmsnorm_doc,
      .inputs = {"x", "gamma"},
      .outputs = {"out", "rstd"},
      .params = {{"eps", ParamKind::real, 1e-6, "added to the mean square inside the square root"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "rmsnorm_bwd",
      .saved_outputs = {"rstd"},
      .body = [](const KernelCall& c) { return rmsnorm(c.inputs[0], c.inputs[1], c.real("eps")); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) { return reference::rmsnorm(in[0], in[1], p.real("eps")); },
      .make_inputs = {},
      .examples = {{{spec({300, 77}, DType::bfloat16), spec({77}, DType::bfloat16)}, {}, "row and column tails"},
                   {{spec({1, 1}, DType::float32), spec({1}, DType::float32)}, {}, "tiny"},
                   {{spec({256, 600}, DType::float32), spec({600}, DType::float32)},
                    {{"eps", 1e-3}},
                    "two rows per partition, fp32"},
                   {{spec({2, 20000}, DType::bfloat16), spec({20000}, DType::bfloat16)}, {}, "wide rows"},
                   {{spec({2, 40000}, DType::bfloat16), spec({40000}, DType::bfloat16)}, {}, "rows too wide for SBUF, streamed"}},
      .draw = [](CaseRng& r) { return norm_detail::draw_case(r, norm_detail::Kind::rms, false); },
      .tolerance = {},
      .benchmark = Benchmark{norm_detail::benchmark_case(norm_detail::Kind::rms, false), Bound::hbm, {}, 0.70},
  };
}

inline constexpr const char* rmsnorm_bwd_doc = R"(Backward of rmsnorm over the last axis.

Dimensions: x [R, H], gamma [H], rstd [R], grad_out [R, H] -> grad_x [R, H], grad_gamma [H].
Args:       x, gamma: the forward's inputs; rstd: its saved output (float32);
            grad_out: the gradient of the loss with respect to out.
Returns:    grad_x in x's dtype; grad_gamma in gamma's dtype.
Notes:      as layernorm_bwd without the mean terms: row sums on the ScalarE accumulators,
            grad_gamma's column sums accumulated in fp32 PSUM on the TensorE across all rows.
            Computed in fp32; each output is rounded once.
Pseudocode: xhat = x * rstd; g = grad_out * gamma
            grad_x = rstd * (g - xhat * mean(g * xhat, axis=1))
            grad_gamma = sum(grad_out * xhat, axis=0))";

/** @brief {grad_x, grad_gamma}; see rmsnorm_bwd_doc. */
inline std::vector<Tensor> rmsnorm_bwd(const Tensor& x, const Tensor& gamma, const Tensor& rstd, const Tensor& grad_out,
                                       Loc loc = Loc::current()) {
  return norm_detail::backward(norm_detail::Kind::rms, x, gamma, std::nullopt, rstd, grad_out, loc);
}

inline KernelInfo rmsnorm_bwd_info() {
  return KernelInfo{
      .name = "rmsnorm_bwd",
      .summary = "gradients of RMS normalization over the last axis",
      .doc = rmsnorm_bwd_doc,
      .inputs = {"x", "gamma", "rstd", "grad_out"},
      .outputs = {"grad_x", "grad_gamma"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return rmsnorm_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3]); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return reference::rmsnorm_backward(in[0], in[1], in[2], in[3]);
          },
      .make_inputs = [](const ExampleCase& c, CaseRng& r) { return norm_detail::backward_inputs(c, r, norm_detail::Kind::rms); },
      .examples = {{{spec({300, 77}, DType::bfloat16), spec({77}, DType::float32), spec({300}, DType::float32),
                     spec({300, 77}, DType::bfloat16)},
                    {},
                    "row and column tails, fp32 gamma"},
                   {{spec({1, 1}, DType::float32), spec({1}, DType::float32), spec({1}, DType::float32),
                     spec({1, 1}, DType::float32)},
                    {},
                    "tiny"},
                   {{spec({256, 600}, DType::float32), spec({600}, DType::float32), spec({256}, DType::float32),
                     spec({256, 600}, DType::float32)},
                    {},
                    "two rows per partition, fp32"},
                   {{spec({2, 40000}, DType::bfloat16), spec({40000}, DType::bfloat16), spec({2}, DType::float32),
                     spec({2, 40000}, DType::bfloat16)},
                    {},
                    "rows too wide for SBUF, streamed"}},
      .draw = [](CaseRng& r) { return norm_detail::draw_case(r, norm_detail::Kind::rms, true); },
      .tolerance = {},
      .benchmark = Benchmark{norm_detail::benchmark_case(norm_detail::Kind::rms, true), Bound::hbm, {}, 0},
  };
}

}  // namespace nikki::kernels
