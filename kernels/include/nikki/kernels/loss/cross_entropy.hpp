// Per-token cross-entropy of logits [T, V] against integer targets, for vocabularies of any size
// (a row is never held whole in SBUF), and its backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nikki/kernels/loss/cross_entropy_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

namespace loss_detail {

using reference::CrossEntropyOptions;
using toolkit::first;

/** Checks logits [T, V], targets [T] int32 and the options; returns {T, V}. */
inline std::pair<int64_t, int64_t> check_inputs(const ArgumentCheck& check, const Tensor& logits, const Tensor& targets,
                                                const CrossEntropyOptions& o) {
  const DType dt = logits.dtype();
  check.require(logits.ndim() == 2 && (dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16),
                "logits must be a 2-D float32, bfloat16 or float16 tensor [T, V], got " + std::string(dtype_name(dt)) +
                    logits.shape().str(),
                "flatten the leading dims into tokens: logits.reshape(-1, V)");
  const int64_t T = logits.shape()[0], V = logits.shape()[1];
  check.require(targets.ndim() == 1 && targets.shape()[0] == T && targets.dtype() == DType::int32,
                "targets must be int32 [" + std::to_string(T) + "] (one class index per row of logits), got " +
                    std::string(dtype_name(targets.dtype())) + targets.shape().str(),
                "pass targets.to(torch.int32) with one entry per row");
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 1))
    check.fail("label_smoothing is " + std::to_string(o.label_smoothing), "label_smoothing lies in [0, 1]",
               "pass a value between 0 (one-hot targets) and 1 (uniform targets)");
  // Column positions are compared in fp32: exact below 2^24.
  if (V >= (int64_t(1) << 24))
    check.fail("V = " + std::to_string(V) + " classes", "at most 2^24 - 1 classes (positions are exact in fp32)",
               "split the vocabulary");
  return {T, V};
}

/** One row's column chunks: their starts are multiples of the chunk width. */
struct Chunks {
  int64_t width = 0, count = 0, last = 0;  // chunk width, number of chunks, width of the last one

  Chunks(int64_t V, int64_t max_width) : width(toolkit::chunk_width(V, max_width)) {
    count = ceil_div(V, width);
    last = V - (count - 1) * width;
  }
  int64_t c0(int64_t j) const { return j * width; }
  int64_t w(int64_t j) const { return j + 1 == count ? last : width; }
};

/** The [p, 1] HBM view of rows [r0, r0 + p) of a [T] tensor. */
inline Tensor row_entries(const Tensor& t, const toolkit::RowTile& rt) { return t(nl::ds(rt.r0, rt.p)).reshape({rt.p, 1}); }

/** starts [P, J] fp32 of the chunks' first columns, and each row's target position within chunk
 *  j: local[p, j] = target[p] - starts[j] (in chunk j exactly when 0 <= local < its width). */
inline void chunk_starts(const Tensor& starts, const Chunks& ch) {
  isa::iota(starts, {{ch.width, ch.count}});
}
inline void local_targets(const Tensor& local, const Tensor& starts, const Tensor& target) {
  isa::tensor_scalar(local, starts, nl::subtract, target, {.reverse0 = true});
}

inline int64_t ignore_index(const ParamValues& p) { return p.integer("ignore_index"); }
inline CrossEntropyOptions options(const ParamValues& p) { return {ignore_index(p), p.real("label_smoothing")}; }

}  // namespace loss_detail

inline constexpr const char* cross_entropy_doc = R"(Per-token cross-entropy of logits against integer targets (F.cross_entropy(logits, targets, reduction='none')), for vocabularies of any size.

Dimensions: logits [T, V], targets [T] -> loss [T], lse [T]; any T >= 1, 1 <= V < 2^24.
Args:       logits: HBM tensor, float32 / bfloat16 / float16.
            targets: int32 class indices in [0, V), or ignore_index.
            ignore_index: rows whose target equals it get loss 0 (default -100, torch's).
            label_smoothing: weight e of the uniform distribution mixed into the one-hot target.
Returns:    loss and lse (logsumexp of each row, saved for the backward), float32.
Notes:      Rows on partitions, each row read once in column chunks (up to 8192 columns, never a
            whole row in SBUF): per chunk j its max m_j (VectorE), the sum s_j of exp(x - m_j)
            (one ScalarE activation with its add-reduction) and the logit at the row's target
            clamped into the chunk (a GpSimd nc_n_gather of one element per partition). After
            the last chunk the pairs combine as lse = M + log(sum_j s_j exp(m_j - M)), M = max_j
            m_j, and x[t] is the gathered value of the chunk that holds t; label smoothing adds a
            row sum per chunk (VectorE). fp32 throughout. Targets outside [0, V) other than
            ignore_index give an unspecified loss (torch raises an error).
Pseudocode: lse = logsumexp(logits, axis=1)
            loss = lse - (1 - e) * logits[i, t_i] - e * mean(logits, axis=1); loss[t == ignore_index] = 0)";

/** @brief {loss, lse} of the per-token cross-entropy; see cross_entropy_doc. */
inline std::vector<Tensor> cross_entropy(const Tensor& logits, const Tensor& targets,
                                         const reference::CrossEntropyOptions& o = {}, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using loss_detail::first;
  const ArgumentCheck check("cross_entropy", logits, loc);
  const auto [T, V] = loss_detail::check_inputs(check, logits, targets, o);
  const int64_t P = nl::tile_size().pmax;
  const DType dt = logits.dtype();
  const int64_t es = dtype_size(dt);
  const bool smoothing = o.label_smoothing != 0;
  Tensor loss = nl::ndarray({T}, nl::float32, nl::shared_hbm, "loss");
  Tensor lse = nl::ndarray({T}, nl::float32, nl::shared_hbm, "lse");

  // In flight per column: four logits tiles and two of the exp's (unused) elementwise output.
  constexpr int64_t kInputs = 4, kExps = 2, kSmall = 4;
  toolkit::Budget budget(check);
  const int64_t max_width =
      budget.largest({8192, 4096, 2048, 1024, 512}, [&](int64_t w) { return w * (kInputs + kExps) * es + 64 * 1024; })
          .value_or(512);
  const loss_detail::Chunks ch(V, max_width);
  const int64_t W = ch.width, J = ch.count;
  toolkit::Ring x_ring = budget.sbuf_ring({P, W}, dt, kInputs, "logits_tile");
  toolkit::Ring exp_ring = budget.sbuf_ring({P, W}, dt, kExps, "exp");
  const Tensor starts = budget.sbuf({P, J}, nl::float32, "chunk_starts");
  // Per row tile: -m_j, s_j, row sums, positions (fp32 and int32), in-chunk flags, gathered logits.
  // The max of 16-bit values is exact in their dtype, which also takes VectorE's fast reduction.
  toolkit::Ring nmax_ring = budget.sbuf_ring({P, J}, es == 2 ? dt : nl::float32, kSmall, "neg_chunk_max");
  toolkit::Ring scale_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "chunk_scale");
  toolkit::Ring sum_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "chunk_sums");
  toolkit::Ring rowsum_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "chunk_row_sums");
  toolkit::Ring local_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "local_target");
  toolkit::Ring clamped_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "clamped_target");
  toolkit::Ring index_ring = budget.sbuf_ring({P, J}, nl::int32, kSmall, "gather_index");
  toolkit::Ring flag_ring = budget.sbuf_ring({P, J}, nl::uint8, kSmall, "holds_target");
  toolkit::Ring picked_ring = budget.sbuf_ring({P, J}, dt, kSmall, "picked");
  toolkit::Ring chosen_ring = budget.sbuf_ring({P, J}, dt, kSmall, "picked_in_chunk");
  toolkit::Ring row_ring = budget.sbuf_ring({P, 8}, nl::float32, kSmall, "row_values");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  sch.add([&] { loss_detail::chunk_starts(starts, ch); });
  for (const toolkit::RowTile& rt : toolkit::row_tiles(T, P)) {
    const int64_t p = rt.p;
    const Tensor nmax = nmax_ring.next()(first(p), all), sums = sum_ring.next()(first(p), all);
    const Tensor scale = scale_ring.next()(first(p), all);
    const Tensor rowsums = rowsum_ring.next()(first(p), all), local = local_ring.next()(first(p), all);
    const Tensor clamped = clamped_ring.next()(first(p), all), index = index_ring.next()(first(p), all);
    const Tensor picked = picked_ring.next()(first(p), all), chosen = chosen_ring.next()(first(p), all);
    const Tensor holds = flag_ring.next()(first(p), all);
    const Tensor row = row_ring.next()(first(p), all);
    auto col = [&](int64_t c) { return row(all, nl::ds(c, 1)); };
    const Tensor target = col(0), neg_max = col(1), total = col(2), row_lse = col(3), picked_x = col(4),
                 row_loss = col(5), row_sum = col(6);
    // Where each row's target falls: the gather index of every chunk, clamped into the chunk, and
    // whether the chunk holds the target (the clamp changed nothing).
    sch.add([&] { isa::dma_copy(target, loss_detail::row_entries(targets, rt)); });
    sch.add([&] { loss_detail::local_targets(local, starts(first(p), all), target); });
    sch.add([&] { isa::tensor_scalar(clamped, local, nl::maximum, 0.0, {.op1 = nl::minimum, .operand1 = double(W - 1)}); });
    if (ch.last != W) {
      const Tensor last = clamped(all, nl::ds(J - 1, 1));
      sch.add([&] { isa::tensor_scalar(last, last, nl::minimum, double(ch.last - 1)); });
    }
    sch.add([&] { isa::tensor_copy(index, clamped, isa::gpsimd_engine); });
    sch.add([&] { isa::tensor_tensor(holds, clamped, local, nl::equal); });
    for (int64_t j = 0; j < J; ++j) {
      const int64_t w = ch.w(j);
      const Tensor xt = x_ring.next()(first(p), nl::ds(0, w)), e = exp_ring.next()(first(p), nl::ds(0, w));
      const Tensor m = nmax(all, nl::ds(j, 1)), s = sums(all, nl::ds(j, 1));
      sch.add([&] { isa::dma_copy(xt, rt.rows_view(logits, ch.c0(j), w)); });
      sch.add([&] { isa::tensor_reduce(m, nl::maximum, xt, {1}, /*negate=*/true); });
      sch.add([&] { isa::activation_reduce(e, nl::exp, xt, nl::add, s, m); });
      sch.add([&] { isa::nc_n_gather(picked(all, nl::ds(j, 1)), xt, index(all, nl::ds(j, 1))); });
      if (smoothing) sch.add([&] { isa::tensor_reduce(rowsums(all, nl::ds(j, 1)), nl::add, xt, {1}); });
    }
    // lse = M + log(sum_j s_j exp(m_j - M)); -M = min_j(-m_j).
    sch.add([&] { isa::tensor_reduce(neg_max, nl::minimum, nmax, {1}); });
    sch.add([&] { isa::activation(scale, nl::exp, nmax, {.bias = neg_max, .scale = -1.0}); });
    sch.add([&] { isa::tensor_tensor(scale, scale, sums, nl::multiply); });
    sch.add([&] { isa::tensor_reduce(total, nl::add, scale, {1}); });
    sch.add([&] { isa::activation(row_lse, nl::log, total); });
    sch.add([&] { isa::tensor_tensor(row_lse, row_lse, neg_max, nl::subtract); });
    // x[t]: the gathered logit of the chunk that holds t (0 when none does).
    sch.add([&] { isa::memset(chosen, 0.0); });
    sch.add([&] { isa::tensor_copy_predicated(chosen, picked, holds); });
    sch.add([&] { isa::tensor_reduce(picked_x, nl::add, chosen, {1}); });
    sch.add([&] { isa::scalar_tensor_tensor(row_loss, picked_x, nl::multiply, -(1 - o.label_smoothing), nl::add, row_lse); });
    if (smoothing) {
      sch.add([&] { isa::tensor_reduce(row_sum, nl::add, rowsums, {1}); });
      sch.add([&] {
        isa::scalar_tensor_tensor(row_loss, row_sum, nl::multiply, -o.label_smoothing / double(V), nl::add, row_loss);
      });
    }
    // Ignored rows: loss = (target != ignore_index) * loss.
    sch.add([&] {
      isa::tensor_scalar(row_loss, target, nl::not_equal, double(o.ignore_index), {.op1 = nl::multiply, .operand1 = row_loss});
    });
    sch.add([&] { isa::dma_copy(loss_detail::row_entries(loss, rt), row_loss); });
    sch.add([&] { isa::dma_copy(loss_detail::row_entries(lse, rt), row_lse); });
  }
  sch.run();
  return {loss, lse};
}

inline constexpr const char* cross_entropy_bwd_doc = R"(Backward of the per-token cross-entropy: gradient of the logits.

Dimensions: logits [T, V], targets [T], lse [T], grad_loss [T] -> grad_logits [T, V].
Args:       logits, targets: the forward's inputs; lse: its saved output (float32);
            grad_loss: the gradient of the loss with respect to each token's loss (float32);
            ignore_index, label_smoothing: the forward's options.
Returns:    grad_logits in logits' dtype.
Notes:      One read of the logits and one write of the gradient, chunk by chunk: ScalarE
            exp(x - lse), VectorE (e * g - g e / V) and the add of the one-hot term, which GpSimd
            builds from a column-position tile compared with the row's target
            ((position == t) * -g (1 - e)). g is 0 on ignored rows. The probabilities are
            rounded to the logits' dtype before scaling (16-bit outputs: a few roundings).
Pseudocode: g = grad_loss * (targets != ignore_index)
            grad_logits = g * (exp(logits - lse) - e / V - (1 - e) * onehot(targets)))";

/** @brief grad_logits of the per-token cross-entropy; see cross_entropy_bwd_doc. */
inline Tensor cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& grad_loss,
                                const reference::CrossEntropyOptions& o = {}, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using loss_detail::first;
  const ArgumentCheck check("cross_entropy_bwd", logits, loc);
  const auto [T, V] = loss_detail::check_inputs(check, logits, targets, o);
  for (const Tensor* t : {&lse, &grad_loss})
    check.require(t->ndim() == 1 && t->shape()[0] == T && t->dtype() == DType::float32,
                  "'" + t->name() + "' must be float32 [" + std::to_string(T) + "], got " +
                      std::string(dtype_name(t->dtype())) + t->shape().str(),
                  "pass the forward's lse and the loss gradient, one float32 per row");
  const int64_t P = nl::tile_size().pmax;
  const DType dt = logits.dtype();
  const int64_t es = dtype_size(dt);
  const double e = o.label_smoothing;
  Tensor grad = nl::ndarray({T, V}, dt, nl::shared_hbm, "grad_logits");

  // In flight per column: logits tiles (the gradient overwrites them), probabilities, one-hot
  // terms, and the constant column positions.
  constexpr int64_t kInputs = 4, kTemps = 3, kSmall = 4;
  toolkit::Budget budget(check);
  const int64_t max_width =
      budget.largest({8192, 4096, 2048, 1024, 512}, [&](int64_t w) { return w * ((kInputs + 2 * kTemps) * es + 2) + 64 * 1024; })
          .value_or(512);
  const loss_detail::Chunks ch(V, max_width);
  const int64_t W = ch.width, J = ch.count;
  toolkit::Ring x_ring = budget.sbuf_ring({P, W}, dt, kInputs, "logits_tile");
  toolkit::Ring p_ring = budget.sbuf_ring({P, W}, dt, kTemps, "probabilities");
  toolkit::Ring hot_ring = budget.sbuf_ring({P, W}, dt, kTemps, "one_hot");
  // Column positions in 16 bits (exact: W <= 8192) keep the one-hot pass on VectorE's fast path.
  const Tensor positions = budget.sbuf({P, W}, nl::uint16, "positions");
  const Tensor starts = budget.sbuf({P, J}, nl::float32, "chunk_starts");
  toolkit::Ring local_ring = budget.sbuf_ring({P, J}, nl::float32, kSmall, "local_target");
  toolkit::Ring row_ring = budget.sbuf_ring({P, 8}, nl::float32, kSmall, "row_values");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  sch.add([&] { isa::iota(positions, {{1, W}}); });
  sch.add([&] { loss_detail::chunk_starts(starts, ch); });
  for (const toolkit::RowTile& rt : toolkit::row_tiles(T, P)) {
    const int64_t p = rt.p;
    const Tensor local = local_ring.next()(first(p), all), row = row_ring.next()(first(p), all);
    auto col = [&](int64_t c) { return row(all, nl::ds(c, 1)); };
    const Tensor target = col(0), neg_lse = col(1), g = col(2), hot = col(3), uniform = col(4);
    sch.add([&] { isa::dma_copy(target, loss_detail::row_entries(targets, rt)); });
    sch.add([&] { isa::dma_copy(neg_lse, loss_detail::row_entries(lse, rt)); });
    sch.add([&] { isa::dma_copy(g, loss_detail::row_entries(grad_loss, rt)); });
    sch.add([&] { isa::tensor_scalar(neg_lse, neg_lse, nl::multiply, -1.0); });
    sch.add([&] { isa::tensor_scalar(g, target, nl::not_equal, double(o.ignore_index), {.op1 = nl::multiply, .operand1 = g}); });
    sch.add([&] { isa::tensor_scalar(hot, g, nl::multiply, -(1 - e)); });
    sch.add([&] { isa::tensor_scalar(uniform, g, nl::multiply, -e / double(V)); });
    sch.add([&] { loss_detail::local_targets(local, starts(first(p), all), target); });
    for (int64_t j = 0; j < J; ++j) {
      const int64_t w = ch.w(j);
      const Tensor xt = x_ring.next()(first(p), nl::ds(0, w)), pt = p_ring.next()(first(p), nl::ds(0, w));
      const Tensor ht = hot_ring.next()(first(p), nl::ds(0, w));
      sch.add([&] { isa::dma_copy(xt, rt.rows_view(logits, ch.c0(j), w)); });
      sch.add([&] { isa::activation(pt, nl::exp, xt, {.bias = neg_lse}); });
      sch.add([&] {
        isa::tensor_scalar(ht, positions(first(p), nl::ds(0, w)), nl::equal, local(all, nl::ds(j, 1)),
                           {.op1 = nl::multiply, .operand1 = hot});
      });
      sch.add([&] { isa::tensor_scalar(pt, pt, nl::multiply, g, {.op1 = nl::add, .operand1 = uniform}); });
      sch.add([&] { isa::tensor_tensor(xt, pt, ht, nl::add); });
      sch.add([&] { isa::dma_copy(rt.rows_view(grad, ch.c0(j), w), xt); });
    }
  }
  sch.run();
  return grad;
}

namespace loss_detail {

inline ExampleCase forward_case(int64_t T, int64_t V, DType d, std::string label, Params params = {}) {
  return ExampleCase{{spec({T, V}, d), spec({T}, DType::int32)}, std::move(params), std::move(label)};
}
inline ExampleCase backward_case(int64_t T, int64_t V, DType d, std::string label, Params params = {}) {
  return ExampleCase{{spec({T, V}, d), spec({T}, DType::int32), spec({T}, DType::float32), spec({T}, DType::float32)},
                     std::move(params), std::move(label)};
}

/** The options of a case (its parameters, or the defaults). */
inline CrossEntropyOptions case_options(const ExampleCase& c) {
  const CrossEntropyOptions defaults;
  return {int64_t(c.params.find("ignore_index").value_or(double(defaults.ignore_index))),
          c.params.find("label_smoothing").value_or(defaults.label_smoothing)};
}

/** Logits of a trained model's spread (standard normal times 3) and targets in [0, V), about one
 *  in eight replaced by the ignore_index. */
inline std::vector<RefTensor> forward_inputs(const ExampleCase& c, CaseRng& r) {
  RefTensor logits = random_input(c.inputs[0], r, 3.0), targets(c.inputs[1].shape);
  const int64_t V = c.inputs[0].shape[1];
  const int64_t ignore = case_options(c).ignore_index;
  for (double& t : targets.data) t = r.uniform(0, 7) == 0 ? double(ignore) : double(r.uniform(0, V - 1));
  return {logits, targets};
}

/** The forward's inputs, its lse (as the forward computes it) and a gradient per row. */
inline std::vector<RefTensor> backward_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in = forward_inputs(c, r);
  RefTensor lse = reference::cross_entropy(in[0], in[1], case_options(c))[1];
  for (double& v : lse.data) v = round_to(DType::float32, v);
  in.push_back(lse);
  in.push_back(random_input(c.inputs[3], r));
  return in;
}

inline Params draw_params(CaseRng& r, int64_t V) {
  return Params{{"ignore_index", r.coin(0.7) ? -100.0 : double(r.uniform(0, V - 1))},
                {"label_smoothing", r.pick({0.0, 0.0, 0.1, 0.25})}};
}

/** Mostly short vocabularies, sometimes long ones of several chunks; at most ~2M logits. */
inline std::pair<int64_t, int64_t> draw_shape(CaseRng& r) {
  if (r.coin(0.25)) return {r.size(1, 40), r.size(8193, 40000, 8192)};
  return {r.size(1, 300, 128), r.size(1, 5000, 512)};
}

inline std::vector<ParamSpec> params() {
  return {{"ignore_index", ParamKind::integer, -100, "target value whose rows get loss 0 and no gradient"},
          {"label_smoothing", ParamKind::real, 0, "weight of the uniform distribution mixed into the target"}};
}

}  // namespace loss_detail

inline KernelInfo cross_entropy_info() {
  using loss_detail::forward_case;
  return KernelInfo{
      .name = "cross_entropy",
      .summary = "per-token cross-entropy and logsumexp of logits against integer targets, any vocabulary size",
      .doc = cross_entropy_doc,
      .inputs = {"logits", "targets"},
      .outputs = {"loss", "lse"},
      .params = loss_detail::params(),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16, DType::int32},
      .backward = "cross_entropy_bwd",
      .gradient = "",
      .saved_outputs = {"lse"},
      .body = [](const KernelCall& c) { return cross_entropy(c.inputs[0], c.inputs[1], loss_detail::options(c)); },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::cross_entropy(in[0], in[1], loss_detail::options(p));
          },
      .make_inputs = loss_detail::forward_inputs,
      .examples = {forward_case(1, 1, DType::float32, "one class"),
                   forward_case(130, 1000, DType::float32, "row tail"),
                   forward_case(64, 777, DType::bfloat16, "bf16, label smoothing", {{"label_smoothing", 0.1}}),
                   forward_case(9, 20000, DType::float32, "several column chunks, a short last one",
                                {{"ignore_index", 5.0}}),
                   forward_case(3, 17000, DType::bfloat16, "chunks, smoothing", {{"label_smoothing", 0.2}})},
      .draw =
          [](CaseRng& r) {
            const auto [T, V] = loss_detail::draw_shape(r);
            return forward_case(T, V, r.pick({DType::float32, DType::bfloat16, DType::float16}), "drawn",
                                loss_detail::draw_params(r, V));
          },
      .tolerance = {},
      .benchmark = Benchmark{forward_case(2048, 131072, DType::bfloat16, "T=2048 V=131072 bf16"), Bound::hbm, {}, 0.70},
  };
}

inline KernelInfo cross_entropy_bwd_info() {
  using loss_detail::backward_case;
  return KernelInfo{
      .name = "cross_entropy_bwd",
      .summary = "gradient of the per-token cross-entropy with respect to the logits",
      .doc = cross_entropy_bwd_doc,
      .inputs = {"logits", "targets", "lse", "grad_loss"},
      .outputs = {"grad_logits"},
      .params = loss_detail::params(),
      .dtypes = {DType::float32, DType::bfloat16, DType::float16, DType::int32},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{
                cross_entropy_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], loss_detail::options(c))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{
                reference::cross_entropy_backward(in[0], in[1], in[2], in[3], loss_detail::options(p))};
          },
      .make_inputs = loss_detail::backward_inputs,
      .examples = {backward_case(1, 1, DType::float32, "one class"),
                   backward_case(130, 1000, DType::float32, "row tail", {{"ignore_index", 3.0}}),
                   backward_case(64, 777, DType::bfloat16, "bf16, label smoothing", {{"label_smoothing", 0.1}}),
                   backward_case(5, 20000, DType::float32, "several column chunks", {{"label_smoothing", 0.3}})},
      .draw =
          [](CaseRng& r) {
            const auto [T, V] = loss_detail::draw_shape(r);
            return backward_case(T, V, r.pick({DType::float32, DType::bfloat16, DType::float16}), "drawn",
                                 loss_detail::draw_params(r, V));
          },
      .tolerance = {},
      .benchmark = Benchmark{backward_case(2048, 131072, DType::bfloat16, "T=2048 V=131072 bf16"), Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
