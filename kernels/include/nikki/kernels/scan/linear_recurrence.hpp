// First-order linear recurrence h_t = a_t * h_{t-1} + b_t along the last axis of [B, C, L] (the
// state update of linear RNNs and of diagonal state-space models), in fp32 on the VectorE scan.
//
// Every (batch, channel) row is independent: the B * C rows go on partitions (several short rows
// to a partition), time along the free dim, as [B, C, L] lies in memory, so every partition loads
// one contiguous run. One tensor_tensor_scan per row does the whole recurrence
// (res[i] = a[i] * res[i-1] + b[i]); rows longer than SBUF holds go in column chunks, each scan
// starting from the previous chunk's last fp32 state.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "nikki/kernels/scan/linear_recurrence_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

namespace recurrence {

/** Rows narrower than this pack several to a partition (see plan_rows). */
inline constexpr int64_t kNarrowRow = 32;

/** The sizes of one call: B * C independent rows of L steps. */
struct RecurrenceShape {
  int64_t B, C, L;
  int64_t rows() const { return B * C; }
};

/**
 * Checks a, the tensors of a's shape (`same`: b, h, grad_h) and the per-row states (`states`:
 * h0), all of a's dtype.
 */
inline RecurrenceShape check_recurrence(const ArgumentCheck& check, const Tensor& a,
                                        std::initializer_list<const Tensor*> same,
                                        std::initializer_list<const Tensor*> states) {
  const DType dt = a.dtype();
  check.require(a.ndim() == 3, "a must be 3-D [batch, channels, length], got " + a.shape().str(),
                "pass a, b as [B, C, L] with time last");
  check.require(dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16,
                "a must be float32, bfloat16 or float16, got " + std::string(dtype_name(dt)));
  const RecurrenceShape s{a.shape()[0], a.shape()[1], a.shape()[2]};
  for (const Tensor* t : same)
    check.require(t->shape() == a.shape(), "'" + t->name() + "' must have a's shape " + a.shape().str() + ", got " +
                                               t->shape().str());
  for (const Tensor* t : states)
    check.require(t->shape() == Shape{s.B, s.C},
                  "'" + t->name() + "' must be [" + std::to_string(s.B) + ", " + std::to_string(s.C) +
                      "] (one state per batch and channel of a), got " + t->shape().str(),
                  "pass zeros for a recurrence that starts from zero");
  std::vector<const Tensor*> others(same);
  others.insert(others.end(), states.begin(), states.end());
  for (const Tensor* t : others)
    check.require(t->dtype() == dt, "'" + t->name() + "' must have a's dtype " + std::string(dtype_name(dt)) +
                                         ", got " + std::string(dtype_name(t->dtype())));
  return s;
}

/** The scan and finishing steps of the recurrence, one engine each. */
struct RecurrenceMath {
  /** h = a * h_prev + b along the free dim, from `initial` (fp32 state; h's dtype on the way out). */
  static void scan(const Tensor& h, const Tensor& a, const Tensor& b, const isa::Scalar& initial) {
    isa::tensor_tensor_scan(h, a, b, initial, nl::multiply, nl::add);
  }
  /** dst = src rounded to dst's dtype (ScalarE or GpSimd: VectorE is busy scanning). */
  static void round_out(const Tensor& dst, const Tensor& src, Engine engine) {
    if (engine == Engine::scalar) isa::activation(dst, nl::copy, src);
    else isa::tensor_copy(dst, src, engine);
  }
};

/** The per-row states of a row tile, as [p, g, 1] (h0 [B, C] viewed as one column of B * C rows). */
inline Tensor row_states(const toolkit::RowTile& rt, const Tensor& states) {
  return rt.view(states.reshape({states.shape()[0] * states.shape()[1], 1}), 0, 1);
}

/** a [B, C, L] as [B * C, L] rows. */
inline Tensor as_rows(const Tensor& t) { return t.reshape({t.shape()[0] * t.shape()[1], t.shape()[2]}); }

}  // namespace recurrence

inline constexpr const char* linear_recurrence_doc = R"(First-order linear recurrence h_t = a_t * h_{t-1} + b_t along the last axis (a linear RNN / diagonal SSM state update).

Dimensions: a [B, C, L], b [B, C, L], h0 [B, C] -> h [B, C, L]; any B, C, L >= 1.
Args:       a: the per-step decay (or gate), HBM tensor, float32 / bfloat16 / float16.
            b: the per-step input, a's shape and dtype.
            h0: the state before the first step, [B, C] of a's dtype (zeros for none).
Returns:    h, a's dtype.
Notes:      Rows (batch, channel) on partitions, several short rows per partition; time along the
            free dim. One VectorE tensor_tensor_scan per row (res[i] = a[i] * res[i-1] + b[i])
            keeps the state in fp32 and starts from h0; rows longer than SBUF holds go in
            column chunks, each scan starting from the previous chunk's last fp32 state. 16-bit
            outputs are rounded once from the fp32 state (ScalarE or GpSimd). The scan costs
            VectorE 2 cycles per element and partition, which matches HBM at 16-bit (6 bytes per
            element) and leaves it idle half the time at fp32.
Pseudocode: h[:, :, t] = a[:, :, t] * (h[:, :, t - 1] if t > 0 else h0) + b[:, :, t])";

/** @brief h_t = a_t * h_{t-1} + b_t along the last axis, h_{-1} = h0; see linear_recurrence_doc. */
inline Tensor linear_recurrence(const Tensor& a, const Tensor& b, const Tensor& h0, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("linear_recurrence", a, loc);
  const recurrence::RecurrenceShape s = recurrence::check_recurrence(check, a, {&b}, {&h0});
  const DType dt = a.dtype();
  const int64_t P = nl::tile_size().pmax, es = dtype_size(dt), R = s.rows();
  const bool rounds = dt != DType::float32;  // the fp32 state is rounded to a 16-bit output on the way out
  Tensor h = nl::ndarray({s.B, s.C, s.L}, dt, nl::shared_hbm, "h");
  const Tensor a_rows = recurrence::as_rows(a), b_rows = recurrence::as_rows(b), h_rows = recurrence::as_rows(h);

  // In flight per column: three tiles of a and of b (a 16-bit result overwrites its a) and three
  // of the fp32 state.
  constexpr int64_t kInputs = 3, kStates = 3, kSmall = 4;
  toolkit::Budget budget(check);
  const toolkit::RowPlan plan = toolkit::plan_rows(R, s.L, kInputs * 2 * es + kStates * 4, budget.sbuf_capacity() * 3 / 4,
                                                   P, recurrence::kNarrowRow);
  const int64_t g = plan.g, W = plan.whole_rows ? s.L : plan.chunk;
  toolkit::Ring a_ring = budget.sbuf_ring({P, g, W}, dt, kInputs, "a_tile");
  toolkit::Ring b_ring = budget.sbuf_ring({P, g, W}, dt, kInputs, "b_tile");
  toolkit::Ring h_ring = budget.sbuf_ring({P, g, W}, nl::float32, kStates, "state");
  toolkit::Ring h0_ring = budget.sbuf_ring({P, g, 1}, nl::float32, kSmall, "h0_column");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const int64_t p = rt.p, gg = rt.g;
    const Tensor h0_tile = h0_ring.next()(first(p), first(gg), all);
    sch.add([&] { isa::dma_copy(h0_tile, recurrence::row_states(rt, h0)); });
    Tensor carry;  // the previous chunk's last fp32 state, [p, 1] (chunks have one row per partition)
    for (const toolkit::ColumnChunk& chunk : plan.chunks) {
      const int64_t c0 = chunk.c0, w = chunk.width;
      const Tensor at = a_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor bt = b_ring.next()(first(p), first(gg), nl::ds(0, w));
      const Tensor state = h_ring.next()(first(p), first(gg), nl::ds(0, w));
      sch.add([&] { isa::dma_copy(at, rt.view(a_rows, c0, w)); });
      sch.add([&] { isa::dma_copy(bt, rt.view(b_rows, c0, w)); });
      sch.add([&] {
        for (int64_t i = 0; i < gg; ++i)
          recurrence::RecurrenceMath::scan(state(all, i, all), at(all, i, all), bt(all, i, all),
                                           carry.valid() ? isa::Scalar(carry) : isa::Scalar(h0_tile(all, i, all)));
      });
      carry = state(all, 0, nl::ds(w - 1, 1));
      const Tensor result = rounds ? at : state;
      if (rounds)
        sch.add_any({[&] { recurrence::RecurrenceMath::round_out(at, state, Engine::scalar); },
                     [&] { recurrence::RecurrenceMath::round_out(at, state, Engine::gpsimd); }});
      sch.add([&] { isa::dma_copy(rt.view(h_rows, c0, w), result); });
    }
  }
  sch.run();
  return h;
}

namespace recurrence {

/** Inputs of a forward case: a [B, C, L], b [B, C, L], h0 [B, C]. */
inline std::vector<TensorSpec> forward_specs(int64_t B, int64_t C, int64_t L, DType dt) {
  return {spec({B, C, L}, dt), spec({B, C, L}, dt), spec({B, C}, dt)};
}

inline ExampleCase forward_case(int64_t B, int64_t C, int64_t L, DType dt, std::string label) {
  return ExampleCase{forward_specs(B, C, L, dt), {}, std::move(label)};
}

/**
 * Decays in (-1, 1) the way linear RNNs and SSMs have them: mostly in (0.5, 1) (long memory), a
 * fifth negative, so that the state stays bounded over any length and a wrong carry shows.
 */
inline RefTensor decays(const TensorSpec& s, CaseRng& rng) {
  RefTensor a(s.shape);
  for (double& v : a.data) {
    const double magnitude = 0.75 + 0.2499 * std::tanh(rng.normal());
    v = round_to(s.dtype, rng.coin(0.2) ? -magnitude : magnitude);
  }
  return a;
}

/** h0 standard normal, or (a third of the time) zeros: a recurrence with and without a state. */
inline RefTensor initial_states(const TensorSpec& s, CaseRng& rng) {
  return rng.coin(1.0 / 3) ? RefTensor(s.shape) : random_input(s, rng);
}

/** a from decays(), b standard normal, h0 from initial_states(). */
inline std::vector<RefTensor> forward_inputs(const ExampleCase& c, CaseRng& rng) {
  return {decays(c.inputs[0], rng), random_input(c.inputs[1], rng), initial_states(c.inputs[2], rng)};
}

inline std::vector<ExampleCase> examples() {
  return {forward_case(1, 1, 1, DType::float32, "tiny"),
          forward_case(2, 130, 600, DType::bfloat16, "channel tail across the batch, length not a multiple of 128"),
          forward_case(1, 1000, 20, DType::float32, "short rows packed per partition"),
          forward_case(3, 70, 300, DType::float16, "row tail, float16"),
          forward_case(3, 5, 13000, DType::float32, "long rows: the fp32 state carried across column chunks"),
          forward_case(2, 3, 13001, DType::bfloat16, "long rows, bf16, odd length")};
}

/** A random problem: mostly rows that fit SBUF, sometimes long ones in column chunks. */
inline ExampleCase draw_case(CaseRng& r) {
  const DType dt = r.pick({DType::float32, DType::bfloat16, DType::float16});
  if (r.coin(0.15)) return forward_case(r.uniform(1, 2), r.uniform(1, 6), r.size(6000, 14000, 4096), dt, "drawn");
  return forward_case(r.uniform(1, 3), r.size(1, 300), r.size(1, 2500, 512), dt, "drawn");
}

/** Memory-bound: B=4, C=4096, L=4096. */
inline ExampleCase benchmark_case(DType dt) {
  return forward_case(4, 4096, 4096, dt, std::string("B=4, C=4096, L=4096 ") + std::string(dtype_name(dt)));
}

}  // namespace recurrence

inline KernelInfo linear_recurrence_info() {
  return KernelInfo{
      .name = "linear_recurrence",
      .summary = "first-order linear recurrence h_t = a_t * h_{t-1} + b_t along the last axis, from h0 (fp32 state)",
      .doc = linear_recurrence_doc,
      .inputs = {"a", "b", "h0"},
      .outputs = {"h"},
      .params = {},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "linear_recurrence_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{linear_recurrence(c.inputs[0], c.inputs[1], c.inputs[2], Loc::current())};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::linear_recurrence(in[0], in[1], in[2])};
          },
      .make_inputs = recurrence::forward_inputs,
      .examples = recurrence::examples(),
      .draw = recurrence::draw_case,
      .tolerance = {},
      .benchmark = Benchmark{recurrence::benchmark_case(DType::float32), Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
