// How the library kernels cut a problem into tiles: rows onto partitions (with tails, and several
// short rows per partition), and long rows into column chunks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "nikki/nikki.hpp"

namespace nikki::kernels::toolkit {

/** @brief The first n partitions (or elements) of a dim: nl::ds(0, n). */
inline Slice first(int64_t n) { return nl::ds(0, n); }

/**
 * @brief The rows of one tile of a 2-D problem: partition q holds rows r0 + q * g ...
 * r0 + q * g + g - 1. Packing g > 1 short rows per partition keeps DMA runs long and amortizes
 * per-instruction costs.
 */
struct RowTile {
  int64_t r0 = 0;  // first row
  int64_t p = 0;   // partitions used
  int64_t g = 1;   // rows per partition

  int64_t rows() const { return p * g; }
  /** @brief The tile's rows of an [R, C] HBM tensor, columns [c0, c0 + cw), as [p, g, cw] (each
   *  partition reads one contiguous run). */
  Tensor view(const Tensor& t, int64_t c0, int64_t cw) const {
    return t(nl::ds(r0, p * g), nl::ds(c0, cw)).reshape_dim(0, {p, g});
  }
  /** @brief The tile's rows as [p, cw] (one row per partition; g must be 1). */
  Tensor rows_view(const Tensor& t, int64_t c0, int64_t cw) const { return t(nl::ds(r0, p), nl::ds(c0, cw)); }
};

/** @brief R rows as tiles of P partitions x g rows, then one of fewer rows per partition, then
 *  the tail of fewer than P rows (one per partition). */
inline std::vector<RowTile> row_tiles(int64_t R, int64_t P, int64_t g = 1) {
  std::vector<RowTile> tiles;
  int64_t r = 0;
  for (; R - r >= P * g; r += P * g) tiles.push_back({r, P, g});
  if (const int64_t g2 = (R - r) / P; g2 > 0) {
    tiles.push_back({r, P, g2});
    r += P * g2;
  }
  if (r < R) tiles.push_back({r, R - r, 1});
  return tiles;
}

/** @brief A span of columns [c0, c0 + width). */
struct ColumnChunk {
  int64_t c0 = 0;
  int64_t width = 0;
};

/**
 * @brief Width of balanced column chunks of at most `max_cols`: the fewest chunks, of equal
 * width rounded up to a multiple of `align` (even widths keep VectorE's 16-bit fast paths), the
 * last one taking the remainder.
 */
inline int64_t chunk_width(int64_t C, int64_t max_cols, int64_t align = 64) {
  const int64_t chunks = (C + max_cols - 1) / max_cols;
  const int64_t w = (C + chunks - 1) / chunks;
  return std::min(C, (w + align - 1) / align * align);
}

/** @brief The chunks of C columns at most `max_cols` wide (see chunk_width). */
inline std::vector<ColumnChunk> column_chunks(int64_t C, int64_t max_cols, int64_t align = 64) {
  const int64_t w = chunk_width(C, max_cols, align);
  std::vector<ColumnChunk> chunks;
  for (int64_t c0 = 0; c0 < C; c0 += w) chunks.push_back({c0, std::min(w, C - c0)});
  return chunks;
}

/**
 * @brief How a row-wise kernel (softmax, its backward, ...) covers x [R, C]: whole rows when the
 * tiles it keeps in flight fit, several short rows per partition; else column chunks, which
 * the kernel visits in two passes (statistics, then results).
 */
struct RowPlan {
  bool whole_rows = true;
  int64_t g = 1;      // rows per partition of a whole-row tile
  int64_t chunk = 0;  // columns per chunk when rows are chunked
  std::vector<RowTile> tiles;
  std::vector<ColumnChunk> chunks;  // [0, C) as one chunk for whole rows
};

/**
 * @brief Plans rows for a kernel whose tiles in flight take `bytes_per_column` bytes per
 * partition per column of a row (every row-shaped ring: slots x element size), within `budget`
 * bytes per partition. Whole rows pack up to ~4K elements per partition (long DMA runs, few
 * instructions), but leave enough tiles for the pipeline to overlap when R allows (fewer for
 * narrow rows, whose per-tile cost is mostly fixed). Chunks are balanced, at most 4096 columns,
 * and use about half the budget: a fuller SBUF buys nothing once DMAs are ~1 MiB.
 */
inline RowPlan plan_rows(int64_t R, int64_t C, int64_t bytes_per_column, int64_t budget, int64_t P,
                         int64_t narrow_below) {
  RowPlan plan;
  if (C * bytes_per_column <= budget) {
    const int64_t fit = budget / (C * bytes_per_column);
    const int64_t spread = R / ((C < narrow_below ? 2 : 8) * P);
    plan.g = std::max<int64_t>(1, std::min({4096 / C, fit, spread}));
    plan.tiles = row_tiles(R, P, plan.g);
    plan.chunks = {{0, C}};
    return plan;
  }
  plan.whole_rows = false;
  plan.chunk = chunk_width(C, std::clamp<int64_t>(budget / 2 / bytes_per_column / 64 * 64, 64, 4096));
  plan.tiles = row_tiles(R, P, 1);
  plan.chunks = column_chunks(C, plan.chunk);
  return plan;
}

}  // namespace nikki::kernels::toolkit
