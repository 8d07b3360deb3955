// Float64 references of the attention kernels: the plain definitions, one query row at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief Which keys a query sees and how its scores are shaped (flash attention's options). */
struct AttentionOptions {
  bool causal = false;  // query i sees keys j <= i + prefix
  int64_t window = 0;   // > 0: only keys j > i + prefix - window as well (causal implied)
  int64_t prefix = 0;   // cached keys before the active ones: query i sits at key i + prefix
  double softcap = 0;   // > 0: scores s -> softcap * tanh(s / softcap) before masking
};

/** @brief Scaled, capped, masked scores and probabilities of one query row: the definitions both
 *  the forward and the backward reference use. */
struct RowSoftmax {
  std::vector<double> p;      // probabilities over the keys (0 where masked)
  std::vector<double> dcap;   // d(capped score) / d(scaled score): 1 - tanh^2, or 1 without a cap
  double lse = 0;             // logsumexp of the scores and the sink
  double p_sink = 0;          // the sink's probability (0 for a -inf sink)
};

/** @brief q [B, H, S, D], k [B, Hkv, Skv, D]: the probabilities of query (b, h, i), with the
 *  sink's logit `sink` (-inf: none) in the denominator. */
inline RowSoftmax row_softmax(const RefTensor& q, const RefTensor& k, int64_t b, int64_t h, int64_t i,
                              const AttentionOptions& o, double scale, double sink) {
  const int64_t H = q.shape[1], S = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Skv = k.shape[2];
  const int64_t g = h / (H / Hkv);
  const double* qi = &q.data[size_t(((b * H + h) * S + i) * D)];
  RowSoftmax r;
  r.p.assign(size_t(Skv), 0.0);
  r.dcap.assign(size_t(Skv), 1.0);
  const int64_t position = i + o.prefix;  // of query i among the keys
  const int64_t end = o.causal || o.window > 0 ? std::min(Skv, position + 1) : Skv;
  const int64_t first = o.window > 0 ? std::max<int64_t>(0, position - o.window + 1) : 0;
  double m = sink;
  for (int64_t j = first; j < end; ++j) {
    const double* kj = &k.data[size_t(((b * Hkv + g) * Skv + j) * D)];
    double s = 0;
    for (int64_t x = 0; x < D; ++x) s += qi[x] * kj[x];
    s *= scale;
    if (o.softcap > 0) {
      const double t = std::tanh(s / o.softcap);
      s = o.softcap * t;
      r.dcap[size_t(j)] = 1 - t * t;
    }
    r.p[size_t(j)] = s;
    m = std::max(m, s);
  }
  double sum = std::exp(sink - m);
  for (int64_t j = first; j < end; ++j) sum += std::exp(r.p[size_t(j)] - m);
  for (int64_t j = first; j < end; ++j) r.p[size_t(j)] = std::exp(r.p[size_t(j)] - m) / sum;
  r.p_sink = std::exp(sink - m) / sum;
  r.lse = m + std::log(sum);
  return r;
}

/** @brief (out, lse) of attention; query head h reads kv head h / (H / Hkv); sinks [H] (-inf: none). */
inline std::vector<RefTensor> attention_forward(const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                                const RefTensor& sinks, std::optional<double> scale_opt,
                                                const AttentionOptions& o) {
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Skv = k.shape[2];
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  RefTensor out(q.shape), lse(Shape{B, H, S});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        const RowSoftmax r = row_softmax(q, k, b, h, i, o, scale, sinks[h]);
        lse[(b * H + h) * S + i] = r.lse;
        double* out_row = &out.data[size_t(((b * H + h) * S + i) * D)];
        for (int64_t j = 0; j < Skv; ++j) {
          if (r.p[size_t(j)] == 0) continue;
          const double* vj = &v.data[size_t(((b * Hkv + g) * Skv + j) * D)];
          for (int64_t x = 0; x < D; ++x) out_row[x] += r.p[size_t(j)] * vj[x];
        }
      }
    }
  return {out, lse};
}

/**
 * @brief (grad_q, grad_k, grad_v, grad_sinks) of attention for the incoming gradient grad_out.
 * The probabilities are recomputed from q and k; `out` enters through Di = rowsum(grad_out * out),
 * as in the kernel, so a backward given the forward's own output is checked on its own terms.
 * With a sink, d loss / d sink = -sum over queries of p_sink * Di (the sink weighs no value row,
 * so it pulls every probability down in proportion to p_sink).
 */
inline std::vector<RefTensor> attention_backward(const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                                 const RefTensor& sinks, const RefTensor& out, const RefTensor& grad_out,
                                                 std::optional<double> scale_opt, const AttentionOptions& o) {
  const int64_t B = q.shape[0], H = q.shape[1], S = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Skv = k.shape[2];
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  RefTensor dq(q.shape), dk(k.shape), dv(v.shape), dsinks(Shape{H});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        const RowSoftmax r = row_softmax(q, k, b, h, i, o, scale, sinks[h]);
        const size_t row = size_t(((b * H + h) * S + i) * D);
        const double* go = &grad_out.data[row];
        double di = 0;
        for (int64_t x = 0; x < D; ++x) di += go[x] * out.data[row + size_t(x)];
        dsinks[h] -= r.p_sink * di;
        for (int64_t j = 0; j < Skv; ++j) {
          const double pj = r.p[size_t(j)];
          const size_t kv_row = size_t(((b * Hkv + g) * Skv + j) * D);
          double dp = 0;
          for (int64_t x = 0; x < D; ++x) {
            dp += go[x] * v.data[kv_row + size_t(x)];
            dv.data[kv_row + size_t(x)] += pj * go[x];
          }
          const double ds = pj * (dp - di) * r.dcap[size_t(j)];
          for (int64_t x = 0; x < D; ++x) {
            dq.data[row + size_t(x)] += scale * ds * k.data[kv_row + size_t(x)];
            dk.data[kv_row + size_t(x)] += scale * ds * q.data[row + size_t(x)];
          }
        }
      }
    }
  return {dq, dk, dv, dsinks};
}

}  // namespace nikki::kernels::reference
