// Residual add fused with RMS normalization (the pre-norm transformer's "h = x + residual;
// rmsnorm(h)"), returning the sum for the next residual, and its backward.
#pragma once

#include "nikki/kernels/norm/norm_cases.hpp"
#include "nikki/kernels/norm/row_norm_backward.hpp"
#include "nikki/kernels/norm/row_norm_forward.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels {

inline constexpr const char* add_rmsnorm_doc = R"(Residual add followed by RMS normalization over the last axis: sum = x + residual, out = rmsnorm(sum) * gamma.

Dimensions: x [R, H], residual [R, H], gamma [H] -> out [R, H], sum [R, H], rstd [R]; any R and H.
Args:       x, residual: HBM tensors of one shape and dtype, float32 / bfloat16 / float16.
            gamma: the per-column scale, float32 / bfloat16 / float16.
            eps: added to the mean square inside the square root (default 1e-6).
Returns:    out and sum in x's dtype (sum is the next layer's residual); rstd in float32 (saved
            for the backward).
Notes:      rmsnorm's kernel with the add folded into its loads: the residual's tiles arrive
            beside x's, one VectorE or GpSimd add (whichever is free) forms the sum in place,
            rounded to x's dtype as an unfused add would, and it is stored at once; the norm
            then runs on it exactly as rmsnorm does. Rows too wide for SBUF read the stored sum
            back for their second pass. Traffic: x and residual read once, out and sum written
            once.
Pseudocode: sum = x + residual
            rstd = 1 / sqrt(mean(sum^2, axis=1) + eps); out = sum * rstd * gamma)";

/** @brief {out, sum, rstd} = add_rmsnorm(x, residual, gamma); see add_rmsnorm_doc. */
inline std::vector<Tensor> add_rmsnorm(const Tensor& x, const Tensor& residual, const Tensor& gamma, double eps = 1e-6,
                                       Loc loc = Loc::current()) {
  return norm_detail::forward(norm_detail::Kind::rms, x, gamma, std::nullopt, eps, loc, residual);
}

inline constexpr const char* add_rmsnorm_bwd_doc = R"(Backward of add_rmsnorm: the gradient of the sum, through the norm and directly, for both addends.

Dimensions: sum [R, H], gamma [H], rstd [R], grad_out [R, H], grad_sum [R, H] -> grad_x [R, H], grad_residual [R, H], grad_gamma [H].
Args:       sum, rstd: the forward's outputs; gamma: its input; grad_out, grad_sum: the gradients
            of the loss with respect to out and sum (zeros when sum is not used further).
Returns:    grad_x and grad_residual (equal) in sum's dtype; grad_gamma in gamma's dtype.
Notes:      rmsnorm_bwd's kernel on the sum, with grad_sum's tiles added to each output tile
            (VectorE or GpSimd) before it is stored, once for each addend. grad_x is rounded
            twice in 16-bit dtypes (the norm's gradient, then the sum).
Pseudocode: xhat = sum * rstd; g = grad_out * gamma
            grad_x = grad_residual = rstd * (g - xhat * mean(g * xhat, axis=1)) + grad_sum
            grad_gamma = sum(grad_out * xhat, axis=0))";

/** @brief {grad_x, grad_residual, grad_gamma}; see add_rmsnorm_bwd_doc. */
inline std::vector<Tensor> add_rmsnorm_bwd(const Tensor& sum, const Tensor& gamma, const Tensor& rstd,
                                           const Tensor& grad_out, const Tensor& grad_sum, Loc loc = Loc::current()) {
  return norm_detail::backward(norm_detail::Kind::rms, sum, gamma, std::nullopt, rstd, grad_out, loc, grad_sum);
}

namespace norm_detail {

/** add_rmsnorm's specs from rmsnorm's: the residual after x (forward), grad_sum last (backward). */
inline ExampleCase with_residual(ExampleCase c, bool backward) {
  if (backward) c.inputs.push_back(c.inputs[0]);
  else c.inputs.insert(c.inputs.begin() + 1, c.inputs[0]);
  return c;
}

inline ExampleCase add_rms_case(int64_t R, int64_t H, DType x, DType v, bool backward, std::string label) {
  return with_residual({norm_specs(Kind::rms, backward, R, H, x, v), {}, std::move(label)}, backward);
}

inline std::vector<ExampleCase> add_rms_examples(bool backward) {
  return {add_rms_case(300, 77, DType::bfloat16, DType::bfloat16, backward, "row and column tails"),
          add_rms_case(1, 1, DType::float32, DType::float32, backward, "tiny"),
          add_rms_case(256, 600, DType::float32, DType::float32, backward, "two rows per partition, fp32"),
          add_rms_case(2, 40000, DType::bfloat16, DType::float32, backward, "rows too wide for SBUF, streamed")};
}

}  // namespace norm_detail

inline KernelInfo add_rmsnorm_info() {
  return KernelInfo{
      .name = "add_rmsnorm",
      .summary = "residual add fused with RMS normalization over the last axis, returning the sum",
      .doc = add_rmsnorm_doc,
      .inputs = {"x", "residual", "gamma"},
      .outputs = {"out", "sum", "rstd"},
      .params = {{"eps", ParamKind::real, 1e-6, "added to the mean square inside the square root"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "add_rmsnorm_bwd",
      .gradient = "",
      .saved_outputs = {"rstd"},
      .body = [](const KernelCall& c) { return add_rmsnorm(c.inputs[0], c.inputs[1], c.inputs[2], c.real("eps")); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::add_rmsnorm(in[0], in[1], in[2], p.real("eps"));
          },
      .make_inputs = {},
      .examples = norm_detail::add_rms_examples(false),
      .draw = [](CaseRng& r) { return norm_detail::with_residual(norm_detail::draw_case(r, norm_detail::Kind::rms, false), false); },
      .tolerance = {},
      .benchmark = Benchmark{norm_detail::with_residual(norm_detail::benchmark_case(norm_detail::Kind::rms, false), false),
                             Bound::hbm, {}, 0.70},
  };
}

inline KernelInfo add_rmsnorm_bwd_info() {
  return KernelInfo{
      .name = "add_rmsnorm_bwd",
      .summary = "gradients of add_rmsnorm (both addends and gamma)",
      .doc = add_rmsnorm_bwd_doc,
      .inputs = {"sum", "gamma", "rstd", "grad_out", "grad_sum"},
      .outputs = {"grad_x", "grad_residual", "grad_gamma"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return add_rmsnorm_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]);
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return reference::add_rmsnorm_backward(in[0], in[1], in[2], in[3], in[4]);
          },
      // sum, gamma, rstd of the sum (as the forward computes it), grad_out, grad_sum.
      .make_inputs =
          [](const ExampleCase& c, CaseRng& r) {
            std::vector<RefTensor> in = norm_detail::backward_inputs(c, r, norm_detail::Kind::rms);
            in.push_back(random_input(c.inputs[4], r));
            return in;
          },
      .examples = norm_detail::add_rms_examples(true),
      .draw = [](CaseRng& r) { return norm_detail::with_residual(norm_detail::draw_case(r, norm_detail::Kind::rms, true), true); },
      .tolerance = {},
      .benchmark = Benchmark{norm_detail::with_residual(norm_detail::benchmark_case(norm_detail::Kind::rms, true), true),
                             Bound::hbm, {}, 0},
  };
}

}  // namespace nikki::kernels
