// Rotary position embeddings (RoPE), forward and backward, with the Hugging Face formula
// out = x * cos + rotate(x) * sin on the first r dims of each head (partial rotary passes the rest
// through), rotate being rotate_half (half-split) or rotate-every-two (interleaved pairs).
//
// The kernel is memory-bound: it reads x and writes out once (cos and sin are read once per
// block of positions and reused by every head). Positions go onto partitions, several
// consecutive positions of one head per partition, so that each partition moves one long
// contiguous run of x per DMA. Sequences shorter than a tile (decode) pack several heads onto
// the partitions instead (and several batches when the tables are shared by the batch). Per tile, four element-wise instructions on the Vector and GpSimd
// engines (the scheduler spreads them) compute the rotated part in place in the loaded tile,
// which is then stored whole, pass-through dims included:
//   a = x * cos;  m = x * T;  out[member 0] = a[member 0] + m[member 1];  out[member 1] = ...
// where T, built once per block on the Scalar engine, holds each partner's signed sine (for the
// forward T = (sin[member 1], -sin[member 0]), for the backward (-sin[member 0], sin[member 1])),
// so that the sum swaps the pair members with no data movement.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "nikki/kernels/attention/rope_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* rope_doc = R"(Rotary position embeddings (Hugging Face apply_rotary_pos_emb), applied to q or k.

Dimensions: x [B, H, S, D], cos [S, r] or [B, S, r] (or [1, S, r]), sin like cos -> out [B, H, S, D];
            r even, r <= D: the first r dims of each head rotate, the other D - r pass through
            (partial rotary). Any B, H, S.
Args:       x: q or k, float32 / bfloat16 / float16.
            cos, sin: the rotary tables as the model's rotary embedding returns them (one row per
              position; per sequence when 3-D), of one float dtype.
            interleaved: rotate pairs (2i, 2i + 1) (GPT-J / rotate-every-two layout) instead of
              the two halves (i, i + r/2) (rotate_half).
Returns:    out in x's dtype.
Notes:      cos and sin are used as given, so any table works (duplicated halves as Hugging Face
            builds them, scaled frequencies, ...). When cos has x's dtype the products are rounded
            to that dtype before their sum, as torch computes the formula in that dtype; otherwise
            they are float32. One pass over x; cos and sin are read once per block of up to 4096
            positions and reused by every head.
Pseudocode: rotate(v) = cat(-v[r/2:], v[:r/2])          (interleaved: (v0, v1) -> (-v1, v0))
            out[..., :r] = x[..., :r] * cos + rotate(x[..., :r]) * sin
            out[..., r:] = x[..., r:])";

inline constexpr const char* rope_bwd_doc = R"(Backward of rope: the gradient with respect to x.

Dimensions: cos [S, r] or [B, S, r] (or [1, S, r]), sin like cos, grad_out [B, H, S, D]
            -> grad_x [B, H, S, D].
Args:       cos, sin: the forward's tables; grad_out: the gradient of the loss with respect to out.
            interleaved: the forward's layout.
Returns:    grad_x in grad_out's dtype. cos and sin get no gradient (they are tables of the
            positions, not parameters).
Notes:      rope is a rotation of each pair, so its gradient is the transposed rotation: the
            forward's kernel with the opposite sine, rotate^T = -rotate.
Pseudocode: grad_x[..., :r] = grad_out[..., :r] * cos - rotate(grad_out[..., :r] * sin)
            grad_x[..., r:] = grad_out[..., r:])";

namespace attention {

/** @brief Member `j` (0 or 1) of every rotated pair of a tile [p, g, >= r], as [p, g, r / 2]. */
inline Tensor pair_member(const Tensor& t, int64_t r, bool interleaved, int64_t j) {
  const Tensor rot = t(nl::all, nl::all, nl::ds(0, r));
  return interleaved ? rot.reshape_dim(2, {r / 2, 2}).select(3, j) : rot.reshape_dim(2, {2, r / 2}).select(2, j);
}

/** The maths of one tile, an instruction group per call (each a task of the schedule). */
struct RopeMath {
  int64_t r;
  bool interleaved, backward;

  /** T: each rotated dim's multiplier of its partner, from sin (Scalar engine, once per block). */
  void partner_sine(const Tensor& T, const Tensor& sin) const {
    auto member = [&](const Tensor& t, int64_t j) { return pair_member(t, r, interleaved, j); };
    // forward: out0 = x0 c0 - x1 s0, out1 = x1 c1 + x0 s1; backward: grad0 = g0 c0 + g1 s1,
    // grad1 = g1 c1 - g0 s0. m = x * T supplies the partner terms: m1 goes to member 0, m0 to 1.
    isa::activation(member(T, 0), nl::copy, member(sin, backward ? 0 : 1), {.scale = backward ? -1.0 : 1.0});
    isa::activation(member(T, 1), nl::copy, member(sin, backward ? 1 : 0), {.scale = backward ? 1.0 : -1.0});
  }
  /** a = x * cos and m = x * T over the rotated dims, on `engine`. */
  void products(const Tensor& dst, const Tensor& x, const Tensor& table, Engine engine) const {
    isa::tensor_tensor(dst, x(nl::all, nl::all, nl::ds(0, r)), table, nl::multiply, engine);
  }
  /** x[member j] = a[member j] + m[member 1 - j], in place in the loaded tile. */
  void combine(const Tensor& x, const Tensor& a, const Tensor& m, int64_t j, Engine engine) const {
    isa::tensor_tensor(pair_member(x, r, interleaved, j), pair_member(a, r, interleaved, j),
                       pair_member(m, r, interleaved, 1 - j), nl::add, engine);
  }
};

/**
 * @brief Checks rotary tables for heads of `D` dims at S positions of B sequences (`against`
 * names what they must match in the errors, e.g. "x [1, 2, 8, 16]"); returns r (the rotated dims).
 */
inline int64_t check_rope_tables(const ArgumentCheck& check, const Tensor& cos, const Tensor& sin, int64_t B, int64_t S,
                                 int64_t D, const std::string& against) {
  auto is_float = [](DType t) { return t == DType::float32 || t == DType::bfloat16 || t == DType::float16; };
  check.require(cos.ndim() == 2 || cos.ndim() == 3,
                "cos must be [S, r] or [B, S, r], got " + cos.shape().str(),
                "pass the rotary embedding's cos (one row per position)");
  const int64_t r = cos.shape()[size_t(cos.ndim() - 1)];
  const bool shapes_ok = cos.shape()[size_t(cos.ndim() - 2)] == S &&
                         (cos.ndim() == 2 || cos.shape()[0] == B || cos.shape()[0] == 1);
  check.require(shapes_ok,
                "cos " + cos.shape().str() + " does not match " + against +
                    ": it must be [S, r], [B, S, r] or [1, S, r] with S = " + std::to_string(S) + " and B = " +
                    std::to_string(B),
                "slice the tables to the positions of x");
  check.require(sin.shape() == cos.shape(), "sin " + sin.shape().str() + " must have cos's shape " + cos.shape().str());
  check.require(r % 2 == 0 && r <= D,
                "the rotary dim r = " + std::to_string(r) + " (cos's last dim) must be even and at most head_dim " +
                    std::to_string(D),
                "partial rotary rotates the first r dims of each head");
  check.require(is_float(cos.dtype()) && sin.dtype() == cos.dtype(),
                "cos and sin must have one float dtype, got " + std::string(dtype_name(cos.dtype())) + " and " +
                    std::string(dtype_name(sin.dtype())));
  return r;
}

/** @brief Checks the rope kernels' arguments; returns r (the rotated dims). */
inline int64_t check_rope(const ArgumentCheck& check, const Tensor& x, const Tensor& cos, const Tensor& sin,
                          const std::string& x_name) {
  check.require(x.ndim() == 4, x_name + " must be 4-D [batch, heads, seq, head_dim], got " + x.shape().str(),
                "apply the kernel to q or k in the [B, H, S, D] layout");
  auto is_float = [](DType t) { return t == DType::float32 || t == DType::bfloat16 || t == DType::float16; };
  check.require(is_float(x.dtype()), x_name + " must be float32, bfloat16 or float16, got " +
                                         std::string(dtype_name(x.dtype())));
  return check_rope_tables(check, cos, sin, x.shape()[0], x.shape()[2], x.shape()[3], x_name + " " + x.shape().str());
}

/**
 * @brief rope (backward = false) or its backward of x [B, H, S, D] (the incoming gradient for the
 * backward) into `out`, an HBM view of x's shape and dtype: a new tensor, or the heads of a wider
 * one (the fused q/k/v projection's rows, viewed as [B, H, S, D]). The arguments are checked.
 */
inline void rope_into(const ArgumentCheck& check, const Tensor& out, const Tensor& x, const Tensor& cos,
                      const Tensor& sin, bool interleaved, bool backward) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const int64_t r = check_rope(check, x, cos, sin, backward ? "grad_out" : "x");
  internal_check(out.shape() == x.shape() && out.dtype() == x.dtype(), "rope_into: out must match x");
  const int64_t S = x.shape()[2], D = x.shape()[3];
  const int64_t P = nl::tile_size().pmax;
  const bool per_batch = cos.ndim() == 3 && cos.shape()[0] > 1;
  // Tables shared by the batch: every sequence of every batch is alike, so the kernel sees
  // [1, B * H, S, D] and short sequences (decode) pack across the batch as well as the heads
  // (when both views merge the batch into the heads; a strided out keeps its batches apart).
  const bool merged = !per_batch && x.is_contiguous() && out.is_contiguous();
  const int64_t B = merged ? 1 : x.shape()[0], H = x.shape()[1] * (merged ? x.shape()[0] : 1);
  const DType dt = x.dtype(), table_dt = cos.dtype();
  // Products in x's dtype when the tables have it (torch's roundings of the formula), else fp32.
  const DType cd = table_dt == dt ? dt : DType::float32;
  const int64_t es = dtype_size(dt), ces = dtype_size(cd), tes = dtype_size(table_dt);
  const Tensor x_seqs = merged ? x.reshape({B, H, S, D}) : x, out_seqs = merged ? out.reshape({B, H, S, D}) : out;

  // x tiles four deep (load, two computing, store); the products two deep; the tables (cos, sin,
  // T) two deep, so the next block's tables load while the current block finishes.
  constexpr int64_t kX = 4, kProducts = 2, kTables = 2;
  toolkit::Budget budget(check);
  auto per_row = [&](int64_t g) { return g * (kX * D * es + 2 * kProducts * r * ces + kTables * r * (2 * tes + ces)); };
  // Short sequences pack several heads onto the partitions; long ones take g consecutive
  // positions per partition, up to 8 KiB of x per partition (long DMA runs, few instructions).
  const int64_t heads_per_tile = S < P ? std::min(H, P / S) : 1;
  int64_t g = 1;
  if (S >= P)
    for (int64_t cand : {64, 32, 16, 8, 4, 2, 1})
      if (cand * D * es <= 8192 && cand <= S / P && budget.fits(per_row(cand))) {
        g = cand;
        break;
      }
  if (!budget.fits(per_row(g)))
    check.fail("a head of " + std::to_string(D) + " dims does not fit in SBUF", "SBUF per partition",
               "use a smaller head_dim");
  const std::vector<toolkit::RowTile> tiles =
      S < P ? std::vector<toolkit::RowTile>{{0, heads_per_tile * S, 1}} : toolkit::row_tiles(S, P, g);
  toolkit::Ring x_ring = budget.sbuf_ring({P, g, D}, dt, kX, backward ? "grad_out_tile" : "x_tile");
  toolkit::Ring a_ring = budget.sbuf_ring({P, g, r}, cd, kProducts, "x_cos");
  toolkit::Ring m_ring = budget.sbuf_ring({P, g, r}, cd, kProducts, "x_partner_sin");
  toolkit::Ring cos_ring = budget.sbuf_ring({P, g, r}, table_dt, kTables, "cos");
  toolkit::Ring sin_ring = budget.sbuf_ring({P, g, r}, table_dt, kTables, "sin");
  toolkit::Ring t_ring = budget.sbuf_ring({P, g, r}, cd, kTables, "partner_sin");

  const RopeMath math{r, interleaved, backward};
  const auto all = nl::all;
  // HBM rows of a tile: positions [r0, r0 + p * g) of head h (g per partition), or the whole
  // sequences of heads h0 .. h0 + heads - 1 (one position per partition).
  // (A strided view's heads do not merge with its positions: it keeps them as [heads, S, 1, D],
  // the same elements in the same order.)
  auto rows = [&](const Tensor& t, int64_t b, int64_t h0, int64_t heads, const toolkit::RowTile& rt) {
    if (heads_per_tile > 1) {
      const Tensor seqs = t(b, nl::ds(h0, heads), all, all);
      return seqs.is_contiguous() ? seqs.reshape({heads * S, 1, D}) : seqs.expand_dim(2);
    }
    return t(b, h0, nl::ds(rt.r0, rt.p * rt.g), all).reshape_dim(0, {rt.p, rt.g});
  };
  auto table_rows = [&](const Tensor& table, int64_t b) {
    return cos.ndim() == 2 ? table : table(per_batch ? b : 0, all, all);
  };

  toolkit::TaskScheduler sch;
  const Engine vector = Engine::vector, gpsimd = Engine::gpsimd;
  for (const toolkit::RowTile& rt : tiles) {
    Tensor c_tile, T_tile;
    for (int64_t b = 0; b < B; ++b) {
      if (b == 0 || per_batch) {
        // The block's tables: [p, g, r] (for packed heads, the sequence's rows once per head).
        const Tensor ct = cos_ring.next()(first(rt.p), nl::ds(0, rt.g), all);
        const Tensor st = sin_ring.next()(first(rt.p), nl::ds(0, rt.g), all);
        T_tile = t_ring.next()(first(rt.p), nl::ds(0, rt.g), all);
        c_tile = ct;
        for (const std::pair<Tensor, Tensor>& tile_table : {std::pair{ct, cos}, std::pair{st, sin}}) {
          const Tensor& tile = tile_table.first;
          const Tensor src = table_rows(tile_table.second, b);
          if (heads_per_tile > 1 && S == 1) {  // decode: one row for every partition, one DMA
            sch.add([&] { isa::dma_copy(tile, src.broadcast(0, heads_per_tile).expand_dim(1)); });
          } else if (heads_per_tile > 1) {
            for (int64_t j = 0; j < heads_per_tile; ++j)
              sch.add([&] { isa::dma_copy(tile(nl::ds(j * S, S), all, all), src.reshape({S, 1, r})); });
          } else {
            sch.add([&] { isa::dma_copy(tile, src(nl::ds(rt.r0, rt.p * rt.g), all).reshape_dim(0, {rt.p, rt.g})); });
          }
        }
        sch.add([&] { math.partner_sine(T_tile, st); });
      }
      for (int64_t h0 = 0; h0 < H; h0 += heads_per_tile) {
        const int64_t heads = std::min(heads_per_tile, H - h0);
        const int64_t p = heads_per_tile > 1 ? heads * S : rt.p;
        const Tensor xt = x_ring.next()(first(p), nl::ds(0, rt.g), all);
        const Tensor a = a_ring.next()(first(p), nl::ds(0, rt.g), all);
        const Tensor m = m_ring.next()(first(p), nl::ds(0, rt.g), all);
        const Tensor ct = c_tile(first(p), all, all), tt = T_tile(first(p), all, all);
        sch.add([&] { isa::dma_copy(xt, rows(x_seqs, b, h0, heads, rt)); });
        sch.add_any({[&] { math.products(a, xt, ct, vector); }, [&] { math.products(a, xt, ct, gpsimd); }});
        sch.add_any({[&] { math.products(m, xt, tt, vector); }, [&] { math.products(m, xt, tt, gpsimd); }});
        for (int64_t j : {0, 1})
          sch.add_any({[&] { math.combine(xt, a, m, j, vector); }, [&] { math.combine(xt, a, m, j, gpsimd); }});
        sch.add([&] { isa::dma_copy(rows(out_seqs, b, h0, heads, rt), xt); });
      }
    }
  }
  sch.run();
}

/** @brief rope (backward = false) or its backward of x into a new output. */
inline Tensor rope_apply(const ArgumentCheck& check, const Tensor& x, const Tensor& cos, const Tensor& sin,
                         bool interleaved, bool backward) {
  Tensor out = nl::ndarray(x.shape(), x.dtype(), nl::shared_hbm, backward ? "grad_x" : "out");
  rope_into(check, out, x, cos, sin, interleaved, backward);
  return out;
}

/** @brief Fills in[table_at] and in[table_at + 1] (cos and sin, [S, r] or [B, S, r]) with real
 *  rotary angles: positions from a random offset (each sequence of a 3-D table at others),
 *  frequencies 10000^(-2i/r), duplicated per pair as the model builds them. */
inline void fill_rotary_tables(std::vector<RefTensor>& in, const ExampleCase& c, CaseRng& rng, bool interleaved,
                               size_t table_at) {
  const Shape& ts = c.inputs[table_at].shape;
  const int64_t r = ts[ts.rank() - 1], S = ts[ts.rank() - 2], rows = ts.num_elements() / r;
  const double offset = double(rng.uniform(0, 2000));
  for (int64_t row = 0; row < rows; ++row) {
    const double pos = offset + double(row % S) + double(row / S) * 7;  // sequences at other positions
    for (int64_t i = 0; i < r; ++i) {
      const int64_t f = interleaved ? i / 2 : i % (r / 2);
      const double angle = pos * std::pow(10000.0, -2.0 * double(f) / double(r));
      in[table_at][row * r + i] = round_to(c.inputs[table_at].dtype, std::cos(angle));
      in[table_at + 1][row * r + i] = round_to(c.inputs[table_at + 1].dtype, std::sin(angle));
    }
  }
}

/** @brief rope's test inputs: x normal, cos and sin of real rotary angles (fill_rotary_tables). */
inline std::vector<RefTensor> rope_inputs(const ExampleCase& c, CaseRng& rng, bool interleaved, size_t table_at) {
  std::vector<RefTensor> in;
  for (const TensorSpec& s : c.inputs) in.push_back(random_input(s, rng));
  fill_rotary_tables(in, c, rng, interleaved, table_at);
  return in;
}

/** @brief A rope case: x (or grad_out) [B, H, S, D] and tables [S, r] or [B, S, r]. */
inline ExampleCase rope_case(bool backward, int64_t B, int64_t H, int64_t S, int64_t D, int64_t r, DType x_dtype,
                             DType table_dtype, bool per_batch, bool interleaved, std::string label) {
  const Shape table = per_batch ? Shape{B, S, r} : Shape{S, r};
  std::vector<TensorSpec> in{spec(table, table_dtype), spec(table, table_dtype)};
  if (backward) in.push_back(spec({B, H, S, D}, x_dtype));
  else in.insert(in.begin(), spec({B, H, S, D}, x_dtype));
  return ExampleCase{std::move(in), Params{{"interleaved", interleaved ? 1.0 : 0.0}}, std::move(label)};
}

inline std::vector<ExampleCase> rope_examples(bool backward) {
  const DType f32 = DType::float32, bf16 = DType::bfloat16, f16 = DType::float16;
  return {rope_case(backward, 1, 2, 200, 64, 64, f32, f32, false, false, "half-split, position tail"),
          rope_case(backward, 2, 3, 130, 64, 32, bf16, bf16, false, true, "interleaved, partial rotary"),
          rope_case(backward, 2, 4, 1, 128, 128, bf16, bf16, true, false, "one token per sequence (decode), heads packed"),
          rope_case(backward, 2, 5, 30, 80, 40, f16, f32, true, true, "per-sequence tables, heads packed with a tail"),
          rope_case(backward, 1, 2, 600, 96, 64, bf16, bf16, false, false, "several positions per partition, tail"),
          rope_case(backward, 2, 5, 30, 64, 64, bf16, bf16, false, false, "shared tables: short sequences packed across the batch")};
}

inline ExampleCase draw_rope(CaseRng& rng, bool backward) {
  const int64_t D = rng.pick<int64_t>({16, 32, 64, 80, 96, 128, 128});
  const int64_t r = rng.coin(0.6) ? D : 2 * rng.uniform(1, D / 2);
  const DType x = rng.pick({DType::float32, DType::bfloat16, DType::float16});
  const DType t = rng.coin(0.75) ? x : DType::float32;
  return rope_case(backward, rng.uniform(1, 2), rng.uniform(1, 5), rng.size(1, 700), D, r, x, t, rng.coin(0.3),
                   rng.coin(), "drawn");
}

}  // namespace attention

/** @brief out = rope(x, cos, sin); see rope_doc. */
inline Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, bool interleaved = false,
                   Loc loc = Loc::current()) {
  return attention::rope_apply(ArgumentCheck("rope", x, loc), x, cos, sin, interleaved, false);
}

/** @brief grad_x of rope; see rope_bwd_doc. */
inline Tensor rope_bwd(const Tensor& cos, const Tensor& sin, const Tensor& grad_out, bool interleaved = false,
                       Loc loc = Loc::current()) {
  return attention::rope_apply(ArgumentCheck("rope_bwd", grad_out, loc), grad_out, cos, sin, interleaved, true);
}

inline KernelInfo rope_info() {
  return KernelInfo{
      .name = "rope",
      .summary = "rotary position embeddings (half-split or interleaved, partial rotary) on q or k",
      .doc = rope_doc,
      .inputs = {"x", "cos", "sin"},
      .outputs = {"out"},
      .params = {{"interleaved", ParamKind::boolean, 0, "rotate pairs (2i, 2i + 1) instead of the two halves"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "rope_bwd",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{rope(c.inputs[0], c.inputs[1], c.inputs[2], c.flag("interleaved"))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::rope(in[0], in[1], in[2], p.flag("interleaved"), false)};
          },
      .make_inputs =
          [](const ExampleCase& c, CaseRng& r) {
            return attention::rope_inputs(c, r, c.params.find("interleaved").value_or(0) != 0, 1);
          },
      .examples = attention::rope_examples(false),
      .draw = [](CaseRng& r) { return attention::draw_rope(r, false); },
      .tolerance = {},
      .benchmark = Benchmark{attention::rope_case(false, 1, 32, 4096, 128, 128, DType::bfloat16, DType::bfloat16,
                                                  false, false, "q [1, 32, 4096, 128] bf16, half-split"),
                             Bound::hbm, {}, 0.70},
  };
}

inline KernelInfo rope_bwd_info() {
  return KernelInfo{
      .name = "rope_bwd",
      .summary = "gradient of rotary position embeddings with respect to x",
      .doc = rope_bwd_doc,
      .inputs = {"cos", "sin", "grad_out"},
      .outputs = {"grad_x"},
      .params = {{"interleaved", ParamKind::boolean, 0, "the forward's layout"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{rope_bwd(c.inputs[0], c.inputs[1], c.inputs[2], c.flag("interleaved"))};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::rope(in[2], in[0], in[1], p.flag("interleaved"), true)};
          },
      .make_inputs =
          [](const ExampleCase& c, CaseRng& r) {
            return attention::rope_inputs(c, r, c.params.find("interleaved").value_or(0) != 0, 0);
          },
      .examples = attention::rope_examples(true),
      .draw = [](CaseRng& r) { return attention::draw_rope(r, true); },
      .tolerance = {},
      .benchmark = Benchmark{attention::rope_case(true, 1, 32, 4096, 128, 128, DType::bfloat16, DType::bfloat16,
                                                  false, false, "grad [1, 32, 4096, 128] bf16, half-split"),
                             Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
