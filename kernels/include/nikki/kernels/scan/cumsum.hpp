// Cumulative sum along the last axis, forward or reversed, and its backward (the cumulative sum
// in the other direction), for rows of any length.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/scan/cumsum_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

namespace scan_detail {

/** Rows narrower than this pack several to a partition (the scan still runs one row at a time:
 *  it carries along every free element of its operands). */
inline constexpr int64_t kNarrowRow = 32;

/**
 * Scan and finishing steps of a cumulative sum, one engine each. Sums run in fp32 on the
 * VectorE scan (res[i] = 1 * res[i-1] + data[i]); the input tile holds one zero column before
 * the data so that a scan over it shifted by one column gives the exclusive sums a reversed
 * cumulative sum is made of: rev[i] = total - sum_{j < i} x[j].
 */
struct CumsumMath {
  /** sums = initial + running sum of data along the free dim (fp32 accumulation). */
  static void running_sum(const Tensor& sums, const Tensor& ones, const Tensor& data, const isa::Scalar& initial) {
    isa::tensor_tensor_scan(sums, ones, data, initial, nl::multiply, nl::add);
  }
  /** dst = total - exclusive (a per-row total as the activation's bias), rounded to dst's dtype. */
  static void from_total(const Tensor& dst, const Tensor& exclusive, const Tensor& total) {
    isa::activation(dst, nl::copy, exclusive, {.bias = total, .scale = -1.0});
  }
  /** dst = src rounded to dst's dtype. */
  static void round_out(const Tensor& dst, const Tensor& src, Engine engine) {
    if (engine == Engine::scalar) isa::activation(dst, nl::copy, src);
    else isa::tensor_copy(dst, src, engine);
  }
};

inline Tensor cumsum_rows(const char* kernel, const char* out_name, const Tensor& x, bool reverse, Loc loc) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check(kernel, x, loc);
  const DType dt = x.dtype();
  check.require(x.ndim() == 2 && (dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16),
                "expected a 2-D float32, bfloat16 or float16 tensor, got " + std::string(dtype_name(dt)) +
                    x.shape().str(),
                "reshape to [rows, columns] with the summed axis last");
  const int64_t R = x.shape()[0], C = x.shape()[1];
  const int64_t P = nl::tile_size().pmax, es = dtype_size(dt);
  const bool rounds = dt != DType::float32;  // fp32 sums are rounded to a 16-bit output on the way out
  Tensor out = nl::ndarray({R, C}, dt, nl::shared_hbm, out_name);

  // In flight per column: the input tiles (a 16-bit result overwrites its input), the fp32 sums
  // and the constant ones the scan multiplies its carry by.
  constexpr int64_t kInputs = 4, kSums = 3, kSmall = 8;
  toolkit::Budget budget(check);
  const toolkit::RowPlan plan =
      toolkit::plan_rows(R, C, kInputs * es + kSums * 4 + 4, budget.sbuf_capacity() * 3 / 4, P, kNarrowRow);
  const int64_t g = plan.g, W = plan.whole_rows ? C : plan.chunk, J = int64_t(plan.chunks.size());
  toolkit::Ring x_ring = budget.sbuf_ring({P, g, W + 1}, dt, kInputs, "x_tile");  // column 0: zero
  toolkit::Ring sum_ring = budget.sbuf_ring({P, g, W}, nl::float32, kSums, "sums");
  toolkit::Ring total_ring = budget.sbuf_ring({P, std::max(g, J)}, nl::float32, kSmall, "totals");
  const Tensor ones = budget.sbuf({P, W}, nl::float32, "ones");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  sch.add([&] { isa::memset(ones, 1.0); });
  if (reverse)
    for (int64_t s = 0; s < x_ring.slots(); ++s)
      sch.add([&] { isa::memset(x_ring.slot(s)(all, all, nl::ds(0, 1)), 0.0); });
  for (const toolkit::RowTile& rt : plan.tiles) {
    const int64_t p = rt.p, gg = rt.g;
    const Tensor totals = total_ring.next()(first(p), all);
    Tensor carry;  // forward: the previous chunk's last sums, [p, 1]
    for (int64_t k = 0; k < J; ++k) {
      const int64_t j = reverse ? J - 1 - k : k;
      const int64_t c0 = plan.chunks[size_t(j)].c0, w = plan.chunks[size_t(j)].width;
      const Tensor tile = x_ring.next()(first(p), first(gg), all);
      const Tensor xs = tile(all, all, nl::ds(1, w)), sums = sum_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor result = rounds ? xs : sums;
      const Tensor one = ones(first(p), nl::ds(0, w));
      sch.add([&] { isa::dma_copy(xs, rt.view(x, c0, w)); });
      if (!reverse) {
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            CumsumMath::running_sum(sums(all, i, all), one, xs(all, i, all),
                                    carry.valid() ? isa::Scalar(carry) : isa::Scalar(0.0));
        });
        carry = sums(all, 0, nl::ds(w - 1, 1));
        if (rounds)
          sch.add_any({[&] { CumsumMath::round_out(xs, sums, Engine::scalar); },
                       [&] { CumsumMath::round_out(xs, sums, Engine::gpsimd); }});
      } else {
        // Exclusive sums (the scan over the input shifted by the zero column), the row totals
        // (this chunk's plus the chunks after it), then total - exclusive.
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            CumsumMath::running_sum(sums(all, i, all), one, tile(all, i, nl::ds(0, w)), 0.0);
        });
        const Tensor last_sum = sums(all, all, w - 1), last_x = xs(all, all, w - 1);  // [p, gg]
        if (k == 0) {
          const Tensor first_totals = totals(all, nl::ds(J > 1 ? j : 0, gg));
          sch.add([&] { isa::tensor_tensor(first_totals, last_sum, last_x, nl::add); });
        } else {
          const Tensor total = totals(all, nl::ds(j, 1)), after = totals(all, nl::ds(j + 1, 1));
          sch.add([&] { isa::scalar_tensor_tensor(total, last_sum, nl::add, after, nl::add, last_x); });
        }
        sch.add([&] {
          for (int64_t i = 0; i < gg; ++i)
            CumsumMath::from_total(result(all, i, all), sums(all, i, all), totals(all, nl::ds(J > 1 ? j : i, 1)));
        });
      }
      sch.add([&] { isa::dma_copy(rt.view(out, c0, w), result); });
    }
  }
  sch.run();
  return out;
}

}  // namespace scan_detail

inline constexpr const char* cumsum_doc = R"(Cumulative sum along the last axis of a 2-D tensor (torch.cumsum(x, -1)), forward or reversed.

Dimensions: x [R, C] -> out [R, C]; any R, C >= 1.
Args:       x: HBM tensor, float32 / bfloat16 / float16.
            reverse: sum from the end of each row (out[i] = sum_{j >= i} x[j]) instead of its start.
Returns:    out, x's dtype.
Notes:      Rows on partitions (several short rows per partition), the sums from the VectorE
            scan tensor_tensor_scan (res[i] = 1 * res[i-1] + x[i]) in fp32, rounded once on the
            way out (ScalarE or GpSimd, whichever is free, for 16-bit outputs). Rows longer than
            SBUF holds go in column chunks, each scan starting from the previous chunk's last
            fp32 sum. reverse visits the chunks from the end: the scan of the input shifted by
            one zero column gives the exclusive sums e[i] = sum_{j < i} x[j] of the chunk, and
            one ScalarE activation writes total - e[i], total being the sum of the chunk and of
            every chunk after it (fp32; its rounding error is relative to the row's total rather
            than to each output).
Pseudocode: out[:, i] = sum(x[:, :i + 1], axis=1)      (reverse: sum(x[:, i:], axis=1)))";

/** @brief out = cumsum(x) along rows (reverse: from the end); see cumsum_doc. */
inline Tensor cumsum(const Tensor& x, bool reverse = false, Loc loc = Loc::current()) {
  return scan_detail::cumsum_rows("cumsum", "out", x, reverse, loc);
}

inline constexpr const char* cumsum_bwd_doc = R"(Backward of cumsum along the last axis: the cumulative sum of the gradient in the other direction.

Dimensions: grad_out [R, C] -> grad_x [R, C]; any R, C >= 1.
Args:       grad_out: the gradient of the loss with respect to cumsum's out.
            reverse: the forward's reverse flag.
Returns:    grad_x, grad_out's dtype.
Notes:      grad_x[i] = sum_{j >= i} grad_out[j] for a forward cumsum (sum_{j <= i} for a reversed
            one): the same kernel as cumsum with reverse flipped.
Pseudocode: grad_x = cumsum(grad_out, reverse=not reverse))";

/** @brief grad_x = cumsum(grad_out, !reverse); see cumsum_bwd_doc. */
inline Tensor cumsum_bwd(const Tensor& grad_out, bool reverse = false, Loc loc = Loc::current()) {
  return scan_detail::cumsum_rows("cumsum_bwd", "grad_x", grad_out, !reverse, loc);
}

namespace scan_detail {

inline ExampleCase rows_case(Shape s, DType d, bool reverse, std::string label) {
  return ExampleCase{{spec(s, d)}, {{"reverse", reverse ? 1.0 : 0.0}}, std::move(label)};
}

/** A random problem: mostly rows that fit SBUF, sometimes rows long enough for column chunks. */
inline ExampleCase draw_case(CaseRng& r) {
  const Shape s = r.coin(0.2) ? Shape{r.size(1, 12), r.size(6000, 20000, 4096)} : Shape{r.size(1, 700), r.size(1, 3000, 32)};
  return rows_case(s, r.pick({DType::float32, DType::bfloat16, DType::float16}), r.coin(), "drawn");
}

/** fp32 sums of C terms carry ~sqrt(C) roundings of the running sum; 16-bit outputs one rounding. */
inline Tolerance tolerance(const ExampleCase& c) {
  const Tolerance t = dtype_tolerance(c.inputs[0].dtype);
  const double terms = double(c.inputs[0].shape[1]);
  return c.inputs[0].dtype == DType::float32 ? widened_for_sums(t, terms, 16) : t;
}

inline std::vector<ExampleCase> examples() {
  return {rows_case({1, 1}, DType::float32, false, "tiny"),
          rows_case({300, 77}, DType::bfloat16, false, "row and column tails"),
          rows_case({300, 77}, DType::float32, true, "reversed, tails"),
          rows_case({1000, 20}, DType::float32, true, "narrow rows packed per partition, reversed"),
          rows_case({700, 300}, DType::float16, false, "short rows packed per partition"),
          rows_case({5, 13000}, DType::float32, false, "long rows: carry across column chunks"),
          rows_case({3, 13000}, DType::bfloat16, true, "long rows reversed: totals across chunks")};
}

}  // namespace scan_detail

namespace scan_detail {

/** The registration cumsum and cumsum_bwd share: one kernel, the backward with reverse flipped. */
inline KernelInfo registration(std::string name, std::string summary, const char* doc, std::string input,
                               std::string output, std::string reverse_doc, std::string backward, bool flips) {
  auto run = flips ? cumsum_bwd : cumsum;
  return KernelInfo{
      .name = std::move(name),
      .summary = std::move(summary),
      .doc = doc,
      .inputs = {std::move(input)},
      .outputs = {std::move(output)},
      .params = {{"reverse", ParamKind::boolean, 0, std::move(reverse_doc)}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = std::move(backward),
      .gradient = "",
      .saved_outputs = {},
      .body = [run](const KernelCall& c) { return std::vector<Tensor>{run(c.inputs[0], c.flag("reverse"), Loc::current())}; },
      .reference =
          [flips](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::cumsum(in[0], p.flag("reverse") != flips)};
          },
      .make_inputs = {},
      .examples = examples(),
      .draw = draw_case,
      .tolerance = tolerance,
      .benchmark = Benchmark{rows_case({8192, 4096}, DType::float32, false, "[8192, 4096] fp32"), Bound::hbm, {}, 0.70},
  };
}

}  // namespace scan_detail

inline KernelInfo cumsum_info() {
  return scan_detail::registration("cumsum", "cumulative sum along the last axis of a 2-D tensor (forward or reversed)",
                                   cumsum_doc, "x", "out", "sum from the end of each row", "cumsum_bwd", false);
}

inline KernelInfo cumsum_bwd_info() {
  return scan_detail::registration("cumsum_bwd", "gradient of cumsum: the cumulative sum of grad_out in the other direction",
                                   cumsum_bwd_doc, "grad_out", "grad_x", "the forward's reverse flag", "", true);
}

}  // namespace nikki::kernels
