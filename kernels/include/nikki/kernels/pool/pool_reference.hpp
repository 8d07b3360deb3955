// Float64 references of 2-D max and average pooling and their gradients: the textbook loops over
// windows, with padding as cells outside the input (never the maximum; zeros in an average).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "nikki/kernels/pool/pool_window.hpp"

namespace nikki::kernels::reference {

namespace pool_detail {

/** Calls visit(plane, oh, ow, h, w) for every valid cell (h, w) of every window, in row-major
 *  window order. */
template <class Visit>
void for_each_window_cell(const pool::PoolGeometry& g, Visit&& visit) {
  for (int64_t pl = 0; pl < g.planes(); ++pl)
    for (int64_t oh = 0; oh < g.Ho; ++oh)
      for (int64_t ow = 0; ow < g.Wo; ++ow)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            const int64_t h = oh * g.sh - g.ph + i, w = ow * g.sw - g.pw + j;
            if (h >= 0 && h < g.H && w >= 0 && w < g.W) visit(pl, oh, ow, h, w);
          }
}

inline Shape out_shape(const pool::PoolGeometry& g) { return Shape{g.N, g.C, g.Ho, g.Wo}; }

}  // namespace pool_detail

/** @brief out[n, c, oh, ow] = the largest x in the window (padding never wins). */
inline RefTensor max_pool2d(const RefTensor& x, const pool::PoolGeometry& g) {
  RefTensor out(pool_detail::out_shape(g));
  for (double& v : out.data) v = -std::numeric_limits<double>::infinity();
  pool_detail::for_each_window_cell(g, [&](int64_t pl, int64_t oh, int64_t ow, int64_t h, int64_t w) {
    double& o = out[(pl * g.Ho + oh) * g.Wo + ow];
    o = std::max(o, x[(pl * g.H + h) * g.W + w]);
  });
  return out;
}

/** @brief grad_x: each window's gradient goes to the first cell (row-major in the window) that
 *  holds its maximum, as torch's max_pool2d indices route it; windows that share a cell add. */
inline RefTensor max_pool2d_bwd(const RefTensor& x, const RefTensor& out, const RefTensor& grad_out,
                                const pool::PoolGeometry& g) {
  RefTensor grad_x(x.shape);
  std::vector<bool> routed(size_t(out.size()), false);
  pool_detail::for_each_window_cell(g, [&](int64_t pl, int64_t oh, int64_t ow, int64_t h, int64_t w) {
    const int64_t o = (pl * g.Ho + oh) * g.Wo + ow, i = (pl * g.H + h) * g.W + w;
    if (!routed[size_t(o)] && x[i] == out[o]) {
      grad_x[i] += grad_out[o];
      routed[size_t(o)] = true;
    }
  });
  return grad_x;
}

/** @brief The divisor of each window: kh * kw with count_include_pad, else its valid cells. */
inline std::vector<double> avg_divisors(const pool::PoolGeometry& g, bool count_include_pad) {
  std::vector<double> div(size_t(g.planes() * g.out_plane()), count_include_pad ? double(g.kh * g.kw) : 0.0);
  if (!count_include_pad)
    pool_detail::for_each_window_cell(g, [&](int64_t pl, int64_t oh, int64_t ow, int64_t, int64_t) {
      div[size_t((pl * g.Ho + oh) * g.Wo + ow)] += 1;
    });
  return div;
}

/** @brief out = the window's sum over its divisor (padding counts as zeros). */
inline RefTensor avg_pool2d(const RefTensor& x, const pool::PoolGeometry& g, bool count_include_pad) {
  RefTensor out(pool_detail::out_shape(g));
  pool_detail::for_each_window_cell(g, [&](int64_t pl, int64_t oh, int64_t ow, int64_t h, int64_t w) {
    out[(pl * g.Ho + oh) * g.Wo + ow] += x[(pl * g.H + h) * g.W + w];
  });
  const std::vector<double> div = avg_divisors(g, count_include_pad);
  for (int64_t o = 0; o < out.size(); ++o) out[o] /= div[size_t(o)];
  return out;
}

/** @brief grad_x[cell] = sum over the windows holding the cell of grad_out / divisor. */
inline RefTensor avg_pool2d_bwd(const RefTensor& x, const RefTensor& grad_out, const pool::PoolGeometry& g,
                                bool count_include_pad) {
  RefTensor grad_x(x.shape);
  const std::vector<double> div = avg_divisors(g, count_include_pad);
  pool_detail::for_each_window_cell(g, [&](int64_t pl, int64_t oh, int64_t ow, int64_t h, int64_t w) {
    const int64_t o = (pl * g.Ho + oh) * g.Wo + ow;
    grad_x[(pl * g.H + h) * g.W + w] += grad_out[o] / div[size_t(o)];
  });
  return grad_x;
}

}  // namespace nikki::kernels::reference
