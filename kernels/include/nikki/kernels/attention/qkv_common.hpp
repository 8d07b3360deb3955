// What the fused q/k/v projection's forward and backward share: the argument checks, the head
// layout of the projection's columns, how a tile of token rows maps onto sequences, and the test
// cases of the four registrations (qkv, add_qkv and their backwards).
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/attention/qkv_reference.hpp"
#include "nikki/kernels/attention/rope.hpp"
#include "nikki/kernels/norm/row_norm.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels::attention {

/** @brief The projection's sizes: x [B, S, H], w_qkv [H, I], I = (Hq + 2 Hkv) D, M = B S token
 *  rows, r rotated dims per head (0 without rope). */
struct QkvDims {
  int64_t B = 0, S = 0, H = 0, Hq = 0, Hkv = 0, D = 0, I = 0, M = 0, r = 0;
  int64_t heads() const { return Hq + 2 * Hkv; }
};

/** @brief The norm kernels' kind for a QkvConfig (none: no norm). */
inline std::optional<norm_detail::Kind> norm_kind(const reference::QkvConfig& c) {
  if (c.norm == reference::QkvNorm::none) return std::nullopt;
  return c.norm == reference::QkvNorm::layer ? norm_detail::Kind::layer : norm_detail::Kind::rms;
}

inline std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "[" : ", ") + std::to_string(d);
  return s + "]";
}

inline std::string dtype_text(const Tensor& t) { return std::string(dtype_name(t.dtype())); }

/** @brief Requires `t` to have `shape` and (when given) `dtype`; the error names it as `name`. */
inline void require_tensor(const ArgumentCheck& check, const Tensor& t, const std::string& name, const Shape& shape,
                           std::optional<DType> dtype, const std::string& hint = {}) {
  check.require(t.shape() == shape, name + " must be " + shape.str() + ", got " + t.shape().str(), hint);
  if (dtype)
    check.require(t.dtype() == *dtype, name + " must be " + std::string(dtype_name(*dtype)) + " (x's dtype), got " +
                                           dtype_text(t),
                  hint);
}

/**
 * @brief Checks the arguments both directions take: x (or the sum) [B, S, H], w_qkv [H, I] of x's
 * dtype, gamma and beta [H] of a float dtype, the head counts, the norm, and (with rope) the
 * tables for q's positions. Returns the sizes.
 */
inline QkvDims check_qkv(const ArgumentCheck& check, const Tensor& x, const std::string& x_name, const Tensor& w,
                         const Tensor& gamma, const Tensor& beta, const Tensor& cos, const Tensor& sin,
                         const reference::QkvConfig& c) {
  check.require(x.ndim() == 3, x_name + " must be 3-D [batch, seq, hidden], got " + x.shape().str(),
                "pass the hidden states as [B, S, H]");
  check.require(norm_detail::is_norm_float(x.dtype()),
                x_name + " must be float32, bfloat16 or float16, got " + dtype_text(x));
  QkvDims d{.B = x.shape()[0], .S = x.shape()[1], .H = x.shape()[2], .Hq = c.q_heads, .Hkv = c.kv_heads};
  check.require(c.q_heads >= 1 && c.kv_heads >= 1,
                "q_heads and kv_heads must be at least 1, got " + std::to_string(c.q_heads) + " and " +
                    std::to_string(c.kv_heads),
                "pass the model's numbers of query and key/value heads");
  check.require(w.ndim() == 2 && w.shape()[0] == d.H,
                "w_qkv must be [H, I] with H = " + std::to_string(d.H) + " (x's last dim), got " + w.shape().str(),
                "pass the fused weight as [hidden, (q_heads + 2 kv_heads) * head_dim] (the Linear weights' "
                "transposes, concatenated q | k | v)");
  d.I = w.shape()[1];
  check.require(d.I % d.heads() == 0,
                "w_qkv's " + std::to_string(d.I) + " columns are not q_heads + 2 kv_heads = " +
                    std::to_string(d.heads()) + " heads of one head_dim",
                "check q_heads and kv_heads against the weight");
  d.D = d.I / d.heads();
  d.M = d.B * d.S;
  const int64_t bank = nl::tile_size().psum_bank_fmax;
  check.require(d.D <= bank, "head_dim " + std::to_string(d.D) + " is larger than " + std::to_string(bank),
                "a head's columns accumulate in one PSUM bank of " + std::to_string(bank) + " fp32 values");
  check.require(w.dtype() == x.dtype(), "w_qkv must have " + x_name + "'s dtype " + dtype_text(x) + ", got " + dtype_text(w),
                "cast the weight to the activations' dtype");
  for (const auto& [t, name] : {std::pair{&gamma, "gamma"}, std::pair{&beta, "beta"}}) {
    check.require(t->shape() == Shape{d.H}, std::string(name) + " must be [" + std::to_string(d.H) + "], got " +
                                                t->shape().str(),
                  "pass the norm's weight and bias of the hidden size (ones and zeros when the norm does not use them)");
    check.require(norm_detail::is_norm_float(t->dtype()),
                  std::string(name) + " must be float32, bfloat16 or float16, got " + dtype_text(*t));
  }
  check.require(c.norm == reference::QkvNorm::none || c.norm == reference::QkvNorm::rms ||
                    c.norm == reference::QkvNorm::layer,
                "norm must be 0 (none), 1 (rmsnorm) or 2 (layernorm), got " + std::to_string(int(c.norm)));
  check.require(c.eps >= 0 && std::isfinite(c.eps), "eps must be a finite non-negative number");
  if (c.rope)
    d.r = check_rope_tables(check, cos, sin, d.B, d.S, d.D,
                            "q " + shape_text({d.B, d.Hq, d.S, d.D}) + " (from " + x_name + " " + x.shape().str() + ")");
  return d;
}

/** @brief Which output a head of the projection's columns belongs to (0 q, 1 k, 2 v) and its
 *  index there: heads [0, Hq) are q's, the next Hkv k's, the last Hkv v's. */
struct HeadRun {
  int section = 0;
  int64_t head = 0;   // first head within the section
  int64_t count = 0;  // consecutive heads
  int64_t offset = 0; // first head relative to the run's start in the projection's columns
};

/** @brief Heads [h0, h0 + n) of the projection cut at the q | k | v boundaries. */
inline std::vector<HeadRun> head_runs(const QkvDims& d, int64_t h0, int64_t n) {
  const int64_t starts[4] = {0, d.Hq, d.Hq + d.Hkv, d.heads()};
  std::vector<HeadRun> runs;
  for (int s = 0; s < 3; ++s) {
    const int64_t lo = std::max(h0, starts[s]), hi = std::min(h0 + n, starts[s + 1]);
    if (lo < hi) runs.push_back({s, lo - starts[s], hi - lo, lo - h0});
  }
  return runs;
}

/**
 * @brief Part of a tile of token rows (b * S + s) lying in consecutive sequences: partitions
 * [part, part + nb * ns) hold positions [s, s + ns) of sequence b (nb == 1), or whole sequences
 * b .. b + nb - 1 (s == 0, ns == S), so that each part is one strided view of a [B, ..., S, ...]
 * tensor.
 */
struct RowPiece {
  int64_t part = 0, b = 0, nb = 1, s = 0, ns = 0;
  int64_t rows() const { return nb * ns; }
};

/** @brief The pieces of token rows [row0, row0 + p) with S positions per sequence. */
inline std::vector<RowPiece> row_pieces(int64_t row0, int64_t p, int64_t S) {
  std::vector<RowPiece> pieces;
  for (int64_t q = 0; q < p;) {
    const int64_t row = row0 + q, b = row / S, s = row % S;
    if (s > 0 || p - q < S) {
      const int64_t ns = std::min(S - s, p - q);
      pieces.push_back({q, b, 1, s, ns});
      q += ns;
    } else {
      const int64_t nb = (p - q) / S;
      pieces.push_back({q, b, nb, 0, S});
      q += nb * S;
    }
  }
  return pieces;
}

/** @brief Heads [head, head + n) of t [B, heads, S, D] at a piece's rows, as [nb, ns, n, D]: the
 *  order of the rows of a tile [rows, n * D]. */
inline Tensor piece_heads(const Tensor& t, const RowPiece& pc, int64_t head, int64_t n) {
  return t(nl::ds(pc.b, pc.nb), nl::ds(head, n), nl::ds(pc.s, pc.ns), nl::all).permute({0, 2, 1, 3});
}

/** @brief The rotary table rows of a piece, as [rows, 1, r]: [B, S, r] tables by token row, shared
 *  ([S, r] or [1, S, r]) tables by position, repeated for whole sequences. */
inline Tensor piece_table(const Tensor& table, const RowPiece& pc, int64_t B) {
  const int64_t r = table.shape()[size_t(table.ndim() - 1)];
  if (table.ndim() == 3 && table.shape()[0] == B && B > 1)
    return table(nl::ds(pc.b, pc.nb), nl::ds(pc.s, pc.ns), nl::all).reshape({pc.rows(), 1, r});
  const Tensor shared = table.ndim() == 3 ? table.select(0, 0) : table;
  if (pc.nb > 1) return shared.expand_dim(0).broadcast(0, pc.nb).expand_dim(2);
  return shared(nl::ds(pc.s, pc.ns), nl::all).expand_dim(1);
}

/** @brief Fills an HBM vector t [N] with `value` (a memset tile, one or two DMAs). */
inline void fill_vector(const Tensor& t, double value) {
  const int64_t P = nl::tile_size().pmax, N = t.shape()[0], full = N / P;
  Tensor tile = nl::ndarray({P, std::max<int64_t>(1, full)}, t.dtype(), nl::sbuf, t.name() + "_fill");
  isa::memset(tile, value, isa::gpsimd_engine);
  if (full > 0) isa::dma_copy(t(nl::ds(0, full * P)).reshape({P, full}), tile);
  if (N % P > 0) isa::dma_copy(t(nl::ds(full * P, N % P)).reshape({N % P, 1}), tile(nl::ds(0, N % P), nl::ds(0, 1)));
}

/** @brief The config of a call from the kernels' parameters. */
inline reference::QkvConfig qkv_config(const ParamValues& p) {
  return {.q_heads = p.integer("q_heads"),
          .kv_heads = p.integer("kv_heads"),
          .norm = reference::QkvNorm(p.integer("norm")),
          .eps = p.real("eps"),
          .rope = p.flag("rope"),
          .interleaved = p.flag("interleaved")};
}

/** @brief The parameters of the forward (with eps) or the backward. */
inline std::vector<ParamSpec> qkv_params(bool backward) {
  return {
      {"q_heads", ParamKind::integer, 0, "the number of query heads Hq (required)"},
      {"kv_heads", ParamKind::integer, 0, "the number of key/value heads Hkv (required)"},
      {"norm", ParamKind::integer, 1, "the norm before the projection: 0 none, 1 rmsnorm, 2 layernorm"},
      {"eps", ParamKind::real, 1e-6,
       backward ? "the forward's epsilon (the backward recomputes x_norm)" : "the norm's epsilon"},
      {"rope", ParamKind::boolean, 1, "rotate q and k with cos and sin"},
      {"interleaved", ParamKind::boolean, 0, "rotate pairs (2i, 2i + 1) instead of the two halves"}};
}

// --- test cases ---------------------------------------------------------------------------------

/** @brief How a case's rotary tables are laid out. */
enum class TableLayout { shared, per_sequence, leading_one };

/** @brief One problem of the projection: sizes, dtypes and options. */
struct QkvProblem {
  int64_t B = 1, S = 1, H = 1, Hq = 1, Hkv = 1, D = 8, r = 8;
  DType dtype = DType::float32, table_dtype = DType::float32, norm_dtype = DType::float32;
  TableLayout tables = TableLayout::shared;
  reference::QkvConfig config;
};

/**
 * @brief The input specs of a problem: forward x[, residual], w_qkv, bias, gamma, beta, cos, sin;
 * backward x (the sum with a residual), w_qkv, gamma, beta, cos, sin, mean, rstd, grad_q, grad_k,
 * grad_v[, grad_sum]. Tables are [1, 2] placeholders without rope.
 */
inline ExampleCase qkv_case(const QkvProblem& p, bool backward, bool residual, std::string label) {
  const Shape xs{p.B, p.S, p.H}, table = !p.config.rope                       ? Shape{1, 2}
                                         : p.tables == TableLayout::shared       ? Shape{p.S, p.r}
                                         : p.tables == TableLayout::leading_one  ? Shape{1, p.S, p.r}
                                                                                 : Shape{p.B, p.S, p.r};
  const DType t = p.config.rope ? p.table_dtype : DType::float32;
  std::vector<TensorSpec> in{spec(xs, p.dtype)};
  if (residual && !backward) in.push_back(spec(xs, p.dtype));
  in.push_back(spec({p.H, (p.Hq + 2 * p.Hkv) * p.D}, p.dtype));
  if (!backward) in.push_back(spec({(p.Hq + 2 * p.Hkv) * p.D}, p.dtype));
  for (int i = 0; i < 2; ++i) in.push_back(spec({p.H}, p.norm_dtype));
  for (int i = 0; i < 2; ++i) in.push_back(spec(table, t));
  if (backward) {
    for (int i = 0; i < 2; ++i) in.push_back(spec({p.B * p.S}, DType::float32));
    in.push_back(spec({p.B, p.Hq, p.S, p.D}, p.dtype));
    for (int i = 0; i < 2; ++i) in.push_back(spec({p.B, p.Hkv, p.S, p.D}, p.dtype));
    if (residual) in.push_back(spec(xs, p.dtype));
  }
  const reference::QkvConfig& c = p.config;
  Params params{{"q_heads", double(p.Hq)}, {"kv_heads", double(p.Hkv)},          {"norm", double(int(c.norm))},
                {"eps", c.eps},             {"rope", c.rope ? 1.0 : 0.0}, {"interleaved", c.interleaved ? 1.0 : 0.0}};
  return ExampleCase{std::move(in), std::move(params), std::move(label)};
}

/**
 * @brief Inputs at the scale of a trained layer: x and residual standard normal, w_qkv
 * N(0, 1 / H) (so each projected value is ~1), bias N(0, 0.1), gamma 1 + N(0, 0.2), beta
 * N(0, 0.1), real rotary tables; for a backward, the forward's mean and rstd of x (fp32, the
 * case's eps) and standard normal gradients.
 */
inline std::vector<RefTensor> qkv_inputs(const ExampleCase& c, CaseRng& rng, bool backward, bool residual) {
  const std::vector<ParamSpec> specs = qkv_params(backward);
  const reference::QkvConfig cfg = qkv_config(ParamValues{specs, c.params});
  const size_t w_at = residual && !backward ? 2 : 1, gamma_at = w_at + (backward ? 1 : 2), table_at = gamma_at + 2;
  const int64_t H = c.inputs[0].shape[2];
  auto scale = [&](size_t i) {
    if (i == w_at) return 1 / std::sqrt(double(H));
    if ((i == w_at + 1 && !backward) || i == gamma_at + 1) return 0.1;  // bias, beta
    return i == gamma_at ? 0.2 : 1.0;
  };
  std::vector<RefTensor> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) in.push_back(random_input(c.inputs[i], rng, scale(i)));
  for (double& g : in[gamma_at].data) g = round_to(c.inputs[gamma_at].dtype, 1 + g);
  if (cfg.rope) fill_rotary_tables(in, c, rng, cfg.interleaved, table_at);
  if (backward) {
    const std::vector<RefTensor> n = reference::qkv_norm(reference::as_rows(in[0], H), in[gamma_at], in[gamma_at + 1], cfg);
    for (int i : {1, 2}) {
      in[table_at + 1 + size_t(i)] = n[size_t(i)];
      for (double& v : in[table_at + 1 + size_t(i)].data) v = round_to(DType::float32, v);
    }
  }
  return in;
}

/** @brief The registrations' examples: tails, every norm and table layout, decode, GQA, head dims
 *  that do not fill a PSUM bank, several token blocks. */
inline std::vector<ExampleCase> qkv_examples(bool backward, bool residual) {
  using reference::QkvNorm;
  const DType f32 = DType::float32, bf16 = DType::bfloat16, f16 = DType::float16;
  auto problem = [](int64_t B, int64_t S, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t r, DType dt, DType tdt,
                    TableLayout layout, QkvNorm norm, bool rope, bool interleaved) {
    return QkvProblem{B, S, H, Hq, Hkv, D, r, dt, tdt, dt, layout, {Hq, Hkv, norm, 1e-6, rope, interleaved}};
  };
  std::vector<ExampleCase> cases{
      qkv_case(problem(1, 3, 40, 2, 1, 8, 8, f32, f32, TableLayout::shared, QkvNorm::none, false, false), backward,
               residual, "tiny, no norm, no rope"),
      qkv_case(problem(2, 100, 200, 4, 2, 32, 32, bf16, bf16, TableLayout::shared, QkvNorm::rms, true, false), backward,
               residual, "rmsnorm and rope, tails in S and H, a row tile across two sequences"),
      qkv_case(problem(2, 70, 136, 3, 1, 64, 32, f16, f32, TableLayout::per_sequence, QkvNorm::layer, true, true),
               backward, residual, "layernorm, interleaved partial rotary, per-sequence fp32 tables"),
      qkv_case(problem(8, 1, 256, 8, 2, 64, 64, bf16, bf16, TableLayout::per_sequence, QkvNorm::rms, true, false),
               backward, residual, "decode: 8 sequences of one token at their own positions"),
      qkv_case(problem(1, 600, 130, 4, 1, 128, 128, bf16, bf16, TableLayout::leading_one, QkvNorm::rms, true, false),
               backward, residual, "two token blocks, D = 128, H tail"),
      qkv_case(problem(3, 50, 96, 5, 1, 96, 96, f32, f32, TableLayout::shared, QkvNorm::layer, true, false), backward,
               residual, "D = 96: 5 heads per PSUM bank, chunks across the q | k | v boundaries, fp32")};
  return cases;
}

/** @brief A random problem: sizes with tails, head counts and dims, every option, dtypes. */
inline ExampleCase draw_qkv(CaseRng& rng, bool backward, bool residual) {
  using reference::QkvNorm;
  QkvProblem p;
  p.B = rng.uniform(1, 3);
  p.S = rng.coin(0.2) ? rng.uniform(1, 4) : rng.size(1, 200);
  p.H = rng.size(1, 300);
  p.D = rng.pick<int64_t>({8, 16, 32, 64, 80, 96, 128});
  p.Hkv = rng.uniform(1, 2);
  p.Hq = p.Hkv * rng.uniform(1, 4);
  p.dtype = rng.pick({DType::float32, DType::bfloat16, DType::float16});
  p.table_dtype = rng.coin(0.75) ? p.dtype : DType::float32;
  p.norm_dtype = rng.coin(0.7) ? p.dtype : DType::float32;
  p.tables = rng.pick({TableLayout::shared, TableLayout::per_sequence, TableLayout::leading_one});
  p.r = rng.coin(0.6) ? p.D : 2 * rng.uniform(1, p.D / 2);
  p.config = {p.Hq, p.Hkv, rng.pick({QkvNorm::none, QkvNorm::rms, QkvNorm::layer}), rng.pick({1e-6, 1e-5, 1e-3}),
              rng.coin(0.7), rng.coin()};
  return qkv_case(p, backward, residual, "drawn");
}

/** @brief The benchmark problem: Llama-3-8B's attention projection at a 4096-token prefill
 *  (B = 1, S = 4096, H = 4096, Hq = 32, Hkv = 8, D = 128), bf16, rmsnorm and rope. */
inline QkvProblem qkv_benchmark_problem(int64_t B = 1, int64_t S = 4096) {
  const DType bf16 = DType::bfloat16;
  return {B, S, 4096, 32, 8, 128, 128, bf16, bf16, bf16, TableLayout::shared, {32, 8, reference::QkvNorm::rms, 1e-6, true, false}};
}

/** @brief Useful FLOPs: 2 M H I per product (one forward, two backward). */
inline double qkv_flops(const ExampleCase& c, int64_t products) {
  const Shape& x = c.inputs[0].shape;
  const Shape& w = c.inputs[c.inputs[1].shape.rank() == 3 ? 2 : 1].shape;
  return 2.0 * double(products) * double(x[0] * x[1]) * double(w[0]) * double(w[1]);
}

}  // namespace nikki::kernels::attention
