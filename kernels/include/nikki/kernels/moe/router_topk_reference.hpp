// Float64 reference of the mixture-of-experts router: logits, activation, top-k selection.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief How the router turns logits into routing weights. */
struct RouterOptions {
  int64_t k = 2;
  bool sigmoid = false;      // sigmoid of each logit instead of a softmax
  bool select_first = false;  // top-k of the logits, then the activation over the k selected
  bool normalize = false;     // the k weights divided by their sum
};

/** @brief {weights [T, k], expert ids [T, k]} for x [T, H], w_router [H, E], bias [E]: scores
 *  are act(logits) (or the logits when selecting first), the k largest taken in descending
 *  order (equal scores by lowest expert id). */
inline std::vector<RefTensor> router_topk(const RefTensor& x, const RefTensor& w, const RefTensor& bias,
                                          const RouterOptions& o) {
  const int64_t T = x.shape[0], H = x.shape[1], E = w.shape[1], k = o.k;
  RefTensor weights(Shape{T, k}), ids(Shape{T, k});
  std::vector<double> s(static_cast<size_t>(E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto softmax = [](std::vector<double>& v) {
    const double m = *std::max_element(v.begin(), v.end());
    double sum = 0;
    for (double& e : v) sum += (e = std::exp(e - m));
    for (double& e : v) e /= sum;
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double l = bias[e];
      for (int64_t h = 0; h < H; ++h) l += x[t * H + h] * w[h * E + e];
      s[size_t(e)] = l;
    }
    if (!o.select_first) {
      if (o.sigmoid) std::transform(s.begin(), s.end(), s.begin(), sigmoid);
      else softmax(s);
    }
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
    std::vector<double> top(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) top[size_t(j)] = s[size_t(order[size_t(j)])];
    if (o.select_first) {
      if (o.sigmoid) std::transform(top.begin(), top.end(), top.begin(), sigmoid);
      else softmax(top);
    }
    if (o.normalize) {
      const double sum = std::accumulate(top.begin(), top.end(), 0.0);
      for (double& v : top) v /= sum;
    }
    for (int64_t j = 0; j < k; ++j) {
      weights[t * k + j] = top[size_t(j)];
      ids[t * k + j] = double(order[size_t(j)]);
    }
  }
  return {weights, ids};
}

}  // namespace nikki::kernels::reference
