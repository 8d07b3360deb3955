// The routing helpers of mixture-of-experts layers as kernels of their own: gather token rows
// x[idx] into a dense buffer, and scatter-add (optionally scaled) rows back into [T, H], with
// their backwards. Indices outside the table mark padding (a routing buffer's unused slots):
// their gathered rows are zero and their scattered rows are dropped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/gather/gather_reference.hpp"
#include "nikki/kernels/gather/indexed_rows.hpp"

namespace nikki::kernels {

inline constexpr const char* gather_rows_doc = R"(Rows of x gathered by index (x[idx] with zero rows for padding): the token gather of MoE routing.

Dimensions: x [T, H], idx [N] -> out [N, H]; any N, H >= 1, 1 <= T < 2^24.
Args:       x: HBM tensor, float32 / bfloat16 / float16.
            idx: int32 row indices; an index outside [0, T) (e.g. -1 or T, a routing buffer's
            padding) gives a zero row.
Returns:    out in x's dtype, bit-exact rows.
Notes:      embedding's gather: 128 rows per tile, one indirect DMA (runtime vector offset)
            per column chunk into SBUF, one store. The gather skips out-of-range addresses
            (oob_mode=skip) into a tile cleared first (GpSimd or VectorE).
Pseudocode: out[n, :] = x[idx[n], :] if 0 <= idx[n] < T else 0)";

inline constexpr const char* gather_rows_bwd_doc = R"(Gradient of gather_rows with respect to x: grad rows scatter-added by index.

Dimensions: x [T, H], idx [N], grad_out [N, H] -> grad_x [T, H].
Args:       x: the forward's input (only its shape is used); idx: its int32 indices;
            grad_out: the gradient of out, in x's dtype.
Returns:    grad_x in x's dtype.
Notes:      scatter_add_rows with unit scales (see there): repeated indices accumulate, indices
            outside [0, T) contribute nothing.
Pseudocode: grad_x = zeros(T, H); for n: if 0 <= idx[n] < T: grad_x[idx[n], :] += grad_out[n, :])";

inline constexpr const char* scatter_add_rows_doc = R"(Rows scatter-added by index, each times a scale (out.index_add_(0, idx, scale[:, None] * rows)): the combine of MoE routing.

Dimensions: rows [N, H], idx [N], scale [N] -> out [num_rows, H]; any N, H >= 1,
            1 <= num_rows < 2^24.
Args:       rows: float32 / bfloat16 / float16; idx: int32 destination rows; an index outside
            [0, num_rows) (padding) contributes nothing; scale: float32 weight of each row
            (ones for a plain scatter-add); num_rows: the rows of out.
Returns:    out in rows' dtype, zero where no index points.
Notes:      out is cleared by DMA, then each tile of 128 rows is combined on the Tensor engine
            (same[n', n] = (idx[n'] == idx[n]) * scale[n'], in rows' dtype, times the tile: every
            row gets the fp32 sum of the scaled rows of its index in the tile) and added into
            out by the DMA engines, each index once per transfer (later repeats and padding are
            skipped with oob_mode=skip), so the read-add-write is race-free; tiles are ordered.
            The scales are rounded to rows' dtype in the matrix; 16-bit outputs round each
            tile's sums and each accumulation.
Pseudocode: out = zeros(num_rows, H)
            for n: if 0 <= idx[n] < num_rows: out[idx[n], :] += scale[n] * rows[n, :])";

inline constexpr const char* scatter_add_rows_bwd_doc = R"(Gradients of scatter_add_rows with respect to the rows and the scales.

Dimensions: rows [N, H], idx [N], scale [N], grad_out [num_rows, H] -> grad_rows [N, H],
            grad_scale [N].
Args:       rows, idx, scale: the forward's inputs; grad_out: the gradient of out, in rows'
            dtype; num_rows: the forward's (grad_out's rows).
Returns:    grad_rows in rows' dtype; grad_scale float32; both zero where idx is padding.
Notes:      The grad_out rows each index names are gathered by indirect DMA (gather_rows);
            grad_rows = scale * g on ScalarE/VectorE; grad_scale is the row dot product
            rows . g, a VectorE multiply and add-reduction per column chunk, fp32.
Pseudocode: g[n, :] = grad_out[idx[n], :] if 0 <= idx[n] < num_rows else 0
            grad_rows = scale[:, None] * g; grad_scale = sum(rows * g, axis=1))";

namespace gather {

/** Checks x/rows [*, H] and an index of `n` entries (0: any). */
inline void check_rows_and_index(const ArgumentCheck& check, const Tensor& table, const Tensor& idx, int64_t n = 0) {
  check_table(check, table);
  check_index(check, idx, n ? "one index per row" : "row indices", n);
}

/** Checks a float32 [n] per-row tensor. */
inline void check_per_row(const ArgumentCheck& check, const Tensor& t, int64_t n) {
  check.require(t.ndim() == 1 && t.shape()[0] == n && t.dtype() == DType::float32,
                "'" + t.name() + "' must be float32 [" + std::to_string(n) + "] (one value per row), got " +
                    std::string(dtype_name(t.dtype())) + t.shape().str(),
                "pass one float32 per row (torch.ones(N) for a plain scatter-add)");
}

/** Checks a gradient of `shape` in `dtype`. */
inline void check_gradient(const ArgumentCheck& check, const Tensor& g, const Shape& shape, DType dtype) {
  check.require(g.shape() == shape && g.dtype() == dtype,
                "'" + g.name() + "' must be " + std::string(dtype_name(dtype)) + shape.str() + ", got " +
                    std::string(dtype_name(g.dtype())) + g.shape().str());
}

}  // namespace gather

/** @brief out [N, H] = x[idx] (zero rows for out-of-range indices); see gather_rows_doc. */
inline Tensor gather_rows(const Tensor& x, const Tensor& idx, Loc loc = Loc::current()) {
  const ArgumentCheck check("gather_rows", x, loc);
  gather::check_rows_and_index(check, x, idx);
  Tensor out = nl::ndarray({idx.shape()[0], x.shape()[1]}, x.dtype(), nl::shared_hbm, "out");
  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  gather::gather_into(sch, budget, out, x, idx, gather::OutOfRange::skip);
  sch.run();
  return out;
}

/** @brief out [num_rows, H] = sum of scale[n] * rows[n] at idx[n]; see scatter_add_rows_doc. */
inline Tensor scatter_add_rows(const Tensor& rows, const Tensor& idx, const Tensor& scale, int64_t num_rows,
                               Loc loc = Loc::current()) {
  const ArgumentCheck check("scatter_add_rows", rows, loc);
  const int64_t N = rows.ndim() >= 1 ? rows.shape()[0] : 0;
  gather::check_rows_and_index(check, rows, idx, N);
  gather::check_per_row(check, scale, N);
  if (num_rows < 1 || num_rows >= gather::kMaxIndexedRows)
    check.fail("num_rows is " + std::to_string(num_rows), "1 <= num_rows < 2^24",
               "pass the number of rows of the destination (tokens)");
  Tensor out = nl::ndarray({num_rows, rows.shape()[1]}, rows.dtype(), nl::shared_hbm, "out");
  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  gather::scatter_into(sch, budget, out, {.rows = rows, .index = idx, .scale = scale});
  sch.run();
  return out;
}

/** @brief grad_x [T, H]; see gather_rows_bwd_doc. */
inline Tensor gather_rows_bwd(const Tensor& x, const Tensor& idx, const Tensor& grad_out, Loc loc = Loc::current()) {
  const ArgumentCheck check("gather_rows_bwd", x, loc);
  gather::check_rows_and_index(check, x, idx);
  gather::check_gradient(check, grad_out, Shape{idx.shape()[0], x.shape()[1]}, x.dtype());
  Tensor grad_x = nl::ndarray(x.shape(), x.dtype(), nl::shared_hbm, "grad_x");
  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  gather::scatter_into(sch, budget, grad_x, {.rows = grad_out, .index = idx});
  sch.run();
  return grad_x;
}

/** @brief {grad_rows, grad_scale}; see scatter_add_rows_bwd_doc. */
inline std::vector<Tensor> scatter_add_rows_bwd(const Tensor& rows, const Tensor& idx, const Tensor& scale,
                                                const Tensor& grad_out, int64_t num_rows, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("scatter_add_rows_bwd", rows, loc);
  const int64_t N = rows.ndim() >= 1 ? rows.shape()[0] : 0;
  gather::check_rows_and_index(check, rows, idx, N);
  gather::check_per_row(check, scale, N);
  const int64_t H = rows.shape()[1];
  gather::check_gradient(check, grad_out, Shape{num_rows, H}, rows.dtype());
  const DType dt = rows.dtype();
  Tensor grad_rows = nl::ndarray({N, H}, dt, nl::shared_hbm, "grad_rows");
  Tensor grad_scale = nl::ndarray({N}, nl::float32, nl::shared_hbm, "grad_scale");

  // In flight per column: gathered gradient rows, the rows, their products and grad_rows tiles.
  constexpr int64_t kDepth = 3, kSmall = 3;
  const int64_t P = nl::tile_size().pmax;
  toolkit::Budget budget(check);
  const int64_t W = gather::chunk_columns(budget, H, kDepth * (3 * dtype_size(dt) + 4));
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(H, W);
  const int64_t J = int64_t(chunks.size());
  toolkit::Ring g_ring = budget.sbuf_ring({P, W}, dt, kDepth, "gathered_grad");
  toolkit::Ring x_ring = budget.sbuf_ring({P, W}, dt, kDepth, "rows_tile");
  toolkit::Ring out_ring = budget.sbuf_ring({P, W}, dt, kDepth, "grad_rows_tile");
  toolkit::Ring prod_ring = budget.sbuf_ring({P, W}, nl::float32, kDepth, "products");
  toolkit::Ring index_ring = budget.sbuf_ring({P, 1}, nl::int32, kSmall, "row_index");
  toolkit::Ring partial_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "dot_partials");
  toolkit::Ring col_ring = budget.sbuf_ring({P, 2}, nl::float32, kSmall, "row_values");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  for (const toolkit::RowTile& rt : toolkit::row_tiles(N, P)) {
    const int64_t p = rt.p;
    const Tensor index = index_ring.next()(first(p), all), partials = partial_ring.next()(first(p), all);
    const Tensor col = col_ring.next()(first(p), all);
    const Tensor s = col(all, nl::ds(0, 1)), dot = col(all, nl::ds(1, 1));
    sch.add([&] { isa::dma_copy(index, gather::entries(idx, rt)); });
    sch.add([&] { isa::dma_copy(s, gather::entries(scale, rt)); });
    for (int64_t j = 0; j < J; ++j) {
      const toolkit::ColumnChunk& c = chunks[size_t(j)];
      auto tile = [&](toolkit::Ring& r) { return r.next()(first(p), nl::ds(0, c.width)); };
      const Tensor g = tile(g_ring), x = tile(x_ring), out = tile(out_ring), prod = tile(prod_ring);
      sch.add_any({[&] { isa::memset(g, 0.0, isa::gpsimd_engine); }, [&] { isa::memset(g, 0.0, isa::vector_engine); }});
      sch.add([&] { gather::gather(g, grad_out, index, c.c0, gather::OutOfRange::skip); });
      sch.add([&] { isa::dma_copy(x, rt.rows_view(rows, c.c0, c.width)); });
      sch.add_any({[&] { isa::activation(out, nl::copy, g, {.scale = s}); },
                   [&] { isa::tensor_scalar(out, g, nl::multiply, s, {.engine = isa::vector_engine}); }});
      sch.add([&] { isa::dma_copy(rt.rows_view(grad_rows, c.c0, c.width), out); });
      sch.add_any({[&] { isa::tensor_tensor(prod, x, g, nl::multiply, isa::gpsimd_engine); },
                   [&] { isa::tensor_tensor(prod, x, g, nl::multiply, isa::vector_engine); }});
      sch.add([&] { isa::tensor_reduce(partials(all, nl::ds(j, 1)), nl::add, prod, {1}); });
    }
    sch.add([&] { isa::tensor_reduce(dot, nl::add, partials, {1}); });
    sch.add([&] { isa::dma_copy(gather::entries(grad_scale, rt), dot); });
  }
  sch.run();
  return {grad_rows, grad_scale};
}

namespace gather {

inline ExampleCase gather_case(int64_t T, int64_t H, int64_t N, DType d, std::string label, bool backward = false) {
  std::vector<TensorSpec> in{spec({T, H}, d), spec({N}, DType::int32)};
  if (backward) in.push_back(spec({N, H}, d));
  return ExampleCase{std::move(in), {}, std::move(label)};
}

inline ExampleCase scatter_case(int64_t N, int64_t H, int64_t R, DType d, std::string label, bool backward = false) {
  std::vector<TensorSpec> in{spec({N, H}, d), spec({N}, DType::int32), spec({N}, DType::float32)};
  if (backward) in.push_back(spec({R, H}, d));
  return ExampleCase{std::move(in), {{"num_rows", double(R)}}, std::move(label)};
}

/** Indices into `rows` rows as a router makes them: every row, repeats, rows 0 and rows - 1, and
 *  about one in ten padding (-1 or rows, past either end). */
inline void routing_indices(RefTensor& idx, int64_t rows, CaseRng& r) {
  const int64_t N = idx.size();
  for (int64_t n = 0; n < N; ++n) idx[n] = double(r.uniform(0, rows - 1));
  for (int64_t n = 0; n < N; n += 5) idx[n] = idx[r.uniform(0, n)];
  for (int64_t n = 3; n < N; n += 10) idx[n] = r.coin() ? -1.0 : double(rows);
  idx[0] = 0;
  if (N > 1) idx[N - 1] = double(rows - 1);
}

inline std::vector<RefTensor> gather_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in{random_input(c.inputs[0], r), RefTensor(c.inputs[1].shape)};
  routing_indices(in[1], c.inputs[0].shape[0], r);
  if (c.inputs.size() > 2) in.push_back(random_input(c.inputs[2], r));
  return in;
}

/** Scales are routing weights in (0, 1]; the destination's row count is the parameter. */
inline std::vector<RefTensor> scatter_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in{random_input(c.inputs[0], r), RefTensor(c.inputs[1].shape), RefTensor(c.inputs[2].shape)};
  routing_indices(in[1], int64_t(c.params.find("num_rows").value_or(1)), r);
  for (double& s : in[2].data) s = round_to(DType::float32, double(r.uniform(1, 1000)) / 1000);
  if (c.inputs.size() > 3) in.push_back(random_input(c.inputs[3], r));
  return in;
}

/** Gathered rows are read and written once, with the indices. */
inline double gather_rows_bytes(const ExampleCase& c) {
  const int64_t H = c.inputs[0].shape[1], N = c.inputs[1].shape[0];
  return double(N) * 4 + 2.0 * double(N * H) * dtype_size(c.inputs[0].dtype);
}

/** A scatter reads its rows, indices and scales and writes the whole destination. */
inline double scatter_add_rows_bytes(const ExampleCase& c) {
  const int64_t N = c.inputs[0].shape[0], H = c.inputs[0].shape[1];
  const int64_t R = int64_t(c.params.find("num_rows").value_or(1));
  return double(N) * 8 + double(N * H + R * H) * dtype_size(c.inputs[0].dtype);
}

}  // namespace gather

inline KernelInfo gather_rows_info() {
  using gather::gather_case;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "gather_rows",
      .summary = "rows of x gathered by index with indirect DMA (zero rows for padding indices)",
      .doc = gather_rows_doc,
      .inputs = {"x", "idx"},
      .outputs = {"out"},
      .params = {},
      .dtypes = gather::family_dtypes(),
      .backward = "gather_rows_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{gather_rows(c.inputs[0], c.inputs[1])}; },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::gather_rows(in[0], in[1])};
          },
      .make_inputs = gather::gather_inputs,
      .examples = {gather_case(1, 1, 1, f32, "one row"),
                   gather_case(300, 70, 130, f32, "row tail, repeats and padding"),
                   gather_case(64, 5000, 300, bf16, "bf16, more rows than x, several column chunks")},
      .draw =
          [](CaseRng& r) {
            return gather_case(r.size(1, 2000), r.size(1, 3000, 512), r.size(1, 600), gather::draw_dtype(r), "drawn");
          },
      .tolerance = {},
      .benchmark = Benchmark{gather_case(4096, 4096, 8192, bf16, "T=4096 H=4096, 8192 rows (top-2) bf16"), Bound::hbm,
                             {}, 0.70, gather::gather_rows_bytes},
  };
}

inline KernelInfo gather_rows_bwd_info() {
  using gather::gather_case;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "gather_rows_bwd",
      .summary = "gradient of gather_rows: grad rows scatter-added by index",
      .doc = gather_rows_bwd_doc,
      .inputs = {"x", "idx", "grad_out"},
      .outputs = {"grad_x"},
      .params = {},
      .dtypes = gather::family_dtypes(),
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) { return std::vector<Tensor>{gather_rows_bwd(c.inputs[0], c.inputs[1], c.inputs[2])}; },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::scatter_add_rows(in[2], in[1], nullptr, in[0].shape[0])};
          },
      .make_inputs = gather::gather_inputs,
      .examples = {gather_case(1, 1, 1, f32, "one row", true),
                   gather_case(20, 70, 300, f32, "repeats within and across tiles, padding", true),
                   gather_case(500, 600, 129, bf16, "bf16, tails", true)},
      .draw =
          [](CaseRng& r) {
            return gather_case(r.size(1, 2000), r.size(1, 2000, 512), r.size(1, 600), gather::draw_dtype(r), "drawn",
                               true);
          },
      .tolerance = gather::per_tile_sum_tolerance,
      .benchmark = std::nullopt,
  };
}

inline KernelInfo scatter_add_rows_info() {
  using gather::scatter_case;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "scatter_add_rows",
      .summary = "rows scatter-added by index, each times a scale (the MoE combine)",
      .doc = scatter_add_rows_doc,
      .inputs = {"rows", "idx", "scale"},
      .outputs = {"out"},
      .params = {{"num_rows", ParamKind::integer, 1, "rows of the output (tokens)"}},
      .dtypes = gather::family_dtypes(),
      .backward = "scatter_add_rows_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{scatter_add_rows(c.inputs[0], c.inputs[1], c.inputs[2], c.integer("num_rows"))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::scatter_add_rows(in[0], in[1], &in[2], p.integer("num_rows"))};
          },
      .make_inputs = gather::scatter_inputs,
      .examples = {scatter_case(1, 1, 1, f32, "one row"),
                   scatter_case(300, 70, 20, f32, "repeats within and across tiles, padding"),
                   scatter_case(260, 1100, 130, bf16, "bf16, top-2 of 130 tokens, column tail")},
      .draw =
          [](CaseRng& r) {
            return scatter_case(r.size(1, 600), r.size(1, 2000, 512), r.size(1, 1000), gather::draw_dtype(r), "drawn");
          },
      .tolerance = gather::per_tile_sum_tolerance,
      .benchmark = Benchmark{scatter_case(8192, 4096, 4096, bf16, "8192 rows (top-2) into T=4096, H=4096 bf16"),
                             Bound::hbm, {}, 0.70, gather::scatter_add_rows_bytes},
  };
}

inline KernelInfo scatter_add_rows_bwd_info() {
  using gather::scatter_case;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "scatter_add_rows_bwd",
      .summary = "gradients of scatter_add_rows with respect to the rows and the scales",
      .doc = scatter_add_rows_bwd_doc,
      .inputs = {"rows", "idx", "scale", "grad_out"},
      .outputs = {"grad_rows", "grad_scale"},
      .params = {{"num_rows", ParamKind::integer, 1, "rows of the forward's output (tokens)"}},
      .dtypes = gather::family_dtypes(),
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return scatter_add_rows_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.integer("num_rows"));
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return reference::scatter_add_rows_backward(in[0], in[1], in[2], in[3]);
          },
      .make_inputs = gather::scatter_inputs,
      .examples = {scatter_case(1, 1, 1, f32, "one row", true),
                   scatter_case(300, 70, 20, f32, "repeats and padding", true),
                   scatter_case(260, 1100, 130, bf16, "bf16, column tail", true)},
      .draw =
          [](CaseRng& r) {
            return scatter_case(r.size(1, 600), r.size(1, 2000, 512), r.size(1, 1000), gather::draw_dtype(r), "drawn",
                                true);
          },
      .tolerance = {},
      .benchmark = std::nullopt,
  };
}

}  // namespace nikki::kernels
