// Row softmax and its backward.
#pragma once

#include <algorithm>

#include "nikki/kernels/library.hpp"

namespace nikki::kernels {

inline constexpr const char* softmax_doc = R"(Softmax over the last axis of a 2-D tensor.

Dimensions: x [R, C] -> out [R, C]; rows are tiled over partitions (128 per tile, any R).
Args:       x: HBM tensor, float32 / bfloat16 / float16.
Returns:    out, x's dtype.
Notes:      max-subtracted for stability; exp and the row sum come from one activation
            instruction (its add-reduction); the normalization is one tensor_scalar. Computation
            in fp32, one rounding on the store.
Pseudocode: m = max(x, axis=1); e = exp(x - m); out = e / sum(e, axis=1))";

/** @brief out = softmax(x) over rows; see softmax_doc. */
inline Tensor softmax(const Tensor& x) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const int64_t R = x.shape()[0], C = x.shape()[1];
  const int64_t tile_p = nl::tile_size().pmax;
  Tensor out = nl::ndarray({R, C}, x.dtype(), nl::shared_hbm, "out");
  for (int64_t r0 = 0; r0 < R; r0 += tile_p) {
    const int64_t p = std::min(tile_p, R - r0);
    Tensor xt = nl::ndarray({p, C}, nl::float32, nl::sbuf, "x_tile");
    isa::dma_copy(xt, x(nl::ds(r0, p), nl::all));
    Tensor neg_max = nl::ndarray({p, 1}, nl::float32, nl::sbuf, "neg_max");
    isa::tensor_reduce(neg_max, nl::maximum, xt, {1}, /*negate=*/true);
    Tensor e = nl::ndarray({p, C}, nl::float32, nl::sbuf, "exp");
    Tensor sum = nl::ndarray({p, 1}, nl::float32, nl::sbuf, "row_sum");
    isa::activation_reduce(e, nl::exp, xt, nl::add, sum, neg_max);
    Tensor inv = nl::ndarray({p, 1}, nl::float32, nl::sbuf, "inv_sum");
    isa::reciprocal(inv, sum);
    Tensor y = nl::ndarray({p, C}, x.dtype(), nl::sbuf, "y");
    isa::tensor_scalar(y, e, nl::multiply, inv);
    isa::dma_copy(out(nl::ds(r0, p), nl::all), y);
  }
  return out;
}

inline constexpr const char* softmax_bwd_doc = R"(Backward of softmax over the last axis.

Dimensions: out [R, C], grad_out [R, C] -> grad_x [R, C].
Args:       out: the forward's output; grad_out: the gradient of the loss with respect to out.
Returns:    grad_x, grad_out's dtype.
Notes:      fp32 computation; one rounding on the store.
Pseudocode: grad_x = out * (grad_out - sum(grad_out * out, axis=1)))";

/** @brief grad_x = out * (grad_out - rowsum(grad_out * out)); see softmax_bwd_doc. */
inline Tensor softmax_bwd(const Tensor& out, const Tensor& grad_out) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const int64_t R = out.shape()[0], C = out.shape()[1];
  const int64_t tile_p = nl::tile_size().pmax;
  Tensor grad_x = nl::ndarray({R, C}, grad_out.dtype(), nl::shared_hbm, "grad_x");
  for (int64_t r0 = 0; r0 < R; r0 += tile_p) {
    const int64_t p = std::min(tile_p, R - r0);
    Tensor y = nl::ndarray({p, C}, nl::float32, nl::sbuf, "y");
    Tensor dy = nl::ndarray({p, C}, nl::float32, nl::sbuf, "dy");
    isa::dma_copy(y, out(nl::ds(r0, p), nl::all));
    isa::dma_copy(dy, grad_out(nl::ds(r0, p), nl::all));
    Tensor prod = nl::ndarray({p, C}, nl::float32, nl::sbuf, "y_dy");
    isa::tensor_tensor(prod, y, dy, nl::multiply);
    Tensor dot = nl::ndarray({p, 1}, nl::float32, nl::sbuf, "row_dot");
    isa::tensor_reduce(dot, nl::add, prod, {1});
    Tensor dx = nl::ndarray({p, C}, grad_out.dtype(), nl::sbuf, "dx");
    isa::scalar_tensor_tensor(dx, dy, nl::subtract, dot, nl::multiply, y);
    isa::dma_copy(grad_x(nl::ds(r0, p), nl::all), dx);
  }
  return grad_x;
}

inline KernelInfo softmax_info() {
  return KernelInfo{
      .name = "softmax",
      .summary = "softmax over the last axis of a 2-D tensor",
      .doc = softmax_doc,
      .inputs = {"x"},
      .outputs = {"out"},
      .params = {},
      .backward = "softmax_bwd",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{softmax(c.inputs[0])}; },
      .examples = {{{spec({128, 512}, DType::float32)}, {}, "one tile"},
                   {{spec({300, 77}, DType::bfloat16)}, {}, "row and column tails"},
                   {{spec({1, 1}, DType::float32)}, {}, "tiny"}},
  };
}

inline KernelInfo softmax_bwd_info() {
  return KernelInfo{
      .name = "softmax_bwd",
      .summary = "gradient of softmax over the last axis",
      .doc = softmax_bwd_doc,
      .inputs = {"out", "grad_out"},
      .outputs = {"grad_x"},
      .params = {},
      .backward = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{softmax_bwd(c.inputs[0], c.inputs[1])}; },
      .examples = {{{spec({200, 96}, DType::float32), spec({200, 96}, DType::float32)}, {}, "row tail"}},
  };
}

}  // namespace nikki::kernels
