// Backward of Mamba's selective scan: the gradients of u, delta, A, Bm, Cm, Dskip, z, delta_bias
// and h0 from grad_y and grad_last_state.
//
// With a_t = exp(dt_t A) per state, the adjoint state lambda_t = dLoss / dh_t obeys
// lambda_t = gy'_t Cm_t + a_{t+1} lambda_{t+1} (gy' = grad_y, times silu(z) with the gate), the
// forward recurrence run backwards in time. Pass 1 reruns the forward scan (one VectorE scan per
// state and chunk, as selective_scan) and keeps h in an fp32 HBM scratch; with the gate it also
// forms y (for grad_z) and gy'. Pass 2 visits the chunks from the end: per state, GpSimd reverses
// a (shifted one step) and gy' Cm along the free dim (nc_n_gather), one VectorE scan computes
// lambda reversed from the next chunk's carry, and GpSimd gathers it back. The sums over channels
// (grad_Bm, grad_Cm) are one-hot matmuls into PSUM, the sums over states (grad_u, grad_delta)
// identity matmuls, the sums over time (grad_A, grad_Dskip, grad_delta_bias) VectorE reductions.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "nikki/kernels/scan/selective_scan.hpp"

namespace nikki::kernels {

inline constexpr const char* selective_scan_bwd_doc = R"(Backward of selective_scan: the gradients of u, delta, A, Bm, Cm, Dskip, z, delta_bias and h0.

Dimensions: u, delta, z [B, D, L], A [D, N], Bm, Cm [B, N, L], Dskip, delta_bias [D], h0 [B, D, N],
            grad_y [B, D, L], grad_last_state [B, D, N] -> one gradient per input, of its shape;
            any B, D, L >= 1, 1 <= N <= 64.
Args:       the forward's inputs and options; grad_y: the gradient of the loss with respect to y,
            u's dtype; grad_last_state: with respect to last_state, float32.
Returns:    grad_u, grad_delta, grad_Bm, grad_Cm, grad_z in u's dtype; grad_A, grad_Dskip,
            grad_delta_bias, grad_h0 in the dtypes of A, Dskip, delta_bias, h0. grad_z is zeros
            without the gate.
Notes:      Pass 1 reruns the forward scan (channels on partitions, time in chunks, one VectorE
            tensor_tensor_scan per state) and stores h in an fp32 HBM scratch; with the gate it
            also forms y' = sum_n Cm h + Dskip u, grad_z and gy' = grad_y silu(z) (fp32 scratch).
            Pass 2 visits the chunks from the end: per state, ScalarE recomputes the decays,
            GpSimd reverses them (shifted one step) and gy' Cm with nc_n_gather, one VectorE scan
            runs lambda backwards from the next chunk's fp32 carry, and GpSimd gathers it back
            into time order. grad_Bm and grad_Cm sum over channels as one-hot matmuls into fp32
            PSUM; grad_u and grad_delta sum over states as identity matmuls; grad_A, grad_Dskip
            and grad_delta_bias are fp32 free-dim reductions summed over chunks and batches.
            Every gradient is rounded once. Bound: VectorE, two scans per (channel, state, step)
            at 2 cycles each, besides its share of the element-wise products.
Pseudocode: dt, a[n] = exp(dt * A[:, n]), h as the forward; gy' = grad_y * silu(z) if gate
            lam[n, L - 1] = gy'[L - 1] Cm[n, L - 1] + grad_last_state[n]
            lam[n, t] = gy'[t] Cm[n, t] + a[n, t + 1] lam[n, t + 1]
            grad_Cm[n, t] = sum_d gy' h[n, t];  grad_Bm[n, t] = sum_d lam[n, t] dt[t] u[t]
            rho[n, t] = lam[n, t] a[n, t] h[n, t - 1];  grad_A[:, n] = sum_t rho[n, t] dt[t]
            grad_u = dt sum_n lam Bm + Dskip gy';  grad_dt = u sum_n lam Bm + sum_n A[:, n] rho[n]
            grad_delta = grad_dt * sigmoid(delta + delta_bias) if delta_softplus else grad_dt
            grad_delta_bias = sum_t grad_delta; grad_Dskip = sum_t gy' u; grad_h0 = a[0] lam[0]
            grad_z = grad_y * y' * silu'(z) if gate (y' before the gate) else 0)";

namespace selective {

/** The element-wise steps of the backward that are not the forward's, an engine each. */
struct SelectiveGrad {
  /** sums[:, 0] += the free-dim sum of `terms` (fp32), on VectorE through a [p, 1] partial. */
  static void add_row_sums(const Tensor& sums, const Tensor& partial, const Tensor& terms) {
    isa::tensor_reduce(partial, nl::add, terms, {1});
    isa::tensor_tensor(sums, sums, partial, nl::add, Engine::vector);
  }
  /** dst = src * column ([p, 1]) on ScalarE. */
  static void scale(const Tensor& dst, const Tensor& src, const Tensor& column) {
    isa::activation(dst, nl::copy, src, {.scale = column});
  }
};

}  // namespace selective

/** @brief The nine gradients of selective_scan; see selective_scan_bwd_doc. */
inline std::vector<Tensor> selective_scan_bwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& Bm,
                                              const Tensor& Cm, const Tensor& Dskip, const Tensor& z,
                                              const Tensor& delta_bias, const Tensor& h0, const Tensor& grad_y,
                                              const Tensor& grad_last_state, const reference::SelectiveScanOptions& o,
                                              Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using selective::SelectiveGrad;
  using selective::SelectiveMath;
  using toolkit::first;
  const ArgumentCheck check("selective_scan_bwd", u, loc);
  const selective::ScanShape s =
      selective::check_selective_scan(check, {&u, &delta, &A, &Bm, &Cm, &Dskip, &z, &delta_bias, &h0});
  const DType dt = u.dtype(), f32 = nl::float32;
  check.require(grad_y.shape() == u.shape() && grad_y.dtype() == dt,
                "grad_y must be y's " + u.shape().str() + " " + std::string(dtype_name(dt)) + ", got " +
                    grad_y.shape().str() + " " + std::string(dtype_name(grad_y.dtype())));
  const Shape state_shape{s.B, s.D, s.N};
  check.require(grad_last_state.shape() == state_shape && grad_last_state.dtype() == f32,
                "grad_last_state must be last_state's " + state_shape.str() + " float32, got " +
                    grad_last_state.shape().str() + " " + std::string(dtype_name(grad_last_state.dtype())));
  const int64_t P = nl::tile_size().pmax, es = dtype_size(dt), N = s.N;
  std::vector<Tensor> outs;
  for (const Tensor* t : {&u, &delta, &A, &Bm, &Cm, &Dskip, &z, &delta_bias, &h0})
    outs.push_back(nl::ndarray(t->shape(), t->dtype(), nl::shared_hbm, "grad_" + t->name()));
  const Tensor &grad_u = outs[0], &grad_delta = outs[1], &grad_A = outs[2], &grad_Bm = outs[3], &grad_Cm = outs[4],
               &grad_Dskip = outs[5], &grad_z = outs[6], &grad_bias = outs[7], &grad_h0 = outs[8];
  // h with h0 in front ([B, D, N, L + 1]: the previous state of step t is column t) and gy'.
  const Tensor states_hbm = nl::ndarray({s.B, s.D, N, s.L + 1}, f32, nl::hbm, "states");
  const Tensor gy_hbm = o.gate ? nl::ndarray(u.shape(), f32, nl::hbm, "gated_grad") : grad_y;
  const std::vector<conv::ChannelTile> tiles = conv::channel_tiles(s.D, P);
  const int64_t T = int64_t(tiles.size());

  constexpr int64_t kDepth = 2, kWork = 3;
  toolkit::Budget budget(check);
  const Tensor states = budget.sbuf({P, T, N}, f32, "states");
  const Tensor carries = budget.sbuf({P, T, N}, f32, "adjoint_carries");
  const Tensor columns = budget.sbuf({P, T, N + 2}, f32, "channel_operands");  // A | Dskip | bias
  const Tensor sums = budget.sbuf({P, T, N + 2}, f32, "time_sums");            // grad A | Dskip | bias
  const Tensor eye = budget.sbuf({P, P}, f32, "identity");
  const Tensor ones = budget.sbuf({P, P}, f32, "ones");
  const Tensor one_hot = budget.sbuf({P, N, N}, f32, "one_hot");  // [:, n, :] selects row n
  // Bytes per step in flight: the broadcast Bm and Cm; u, delta, z, grad_y and result tiles;
  // fp32 chunk temporaries and per-state temporaries; the two gather index rows.
  const int64_t per_step = 2 * kDepth * N * es + (8 * kDepth + 3) * es + (10 * kDepth + 12 * kWork + 2) * 4;
  const int64_t W = std::min(s.L, budget.largest({selective::kMaxChunk, 256, 128, 64}, [&](int64_t w) {
    return w * per_step;
  }).value_or(64));
  toolkit::Ring b_ring = budget.sbuf_ring({P, N, W}, dt, kDepth, "Bm_broadcast");
  toolkit::Ring c_ring = budget.sbuf_ring({P, N, W}, dt, kDepth, "Cm_broadcast");
  toolkit::Ring in_ring = budget.sbuf_ring({P, W}, dt, 4 * kDepth, "input_tiles");  // u, delta, z, grad_y
  toolkit::Ring out_ring = budget.sbuf_ring({P, W}, dt, 4 * kDepth, "result_tiles");
  toolkit::Ring chunk_ring = budget.sbuf_ring({P, W}, f32, 10 * kDepth, "chunk_temporaries");
  toolkit::Ring work_ring = budget.sbuf_ring({P, W}, f32, 10 * kWork, "state_temporaries");
  toolkit::Ring wide_ring = budget.sbuf_ring({P, W + 1}, f32, 2 * kWork, "state_rows");  // a | 1, h_prev | h
  toolkit::Ring column_ring = budget.sbuf_ring({P, 1}, f32, 8, "partial_sums");
  toolkit::Ring rows_ring = budget.sbuf_ring({P, std::max(W, N + 2)}, dt, 2, "grad_rows");
  const Tensor zeros = budget.sbuf({P, W}, dt, "zeros");
  const Tensor reversing = budget.sbuf({P, W}, nl::uint32, "reversing_indices");  // W - 1 - j
  const Tensor shifting = budget.sbuf({P, W}, nl::uint32, "shifted_reversing_indices");  // W - j
  toolkit::Ring sums_ring = budget.psum_ring({P, W}, f32, 1, "state_sums");
  toolkit::Ring grad_b_ring = budget.psum_ring({P, W}, f32, 1, "lambda_Bm_sums");
  toolkit::Ring grad_a_ring = budget.psum_ring({P, W}, f32, 1, "A_rho_sums");
  toolkit::Ring channel_ring = budget.psum_ring({P, W}, f32, 4, "channel_sums");  // grad_Bm, grad_Cm

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, gpsimd = Engine::gpsimd;
  const auto product = [&](const Tensor& dst, const Tensor& x, const Tensor& y) {
    sch.add_any({[&] { SelectiveMath::product(dst, x, y, vector); }, [&] { SelectiveMath::product(dst, x, y, gpsimd); }});
  };
  sch.add([&] { conv::DepthwiseTaps::identity(eye, ones); });
  sch.add([&] { isa::memset(one_hot, 0.0, gpsimd); });
  for (int64_t n = 0; n < N; ++n) sch.add([&] { isa::memset(one_hot(all, n, nl::ds(n, 1)), 1.0, gpsimd); });
  sch.add([&] { isa::memset(sums, 0.0, gpsimd); });
  sch.add([&] { isa::memset(zeros, 0.0, gpsimd); });
  sch.add([&] { isa::iota(reversing, {{-1, W}}, W - 1); });
  sch.add([&] { isa::iota(shifting, {{-1, W}}, W); });
  for (int64_t ti = 0; ti < T; ++ti) {
    const conv::ChannelTile& ct = tiles[size_t(ti)];
    const Slice ch = nl::ds(ct.c0, ct.p);
    const Tensor col = columns(first(ct.p), ti, all);
    sch.add([&] { isa::dma_copy(col(all, nl::ds(0, N)), A(ch, all)); });
    sch.add([&] { isa::dma_copy(col(all, nl::ds(N, 1)), Dskip(ch).reshape({ct.p, 1})); });
    sch.add([&] { isa::dma_copy(col(all, nl::ds(N + 1, 1)), delta_bias(ch).reshape({ct.p, 1})); });
  }
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(s.L, W, 1);
  const auto broadcast = [&](const Tensor& m, int64_t b, int64_t t0, int64_t w) {
    return m(b, all, nl::ds(t0, w)).expand_dim(0).broadcast(0, P);
  };

  // Pass 1: the forward's states into the scratch; with the gate, grad_z and gy'.
  for (int64_t b = 0; b < s.B; ++b)
    for (size_t k = 0; k < chunks.size(); ++k) {
      const int64_t t0 = chunks[k].c0, w = chunks[k].width;
      const Tensor bb = b_ring.next()(all, all, nl::ds(0, w)), cb = c_ring.next()(all, all, nl::ds(0, w));
      sch.add([&] { isa::dma_copy(bb, broadcast(Bm, b, t0, w)); });
      if (o.gate) sch.add([&] { isa::dma_copy(cb, broadcast(Cm, b, t0, w)); });
      for (int64_t ti = 0; ti < T; ++ti) {
        const conv::ChannelTile& ct = tiles[size_t(ti)];
        const int64_t p = ct.p;
        const Slice ch = nl::ds(ct.c0, p), steps = nl::ds(t0, w), cols = nl::ds(0, w);
        const Tensor col = columns(first(p), ti, all), state = states(first(p), ti, all);
        const Tensor ut = in_ring.next()(first(p), cols), deltat = in_ring.next()(first(p), cols);
        const Tensor stepsz = chunk_ring.next()(first(p), cols), du = chunk_ring.next()(first(p), cols);
        const Tensor ysum = o.gate ? sums_ring.next()(first(p), cols) : Tensor{};
        if (k == 0) {
          sch.add([&] { isa::dma_copy(state, h0(b, ch, all)); });
          sch.add([&] { isa::dma_copy(states_hbm(b, ch, all, 0), state); });
        }
        sch.add([&] { isa::dma_copy(ut, u(b, ch, steps)); });
        sch.add([&] { isa::dma_copy(deltat, delta(b, ch, steps)); });
        sch.add([&] { SelectiveMath::step_sizes(stepsz, deltat, col(all, nl::ds(N + 1, 1)), o.delta_softplus); });
        product(du, stepsz, ut);
        for (int64_t n = 0; n < N; ++n) {
          const Tensor decay = work_ring.next()(first(p), cols), input = work_ring.next()(first(p), cols);
          const Tensor h = work_ring.next()(first(p), cols), carry = state(all, nl::ds(n, 1));
          sch.add([&] { SelectiveMath::decay(decay, stepsz, col(all, nl::ds(n, 1))); });
          product(input, du, bb(first(p), n, all));
          sch.add([&] { recurrence::RecurrenceMath::scan(h, decay, input, isa::Scalar(carry)); });
          sch.add([&] { isa::activation(carry, nl::copy, h(all, nl::ds(w - 1, 1))); });
          sch.add([&] { isa::dma_copy(states_hbm(b, ch, n, nl::ds(t0 + 1, w)), h); });
          if (!o.gate) continue;
          const Tensor chp = work_ring.next()(first(p), cols);
          product(chp, h, cb(first(p), n, all));
          sch.add([&] { SelectiveMath::accumulate(ysum, eye(first(p), first(p)), chp, n == 0); });
        }
        if (!o.gate) continue;
        // y' = the sums + Dskip u; grad_z = grad_y y' silu'(z); gy' = grad_y silu(z).
        const Tensor skip = chunk_ring.next()(first(p), cols), zt = in_ring.next()(first(p), cols);
        const Tensor gyt = in_ring.next()(first(p), cols), silu = chunk_ring.next()(first(p), cols);
        const Tensor slope = chunk_ring.next()(first(p), cols), gys = chunk_ring.next()(first(p), cols);
        const Tensor yslope = chunk_ring.next()(first(p), cols), gz = out_ring.next()(first(p), cols);
        sch.add([&] { SelectiveMath::skip(skip, ut, col(all, nl::ds(N, 1))); });
        sch.add([&] { SelectiveMath::accumulate(ysum, eye(first(p), first(p)), skip, false); });
        sch.add([&] { isa::dma_copy(zt, z(b, ch, steps)); });
        sch.add([&] { isa::dma_copy(gyt, grad_y(b, ch, steps)); });
        sch.add([&] { isa::activation(silu, nl::silu, zt); });
        sch.add([&] { isa::activation(slope, nl::silu_dx, zt); });
        sch.add([&] { SelectiveMath::product(yslope, ysum, slope, vector); });
        product(gz, yslope, gyt);
        product(gys, gyt, silu);
        sch.add([&] { isa::dma_copy(grad_z(b, ch, steps), gz); });
        sch.add([&] { isa::dma_copy(gy_hbm(b, ch, steps), gys); });
      }
    }

  // Pass 2: lambda backwards in time, chunk by chunk from the end, and the gradients.
  for (int64_t b = 0; b < s.B; ++b)
    for (size_t kr = 0; kr < chunks.size(); ++kr) {
      const size_t k = chunks.size() - 1 - kr;
      const int64_t t0 = chunks[k].c0, w = chunks[k].width;
      const Slice steps = nl::ds(t0, w), cols = nl::ds(0, w);
      const Tensor bb = b_ring.next()(all, all, cols), cb = c_ring.next()(all, all, cols);
      sch.add([&] { isa::dma_copy(bb, broadcast(Bm, b, t0, w)); });
      sch.add([&] { isa::dma_copy(cb, broadcast(Cm, b, t0, w)); });
      const Tensor gB = channel_ring.next()(first(N), cols), gC = channel_ring.next()(first(N), cols);
      const Tensor rev = reversing(all, nl::ds(W - w, w)), shifted_rev = shifting(all, nl::ds(W - w, w));
      for (int64_t ti = 0; ti < T; ++ti) {
        const conv::ChannelTile& ct = tiles[size_t(ti)];
        const int64_t p = ct.p;
        const Slice ch = nl::ds(ct.c0, p);
        const Tensor col = columns(first(p), ti, all), carry_row = carries(first(p), ti, all);
        const Tensor sum_row = sums(first(p), ti, all), identity = eye(first(p), first(p));
        const Tensor ut = in_ring.next()(first(p), cols), deltat = in_ring.next()(first(p), cols);
        const Tensor gyt = chunk_ring.next()(first(p), cols), stepsz = chunk_ring.next()(first(p), cols);
        const Tensor du = chunk_ring.next()(first(p), cols);
        const Tensor sum_b = grad_b_ring.next()(first(p), cols), sum_a = grad_a_ring.next()(first(p), cols);
        if (kr == 0) sch.add([&] { isa::dma_copy(carry_row, grad_last_state(b, ch, all)); });
        sch.add([&] { isa::dma_copy(ut, u(b, ch, steps)); });
        sch.add([&] { isa::dma_copy(deltat, delta(b, ch, steps)); });
        sch.add([&] { isa::dma_copy(gyt, gy_hbm(b, ch, steps)); });
        sch.add([&] { SelectiveMath::step_sizes(stepsz, deltat, col(all, nl::ds(N + 1, 1)), o.delta_softplus); });
        product(du, stepsz, ut);
        for (int64_t n = 0; n < N; ++n) {
          const Tensor decay = wide_ring.next()(first(p), nl::ds(0, w + 1));
          const Tensor hrow = wide_ring.next()(first(p), nl::ds(0, w + 1));
          const Tensor h_prev = hrow(all, nl::ds(0, w)), h = hrow(all, nl::ds(1, w)), a = decay(all, cols);
          const Tensor carry = carry_row(all, nl::ds(n, 1)), onehot = one_hot(first(p), n, all);
          const auto work = [&] { return work_ring.next()(first(p), cols); };
          const Tensor c = work(), c_rev = work(), a_rev = work(), lam_rev = work(), lam = work();
          sch.add([&] { SelectiveMath::decay(a, stepsz, col(all, nl::ds(n, 1))); });
          sch.add([&] { isa::memset(decay(all, nl::ds(w, 1)), 1.0, gpsimd); });  // the carry is a_{t+1} lam_{t+1}
          sch.add([&] { isa::dma_copy(hrow, states_hbm(b, ch, n, nl::ds(t0, w + 1))); });
          product(c, gyt, cb(first(p), n, all));
          sch.add([&] { isa::nc_n_gather(a_rev, decay, shifted_rev(first(p), all)); });
          sch.add([&] { isa::nc_n_gather(c_rev, c, rev(first(p), all)); });
          sch.add([&] { recurrence::RecurrenceMath::scan(lam_rev, a_rev, c_rev, isa::Scalar(carry)); });
          sch.add([&] { isa::nc_n_gather(lam, lam_rev, rev(first(p), all)); });
          product(carry, a(all, nl::ds(0, 1)), lam(all, nl::ds(0, 1)));
          const Tensor gcp = work(), e = work(), f = work(), mu = work(), rho = work(), rho_a = work(), rho_dt = work();
          const bool first_term = ti == 0 && n == 0;
          product(gcp, gyt, h);
          sch.add([&] { isa::nc_matmul(gC, onehot, gcp, {.accumulate = !first_term}); });
          product(e, lam, du);
          sch.add([&] { isa::nc_matmul(gB, onehot, e, {.accumulate = !first_term}); });
          product(f, lam, bb(first(p), n, all));
          sch.add([&] { SelectiveMath::accumulate(sum_b, identity, f, n == 0); });
          product(mu, lam, a);
          product(rho, mu, h_prev);
          sch.add([&] { SelectiveGrad::scale(rho_a, rho, col(all, nl::ds(n, 1))); });
          sch.add([&] { SelectiveMath::accumulate(sum_a, identity, rho_a, n == 0); });
          product(rho_dt, rho, stepsz);
          const Tensor partial = column_ring.next()(first(p), all);
          sch.add([&] { SelectiveGrad::add_row_sums(sum_row(all, nl::ds(n, 1)), partial, rho_dt); });
        }
        // grad_u = dt sum_b + Dskip gy'; grad_dt = u sum_b + sum_a, through the softplus.
        const auto chunk_tmp = [&] { return chunk_ring.next()(first(p), cols); };
        const Tensor t1 = chunk_tmp(), skip = chunk_tmp(), t2 = chunk_tmp(), gdt = chunk_tmp(), gyu = chunk_tmp();
        const Tensor gu = out_ring.next()(first(p), cols), gd = out_ring.next()(first(p), cols);
        sch.add([&] { SelectiveMath::product(t1, sum_b, stepsz, vector); });
        sch.add([&] { SelectiveGrad::scale(skip, gyt, col(all, nl::ds(N, 1))); });
        sch.add_any({[&] { isa::tensor_tensor(gu, t1, skip, nl::add, vector); },
                     [&] { isa::tensor_tensor(gu, t1, skip, nl::add, gpsimd); }});
        sch.add([&] { isa::dma_copy(grad_u(b, ch, steps), gu); });
        sch.add([&] { SelectiveMath::product(t2, sum_b, ut, vector); });
        sch.add([&] { isa::tensor_tensor(gdt, t2, sum_a, nl::add, vector); });
        if (o.delta_softplus) {
          const Tensor slope = chunk_tmp();
          sch.add([&] { isa::activation(slope, nl::sigmoid, deltat, {.bias = col(all, nl::ds(N + 1, 1))}); });
          product(gdt, gdt, slope);
        }
        sch.add([&] { recurrence::RecurrenceMath::round_out(gd, gdt, Engine::scalar); });
        sch.add([&] { isa::dma_copy(grad_delta(b, ch, steps), gd); });
        const Tensor partial_bias = column_ring.next()(first(p), all), partial_skip = column_ring.next()(first(p), all);
        sch.add([&] { SelectiveGrad::add_row_sums(sum_row(all, nl::ds(N + 1, 1)), partial_bias, gdt); });
        product(gyu, gyt, ut);
        sch.add([&] { SelectiveGrad::add_row_sums(sum_row(all, nl::ds(N, 1)), partial_skip, gyu); });
        if (!o.gate) sch.add([&] { isa::dma_copy(grad_z(b, ch, steps), zeros(first(p), cols)); });
        if (k == 0) {
          if (h0.dtype() == f32) {
            sch.add([&] { isa::dma_copy(grad_h0(b, ch, all), carry_row); });
          } else {
            const Tensor gh0 = rows_ring.next()(first(p), nl::ds(0, N));
            sch.add([&] { isa::tensor_copy(gh0, carry_row, gpsimd); });
            sch.add([&] { isa::dma_copy(grad_h0(b, ch, all), gh0); });
          }
        }
      }
      // The channel sums of the chunk, rounded once.
      for (const auto& [psum, dst] : {std::pair{gB, grad_Bm}, std::pair{gC, grad_Cm}}) {
        const Tensor rows = rows_ring.next()(first(N), cols);
        sch.add([&] { recurrence::RecurrenceMath::round_out(rows, psum, Engine::scalar); });
        sch.add([&] { isa::dma_copy(dst(b, all, steps), rows); });
      }
    }
  // The sums over time: grad_A | grad_Dskip | grad_delta_bias per channel tile.
  for (int64_t ti = 0; ti < T; ++ti) {
    const conv::ChannelTile& ct = tiles[size_t(ti)];
    const Slice ch = nl::ds(ct.c0, ct.p);
    const Tensor sum_row = sums(first(ct.p), ti, all);
    const struct {
      const Tensor& dst;
      int64_t first, width;
    } parts[] = {{grad_A, 0, N}, {grad_Dskip, N, 1}, {grad_bias, N + 1, 1}};
    for (const auto& part : parts) {
      const Tensor rounded = rows_ring.next()(first(ct.p), nl::ds(0, part.width));
      const Tensor sum = sum_row(all, nl::ds(part.first, part.width));
      const Tensor target = part.dst.ndim() == 1 ? part.dst(ch).reshape({ct.p, 1}) : part.dst(ch, all);
      if (part.dst.dtype() == f32) {
        sch.add([&] { isa::dma_copy(target, sum); });
      } else {
        sch.add([&] { isa::tensor_copy(rounded, sum, gpsimd); });
        sch.add([&] { isa::dma_copy(target, rounded); });
      }
    }
  }
  sch.run();
  return outs;
}

namespace selective {

/** A backward case from a forward one: the forward's inputs, grad_y and grad_last_state. */
inline ExampleCase scan_bwd_case(ExampleCase forward) {
  const Shape u = forward.inputs[0].shape;
  const int64_t states = forward.inputs[2].shape[1];
  forward.inputs.push_back(spec(u, forward.inputs[0].dtype));
  forward.inputs.push_back(spec({u[0], u[1], states}, DType::float32));
  return forward;
}

/** The forward's value ranges, grad_y and grad_last_state standard normal (grad_last_state left
 *  out, as zeros, a third of the time: the common case of a loss on y only). */
inline std::vector<RefTensor> scan_bwd_inputs(const ExampleCase& c, CaseRng& rng) {
  std::vector<RefTensor> in = scan_inputs(c, rng);
  in.push_back(random_input(c.inputs[9], rng));
  in.push_back(rng.coin(1.0 / 3) ? RefTensor(c.inputs[10].shape) : random_input(c.inputs[10], rng));
  return in;
}

/** Sums over channels (grad_Bm, grad_Cm) and over time (grad_A, grad_Dskip, grad_delta_bias)
 *  of fp32 terms: the forward's tolerance widened like the square root of the longest sum. */
inline Tolerance scan_bwd_tolerance(const ExampleCase& c) {
  const Tolerance t = scan_tolerance(c);
  const Shape& u = c.inputs[0].shape;
  const double terms = double(std::max(u[1], u[0] * u[2]));
  return {t.rtol, t.atol * std::max(1.0, std::sqrt(terms) / 8)};
}

}  // namespace selective

inline KernelInfo selective_scan_bwd_info() {
  KernelInfo forward = selective_scan_info();
  std::vector<ExampleCase> examples;
  for (const ExampleCase& c : forward.examples) examples.push_back(selective::scan_bwd_case(c));
  return KernelInfo{
      .name = "selective_scan_bwd",
      .summary = "gradients of selective_scan: u, delta, A, Bm, Cm, Dskip, z, delta_bias and h0 by a reverse scan",
      .doc = selective_scan_bwd_doc,
      .inputs = {"u", "delta", "A", "Bm", "Cm", "Dskip", "z", "delta_bias", "h0", "grad_y", "grad_last_state"},
      .outputs = {"grad_u", "grad_delta", "grad_A", "grad_Bm", "grad_Cm", "grad_Dskip", "grad_z", "grad_delta_bias",
                  "grad_h0"},
      .params = forward.params,
      .dtypes = forward.dtypes,
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            const auto& in = c.inputs;
            return selective_scan_bwd(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9], in[10],
                                      {.delta_softplus = c.flag("delta_softplus"), .gate = c.flag("gate")},
                                      Loc::current());
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::selective_scan_bwd(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], in[9],
                                                 in[10],
                                                 {.delta_softplus = p.flag("delta_softplus"), .gate = p.flag("gate")});
          },
      .make_inputs = selective::scan_bwd_inputs,
      .examples = examples,
      .draw = [](CaseRng& r) { return selective::scan_bwd_case(selective::draw_scan_case(r)); },
      .tolerance = selective::scan_bwd_tolerance,
      .benchmark = Benchmark{selective::scan_bwd_case(selective::scan_benchmark()), Bound::hbm, {}, 0},
  };
}

}  // namespace nikki::kernels
