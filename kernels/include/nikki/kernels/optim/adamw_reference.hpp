// Float64 reference of one AdamW step (torch.optim.AdamW's update, decoupled weight decay).
#pragma once

#include <cmath>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief Hyperparameters of one AdamW step; `step` counts from 1. */
struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};

/** @brief (param, exp_avg, exp_avg_sq) after one step, for the gradient `grad`. */
inline std::vector<RefTensor> adamw(const RefTensor& param, const RefTensor& grad, const RefTensor& exp_avg,
                                    const RefTensor& exp_avg_sq, const AdamWStep& h) {
  RefTensor p(param.shape), m(param.shape), v(param.shape);
  const double bias1 = 1 - std::pow(h.beta1, double(h.step)), bias2 = 1 - std::pow(h.beta2, double(h.step));
  for (int64_t i = 0; i < param.size(); ++i) {
    m[i] = exp_avg[i] + (1 - h.beta1) * (grad[i] - exp_avg[i]);
    v[i] = h.beta2 * exp_avg_sq[i] + (1 - h.beta2) * grad[i] * grad[i];
    const double denom = std::sqrt(v[i]) / std::sqrt(bias2) + h.eps;
    p[i] = param[i] * (1 - h.lr * h.weight_decay) - h.lr / bias1 * m[i] / denom;
  }
  return {p, m, v};
}

}  // namespace nikki::kernels::reference
