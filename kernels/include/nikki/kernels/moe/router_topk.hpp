// The mixture-of-experts router: logits on the Tensor engine, softmax or sigmoid, and the top-k
// experts of each token with VectorE's max8 / nc_find_index8.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nikki/kernels/mlp/transposed_rows.hpp"
#include "nikki/kernels/moe/router_topk_reference.hpp"
#include "nikki/kernels/moe/topk.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* router_topk_doc = R"(MoE router: logits = x @ w_router + bias, softmax or sigmoid, the top-k experts of each token.

Dimensions: x [T, H], w_router [H, E], bias [E] -> weights [T, k], expert_ids [T, k]; any T,
            H >= 1; 1 <= E <= 512; 1 <= k <= min(E, 64).
Args:       x, w_router, bias: HBM tensors of one dtype, float32 / bfloat16 / float16 (zeros for
            a router without bias). k: experts per token. sigmoid: sigmoid of each logit instead
            of a softmax over the experts. select_first: take the top-k of the logits, then the
            activation over the k selected (softmax over k); else the top-k of the activated
            scores. normalize: divide the k weights by their sum.
Returns:    weights (float32, descending), expert_ids (int32; equal scores by lowest id).
Notes:      128 tokens per tile: x's rows are transposed on TensorE (H on partitions) and
            multiplied by the resident router weights into one PSUM bank of fp32 logits; the
            bias is added on VectorE as they leave PSUM. Softmax: a VectorE max, exp with its
            row sum on ScalarE, a reciprocal and a multiply; sigmoid: one ScalarE activation.
            max8 gives the 8 largest scores in descending order and nc_find_index8 their expert
            ids (first occurrences, so ties go to the lowest id); k > 8 takes more rounds, each
            after nc_match_replace8 has removed the previous 8 (as topk does). The k selected
            take the optional activation and normalization as [tokens, k] tiles. Rows of fewer than 8
            experts are padded with NaN, which max8 ranks last. fp32 throughout.
Pseudocode: logits = x @ w_router + bias
            scores = logits if select_first else act(logits)
            ids = argsort(-scores, stable=True)[:, :k]; w = take(scores, ids)
            w = act_over_k(w) if select_first else w; w = w / sum(w) if normalize)";

namespace router_detail {

inline constexpr int64_t kMaxK = topk_detail::kMaxK;
inline constexpr int64_t kMaxExperts = 512;

inline reference::RouterOptions options(const ParamValues& p) {
  return {p.integer("k"), p.flag("sigmoid"), p.flag("select_first"), p.flag("normalize")};
}

}  // namespace router_detail

/** @brief {weights, expert_ids} of the router; see router_topk_doc. */
inline std::vector<Tensor> router_topk(const Tensor& x, const Tensor& w_router, const Tensor& bias,
                                       const reference::RouterOptions& o, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("router_topk", x, loc);
  check.require(x.ndim() == 2 && is_float(x.dtype()),
                "expected a 2-D float tensor x, got " + std::string(dtype_name(x.dtype())) + x.shape().str(),
                "reshape x to [tokens, hidden]");
  const int64_t T = x.shape()[0], H = x.shape()[1];
  check.require(w_router.ndim() == 2 && w_router.shape()[0] == H,
                "w_router must be [H, E] with H = " + std::to_string(H) + " (x's last dim), got " +
                    w_router.shape().str(),
                "pass the router weight as [hidden, experts] (torch's Linear.weight transposed)");
  const int64_t E = w_router.shape()[1];
  if (E > router_detail::kMaxExperts)
    check.fail("w_router has " + std::to_string(E) + " experts",
               "at most " + std::to_string(router_detail::kMaxExperts) + " experts (one PSUM bank of fp32 logits)",
               "route in groups of experts");
  check.require(bias.shape() == Shape{E}, "'bias' must have shape " + Shape{E}.str() + ", got " + bias.shape().str(),
                "pass one bias per expert (zeros for none)");
  for (const Tensor* t : {&w_router, &bias})
    check.require(t->dtype() == x.dtype(), "'" + std::string(t == &bias ? "bias" : "w_router") + "' is " +
                                               std::string(dtype_name(t->dtype())) + " but x is " +
                                               std::string(dtype_name(x.dtype())),
                  "pass x, w_router and bias in one dtype");
  const int64_t k = o.k;
  if (k < 1 || k > std::min(E, router_detail::kMaxK))
    check.fail("k = " + std::to_string(k) + " with " + std::to_string(E) + " experts",
               "1 <= k <= min(E, " + std::to_string(router_detail::kMaxK) + ")",
               "route each token to between 1 and " + std::to_string(router_detail::kMaxK) + " experts");
  const nl::TileSize ts = nl::tile_size();
  const TargetConfig& target = x.builder().config();
  const int64_t P = ts.pmax, lanes = target.max8_min_elems;
  const DType dt = x.dtype();
  const int64_t es = dtype_size(dt), nH = ceil_div(H, P), Ew = std::max(E, lanes);
  const int64_t rounds = ceil_div(k, lanes);
  const int64_t tpb = ts.psum_bank_fmax_bytes / (P * es);
  Tensor weights = nl::ndarray({T, k}, nl::float32, nl::shared_hbm, "weights");
  Tensor ids = nl::ndarray({T, k}, nl::int32, nl::shared_hbm, "expert_ids");

  constexpr int64_t kDepth = 3;
  toolkit::Budget budget(check);
  Tensor w_sb = budget.sbuf({P, nH, E}, dt, "w_router");
  Tensor bias_rows = budget.sbuf({P, E}, nl::float32, "bias_rows");
  toolkit::Ring row_ring = budget.sbuf_ring({P, H}, dt, 2, "x_rows");
  toolkit::Ring xT_ring = budget.sbuf_ring({P, nH, P}, dt, 2, "x_T");
  toolkit::Ring s_ring = budget.sbuf_ring({P, Ew}, nl::float32, kDepth, "scores");
  toolkit::Ring top_ring = budget.sbuf_ring({P, rounds * lanes}, nl::float32, kDepth, "top_scores");
  toolkit::Ring id_ring = budget.sbuf_ring({P, rounds * lanes}, nl::uint32, kDepth, "top_ids");
  toolkit::Ring w_ring = budget.sbuf_ring({P, k}, nl::float32, kDepth, "top_weights");
  toolkit::Ring stat_ring = budget.sbuf_ring({P, 2}, nl::float32, 2 * kDepth, "row_stats");
  toolkit::Ring acc_ring = budget.psum_ring({P, ts.psum_bank_fmax}, nl::float32, 2, "logits");
  toolkit::Ring tr_ring = budget.psum_ring({P, tpb, P}, dt, 2, "transposes");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  for (int64_t kb = 0; kb < nH; ++kb) {
    const int64_t ph = std::min(P, H - kb * P);
    sch.add([&] { isa::dma_copy(w_sb(first(ph), kb, all), w_router(nl::ds(kb * P, ph), all)); });
  }
  sch.add([&] { isa::dma_copy(bias_rows, bias.expand_dim(0).broadcast(0, P)); });
  // softmax of each row of `v` ([p, n]) in place, with `stats` [p, 2] for -max and the sum.
  auto softmax_rows = [&](const Tensor& v, const Tensor& stats) {
    const Tensor nmax = stats(all, nl::ds(0, 1)), sum = stats(all, nl::ds(1, 1));
    sch.add([&] { isa::tensor_reduce(nmax, nl::maximum, v, {1}, /*negate=*/true); });
    sch.add([&] { isa::activation_reduce(v, nl::exp, v, nl::add, sum, nmax); });
    sch.add([&] { isa::reciprocal(sum, sum); });
    sch.add([&] { isa::tensor_scalar(v, v, nl::multiply, sum); });
  };
  for (const toolkit::RowTile& rt : toolkit::row_tiles(T, P)) {
    const int64_t pt = rt.p;
    const Tensor rows = row_ring.next()(first(pt), all), xT = xT_ring.next()(all, all, first(pt));
    sch.add([&] { isa::dma_copy(rows, rt.rows_view(x, 0, H)); });
    mlp::transpose_rows(sch, tr_ring, xT, rows);
    const Tensor logits = acc_ring.next()(first(pt), nl::ds(0, E));
    sch.add([&] {
      for (int64_t kb = 0; kb < nH; ++kb) {
        const int64_t ph = std::min(P, H - kb * P);
        isa::nc_matmul(logits, xT(first(ph), kb, all), w_sb(first(ph), kb, all), {.accumulate = kb > 0});
      }
    });
    const Tensor s = s_ring.next()(first(pt), all), scores = s(all, nl::ds(0, E));
    if (E < Ew) sch.add([&] { isa::memset(s(all, nl::ds(E, Ew - E)), std::numeric_limits<double>::quiet_NaN()); });
    sch.add([&] { isa::tensor_tensor(scores, logits, bias_rows(first(pt), all), nl::add); });
    const Tensor stats = stat_ring.next()(first(pt), all);
    if (!o.select_first) {
      if (o.sigmoid) sch.add([&] { isa::activation(scores, nl::sigmoid, scores); });
      else softmax_rows(scores, stats);
    }
    const Tensor top = top_ring.next()(first(pt), all), top_ids = id_ring.next()(first(pt), all);
    topk_detail::rounds(sch, s, top, top_ids, rounds);
    const Tensor w = w_ring.next()(first(pt), nl::ds(0, k));
    sch.add([&] {
      if (o.select_first && o.sigmoid) isa::activation(w, nl::sigmoid, top(all, nl::ds(0, k)));
      else isa::tensor_copy(w, top(all, nl::ds(0, k)), isa::vector_engine);
    });
    if (o.select_first && !o.sigmoid) softmax_rows(w, stat_ring.next()(first(pt), all));
    else if (o.normalize) {
      const Tensor sum = stat_ring.next()(first(pt), nl::ds(0, 1));
      sch.add([&] { isa::tensor_reduce(sum, nl::add, w, {1}); });
      sch.add([&] { isa::reciprocal(sum, sum); });
      sch.add([&] { isa::tensor_scalar(w, w, nl::multiply, sum); });
    }
    sch.add([&] { isa::dma_copy(rt.rows_view(weights, 0, k), w); });
    sch.add([&] { isa::dma_copy(rt.rows_view(ids, 0, k), top_ids(all, nl::ds(0, k))); });
  }
  sch.run();
  return {weights, ids};
}

namespace router_detail {

inline ExampleCase router_case(int64_t T, int64_t H, int64_t E, DType d, reference::RouterOptions o,
                               std::string label) {
  return ExampleCase{{spec({T, H}, d), spec({H, E}, d), spec({E}, d)},
                     Params{{"k", double(o.k)},
                            {"sigmoid", double(o.sigmoid)},
                            {"select_first", double(o.select_first)},
                            {"normalize", double(o.normalize)}},
                     std::move(label)};
}

/** x standard normal, w_router N(0, 1 / H), bias N(0, 0.1): logits of magnitude ~1. */
inline std::vector<RefTensor> router_inputs(const ExampleCase& c, CaseRng& r) {
  const double H = double(c.inputs[0].shape[1]);
  return {random_input(c.inputs[0], r), random_input(c.inputs[1], r, 1 / std::sqrt(H)),
          random_input(c.inputs[2], r, 0.1)};
}

}  // namespace router_detail

inline KernelInfo router_topk_info() {
  using router_detail::router_case;
  using Opts = reference::RouterOptions;
  return KernelInfo{
      .name = "router_topk",
      .summary = "MoE router: logits, softmax or sigmoid, top-k experts per token with their weights",
      .doc = router_topk_doc,
      .inputs = {"x", "w_router", "bias"},
      .outputs = {"weights", "expert_ids"},
      .params = {{"k", ParamKind::integer, 2, "experts per token, 1 to min(E, 64)"},
                 {"sigmoid", ParamKind::boolean, 0, "sigmoid of each logit instead of a softmax"},
                 {"select_first", ParamKind::boolean, 0, "top-k of the logits, then the activation over the k"},
                 {"normalize", ParamKind::boolean, 0, "divide the k weights by their sum"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "the weights' gradient in x, w_router and bias by nikki.torch: logits recomputed on the matmul "
                  "kernel, the activation's derivative in torch (fp32); expert ids have none",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return router_topk(c.inputs[0], c.inputs[1], c.inputs[2], router_detail::options(c));
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::router_topk(in[0], in[1], in[2], router_detail::options(p));
          },
      .make_inputs = router_detail::router_inputs,
      .examples = {router_case(5, 64, 8, DType::float32, Opts{.k = 2}, "Mixtral-style: softmax, top-2"),
                   router_case(130, 200, 64, DType::bfloat16, Opts{.k = 8, .sigmoid = true, .normalize = true},
                               "sigmoid, top-8, normalized; token and H tails"),
                   router_case(3, 16, 4, DType::float32, Opts{.k = 4, .select_first = true},
                               "fewer than 8 experts (padded), softmax over the selected"),
                   router_case(300, 130, 128, DType::float16, Opts{.k = 3, .sigmoid = true, .select_first = true},
                               "128 experts, sigmoid of the selected"),
                   router_case(20, 40, 160, DType::float32, Opts{.k = 20, .normalize = true},
                               "k = 20: three rounds of max8")},
      .draw =
          [](CaseRng& r) {
            const int64_t E = r.coin(0.3) ? r.uniform(1, 12) : r.size(1, 300, 64);
            Opts o{.k = r.uniform(1, std::min<int64_t>(E, r.coin(0.8) ? 8 : router_detail::kMaxK)),
                   .sigmoid = r.coin(),
                   .select_first = r.coin(),
                   .normalize = r.coin()};
            return router_case(r.size(1, 400), r.size(1, 400), E,
                               r.pick({DType::float32, DType::bfloat16, DType::float16}), o, "drawn");
          },
      // Logits in fp32 from exactly represented inputs, then fp32 maths; ids exact.
      .tolerance = [](const ExampleCase&) { return Tolerance{2e-5, 2e-5}; },
      .benchmark = Benchmark{router_case(4096, 4096, 64, DType::bfloat16, Opts{.k = 2}, "T=4096 H=4096 E=64 bf16, top-2"),
                             Bound::hbm, {}, 0.60},
  };
}

}  // namespace nikki::kernels
