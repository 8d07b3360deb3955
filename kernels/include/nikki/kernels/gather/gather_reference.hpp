// Float64 references of the row gather/scatter family: embedding lookup (F.embedding) and its
// weight gradient, gathering rows by index and scatter-adding (optionally scaled) rows back.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::reference {

/** @brief out [N, H]: row n is table[index[n]], or zeros when the index is outside [0, R). */
inline RefTensor gather_rows(const RefTensor& table, const RefTensor& index) {
  const int64_t R = table.shape[0], H = table.shape[1], N = index.size();
  RefTensor out(Shape{N, H});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = int64_t(index[n]);
    if (r < 0 || r >= R) continue;
    for (int64_t h = 0; h < H; ++h) out[n * H + h] = table[r * H + h];
  }
  return out;
}

/** @brief out [R, H] = sum over n with index[n] == r of scale[n] * rows[n] (scale 1 when absent);
 *  indices outside [0, R) and `skip` (padding) contribute nothing. */
inline RefTensor scatter_add_rows(const RefTensor& rows, const RefTensor& index, const RefTensor* scale, int64_t R,
                                  std::optional<int64_t> skip = std::nullopt) {
  const int64_t N = rows.shape[0], H = rows.shape[1];
  RefTensor out(Shape{R, H});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = int64_t(index[n]);
    if (r < 0 || r >= R || (skip && r == *skip)) continue;
    const double s = scale ? (*scale)[n] : 1.0;
    for (int64_t h = 0; h < H; ++h) out[r * H + h] += s * rows[n * H + h];
  }
  return out;
}

/** @brief {grad_rows [N, H], grad_scale [N]} of scatter_add_rows: grad_rows[n] = scale[n] *
 *  grad_out[index[n]], grad_scale[n] = rows[n] . grad_out[index[n]] (zero for skipped indices). */
inline std::vector<RefTensor> scatter_add_rows_backward(const RefTensor& rows, const RefTensor& index,
                                                        const RefTensor& scale, const RefTensor& grad_out) {
  const int64_t N = rows.shape[0], H = rows.shape[1], R = grad_out.shape[0];
  RefTensor grad_rows(rows.shape), grad_scale(Shape{N});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = int64_t(index[n]);
    if (r < 0 || r >= R) continue;
    for (int64_t h = 0; h < H; ++h) {
      grad_rows[n * H + h] = scale[n] * grad_out[r * H + h];
      grad_scale[n] += rows[n * H + h] * grad_out[r * H + h];
    }
  }
  return {grad_rows, grad_scale};
}

/** @brief padding_idx as torch normalizes it: a negative value counts from the end of V rows. */
inline std::optional<int64_t> normalized_padding(std::optional<double> padding_idx, int64_t V) {
  if (!padding_idx) return std::nullopt;
  const int64_t p = int64_t(*padding_idx);
  return p < 0 ? p + V : p;
}

}  // namespace nikki::kernels::reference
