// Whether a routine may run an instruction's element loop in any order: the overlap test between
// its destination and its sources. The kernel library evaluates it at run time from the operands'
// addresses; the template builder evaluates the same code at compile time when every operand is
// on chip (the allocator fixed the addresses) and stores the verdict in the descriptor, so LLVM
// keeps one version of each loop instead of an ordered and an unordered one.
//
// Compiled by both g++ (the compiler side) and clang (the bitcode side).
#pragma once

#include <cstdint>

#include "nikki/dtype.hpp"
#include "op_desc.hpp"

namespace nikki::native {

/** @brief Bit of overlap_hazards' result: dst itself may address an element twice (or is irregular). */
inline constexpr uint32_t kHazardDst = 1u << 31;

inline int64_t element_bytes(const OpDesc* d, int slot) { return dtype_size(static_cast<DType>(d->view[slot].dtype)); }

/** @brief Byte offsets [lo, hi) of a regular slot's elements from its base, over the iteration space. */
inline void extent(const OpDesc* d, int slot, int64_t& lo, int64_t& hi) {
  lo = 0, hi = 0;
  for (int k = 0; k < kIterDims; ++k) {
    const int64_t span = (d->count[k] - 1) * d->view[slot].stride[k];
    if (span < 0) lo += span;
    else hi += span;
  }
  hi += element_bytes(d, slot);
}

/** @brief Whether a regular slot and dst share no byte at all, seen row by row of their outermost
 * dim (the one of largest stride, which both must step by the same S: the partition dim of on-chip
 * tiles, whichever iteration dim carries it). Row i of dst covers [base_d + i*S + dlo,
 * base_d + i*S + dhi) over its other dims and row j of the slot the same with its own extent, so
 * the two meet only if some row shift k = j - i (|k| < rows) puts k*S strictly between
 * base_d - base_s + dlo - shi and base_d - base_s + dhi - slo. Two tiles at different byte offsets
 * of the same partitions are disjoint although their linear extents overlap. */
inline bool disjoint_by_rows(const OpDesc* d, int dst, int s, const intptr_t (&base)[kSlots]) {
  int row = -1;
  for (int k = 0; k < kIterDims; ++k)
    if (d->count[k] > 1 && (row < 0 || d->view[dst].stride[k] > d->view[dst].stride[row])) row = k;
  if (row < 0) return false;
  const int64_t stride = d->view[dst].stride[row];
  if (stride <= 0 || d->view[s].stride[row] != stride) return false;
  int64_t dlo = 0, dhi = 0, slo = 0, shi = 0;
  for (int k = 0; k < kIterDims; ++k) {
    if (k == row) continue;
    const int64_t ds = (d->count[k] - 1) * d->view[dst].stride[k], ss = (d->count[k] - 1) * d->view[s].stride[k];
    (ds < 0 ? dlo : dhi) += ds;
    (ss < 0 ? slo : shi) += ss;
  }
  dhi += element_bytes(d, dst);
  shi += element_bytes(d, s);
  const int64_t delta = static_cast<int64_t>(base[dst] - base[s]);
  const int64_t lo = delta + dlo - shi, hi = delta + dhi - slo;  // k*stride must avoid (lo, hi)
  const int64_t rows = d->count[row];
  // the smallest shift above lo (floor(lo / stride) + 1), but not below -(rows - 1)
  int64_t k = (lo >= 0 ? lo / stride : -((-lo + stride - 1) / stride)) + 1;
  if (k < 1 - rows) k = 1 - rows;
  return !(k < rows && k * stride < hi);
}

/** @brief Whether distinct iteration points address distinct elements of a regular slot: taken
 * from the smallest stride up, each dim steps over everything the dims inside it cover. */
inline bool injective(const OpDesc* d, int slot) {
  int64_t stride[kIterDims], span[kIterDims];
  int n = 0;
  for (int k = 0; k < kIterDims; ++k)
    if (d->count[k] > 1) {
      const int64_t s = d->view[slot].stride[k] < 0 ? -d->view[slot].stride[k] : d->view[slot].stride[k];
      int i = n++;
      for (; i > 0 && stride[i - 1] > s; --i) stride[i] = stride[i - 1], span[i] = span[i - 1];
      stride[i] = s, span[i] = (d->count[k] - 1) * s;
    }
  int64_t inner = element_bytes(d, slot);
  for (int i = 0; i < n; ++i) {
    if (stride[i] < inner) return false;
    inner += span[i];
  }
  return true;
}

/**
 * @brief The slots whose elements a routine must not process out of order, given each tensor
 * slot's base address: kHazardDst when `dst` may address an element twice, and bit s for a source
 * that shares bytes with dst without being dst's own elements in the same order (an in-place
 * update is safe: each element is read before it is written, by the same iteration).
 */
inline uint32_t overlap_hazards(const OpDesc* d, int dst, const intptr_t (&base)[kSlots]) {
  if (((d->irregular >> dst) & 1) || !injective(d, dst)) return kHazardDst;
  int64_t dlo, dhi;
  extent(d, dst, dlo, dhi);
  uint32_t hazards = 0;
  for (int s = 0; s < kSlots; ++s) {
    if (s == dst || d->slot_kind[s] != kSlotTensor) continue;
    if ((d->irregular >> s) & 1) {
      hazards |= 1u << s;
      continue;
    }
    int64_t lo, hi;
    extent(d, s, lo, hi);
    if (base[s] + hi <= base[dst] + dlo || base[dst] + dhi <= base[s] + lo) continue;
    if (disjoint_by_rows(d, dst, s, base)) continue;
    bool same = base[s] == base[dst] && element_bytes(d, s) == element_bytes(d, dst);
    for (int k = 0; k < kIterDims; ++k)
      same = same && (d->count[k] == 1 || d->view[s].stride[k] == d->view[dst].stride[k]);
    if (!same) hazards |= 1u << s;
  }
  return hazards;
}

}  // namespace nikki::native
