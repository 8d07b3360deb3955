// Top-k over long rows (vocabularies), and row max / argmax as k = 1, on VectorE's top-8
// instructions.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nikki/kernels/moe/topk_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* topk_doc = R"(The k largest values of each row and their indices, sorted, ties to the lowest index.

Dimensions: x [T, N] -> values [T, k], indices [T, k]; any T, N >= 1, 1 <= k <= min(N, 64).
Args:       x: HBM tensor, float32 / bfloat16 / float16. k: how many values per row (k = 1 is the
            row max and argmax).
Returns:    values (x's dtype) in descending order; indices (int32) of the values in x's row,
            equal values in order of increasing index (torch.topk's values, with the indices of
            a stable descending sort).
Notes:      Rows go onto partitions, 128 per tile; a row is read once, in column chunks of up to
            16384 elements (what max8 reads). Each chunk yields its top ceil(k / 8) * 8
            candidates in rounds of three VectorE instructions: max8 (the next 8 values,
            descending), nc_find_index8 (their first occurrences: equal values take successive
            positions, lowest first) and nc_match_replace8 (those occurrences become NaN, which
            never outranks a number and matches nothing, so the next round sees the rest). When
            a row has several chunks, the candidates (in chunk order, so equal values stay in
            index order) go through the same rounds once more, and their chunk-global indices
            are gathered by position on GpSimd (nc_n_gather). Values are exact (fp32 compares,
            no arithmetic). VectorE scans each element (3 * ceil(k / 8) - 1) times, so the kernel
            is VectorE-bound rather than HBM-bound. NaNs in x rank below every number (torch
            ranks them first); -inf and +inf are ordinary values.
Pseudocode: order = argsort(-x, axis=1, stable=True)[:, :k]
            values = take_along_axis(x, order, axis=1); indices = order)";

namespace topk_detail {

/** The largest k the kernel takes: eight rounds of max8. */
inline constexpr int64_t kMaxK = 64;
/** Values max8 returns per instruction. */
inline constexpr int64_t kLanes = 8;

/** One row tile's top-8 rounds over `data` [p, w]: vals/idx [p, rounds * 8], data is consumed
 *  (its selected elements become NaN; the last round leaves it as it is). */
inline void rounds(toolkit::TaskScheduler& sch, const Tensor& data, const Tensor& vals, const Tensor& idx,
                   int64_t rounds) {
  const double removed = std::numeric_limits<double>::quiet_NaN();
  for (int64_t r = 0; r < rounds; ++r) {
    const Tensor v = vals(nl::all, nl::ds(r * kLanes, kLanes)), i = idx(nl::all, nl::ds(r * kLanes, kLanes));
    sch.add([&] { isa::max8(v, data); });
    sch.add([&] { isa::nc_find_index8(i, data, v); });
    if (r + 1 < rounds) sch.add([&] { isa::nc_match_replace8(data, data, v, removed); });
  }
}

}  // namespace topk_detail

/** @brief {values, indices} of the k largest elements of each row of x; see topk_doc. */
inline std::vector<Tensor> topk(const Tensor& x, int64_t k, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  using topk_detail::kLanes;
  const ArgumentCheck check("topk", x, loc);
  check.require(x.ndim() == 2 && is_float(x.dtype()),
                "expected a 2-D float tensor x, got " + std::string(dtype_name(x.dtype())) + x.shape().str(),
                "reshape to [rows, columns]");
  const int64_t T = x.shape()[0], N = x.shape()[1];
  if (k < 1 || k > std::min(N, topk_detail::kMaxK))
    check.fail("k = " + std::to_string(k) + " for rows of " + std::to_string(N) + " elements",
               "1 <= k <= min(N, " + std::to_string(topk_detail::kMaxK) + ")",
               k > topk_detail::kMaxK ? "sort the rows instead (or take top-64 and refine)"
                                      : "pass a k between 1 and the row length");
  const nl::TileSize ts = nl::tile_size();
  const TargetConfig& target = x.builder().config();
  const int64_t P = ts.pmax, es = dtype_size(x.dtype());
  const int64_t R = ceil_div(k, kLanes), K8 = R * kLanes;
  const int64_t min_row = target.max8_min_elems, max_row = target.max8_max_elems;

  // Chunks as wide as max8 reads, three in flight (one loading, one in its rounds, one spare),
  // within half of SBUF.
  constexpr int64_t kDepth = 3;
  toolkit::Budget budget(check);
  const int64_t widest = budget.largest({max_row, max_row / 2, max_row / 4, max_row / 8},
                                        [&](int64_t w) { return kDepth * w * es * 2; })
                             .value_or(max_row / 8);
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(N, widest, kLanes);
  const int64_t J = int64_t(chunks.size());
  const int64_t W = std::max(chunks.front().width, min_row);
  if (J * K8 > max_row)
    check.fail("rows of " + std::to_string(N) + " elements give " + std::to_string(J * K8) + " candidates",
               "the candidates of a row are at most " + std::to_string(max_row) + " (what max8 reads)",
               "take the top-k of row segments, then of their results");
  Tensor values = nl::ndarray({T, k}, x.dtype(), nl::shared_hbm, "values");
  Tensor indices = nl::ndarray({T, k}, nl::int32, nl::shared_hbm, "indices");

  toolkit::Ring x_ring = budget.sbuf_ring({P, W}, x.dtype(), kDepth, "x_chunk");
  toolkit::Ring cand_v_ring = budget.sbuf_ring({P, J * K8}, nl::float32, 2, "candidate_values");
  toolkit::Ring cand_i_ring = budget.sbuf_ring({P, J * K8}, nl::uint32, 2, "candidate_indices");
  toolkit::Ring fin_v_ring = budget.sbuf_ring({P, K8}, nl::float32, 2, "top_values");
  toolkit::Ring fin_i_ring = budget.sbuf_ring({P, K8}, nl::uint32, 2, "top_indices");
  toolkit::Ring pos_ring = budget.sbuf_ring({P, K8}, nl::uint32, 2, "candidate_positions");

  toolkit::TaskScheduler sch;
  for (const toolkit::RowTile& rt : toolkit::row_tiles(T, P)) {
    const int64_t p = rt.p;
    const Tensor cand_v = cand_v_ring.next()(first(p), nl::all), cand_i = cand_i_ring.next()(first(p), nl::all);
    for (int64_t j = 0; j < J; ++j) {
      const int64_t c0 = chunks[size_t(j)].c0, w = chunks[size_t(j)].width;
      const Tensor slot = x_ring.next();
      const Tensor xt = slot(first(p), nl::ds(0, std::max(w, min_row)));
      // Rows shorter than max8 reads are padded with NaN, which ranks below every value.
      if (w < min_row) sch.add([&] { isa::memset(xt, std::numeric_limits<double>::quiet_NaN()); });
      sch.add([&] { isa::dma_copy(xt(nl::all, nl::ds(0, w)), rt.rows_view(x, c0, w)); });
      const Tensor v = cand_v(nl::all, nl::ds(j * K8, K8)), i = cand_i(nl::all, nl::ds(j * K8, K8));
      topk_detail::rounds(sch, xt, v, i, R);
      if (c0 > 0)
        sch.add([&] { isa::tensor_scalar(i, i, nl::add, double(c0), {.engine = isa::vector_engine}); });
    }
    Tensor top_v = cand_v, top_i = cand_i;
    if (J > 1) {
      // The candidates' own rounds, then their indices gathered by position.
      top_v = fin_v_ring.next()(first(p), nl::all);
      top_i = fin_i_ring.next()(first(p), nl::all);
      const Tensor pos = pos_ring.next()(first(p), nl::all);
      topk_detail::rounds(sch, cand_v, top_v, pos, R);
      sch.add([&] { isa::nc_n_gather(top_i, cand_i, pos); });
    }
    sch.add([&] { isa::dma_copy(rt.rows_view(values, 0, k), top_v(nl::all, nl::ds(0, k))); });
    sch.add([&] { isa::dma_copy(rt.rows_view(indices, 0, k), top_i(nl::all, nl::ds(0, k))); });
  }
  sch.run();
  return {values, indices};
}

namespace topk_detail {

inline ExampleCase topk_case(Shape x, DType d, int64_t k, std::string label) {
  return ExampleCase{{spec(x, d)}, Params{{"k", double(k)}}, std::move(label)};
}

/** Standard normal values, or for cases labelled "ties" values on a coarse grid (quarters in
 *  [-2, 2]), so that most selected values are tied and the index order is tested. */
inline std::vector<RefTensor> topk_inputs(const ExampleCase& c, CaseRng& r) {
  RefTensor x = random_input(c.inputs[0], r);
  if (c.label.find("ties") != std::string::npos)
    for (double& v : x.data) v = std::clamp(std::round(v * 4) / 4, -2.0, 2.0);
  return {x};
}

}  // namespace topk_detail

inline KernelInfo topk_info() {
  using topk_detail::topk_case;
  return KernelInfo{
      .name = "topk",
      .summary = "top-k values and int32 indices of each row, sorted, ties to the lowest index",
      .doc = topk_doc,
      .inputs = {"x"},
      .outputs = {"values", "indices"},
      .params = {{"k", ParamKind::integer, 1, "values per row, 1 to min(N, 64)"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "grad_x = zeros with grad_values scattered at indices (nikki.torch, by torch's scatter); "
                  "indices have none",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return topk(c.inputs[0], c.integer("k")); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) { return reference::topk(in[0], p.integer("k")); },
      .make_inputs = topk_detail::topk_inputs,
      .examples = {topk_case({1, 1}, DType::float32, 1, "one element: padded to max8's 8"),
                   topk_case({5, 6}, DType::bfloat16, 6, "short rows, k = N"),
                   topk_case({130, 200}, DType::float32, 1, "row max and argmax, row tail"),
                   topk_case({129, 300}, DType::bfloat16, 13, "ties, k not a multiple of 8"),
                   topk_case({3, 40000}, DType::bfloat16, 64, "ties across column chunks, k = 64"),
                   topk_case({2, 20000}, DType::float32, 9, "two chunks, fp32")},
      .draw =
          [](CaseRng& r) {
            const bool long_rows = r.coin(0.2);
            const Shape x = long_rows ? Shape{r.size(1, 4), r.size(16000, 70000, 16384)}
                                      : Shape{r.size(1, 300), r.size(1, 3000, 64)};
            const int64_t k = r.coin(0.3) ? 1 : r.uniform(1, std::min<int64_t>(x[1], topk_detail::kMaxK));
            return topk_case(x, r.pick({DType::float32, DType::bfloat16, DType::float16}), k,
                             r.coin(0.3) ? "drawn, ties" : "drawn");
          },
      // Values are copied and indices are integers: both exact.
      .tolerance = [](const ExampleCase&) { return Tolerance{0, 0}; },
      .benchmark = Benchmark{topk_case({128, 131072}, DType::bfloat16, 8, "[128, 128K] bf16, k = 8"), Bound::hbm, {}, 0},
  };
}

}  // namespace nikki::kernels
