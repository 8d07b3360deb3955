// The maths the row gather/scatter kernels share: HBM rows addressed by runtime indices (indirect
// DMA with a per-partition vector offset), the gather that copies them into SBUF, and the
// scatter-add that accumulates a tile of rows into them.
//
// Scatter-adding rows whose indices repeat is the delicate part. The DMA engines add in fp32
// (read-modify-write of the destination row), but the rows of one transfer may be processed in
// any order and concurrently, so one transfer must not name a row twice. Duplicates are
// therefore combined on the Tensor engine first, without sorting: for a tile of p rows with
// indices id, the p x p matrix same[t', t] = (id[t'] == id[t]) * scale[t'] times the tile gives,
// for every row t, the (scaled) sum of all the rows of the tile that share its index (fp32 PSUM).
// Only the first row of each index keeps its index for the scatter; the others, and rows the
// caller drops (padding), get an index past the table's end and the transfer skips them
// (oob_mode=skip). Successive tiles' transfers touch the destination through runtime views, which
// claim the whole tensor, so they are ordered one after another and accumulate correctly.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels::gather {

using toolkit::first;

/** @brief What an index outside the table does: a runtime error (NKI's default oob_mode), or
 *  nothing (the element is not transferred: gathered rows stay zero, scattered rows are dropped). */
enum class OutOfRange { error, skip };

/** @brief Rows per tile outside a kernel (tolerances): the partitions of the default target. */
inline int64_t tile_rows() { return int64_t(target_config(default_target()).num_partitions); }

/** @brief Tolerance of a sum of rows that 16-bit outputs round once per tile of tile_rows()
 *  rows (embedding_bwd, scatter_add_rows): the dtype's atol per tile, over the rows of input 1. */
inline Tolerance per_tile_sum_tolerance(const ExampleCase& c) {
  const Tolerance d = dtype_tolerance(c.inputs[0].dtype);
  return {d.rtol, d.atol * double(ceil_div(c.inputs[1].shape[0], tile_rows()))};
}

/** @brief The dtype of a drawn case of the family. */
inline DType draw_dtype(CaseRng& r) { return r.pick({DType::float32, DType::bfloat16, DType::float16}); }

/** @brief Indices are compared in fp32 on the engines: exact below 2^24. */
inline constexpr int64_t kMaxIndexedRows = int64_t(1) << 24;

/** @brief The HBM rows index[q] of a 2-D table (one per partition q of `index`, an SBUF [p, 1]
 *  int32 tile), columns [c0, c0 + w): a view with a runtime vector offset. */
inline Tensor indexed_rows(const Tensor& table, const Tensor& index, int64_t c0, int64_t w) {
  const int64_t H = table.shape()[1];
  return table.ap({{H, index.shape()[0]}, {1, w}}, ApOptions{.offset = c0, .vector_offset = index});
}

/** @brief The [p, 1] HBM view of entries [r0, r0 + p) of a 1-D tensor (one per partition). */
inline Tensor entries(const Tensor& t, const toolkit::RowTile& rt) { return t(nl::ds(rt.r0, rt.p)).reshape({rt.p, 1}); }

/** @brief The same entries as one row repeated on every partition: [p, p]. */
inline Tensor entries_across(const Tensor& t, const toolkit::RowTile& rt) {
  return t(nl::ds(rt.r0, rt.p)).reshape({1, rt.p}).broadcast(0, rt.p);
}

/** @brief dst [p, w] = table[index[q], c0 : c0 + w] (one DMA transfer). With OutOfRange::skip the
 *  rows of out-of-range indices are left as they are. */
inline void gather(const Tensor& dst, const Tensor& table, const Tensor& index, int64_t c0, OutOfRange oob) {
  isa::dma_copy(dst, indexed_rows(table, index, c0, dst.shape()[1]), {.oob_skip = oob == OutOfRange::skip});
}

/** @brief table[index[q], c0 : c0 + w] += src[q] inside the DMA engines (fp32 adds, rounded to
 *  the table's dtype); out-of-range indices are skipped. The indices must be unique. */
inline void scatter_add(const Tensor& table, const Tensor& index, const Tensor& src, int64_t c0) {
  const Tensor dst = indexed_rows(table, index, c0, src.shape()[1]);
  isa::dma_compute(dst, {dst, src}, {.oob_skip = true});
}

/**
 * @brief The duplicate-combining maths of one tile of p rows (see the file comment), one
 * instruction per call. `rows` is the number of rows of the destination table: the index that
 * marks a row as not scattered.
 */
struct TileDuplicates {
  int64_t rows = 0;

  /** equal[t, t'] = (id[t'] == id[t]) from the indices across the partitions ([p, p] int32) and
   *  each partition's own index (fp32 [p, 1]); symmetric. */
  static void equal(const Tensor& equal, const Tensor& ids_across, const Tensor& id) {
    isa::tensor_scalar(equal, ids_across, nl::equal, id);
  }
  /** same[t', t] = equal[t', t] * scale[t'] in the rows' dtype: the stationary operand. */
  static void same(const Tensor& same, const Tensor& equal, const std::optional<Tensor>& scale, Engine engine) {
    if (!scale) isa::tensor_copy(same, equal, engine);
    else if (engine == Engine::scalar) isa::activation(same, nl::copy, equal, {.scale = *scale});
    else isa::tensor_scalar(same, equal, nl::multiply, *scale, {.engine = engine});
  }
  /** The engines `same` can run on. */
  static std::array<Engine, 2> same_engines(bool scaled) {
    return {scaled ? Engine::scalar : Engine::gpsimd, Engine::vector};
  }
  /** earlier[t, t'] = equal[t, t'] where t' < t, else 0 (partition t, free t': t - t' > 0). */
  static void earlier(const Tensor& earlier, const Tensor& equal) {
    isa::affine_select(earlier, {{-1, equal.shape()[1]}}, 1, equal, 0.0, nl::greater);
  }
  /** count[t] = the rows before t in the tile with t's index. */
  static void count(const Tensor& count, const Tensor& earlier) { isa::tensor_reduce(count, nl::add, earlier, {1}); }
  /** keep[t] = (count[t] == 0) * (id[t] != padding): whether row t carries its index's sum. */
  static void keep(const Tensor& keep, const Tensor& count, const Tensor& id, std::optional<int64_t> padding) {
    if (padding) {
      isa::tensor_scalar(keep, id, nl::not_equal, double(*padding));
      isa::tensor_scalar(keep, count, nl::equal, 0.0, {.op1 = nl::multiply, .operand1 = keep});
    } else {
      isa::tensor_scalar(keep, count, nl::equal, 0.0);
    }
  }
  /** target = (id - rows) * keep + rows, i.e. id where kept, else `rows` (past the end). */
  void target(const Tensor& target, const Tensor& id, const Tensor& keep) const {
    isa::tensor_scalar(target, id, nl::subtract, double(rows), {.op1 = nl::multiply, .operand1 = keep});
    isa::tensor_scalar(target, target, nl::add, double(rows));
  }
  /** combined[t, c] = sum_t' same[t', t] * tile[t', c] for one PSUM bank of columns (overwriting
   *  what an earlier tile left in the bank). */
  static void combine(const Tensor& combined, const Tensor& same, const Tensor& tile) {
    isa::nc_matmul(combined, same, tile, {.accumulate = false});
  }
};

/** @brief The dtypes of the family's registrations: float tables, int32 indices. */
inline std::vector<DType> family_dtypes() { return {DType::float32, DType::bfloat16, DType::float16, DType::int32}; }

/** @brief Checks a 1-D int32 index tensor of `n` entries (n = 0: any length). */
inline void check_index(const ArgumentCheck& check, const Tensor& index, const std::string& what, int64_t n = 0) {
  check.require(index.ndim() == 1 && index.dtype() == DType::int32 && (n == 0 || index.shape()[0] == n),
                "'" + index.name() + "' must be a 1-D int32 tensor of " + what + ", got " +
                    std::string(dtype_name(index.dtype())) + index.shape().str(),
                "flatten the indices and convert them: idx.reshape(-1).to(torch.int32)");
}

/** @brief Checks a 2-D float table whose rows are addressed by index (fewer than 2^24 rows). */
inline void check_table(const ArgumentCheck& check, const Tensor& table) {
  const DType dt = table.dtype();
  check.require(table.ndim() == 2 && (dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16),
                "'" + table.name() + "' must be a 2-D float32, bfloat16 or float16 tensor [rows, H], got " +
                    std::string(dtype_name(dt)) + table.shape().str(),
                "flatten the leading dims into rows");
  if (table.shape()[0] >= kMaxIndexedRows)
    check.fail("'" + table.name() + "' has " + std::to_string(table.shape()[0]) + " rows",
               "at most 2^24 - 1 rows (indices are compared exactly in fp32)", "split the table into parts");
}

/** @brief The widest column chunk (at most H) whose `per_column` bytes per partition fit. */
inline int64_t chunk_columns(toolkit::Budget& budget, int64_t H, int64_t per_column) {
  const int64_t w = budget.largest({8192, 4096, 2048, 1024, 512}, [&](int64_t c) { return c * per_column; }).value_or(512);
  return toolkit::chunk_width(H, w);
}

/**
 * @brief Records the gather of rows index[r] of `table` into out [N, H] (N = index's length),
 * tile by tile through SBUF. With OutOfRange::skip the rows of out-of-range indices are zero.
 */
inline void gather_into(toolkit::TaskScheduler& sch, toolkit::Budget& budget, const Tensor& out, const Tensor& table,
                        const Tensor& index, OutOfRange oob) {
  // Four tiles in flight: gathering, storing, and two waiting for a DMA queue.
  constexpr int64_t kDepth = 4;
  const int64_t P = nl::tile_size().pmax, N = index.shape()[0], H = table.shape()[1];
  const DType dt = table.dtype();
  const int64_t W = chunk_columns(budget, H, kDepth * dtype_size(dt));
  toolkit::Ring row_ring = budget.sbuf_ring({P, W}, dt, kDepth, "gathered_rows");
  toolkit::Ring index_ring = budget.sbuf_ring({P, 1}, nl::int32, kDepth, "row_index");
  for (const toolkit::RowTile& rt : toolkit::row_tiles(N, P)) {
    const Tensor idx = index_ring.next()(first(rt.p), nl::all);
    sch.add([&] { isa::dma_copy(idx, entries(index, rt)); });
    for (const toolkit::ColumnChunk& c : toolkit::column_chunks(H, W)) {
      const Tensor tile = row_ring.next()(first(rt.p), nl::ds(0, c.width));
      if (oob == OutOfRange::skip)
        sch.add_any({[&] { isa::memset(tile, 0.0, isa::gpsimd_engine); }, [&] { isa::memset(tile, 0.0, isa::vector_engine); }});
      sch.add([&] { gather(tile, table, idx, c.c0, oob); });
      sch.add([&] { isa::dma_copy(rt.rows_view(out, c.c0, c.width), tile); });
    }
  }
}

/**
 * @brief Records the copy of `filled` ([P, Z], every element one value: cleared, or set to a
 * padding value) over the whole of the HBM tensor `out`: blocks of consecutive elements viewed as
 * [P, Z] (disjoint extents, so the transfers are independent), then [P, cols] and a tail of
 * fewer than P elements.
 */
inline void fill_from(toolkit::TaskScheduler& sch, const Tensor& out, const Tensor& filled) {
  const auto all = nl::all;
  const int64_t P = filled.shape()[0], total = out.size();
  const Tensor flat = out.reshape({total});
  const int64_t Z = filled.shape()[1], block = P * Z, blocks = total / block;
  for (int64_t b = 0; b < blocks; ++b)
    sch.add([&] { isa::dma_copy(flat(nl::ds(b * block, block)).reshape({P, Z}), filled); });
  const int64_t rest = blocks * block, rest_cols = (total - rest) / P, tail = (total - rest) % P;
  if (rest_cols > 0)
    sch.add([&] {
      isa::dma_copy(flat(nl::ds(rest, P * rest_cols)).reshape({P, rest_cols}), filled(all, nl::ds(0, rest_cols)));
    });
  if (tail > 0)
    sch.add([&] {
      isa::dma_copy(flat(nl::ds(rest + P * rest_cols, tail)).reshape({tail, 1}), filled(first(tail), nl::ds(0, 1)));
    });
}

/** @brief What scatter_into adds: rows [N, H] at index [N], each times scale[n] when given. */
struct ScatterSource {
  Tensor rows;
  Tensor index;
  std::optional<Tensor> scale;  // float32 [N]
  std::optional<int64_t> padding;  // an index whose rows are dropped
  /** A table whose rows `index` names (of out's row count): gathering one element of each named
   *  row first makes an out-of-range index a runtime error instead of a dropped row. */
  std::optional<Tensor> bounds_check;
};

/**
 * @brief Records out [R, H] = 0, then out[index[n]] += scale[n] * rows[n] for every n: the
 * duplicates of each tile of 128 rows combined on the Tensor engine, the tile's sums added into
 * `out` by the DMA engines (see the file comment).
 */
inline void scatter_into(toolkit::TaskScheduler& sch, toolkit::Budget& budget, const Tensor& out,
                         const ScatterSource& s) {
  constexpr int64_t kDepth = 3, kSmall = 3, kPsum = 4;
  const int64_t P = nl::tile_size().pmax, R = out.shape()[0], H = out.shape()[1], N = s.rows.shape()[0];
  const int64_t bank = nl::tile_size().psum_fmax;  // fp32 columns of one PSUM bank
  const DType dt = s.rows.dtype(), out_dt = out.dtype();
  const auto all = nl::all;
  // SBUF: rows tiles and their combined sums, a zero tile to clear `out`, small per-tile state.
  const int64_t total = R * H;
  const Tensor zeros = budget.sbuf({P, std::clamp<int64_t>(total / P, 1, 4096)}, out_dt, "zeros");
  const int64_t W = chunk_columns(budget, H, kDepth * (dtype_size(dt) + dtype_size(out_dt)) + 64);
  toolkit::Ring row_ring = budget.sbuf_ring({P, W}, dt, kDepth, "rows_tile");
  toolkit::Ring sum_ring = budget.sbuf_ring({P, W}, out_dt, kDepth, "combined_rows");
  toolkit::Ring across_ring = budget.sbuf_ring({P, P}, nl::int32, kSmall, "indices_across");
  toolkit::Ring equal_ring = budget.sbuf_ring({P, P}, nl::float32, kSmall, "same_index");
  toolkit::Ring earlier_ring = budget.sbuf_ring({P, P}, nl::float32, kSmall, "same_index_before");
  toolkit::Ring same_ring = budget.sbuf_ring({P, P}, dt, kSmall, "combine_matrix");
  toolkit::Ring index_ring = budget.sbuf_ring({P, 1}, nl::int32, kSmall, "row_index");
  toolkit::Ring target_ring = budget.sbuf_ring({P, 1}, nl::int32, kSmall, "scatter_index");
  toolkit::Ring check_ring = budget.sbuf_ring({P, 1}, out_dt, kSmall, "bounds_probe");
  toolkit::Ring col_ring = budget.sbuf_ring({P, 8}, nl::float32, kSmall, "row_values");
  toolkit::Ring psum_ring = budget.psum_ring({P, bank}, nl::float32, kPsum, "combined_psum");
  const TileDuplicates dup{R};

  sch.add_any({[&] { isa::memset(zeros, 0.0, isa::gpsimd_engine); }, [&] { isa::memset(zeros, 0.0, isa::vector_engine); }});
  fill_from(sch, out, zeros);

  for (const toolkit::RowTile& rt : toolkit::row_tiles(N, P)) {
    const int64_t p = rt.p;
    const Tensor idx = index_ring.next()(first(p), all), target_index = target_ring.next()(first(p), all);
    const Tensor across = across_ring.next()(first(p), first(p)), equal = equal_ring.next()(first(p), first(p));
    const Tensor earlier = earlier_ring.next()(first(p), first(p)), same = same_ring.next()(first(p), first(p));
    const Tensor col = col_ring.next()(first(p), all);
    auto value = [&](int64_t c) { return col(all, nl::ds(c, 1)); };
    const Tensor id = value(0), count = value(1), keep = value(2), target = value(3), scale = value(4);
    sch.add([&] { isa::dma_copy(idx, entries(s.index, rt)); });
    if (s.bounds_check) {
      const Tensor probe = check_ring.next()(first(p), all);
      sch.add([&] { gather(probe, *s.bounds_check, idx, 0, OutOfRange::error); });
    }
    sch.add([&] { isa::dma_copy(across, entries_across(s.index, rt)); });
    if (s.scale) sch.add([&] { isa::dma_copy(scale, entries(*s.scale, rt)); });
    sch.add([&] { isa::tensor_copy(id, idx, isa::gpsimd_engine); });
    sch.add([&] { dup.equal(equal, across, id); });
    const std::optional<Tensor> row_scale = s.scale ? std::optional(scale) : std::nullopt;
    const auto [first_engine, second_engine] = TileDuplicates::same_engines(s.scale.has_value());
    sch.add_any({[&] { dup.same(same, equal, row_scale, first_engine); },
                 [&] { dup.same(same, equal, row_scale, second_engine); }});
    sch.add([&] { dup.earlier(earlier, equal); });
    sch.add([&] { dup.count(count, earlier); });
    sch.add([&] { dup.keep(keep, count, id, s.padding); });
    sch.add([&] { dup.target(target, id, keep); });
    sch.add([&] { isa::tensor_copy(target_index, target, isa::gpsimd_engine); });
    for (const toolkit::ColumnChunk& c : toolkit::column_chunks(H, W)) {
      const Tensor tile = row_ring.next()(first(p), nl::ds(0, c.width));
      const Tensor sums = sum_ring.next()(first(p), nl::ds(0, c.width));
      sch.add([&] { isa::dma_copy(tile, rt.rows_view(s.rows, c.c0, c.width)); });
      for (int64_t b0 = 0; b0 < c.width; b0 += bank) {
        const int64_t wb = std::min(bank, c.width - b0);
        const Tensor acc = psum_ring.next()(first(p), nl::ds(0, wb));
        sch.add([&] { dup.combine(acc, same, tile(all, nl::ds(b0, wb))); });
        sch.add_any({[&] { isa::tensor_copy(sums(all, nl::ds(b0, wb)), acc, isa::vector_engine); },
                     [&] { isa::activation(sums(all, nl::ds(b0, wb)), nl::copy, acc); }});
      }
      sch.add([&] { scatter_add(out, target_index, sums, c.c0); });
    }
  }
}

}  // namespace nikki::kernels::gather
