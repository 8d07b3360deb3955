// Embedding lookup (torch.nn.functional.embedding): rows of a weight table gathered by token id
// with indirect DMA, and its weight gradient by scatter-add.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/gather/gather_reference.hpp"
#include "nikki/kernels/gather/indexed_rows.hpp"

namespace nikki::kernels {

inline constexpr const char* embedding_doc = R"(Embedding lookup (F.embedding(ids, weight, padding_idx)): the weight rows of each token id.

Dimensions: weight [V, H], ids [T] -> out [T, H]; any T, H >= 1, 1 <= V < 2^24.
Args:       weight: HBM table, float32 / bfloat16 / float16.
            ids: int32 token ids in [0, V).
            padding_idx: None, or a row (negative counts from the end, as in torch) whose
            occurrences get no gradient in the backward; the forward returns its row as it is
            (torch does the same: nn.Embedding keeps that row at zero).
Returns:    out in weight's dtype, bit-exact rows.
Notes:      Tokens on partitions, 128 per tile: the tile's ids are loaded into SBUF and one
            indirect DMA per column chunk (a vector offset: the source rows are read at run
            time from the ids, not fixed at trace time) gathers the rows into SBUF, a second
            stores them. Memory-bound: every gathered row is read once and written once.
            An id outside [0, V) makes the gather's address out of bounds: the run stops with a
            KernelError "runtime offset out of bounds" at the gather (NKI's default
            oob_mode=error; torch raises IndexError).
Pseudocode: out[t, :] = weight[ids[t], :])";

inline constexpr const char* embedding_bwd_doc = R"(Gradient of the embedding lookup with respect to the weight table.

Dimensions: weight [V, H], ids [T], grad_out [T, H] -> grad_weight [V, H].
Args:       weight: the forward's table (only its shape and bounds are used);
            ids: the forward's int32 ids; grad_out: the gradient of out, in weight's dtype;
            padding_idx: None, or the row whose occurrences contribute nothing.
Returns:    grad_weight in weight's dtype: zero except the rows that occur in ids.
Notes:      grad_weight is cleared by DMA, then each tile of 128 tokens is scatter-added into
            it. Duplicate ids are combined without sorting: the tile's p x p equality matrix
            (same[t', t] = ids[t'] == ids[t], built on VectorE/GpSimd) times the grad rows on
            the Tensor engine gives every token the fp32 sum of its id's rows in the tile; only
            the first token of each id (and not padding_idx) keeps its id, the others are sent
            past the table's end and skipped (oob_mode=skip), so each scatter transfer names a
            row at most once and the DMA engines' read-add-write (fp32, rounded to weight's
            dtype) is race-free; successive tiles' transfers are ordered. 16-bit tables round
            each tile's sum once and each accumulation once. An id outside [0, V) is a runtime
            KernelError (a bounds-checked gather of one element per id), as in the forward.
Pseudocode: grad_weight = zeros(V, H)
            for t: if ids[t] != padding_idx: grad_weight[ids[t], :] += grad_out[t, :])";

namespace gather {

inline void check_padding(const ArgumentCheck& check, std::optional<double> padding_idx, int64_t V) {
  if (!padding_idx) return;
  const double p = *padding_idx;
  if (!(p == std::floor(p) && p >= -double(V) && p < double(V)))
    check.fail("padding_idx is " + std::to_string(p), "padding_idx lies in [-V, V) = [" + std::to_string(-V) + ", " +
                   std::to_string(V) + ") and is an integer",
               "pass a row of the table (or None)");
}

/** Checks the embedding's weight and ids (and padding_idx); returns {V, H, T}. */
inline std::array<int64_t, 3> check_embedding(const ArgumentCheck& check, const Tensor& weight, const Tensor& ids,
                                              std::optional<double> padding_idx) {
  check_table(check, weight);
  check_index(check, ids, "token ids");
  check_padding(check, padding_idx, weight.shape()[0]);
  return {weight.shape()[0], weight.shape()[1], ids.shape()[0]};
}

}  // namespace gather

/** @brief out [T, H] = weight[ids]; see embedding_doc. */
inline Tensor embedding(const Tensor& weight, const Tensor& ids, std::optional<double> padding_idx = std::nullopt,
                        Loc loc = Loc::current()) {
  const ArgumentCheck check("embedding", weight, loc);
  const auto [V, H, T] = gather::check_embedding(check, weight, ids, padding_idx);
  Tensor out = nl::ndarray({T, H}, weight.dtype(), nl::shared_hbm, "out");
  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  gather::gather_into(sch, budget, out, weight, ids, gather::OutOfRange::error);
  sch.run();
  return out;
}

/** @brief grad_weight [V, H]; see embedding_bwd_doc. */
inline Tensor embedding_bwd(const Tensor& weight, const Tensor& ids, const Tensor& grad_out,
                            std::optional<double> padding_idx = std::nullopt, Loc loc = Loc::current()) {
  const ArgumentCheck check("embedding_bwd", weight, loc);
  const auto [V, H, T] = gather::check_embedding(check, weight, ids, padding_idx);
  check.require(grad_out.ndim() == 2 && grad_out.shape() == Shape{T, H} && grad_out.dtype() == weight.dtype(),
                "grad_out must be " + std::string(dtype_name(weight.dtype())) + " [" + std::to_string(T) + ", " +
                    std::to_string(H) + "] (one row per id, in weight's dtype), got " +
                    std::string(dtype_name(grad_out.dtype())) + grad_out.shape().str());
  Tensor grad_weight = nl::ndarray({V, H}, weight.dtype(), nl::shared_hbm, "grad_weight");
  toolkit::Budget budget(check);
  toolkit::TaskScheduler sch;
  gather::scatter_into(sch, budget, grad_weight,
                       {.rows = grad_out,
                        .index = ids,
                        .scale = std::nullopt,
                        .padding = reference::normalized_padding(padding_idx, V),
                        .bounds_check = weight});
  sch.run();
  return grad_weight;
}

namespace gather {

inline std::optional<double> padding_param(const ParamValues& p) { return p.optional_real("padding_idx"); }

inline std::vector<ParamSpec> embedding_params() {
  return {{"padding_idx", ParamKind::optional_real, 0,
           "row whose occurrences get no gradient (None: every row; negative: from the end)"}};
}

inline ExampleCase embedding_case(int64_t V, int64_t H, int64_t T, DType d, std::string label, Params params = {},
                                  bool backward = false) {
  std::vector<TensorSpec> in{spec({V, H}, d), spec({T}, DType::int32)};
  if (backward) in.push_back(spec({T, H}, d));
  return ExampleCase{std::move(in), std::move(params), std::move(label)};
}

/** Ids in [0, V) with the first and last rows always present, padding_idx among them when it is
 *  set, and repeats (a small vocabulary repeats ids by itself; a large one gets copies). */
inline std::vector<RefTensor> embedding_inputs(const ExampleCase& c, CaseRng& r) {
  std::vector<RefTensor> in{random_input(c.inputs[0], r), RefTensor(c.inputs[1].shape)};
  if (c.inputs.size() > 2) in.push_back(random_input(c.inputs[2], r));
  const int64_t V = c.inputs[0].shape[0], T = c.inputs[1].shape[0];
  RefTensor& ids = in[1];
  for (int64_t t = 0; t < T; ++t) ids[t] = double(r.uniform(0, V - 1));
  for (int64_t t = 0; t < T; t += 7) ids[t] = ids[r.uniform(0, t)];  // repeats of earlier ids
  ids[0] = 0;
  if (T > 1) ids[T - 1] = double(V - 1);
  if (const std::optional<double> pad = c.params.find("padding_idx"); pad && !std::isnan(*pad) && T > 2)
    ids[T / 2] = double(*reference::normalized_padding(*pad, V));
  return in;
}

/** A case of the forward's or the backward's shapes: small vocabularies (many repeats) and
 *  large ones, tails of rows and columns, with or without padding_idx. */
inline ExampleCase draw_embedding(CaseRng& r, bool backward) {
  const int64_t V = r.coin(0.4) ? r.size(1, 20) : r.size(1, 5000);
  const int64_t T = r.size(1, 600), H = r.size(1, 3000, 512);
  Params p;
  if (r.coin(0.5)) p.set("padding_idx", double(r.uniform(-V, V - 1)));
  return embedding_case(V, H, T, draw_dtype(r), "drawn", p, backward);
}

/** The bytes the lookup must move: ids, then T rows read and written. */
inline double embedding_bytes(const ExampleCase& c) {
  const int64_t H = c.inputs[0].shape[1], T = c.inputs[1].shape[0];
  return double(T) * 4 + 2.0 * double(T * H) * dtype_size(c.inputs[0].dtype);
}

/** The bytes the gradient must move: ids and grad_out read, grad_weight written. */
inline double embedding_bwd_bytes(const ExampleCase& c) {
  const int64_t V = c.inputs[0].shape[0], H = c.inputs[0].shape[1], T = c.inputs[1].shape[0];
  return double(T) * 4 + double(T * H + V * H) * dtype_size(c.inputs[0].dtype);
}

}  // namespace gather

inline KernelInfo embedding_info() {
  using gather::embedding_case;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "embedding",
      .summary = "embedding lookup: weight rows gathered by token id with indirect DMA",
      .doc = embedding_doc,
      .inputs = {"weight", "ids"},
      .outputs = {"out"},
      .params = gather::embedding_params(),
      .dtypes = gather::family_dtypes(),
      .backward = "embedding_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{embedding(c.inputs[0], c.inputs[1], gather::padding_param(c))}; },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues&) {
            return std::vector<RefTensor>{reference::gather_rows(in[0], in[1])};
          },
      .make_inputs = gather::embedding_inputs,
      .examples = {embedding_case(1, 1, 1, f32, "one row, one token"),
                   embedding_case(10, 300, 130, f32, "row tail, repeated ids, ids 0 and V-1"),
                   embedding_case(1000, 5000, 200, bf16, "bf16, several column chunks", {{"padding_idx", 3.0}}),
                   embedding_case(50, 77, 257, DType::float16, "fp16, two full tiles and a tail", {{"padding_idx", -1.0}})},
      .draw = [](CaseRng& r) { return gather::draw_embedding(r, false); },
      .tolerance = {},
      .benchmark = Benchmark{embedding_case(32000, 4096, 4096, bf16, "T=4096 H=4096 V=32000 bf16"), Bound::hbm, {}, 0.70,
                             gather::embedding_bytes},
  };
}

inline KernelInfo embedding_bwd_info() {
  using gather::embedding_case;
  const DType bf16 = DType::bfloat16, f32 = DType::float32;
  return KernelInfo{
      .name = "embedding_bwd",
      .summary = "gradient of the embedding lookup: grad rows scatter-added by token id",
      .doc = embedding_bwd_doc,
      .inputs = {"weight", "ids", "grad_out"},
      .outputs = {"grad_weight"},
      .params = gather::embedding_params(),
      .dtypes = gather::family_dtypes(),
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{embedding_bwd(c.inputs[0], c.inputs[1], c.inputs[2], gather::padding_param(c))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            const int64_t V = in[0].shape[0];
            return std::vector<RefTensor>{
                reference::scatter_add_rows(in[2], in[1], nullptr, V, reference::normalized_padding(gather::padding_param(p), V))};
          },
      .make_inputs = gather::embedding_inputs,
      .examples = {embedding_case(1, 1, 1, f32, "one row, one token", {}, true),
                   embedding_case(3, 40, 300, f32, "3 ids over 300 tokens: duplicates across tiles", {{"padding_idx", 1.0}}, true),
                   embedding_case(700, 600, 130, bf16, "bf16, row and column tails, ids 0 and V-1", {}, true),
                   embedding_case(64, 1100, 257, DType::float16, "fp16, padding_idx from the end", {{"padding_idx", -64.0}}, true)},
      .draw = [](CaseRng& r) { return gather::draw_embedding(r, true); },
      .tolerance = gather::per_tile_sum_tolerance,
      .benchmark = Benchmark{embedding_case(32000, 4096, 4096, bf16, "T=4096 H=4096 V=32000 bf16", {}, true), Bound::hbm,
                             {}, 0.70, gather::embedding_bwd_bytes},
  };
}

}  // namespace nikki::kernels
