// The backward of the fused q/k/v projection, from the library's kernels: rope's backward writes
// the projection's row gradients, matmul runs the two products (the weight's gradient with
// x_norm as its K-major operand as it lies in HBM, x_norm's gradient against a transposed copy
// of w_qkv), column sums give the bias's gradient, and the norm family's backward takes x_norm's
// gradient to x's (and gamma's, beta's).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/output_projection.hpp"
#include "nikki/kernels/attention/qkv_common.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/norm/row_norm_backward.hpp"
#include "nikki/kernels/norm/row_norm_forward.hpp"

namespace nikki::kernels {

inline constexpr const char* qkv_bwd_doc = R"(Backward of qkv: the gradients of x, w_qkv, bias, gamma and beta.

Dimensions: x [B, S, H], w_qkv [H, I], gamma [H], beta [H], cos and sin as the forward's,
            mean [B * S], rstd [B * S], grad_q [B, Hq, S, D], grad_k [B, Hkv, S, D],
            grad_v [B, Hkv, S, D] -> grad_x [B, S, H], grad_w_qkv [H, I], grad_bias [I],
            grad_gamma [H], grad_beta [H].
Args:       x, w_qkv, gamma, beta, cos, sin: the forward's inputs; mean, rstd: its saved outputs;
            grad_q, grad_k, grad_v: the gradients of the loss with respect to q, k and v (x's
            dtype). q_heads, kv_heads, norm, rope, interleaved: the forward's; eps: the forward's
            (x_norm is recomputed).
Returns:    grad_x, grad_w_qkv, grad_bias in x's dtype; grad_gamma and grad_beta in their
            dtypes (zeros where the norm does not use them). cos and sin get no gradient.
Notes:      rope's backward kernel (the transposed rotation) writes grad_q and grad_k as the
            projection's rows [B * S, I] (an HBM scratch), grad_v is copied beside them; the
            bias's gradient is their column sums, w_qkv's is x_norm^T @ rows on matmul's kernel
            with x_norm (recomputed by the norm kernel's forward, the forward's bits) as its
            K-major operand; x_norm's is rows @ w_qkv^T against a transposed copy of w_qkv, and
            the norm kernels' backward (with the saved mean and rstd) turns it into x's and
            gamma's (beta's). Each product accumulates in fp32 and is rounded once; x_norm's
            gradient is rounded to x's dtype before the norm's backward (as torch's autograd).
Pseudocode: rows = cat(rope_bwd(grad_q), rope_bwd(grad_k), grad_v) in the [B * S, I] layout
            grad_bias = rows.sum(0); grad_w_qkv = xn.T @ rows; grad_xn = rows @ w_qkv.T
            grad_x, grad_gamma, grad_beta = norm_bwd(x, gamma, mean, rstd, grad_xn))";

inline constexpr const char* add_qkv_bwd_doc = R"(Backward of add_qkv: the gradient of the sum, through the projection and directly, for both addends.

Dimensions: sum [B, S, H], w_qkv [H, I], gamma [H], beta [H], cos and sin as the forward's,
            mean [B * S], rstd [B * S], grad_q [B, Hq, S, D], grad_k [B, Hkv, S, D],
            grad_v [B, Hkv, S, D], grad_sum [B, S, H] -> grad_x [B, S, H], grad_residual [B, S, H],
            grad_w_qkv [H, I], grad_bias [I], grad_gamma [H], grad_beta [H].
Args:       sum, mean, rstd: the forward's outputs; the rest as qkv_bwd, and grad_sum, the
            gradient of the loss with respect to sum (zeros when it is not used further).
Returns:    grad_x and grad_residual (equal) in sum's dtype; the rest as qkv_bwd.
Notes:      qkv_bwd's kernels on the sum, with grad_sum added to x_norm's gradient through the
            norm as the norm kernels' backward stores it (without a norm, as matmul's epilogue
            adds it to the fp32 sums).
Pseudocode: grad_x = grad_residual = qkv_bwd(sum, ...).grad_x + grad_sum)";

namespace attention {

/** @brief The backward of qkv (grad_sum: add_qkv); see qkv_bwd_doc. */
inline std::vector<Tensor> qkv_backward(const ArgumentCheck& check, const Tensor& x, const Tensor& w, const Tensor& gamma,
                                        const Tensor& beta, const Tensor& cos, const Tensor& sin, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& grad_q, const Tensor& grad_k,
                                        const Tensor& grad_v, const std::optional<Tensor>& grad_sum,
                                        const reference::QkvConfig& cfg, Loc loc) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const std::string x_name = grad_sum ? "sum" : "x";
  const QkvDims d = check_qkv(check, x, x_name, w, gamma, beta, cos, sin, cfg);
  const DType dt = x.dtype();
  for (const auto& [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}})
    require_tensor(check, *t, name, Shape{d.M}, DType::float32, "pass the forward's saved statistics");
  const std::string hint = "pass the gradients of the forward's outputs";
  require_tensor(check, grad_q, "grad_q", Shape{d.B, d.Hq, d.S, d.D}, dt, hint);
  require_tensor(check, grad_k, "grad_k", Shape{d.B, d.Hkv, d.S, d.D}, dt, hint);
  require_tensor(check, grad_v, "grad_v", Shape{d.B, d.Hkv, d.S, d.D}, dt, hint);
  if (grad_sum) require_tensor(check, *grad_sum, "grad_sum", x.shape(), dt, hint);
  const std::optional<norm_detail::Kind> kind = norm_kind(cfg);

  Tensor grad_x = nl::ndarray(x.shape(), dt, nl::shared_hbm, "grad_x");
  std::optional<Tensor> grad_residual;
  if (grad_sum) grad_residual = nl::ndarray(x.shape(), dt, nl::shared_hbm, "grad_residual");
  Tensor grad_w = nl::ndarray(w.shape(), dt, nl::shared_hbm, "grad_w_qkv");
  Tensor grad_bias = nl::ndarray({d.I}, dt, nl::shared_hbm, "grad_bias");
  const Tensor x2 = x.reshape({d.M, d.H}), grad_x2 = grad_x.reshape({d.M, d.H});

  // The projection's row gradients [B * S, I], written head by head through a [B, heads, S, D] view.
  Tensor rows = nl::ndarray({d.M, d.I}, dt, nl::hbm, "grad_qkv_rows");
  const Tensor heads = rows.reshape({d.B, d.S, d.heads(), d.D}).permute({0, 2, 1, 3});
  const Tensor grads[3] = {grad_q, grad_k, grad_v};
  const int64_t first_head[3] = {0, d.Hq, d.Hq + d.Hkv};
  for (int s = 0; s < 3; ++s) {
    const Tensor dst = heads(nl::all, nl::ds(first_head[s], grads[s].shape()[1]), nl::all, nl::all);
    if (cfg.rope && s < 2) {
      rope_into(check, dst, grads[s], cos, sin, cfg.interleaved, /*backward=*/true);
    } else {
      for (int64_t b = 0; b < d.B; ++b) isa::dma_copy(dst.select(0, b), grads[s].select(0, b));
    }
  }

  // w_qkv's gradient against x_norm (x without a norm), then the bias's.
  const Tensor xn = kind ? norm_detail::forward(*kind, x2, gamma, *kind == norm_detail::Kind::layer ? std::optional<Tensor>(beta)
                                                                                                    : std::nullopt,
                                                cfg.eps, loc)[0]
                         : x2;
  matmul(xn, rows, MatmulOptions{.a_transposed = true, .out = grad_w}, loc);
  column_sums(grad_bias, rows, loc);

  // x_norm's gradient against w_qkv^T, and through the norm.
  Tensor w_t = nl::ndarray({d.I, d.H}, dt, nl::hbm, "w_qkv_transposed");
  transpose_into(check, w_t, w);
  std::vector<Tensor> result{grad_x};
  if (grad_residual) result.push_back(*grad_residual);
  result.push_back(grad_w);
  result.push_back(grad_bias);
  if (!kind) {
    MatmulOptions o{.out = grad_x2};
    if (grad_sum) o.residual = grad_sum->reshape({d.M, d.H});
    matmul(rows, w_t, o, loc);
    if (grad_residual) isa::dma_copy(*grad_residual, grad_x);
    for (const Tensor* v : {&gamma, &beta}) {
      Tensor zeros = nl::ndarray(v->shape(), v->dtype(), nl::shared_hbm, v == &gamma ? "grad_gamma" : "grad_beta");
      fill_vector(zeros, 0.0);
      result.push_back(zeros);
    }
    return result;
  }
  Tensor grad_xn = nl::ndarray({d.M, d.H}, dt, nl::hbm, "grad_x_norm");
  matmul(rows, w_t, MatmulOptions{.out = grad_xn}, loc);
  const bool layer = *kind == norm_detail::Kind::layer;
  norm_detail::BackwardInto into{.grad_x = grad_x2};
  std::optional<Tensor> grad_sum2;
  if (grad_sum) {
    grad_sum2 = grad_sum->reshape({d.M, d.H});
    into.grad_residual = grad_residual->reshape({d.M, d.H});
  }
  const std::vector<Tensor> norm = norm_detail::backward(*kind, x2, gamma, layer ? std::optional<Tensor>(mean) : std::nullopt,
                                                         rstd, grad_xn, loc, grad_sum2, into);
  result.push_back(norm[grad_sum ? 2 : 1]);  // grad_gamma
  if (layer) {
    result.push_back(norm.back());
  } else {
    Tensor zeros = nl::ndarray(beta.shape(), beta.dtype(), nl::shared_hbm, "grad_beta");
    fill_vector(zeros, 0.0);
    result.push_back(zeros);
  }
  return result;
}

}  // namespace attention

/** @brief {grad_x, grad_w_qkv, grad_bias, grad_gamma, grad_beta}; see qkv_bwd_doc. */
inline std::vector<Tensor> qkv_bwd(const Tensor& x, const Tensor& w_qkv, const Tensor& gamma, const Tensor& beta,
                                   const Tensor& cos, const Tensor& sin, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                   const reference::QkvConfig& config, Loc loc = Loc::current()) {
  return attention::qkv_backward(ArgumentCheck("qkv_bwd", x, loc), x, w_qkv, gamma, beta, cos, sin, mean, rstd, grad_q,
                                 grad_k, grad_v, std::nullopt, config, loc);
}

/** @brief {grad_x, grad_residual, grad_w_qkv, grad_bias, grad_gamma, grad_beta}; see add_qkv_bwd_doc. */
inline std::vector<Tensor> add_qkv_bwd(const Tensor& sum, const Tensor& w_qkv, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& cos, const Tensor& sin, const Tensor& mean, const Tensor& rstd,
                                       const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                       const Tensor& grad_sum, const reference::QkvConfig& config,
                                       Loc loc = Loc::current()) {
  return attention::qkv_backward(ArgumentCheck("add_qkv_bwd", sum, loc), sum, w_qkv, gamma, beta, cos, sin, mean, rstd,
                                 grad_q, grad_k, grad_v, grad_sum, config, loc);
}

namespace attention {

/** @brief The registration of qkv_bwd (residual: add_qkv_bwd). */
inline KernelInfo qkv_backward_info(bool residual) {
  std::vector<std::string> inputs{residual ? "sum" : "x", "w_qkv", "gamma", "beta", "cos", "sin", "mean", "rstd",
                                  "grad_q", "grad_k", "grad_v"};
  std::vector<std::string> outputs{"grad_x", "grad_w_qkv", "grad_bias", "grad_gamma", "grad_beta"};
  if (residual) {
    inputs.push_back("grad_sum");
    outputs.insert(outputs.begin() + 1, "grad_residual");
  }
  return KernelInfo{
      .name = residual ? "add_qkv_bwd" : "qkv_bwd",
      .summary = residual ? "gradients of add_qkv (both addends, the weight, bias and the norm's parameters)"
                          : "gradients of the fused q/k/v projection (x, the weight, bias and the norm's parameters)",
      .doc = residual ? add_qkv_bwd_doc : qkv_bwd_doc,
      .inputs = inputs,
      .outputs = outputs,
      .params = qkv_params(true),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [residual](const KernelCall& c) {
            const reference::QkvConfig cfg = qkv_config(c);
            const std::vector<Tensor>& in = c.inputs;
            if (residual)
              return add_qkv_bwd(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9], in[10], in[11], cfg);
            return qkv_bwd(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9], in[10], cfg);
          },
      .reference =
          [residual](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::qkv_backward(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9], in[10],
                                           residual ? &in[11] : nullptr, qkv_config(p));
          },
      .make_inputs = [residual](const ExampleCase& c, CaseRng& r) { return qkv_inputs(c, r, true, residual); },
      .examples = qkv_examples(true, residual),
      .draw = [residual](CaseRng& r) { return draw_qkv(r, true, residual); },
      .tolerance = {},
      .benchmark = Benchmark{qkv_case(qkv_benchmark_problem(), true, residual,
                                      "B=1 S=4096 H=4096 Hq=32 Hkv=8 D=128 bf16, rmsnorm, rope"),
                             Bound::tensor_engine, [](const ExampleCase& c) { return qkv_flops(c, 2); }, 0},
  };
}

}  // namespace attention

inline KernelInfo qkv_bwd_info() { return attention::qkv_backward_info(false); }
inline KernelInfo add_qkv_bwd_info() { return attention::qkv_backward_info(true); }

}  // namespace nikki::kernels
