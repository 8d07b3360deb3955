// Float64 reference of decode attention over a KV cache: the cache updated with the new tokens,
// then masked softmax attention of each new token over the first len + T positions, with an
// attention sink (a per-head logit in the denominator).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/**
 * @brief (out, k_cache', v_cache') of decode attention. q [B, H, T, D]; caches [B, Hkv, S, D];
 * k, v [B, Hkv, T, D]; lengths [B]. The new tokens of sequence b take positions len_b .. len_b +
 * T - 1 of the caches; new token t (at position len_b + t) sees positions j <= len_b + t, and with
 * a window only those with j > len_b + t - window. Query head h reads kv head h / (H / Hkv).
 */
inline std::vector<RefTensor> decode_attention(const RefTensor& q, const RefTensor& k_cache, const RefTensor& v_cache,
                                               const RefTensor& k, const RefTensor& v, const RefTensor& lengths,
                                               const RefTensor& sinks, std::optional<double> scale_opt,
                                               int64_t window) {
  const int64_t B = q.shape[0], H = q.shape[1], T = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k_cache.shape[1], S = k_cache.shape[2];
  const double scale = scale_opt.value_or(1.0 / std::sqrt(double(D)));
  RefTensor kc = k_cache, vc = v_cache, out(q.shape);
  auto row = [&](RefTensor& t, int64_t b, int64_t g, int64_t j) { return &t.data[size_t(((b * Hkv + g) * S + j) * D)]; };
  for (int64_t b = 0; b < B; ++b) {
    const auto len = static_cast<int64_t>(lengths[b]);
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t t = 0; t < T; ++t) {
        const size_t src = size_t(((b * Hkv + g) * T + t) * D);
        std::copy_n(&k.data[src], D, row(kc, b, g, len + t));
        std::copy_n(&v.data[src], D, row(vc, b, g, len + t));
      }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        const double* qi = &q.data[size_t(((b * H + h) * T + t) * D)];
        const int64_t last = len + t, first = window > 0 ? std::max<int64_t>(0, last - window + 1) : 0;
        std::vector<double> s(size_t(last + 1), 0.0);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          const double* kj = row(kc, b, g, j);
          double dot = 0;
          for (int64_t x = 0; x < D; ++x) dot += qi[x] * kj[x];
          s[size_t(j)] = scale * dot;
          m = std::max(m, s[size_t(j)]);
        }
        // The sink's logit joins the denominator (and the maximum); -inf adds nothing.
        m = std::max(m, sinks[h]);
        double sum = std::exp(sinks[h] - m);
        for (int64_t j = first; j <= last; ++j) sum += std::exp(s[size_t(j)] - m);
        double* o = &out.data[size_t(((b * H + h) * T + t) * D)];
        for (int64_t j = first; j <= last; ++j) {
          const double p = std::exp(s[size_t(j)] - m) / sum;
          const double* vj = row(vc, b, g, j);
          for (int64_t x = 0; x < D; ++x) o[x] += p * vj[x];
        }
      }
    }
  }
  return {out, kc, vc};
}

}  // namespace nikki::kernels::reference
