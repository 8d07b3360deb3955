// Row softmax.
//
// Dimensions: x [R, C], out [R, C]; rows are tiled over partitions (128 per tile, any R).
// Args:       x: HBM tensor of a float dtype; C must fit a few fp32 rows in SBUF.
// Returns:    out in shared_hbm with x's dtype.
// Notes:      max-subtracted for stability; exp and the row sum come from one activation
//             instruction (its add-reduction), the normalization is one tensor_scalar.
// Pseudocode: m = max(x, axis=1); e = exp(x - m); out = e * (1 / sum(e, axis=1))
#pragma once

#include <algorithm>

#include "nikki/nikki.hpp"

namespace nikki::kernels {

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

}  // namespace nikki::kernels
