// Row softmax and its backward, for rows of any length.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nikki/kernels/argument_check.hpp"
#include "nikki/kernels/library.hpp"

namespace nikki::kernels {

namespace softmax_detail {

/**
 * Rows of one SBUF tile: partition q holds rows r0 + q * g ... r0 + q * g + g - 1. Packing g > 1
 * short rows per partition keeps DMA runs long and amortizes per-instruction costs.
 */
struct RowTile {
  int64_t r0 = 0, p = 0, g = 1;
  /** The tile's rows of an [R, C] HBM tensor as [p, g, C] (each partition reads one contiguous run). */
  Tensor view(const Tensor& t, int64_t c0, int64_t cw) const {
    return t(nl::ds(r0, p * g), nl::ds(c0, cw)).reshape_dim(0, {p, g});
  }
};

/** Splits R rows into full tiles of `g` rows per partition, then the tail with fewer. */
inline std::vector<RowTile> row_tiles(int64_t R, int64_t P, int64_t g) {
  std::vector<RowTile> tiles;
  int64_t r = 0;
  for (; R - r >= P * g; r += P * g) tiles.push_back({r, P, g});
  if (const int64_t g2 = (R - r) / P; g2 > 0) {
    tiles.push_back({r, P, g2});
    r += P * g2;
  }
  if (r < R) tiles.push_back({r, R - r, 1});
  return tiles;
}

/**
 * Rows shorter than this take whole-tile instructions with per-row values broadcast along the
 * row; longer ones one instruction per packed row with [p, 1] operands, which costs less per
 * element but a fixed cost per instruction.
 */
inline constexpr int64_t kNarrowRow = 32;

/**
 * Rows per partition for rows of C columns: up to ~4K elements per partition per tile (long DMA
 * runs, few instructions) but no more than `fit`, and enough tiles for the pipeline to overlap
 * when R allows (fewer for narrow rows, whose per-tile cost is mostly fixed).
 */
inline int64_t rows_per_partition(int64_t R, int64_t C, int64_t P, int64_t fit, bool narrow) {
  return std::max<int64_t>(1, std::min({4096 / C, fit, R / ((narrow ? 2 : 8) * P)}));
}

/** One unit of work in three stages: load, compute, finish (compute that ends in the store). */
struct Unit {
  std::function<void()> load, compute, finish;
};

/**
 * Software pipelining in program order: unit i's load is issued `ahead` units before its compute
 * and its finish one unit after its compute. In-order engines then overlap: the next tile's
 * loads and first engine pass run while this tile's last pass and store do, and a tile's
 * buffers stay live together, so the allocator places in-flight tiles apart.
 */
inline void emit_pipelined(const std::vector<Unit>& units, int64_t ahead) {
  const int64_t n = static_cast<int64_t>(units.size());
  for (int64_t i = -(ahead + 1); i < n; ++i) {
    if (const int64_t l = i + ahead + 1; l >= 0 && l < n && units[l].load) units[l].load();
    if (const int64_t c = i + 1; c >= 0 && c < n && units[c].compute) units[c].compute();
    if (i >= 0 && units[i].finish) units[i].finish();
  }
}

/**
 * Columns per chunk when a row does not fit SBUF: balanced chunks of at most `max_cols`. Callers
 * keep the chunks in flight to about half of SBUF (4K columns already make ~1 MiB DMAs): a fuller
 * SBUF fragments between the differently sized chunk tiles.
 */
inline int64_t chunk_width(int64_t C, int64_t max_cols) {
  const int64_t chunks = ceil_div(C, max_cols);
  const int64_t w = ceil_div(C, chunks);
  return std::min(C, (w + 63) / 64 * 64);  // even widths keep VectorE's 16-bit fast paths
}

inline void check_2d(const ArgumentCheck& check, const Tensor& t) {
  check.require(t.ndim() == 2 && is_float(t.dtype()),
                "expected a 2-D float tensor, got " + std::string(dtype_name(t.dtype())) + t.shape().str(),
                "reshape to [rows, columns]");
}

}  // namespace softmax_detail

inline constexpr const char* softmax_doc = R"(Softmax over the last axis of a 2-D tensor, for rows of any length.

Dimensions: x [R, C] -> out [R, C]; any R, C >= 1.
Args:       x: HBM tensor, float32 / bfloat16 / float16.
Returns:    out, x's dtype.
Notes:      Rows that fit SBUF are read once: 128 partitions per tile, and several short rows per
            partition when C is small, so DMA runs stay long. The max comes from one VectorE
            reduction (negated: it is the exp's bias), exp and the row sum from one ScalarE
            activation (its add-reduction), the normalization from one VectorE multiply by the
            reciprocal of the sum; rows under 32 columns use whole-tile instructions with the
            per-row values broadcast instead. Tiles are software-pipelined: the next tile loads
            and exponentiates while this one is normalized and stored. Longer rows are processed
            in column chunks in two passes: the first keeps each chunk's max m_j and sum s_j of
            exp(x - m_j), combined as sum = sum_j s_j * exp(m_j - m); the second recomputes
            exp(x - m) / sum chunk by chunk (1.5x the compulsory HBM traffic). fp32 computation,
            one rounding on the store.
Pseudocode: m = max(x, axis=1); e = exp(x - m); out = e / sum(e, axis=1))";

/** @brief out = softmax(x) over rows; see softmax_doc. */
inline Tensor softmax(const Tensor& x, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using namespace softmax_detail;
  check_2d(ArgumentCheck("softmax", x, loc), x);
  const int64_t R = x.shape()[0], C = x.shape()[1];
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax;
  const DType dt = x.dtype();
  const int64_t esize = dtype_size(dt);
  // The max of 16-bit values is exact in their dtype, which also takes VectorE's fast reduction.
  const DType stat = esize == 2 ? dt : nl::float32;
  Tensor out = nl::ndarray({R, C}, dt, nl::shared_hbm, "out");

  const int64_t budget = ts.sbuf_fmax_bytes * 3 / 4;
  // Live per row element with `ahead` tiles loading while one computes: ahead + 2 input tiles
  // (the result overwrites its input) and two fp32 exp tiles.
  auto footprint = [&](int64_t cols, int64_t ahead) { return cols * ((ahead + 2) * esize + 2 * 4); };
  int64_t ahead = footprint(C, 2) <= budget ? 2 : 1;
  std::vector<Unit> units;

  if (footprint(C, ahead) <= budget) {
    const bool narrow = C < kNarrowRow;
    const int64_t g = rows_per_partition(R, C, P, budget / footprint(C, ahead), narrow);
    for (const RowTile& rt : row_tiles(R, P, g)) {
      struct State {
        Tensor x, nmax, e, sum;
      };
      auto s = std::make_shared<State>();
      const int64_t p = rt.p, gg = rt.g;
      // Per packed row: the row's max and sum as [p, 1] operands of one instruction per row; for
      // narrow rows, whole-tile instructions with the per-row values broadcast along the row.
      auto per_row = [=](const Tensor& t) { return t.expand_dim(2).broadcast(2, C); };
      units.push_back(Unit{
          [=, &x] {
            s->x = nl::ndarray({p, gg, C}, dt, nl::sbuf, "x_tile");
            isa::dma_copy(s->x, rt.view(x, 0, C));
          },
          [=] {
            s->nmax = nl::ndarray({p, gg}, stat, nl::sbuf, "neg_max");
            isa::tensor_reduce(s->nmax, nl::maximum, s->x, {2}, /*negate=*/true);
            s->e = nl::ndarray({p, gg, C}, nl::float32, nl::sbuf, "exp");
            s->sum = nl::ndarray({p, gg}, nl::float32, nl::sbuf, "row_sum");
            if (narrow) {
              isa::tensor_tensor(s->e, s->x, per_row(s->nmax), nl::add);
              isa::activation(s->e, nl::exp, s->e);
              isa::tensor_reduce(s->sum, nl::add, s->e, {2});
            } else {
              for (int64_t i = 0; i < gg; ++i)
                isa::activation_reduce(s->e(nl::all, i, nl::all), nl::exp, s->x(nl::all, i, nl::all), nl::add,
                                       s->sum(nl::all, nl::ds(i, 1)), s->nmax(nl::all, nl::ds(i, 1)));
            }
          },
          [=, &out] {
            isa::reciprocal(s->sum, s->sum);
            if (narrow) {
              isa::tensor_tensor(s->x, s->e, per_row(s->sum), nl::multiply);
            } else {
              for (int64_t i = 0; i < gg; ++i)
                isa::tensor_scalar(s->x(nl::all, i, nl::all), s->e(nl::all, i, nl::all), nl::multiply,
                                   s->sum(nl::all, nl::ds(i, 1)));
            }
            isa::dma_copy(rt.view(out, 0, C), s->x);
          }});
    }
  } else {
    // Long rows: column chunks, two passes per row tile.
    ahead = 2;
    const int64_t cw = chunk_width(C, std::clamp<int64_t>(budget / 2 / footprint(1, ahead) / 64 * 64, 64, 4096));
    const int64_t J = ceil_div(C, cw);
    for (const RowTile& rt : row_tiles(R, P, 1)) {
      struct Stats {
        Tensor nmax, sums, nM, total;  // per chunk: -max and sum of exp(x - max); -max and 1 / sum
      };
      auto st = std::make_shared<Stats>();
      const int64_t p = rt.p;
      for (int64_t pass = 0; pass < 2; ++pass)
        for (int64_t j = 0; j < J; ++j) {
          const int64_t c0 = j * cw, w = std::min(cw, C - c0);
          struct Chunk {
            Tensor x, e;
          };
          auto ch = std::make_shared<Chunk>();
          Unit u;
          u.load = [=, &x] {
            ch->x = nl::ndarray({p, 1, w}, dt, nl::sbuf, "x_chunk");
            isa::dma_copy(ch->x, rt.view(x, c0, w));
          };
          if (pass == 0) {
            u.compute = [=] {
              if (j == 0) {
                st->nmax = nl::ndarray({p, J}, stat, nl::sbuf, "chunk_neg_max");
                st->sums = nl::ndarray({p, J}, nl::float32, nl::sbuf, "chunk_sum");
              }
              isa::tensor_reduce(st->nmax(nl::all, nl::ds(j, 1)), nl::maximum, ch->x(nl::all, 0, nl::all), {1}, /*negate=*/true);
              ch->e = nl::ndarray({p, w}, nl::float32, nl::sbuf, "exp_chunk");
              isa::activation_reduce(ch->e, nl::exp, ch->x(nl::all, 0, nl::all), nl::add,
                                     st->sums(nl::all, nl::ds(j, 1)), st->nmax(nl::all, nl::ds(j, 1)));
            };
          } else {
            u.compute = [=] {
              if (j == 0) {
                // -m = min_j(-m_j); sum = sum_j s_j * exp(m_j - m).
                st->nM = nl::ndarray({p, 1}, stat, nl::sbuf, "neg_max");
                isa::tensor_reduce(st->nM, nl::minimum, st->nmax, {1});
                Tensor scale = nl::ndarray({p, J}, nl::float32, nl::sbuf, "chunk_scale");
                isa::activation(scale, nl::exp, st->nmax, {.bias = st->nM, .scale = -1.0});
                isa::tensor_tensor(scale, scale, st->sums, nl::multiply);
                st->total = nl::ndarray({p, 1}, nl::float32, nl::sbuf, "row_sum");
                isa::tensor_reduce(st->total, nl::add, scale, {1});
                isa::reciprocal(st->total, st->total);
              }
              ch->e = nl::ndarray({p, w}, nl::float32, nl::sbuf, "exp_chunk");
              isa::activation(ch->e, nl::exp, ch->x(nl::all, 0, nl::all), {.bias = st->nM});
            };
            u.finish = [=, &out] {
              isa::tensor_scalar(ch->x(nl::all, 0, nl::all), ch->e, nl::multiply, st->total);
              isa::dma_copy(rt.view(out, c0, w), ch->x);
            };
          }
          units.push_back(std::move(u));
        }
    }
  }
  emit_pipelined(units, ahead);
  return out;
}

inline constexpr const char* softmax_bwd_doc = R"(Backward of softmax over the last axis, for rows of any length.

Dimensions: out [R, C], grad_out [R, C] -> grad_x [R, C]; any R, C >= 1.
Args:       out: the forward's output; grad_out: the gradient of the loss with respect to out.
Returns:    grad_x, grad_out's dtype.
Notes:      The row dot product sum(grad_out * out) is an fp32 product on GpSimd (leaving
            VectorE to the final pass) summed by a ScalarE activation's add-reduction; grad_x is
            one VectorE scalar_tensor_tensor per row (rows under 32 columns: whole-tile
            instructions with the dot broadcast). Tiling, row packing and software pipelining as
            in softmax; rows that do not fit SBUF take two passes over column chunks (dot
            products, then grad_x). fp32 computation, one rounding on the store.
Pseudocode: grad_x = out * (grad_out - sum(grad_out * out, axis=1)))";

/** @brief grad_x = out * (grad_out - rowsum(grad_out * out)); see softmax_bwd_doc. */
inline Tensor softmax_bwd(const Tensor& out, const Tensor& grad_out, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using namespace softmax_detail;
  const ArgumentCheck check("softmax_bwd", out, loc);
  check_2d(check, out);
  check_2d(check, grad_out);
  check.require(out.shape() == grad_out.shape(),
                "out is " + out.shape().str() + " but grad_out is " + grad_out.shape().str(),
                "pass the forward's output and its gradient");
  const int64_t R = out.shape()[0], C = out.shape()[1];
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax;
  const DType yt = out.dtype(), gt = grad_out.dtype();
  Tensor grad_x = nl::ndarray({R, C}, gt, nl::shared_hbm, "grad_x");

  const int64_t budget = ts.sbuf_fmax_bytes * 3 / 4;
  // Live per row element: ahead + 2 tiles of out and of grad_out (grad_x overwrites grad_out)
  // and two fp32 product tiles.
  auto footprint = [&](int64_t cols, int64_t ahead) {
    return cols * ((ahead + 2) * (dtype_size(yt) + dtype_size(gt)) + 2 * 4);
  };
  int64_t ahead = footprint(C, 2) <= budget ? 2 : 1;
  std::vector<Unit> units;

  if (footprint(C, ahead) <= budget) {
    const bool narrow = C < kNarrowRow;
    const int64_t g = rows_per_partition(R, C, P, budget / footprint(C, ahead), narrow);
    for (const RowTile& rt : row_tiles(R, P, g)) {
      struct State {
        Tensor y, dy, prod, dot;
      };
      auto s = std::make_shared<State>();
      const int64_t p = rt.p, gg = rt.g;
      auto per_row = [=](const Tensor& t) { return t.expand_dim(2).broadcast(2, C); };
      units.push_back(Unit{
          [=, &out, &grad_out] {
            s->y = nl::ndarray({p, gg, C}, yt, nl::sbuf, "y_tile");
            s->dy = nl::ndarray({p, gg, C}, gt, nl::sbuf, "dy_tile");
            isa::dma_copy(s->y, rt.view(out, 0, C));
            isa::dma_copy(s->dy, rt.view(grad_out, 0, C));
          },
          [=] {
            // The product in fp32 on GpSimd, its row sums on ScalarE (in place, as a copy).
            s->prod = nl::ndarray({p, gg, C}, nl::float32, nl::sbuf, "y_dy");
            isa::tensor_tensor(s->prod, s->y, s->dy, nl::multiply, isa::gpsimd_engine);
            s->dot = nl::ndarray({p, gg}, nl::float32, nl::sbuf, "row_dot");
            if (narrow) {
              isa::tensor_reduce(s->dot, nl::add, s->prod, {2});
            } else {
              for (int64_t i = 0; i < gg; ++i)
                isa::activation_reduce(s->prod(nl::all, i, nl::all), nl::copy, s->prod(nl::all, i, nl::all), nl::add,
                                       s->dot(nl::all, nl::ds(i, 1)));
            }
          },
          [=, &grad_x] {
            if (narrow) {
              isa::tensor_tensor(s->prod, s->dy, per_row(s->dot), nl::subtract);
              isa::tensor_tensor(s->dy, s->prod, s->y, nl::multiply);
            } else {
              for (int64_t i = 0; i < gg; ++i)
                isa::scalar_tensor_tensor(s->dy(nl::all, i, nl::all), s->dy(nl::all, i, nl::all), nl::subtract,
                                          s->dot(nl::all, nl::ds(i, 1)), nl::multiply, s->y(nl::all, i, nl::all));
            }
            isa::dma_copy(rt.view(grad_x, 0, C), s->dy);
          }});
    }
  } else {
    ahead = 2;
    const int64_t cw = chunk_width(C, std::clamp<int64_t>(budget / 2 / footprint(1, ahead) / 64 * 64, 64, 4096));
    const int64_t J = ceil_div(C, cw);
    for (const RowTile& rt : row_tiles(R, P, 1)) {
      struct Stats {
        Tensor dots, dot;  // per chunk, and the row's
      };
      auto st = std::make_shared<Stats>();
      const int64_t p = rt.p;
      for (int64_t pass = 0; pass < 2; ++pass)
        for (int64_t j = 0; j < J; ++j) {
          const int64_t c0 = j * cw, w = std::min(cw, C - c0);
          struct Chunk {
            Tensor y, dy;
          };
          auto ch = std::make_shared<Chunk>();
          Unit u;
          u.load = [=, &out, &grad_out] {
            ch->y = nl::ndarray({p, 1, w}, yt, nl::sbuf, "y_chunk");
            ch->dy = nl::ndarray({p, 1, w}, gt, nl::sbuf, "dy_chunk");
            isa::dma_copy(ch->y, rt.view(out, c0, w));
            isa::dma_copy(ch->dy, rt.view(grad_out, c0, w));
          };
          if (pass == 0) {
            u.compute = [=] {
              if (j == 0) st->dots = nl::ndarray({p, J}, nl::float32, nl::sbuf, "chunk_dot");
              Tensor prod = nl::ndarray({p, w}, nl::float32, nl::sbuf, "y_dy");
              isa::tensor_tensor(prod, ch->y(nl::all, 0, nl::all), ch->dy(nl::all, 0, nl::all), nl::multiply,
                                 isa::gpsimd_engine);
              isa::activation_reduce(prod, nl::copy, prod, nl::add, st->dots(nl::all, nl::ds(j, 1)));
            };
          } else {
            u.compute = [=] {
              if (j == 0) {
                st->dot = nl::ndarray({p, 1}, nl::float32, nl::sbuf, "row_dot");
                isa::tensor_reduce(st->dot, nl::add, st->dots, {1});
              }
            };
            u.finish = [=, &grad_x] {
              isa::scalar_tensor_tensor(ch->dy(nl::all, 0, nl::all), ch->dy(nl::all, 0, nl::all), nl::subtract,
                                        st->dot, nl::multiply, ch->y(nl::all, 0, nl::all));
              isa::dma_copy(rt.view(grad_x, c0, w), ch->dy);
            };
          }
          units.push_back(std::move(u));
        }
    }
  }
  emit_pipelined(units, ahead);
  return grad_x;
}

inline KernelInfo softmax_info() {
  return KernelInfo{
      .name = "softmax",
      .summary = "softmax over the last axis of a 2-D tensor",
      .doc = softmax_doc,
      .inputs = {"x"},
      .outputs = {"out"},
      .params = {},
      .backward = "softmax_bwd",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{softmax(c.inputs[0])}; },
      .examples = {{{spec({1, 1}, DType::float32)}, {}, "tiny"},
                   {{spec({128, 512}, DType::float32)}, {}, "one tile"},
                   {{spec({300, 77}, DType::bfloat16)}, {}, "row and column tails"},
                   {{spec({1000, 24}, DType::float32)}, {}, "narrow rows packed per partition, tails"},
                   {{spec({2100, 40}, DType::bfloat16)}, {}, "short rows packed per partition"},
                   {{spec({9, 9000}, DType::float32)}, {}, "long rows: two passes over column chunks"},
                   {{spec({3, 20000}, DType::bfloat16)}, {}, "long rows, bf16"}},
  };
}

inline KernelInfo softmax_bwd_info() {
  return KernelInfo{
      .name = "softmax_bwd",
      .summary = "gradient of softmax over the last axis",
      .doc = softmax_bwd_doc,
      .inputs = {"out", "grad_out"},
      .outputs = {"grad_x"},
      .params = {},
      .backward = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{softmax_bwd(c.inputs[0], c.inputs[1])}; },
      .examples = {{{spec({1, 1}, DType::bfloat16), spec({1, 1}, DType::bfloat16)}, {}, "tiny"},
                   {{spec({200, 96}, DType::float32), spec({200, 96}, DType::float32)}, {}, "row tail"},
                   {{spec({1100, 10}, DType::bfloat16), spec({1100, 10}, DType::bfloat16)}, {}, "narrow rows packed"},
                   {{spec({2100, 33}, DType::float32), spec({2100, 33}, DType::float32)}, {}, "short rows packed, odd width"},
                   {{spec({4, 9000}, DType::float32), spec({4, 9000}, DType::float32)}, {}, "long rows: two passes"}},
  };
}

}  // namespace nikki::kernels
