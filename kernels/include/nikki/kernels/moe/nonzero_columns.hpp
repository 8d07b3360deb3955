// The rows of the nonzero entries of each column of a [T, C] matrix, compacted: GpSimd's
// nonzero_with_count, which compacts the free dim of partitions 0, 16, ..., 112 (one GpSimd core
// each), so eight columns at a time. Each tile of 128 rows becomes an indicator (1 where nonzero,
// bf16), whose columns are spread to the partitions of the GpSimd cores and transposed on the
// Tensor engine into a chunk of up to L rows along the free dim; a column's compacted chunk goes
// to HBM at the count of its earlier chunks (a runtime offset, the carry).
//
// A chunk of w rows with n nonzeros writes w entries: its n indices, then -1. Its carry is at
// most the rows of the earlier chunks, so the write ends within the row; later chunks overwrite
// the -1s from their own carry on. What no chunk writes (past the last chunk's end) is -1 from a
// fill before the first chunk, when there is more than one chunk or the rows are padded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/gather/indexed_rows.hpp"
#include "nikki/kernels/mlp/transposed_rows.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels::moe {

using toolkit::first;

/** @brief Rows whose indices are exact in the engines' fp32 arithmetic (carries, offsets). */
inline constexpr int64_t kMaxRows = int64_t(1) << 24;

/** @brief Records the tasks that fill `indicator` ([p, C] bf16: 1 where row rt.r0 + q of the
 *  matrix has a nonzero entry in column c, else 0) for the row tile `rt`. Called once per tile,
 *  in order. */
using IndicatorSource = std::function<void(const Tensor& indicator, const toolkit::RowTile& rt)>;

/** @brief Fails unless the target has GpSimd's nonzero_with_count (NeuronCore-v3 and later). */
inline void require_nonzero_with_count(const ArgumentCheck& check, const Tensor& any) {
  const TargetConfig& t = any.builder().config();
  if (t.generation < 3)
    check.fail("needs GpSimd's nonzero_with_count, which " + std::string(t.name) + " does not have",
               "NeuronCore-v3 (trn2) and later", "trace the kernel for target trn2");
}

/** @brief A PSUM ring of `slots` [P, free] tiles (as Ring::psum) in banks from `first_bank` on,
 *  placed there rather than by the allocator: a kernel whose later phase needs the PSUM
 *  unfragmented puts an earlier phase's tiles in the last banks. */
inline toolkit::Ring psum_ring_at(toolkit::Budget& budget, int64_t P, int64_t free, DType dtype, int64_t slots,
                                  int64_t first_bank, const std::string& name) {
  const nl::TileSize ts = nl::tile_size();
  const int64_t bank_elems = ts.psum_bank_fmax_bytes / dtype_size(dtype), per_bank = bank_elems / free;
  const int64_t banks = ceil_div(slots, per_bank);
  budget.reserve_psum(banks, name);
  Tensor t = nl::ndarray({P, banks, bank_elems}, dtype, nl::psum, name,
                         Address{0, static_cast<uint32_t>(first_bank * ts.psum_bank_fmax_bytes)});
  std::vector<Tensor> views;
  for (int64_t s = 0; s < slots; ++s) views.push_back(t(nl::all, s / per_bank, nl::ds((s % per_bank) * free, free)));
  return toolkit::Ring(std::move(views));
}

/** @brief PSUM banks nonzero_columns' transposes take. */
inline constexpr int64_t kNonzeroPsumBanks = 2;

/**
 * @brief Records indices[c, 0 : n_c] = the rows t < T whose column c is nonzero (increasing),
 * indices[c, n_c : W] = -1, counts[c] = n_c, for the T x C matrix that `source` describes.
 * `indices` is int32 [C, W] with W >= T (rows may be padded), `counts` int32 [C]. `chunk`: rows
 * per chunk (a multiple of 128; 0 chooses from the SBUF `budget` leaves). `psum_bank`: where
 * its kNonzeroPsumBanks banks of transposes go (see psum_ring_at; nullopt: the allocator's choice).
 */
inline void nonzero_columns(toolkit::TaskScheduler& sch, toolkit::Budget& budget, const ArgumentCheck& check,
                            int64_t T, int64_t C, const IndicatorSource& source, const Tensor& indices,
                            const Tensor& counts, int64_t chunk = 0, std::optional<int64_t> psum_bank = std::nullopt) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const auto all = nl::all;
  require_nonzero_with_count(check, indices);
  const TargetConfig& target = indices.builder().config();
  const int64_t P = nl::tile_size().pmax, group = target.gpsimd_core_partitions, lanes = P / group;
  const int64_t rounds = ceil_div(C, lanes), W = indices.shape()[1];
  // Per row of a chunk: every round's indicator rows (bf16) and two compacted chunks (int32).
  const int64_t padded_T = ceil_div(T, P) * P;
  const int64_t per_row = 2 * rounds + 2 * 4;
  const int64_t cap = std::min<int64_t>(budget.sbuf_free() / 4, 64 * 1024);
  const int64_t L = chunk > 0 ? std::min(chunk, padded_T)
                              : std::clamp<int64_t>(cap / per_row / P * P, P, padded_T);
  const int64_t chunks = ceil_div(T, L);

  Tensor indicators = budget.sbuf({P, rounds, L}, nl::bfloat16, "column_indicators");
  toolkit::Ring ind_ring = budget.sbuf_ring({P, C}, nl::bfloat16, 2, "row_indicator");
  toolkit::Ring spread_ring = budget.sbuf_ring({P, P}, nl::bfloat16, 2, "spread_indicator");
  toolkit::Ring dst_ring = budget.sbuf_ring({P, L + 1}, nl::int32, 2, "compacted_rows");
  Tensor carry = budget.sbuf({P, rounds}, nl::int32, "carry");
  Tensor fill = budget.sbuf({P, std::clamp<int64_t>(C * W / P, 1, 2048)}, nl::int32, "padding_fill");
  constexpr int64_t kTransposes = 16;
  toolkit::Ring tr_ring = psum_bank ? psum_ring_at(budget, P, P, nl::bfloat16, kTransposes, *psum_bank, "indicator_transposes")
                                    : budget.psum_ring({P, P}, nl::bfloat16, kTransposes, "indicator_transposes");

  // nonzero_with_count writes only the partitions of the GpSimd cores: the others of each
  // compacted tile are cleared once, so that the carry update reads defined values.
  for (int64_t s = 0; s < dst_ring.slots(); ++s)
    sch.add_any({[&] { isa::memset(dst_ring.slot(s), 0.0, isa::gpsimd_engine); },
                 [&] { isa::memset(dst_ring.slot(s), 0.0, isa::vector_engine); }});
  sch.add_any({[&] { isa::memset(carry, 0.0, isa::gpsimd_engine); }, [&] { isa::memset(carry, 0.0, isa::vector_engine); }});
  if (chunks > 1 || W > T) {
    sch.add_any({[&] { isa::memset(fill, -1.0, isa::gpsimd_engine); }, [&] { isa::memset(fill, -1.0, isa::vector_engine); }});
    gather::fill_from(sch, indices, fill);
  }

  for (int64_t j = 0; j < chunks; ++j) {
    const int64_t t0 = j * L, w = std::min(L, T - t0);
    // Rows -> indicator -> round r's columns on the GpSimd cores' partitions -> along the free dim.
    for (toolkit::RowTile rt : toolkit::row_tiles(w, P)) {
      const int64_t p = rt.p, local = rt.r0;
      rt.r0 += t0;
      const Tensor ind = ind_ring.next()(first(p), all);
      source(ind, rt);
      for (int64_t r = 0; r < rounds; ++r) {
        const int64_t n = std::min(lanes, C - r * lanes);
        const Tensor sp = spread_ring.next()(first(p), all);
        sch.add_any({[&] { isa::memset(sp, 0.0, isa::gpsimd_engine); }, [&] { isa::memset(sp, 0.0, isa::vector_engine); }});
        const Tensor lanes_view = sp.reshape({p, lanes, group})(all, nl::ds(0, n), 0);
        sch.add_any({[&] { isa::tensor_copy(lanes_view, ind(all, nl::ds(r * lanes, n)), isa::gpsimd_engine); },
                     [&] { isa::tensor_copy(lanes_view, ind(all, nl::ds(r * lanes, n)), isa::vector_engine); }});
        const Tensor tr = tr_ring.next()(all, first(p));
        sch.add([&] { isa::nc_transpose(tr, sp); });
        const Tensor d = indicators(all, r, nl::ds(local, p));
        sch.add_any({[&] { mlp::copy_from_psum(d, tr, Engine::vector); }, [&] { mlp::copy_from_psum(d, tr, Engine::scalar); }});
      }
    }
    for (int64_t r = 0; r < rounds; ++r) {
      const int64_t n = std::min(lanes, C - r * lanes);
      const Tensor d = dst_ring.next()(all, nl::ds(0, w + 1));
      sch.add([&] { isa::nonzero_with_count(d, indicators(all, r, nl::ds(0, w)), t0, -1); });
      for (int64_t q = 0; q < n; ++q) {
        const int64_t c = r * lanes + q;
        const Tensor row = indices.ap({{1, 1}, {1, w}}, ApOptions{.offset = c * W,
                                                                  .scalar_offset_tensor = carry(nl::ds(q * group, 1), nl::ds(r, 1)),
                                                                  .indirect_dim = 1});
        sch.add([&] { isa::dma_copy(row, d(nl::ds(q * group, 1), nl::ds(0, w))); });
      }
      sch.add([&] { isa::tensor_tensor(carry(all, nl::ds(r, 1)), carry(all, nl::ds(r, 1)), d(all, nl::ds(w, 1)), nl::add, isa::vector_engine); });
    }
  }
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t n = std::min(lanes, C - r * lanes);
    sch.add([&] {
      isa::dma_copy(counts(nl::ds(r * lanes, n)).reshape({n, 1}), carry(Slice{0, n * group, group}, nl::ds(r, 1)));
    });
  }
}

}  // namespace nikki::kernels::moe
