// Mixture-of-experts feed-forward of a decode step (nki-library's moe_tkg): a few tokens, so the
// time is the experts' weights streaming from HBM. Selective: one pass per (token, slot) over the
// weights of the expert the slot names, read at a runtime offset, so only the chosen experts are
// read; all experts: one pass per expert over every token, each scaled by its routing weight for
// that expert (zero when not chosen), which reads each expert once however many tokens chose it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nikki/kernels/mlp/gated_blocks.hpp"
#include "nikki/kernels/moe/moe_reference.hpp"
#include "nikki/kernels/moe/routed_experts.hpp"

namespace nikki::kernels {

inline constexpr const char* moe_decode_doc = R"(Mixture-of-experts feed-forward of a decode step (token generation).

Dimensions: x [T, H], expert_ids [T, k], weights [T, k], w_gate [E, H, I], w_up [E, H, I],
            w_down [E, I, H] -> out [T, H]; 1 <= T <= 128 (decode: T <= 8); any H, I >= 1;
            1 <= E <= 128; 1 <= k <= 8.
Args:       x and the expert weights: one float dtype (float32 / bfloat16 / float16).
            expert_ids: int32, the experts router_topk chose for each token (an id outside
            [0, E) routes nowhere; an expert named twice by one token gets the sum of its
            weights). weights: float, the routing weights of those slots.
            activation: 0 silu (SwiGLU), 1 gelu (erf form), 2 gelu with the tanh approximation.
            experts: 1 selective (read only the experts the slots name), 2 all experts, 0
            chooses: selective when the slots are fewer than the experts (T k < E).
Returns:    out, x's dtype.
Notes:      Selective: for each token t and slot j, the gated MLP of x[t] with the weights of
            expert expert_ids[t, j], addressed at run time (the id clamped into [0, E), its
            weight zeroed when it was outside): T k passes over one expert's weights, the
            fewest bytes when T k < E. All experts: for each expert, the gated MLP of every
            token, scaled by the token's routing weight for that expert (built on VectorE
            from the ids): E passes, the fewest bytes once T k >= E (Mixtral's decode: T = 8,
            top-2 of 8). Each pass is gated_mlp's decode schedule (weight slabs of up to 2048
            columns, 4 KiB runs at bf16, several in flight). The down projection leaves PSUM
            scaled by the routing weight and is summed in fp32 in SBUF; out is rounded once.
Pseudocode: selective:
              for t in range(T), j in range(k):
                e = expert_ids[t, j]
                if 0 <= e < E: out[t] += weights[t, j] * gated_mlp(x[t], w_gate[e], w_up[e], w_down[e])
            all experts:
              a[t, e] = sum_j weights[t, j] * (expert_ids[t, j] == e)
              for e in range(E): out += a[:, e][:, None] * gated_mlp(x, w_gate[e], w_up[e], w_down[e]))";

namespace moe {

/** @brief How moe_decode reads the experts. */
enum class DecodeExperts { choose = 0, selective = 1, all = 2 };

/** @brief The schedule that reads fewer weights: T k passes over single experts, or E passes. */
inline DecodeExperts decode_schedule(DecodeExperts requested, int64_t T, int64_t k, int64_t E) {
  if (requested != DecodeExperts::choose) return requested;
  return T * k < E ? DecodeExperts::selective : DecodeExperts::all;
}

}  // namespace moe

inline constexpr const char* moe_decode_fp8_doc = R"(Mixture-of-experts decode with fp8 expert weights and per-column scales.

Dimensions: x [T, H], expert_ids [T, k], weights [T, k], w_gate [E, H, I], w_up [E, H, I],
            w_down [E, I, H], gate_scale [E, I], up_scale [E, I], down_scale [E, H] -> out [T, H];
            the limits of moe_decode.
Args:       x: bfloat16 or float16 (TensorE pairs fp8 with 16-bit operands only). expert_ids,
            weights, activation, experts: as moe_decode. w_gate, w_up, w_down: fp8 of one
            format, float8_e4m3fn (within +-240), float8_e4m3 or float8_e5m2. gate_scale,
            up_scale, down_scale: float32 scales of each expert's weight columns
            (w[e] = w_fp8[e] * scale[e]).
Returns:    out, x's dtype.
Notes:      moe_decode's schedules with the expert weights streamed as fp8 (half the HBM bytes
            of bf16); a pass scales each accumulator by its expert's column scales (the row of
            the expert, addressed at run time in the selective schedule) as it leaves PSUM, as
            gated_mlp_fp8 does. Inference only.
Pseudocode: as moe_decode, with gated_mlp_fp8(x[t], w_gate[e], ..., gate_scale[e], ...) per expert)";

namespace moe {

/** @brief moe_decode's body; with `fp8`, in[6..8] are the fp8 weights' column scales. */
inline Tensor decode(const ArgumentCheck& check, const std::vector<Tensor>& in, reference::GateActivation act,
                     int64_t experts, bool fp8) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const auto all = nl::all;
  const std::vector<int64_t> dims = moe::check_routed_operands(check, in, fp8);
  const Tensor &x = in[0], &expert_ids = in[1], &weights = in[2], &w_gate = in[3], &w_up = in[4], &w_down = in[5];
  const int64_t T = dims[0], H = dims[1], I = dims[2], E = dims[3], k = dims[4];
  const int64_t P = nl::tile_size().pmax;
  if (T > P)
    check.fail("x has " + std::to_string(T) + " tokens", "at most " + std::to_string(P) + " tokens (one tile)",
               "use moe_prefill for more tokens");
  if (experts < 0 || experts > 2)
    check.fail("experts is " + std::to_string(experts), "0 (choose), 1 (selective) or 2 (all experts)",
               "pass experts=0 to let the kernel choose");
  const moe::DecodeExperts schedule = moe::decode_schedule(moe::DecodeExperts(experts), T, k, E);
  const DType dt = x.dtype();
  Tensor out = nl::ndarray({T, H}, dt, nl::shared_hbm, "out");
  const int64_t chunk = std::min<int64_t>(H, 2048);  // the columns of out rounded and stored at once

  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  const bool selective = schedule == moe::DecodeExperts::selective;
  // Selective: the T k slots side by side on partition 0; all experts: a token per partition.
  const int64_t rows = selective ? 1 : T, slots = selective ? T * k : k;
  Tensor ids = budget.sbuf({rows, slots}, nl::int32, "expert_ids");
  Tensor idf = budget.sbuf({rows, slots}, nl::float32, "expert_ids_f32");
  Tensor wts = budget.sbuf({rows, slots}, nl::float32, "routing_weights");
  sch.add([&] { isa::dma_copy(ids, selective ? expert_ids.reshape({1, T * k}) : expert_ids); });
  sch.add([&] { isa::dma_copy(wts, selective ? weights.reshape({1, T * k}) : weights); });
  sch.add([&] { isa::tensor_copy(idf, ids, isa::vector_engine); });
  // fp32 sums of the experts' outputs: a row per token (selective), or every token at once.
  toolkit::Ring sums = budget.sbuf_ring({rows, H}, nl::float32, selective ? 2 : 1, "expert_sums");
  toolkit::Ring out_rows = budget.sbuf_ring({rows, chunk}, dt, 2, "out_rows");
  auto store = [&](const Tensor& sum, int64_t t0) {  // rows [t0, t0 + sum's rows) of out
    for (int64_t c0 = 0; c0 < H; c0 += chunk) {
      const int64_t w = std::min(chunk, H - c0);
      const Tensor o = out_rows.next()(all, nl::ds(0, w));
      sch.add([&] { isa::tensor_copy(o, sum(all, nl::ds(c0, w)), isa::vector_engine); });
      sch.add([&] { isa::dma_copy(out(nl::ds(t0, o.shape()[0]), nl::ds(c0, w)), o); });
    }
  };
  // sum (+)= acc * scale as the down projection's accumulator leaves PSUM.
  auto accumulate = [&](const Tensor& sum, const Tensor& scale, bool first_term) {
    return [&sch, sum, scale, first_term](const Tensor&, const Tensor& acc, size_t, int64_t c0) {
      const Tensor dst = sum(first(acc.shape()[0]), nl::ds(c0, acc.shape()[1]));
      if (first_term) sch.add([&] { isa::tensor_scalar(dst, acc, nl::multiply, scale, {.engine = isa::vector_engine}); });
      else sch.add([&] { isa::scalar_tensor_tensor(dst, acc, nl::multiply, scale, nl::add, dst); });
    };
  };
  // A pass over one expert's weights (its index static, or read at run time from an SBUF element).
  // fp8 weights stream as TensorE reads them (e4m3fn's bits as e4m3), with their experts' scales.
  const auto weight = toolkit::as_tensor_engine_fp8;
  auto columns = [&](size_t i, const auto& expert) {
    return fp8 ? std::optional<mlp::ColumnBlock>(mlp::expert_columns(in[i], expert)) : std::nullopt;
  };
  auto pass = [&](const auto& expert, std::function<void(const Tensor&, size_t)> load_rows, const Tensor& sum,
                  const Tensor& scale, bool first_term) {
    return mlp::GatedBlocks::Io{
        .load_rows = std::move(load_rows),
        .w_gate = mlp::expert_blocks(weight(w_gate), expert),
        .w_up = mlp::expert_blocks(weight(w_up), expert),
        .w_down = mlp::expert_blocks(weight(w_down), expert),
        .b_gate = std::nullopt,
        .b_up = std::nullopt,
        .b_down = std::nullopt,
        .s_gate = columns(6, expert),
        .s_up = columns(7, expert),
        .s_down = columns(8, expert),
        .leave_psum = accumulate(sum, scale, first_term),
        .store = [](const Tensor&, size_t, int64_t) {},
    };
  };

  if (selective) {
    // A slot's expert clamped into [0, E) for the address; its weight zeroed when it was outside.
    Tensor in_range = budget.sbuf({1, T * k}, nl::float32, "id_in_range");
    sch.add([&] { isa::tensor_scalar(in_range, idf, nl::greater_equal, 0.0); });
    sch.add([&] { isa::tensor_tensor(wts, wts, in_range, nl::multiply); });
    sch.add([&] { isa::tensor_scalar(in_range, idf, nl::less, double(E)); });
    sch.add([&] { isa::tensor_tensor(wts, wts, in_range, nl::multiply); });
    sch.add([&] { isa::tensor_scalar(idf, idf, nl::maximum, 0.0, {.op1 = nl::minimum, .operand1 = double(E - 1)}); });
    sch.add([&] { isa::tensor_copy(ids, idf, isa::vector_engine); });
    mlp::GatedBlocks blocks(budget, check, H, I, dt, act, P, P, false, w_gate.dtype());
    const std::vector<toolkit::RowTile> one_token = toolkit::row_tiles(1, P);
    for (int64_t t = 0; t < T; ++t) {
      const Tensor sum = sums.next();
      for (int64_t j = 0; j < k; ++j) {
        const Tensor expert = ids(all, nl::ds(t * k + j, 1)), scale = wts(all, nl::ds(t * k + j, 1));
        auto token_row = [&](const Tensor& r, size_t) { sch.add([&] { isa::dma_copy(r, x(nl::ds(t, 1), all)); }); };
        blocks.run(sch, one_token, pass(expert, token_row, sum, scale, j == 0));
      }
      store(sum, t);
    }
  } else {
    Tensor iota = budget.sbuf({T, E}, nl::int32, "expert_index");
    Tensor aff = budget.sbuf({T, E}, nl::float32, "affinities");
    toolkit::Ring eq_ring = budget.sbuf_ring({T, E}, nl::float32, 2, "slot_hits");
    sch.add([&] { isa::iota(iota, {{1, E}}); });
    moe::slot_affinities(sch, aff, nullptr, iota, idf, wts, eq_ring);
    mlp::GatedBlocks blocks(budget, check, H, I, dt, act, P, P, false, w_gate.dtype());
    const std::vector<toolkit::RowTile> tokens = toolkit::row_tiles(T, P);
    const Tensor sum = sums.next();
    for (int64_t e = 0; e < E; ++e) {
      auto every_token = [&](const Tensor& r, size_t) { sch.add([&] { isa::dma_copy(r, x); }); };
      blocks.run(sch, tokens, pass(e, every_token, sum, aff(all, nl::ds(e, 1)), e == 0));
    }
    store(sum, 0);
  }
  sch.run();
  return out;
}

}  // namespace moe

/** @brief out [T, H] = the chosen experts' gated MLPs of a few tokens combined with the routing
 *  weights; see moe_decode_doc. Operands: x, expert_ids, weights, w_gate, w_up, w_down. */
inline Tensor moe_decode(const std::vector<Tensor>& in, reference::GateActivation act, int64_t experts = 0,
                         Loc loc = Loc::current()) {
  return moe::decode(ArgumentCheck("moe_decode", in.at(0), loc), in, act, experts, false);
}

/** @brief moe_decode with fp8 expert weights; see moe_decode_fp8_doc. Operands: x, expert_ids,
 *  weights, w_gate, w_up, w_down, gate_scale, up_scale, down_scale. */
inline Tensor moe_decode_fp8(const std::vector<Tensor>& in, reference::GateActivation act, int64_t experts = 0,
                             Loc loc = Loc::current()) {
  return moe::decode(ArgumentCheck("moe_decode_fp8", in.at(0), loc), in, act, experts, true);
}

inline KernelInfo moe_decode_info() {
  using reference::GateActivation;
  const DType f32 = DType::float32, bf16 = DType::bfloat16, f16 = DType::float16;
  const GateActivation silu = GateActivation::silu;
  using moe::routed_case;
  return KernelInfo{
      .name = "moe_decode",
      .summary = "mixture-of-experts decode: a few tokens through the experts they chose, reading only those "
                 "experts' weights (selective) or each expert once (all experts)",
      .doc = moe_decode_doc,
      .inputs = {"x", "expert_ids", "weights", "w_gate", "w_up", "w_down"},
      .outputs = {"out"},
      .params = {{"activation", ParamKind::integer, 0, "the gate's activation: 0 silu, 1 gelu, 2 gelu (tanh form)"},
                 {"experts", ParamKind::integer, 0, "1 selective, 2 all experts (0: the kernel chooses)"}},
      .dtypes = {f32, bf16, f16, DType::int32},
      .backward = "",
      .gradient = "not differentiable (inference: token generation)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{
                moe_decode(c.inputs, GateActivation(c.integer("activation")), c.integer("experts"))};
          },
      .reference = moe::routed_reference,
      .make_inputs = moe::routed_inputs,
      .examples = {routed_case(1, 8, 16, 1, 1, f32, silu, {"experts", 0}, "one token, one expert"),
                   routed_case(1, 72, 200, 8, 2, bf16, silu, {"experts", 0}, "one token, top-2 of 8 (selective), tails"),
                   routed_case(8, 64, 96, 8, 2, f32, GateActivation::gelu, {"experts", 0}, "Mixtral's decode: 8 tokens, all experts"),
                   routed_case(4, 40, 48, 16, 4, f16, GateActivation::gelu_tanh, {"experts", 1}, "top-4 of 16, selective"),
                   routed_case(3, 130, 140, 5, 3, f32, silu, {"experts", 2}, "all experts forced, H and I tails")},
      .draw =
          [](CaseRng& r) {
            const int64_t E = r.uniform(1, 16), k = r.uniform(1, std::min<int64_t>(E, 8));
            return routed_case(r.size(1, 9), r.size(1, 200), r.size(1, 300), E, k, r.pick({f32, bf16, f16}),
                               r.pick({silu, GateActivation::gelu, GateActivation::gelu_tanh}),
                               {"experts", double(r.pick<int64_t>({0, 1, 2}))}, "drawn");
          },
      .tolerance =
          [](const ExampleCase& c) {
            // As gated_mlp per expert; the experts' outputs are summed in fp32 and rounded once.
            const DType d = c.inputs[0].dtype;
            if (d == DType::float32) return Tolerance{1e-4, 1e-4};
            const Tolerance t = dtype_tolerance(d);
            return Tolerance{t.rtol * 2, t.atol * 2};
          },
      .benchmark =
          Benchmark{routed_case(1, 4096, 14336, 8, 2, bf16, silu, {"experts", 0}, "T=1 E=8 top-2 H=4096 I=14336 bf16 (selective)"),
                    Bound::hbm,
                    {},
                    0.70,
                    [](const ExampleCase& c) {  // the two chosen experts' weights, x and out
                      const int64_t T = c.inputs[0].shape[0], H = c.inputs[0].shape[1], I = c.inputs[3].shape[2],
                                    k = c.inputs[1].shape[1];
                      const double es = double(dtype_size(c.inputs[0].dtype));
                      return double(T * k) * 3.0 * double(H) * double(I) * es + 2.0 * double(T * H) * es;
                    }},
  };
}

inline KernelInfo moe_decode_fp8_info() {
  using reference::GateActivation;
  const DType bf16 = DType::bfloat16, f16 = DType::float16, e4m3fn = DType::float8_e4m3fn;
  const GateActivation silu = GateActivation::silu;
  using moe::routed_fp8_case;
  KernelInfo info = moe_decode_info();
  info.name = "moe_decode_fp8";
  info.summary = "mixture-of-experts decode with fp8 expert weights and per-column scales (selective or all experts)";
  info.doc = moe_decode_fp8_doc;
  info.inputs = {"x", "expert_ids", "weights", "w_gate", "w_up", "w_down", "gate_scale", "up_scale", "down_scale"};
  info.dtypes = {bf16, f16, DType::float8_e4m3fn, DType::float8_e4m3, DType::float8_e5m2, DType::float32,
                 DType::int32};
  info.gradient = "not differentiable (inference: token generation with fp8 weights)";
  info.body = [](const KernelCall& c) {
    return std::vector<Tensor>{moe_decode_fp8(c.inputs, GateActivation(c.integer("activation")), c.integer("experts"))};
  };
  info.reference = moe::routed_fp8_reference;
  info.make_inputs = moe::routed_fp8_inputs;
  info.examples = {
      routed_fp8_case(1, 72, 200, 8, 2, bf16, DType::float8_e4m3, silu, {"experts", 0},
                      "one token, top-2 of 8 (selective), tails, Neuron's e4m3"),
      routed_fp8_case(8, 64, 96, 8, 2, bf16, e4m3fn, GateActivation::gelu, {"experts", 0},
                      "Mixtral's decode: 8 tokens, all experts"),
      routed_fp8_case(3, 130, 140, 5, 3, f16, DType::float8_e5m2, GateActivation::gelu_tanh, {"experts", 1},
                      "e5m2, selective forced, H and I tails")};
  info.draw = [](CaseRng& r) {
    const int64_t E = r.uniform(1, 16), k = r.uniform(1, std::min<int64_t>(E, 8));
    return routed_fp8_case(r.size(1, 9), r.size(1, 200), r.size(1, 300), E, k, r.pick({DType::bfloat16, DType::float16}),
                           r.pick({DType::float8_e4m3fn, DType::float8_e4m3, DType::float8_e5m2}),
                           r.pick({GateActivation::silu, GateActivation::gelu, GateActivation::gelu_tanh}),
                           {"experts", double(r.pick<int64_t>({0, 1, 2}))}, "drawn");
  };
  info.benchmark->shape = routed_fp8_case(1, 4096, 14336, 8, 2, bf16, e4m3fn, silu, {"experts", 0},
                                          "T=1 E=8 top-2 H=4096 I=14336, bf16 x, e4m3fn weights (selective)");
  info.benchmark->compulsory_bytes = [](const ExampleCase& c) {  // the two chosen experts' fp8 weights and scales, x and out
    const double T = double(c.inputs[0].shape[0]), H = double(c.inputs[0].shape[1]), I = double(c.inputs[3].shape[2]),
                 k = double(c.inputs[1].shape[1]);
    return T * k * (3 * H * I + 4 * (2 * I + H)) + 2 * 2 * T * H;
  };
  return info;
}

}  // namespace nikki::kernels
