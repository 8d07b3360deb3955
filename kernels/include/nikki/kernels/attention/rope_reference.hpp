// Float64 reference of rotary position embeddings (the Hugging Face formula) and its backward.
#pragma once

#include <cstdint>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/**
 * @brief The partner of rotary dim `i` (< r) and the sign of rotate(v)[i] = sign * v[partner]:
 * rotate_half (half-split: [-v2, v1]) or rotate every two (interleaved: pairs (2j, 2j + 1)
 * become (-v[2j + 1], v[2j])).
 */
inline std::pair<int64_t, double> rotate_partner(int64_t i, int64_t r, bool interleaved) {
  if (interleaved) return i % 2 == 0 ? std::pair{i + 1, -1.0} : std::pair{i - 1, 1.0};
  return i < r / 2 ? std::pair{i + r / 2, -1.0} : std::pair{i - r / 2, 1.0};
}

/**
 * @brief rope(x) = x * cos + rotate(x) * sin on the first r dims of x [B, H, S, D], the rest
 * passed through; cos and sin are [S, r], [B, S, r] or [1, S, r]. `backward`: the gradient of that map for
 * the incoming gradient x, g * cos + rotate^T(g * sin) (rotate^T = -rotate).
 */
inline RefTensor rope(const RefTensor& x, const RefTensor& cos, const RefTensor& sin, bool interleaved, bool backward) {
  const int64_t B = x.shape[0], H = x.shape[1], S = x.shape[2], D = x.shape[3];
  const int64_t r = cos.shape[cos.shape.rank() - 1];
  const bool per_batch = cos.shape.rank() == 3 && cos.shape[0] > 1;  // [1, S, r] is shared
  RefTensor out(x.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t row = ((b * H + h) * S + s) * D, cs = ((per_batch ? b * S : 0) + s) * r;
        for (int64_t i = 0; i < D; ++i) {
          if (i >= r) {
            out[row + i] = x[row + i];
            continue;
          }
          const auto [j, sign] = rotate_partner(i, r, interleaved);
          // forward: rotate(x)[i] * sin[i]; backward: rotate^T(g * sin)[i] = sign_j * g[j] * sin[j],
          // and the partner's sign sign_j is the opposite of sign.
          out[row + i] = x[row + i] * cos[cs + i] +
                         (backward ? -sign * x[row + j] * sin[cs + j] : sign * x[row + j] * sin[cs + i]);
        }
      }
  return out;
}

}  // namespace nikki::kernels::reference
