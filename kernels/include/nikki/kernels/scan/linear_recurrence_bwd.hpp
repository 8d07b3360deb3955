// Backward of the linear recurrence h_t = a_t * h_{t-1} + b_t: a reverse scan of the gradient.
//
// The gradient g_t = dL/db_t obeys the same recurrence backwards in time,
// g_t = grad_h_t + a_{t+1} g_{t+1}. The VectorE scan only runs forwards and an access pattern
// cannot step backwards, so each tile is reversed along its free dim by a GpSimd gather
// (nc_n_gather with indices w - 1 - j), scanned forwards, and the result gathered back. Chunks
// of long rows are visited from the end, each scan starting from the next chunk's first fp32 g.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "nikki/kernels/scan/linear_recurrence.hpp"

namespace nikki::kernels {

inline constexpr const char* linear_recurrence_bwd_doc = R"(Backward of linear_recurrence: gradients of a, b and h0, by a reverse scan of grad_h.

Dimensions: a [B, C, L], h0 [B, C], h [B, C, L], grad_h [B, C, L]
            -> grad_a [B, C, L], grad_b [B, C, L], grad_h0 [B, C]; any B, C, L >= 1.
Args:       a, h0: the forward's inputs; h: its output; grad_h: the gradient of the loss with
            respect to h. One dtype, float32 / bfloat16 / float16.
Returns:    grad_a, grad_b, grad_h0, a's dtype.
Notes:      g_t = grad_h_t + a_{t+1} g_{t+1} is the forward recurrence run backwards in time. Per
            tile (rows on partitions, time along the free dim): GpSimd reverses a (shifted by one
            step) and grad_h with nc_n_gather, one VectorE tensor_tensor_scan per row computes g
            reversed in fp32, GpSimd gathers it back into time order (rounded first on ScalarE
            for 16-bit outputs), and VectorE or GpSimd multiplies by h_{t-1} for grad_a. Long rows
            go in column chunks from the end, each scan starting from the next chunk's first
            fp32 g. grad_a of 16-bit inputs is the product of g rounded to the dtype and h_{t-1}
            (two roundings).
Pseudocode: g[:, :, L] = 0; g[:, :, t] = grad_h[:, :, t] + a[:, :, t + 1] * g[:, :, t + 1]
            grad_b = g; grad_a[:, :, t] = g[:, :, t] * (h[:, :, t - 1] if t > 0 else h0)
            grad_h0 = a[:, :, 0] * g[:, :, 0])";

/** @brief (grad_a, grad_b, grad_h0) of linear_recurrence; see linear_recurrence_bwd_doc. */
inline std::vector<Tensor> linear_recurrence_bwd(const Tensor& a, const Tensor& h0, const Tensor& h,
                                                 const Tensor& grad_h, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("linear_recurrence_bwd", a, loc);
  const recurrence::RecurrenceShape s = recurrence::check_recurrence(check, a, {&h, &grad_h}, {&h0});
  const DType dt = a.dtype();
  const int64_t P = nl::tile_size().pmax, es = dtype_size(dt), R = s.rows(), L = s.L;
  const bool rounds = dt != DType::float32;
  std::vector<Tensor> outs{nl::ndarray({s.B, s.C, L}, dt, nl::shared_hbm, "grad_a"),
                           nl::ndarray({s.B, s.C, L}, dt, nl::shared_hbm, "grad_b"),
                           nl::ndarray({s.B, s.C}, dt, nl::shared_hbm, "grad_h0")};
  const Tensor a_rows = recurrence::as_rows(a), h_rows = recurrence::as_rows(h), gh_rows = recurrence::as_rows(grad_h);
  const Tensor ga_rows = recurrence::as_rows(outs[0]), gb_rows = recurrence::as_rows(outs[1]);

  // In flight per column: the loads (a with one step more, h one step back, grad_h) and the
  // results three deep; the reversed tiles and the fp32 g two deep; the gather indices.
  constexpr int64_t kLoads = 3, kWork = 2, kSmall = 4;
  const int64_t per_column = kLoads * 3 * es + kWork * (2 * es + 4 + (rounds ? es : 0)) + kLoads * 2 * es + 4;
  toolkit::Budget budget(check);
  const toolkit::RowPlan plan =
      toolkit::plan_rows(R, L, per_column, budget.sbuf_capacity() * 3 / 4, P, recurrence::kNarrowRow);
  const int64_t g = plan.g, W = plan.whole_rows ? L : plan.chunk, J = int64_t(plan.chunks.size());
  toolkit::Ring a_ring = budget.sbuf_ring({P, g, W + 1}, dt, kLoads, "a_tile");  // a_t .. a_{t+w}
  toolkit::Ring hp_ring = budget.sbuf_ring({P, g, W}, dt, kLoads, "h_prev");     // h_{t-1} .. h_{t+w-2}
  toolkit::Ring gh_ring = budget.sbuf_ring({P, g, W}, dt, kLoads, "grad_h_tile");
  toolkit::Ring a_rev_ring = budget.sbuf_ring({P, g, W}, dt, kWork, "a_reversed");
  toolkit::Ring gh_rev_ring = budget.sbuf_ring({P, g, W}, dt, kWork, "grad_h_reversed");
  toolkit::Ring g_rev_ring = budget.sbuf_ring({P, g, W}, nl::float32, kWork, "g_reversed");
  toolkit::Ring g16_ring = rounds ? budget.sbuf_ring({P, g, W}, dt, kWork, "g_rounded") : toolkit::Ring{};
  toolkit::Ring gb_ring = budget.sbuf_ring({P, g, W}, dt, kLoads, "grad_b_tile");
  toolkit::Ring ga_ring = budget.sbuf_ring({P, g, W}, dt, kLoads, "grad_a_tile");
  toolkit::Ring h0_ring = budget.sbuf_ring({P, g, 1}, nl::float32, kSmall, "h0_column");
  toolkit::Ring gh0_ring = budget.sbuf_ring({P, g, 1}, dt, kSmall, "grad_h0_column");
  // indices[q, i, j] = i * W + W - 1 - j: row i of a tile reversed; a chunk of width w < W uses
  // the last w columns (values w - 1 - j).
  const Tensor indices = budget.sbuf({P, g, W}, nl::uint32, "reversing_indices");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  sch.add([&] { isa::iota(indices, {{W, g}, {-1, W}}, W - 1); });
  for (const toolkit::RowTile& rt : plan.tiles) {
    const int64_t p = rt.p, gg = rt.g;
    const Tensor h0_tile = h0_ring.next()(first(p), first(gg), all);
    sch.add([&] { isa::dma_copy(h0_tile, recurrence::row_states(rt, h0)); });
    Tensor carry;  // g at the first step of the chunk after this one, fp32 [p, 1]
    for (int64_t k = 0; k < J; ++k) {
      const toolkit::ColumnChunk chunk = plan.chunks[size_t(J - 1 - k)];
      const int64_t c0 = chunk.c0, w = chunk.width, ahead = std::min(w + 1, L - c0);
      const Tensor at = a_ring.next()(first(p), first(gg), all);
      const Tensor hp = hp_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor ght = gh_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor a_rev = a_rev_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor gh_rev = gh_rev_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor g_rev = g_rev_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor gb = gb_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor ga = ga_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor idx = indices(first(p), first(gg), nl::ds(W - w, w));
      // a_{t+1} for the chunk's last step: the next chunk's first a, or a 0 that the zero initial
      // state multiplies at the end of the row.
      sch.add([&] { isa::dma_copy(at(all, all, nl::ds(0, ahead)), rt.view(a_rows, c0, ahead)); });
      if (ahead == w)
        sch.add_any({[&] { isa::memset(at(all, all, nl::ds(w, 1)), 0.0, Engine::vector); },
                     [&] { isa::memset(at(all, all, nl::ds(w, 1)), 0.0, Engine::gpsimd); }});
      sch.add([&] { isa::dma_copy(ght, rt.view(gh_rows, c0, w)); });
      if (c0 == 0) {
        sch.add_any({[&] { isa::tensor_copy(hp(all, all, nl::ds(0, 1)), h0_tile, Engine::vector); },
                     [&] { isa::tensor_copy(hp(all, all, nl::ds(0, 1)), h0_tile, Engine::gpsimd); }});
        if (w > 1) sch.add([&] { isa::dma_copy(hp(all, all, nl::ds(1, w - 1)), rt.view(h_rows, 0, w - 1)); });
      } else {
        sch.add([&] { isa::dma_copy(hp, rt.view(h_rows, c0 - 1, w)); });
      }
      sch.add([&] { isa::nc_n_gather(a_rev, at(all, all, nl::ds(1, w)), idx); });
      sch.add([&] { isa::nc_n_gather(gh_rev, ght, idx); });
      sch.add([&] {
        for (int64_t i = 0; i < gg; ++i)
          recurrence::RecurrenceMath::scan(g_rev(all, i, all), a_rev(all, i, all), gh_rev(all, i, all),
                                           carry.valid() ? isa::Scalar(carry) : isa::Scalar(0.0));
      });
      carry = g_rev(all, 0, nl::ds(w - 1, 1));
      if (rounds) {
        const Tensor g16 = g16_ring.next()(first(p), first(gg), nl::ds(0, w));
        sch.add_any({[&] { recurrence::RecurrenceMath::round_out(g16, g_rev, Engine::scalar); },
                     [&] { recurrence::RecurrenceMath::round_out(g16, g_rev, Engine::gpsimd); }});
        sch.add([&] { isa::nc_n_gather(gb, g16, idx); });
      } else {
        sch.add([&] { isa::nc_n_gather(gb, g_rev, idx); });
      }
      sch.add([&] { isa::dma_copy(rt.view(gb_rows, c0, w), gb); });
      sch.add_any({[&] { isa::tensor_tensor(ga, gb, hp, nl::multiply, Engine::vector); },
                   [&] { isa::tensor_tensor(ga, gb, hp, nl::multiply, Engine::gpsimd); }});
      sch.add([&] { isa::dma_copy(rt.view(ga_rows, c0, w), ga); });
      if (c0 == 0) {
        // grad_h0 = a_0 g_0, with g_0 the reversed scan's last fp32 value.
        const Tensor gh0 = gh0_ring.next()(first(p), first(gg), all);
        const Tensor g0 = g_rev(all, all, nl::ds(w - 1, 1)), a0 = at(all, all, nl::ds(0, 1));
        sch.add_any({[&] { isa::tensor_tensor(gh0, a0, g0, nl::multiply, Engine::vector); },
                     [&] { isa::tensor_tensor(gh0, a0, g0, nl::multiply, Engine::gpsimd); }});
        sch.add([&] { isa::dma_copy(recurrence::row_states(rt, outs[2]), gh0); });
      }
    }
  }
  sch.run();
  return outs;
}

namespace recurrence {

/** A backward case from a forward one: a, h0, h (a's shape) and grad_h. */
inline ExampleCase backward_case(const ExampleCase& forward) {
  const TensorSpec &a = forward.inputs[0], &h0 = forward.inputs[2];
  return ExampleCase{{a, h0, spec(a.shape, a.dtype), spec(a.shape, a.dtype)}, forward.params, forward.label};
}

/** a, h0 as the forward takes them, h the forward's output (rounded to the dtype), grad_h
 *  standard normal. */
inline std::vector<RefTensor> backward_inputs(const ExampleCase& c, CaseRng& rng) {
  const TensorSpec &a_spec = c.inputs[0], &h0_spec = c.inputs[1];
  const RefTensor a = decays(a_spec, rng), b = random_input(a_spec, rng), h0 = initial_states(h0_spec, rng);
  RefTensor h = reference::linear_recurrence(a, b, h0);
  for (double& v : h.data) v = round_to(a_spec.dtype, v);
  return {a, h0, h, random_input(c.inputs[3], rng)};
}

}  // namespace recurrence

inline KernelInfo linear_recurrence_bwd_info() {
  std::vector<ExampleCase> examples;
  for (const ExampleCase& c : recurrence::examples()) examples.push_back(recurrence::backward_case(c));
  return KernelInfo{
      .name = "linear_recurrence_bwd",
      .summary = "gradients of linear_recurrence (a, b and h0) by a reverse scan of grad_h",
      .doc = linear_recurrence_bwd_doc,
      .inputs = {"a", "h0", "h", "grad_h"},
      .outputs = {"grad_a", "grad_b", "grad_h0"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return linear_recurrence_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], Loc::current());
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return reference::linear_recurrence_bwd(in[0], in[1], in[2], in[3]);
          },
      .make_inputs = recurrence::backward_inputs,
      .examples = examples,
      .draw = [](CaseRng& r) { return recurrence::backward_case(recurrence::draw_case(r)); },
      .tolerance = {},
      .benchmark = Benchmark{recurrence::backward_case(recurrence::benchmark_case(DType::float32)), Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
