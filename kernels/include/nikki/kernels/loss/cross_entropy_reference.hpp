// Float64 references of the per-token cross-entropy of logits [T, V] against integer targets
// (torch.nn.functional.cross_entropy with reduction='none') and of its gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief Options of a cross-entropy: the target value that contributes nothing, and the weight
 *  of the uniform distribution mixed into the one-hot target. */
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0;
};

/** @brief log(sum(exp(row))) of row r of x [T, V]. */
inline double row_logsumexp(const RefTensor& x, int64_t r) {
  const int64_t V = x.shape[1];
  double m = -std::numeric_limits<double>::infinity(), s = 0;
  for (int64_t c = 0; c < V; ++c) m = std::max(m, x[r * V + c]);
  for (int64_t c = 0; c < V; ++c) s += std::exp(x[r * V + c] - m);
  return m + std::log(s);
}

/** @brief {loss [T], lse [T]}: loss = lse - (1 - e) x[t] - e mean(x), 0 where t is ignore_index. */
inline std::vector<RefTensor> cross_entropy(const RefTensor& logits, const RefTensor& targets,
                                            const CrossEntropyOptions& o) {
  const int64_t T = logits.shape[0], V = logits.shape[1];
  RefTensor loss(Shape{T}), lse(Shape{T});
  for (int64_t r = 0; r < T; ++r) {
    lse[r] = row_logsumexp(logits, r);
    const int64_t t = int64_t(targets[r]);
    if (t == o.ignore_index) continue;
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += logits[r * V + c];
    loss[r] = lse[r] - (1 - o.label_smoothing) * logits[r * V + t] - o.label_smoothing * sum / double(V);
  }
  return {loss, lse};
}

/** @brief grad_logits = grad_loss * (softmax(x) - (1 - e) onehot(t) - e / V), 0 on ignored rows. */
inline RefTensor cross_entropy_backward(const RefTensor& logits, const RefTensor& targets, const RefTensor& lse,
                                        const RefTensor& grad_loss, const CrossEntropyOptions& o) {
  const int64_t T = logits.shape[0], V = logits.shape[1];
  RefTensor grad(logits.shape);
  for (int64_t r = 0; r < T; ++r) {
    const int64_t t = int64_t(targets[r]);
    if (t == o.ignore_index) continue;
    for (int64_t c = 0; c < V; ++c)
      grad[r * V + c] = grad_loss[r] * (std::exp(logits[r * V + c] - lse[r]) - o.label_smoothing / double(V) -
                                        (c == t ? 1 - o.label_smoothing : 0.0));
  }
  return grad;
}

}  // namespace nikki::kernels::reference
