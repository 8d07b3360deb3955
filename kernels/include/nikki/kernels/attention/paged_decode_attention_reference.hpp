// Float64 reference of paged decode attention: each sequence's blocks gathered into a contiguous
// cache through its block table, decode attention over it (decode_attention_reference.hpp), and
// the new tokens' rows scattered back into their blocks.
#pragma once

#include <algorithm>
#include <optional>
#include <vector>

#include "nikki/kernels/attention/decode_attention_reference.hpp"

namespace nikki::kernels::reference {

/**
 * @brief (out, k_cache', v_cache') of paged decode attention. q [B, H, T, D]; caches
 * [num_blocks, Hkv, block_size, D]; k, v [B, Hkv, T, D]; block_table [B, max_blocks]; lengths
 * [B]. Position j of sequence b is row j % block_size of block block_table[b, j / block_size].
 */
inline std::vector<RefTensor> paged_decode_attention(const RefTensor& q, const RefTensor& k_cache,
                                                     const RefTensor& v_cache, const RefTensor& k, const RefTensor& v,
                                                     const RefTensor& block_table, const RefTensor& lengths,
                                                     const RefTensor& sinks, std::optional<double> scale, int64_t window) {
  const int64_t B = q.shape[0], Hkv = k_cache.shape[1], bs = k_cache.shape[2], D = k_cache.shape[3];
  const int64_t MB = block_table.shape[1], S = MB * bs;
  // The element of position j, kv head g of sequence b in the paged cache.
  auto paged = [&](int64_t b, int64_t g, int64_t j) {
    const auto block = static_cast<int64_t>(block_table[b * MB + j / bs]);
    return size_t(((block * Hkv + g) * bs + j % bs) * D);
  };
  auto contiguous = [&](int64_t b, int64_t g, int64_t j) { return size_t(((b * Hkv + g) * S + j) * D); };
  RefTensor kc(Shape{B, Hkv, S, D}), vc(Shape{B, Hkv, S, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t j = 0; j < S; ++j) {
        std::copy_n(&k_cache.data[paged(b, g, j)], D, &kc.data[contiguous(b, g, j)]);
        std::copy_n(&v_cache.data[paged(b, g, j)], D, &vc.data[contiguous(b, g, j)]);
      }
  std::vector<RefTensor> r = decode_attention(q, kc, vc, k, v, lengths, sinks, scale, window);
  RefTensor k_out = k_cache, v_out = v_cache;
  const int64_t T = q.shape[2];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t j = static_cast<int64_t>(lengths[b]); j < static_cast<int64_t>(lengths[b]) + T; ++j) {
        std::copy_n(&r[1].data[contiguous(b, g, j)], D, &k_out.data[paged(b, g, j)]);
        std::copy_n(&r[2].data[contiguous(b, g, j)], D, &v_out.data[paged(b, g, j)]);
      }
  return {r[0], k_out, v_out};
}

}  // namespace nikki::kernels::reference
