// Mixture-of-experts prefill (nki-library's moe_cte, dropless and blockwise), with the routing
// metadata built on the device: the tokens each expert receives (find_nonzero_indices' maths on
// the routing mask), padded to blocks of B tokens; each block runs through its expert's gated MLP
// (the schedule gated_mlp uses, its weights addressed by the block's expert at run time) and is
// scattered back into the output scaled by the routing weights.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "nikki/kernels/gather/indexed_rows.hpp"
#include "nikki/kernels/mlp/gated_blocks.hpp"
#include "nikki/kernels/moe/moe_reference.hpp"
#include "nikki/kernels/moe/nonzero_columns.hpp"
#include "nikki/kernels/moe/routed_experts.hpp"

namespace nikki::kernels {

inline constexpr const char* moe_prefill_doc = R"(Mixture-of-experts feed-forward of a prefill (context encoding), dropless and blockwise.

Dimensions: x [T, H], expert_ids [T, k], weights [T, k], w_gate [E, H, I], w_up [E, H, I],
            w_down [E, I, H] -> out [T, H]; any T, H, I >= 1; 1 <= E <= 128; 1 <= k <= 8;
            E x (T + B) < 2^24.
Args:       x and the expert weights: one float dtype (float32 / bfloat16 / float16).
            expert_ids: int32, the experts router_topk chose for each token (an id outside
            [0, E) routes nowhere; an expert named twice by one token gets the sum of its
            weights). weights: float, the routing weights of those slots.
            activation: 0 silu (SwiGLU), 1 gelu (erf form), 2 gelu with the tanh approximation.
            block_size: tokens per block B, 128, 256 or 512 (0 chooses).
Returns:    out, x's dtype.
Notes:      Dropless: every routed token is computed, whatever the balance. The routing
            metadata is built on the device: the routing mask and the affinities [T, E] from
            the ids (VectorE), the tokens of each expert compacted by nonzero_with_count
            (find_nonzero_indices), the blocks per expert ceil(n_e / B) and their prefix sum
            (TensorE), and for each of the N = min(floor((T k + E (B - 1)) / B), E ceil(T / B))
            static blocks its expert and the start of its tokens. Blocks past the last expert's
            hold no token. A block's tokens are gathered by indirect DMA (runtime row indices),
            run through the gated MLP with the expert's weights read at a runtime offset, scaled
            by their affinities as the down projection leaves PSUM and added into out by the DMA
            engines (fp32 adds, rounded to out's dtype: up to k roundings per output row).
            The static schedule computes N blocks: with balanced routing about T k / B of them
            hold tokens, so small B wastes less and large B reads the weights less often.
Pseudocode: a[t, e] = sum_j weights[t, j] * (expert_ids[t, j] == e)
            out = 0
            for e in range(E):
              tokens = [t for t in range(T) if e in expert_ids[t]]
              for each block S of B consecutive entries of tokens:
                out[S] += a[S, e][:, None] * gated_mlp(x[S], w_gate[e], w_up[e], w_down[e]))";

namespace moe {

/** @brief Block sizes the prefill accepts (a multiple of 128, at most gated_mlp's 512). */
inline bool valid_block_size(int64_t B, int64_t P) { return B >= P && B <= 4 * P && B % P == 0; }

/** @brief The static blocks that hold every routed token: each expert's n_e <= T tokens take
 *  ceil(n_e / B) blocks and sum n_e <= T min(k, E). */
inline int64_t static_blocks(int64_t T, int64_t k, int64_t E, int64_t B) {
  return std::max<int64_t>(1, std::min((T * std::min(k, E) + E * (B - 1)) / B, E * ceil_div(T, B)));
}

/** @brief The default block: 256 tokens once the tokens fill more than a block per expert
 *  (weights read half as often as at 128, little padding), else the fewest blocks. */
inline int64_t default_block_size(int64_t T, int64_t k, int64_t E, int64_t P) {
  return T * std::min(k, E) >= 2 * P * E ? 2 * P : P;
}

}  // namespace moe

/** @brief out [T, H] = the experts' gated MLPs combined with the routing weights; see
 *  moe_prefill_doc. Operands: x, expert_ids, weights, w_gate, w_up, w_down. */
inline Tensor moe_prefill(const std::vector<Tensor>& in, reference::GateActivation act, int64_t block_size = 0,
                          Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const auto all = nl::all;
  const ArgumentCheck check("moe_prefill", in.at(0), loc);
  const std::vector<int64_t> dims = moe::check_routed_operands(check, in);
  const Tensor &x = in[0], &expert_ids = in[1], &weights = in[2], &w_gate = in[3], &w_up = in[4], &w_down = in[5];
  const int64_t T = dims[0], H = dims[1], I = dims[2], E = dims[3], k = dims[4];
  const int64_t P = nl::tile_size().pmax;
  if (block_size != 0 && !moe::valid_block_size(block_size, P))
    check.fail("block_size is " + std::to_string(block_size), "0, 128, 256 or 512", "pass block_size=0 to let the kernel choose");
  const int64_t B = block_size ? block_size : moe::default_block_size(T, k, E, P);
  const int64_t W = T + B;  // a block's entries may run B - 1 past its expert's tokens: the -1 padding
  if (E * W >= moe::kMaxRows)
    check.fail("E x (T + block_size) is " + std::to_string(E * W), "below 2^24 (offsets are computed exactly in fp32)",
               "split the tokens into parts");
  const int64_t N = moe::static_blocks(T, k, E, B), nbt = ceil_div(N, P);
  const DType dt = x.dtype();
  Tensor out = nl::ndarray({T, H}, dt, nl::shared_hbm, "out");
  Tensor indices = nl::ndarray({E, W}, nl::int32, nl::hbm, "expert_tokens");
  Tensor counts = nl::ndarray({E}, nl::int32, nl::hbm, "expert_token_counts");
  // Affinities a[t, e] at e * T + t: one runtime offset (the expert) plus one per partition (the token).
  Tensor affinity = nl::ndarray({E * T, 1}, nl::float32, nl::hbm, "affinities_by_expert");

  // The expert phase's budget also holds the block metadata the routing phase writes.
  toolkit::Budget expert_budget(check);
  Tensor meta = expert_budget.sbuf({P, nbt, 3}, nl::int32, "block_metadata");  // token offset, expert, expert * T

  {  // Routing: mask, affinities, each expert's tokens, the blocks' metadata.
    toolkit::Budget budget(check);
    toolkit::TaskScheduler sch;
    Tensor iota_e = budget.sbuf({P, E}, nl::int32, "expert_index");
    sch.add([&] { isa::iota(iota_e, {{1, E}}); });
    toolkit::Ring ids_ring = budget.sbuf_ring({P, k}, nl::int32, 2, "expert_ids");
    toolkit::Ring idf_ring = budget.sbuf_ring({P, k}, nl::float32, 2, "expert_ids_f32");
    toolkit::Ring wts_ring = budget.sbuf_ring({P, k}, nl::float32, 2, "routing_weights");
    toolkit::Ring eq_ring = budget.sbuf_ring({P, E}, nl::float32, 2, "slot_hits");
    toolkit::Ring aff_ring = budget.sbuf_ring({P, E}, nl::float32, 2, "affinities");
    moe::nonzero_columns(
        sch, budget, check, T, E,
        [&](const Tensor& indicator, const toolkit::RowTile& rt) {
          const int64_t p = rt.p;
          const Tensor ids = ids_ring.next()(first(p), all), idf = idf_ring.next()(first(p), all);
          const Tensor wts = wts_ring.next()(first(p), all), aff = aff_ring.next()(first(p), all);
          const Tensor iota = iota_e(first(p), all);
          sch.add([&] { isa::dma_copy(ids, rt.rows_view(expert_ids, 0, k)); });
          sch.add([&] { isa::dma_copy(wts, rt.rows_view(weights, 0, k)); });
          sch.add([&] { isa::tensor_copy(idf, ids, isa::vector_engine); });
          moe::slot_affinities(sch, aff, &indicator, iota, idf, wts, eq_ring);
          // Row tile rt of a, stored expert-major: element (q, e) at e * T + rt.r0 + q.
          sch.add([&] { isa::dma_copy(affinity.ap({{1, p}, {T, E}}, ApOptions{.offset = rt.r0}), aff); });
        },
        indices, counts, 0, nl::tile_size().psum_num_banks - moe::kNonzeroPsumBanks - 1);

    // blocks[e] = ceil(n_e / B) = #{j : j B < n_e}; ends[e] = blocks[0] + ... + blocks[e], on
    // every partition (a ones matrix times the upper-triangular blocks on TensorE).
    const int64_t J = ceil_div(T, B);
    Tensor cnt = budget.sbuf({E, 1}, nl::int32, "counts"), cntf = budget.sbuf({E, 1}, nl::float32, "counts_f32");
    Tensor thr = budget.sbuf({E, J}, nl::int32, "block_starts"), lt = budget.sbuf({E, J}, nl::float32, "started");
    Tensor nb = budget.sbuf({E, 1}, nl::float32, "blocks_per_expert");
    Tensor ones = budget.sbuf({E, std::max(E, P)}, nl::float32, "ones"), tri = budget.sbuf({E, E}, nl::float32, "upper");
    Tensor ends = budget.sbuf({P, E}, nl::float32, "expert_block_ends");
    // The routing phase's PSUM goes in the last banks, so that the expert phase finds the rest
    // in one piece (its accumulators take six banks).
    toolkit::Ring ends_ps = moe::psum_ring_at(budget, P, E, nl::float32, 1, nl::tile_size().psum_num_banks - 1, "ends_psum");
    sch.add([&] { isa::dma_copy(cnt, counts.reshape({E, 1})); });
    sch.add([&] { isa::tensor_copy(cntf, cnt, isa::vector_engine); });
    sch.add([&] { isa::iota(thr, {{B, J}}); });
    sch.add([&] { isa::tensor_scalar(lt, thr, nl::less, cntf); });
    sch.add([&] { isa::tensor_reduce(nb, nl::add, lt, {1}); });
    sch.add([&] { isa::memset(ones, 1.0, isa::vector_engine); });
    sch.add([&] { isa::affine_select(tri, {{1, E}}, -1, ones(all, nl::ds(0, E)), 0.0, nl::greater_equal); });
    sch.add([&] { isa::tensor_scalar(tri, tri, nl::multiply, nb); });
    const Tensor ends_acc = ends_ps.next();
    sch.add([&] { isa::nc_matmul(ends_acc, ones(all, nl::ds(0, P)), tri); });
    sch.add([&] { isa::tensor_copy(ends, ends_acc, isa::vector_engine); });

    // Block b (partition b % P, column b / P): its expert e_b = #{e : ends[e] <= b}, whose blocks
    // start at s = max(ends[e] <= b, else 0); its tokens at e_b W + (b - s) B. A block past the
    // last expert's reads the -1 padding of the last expert's row and the last expert's weights.
    const double pad = double((E - 1) * W + T);
    Tensor bi = budget.sbuf({P, 1}, nl::int32, "block_index");
    Tensor bf = budget.sbuf({P, 1}, nl::float32, "block_index_f32");
    Tensor le = budget.sbuf({P, E}, nl::float32, "ended"), se = budget.sbuf({P, E}, nl::float32, "ended_ends");
    Tensor eb = budget.sbuf({P, 1}, nl::float32, "block_expert"), st = budget.sbuf({P, 1}, nl::float32, "expert_start");
    Tensor off = budget.sbuf({P, 1}, nl::float32, "token_offset"), used = budget.sbuf({P, 1}, nl::float32, "used");
    Tensor ew = budget.sbuf({P, 1}, nl::float32, "weights_expert");
    for (int64_t c = 0; c < nbt; ++c) {
      sch.add([&] { isa::iota(bi, {{0, 1}}, c * P, 1); });
      sch.add([&] { isa::tensor_copy(bf, bi, isa::vector_engine); });
      sch.add([&] { isa::tensor_scalar(le, ends, nl::less_equal, bf); });
      sch.add([&] { isa::tensor_reduce(eb, nl::add, le, {1}); });
      sch.add([&] { isa::tensor_tensor(se, ends, le, nl::multiply); });
      sch.add([&] { isa::tensor_reduce(st, nl::maximum, se, {1}); });
      sch.add([&] { isa::tensor_tensor(st, bf, st, nl::subtract); });
      sch.add([&] { isa::tensor_scalar(st, st, nl::multiply, double(B)); });
      sch.add([&] { isa::scalar_tensor_tensor(off, eb, nl::multiply, double(W), nl::add, st); });
      sch.add([&] { isa::tensor_scalar(used, eb, nl::less, double(E)); });
      sch.add([&] { isa::scalar_tensor_tensor(off, off, nl::subtract, pad, nl::multiply, used); });
      sch.add([&] { isa::tensor_scalar(off, off, nl::add, pad); });
      sch.add([&] { isa::tensor_scalar(ew, eb, nl::minimum, double(E - 1)); });
      sch.add([&] { isa::tensor_copy(meta(all, c, nl::ds(0, 1)), off, isa::vector_engine); });
      sch.add([&] { isa::tensor_copy(meta(all, c, nl::ds(1, 1)), ew, isa::vector_engine); });
      sch.add([&] { isa::tensor_scalar(meta(all, c, nl::ds(2, 1)), ew, nl::multiply, double(T)); });
    }
    sch.run();
  }

  // Experts: out = 0, then each block through its expert's MLP, scaled and added into out.
  toolkit::TaskScheduler sch;
  Tensor zeros = expert_budget.sbuf({P, std::clamp<int64_t>(T * H / P, 1, 512)}, dt, "zeros");
  sch.add_any({[&] { isa::memset(zeros, 0.0, isa::gpsimd_engine); }, [&] { isa::memset(zeros, 0.0, isa::vector_engine); }});
  gather::fill_from(sch, out, zeros);
  mlp::GatedBlocks blocks(expert_budget, check, H, I, dt, act, B, B, false);
  const int64_t tiles_per_block = B / P;
  toolkit::Ring tok_ring = expert_budget.sbuf_ring({P, 1}, nl::int32, 2 * tiles_per_block, "block_tokens");
  toolkit::Ring aff_ring = expert_budget.sbuf_ring({P, 1}, nl::float32, 2 * tiles_per_block, "block_affinities");
  const std::vector<toolkit::RowTile> tiles = toolkit::row_tiles(B, P);
  for (int64_t b = 0; b < N; ++b) {
    auto field = [&](int64_t f) { return meta(nl::ds(b % P, 1), nl::ds(b / P, 1), nl::ds(f, 1)); };
    const Tensor tok_offset = field(0), expert = field(1), expert_T = field(2);
    std::vector<Tensor> toks, affs;
    for (size_t i = 0; i < tiles.size(); ++i) toks.push_back(tok_ring.next()), affs.push_back(aff_ring.next());
    mlp::GatedBlocks::Io io{
        .load_rows =
            [&](const Tensor& rows, size_t i) {
              const Tensor tok = toks[i], aff = affs[i];
              sch.add([&] {
                isa::dma_copy(tok, indices.ap({{1, P}, {1, 1}}, ApOptions{.offset = int64_t(i) * P,
                                                                          .scalar_offset_tensor = tok_offset,
                                                                          .indirect_dim = 1}));
              });
              sch.add_any({[&] { isa::memset(rows, 0.0, isa::gpsimd_engine); },
                           [&] { isa::memset(rows, 0.0, isa::vector_engine); }});
              sch.add([&] { gather::gather(rows, x, tok, 0, gather::OutOfRange::skip); });
              sch.add_any({[&] { isa::memset(aff, 0.0, isa::gpsimd_engine); },
                           [&] { isa::memset(aff, 0.0, isa::vector_engine); }});
              sch.add([&] {
                isa::dma_copy(aff,
                              affinity.ap({{1, P}, {1, 1}}, ApOptions{.scalar_offset_tensor = expert_T,
                                                                      .vector_offset = tok, .indirect_dim = 0}),
                              {.oob_skip = true});
              });
            },
        .w_gate = mlp::expert_blocks(w_gate, expert),
        .w_up = mlp::expert_blocks(w_up, expert),
        .w_down = mlp::expert_blocks(w_down, expert),
        .b_gate = std::nullopt,
        .b_up = std::nullopt,
        .b_down = std::nullopt,
        .leave_psum =
            [&](const Tensor& o, const Tensor& acc, size_t i, int64_t) {
              sch.add([&] { isa::tensor_scalar(o, acc, nl::multiply, affs[i], {.engine = isa::vector_engine}); });
            },
        .store = [&](const Tensor& o, size_t i, int64_t c0) { sch.add([&] { gather::scatter_add(out, toks[i], o, c0); }); },
    };
    blocks.run(sch, tiles, io);
  }
  sch.run();
  return out;
}


inline KernelInfo moe_prefill_info() {
  using moe::routed_case;
  using reference::GateActivation;
  const DType f32 = DType::float32, bf16 = DType::bfloat16, f16 = DType::float16;
  const GateActivation silu = GateActivation::silu;
  return KernelInfo{
      .name = "moe_prefill",
      .summary = "mixture-of-experts prefill, dropless and blockwise: routing metadata on the device, each block of an "
                 "expert's tokens through its gated MLP, combined with the routing weights",
      .doc = moe_prefill_doc,
      .inputs = {"x", "expert_ids", "weights", "w_gate", "w_up", "w_down"},
      .outputs = {"out"},
      .params = {{"activation", ParamKind::integer, 0, "the gate's activation: 0 silu, 1 gelu, 2 gelu (tanh form)"},
                 {"block_size", ParamKind::integer, 0, "tokens per block: 128, 256 or 512 (0: the kernel chooses)"}},
      .dtypes = {f32, bf16, f16, DType::int32},
      .backward = "",
      .gradient = "forward only: no backward kernel yet (nikki.torch.moe_prefill is not differentiable)",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{
                moe_prefill(c.inputs, GateActivation(c.integer("activation")), c.integer("block_size"))};
          },
      .reference = moe::routed_reference,
      .make_inputs = moe::routed_inputs,
      .examples = {routed_case(1, 8, 16, 1, 1, f32, silu, {"block_size", 0}, "one token, one expert"),
                   routed_case(130, 72, 200, 8, 2, bf16, silu, {"block_size", 128}, "Mixtral's 8 experts top-2, tails"),
                   routed_case(300, 64, 96, 6, 3, f32, GateActivation::gelu, {"block_size", 128}, "three blocks per expert, gelu"),
                   routed_case(200, 40, 48, 5, 4, f16, GateActivation::gelu_tanh, {"block_size", 256}, "top-4, blocks of 256"),
                   routed_case(260, 32, 64, 4, 2, f32, silu, {"block_size", 0}, "the kernel's block size")},
      .draw =
          [](CaseRng& r) {
            const int64_t E = r.uniform(1, 12), k = r.uniform(1, std::min<int64_t>(E, 8));
            return routed_case(r.size(1, 600), r.size(1, 200), r.size(1, 300), E, k, r.pick({f32, bf16, f16}),
                                r.pick({silu, GateActivation::gelu, GateActivation::gelu_tanh}),
                                {"block_size", double(r.pick<int64_t>({0, 128, 256}))}, "drawn");
          },
      .tolerance =
          [](const ExampleCase& c) {
            // As gated_mlp per expert; 16-bit outputs are also rounded once per added expert.
            const DType d = c.inputs[0].dtype;
            if (d == DType::float32) return Tolerance{1e-4, 1e-4};
            const Tolerance t = dtype_tolerance(d);
            return Tolerance{t.rtol * 2, t.atol * double(c.inputs[1].shape[1] + 1)};
          },
      .benchmark = Benchmark{routed_case(4096, 4096, 14336, 8, 2, bf16, silu, {"block_size", 0},
                                          "T=4096 E=8 top-2 H=4096 I=14336 bf16, balanced"),
                             Bound::tensor_engine,
                             [](const ExampleCase& c) {
                               const double T = double(c.inputs[0].shape[0]), H = double(c.inputs[0].shape[1]),
                                            I = double(c.inputs[3].shape[2]), k = double(c.inputs[1].shape[1]);
                               return 6 * T * k * H * I;
                             },
                             0.70},
  };
}

}  // namespace nikki::kernels
