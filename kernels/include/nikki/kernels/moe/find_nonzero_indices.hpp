// find_nonzero_indices (nki-library's name): the rows of the nonzero entries of each column of a
// [T, C] matrix, compacted and padded with -1, and their count: which tokens a routing mask sends
// to each expert.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/moe/moe_reference.hpp"
#include "nikki/kernels/moe/nonzero_columns.hpp"

namespace nikki::kernels {

inline constexpr const char* find_nonzero_indices_doc = R"(The rows of the nonzero entries of each column of x, compacted, with their count per column.

Dimensions: x [T, C] -> indices [C, T], nonzero_counts [C]; any T, C >= 1, T < 2^24.
Args:       x: float32 / bfloat16 / float16 / int32 (a routing mask or the affinities of tokens
            to experts); NaN counts as nonzero, -0.0 as zero.
            chunk_size: rows per chunk (a multiple of 128; 0 chooses the largest that SBUF
            leaves room for): a longer column is compacted a chunk at a time, each chunk's
            indices written after the earlier chunks' (the carry).
Returns:    indices int32: row c holds the rows t with x[t, c] != 0 in increasing order, then -1;
            nonzero_counts int32: how many there are.
Notes:      nonzero_with_count on GpSimd (NeuronCore-v3 and later) compacts the free dim of
            partitions 0, 16, ..., 112, eight columns per instruction. Each tile of 128 rows is
            turned into a 0/1 indicator (VectorE), its columns are spread to those partitions
            and transposed on the Tensor engine, so a chunk of rows lies along the free dim. A
            column's compacted chunk goes to HBM at its carry (a runtime offset: the count of
            its earlier chunks); with several chunks the output is first filled with -1.
Pseudocode: for c in range(C):
              rows = [t for t in range(T) if x[t, c] != 0]
              indices[c] = rows + [-1] * (T - len(rows)); nonzero_counts[c] = len(rows))";

/** @brief {indices [C, T], nonzero_counts [C]} of x [T, C]; see find_nonzero_indices_doc. */
inline std::vector<Tensor> find_nonzero_indices(const Tensor& x, int64_t chunk_size = 0, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  const ArgumentCheck check("find_nonzero_indices", x, loc);
  const DType dt = x.dtype();
  check.require(x.ndim() == 2 && (is_float(dt) || dt == DType::int32),
                "expected a 2-D float or int32 tensor x [T, C], got " + std::string(dtype_name(dt)) + x.shape().str(),
                "reshape x to [rows, columns]");
  const int64_t T = x.shape()[0], C = x.shape()[1], P = nl::tile_size().pmax;
  if (T >= moe::kMaxRows)
    check.fail("x has " + std::to_string(T) + " rows", "at most 2^24 - 1 rows (indices are counted exactly in fp32)",
               "split the rows into parts and offset the second part's indices");
  if (chunk_size < 0 || chunk_size % P != 0)
    check.fail("chunk_size is " + std::to_string(chunk_size), "0 or a positive multiple of " + std::to_string(P),
               "pass chunk_size=0 to let the kernel choose");
  Tensor indices = nl::ndarray({C, T}, nl::int32, nl::shared_hbm, "indices");
  Tensor counts = nl::ndarray({C}, nl::int32, nl::shared_hbm, "nonzero_counts");
  toolkit::Budget budget(check);
  toolkit::Ring x_ring = budget.sbuf_ring({P, C}, dt, 2, "x_rows");
  toolkit::TaskScheduler sch;
  moe::nonzero_columns(
      sch, budget, check, T, C,
      [&](const Tensor& indicator, const toolkit::RowTile& rt) {
        const Tensor rows = x_ring.next()(toolkit::first(rt.p), nl::all);
        sch.add([&] { isa::dma_copy(rows, rt.rows_view(x, 0, C)); });
        sch.add([&] { isa::tensor_scalar(indicator, rows, nl::not_equal, 0.0, {.engine = isa::vector_engine}); });
      },
      indices, counts, chunk_size);
  sch.run();
  return {indices, counts};
}

namespace moe {

inline ExampleCase nonzero_case(int64_t T, int64_t C, DType d, int64_t chunk, std::string label) {
  ExampleCase c{{spec({T, C}, d)}, {}, std::move(label)};
  if (chunk) c.params.set("chunk_size", double(chunk));
  return c;
}

/** Masks as routers make them: about a third of the entries nonzero, some columns empty, one full,
 *  values of either sign (and integers), the first and last rows nonzero somewhere. */
inline std::vector<RefTensor> nonzero_inputs(const ExampleCase& c, CaseRng& r) {
  const int64_t T = c.inputs[0].shape[0], C = c.inputs[0].shape[1];
  RefTensor x(c.inputs[0].shape);
  std::vector<double> density(static_cast<size_t>(C));
  for (double& d : density) d = r.pick({0.0, 0.05, 0.3, 0.3, 0.6, 1.0});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < C; ++k)
      if (r.coin(density[size_t(k)])) {
        const double v = r.coin() ? 1 + r.normal() * 3 : -1.0;
        x[t * C + k] = c.inputs[0].dtype == DType::int32 ? std::round(v) : round_to(c.inputs[0].dtype, v);
      }
  x[0] = 1;
  x[(T - 1) * C + (C - 1)] = 2;
  return {x};
}

}  // namespace moe

inline KernelInfo find_nonzero_indices_info() {
  using moe::nonzero_case;
  const DType f32 = DType::float32, bf16 = DType::bfloat16, i32 = DType::int32;
  return KernelInfo{
      .name = "find_nonzero_indices",
      .summary = "the rows of the nonzero entries of each column, compacted and padded with -1, and their count",
      .doc = find_nonzero_indices_doc,
      .inputs = {"x"},
      .outputs = {"indices", "nonzero_counts"},
      .params = {{"chunk_size", ParamKind::integer, 0, "rows per chunk, a multiple of 128 (0: the kernel chooses)"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16, DType::int32},
      .backward = "",
      .gradient = "not differentiable (integer outputs)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) { return find_nonzero_indices(c.inputs[0], c.integer("chunk_size")); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) { return reference::find_nonzero_indices(in[0]); },
      .make_inputs = moe::nonzero_inputs,
      .examples = {nonzero_case(1, 1, f32, 0, "one element"),
                   nonzero_case(300, 8, bf16, 0, "Mixtral's 8 experts, a row tail"),
                   nonzero_case(700, 20, i32, 128, "three rounds of columns, six chunks with carries"),
                   nonzero_case(129, 130, DType::float16, 0, "more columns than partitions")},
      .draw =
          [](CaseRng& r) {
            const int64_t T = r.size(1, 1500);
            const int64_t chunk = r.coin() ? 0 : 128 * r.uniform(1, 4);
            return nonzero_case(T, r.size(1, 140, 8), r.pick({f32, bf16, DType::float16, i32}), chunk, "drawn");
          },
      .tolerance = [](const ExampleCase&) { return Tolerance{0, 0}; },
      .benchmark = std::nullopt,
  };
}

}  // namespace nikki::kernels
