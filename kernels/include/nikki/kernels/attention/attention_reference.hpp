// Float64 references of the attention kernels: the plain definitions, one query row at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief Scaled, masked scores and probabilities of one query row: the definitions both the
 *  forward and the backward reference use. */
struct RowSoftmax {
  std::vector<double> p;  // probabilities over the keys (0 where masked)
  double lse = 0;         // logsumexp of the scaled, masked scores
};

/** @brief q [B, H, S, D], k [B, Hkv, Skv, D]: the probabilities of query (b, h, i). `window` > 0
 *  (a sliding window, causal as well): only keys j with i - window < j <= i are visible. */
inline RowSoftmax row_softmax(const RefTensor& q, const RefTensor& k, int64_t b, int64_t h, int64_t i, bool causal,
                              double scale, int64_t window = 0) {
  const int64_t H = q.shape[1], S = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Skv = k.shape[2];
  const int64_t g = h / (H / Hkv);
  const double* qi = &q.data[size_t(((b * H + h) * S + i) * D)];
  RowSoftmax r;
  r.p.assign(size_t(Skv), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  const int64_t visible = causal || window > 0 ? std::min(Skv, i + 1) : Skv;
  const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
  for (int64_t j = first; j < visible; ++j) {
    const double* kj = &k.data[size_t(((b * Hkv + g) * Skv + j) * D)];
    double s = 0;
    for (int64_t x = 0; x < D; ++x) s += qi[x] * kj[x];
    r.p[size_t(j)] = scale * s;
    m = std::max(m, scale * s);
  }
  double sum = 0;
  for (int64_t j = first; j < visible; ++j) sum += std::exp(r.p[size_t(j)] - m);
  for (int64_t j = first; j < visible; ++j) r.p[size_t(j)] = std::exp(r.p[size_t(j)] - m) / sum;
  r.lse = m + std::log(sum);
  return r;
}

/** @brief (out, lse) of attention; query head h reads kv head h / (H / Hkv). */
inline std::vector<RefTensor> attention_forward(const RefTensor& q, const RefTensor& k, const RefTensor& v, bool causal,
                                                std::optional<double> scale_opt, int64_t window = 0) {
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Skv = k.shape[2];
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  RefTensor out(q.shape), lse(Shape{B, H, S});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        const RowSoftmax r = row_softmax(q, k, b, h, i, causal, scale, window);
        lse[(b * H + h) * S + i] = r.lse;
        double* o = &out.data[size_t(((b * H + h) * S + i) * D)];
        for (int64_t j = 0; j < Skv; ++j) {
          if (r.p[size_t(j)] == 0) continue;
          const double* vj = &v.data[size_t(((b * Hkv + g) * Skv + j) * D)];
          for (int64_t x = 0; x < D; ++x) o[x] += r.p[size_t(j)] * vj[x];
        }
      }
    }
  return {out, lse};
}

/**
 * @brief (grad_q, grad_k, grad_v) of attention for the incoming gradient grad_out. The
 * probabilities are recomputed from q and k; `out` enters through Di = rowsum(grad_out * out), as
 * in the kernel, so a backward given the forward's own output is checked on its own terms.
 */
inline std::vector<RefTensor> attention_backward(const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                                 const RefTensor& out, const RefTensor& grad_out, bool causal,
                                                 std::optional<double> scale_opt, int64_t window = 0) {
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Skv = k.shape[2];
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  RefTensor dq(q.shape), dk(k.shape), dv(v.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        const RowSoftmax r = row_softmax(q, k, b, h, i, causal, scale, window);
        const size_t row = size_t(((b * H + h) * S + i) * D);
        const double* go = &grad_out.data[row];
        double di = 0;
        for (int64_t x = 0; x < D; ++x) di += go[x] * out.data[row + size_t(x)];
        for (int64_t j = 0; j < Skv; ++j) {
          const double pj = r.p[size_t(j)];
          const size_t kv_row = size_t(((b * Hkv + g) * Skv + j) * D);
          double dp = 0;
          for (int64_t x = 0; x < D; ++x) {
            dp += go[x] * v.data[kv_row + size_t(x)];
            dv.data[kv_row + size_t(x)] += pj * go[x];
          }
          const double ds = pj * (dp - di);
          for (int64_t x = 0; x < D; ++x) {
            dq.data[row + size_t(x)] += scale * ds * k.data[kv_row + size_t(x)];
            dk.data[kv_row + size_t(x)] += scale * ds * q.data[row + size_t(x)];
          }
        }
      }
    }
  return {dq, dk, dv};
}

}  // namespace nikki::kernels::reference
