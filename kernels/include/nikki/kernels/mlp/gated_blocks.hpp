// The gated MLP's schedule for one block of tokens, shared by the dense MLP (gated_mlp) and the
// mixture-of-experts kernels, whose blocks are one expert's gathered tokens: x^T and h^T of the
// block stay in SBUF while the weights stream past them in slabs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/mlp/gated_mlp_reference.hpp"
#include "nikki/kernels/mlp/transposed_rows.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/fp8.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels::mlp {

/** @brief The gate's activation on ScalarE for a GateActivation. */
inline nl::Op activation_op(reference::GateActivation act) {
  switch (act) {
    case reference::GateActivation::gelu: return nl::gelu;
    case reference::GateActivation::gelu_tanh: return nl::gelu_apprx_tanh;
    default: return nl::silu;
  }
}

/** @brief Rows [r0, r0 + rows) and columns [c0, c0 + cols) of a weight matrix in HBM: a static
 *  slice, or a view whose start is read at run time (an expert's matrix). */
using MatrixBlock = std::function<Tensor(int64_t r0, int64_t rows, int64_t c0, int64_t cols)>;

/** @brief Entries [c0, c0 + cols) of a per-column vector in HBM (an fp8 weight's dequantization
 *  scales): a static slice, or a view whose start is read at run time (an expert's row). */
using ColumnBlock = std::function<Tensor(int64_t c0, int64_t cols)>;

/** @brief The entries of a 1-D HBM tensor as static slices. */
inline ColumnBlock static_columns(const Tensor& v) {
  return [v](int64_t c0, int64_t cols) { return v(nl::ds(c0, cols)); };
}

/** @brief The entries of row `row` of a 2-D HBM tensor [E, C] (an expert's scales). */
inline ColumnBlock expert_columns(const Tensor& v, int64_t row) {
  return [v, row](int64_t c0, int64_t cols) { return v(row, nl::ds(c0, cols)); };
}

/** @brief The entries of the row read at run time from `row` (an int32 [1, 1] SBUF element) of a
 *  2-D HBM tensor [E, C]. */
inline ColumnBlock expert_columns(const Tensor& v, const Tensor& row) {
  return [v, row](int64_t c0, int64_t cols) {
    return v.ap({{1, cols}}, ApOptions{.offset = c0, .scalar_offset_tensor = row, .indirect_dim = 0});
  };
}

/** @brief The blocks of a 2-D HBM tensor as static slices. */
inline MatrixBlock static_blocks(const Tensor& m) {
  return [m](int64_t r0, int64_t rows, int64_t c0, int64_t cols) { return m(nl::ds(r0, rows), nl::ds(c0, cols)); };
}

/** @brief The blocks of expert `expert`'s matrix in stacked expert weights w [E, R, C]. */
inline MatrixBlock expert_blocks(const Tensor& w, int64_t expert) {
  const int64_t R = w.shape()[1], C = w.shape()[2];
  return [w, expert, R, C](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
    return w.ap({{C, rows}, {1, cols}}, ApOptions{.offset = (expert * R + r0) * C + c0});
  };
}

/** @brief The blocks of the expert whose index is read at run time from `expert` (an int32
 *  [1, 1] SBUF element) in stacked expert weights w [E, R, C]. */
inline MatrixBlock expert_blocks(const Tensor& w, const Tensor& expert) {
  const int64_t C = w.shape()[2];
  return [w, expert, C](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
    return w.ap({{C, rows}, {1, cols}},
                ApOptions{.offset = r0 * C + c0, .scalar_offset_tensor = expert, .indirect_dim = 0});
  };
}

/**
 * @brief The on-chip buffers and the schedule of the gated MLP over blocks of up to 512 tokens
 * (see gated_mlp_doc): x^T and h^T of a block resident, weight slabs of `width()` columns (as
 * many PSUM banks as leave the block's accumulators in four banks), fp32 accumulators in PSUM.
 */
class GatedBlocks {
 public:
  /** What a block reads and where its results go. Callbacks record tasks on the scheduler. */
  struct Io {
    /** Fills `rows` ([p, H], the block's tile `tile`) with the tokens' hidden states. */
    std::function<void(const Tensor& rows, size_t tile)> load_rows;
    MatrixBlock w_gate, w_up, w_down;  // [H, I], [H, I], [I, H]
    /** HBM biases [I], [I], [H], all or none; added as the accumulators leave PSUM. */
    std::optional<Tensor> b_gate, b_up, b_down;
    /** fp8 weights' float32 dequantization scales of the columns of w_gate, w_up ([I]) and
     *  w_down ([H]): set exactly when the blocks were planned for fp8 weights. The accumulators
     *  are scaled as they leave PSUM, before the bias. */
    std::optional<ColumnBlock> s_gate, s_up, s_down;
    /** Without biases: o = the down projection's accumulator `acc` of tile `tile` (output
     *  columns [c0, c0 + acc's width)), as it leaves PSUM. */
    std::function<void(const Tensor& o, const Tensor& acc, size_t tile, int64_t c0)> leave_psum;
    /** Stores `o` ([p, w]): tile `tile`'s output columns [c0, c0 + w). */
    std::function<void(const Tensor& o, size_t tile, int64_t c0)> store;
  };

  /**
   * Plans and reserves the buffers for blocks of the largest size in [min_block, max_block]
   * (multiples of 128) that fits in what `budget` has left; a KernelError at `check`'s call when
   * not even min_block fits. `dt` is the tokens' dtype; weights are of `weight_dt` (default dt):
   * an fp8 one streams its bytes as they are and needs Io's scales.
   */
  GatedBlocks(toolkit::Budget& budget, const ArgumentCheck& check, int64_t H, int64_t I, DType dt,
              reference::GateActivation act, int64_t max_block, int64_t min_block, bool biases,
              std::optional<DType> weight_dt = std::nullopt)
      : H_(H),
        I_(I),
        dt_(dt),
        wdt_(toolkit::tensor_engine_fp8_dtype(weight_dt.value_or(dt))),
        act_op_(activation_op(act)),
        biases_(biases),
        scales_(is_fp8(wdt_)) {
    const nl::TileSize ts = nl::tile_size();
    P_ = ts.pmax;
    bank_ = ts.psum_bank_fmax;
    const int64_t es = dtype_size(dt);
    nH_ = ceil_div(H, P_);
    nI_ = ceil_div(I, P_);
    const int64_t tpb = ts.psum_bank_fmax_bytes / (P_ * es);  // 128-wide transposes per PSUM bank
    auto footprint = [&](int64_t block) { return GatedBlocks::footprint(H, I, dt, block, biases, wdt_); };
    std::optional<int64_t> fit;
    for (int64_t block = max_block; block >= min_block && !fit; block -= P_)
      if (budget.fits(footprint(block))) fit = block;
    if (!fit)
      check.fail("x^T and h^T of " + std::to_string(min_block) + " tokens (H = " + std::to_string(H) +
                     ", I = " + std::to_string(I) + ", " + std::string(dtype_name(dt)) + ") do not fit in SBUF",
                 "a block of tokens keeps x^T [H, " + std::to_string(min_block) + "] and h^T [I, " +
                     std::to_string(min_block) + "] on chip: " + std::to_string(footprint(min_block) / 1024) +
                     " KiB per partition needed, " + std::to_string(budget.sbuf_capacity() / 1024) +
                     " KiB available",
                 "split I into parts and sum their outputs (the down projection is linear in h)");
    block_ = *fit;
    spans_ = spans_for(block_, P_);
    width_ = spans_ * bank_;
    xT_ = budget.sbuf({P_, nH_, block_}, dt, "x_T");
    hT_ = budget.sbuf({P_, nI_, block_}, dt, "h_T");
    slab_ring_ = budget.sbuf_ring({P_, width_}, wdt_, std::max<int64_t>(4, kSlabBanks / spans_), "weight_slab");
    row_ring_ = budget.sbuf_ring({P_, H}, dt, kRows, "x_rows");
    if (biases) bias_ring_ = budget.sbuf_ring({P_, width_}, dt, kBiases, "bias_rows");
    if (scales_) scale_ring_ = budget.sbuf_ring({P_, width_}, nl::float32, kScales, "scale_rows");
    gate_ring_ = budget.sbuf_ring({P_, bank_}, nl::float32, kGates, "gate");
    up_ring_ = budget.sbuf_ring({P_, bank_}, nl::float32, kUps, "up");
    h_ring_ = budget.sbuf_ring({P_, bank_}, dt, kWork, "h");
    o_ring_ = budget.sbuf_ring({P_, bank_}, dt, kWork, "out_tile");
    // PSUM (8 banks): six fp32 accumulators [128, 512] and two banks of transposes.
    acc_ring_ = budget.psum_ring({P_, bank_}, nl::float32, 6, "accumulator");
    tr_ring_ = budget.psum_ring({P_, tpb, P_}, dt, 2, "transposes");
  }

  /** @brief SBUF bytes per partition the buffers of blocks of `block` tokens take (weights of
   *  `weight_dt`, default dt). */
  static int64_t footprint(int64_t H, int64_t I, DType dt, int64_t block, bool biases,
                           std::optional<DType> weight_dt = std::nullopt) {
    const nl::TileSize ts = nl::tile_size();
    const DType wdt = weight_dt.value_or(dt);
    const int64_t P = ts.pmax, bank = ts.psum_bank_fmax, es = dtype_size(dt), ws = dtype_size(wdt);
    const int64_t spans = spans_for(block, P), slabs = std::max<int64_t>(4, kSlabBanks / spans);
    const int64_t scales = is_fp8(wdt) ? kScales * spans * bank * 4 : 0;
    return (ceil_div(H, P) + ceil_div(I, P)) * block * es + slabs * spans * bank * ws +
           (biases ? kBiases : 0) * spans * bank * es + scales + kRows * H * es + (kGates + kUps) * bank * 4 +
           2 * kWork * bank * es;
  }

  /** @brief Tokens per block. */
  int64_t block() const { return block_; }

  /** @brief Records one block: `tiles` are its row tiles (r0 relative to the block). */
  void run(toolkit::TaskScheduler& sch, const std::vector<toolkit::RowTile>& tiles, const Io& io) {
    using toolkit::first;
    const auto all = nl::all;
    const Engine vector = Engine::vector, gpsimd = Engine::gpsimd;
    const int64_t P = P_, bank = bank_, spans = spans_, CW = width_;
    check_scales(io);
    // Per-column vectors are broadcast to as many partitions as the block's largest tile has
    // tokens (each partition's copy is read from HBM: 8 rows, not 128, at decode).
    int64_t rows = 1;
    for (const toolkit::RowTile& t : tiles) rows = std::max(rows, t.p);
    auto bias_rows = [&](const Tensor& bias, int64_t c0, int64_t w) {
      const Tensor b = bias_ring_.next()(first(rows), nl::ds(0, w));
      sch.add([&] { isa::dma_copy(b, bias(nl::ds(c0, w)).expand_dim(0).broadcast(0, rows)); });
      return b;
    };
    auto scale_rows = [&](const std::optional<ColumnBlock>& scale, int64_t c0, int64_t w) -> std::optional<Tensor> {
      if (!scale) return std::nullopt;
      const Tensor s = scale_ring_.next()(first(rows), nl::ds(0, w));
      sch.add([&] { isa::dma_copy(s, (*scale)(c0, w).expand_dim(0).broadcast(0, rows)); });
      return s;
    };
    // The accumulator `acc` of columns [s * bank, + ws) of a slab, scaled (fp8 weights) into the
    // fp32 tile `into` and then plus the bias (into `into` or `out`), as it leaves PSUM. Returns
    // what holds the result so far: acc itself when there is neither.
    auto dequantize = [&](const Tensor& acc, const std::optional<Tensor>& scale, int64_t pt, int64_t s, int64_t ws,
                          const Tensor& into) {
      if (!scale) return acc;
      sch.add([&] { isa::tensor_tensor(into, acc, (*scale)(first(pt), nl::ds(s * bank, ws)), nl::multiply); });
      return into;
    };
    // x^T of the block: rows -> TensorE transposes (a bank at a time) -> x^T.
    for (size_t i = 0; i < tiles.size(); ++i) {
      const int64_t pt = tiles[i].p, t0 = tiles[i].r0;
      const Tensor rows = row_ring_.next()(first(pt), all);
      io.load_rows(rows, i);
      transpose_rows(sch, tr_ring_, xT_(all, all, nl::ds(t0, pt)), rows);
    }
    // accs[i * spans + s] = sum over k of stationary_T[k, tile i]^T @ weight[k, c0 + 512 s ...]:
    // the weight's rows stream in slabs of w columns, each read by every tile of the block.
    auto accumulate = [&](const MatrixBlock& weight, const Tensor& stationary_T, int64_t K, int64_t c0, int64_t w) {
      std::vector<Tensor> accs;
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s < spans; ++s) accs.push_back(acc_ring_.next());
      for (int64_t k = 0; k < ceil_div(K, P); ++k) {
        const int64_t pk = std::min(P, K - k * P);
        const Tensor slab = slab_ring_.next()(first(pk), nl::ds(0, w));
        sch.add([&] { isa::dma_copy(slab, weight(k * P, pk, c0, w)); });
        sch.add([&] {
          for (size_t i = 0; i < tiles.size(); ++i)
            for (int64_t s = 0; s * bank < w; ++s) {
              const int64_t ws = std::min(bank, w - s * bank);
              isa::nc_matmul(accs[i * spans + s](first(tiles[i].p), nl::ds(0, ws)),
                             stationary_T(first(pk), k, nl::ds(tiles[i].r0, tiles[i].p)),
                             slab(nl::all, nl::ds(s * bank, ws)), {.accumulate = k > 0});
            }
        });
      }
      return accs;
    };
    // Gate and up, a slab's columns of I at a time; h^T by TensorE transposes.
    for (int64_t c0 = 0; c0 < I_; c0 += CW) {
      const int64_t w = std::min(CW, I_ - c0);
      std::optional<Tensor> bg, bu;
      if (biases_) bg = bias_rows(*io.b_gate, c0, w), bu = bias_rows(*io.b_up, c0, w);
      const std::optional<Tensor> sg = scale_rows(io.s_gate, c0, w), su = scale_rows(io.s_up, c0, w);
      const std::vector<Tensor> g_acc = accumulate(io.w_gate, xT_, H_, c0, w);
      std::vector<Tensor> gates(g_acc.size());
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * bank < w; ++s) {
          const int64_t pt = tiles[i].p, ws = std::min(bank, w - s * bank);
          const Tensor g = gate_ring_.next()(first(pt), nl::ds(0, ws));
          const Tensor acc = dequantize(g_acc[i * spans + s](first(pt), nl::ds(0, ws)), sg, pt, s, ws, g);
          if (bg) {
            sch.add([&] { isa::tensor_tensor(g, acc, (*bg)(first(pt), nl::ds(s * bank, ws)), nl::add); });
            sch.add([&] { isa::activation(g, act_op_, g); });
          } else {
            sch.add([&] { isa::activation(g, act_op_, acc); });
          }
          gates[i * spans + s] = g;
        }
      const std::vector<Tensor> u_acc = accumulate(io.w_up, xT_, H_, c0, w);
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * bank < w; ++s) {
          const int64_t pt = tiles[i].p, t0 = tiles[i].r0, ws = std::min(bank, w - s * bank);
          const Tensor gate = gates[i * spans + s];
          if (bu || su) {
            const Tensor u = up_ring_.next()(first(pt), nl::ds(0, ws)), h = h_ring_.next()(first(pt), nl::ds(0, ws));
            const Tensor acc = dequantize(u_acc[i * spans + s](first(pt), nl::ds(0, ws)), su, pt, s, ws, u);
            if (bu) sch.add([&] { isa::tensor_tensor(u, acc, (*bu)(first(pt), nl::ds(s * bank, ws)), nl::add); });
            sch.add_any({[&] { isa::tensor_tensor(h, gate, u, nl::multiply, gpsimd); },
                         [&] { isa::tensor_tensor(h, gate, u, nl::multiply, vector); }});
            transpose_rows(sch, tr_ring_, hT_(all, nl::ds((c0 + s * bank) / P, ceil_div(ws, P)), nl::ds(t0, pt)), h);
          } else {
            const Tensor h = h_ring_.next()(first(pt), nl::ds(0, ws)), acc = u_acc[i * spans + s](first(pt), nl::ds(0, ws));
            sch.add([&] { isa::tensor_tensor(h, gate, acc, nl::multiply, vector); });
            transpose_rows(sch, tr_ring_, hT_(all, nl::ds((c0 + s * bank) / P, ceil_div(ws, P)), nl::ds(t0, pt)), h);
          }
        }
    }
    // Down, a slab's columns of H at a time, b_down added on the way out of PSUM.
    for (int64_t c0 = 0; c0 < H_; c0 += CW) {
      const int64_t w = std::min(CW, H_ - c0);
      std::optional<Tensor> bd;
      if (biases_) bd = bias_rows(*io.b_down, c0, w);
      const std::optional<Tensor> sd = scale_rows(io.s_down, c0, w);
      const std::vector<Tensor> accs = accumulate(io.w_down, hT_, I_, c0, w);
      for (size_t i = 0; i < tiles.size(); ++i)
        for (int64_t s = 0; s * bank < w; ++s) {
          const int64_t pt = tiles[i].p, ws = std::min(bank, w - s * bank);
          const Tensor o = o_ring_.next()(first(pt), nl::ds(0, ws));
          const Tensor acc = dequantize(accs[i * spans + s](first(pt), nl::ds(0, ws)), sd, pt, s, ws,
                                        sd ? up_ring_.next()(first(pt), nl::ds(0, ws)) : Tensor{});
          if (bd) sch.add([&] { isa::tensor_tensor(o, acc, (*bd)(first(pt), nl::ds(s * bank, ws)), nl::add); });
          else io.leave_psum(o, acc, i, c0 + s * bank);
          io.store(o, i, c0 + s * bank);
        }
    }
  }

 private:
  /** A weight slab spans as many PSUM banks of columns as leave the accumulators of the block's
   *  tiles in four banks: one for four tiles of tokens, four (2048 columns) for one (decode). */
  static int64_t spans_for(int64_t block, int64_t P) { return std::max<int64_t>(1, 4 / ceil_div(block, P)); }
  /** The scales come with fp8 weights and only with them. */
  void check_scales(const Io& io) const {
    const bool given = io.s_gate && io.s_up && io.s_down, none = !io.s_gate && !io.s_up && !io.s_down;
    internal_check(scales_ ? given : none, "GatedBlocks: fp8 weights take three column scales, others none");
  }

  static constexpr int64_t kSlabBanks = 16, kRows = 2, kWork = 2, kGates = 5, kUps = 2, kBiases = 4, kScales = 6;
  int64_t H_, I_;
  DType dt_, wdt_;
  nl::Op act_op_;
  bool biases_, scales_;
  int64_t P_ = 0, bank_ = 0, nH_ = 0, nI_ = 0, block_ = 0, spans_ = 1, width_ = 0;
  Tensor xT_, hT_;
  toolkit::Ring slab_ring_, row_ring_, bias_ring_, scale_ring_, gate_ring_, up_ring_, h_ring_, o_ring_, acc_ring_,
      tr_ring_;
};

}  // namespace nikki::kernels::mlp
