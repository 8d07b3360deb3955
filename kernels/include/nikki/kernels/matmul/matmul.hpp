// Matrix multiplication in the natural layout, out[M, N] = a[M, K] @ b[K, N].
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nikki/cost_model.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/matmul/matmul_reference.hpp"
#include "nikki/kernels/toolkit/registration.hpp"

namespace nikki::kernels {

inline constexpr const char* matmul_doc = R"(Matrix product in the natural (torch.matmul) layout.

Dimensions: a [M, K], b [K, N] -> out [M, N]; any M, K, N >= 1 (edge tiles take the tails).
Args:       a, b: HBM tensors of one dtype that nc_matmul accepts (bfloat16, float16, float32, ...).
Returns:    out, a's dtype (the C++ function takes an optional out_dtype).
Notes:      TensorE contracts over the partition dim, so a's tiles are transposed on chip
            (nc_transpose into PSUM, copied to SBUF) once per row block and reused for every
            column tile of the output. Row blocks of up to 4 x 128 rows (rows_per_block; from
            Python, the fastest of 2, 3 or 4 by estimated time for the call's shapes and dtype,
            chosen once per shape and cached) accumulate their output tiles [128, 512] at once
            in fp32 PSUM banks while b streams through in multi-tile chunks
            (one DMA per chunk), prefetched ahead of the matmuls that read them. The next block's
            transposes overwrite the transposed block k tile by k tile as the current block's
            last column tile has read them, so TensorE never waits for a block to be prepared.
            When the transposed block does not fit SBUF (very large K), K is split into blocks
            whose fp32 partial sums go through an HBM scratch tensor. Products accumulate in
            fp32; one rounding to the output dtype on the final copy out of PSUM. From C++
            (MatmulOptions), a may be given K-major ([K, M], loaded into the transposed block
            with no transposes), and a bias [N] and a residual [M, N] are added to the fp32
            sums before that rounding.
Pseudocode: for each row block R (<= 512 rows): aT = transpose(a[R, :])            # [K, |R|]
              for each column tile C (<= 512 columns):
                acc[R, C] = sum over k tiles of aT[k, R].T @ b[k, C]   # fp32 PSUM
                out[R, C] = acc[R, C])";

namespace matmul_detail {

/** A DMA load issued ahead of the steps that read it; `tile` is the SBUF tile it fills. */
struct Load {
  std::function<Tensor()> issue;
  int64_t bytes = 0;  // SBUF bytes per partition
  std::optional<Tensor> tile;
  int readers = 0;  // steps not yet emitted that read it
  std::shared_ptr<bool> after;  // set once the step that writes its source has been emitted
  bool ready() const { return !after || *after; }
  Tensor get() {
    if (!tile) tile = issue();
    return *tile;
  }
};

/** One unit of Tensor-engine work in program order, with the loads it reads. */
struct Step {
  double cycles = 0;  // estimated TensorE cycles, to decide how far ahead to issue loads
  std::vector<Load*> needs;
  std::function<void()> emit;
};

/**
 * Emits the steps in order, issuing each step's loads when the step comes within `window`
 * estimated cycles of the Tensor engine's position, as long as the loaded tiles not yet done
 * with stay within `cap` bytes per partition. The DMA of a tile then overlaps the work before
 * it, and SBUF holds a bounded number of tiles in flight.
 */
inline void emit_pipelined(std::vector<Step>& steps, double window, int64_t cap) {
  std::vector<double> start(steps.size() + 1, 0.0);
  for (size_t i = 0; i < steps.size(); ++i) {
    start[i + 1] = start[i] + steps[i].cycles;
    for (Load* l : steps[i].needs) ++l->readers;
  }
  auto new_bytes = [&](const Step& s) {
    int64_t b = 0;
    for (Load* l : s.needs) b += l->tile ? 0 : l->bytes;
    return b;
  };
  auto ready = [&](const Step& s) {
    return std::all_of(s.needs.begin(), s.needs.end(), [](const Load* l) { return l->ready(); });
  };
  int64_t live = 0;
  size_t issued = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    while (issued < steps.size() &&
           (issued <= i || (start[issued] <= start[i] + window && live + new_bytes(steps[issued]) <= cap &&
                            ready(steps[issued])))) {
      live += new_bytes(steps[issued]);
      for (Load* l : steps[issued].needs) l->get();
      ++issued;
    }
    steps[i].emit();
    for (Load* l : steps[i].needs)
      if (--l->readers == 0) live -= l->bytes;
  }
}


}  // namespace matmul_detail

/**
 * @brief Options of matmul for the kernels built on it: a K-major first operand, a fused
 * epilogue (bias and residual added to the fp32 accumulators before the one rounding), and an
 * output the caller allocated.
 */
struct MatmulOptions {
  std::optional<DType> out_dtype;  // a's dtype when not given
  /** a is given transposed, as [K, M] (K-major, e.g. the activations of a weight gradient
   *  x^T @ dy): its tiles load straight into the stationary operand, with no transposes. */
  bool a_transposed = false;
  std::optional<Tensor> bias;      // [N], added to every row
  std::optional<Tensor> residual;  // [M, N], added
  /** Dequantization scales (fp32): the products' sums are multiplied by row_scale[m] (an [M]
   *  tensor) and col_scale[n] (an [N] tensor) before the bias and residual are added. Both or
   *  neither. */
  std::optional<Tensor> row_scale, col_scale;
  std::optional<Tensor> out;       // an HBM view [M, N] to write instead of a new output tensor
  /** Row tiles of 128 per block (1-4), or 0 for the default, 4. Fewer rows per block means more
   *  passes over b but a smaller transposed block, which for long K may avoid splitting K into
   *  blocks summed through HBM: which is faster depends on the shape (nikki.kernels.matmul picks
   *  it by estimated time). */
  int64_t rows_per_block = 0;
};

/** @brief out = a @ b (+ bias + residual); see matmul_doc and MatmulOptions. */
inline Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using matmul_detail::Load;
  using matmul_detail::Step;
  KernelBuilder& builder = a.builder();
  const ArgumentCheck check("matmul", a, loc);
  check.require(a.ndim() == 2 && b.ndim() == 2, "a and b must be 2-D, got " + a.shape().str() + " and " + b.shape().str(),
                "reshape to [M, K] and [K, N]");
  const bool a_t = options.a_transposed;
  const int64_t M = a.shape()[a_t ? 1 : 0], K = a.shape()[a_t ? 0 : 1], N = b.shape()[1];
  check.require(b.shape()[0] == K, "contraction sizes differ: a is " + a.shape().str() + (a_t ? " (transposed)" : "") +
                                       ", b is " + b.shape().str(),
                "a [M, K] @ b [K, N] needs a.shape[1] == b.shape[0]");
  const std::optional<DType> out_dtype = options.out_dtype;
  const std::optional<Tensor> bias = options.bias, residual = options.residual;
  internal_check(!bias || bias->shape() == Shape{N}, "matmul: bias must be [N]");
  internal_check(!residual || residual->shape() == Shape{M, N}, "matmul: residual must be [M, N]");
  internal_check(!options.out || options.out->shape() == Shape{M, N}, "matmul: out must be [M, N]");
  const std::optional<Tensor> row_scale = options.row_scale, col_scale = options.col_scale;
  const bool scaled = row_scale.has_value();
  internal_check(scaled == col_scale.has_value(), "matmul: row_scale and col_scale go together");
  internal_check(!scaled || (row_scale->shape() == Shape{M} && col_scale->shape() == Shape{N}),
                 "matmul: row_scale must be [M] and col_scale [N]");
  check.require(a.dtype() == b.dtype(),
                std::string("a is ") + std::string(dtype_name(a.dtype())) + " but b is " +
                    std::string(dtype_name(b.dtype())),
                "cast both operands to one dtype");

  const TargetConfig& t = builder.config();
  const nl::TileSize ts = nl::tile_size();
  const DType dt = a.dtype();
  const DType odt = out_dtype.value_or(dt);
  const int64_t esize = dtype_size(dt);
  const bool wide = dt == DType::float32 || dt == DType::tfloat32;
  const int64_t P = ts.pmax;                                                 // contraction rows per tile
  const int64_t TMW = std::min(ts.pmax, ts.gemm_stationary_fmax);           // output rows per tile
  const int64_t TNW = std::min(ts.gemm_moving_fmax, ts.psum_bank_fmax);     // output columns per tile
  const int64_t MT = ceil_div(M, TMW), KT = ceil_div(K, P), NT = ceil_div(N, TNW);
  // Transposes land in PSUM in a's dtype; one bank holds this many [<=128, <=128] results.
  const int64_t per_bank = std::max<int64_t>(1, ts.psum_bank_fmax_bytes / (TMW * esize));

  // Row tiles per block, each with its own accumulation bank; the other banks take the transposes.
  // More rows per block means fewer passes over b, the dominant DMA traffic.
  check.require(options.rows_per_block >= 0 && options.rows_per_block <= 4,
                "rows_per_block is " + std::to_string(options.rows_per_block) + ", not 0 (default) or 1-4",
                "pass a number of 128-row tiles per block from 1 to 4, or 0");
  const int64_t rows_wanted = options.rows_per_block == 0 ? 4 : options.rows_per_block;
  const int64_t TM = std::max<int64_t>(1, std::min<int64_t>({rows_wanted, MT, ts.psum_num_banks - 2}));
  const int64_t nn_max = std::min(N, TNW);
  // b streams in chunks of KC k tiles, one DMA each: ~4 KiB per partition amortizes the DMA's
  // fixed cost while keeping the prefetched chunks small.
  const int64_t KC = std::clamp<int64_t>(4096 / (nn_max * esize), 1, KT);
  // a's rows load in pieces of whole PSUM-bank groups, up to ~8 KiB per partition (long DMA runs).
  const int64_t groups_per_piece = std::max<int64_t>(1, (8192 / esize) / (per_bank * P));
  // SBUF: one transposed block (the next block's transposes overwrite it k tile by k tile as the
  // current block's last column tile finishes with them) plus the tiles in flight.
  // Loaded tiles in flight are capped (emit_pipelined) at ~5 b chunks, a piece per row tile plus
  // one, and two partial-sum tiles; output staging tiles come on top.
  const int64_t piece_bytes = groups_per_piece * per_bank * P * esize;
  const int64_t scale_bytes = scaled ? 2 * (TM + nn_max) * 4 : 0;  // two column tiles' scales in flight
  const int64_t stream_cap = 5 * KC * nn_max * esize + (TM + 1) * piece_bytes + 2 * TM * nn_max * 4 + scale_bytes;
  const int64_t stream_bytes = stream_cap + 3 * TM * nn_max * std::max<int64_t>(dtype_size(odt), 4);
  const int64_t at_budget = ts.sbuf_fmax_bytes * 4 / 5 - stream_bytes;
  const int64_t kb_max = std::max<int64_t>(per_bank, at_budget / (TM * TMW * esize) / per_bank * per_bank);
  // K blocks: one unless the transposed block for all of K would not fit SBUF.
  const int64_t n_kblocks = ceil_div(KT, kb_max);
  // Several K blocks start on PSUM-bank groups of transposes; a single one is just all of K.
  const int64_t KB = n_kblocks == 1 ? KT : ceil_div(ceil_div(KT, n_kblocks), per_bank) * per_bank;
  const int64_t n_mblocks = ceil_div(MT, TM);

  Tensor out = options.out ? *options.out : nl::ndarray({M, N}, odt, nl::shared_hbm, "out");
  std::optional<Tensor> partial;  // fp32 partial sums between K blocks
  if (n_kblocks > 1) partial = nl::ndarray({M, N}, nl::float32, nl::hbm, "partial");

  // Estimated TensorE cycles (the target's cost table), to pace the prefetch of loads.
  const double dma_bytes_per_ns = t.dma_engines * t.dma_bytes_per_ns_per_engine;
  const double chunk_ns = double(P * KC * nn_max * esize) / dma_bytes_per_ns;
  const double window = 4.0 * (t.dma_fixed_latency_ns + chunk_ns) * t.clock_ghz.tensor;

  // a's transposed row block, k on partitions: [k row, row tile, k tile, row]. One buffer serves
  // every block and K block (the scheduler orders each overwrite after the matmuls that read
  // it), so it is placed once, early, and the streamed tiles rotate around it.
  Tensor aT = nl::ndarray({P, TM, KB, TMW}, dt, nl::sbuf, "aT");
  std::deque<Load> loads;  // stable addresses for Step::needs
  int evacuations = 0;
  // PSUM evacuations alternate between the vector and scalar engines, so a block's accumulators
  // drain in parallel and their banks free up for the next column tile sooner.
  auto evacuate = [&](const Tensor& dst, const Tensor& src) {
    if (evacuations++ % 2 == 0) isa::tensor_copy(dst, src, isa::vector_engine);
    else isa::activation(dst, nl::copy, src);
  };

  // A pass is one row block over one K block; all passes form one pipeline (loads run ahead
  // across pass boundaries, and each pass's transposes follow the previous pass's last column
  // tile as it releases aT's k tiles).
  struct Pass {
    int64_t kt0 = 0, kts = 0;  // the K block's first k tile and k tile count
    int64_t m0 = 0, tiles = 0;  // the row block's first row and row tile count
    bool first_k = true, last_k = true;
    int64_t k_rows(int64_t kt, int64_t K, int64_t P) const { return std::min(P, K - (kt0 + kt) * P); }
  };
  std::vector<Pass> passes;
  for (int64_t kb = 0; kb < n_kblocks; ++kb)
    for (int64_t bi = 0; bi < n_mblocks; ++bi)
      passes.push_back({kb * KB, std::min(KB, KT - kb * KB), bi * TM * TMW, std::min(TM, MT - bi * TM), kb == 0,
                        kb == n_kblocks - 1});
  auto m_rows = [=](const Pass& ps, int64_t mi) { return std::min(TMW, M - ps.m0 - mi * TMW); };

  // The transposes of one pass, one step per PSUM bank: up to per_bank k tiles of one row tile,
  // transposed into the bank and copied to aT in one instruction. Ordered by k so that they can
  // follow the previous pass's last column tile as it releases aT's k tiles.
  // Returns (last k tile overwritten, step) pairs.
  int transposes = 0;
  auto transpose_steps = [&](const Pass& ps) {
    std::vector<std::pair<int64_t, Step>> steps;
    std::vector<Load*> pieces(ps.tiles, nullptr);
    auto k_rows = [=](int64_t kt) { return ps.k_rows(kt, K, P); };
    for (int64_t g = 0; g < ps.kts; g += per_bank) {
      const int64_t ng = std::min(per_bank, ps.kts - g);
      const int64_t full = k_rows(g + ng - 1) == P ? ng : ng - 1;  // only K's last tile is partial
      for (int64_t mi = 0; mi < ps.tiles; ++mi) {
        const int64_t mm = m_rows(ps, mi), r0 = ps.m0 + mi * TMW;
        if (a_t) {
          // a given K-major: its k tiles load straight into the stationary operand.
          Step s;
          s.emit = [=, &a, &aT] {
            const int64_t k0 = (ps.kt0 + g) * P;
            if (full > 0)
              isa::dma_copy(aT(nl::all, mi, nl::ds(g, full), nl::ds(0, mm)),
                            a(nl::ds(k0, full * P), nl::ds(r0, mm)).reshape_dim(0, {full, P}).permute({1, 0, 2}));
            if (full < ng) {
              const int64_t kk = k_rows(g + full);
              isa::dma_copy(aT(nl::ds(0, kk), mi, g + full, nl::ds(0, mm)), a(nl::ds(k0 + full * P, kk), nl::ds(r0, mm)));
            }
          };
          steps.emplace_back(g + ng - 1, std::move(s));
          continue;
        }
        const int64_t g0 = g / (per_bank * groups_per_piece) * (per_bank * groups_per_piece);
        if (g == g0) {
          const int64_t c0 = (ps.kt0 + g0) * P, cols = std::min(per_bank * groups_per_piece * P, K - c0);
          pieces[mi] = &loads.emplace_back(Load{[=, &a] {
            Tensor s = nl::ndarray({mm, cols}, dt, nl::sbuf, "a_rows");
            isa::dma_copy(s, a(nl::ds(r0, mm), nl::ds(c0, cols)));
            return s;
          }, cols * esize});
        }
        Load* piece = pieces[mi];
        Step s;
        for (int64_t i = 0; i < ng; ++i) s.cycles += cost::matmul_cycles(t, mm, k_rows(g + i), false);
        s.needs = {piece};
        s.emit = [=, &aT, &transposes] {
          // Two allocation sites, each double-buffered: four banks rotate, so a transpose
          // rarely waits for the evacuation of the bank before last.
          Tensor tp = transposes++ % 2 == 0 ? nl::ndarray({P, per_bank, TMW}, dt, nl::psum, "aT_psum")
                                            : nl::ndarray({P, per_bank, TMW}, dt, nl::psum, "aT_psum");
          for (int64_t i = 0; i < ng; ++i) {
            const int64_t kk = k_rows(g + i);
            isa::nc_transpose(tp(nl::ds(0, kk), i, nl::ds(0, mm)),
                              piece->get()(nl::all, nl::ds((g + i - g0) * P, kk)), isa::tensor_engine);
          }
          if (full > 0)
            isa::tensor_copy(aT(nl::all, mi, nl::ds(g, full), nl::ds(0, mm)),
                             tp(nl::all, nl::ds(0, full), nl::ds(0, mm)), isa::vector_engine);
          if (full < ng) {
            const int64_t kk = k_rows(g + full);
            isa::tensor_copy(aT(nl::ds(0, kk), mi, g + full, nl::ds(0, mm)), tp(nl::ds(0, kk), full, nl::ds(0, mm)),
                             isa::vector_engine);
          }
        };
        steps.emplace_back(g + ng - 1, std::move(s));
      }
    }
    return steps;
  };

  // Per output tile (row block, column tile): emitted once the partial sum is stored, so that the
  // next K block's load of it is never issued ahead of the store in program order.
  std::vector<std::shared_ptr<bool>> partial_stored(n_mblocks * NT);

  // The matmuls of one pass: per column tile, chunks of b that each feed every row tile's
  // accumulator, then the evacuation of the accumulators (adding the earlier K blocks' partial
  // sums). `next` are the next pass's transposes, placed in the last column tile as soon as the
  // k tiles they overwrite have been read.
  auto matmul_steps = [&](const Pass& ps, std::vector<std::pair<int64_t, Step>> next) {
    std::vector<Step> steps;
    size_t next_done = 0;
    auto k_rows = [=](int64_t kt) { return ps.k_rows(kt, K, P); };
    for (int64_t j = 0; j < NT; ++j) {
      const int64_t n0 = j * TNW, nn = std::min(TNW, N - n0);
      auto acc = std::make_shared<std::vector<Tensor>>();
      for (int64_t c0 = 0; c0 < ps.kts; c0 += KC) {
        const int64_t kc = std::min(KC, ps.kts - c0);
        const int64_t full = k_rows(c0 + kc - 1) == P ? kc : kc - 1;
        Load* chunk = &loads.emplace_back(Load{[=, &b] {
          Tensor s = nl::ndarray({P, kc, nn}, dt, nl::sbuf, "b_chunk");
          const int64_t r0 = (ps.kt0 + c0) * P;
          if (full > 0)
            isa::dma_copy(s(nl::all, nl::ds(0, full), nl::all),
                          b(nl::ds(r0, full * P), nl::ds(n0, nn)).reshape_dim(0, {full, P}).permute({1, 0, 2}));
          if (full < kc) {
            const int64_t kk = k_rows(c0 + full);
            isa::dma_copy(s(nl::ds(0, kk), full, nl::all), b(nl::ds(r0 + full * P, kk), nl::ds(n0, nn)));
          }
          return s;
        }, kc * nn * esize});
        Step s;
        for (int64_t mi = 0; mi < ps.tiles; ++mi) s.cycles += kc * cost::matmul_cycles(t, m_rows(ps, mi), nn, wide);
        s.needs = {chunk};
        s.emit = [=, &aT] {
          if (acc->empty())
            for (int64_t mi = 0; mi < ps.tiles; ++mi)
              acc->push_back(nl::ndarray({m_rows(ps, mi), nn}, nl::float32, nl::psum, "acc"));
          for (int64_t i = 0; i < kc; ++i) {
            const int64_t kk = k_rows(c0 + i);
            for (int64_t mi = 0; mi < ps.tiles; ++mi)
              isa::nc_matmul((*acc)[mi], aT(nl::ds(0, kk), mi, c0 + i, nl::ds(0, m_rows(ps, mi))),
                             chunk->get()(nl::ds(0, kk), i, nl::all), {.accumulate = c0 + i > 0});
          }
        };
        steps.push_back(std::move(s));
        // Spread the released transposes over the remaining chunks: at most two per chunk
        // until the last one, so their PSUM evacuations keep up.
        if (j == NT - 1) {
          const bool last_chunk = c0 + kc >= ps.kts;
          for (int taken = 0;
               next_done < next.size() && next[next_done].first < c0 + kc && (last_chunk || taken < 2); ++taken)
            steps.push_back(std::move(next[next_done++].second));
        }
      }
      Step e;
      // One staging tile per column tile for the whole block (not one per row tile): the
      // allocator then alternates whole tiles, and an evacuation never waits for the store DMA
      // of a tile that was just written.
      std::shared_ptr<bool>& stored = partial_stored[ps.m0 / (TM * TMW) * NT + j];
      // What the accumulators get added before the store, in fp32: the earlier K blocks' partial
      // sums, and on the last K block the epilogue's residual rows and bias. The first term
      // loads straight into the tile (DMA widens to fp32); further ones are added on GpSimd.
      const bool epilogue = ps.last_k && (bias || residual);
      if (!ps.first_k || epilogue)
        e.needs = {&loads.emplace_back(Load{[=] {
          Tensor s = nl::ndarray({P, ps.tiles, nn}, nl::float32, nl::sbuf, "addend_tile");
          bool filled = false;
          auto add_rows = [&](const Tensor& src, const char* name) {
            const Tensor dst = filled ? nl::ndarray({P, ps.tiles, nn}, nl::float32, nl::sbuf, name) : s;
            for (int64_t mi = 0; mi < ps.tiles; ++mi)
              isa::dma_copy(dst(nl::ds(0, m_rows(ps, mi)), mi, nl::all),
                            src(nl::ds(ps.m0 + mi * TMW, m_rows(ps, mi)), nl::ds(n0, nn)));
            if (filled)
              for (int64_t mi = 0; mi < ps.tiles; ++mi) {
                const Tensor sm = s(nl::ds(0, m_rows(ps, mi)), mi, nl::all);
                isa::tensor_tensor(sm, sm, dst(nl::ds(0, m_rows(ps, mi)), mi, nl::all), nl::add, isa::gpsimd_engine);
              }
            filled = true;
          };
          if (!ps.first_k) add_rows(*partial, "partial_tile");
          if (ps.last_k && residual) add_rows(*residual, "residual_tile");
          if (ps.last_k && bias) add_rows(bias->expand_dim(0).broadcast(0, M), "bias_tile");
          return s;
        }, ps.tiles * nn * 4 * (1 + int64_t(!ps.first_k) + int64_t(epilogue)), std::nullopt, 0, stored})};
      // The scales of the tile: the row tiles' row_scale as columns [rows, TM], then col_scale
      // broadcast to every partition [P, nn] (one DMA each).
      Load* scales = nullptr;
      if (scaled)
        scales = &loads.emplace_back(Load{[=] {
          Tensor s = nl::ndarray({P, ps.tiles + nn}, nl::float32, nl::sbuf, "scale_tile");
          for (int64_t mi = 0; mi < ps.tiles; ++mi)
            isa::dma_copy(s(nl::ds(0, m_rows(ps, mi)), nl::ds(mi, 1)),
                          row_scale->slice(0, ps.m0 + mi * TMW, ps.m0 + mi * TMW + m_rows(ps, mi)).expand_dim(1));
          isa::dma_copy(s(nl::all, nl::ds(ps.tiles, nn)), col_scale->slice(0, n0, n0 + nn).expand_dim(0).broadcast(0, P));
          return s;
        }, (ps.tiles + nn) * 4});
      if (scales) e.needs.push_back(scales);
      if (!ps.last_k) stored = std::make_shared<bool>(false);
      const size_t n_sums = e.needs.size() - (scales ? 1 : 0);
      e.emit = [=, &evacuate, &out, sums = std::vector<Load*>(e.needs.begin(), e.needs.begin() + n_sums),
                stored = stored] {
        Tensor res = nl::ndarray({P, ps.tiles, nn}, ps.last_k ? odt : nl::float32, nl::sbuf, "out_tile");
        for (int64_t mi = 0; mi < ps.tiles; ++mi) {
          const int64_t r0 = ps.m0 + mi * TMW, mm = m_rows(ps, mi);
          Tensor r = res(nl::ds(0, mm), mi, nl::all);
          if (scales) {
            // (acc * row_scale) * col_scale out of PSUM in one VectorE pass (each K block's sums
            // are scaled as they are stored: scaling is linear), then the addends.
            const Tensor sc = scales->get();
            const Tensor scaled_acc = sums.empty() ? r : nl::ndarray({mm, nn}, nl::float32, nl::sbuf, "scaled_acc");
            isa::scalar_tensor_tensor(scaled_acc, (*acc)[mi], nl::multiply, sc(nl::ds(0, mm), nl::ds(mi, 1)),
                                      nl::multiply, sc(nl::ds(0, mm), nl::ds(ps.tiles, nn)));
            if (!sums.empty())
              isa::tensor_tensor(r, sums[0]->get()(nl::ds(0, mm), mi, nl::all), scaled_acc, nl::add,
                                 mi % 2 == 0 ? isa::vector_engine : isa::gpsimd_engine);
          } else if (sums.empty()) {
            evacuate(r, (*acc)[mi]);
          } else if (mi % 2 == 0) {
            isa::tensor_tensor(r, sums[0]->get()(nl::ds(0, mm), mi, nl::all), (*acc)[mi], nl::add,
                               isa::vector_engine);
          } else {
            // Half the sums drain PSUM through the scalar engine and are added on GpSimd.
            Tensor tmp = nl::ndarray({mm, nn}, nl::float32, nl::sbuf, "acc_copy");
            isa::activation(tmp, nl::copy, (*acc)[mi]);
            isa::tensor_tensor(r, sums[0]->get()(nl::ds(0, mm), mi, nl::all), tmp, nl::add, isa::gpsimd_engine);
          }
          isa::dma_copy((ps.last_k ? out : *partial)(nl::ds(r0, mm), nl::ds(n0, nn)), r);
        }
        if (!ps.last_k) *stored = true;
      };
      steps.push_back(std::move(e));
    }
    for (; next_done < next.size(); ++next_done) steps.push_back(std::move(next[next_done].second));
    return steps;
  };

  std::vector<Step> order;
  for (auto& [last_kt, step] : transpose_steps(passes[0])) order.push_back(std::move(step));
  for (size_t pi = 0; pi < passes.size(); ++pi) {
    auto next = pi + 1 < passes.size() ? transpose_steps(passes[pi + 1]) : std::vector<std::pair<int64_t, Step>>{};
    for (Step& s : matmul_steps(passes[pi], std::move(next))) order.push_back(std::move(s));
  }
  matmul_detail::emit_pipelined(order, window, stream_cap);
  return out;
}

/** @brief out = a @ b; see matmul_doc. */
inline Tensor matmul(const Tensor& a, const Tensor& b, std::optional<DType> out_dtype = std::nullopt,
                     Loc loc = Loc::current()) {
  return matmul(a, b, MatmulOptions{.out_dtype = out_dtype}, loc);
}

/** @brief The useful FLOPs of a benchmark case whose inputs `a` [M, K] and `b` [K, N] multiply:
 *  2 M K N. */
inline std::function<double(const ExampleCase&)> matmul_flops(size_t a, size_t b) {
  return [a, b](const ExampleCase& c) {
    return 2.0 * double(c.inputs[a].shape[0]) * double(c.inputs[a].shape[1]) * double(c.inputs[b].shape[1]);
  };
}

inline KernelInfo matmul_info() {
  auto mm = [](Shape a, Shape b, DType d, std::string label) {
    return ExampleCase{{spec(a, d), spec(b, d)}, {}, std::move(label)};
  };
  return KernelInfo{
      .name = "matmul",
      .summary = "matrix product a @ b (torch.matmul layout)",
      .doc = matmul_doc,
      .inputs = {"a", "b"},
      .outputs = {"out"},
      .params = {{"rows_per_block", ParamKind::integer, 0,
                  "128-row tiles per block, 1-4 (0: the fastest by estimated time from Python, else 4)",
                  /*tune_over=*/{2, 3, 4}}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "grad_a = grad_out @ b^T and grad_b = a^T @ grad_out, by matmul itself (nikki.torch)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{
                matmul(c.inputs[0], c.inputs[1], MatmulOptions{.rows_per_block = c.integer("rows_per_block")})};
          },
      .reference = [](const std::vector<RefTensor>& in,
                      const ParamValues&) { return std::vector<RefTensor>{reference::matmul(in[0], in[1])}; },
      .make_inputs = {},
      .examples = {mm({1, 1}, {1, 1}, DType::float32, "tiny"),
                   mm({130, 200}, {200, 520}, DType::bfloat16, "tails in every dim, two column tiles"),
                   mm({520, 130}, {130, 40}, DType::float32, "two row blocks, the last one partial"),
                   mm({257, 1}, {1, 513}, DType::float32, "K = 1"),
                   mm({1, 1000}, {1000, 3}, DType::bfloat16, "one row, K over several chunks"),
                   mm({2, 40000}, {40000, 3}, DType::float32, "large K: split into blocks summed through HBM")},
      .draw =
          [mm](CaseRng& r) {
            const DType d = r.pick({DType::float32, DType::bfloat16, DType::float16});
            const int64_t M = r.size(1, 700), K = r.size(1, 900), N = r.size(1, 1100, 512);
            return mm({M, K}, {K, N}, d, "drawn");
          },
      .tolerance = {},
      .benchmark = Benchmark{mm({4096, 4096}, {4096, 4096}, DType::bfloat16, "4096 x 4096 x 4096 bf16"),
                             Bound::tensor_engine, matmul_flops(0, 1), 0.85},
  };
}

}  // namespace nikki::kernels
