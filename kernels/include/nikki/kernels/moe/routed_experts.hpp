// What the mixture-of-experts kernels share: their operands (tokens, the router's choices, stacked
// expert weights), the routing affinities built on VectorE, and the routings their tests draw.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nikki/kernels/mlp/gated_blocks.hpp"
#include "nikki/kernels/mlp/gated_mlp_reference.hpp"
#include "nikki/kernels/moe/moe_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"

namespace nikki::kernels::moe {

/** Checks the operands (with `fp8`: fp8 expert weights and their scales gate_scale, up_scale
 *  [E, I] and down_scale [E, H] as in[6..8]); returns {T, H, I, E, k}. */
inline std::vector<int64_t> check_routed_operands(const ArgumentCheck& check, const std::vector<Tensor>& in,
                                                  bool fp8 = false) {
  const Tensor &x = in[0], &ids = in[1], &wts = in[2], &wg = in[3];
  check.require(x.ndim() == 2 && is_float(x.dtype()),
                "expected a 2-D float tensor x [T, H], got " + std::string(dtype_name(x.dtype())) + x.shape().str(),
                "reshape x to [tokens, hidden]");
  const int64_t T = x.shape()[0], H = x.shape()[1];
  check.require(ids.ndim() == 2 && ids.shape()[0] == T && ids.dtype() == DType::int32,
                "expert_ids must be int32 [T, k] with T = " + std::to_string(T) + ", got " +
                    std::string(dtype_name(ids.dtype())) + ids.shape().str(),
                "pass router_topk's expert ids");
  const int64_t k = ids.shape()[1];
  if (k > 8) check.fail("expert_ids has k = " + std::to_string(k) + " slots", "top-k up to 8", "route to at most 8 experts");
  check.require(wts.shape() == ids.shape() && is_float(wts.dtype()),
                "weights must be a float tensor of expert_ids' shape " + ids.shape().str() + ", got " +
                    std::string(dtype_name(wts.dtype())) + wts.shape().str(),
                "pass router_topk's weights");
  check.require(wg.ndim() == 3 && wg.shape()[1] == H,
                "w_gate must be [E, H, I] with H = " + std::to_string(H) + " (x's last dim), got " + wg.shape().str(),
                "stack the experts' gate projections as [experts, hidden, intermediate]");
  const int64_t E = wg.shape()[0], I = wg.shape()[2];
  if (E > 128) check.fail("w_gate has " + std::to_string(E) + " experts", "at most 128 experts", "split the experts into groups");
  const std::vector<std::string> names{"w_gate", "w_up", "w_down"};
  const std::vector<Shape> want{{E, H, I}, {E, H, I}, {E, I, H}};
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& w = in[3 + i];
    check.require(w.shape() == want[i], "'" + names[i] + "' must have shape " + want[i].str() + ", got " + w.shape().str(),
                  "w_gate and w_up [E, H, I], w_down [E, I, H]");
    if (fp8)
      check.require(is_fp8(w.dtype()) && w.dtype() == wg.dtype(),
                    "'" + names[i] + "' is " + std::string(dtype_name(w.dtype())) +
                        "; the expert weights are fp8 of one format",
                    "quantize the weights to float8_e4m3fn, float8_e4m3 or float8_e5m2 with per-column scales");
    else
      check.require(w.dtype() == x.dtype(), "'" + names[i] + "' is " + std::string(dtype_name(w.dtype())) +
                                                " but x is " + std::string(dtype_name(x.dtype())),
                    "pass x and the expert weights in one dtype");
  }
  if (fp8) {
    check.require(x.dtype() == DType::bfloat16 || x.dtype() == DType::float16,
                  "x is " + std::string(dtype_name(x.dtype())) +
                      ": TensorE multiplies fp8 weights with bfloat16 or float16 activations",
                  "cast x to bfloat16");
    const std::vector<std::string> scale_names{"gate_scale", "up_scale", "down_scale"};
    const std::vector<Shape> scale_shapes{{E, I}, {E, I}, {E, H}};
    for (size_t i = 0; i < 3; ++i) {
      const Tensor& sc = in[6 + i];
      check.require(sc.shape() == scale_shapes[i] && sc.dtype() == DType::float32,
                    "'" + scale_names[i] + "' must be float32 " + scale_shapes[i].str() + ", got " +
                        std::string(dtype_name(sc.dtype())) + sc.shape().str(),
                    "pass each expert's per-column dequantization scales: gate_scale and up_scale [E, I], "
                    "down_scale [E, H]");
    }
  }
  return {T, H, I, E, k};
}

/** @brief The float64 reference of the kernels over operands x, expert_ids, weights, w_gate,
 *  w_up, w_down and their `activation` parameter. */
inline std::vector<RefTensor> routed_reference(const std::vector<RefTensor>& in, const ParamValues& p) {
  return {reference::moe(in[0], in[1], in[2], reference::ExpertWeights{in[3], in[4], in[5]},
                         reference::GateActivation(p.integer("activation")))};
}

/** @brief routed_reference for fp8 expert weights with their scales (in[6..8]). */
inline std::vector<RefTensor> routed_fp8_reference(const std::vector<RefTensor>& in, const ParamValues& p) {
  return {reference::moe(in[0], in[1], in[2], reference::ExpertWeights{in[3], in[4], in[5], &in[6], &in[7], &in[8]},
                         reference::GateActivation(p.integer("activation")))};
}

/**
 * @brief aff [p, E] = sum over the slots j of wts[q, j] * (idf[q, j] == e) (the routing weights
 * a token gives each expert) and, when given, indicator [p, E] = 1 where some slot names e;
 * idf and wts are the slots' expert ids and weights in fp32 [p, k], iota [p, E] holds 0..E-1.
 */
inline void slot_affinities(toolkit::TaskScheduler& sch, const Tensor& aff, const Tensor* indicator,
                            const Tensor& iota, const Tensor& idf, const Tensor& wts, toolkit::Ring& eq_ring) {
  const int64_t p = aff.shape()[0], k = idf.shape()[1];
  for (int64_t j = 0; j < k; ++j) {
    const Tensor id = idf(nl::all, nl::ds(j, 1)), w = wts(nl::all, nl::ds(j, 1));
    if (j == 0) {
      if (indicator) sch.add([&] { isa::tensor_scalar(*indicator, iota, nl::equal, id); });
      sch.add([&] { isa::tensor_scalar(aff, iota, nl::equal, id, {.op1 = nl::multiply, .operand1 = w}); });
      continue;
    }
    const Tensor eq = eq_ring.next()(toolkit::first(p), nl::all);
    sch.add([&] { isa::tensor_scalar(eq, iota, nl::equal, id); });
    if (indicator) sch.add([&] { isa::tensor_tensor(*indicator, *indicator, eq, nl::maximum); });
    sch.add([&] { isa::scalar_tensor_tensor(aff, eq, nl::multiply, w, nl::add, aff); });
  }
}

/** @brief A case of T tokens, top-k of E experts (H, I), with the gate's activation and the
 *  kernel's own schedule parameter (prefill's block_size, decode's experts). */
inline ExampleCase routed_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, DType d,
                                reference::GateActivation act, const std::pair<std::string, double>& schedule,
                                std::string label) {
  return ExampleCase{{spec({T, H}, d), spec({T, k}, DType::int32), spec({T, k}, DType::float32), spec({E, H, I}, d),
                      spec({E, H, I}, d), spec({E, I, H}, d)},
                     Params{{"activation", double(int(act))}, schedule},
                     std::move(label)};
}

/** @brief routed_case with fp8 expert weights of dtype `w` and their float32 scales. */
inline ExampleCase routed_fp8_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, DType d, DType w,
                                   reference::GateActivation act, const std::pair<std::string, double>& schedule,
                                   std::string label) {
  ExampleCase c = routed_case(T, H, I, E, k, d, act, schedule, std::move(label));
  for (size_t i = 3; i < 6; ++i) c.inputs[i].dtype = w;
  for (const Shape& s : {Shape{E, I}, Shape{E, I}, Shape{E, H}}) c.inputs.push_back(spec(s, DType::float32));
  return c;
}

/** How a case's tokens are routed: the way a trained router spreads them, or degenerate. */
enum class Routing { balanced = 0, skewed = 1, one_expert = 2, some_unrouted = 3, repeated = 4 };

/** Expert ids and routing weights as a router makes them (k distinct experts of random tokens,
 *  positive weights), or skewed toward expert 0, all on one expert (the others get no token),
 *  with slots that route nowhere (-1, E), or with an expert named twice by a token. */
inline void draw_routing(RefTensor& ids, RefTensor& wts, int64_t E, Routing routing, CaseRng& r) {
  const int64_t T = ids.shape[0], k = ids.shape[1];
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
    for (int64_t e = E - 1; e > 0; --e) std::swap(order[size_t(e)], order[size_t(r.uniform(0, e))]);
    for (int64_t j = 0; j < k; ++j) {
      int64_t e = order[size_t(j % E)];
      if (routing == Routing::skewed && r.coin(0.7)) e = j % E;
      if (routing == Routing::one_expert) e = E - 1;
      if (routing == Routing::some_unrouted && r.coin(0.3)) e = r.coin() ? -1 : E;
      if (routing == Routing::repeated && j > 0 && r.coin(0.3)) e = int64_t(ids[t * k]);
      ids[t * k + j] = double(e);
      wts[t * k + j] = round_to(DType::float32, 0.05 + std::abs(r.normal()) / double(k));
    }
  }
}

/** Inputs at the scale of a trained layer (see mlp_inputs) and a routing of a randomly drawn kind. */
inline std::vector<RefTensor> routed_inputs(const ExampleCase& c, CaseRng& r) {
  const int64_t H = c.inputs[0].shape[1], E = c.inputs[3].shape[0], I = c.inputs[3].shape[2];
  std::vector<RefTensor> in{random_input(c.inputs[0], r), RefTensor(c.inputs[1].shape), RefTensor(c.inputs[2].shape)};
  draw_routing(in[1], in[2], E, Routing(r.uniform(0, 4)), r);
  in.push_back(random_input(c.inputs[3], r, 1 / std::sqrt(double(H))));
  in.push_back(random_input(c.inputs[4], r, 1 / std::sqrt(double(H))));
  in.push_back(random_input(c.inputs[5], r, 1 / std::sqrt(double(I))));
  return in;
}

/** routed_inputs with quantized expert weights: fp8 values of magnitude up to ~100 and positive
 *  per-column scales ~1 / (32 sqrt(fan_in)) that restore N(0, 1 / fan_in) weights. */
inline std::vector<RefTensor> routed_fp8_inputs(const ExampleCase& c, CaseRng& r) {
  const int64_t H = c.inputs[0].shape[1], E = c.inputs[3].shape[0], I = c.inputs[3].shape[2];
  std::vector<RefTensor> in{random_input(c.inputs[0], r), RefTensor(c.inputs[1].shape), RefTensor(c.inputs[2].shape)};
  draw_routing(in[1], in[2], E, Routing(r.uniform(0, 4)), r);
  for (size_t i = 3; i < 6; ++i) in.push_back(random_input(c.inputs[i], r, 32));
  for (size_t i = 6; i < 9; ++i) {
    RefTensor s = random_input(c.inputs[i], r);
    const double fan_in = double(i == 8 ? I : H);
    for (double& v : s.data) v = round_to(DType::float32, toolkit::drawn_fp8_scale(v, fan_in));
    in.push_back(std::move(s));
  }
  return in;
}

}  // namespace nikki::kernels::moe
