// How views map onto memory: element ranges, partitions and bytes. Shared by the verifier, the
// allocator, the scheduler and the executors so they agree on what a view touches.
#pragma once

#include <algorithm>
#include <cstdint>

#include "nikki/access_pattern.hpp"
#include "nikki/ir.hpp"

namespace nikki {

/** @brief Bytes between consecutive partitions of an on-chip memory in nikki's simulated core. */
inline int64_t partition_pitch(const TargetConfig& t, Buffer b) {
  return b == Buffer::sbuf ? int64_t(t.sbuf_bytes_per_partition) : int64_t(t.psum_bytes_per_partition());
}

/** @brief Elements of dtype `view_dtype` in one partition row of an on-chip storage. */
inline int64_t row_elements(const Storage& s, DType view_dtype) {
  return s.partition_bytes() / dtype_size(view_dtype);
}

/** @brief Elements of dtype `view_dtype` that fit in the whole storage. */
inline int64_t storage_elements(const Storage& s, DType view_dtype) {
  return s.total_bytes() / dtype_size(view_dtype);
}

/**
 * @brief The LinearExtent of a static view that was validated when it was made (InternalError if
 * its extent does not fit in int64; the verifier checks raw IR with checked_linear_extent).
 */
inline LinearExtent linear_extent(const AccessPattern& ap) {
  std::optional<LinearExtent> e = checked_linear_extent(ap);
  internal_check(e.has_value(), "linear extent of an unvalidated view overflowed int64");
  return *e;
}

/**
 * @brief A view of an on-chip storage as engines see it: `partitions` consecutive partitions from
 * `first_partition`, each holding the same free-element pattern starting at `first_free`.
 */
struct TileGeometry {
  int64_t first_partition = 0;  // relative to the storage
  int64_t partitions = 1;
  int64_t first_free = 0;   // element offset within a row of the first touched free element
  int64_t last_free = 0;    // ... and of the last one (inclusive)
  int64_t free_elements = 1;  // elements per partition the view enumerates
  bool partition_contiguous = true;  // dim 0 steps exactly one partition
  bool rows_in_bounds = true;        // every free access stays inside its partition row
};

/** @brief Engine-side geometry of a static on-chip view (dim 0 is the partition dim). */
inline TileGeometry tile_geometry(const Storage& s, const AccessPattern& ap) {
  TileGeometry g;
  const int64_t row = row_elements(s, ap.dtype);
  if (ap.rank == 0 || row == 0) return g;
  const int64_t base_partition = ap.offset >= 0 ? ap.offset / row : -1;
  g.first_partition = base_partition;
  g.partitions = ap.dims[0].count;
  g.partition_contiguous = ap.dims[0].count == 1 || ap.dims[0].stride == row;
  int64_t f0 = ap.offset - base_partition * row;
  g.first_free = f0;
  g.last_free = f0;
  for (int d = 1; d < ap.rank; ++d) {
    int64_t span = ap.dims[d].stride * (ap.dims[d].count - 1);
    if (span < 0) g.first_free += span;
    else g.last_free += span;
  }
  g.free_elements = ap.inner_elements();
  g.rows_in_bounds = base_partition >= 0 && g.first_free >= 0 && g.last_free < row;
  return g;
}

/** @brief Byte range [begin, end) inside each partition that a tile view touches (relative to the storage). */
struct ByteRange {
  int64_t begin;
  int64_t end;
};

inline ByteRange partition_byte_range(const Storage& s, const AccessPattern& ap) {
  TileGeometry g = tile_geometry(s, ap);
  const int64_t size = dtype_size(ap.dtype);
  return {g.first_free * size, (g.last_free + 1) * size};
}

}  // namespace nikki
