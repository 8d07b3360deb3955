// Row softmax and its backward, for rows of any length.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/softmax/softmax_reference.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

namespace softmax_detail {

/**
 * Rows shorter than this take whole-tile instructions with per-row values broadcast along the
 * row; longer ones one instruction per packed row with [p, 1] operands, which costs less per
 * element but a fixed cost per instruction.
 */
inline constexpr int64_t kNarrowRow = 32;

inline void check_2d(const ArgumentCheck& check, const Tensor& t) {
  check.require(t.ndim() == 2 && is_float(t.dtype()),
                "expected a 2-D float tensor, got " + std::string(dtype_name(t.dtype())) + t.shape().str(),
                "reshape to [rows, columns]");
}

}  // namespace softmax_detail

inline constexpr const char* softmax_doc = R"(Softmax over the last axis of a 2-D tensor, for rows of any length.

Dimensions: x [R, C] -> out [R, C]; any R, C >= 1.
Args:       x: HBM tensor, float32 / bfloat16 / float16.
Returns:    out, x's dtype.
Notes:      Rows that fit SBUF are read once: 128 partitions per tile, and several short rows per
            partition when C is small, so DMA runs stay long. The max comes from one VectorE
            reduction (negated: it is the exp's bias), exp and the row sum from one ScalarE
            activation (its add-reduction), the normalization from one VectorE multiply by the
            reciprocal of the sum; rows under 32 columns use whole-tile instructions with the
            per-row values broadcast instead. Tiles are software-pipelined: the next tile loads
            and exponentiates while this one is normalized and stored. Longer rows are processed
            in column chunks in two passes: the first keeps each chunk's max m_j and sum s_j of
            exp(x - m_j), combined as sum = sum_j s_j * exp(m_j - m); the second recomputes
            exp(x - m) / sum chunk by chunk (1.5x the compulsory HBM traffic). fp32 computation,
            one rounding on the store.
Pseudocode: m = max(x, axis=1); e = exp(x - m); out = e / sum(e, axis=1))";

/** @brief out = softmax(x) over rows; see softmax_doc. */
inline Tensor softmax(const Tensor& x, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("softmax", x, loc);
  softmax_detail::check_2d(check, x);
  const int64_t R = x.shape()[0], C = x.shape()[1];
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax;
  const DType dt = x.dtype();
  const int64_t es = dtype_size(dt);
  // The max of 16-bit values is exact in their dtype, which also takes VectorE's fast reduction.
  const DType stat = es == 2 ? dt : nl::float32;
  Tensor out = nl::ndarray({R, C}, dt, nl::shared_hbm, "out");

  // In flight per column of a row: the input tiles (loading, waiting, computing, storing, and two
  // more so that loads run ahead while a store drains; the result overwrites its input) and two
  // fp32 exp tiles. Rows too long for six input tiles keep four rather than take two passes.
  constexpr int64_t kExps = 2, kSmall = 8;
  toolkit::Budget budget(check);
  auto plan_for = [&](int64_t inputs) {
    return toolkit::plan_rows(R, C, inputs * es + kExps * 4, budget.sbuf_capacity() * 3 / 4, P,
                              softmax_detail::kNarrowRow);
  };
  int64_t kInputs = 6;
  toolkit::RowPlan plan = plan_for(kInputs);
  if (!plan.whole_rows && plan_for(4).whole_rows) plan = plan_for(kInputs = 4);
  const int64_t g = plan.g, W = plan.whole_rows ? C : plan.chunk, J = int64_t(plan.chunks.size());
  toolkit::Ring x_ring = budget.sbuf_ring({P, g, W}, dt, kInputs, "x_tile");
  toolkit::Ring e_ring = budget.sbuf_ring({P, g, W}, nl::float32, kExps, "exp");
  toolkit::Ring max_ring = budget.sbuf_ring({P, g * J}, stat, kSmall, "neg_max");
  toolkit::Ring sum_ring = budget.sbuf_ring({P, g * J}, nl::float32, kSmall, "row_sum");
  toolkit::Ring row_ring = budget.sbuf_ring({P, 2}, nl::float32, kSmall, "row_stats");  // -max, 1 / sum

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const int64_t p = rt.p, gg = rt.g;
    if (plan.whole_rows) {
      const Tensor xt = x_ring.next()(first(p), first(gg), all), e = e_ring.next()(first(p), first(gg), all);
      const Tensor nmax = max_ring.next()(first(p), first(gg)), sum = sum_ring.next()(first(p), first(gg));
      sch.add([&] { isa::dma_copy(xt, rt.view(x, 0, C)); });
      sch.add([&] { isa::tensor_reduce(nmax, nl::maximum, xt, {2}, /*negate=*/true); });
      if (C < softmax_detail::kNarrowRow) {
        // Narrow rows: whole-tile instructions, the per-row values broadcast along the row.
        auto per_row = [&](const Tensor& t) { return t.expand_dim(2).broadcast(2, C); };
        sch.add([&] { isa::tensor_tensor(e, xt, per_row(nmax), nl::add); });
        sch.add([&] { isa::activation(e, nl::exp, e); });
        sch.add([&] { isa::tensor_reduce(sum, nl::add, e, {2}); });
        sch.add([&] { isa::reciprocal(sum, sum); });
        sch.add([&] { isa::tensor_tensor(xt, e, per_row(sum), nl::multiply); });
      } else {
        // One instruction per packed row, with its max and sum as [p, 1] operands.
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            isa::activation_reduce(e(all, i, all), nl::exp, xt(all, i, all), nl::add, sum(all, nl::ds(i, 1)),
                                   nmax(all, nl::ds(i, 1)));
        });
        sch.add([&] { isa::reciprocal(sum, sum); });
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            isa::tensor_scalar(xt(all, i, all), e(all, i, all), nl::multiply, sum(all, nl::ds(i, 1)));
        });
      }
      sch.add([&] { isa::dma_copy(rt.view(out, 0, C), xt); });
      continue;
    }
    // Long rows, in column chunks: each chunk's max m_j and sum s_j of exp(x - m_j), combined as
    // sum = sum_j s_j * exp(m_j - m); then exp(x - m) / sum chunk by chunk.
    const Tensor nmax = max_ring.next()(first(p), all), sums = sum_ring.next()(first(p), all);
    const Tensor row = row_ring.next()(first(p), all), nM = row(all, nl::ds(0, 1)), total = row(all, nl::ds(1, 1));
    for (int64_t j = 0; j < J; ++j) {
      const int64_t c0 = plan.chunks[size_t(j)].c0, w = plan.chunks[size_t(j)].width;
      const Tensor xt = x_ring.next()(first(p), 0, nl::ds(0, w)), e = e_ring.next()(first(p), 0, nl::ds(0, w));
      sch.add([&] { isa::dma_copy(xt, rt.rows_view(x, c0, w)); });
      sch.add([&] { isa::tensor_reduce(nmax(all, nl::ds(j, 1)), nl::maximum, xt, {1}, /*negate=*/true); });
      sch.add([&] { isa::activation_reduce(e, nl::exp, xt, nl::add, sums(all, nl::ds(j, 1)), nmax(all, nl::ds(j, 1))); });
    }
    const Tensor scale = sum_ring.next()(first(p), all);
    sch.add([&] { isa::tensor_reduce(nM, nl::minimum, nmax, {1}); });  // -m = min_j(-m_j)
    sch.add([&] { isa::activation(scale, nl::exp, nmax, {.bias = nM, .scale = -1.0}); });
    sch.add([&] { isa::tensor_tensor(scale, scale, sums, nl::multiply); });
    sch.add([&] { isa::tensor_reduce(total, nl::add, scale, {1}); });
    sch.add([&] { isa::reciprocal(total, total); });
    for (int64_t j = 0; j < J; ++j) {
      const int64_t c0 = plan.chunks[size_t(j)].c0, w = plan.chunks[size_t(j)].width;
      const Tensor xt = x_ring.next()(first(p), 0, nl::ds(0, w)), e = e_ring.next()(first(p), 0, nl::ds(0, w));
      sch.add([&] { isa::dma_copy(xt, rt.rows_view(x, c0, w)); });
      sch.add([&] { isa::activation(e, nl::exp, xt, {.bias = nM}); });
      sch.add([&] { isa::tensor_scalar(xt, e, nl::multiply, total); });
      sch.add([&] { isa::dma_copy(rt.rows_view(out, c0, w), xt); });
    }
  }
  sch.run();
  return out;
}

inline constexpr const char* softmax_bwd_doc = R"(Backward of softmax over the last axis, for rows of any length.

Dimensions: out [R, C], grad_out [R, C] -> grad_x [R, C]; any R, C >= 1.
Args:       out: the forward's output; grad_out: the gradient of the loss with respect to out.
Returns:    grad_x, grad_out's dtype.
Notes:      The row dot product sum(grad_out * out) is an fp32 product on GpSimd (leaving
            VectorE to the final pass) summed by a ScalarE activation's add-reduction; grad_x is
            one VectorE scalar_tensor_tensor per row (rows under 32 columns: whole-tile
            instructions with the dot broadcast). Tiling, row packing and software pipelining as
            in softmax; rows that do not fit SBUF take two passes over column chunks (dot
            products, then grad_x). fp32 computation, one rounding on the store.
Pseudocode: grad_x = out * (grad_out - sum(grad_out * out, axis=1)))";

/** @brief grad_x = out * (grad_out - rowsum(grad_out * out)); see softmax_bwd_doc. */
inline Tensor softmax_bwd(const Tensor& out, const Tensor& grad_out, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("softmax_bwd", out, loc);
  softmax_detail::check_2d(check, out);
  softmax_detail::check_2d(check, grad_out);
  check.require(out.shape() == grad_out.shape(),
                "out is " + out.shape().str() + " but grad_out is " + grad_out.shape().str(),
                "pass the forward's output and its gradient");
  const int64_t R = out.shape()[0], C = out.shape()[1];
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax;
  const DType yt = out.dtype(), gt = grad_out.dtype();
  Tensor grad_x = nl::ndarray({R, C}, gt, nl::shared_hbm, "grad_x");

  // In flight per column of a row: four tiles of out and of grad_out (grad_x overwrites
  // grad_out) and two fp32 product tiles.
  constexpr int64_t kInputs = 4, kProducts = 2, kSmall = 8;
  toolkit::Budget budget(check);
  const toolkit::RowPlan plan = toolkit::plan_rows(R, C, kInputs * (dtype_size(yt) + dtype_size(gt)) + kProducts * 4,
                                                   budget.sbuf_capacity() * 3 / 4, P, softmax_detail::kNarrowRow);
  const int64_t g = plan.g, W = plan.whole_rows ? C : plan.chunk, J = int64_t(plan.chunks.size());
  toolkit::Ring y_ring = budget.sbuf_ring({P, g, W}, yt, kInputs, "y_tile");
  toolkit::Ring dy_ring = budget.sbuf_ring({P, g, W}, gt, kInputs, "dy_tile");
  toolkit::Ring prod_ring = budget.sbuf_ring({P, g, W}, nl::float32, kProducts, "y_dy");
  toolkit::Ring dot_ring = budget.sbuf_ring({P, g * J + 1}, nl::float32, kSmall, "row_dot");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const int64_t p = rt.p, gg = rt.g;
    if (plan.whole_rows) {
      const Tensor y = y_ring.next()(first(p), first(gg), all), dy = dy_ring.next()(first(p), first(gg), all);
      const Tensor prod = prod_ring.next()(first(p), first(gg), all), dot = dot_ring.next()(first(p), first(gg));
      sch.add([&] { isa::dma_copy(y, rt.view(out, 0, C)); });
      sch.add([&] { isa::dma_copy(dy, rt.view(grad_out, 0, C)); });
      // The product in fp32 on GpSimd, its row sums on ScalarE (in place, as a copy).
      sch.add([&] { isa::tensor_tensor(prod, y, dy, nl::multiply, isa::gpsimd_engine); });
      if (C < softmax_detail::kNarrowRow) {
        auto per_row = [&](const Tensor& t) { return t.expand_dim(2).broadcast(2, C); };
        sch.add([&] { isa::tensor_reduce(dot, nl::add, prod, {2}); });
        sch.add([&] { isa::tensor_tensor(prod, dy, per_row(dot), nl::subtract); });
        sch.add([&] { isa::tensor_tensor(dy, prod, y, nl::multiply); });
      } else {
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            isa::activation_reduce(prod(all, i, all), nl::copy, prod(all, i, all), nl::add, dot(all, nl::ds(i, 1)));
        });
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            isa::scalar_tensor_tensor(dy(all, i, all), dy(all, i, all), nl::subtract, dot(all, nl::ds(i, 1)),
                                      nl::multiply, y(all, i, all));
        });
      }
      sch.add([&] { isa::dma_copy(rt.view(grad_x, 0, C), dy); });
      continue;
    }
    // Long rows: the dot product chunk by chunk, then grad_x chunk by chunk.
    const Tensor dots = dot_ring.next()(first(p), all), dot = dots(all, nl::ds(J, 1));
    for (int64_t j = 0; j < J; ++j) {
      const int64_t c0 = plan.chunks[size_t(j)].c0, w = plan.chunks[size_t(j)].width;
      const Tensor y = y_ring.next()(first(p), 0, nl::ds(0, w)), dy = dy_ring.next()(first(p), 0, nl::ds(0, w));
      const Tensor prod = prod_ring.next()(first(p), 0, nl::ds(0, w));
      sch.add([&] { isa::dma_copy(y, rt.rows_view(out, c0, w)); });
      sch.add([&] { isa::dma_copy(dy, rt.rows_view(grad_out, c0, w)); });
      sch.add([&] { isa::tensor_tensor(prod, y, dy, nl::multiply, isa::gpsimd_engine); });
      sch.add([&] { isa::activation_reduce(prod, nl::copy, prod, nl::add, dots(all, nl::ds(j, 1))); });
    }
    sch.add([&] { isa::tensor_reduce(dot, nl::add, dots(all, nl::ds(0, J)), {1}); });
    for (int64_t j = 0; j < J; ++j) {
      const int64_t c0 = plan.chunks[size_t(j)].c0, w = plan.chunks[size_t(j)].width;
      const Tensor y = y_ring.next()(first(p), 0, nl::ds(0, w)), dy = dy_ring.next()(first(p), 0, nl::ds(0, w));
      sch.add([&] { isa::dma_copy(y, rt.rows_view(out, c0, w)); });
      sch.add([&] { isa::dma_copy(dy, rt.rows_view(grad_out, c0, w)); });
      sch.add([&] { isa::scalar_tensor_tensor(dy, dy, nl::subtract, dot, nl::multiply, y); });
      sch.add([&] { isa::dma_copy(rt.rows_view(grad_x, c0, w), dy); });
    }
  }
  sch.run();
  return grad_x;
}

namespace softmax_detail {

/** A random [R, C] problem: mostly rows that fit SBUF, sometimes rows long enough for the
 *  two-pass column chunks. */
inline Shape draw_rows(CaseRng& r) {
  if (r.coin(0.2)) return {r.size(1, 12), r.size(9000, 24000, 4096)};
  return {r.size(1, 900), r.size(1, 3000, 32)};
}

inline ExampleCase rows_case(std::initializer_list<Shape> shapes, DType d, std::string label) {
  ExampleCase c{{}, {}, std::move(label)};
  for (const Shape& s : shapes) c.inputs.push_back(spec(s, d));
  return c;
}

}  // namespace softmax_detail

inline KernelInfo softmax_info() {
  using softmax_detail::rows_case;
  return KernelInfo{
      .name = "softmax",
      .summary = "softmax over the last axis of a 2-D tensor",
      .doc = softmax_doc,
      .inputs = {"x"},
      .outputs = {"out"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "softmax_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{softmax(c.inputs[0])}; },
      .reference = [](const std::vector<RefTensor>& in,
                      const ParamValues&) { return std::vector<RefTensor>{reference::softmax(in[0])}; },
      .make_inputs = {},
      .examples = {rows_case({{1, 1}}, DType::float32, "tiny"),
                   rows_case({{128, 512}}, DType::float32, "one tile"),
                   rows_case({{300, 77}}, DType::bfloat16, "row and column tails"),
                   rows_case({{1000, 24}}, DType::float32, "narrow rows packed per partition, tails"),
                   rows_case({{2100, 40}}, DType::bfloat16, "short rows packed per partition"),
                   rows_case({{9, 9000}}, DType::float32, "long rows: two passes over column chunks"),
                   rows_case({{3, 20000}}, DType::bfloat16, "long rows, bf16")},
      .draw =
          [](CaseRng& r) {
            return rows_case({softmax_detail::draw_rows(r)}, r.pick({DType::float32, DType::bfloat16, DType::float16}),
                             "drawn");
          },
      .tolerance = {},
      .benchmark = Benchmark{rows_case({{8192, 4096}}, DType::bfloat16, "[8192, 4096] bf16"), Bound::hbm, {}, 0.70},
  };
}

inline KernelInfo softmax_bwd_info() {
  using softmax_detail::rows_case;
  return KernelInfo{
      .name = "softmax_bwd",
      .summary = "gradient of softmax over the last axis",
      .doc = softmax_bwd_doc,
      .inputs = {"out", "grad_out"},
      .outputs = {"grad_x"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{softmax_bwd(c.inputs[0], c.inputs[1])}; },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::softmax_backward(in[0], in[1])};
          },
      // out is a softmax (rows of probabilities), as the forward gives it.
      .make_inputs =
          [](const ExampleCase& c, CaseRng& r) {
            RefTensor out = reference::softmax(random_input(c.inputs[0], r));
            for (double& x : out.data) x = round_to(c.inputs[0].dtype, x);
            return std::vector<RefTensor>{out, random_input(c.inputs[1], r)};
          },
      .examples = {rows_case({{1, 1}, {1, 1}}, DType::bfloat16, "tiny"),
                   rows_case({{200, 96}, {200, 96}}, DType::float32, "row tail"),
                   rows_case({{1100, 10}, {1100, 10}}, DType::bfloat16, "narrow rows packed"),
                   rows_case({{2100, 33}, {2100, 33}}, DType::float32, "short rows packed, odd width"),
                   rows_case({{4, 9000}, {4, 9000}}, DType::float32, "long rows: two passes")},
      .draw =
          [](CaseRng& r) {
            const Shape s = softmax_detail::draw_rows(r);
            return rows_case({s, s}, r.pick({DType::float32, DType::bfloat16, DType::float16}), "drawn");
          },
      .tolerance = {},
      .benchmark = Benchmark{rows_case({{8192, 4096}, {8192, 4096}}, DType::bfloat16, "[8192, 4096] bf16"), Bound::hbm,
                             {}, 0},
  };
}

}  // namespace nikki::kernels
