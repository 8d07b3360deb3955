// Mamba's selective scan (the selective state-space model of mamba_ssm's selective_scan_fn):
// per channel d and state n, h_t = exp(dt_t A[d, n]) h_{t-1} + dt_t Bm[n, t] u_t and
// y_t = sum_n Cm[n, t] h_t + Dskip[d] u_t, optionally gated by silu(z).
//
// Channels go on partitions and time along the free dim, as u [B, D, L] lies in memory; the
// state dimension is an outer loop, each state one VectorE tensor_tensor_scan over the chunk
// (the first-order recurrence of linear_recurrence). Bm and Cm rows are the same for every
// channel: one DMA per chunk broadcasts them across partitions, shared by every channel tile.
// VectorE's scan is the bound (2 cycles per channel, state and step); the element-wise products
// around it go to VectorE or GpSimd, the exponentials to ScalarE, and the sum over states
// accumulates on the Tensor engine (identity matmuls into one PSUM bank).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nikki/kernels/conv/causal_conv1d.hpp"
#include "nikki/kernels/scan/linear_recurrence.hpp"
#include "nikki/kernels/scan/selective_scan_reference.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* selective_scan_doc = R"(Mamba's selective scan (mamba_ssm's selective_scan_fn): y and the last state of a selective state-space model.

Dimensions: u [B, D, L], delta [B, D, L], A [D, N], Bm [B, N, L], Cm [B, N, L], Dskip [D],
            z [B, D, L], delta_bias [D], h0 [B, D, N] -> y [B, D, L], last_state [B, D, N];
            any B, D, L >= 1, 1 <= N <= 64.
Args:       u, delta, Bm, Cm, z: HBM tensors of one dtype, float32 / bfloat16 / float16.
            A, Dskip, delta_bias, h0: float32 or u's dtype (Mamba keeps them in fp32).
            Dskip: the skip connection (zeros for none); delta_bias: added to delta (zeros for
            none); h0: the state before the first step (zeros for none).
            delta_softplus: dt = softplus(delta + delta_bias) instead of delta + delta_bias.
            gate: multiply y by silu(z); z is not read otherwise (pass any tensor of u's shape).
Returns:    y, u's dtype; last_state, float32.
Notes:      Channels on partitions (tiles of 128), time in chunks of up to 512 steps; the
            states of every channel tile are kept in fp32 across chunks. Per chunk, one DMA
            broadcasts Bm and one Cm across partitions for all channel tiles. Per channel tile:
            ScalarE computes dt (bias, softplus) and, per state, exp(dt A[:, n]); dt u, dt u Bm
            and h Cm are element-wise products on VectorE or GpSimd; one VectorE
            tensor_tensor_scan per state runs the recurrence in fp32 from the carried state;
            identity matmuls sum h Cm over the states in fp32 PSUM; y = that + Dskip u (times
            silu(z)) is rounded once. VectorE-bound: its scan costs 2 cycles per (channel,
            state, step).
Pseudocode: dt = delta + delta_bias[:, None]; dt = softplus(dt) if delta_softplus
            h[n, t] = exp(dt[t] * A[:, n]) * h[n, t - 1] + dt[t] * Bm[n, t] * u[t]   (h[n, -1] = h0[:, n])
            y[t] = sum_n Cm[n, t] * h[n, t] + Dskip * u[t];  y *= silu(z) if gate
            last_state = h[:, L - 1])";

namespace selective {

/** The most states: Mamba uses 16; the broadcast Bm and Cm of a chunk hold N rows per partition. */
inline constexpr int64_t kMaxStates = 64;
/** Steps per chunk: one PSUM bank of fp32 sums over the states. */
inline constexpr int64_t kMaxChunk = 512;

/** The sizes of one call. */
struct ScanShape {
  int64_t B, D, L, N;
};

inline ScanShape check_selective_scan(const ArgumentCheck& check, const std::vector<const Tensor*>& in) {
  const Tensor &u = *in[0], &delta = *in[1], &A = *in[2], &Bm = *in[3], &Cm = *in[4], &Dskip = *in[5], &z = *in[6],
               &delta_bias = *in[7], &h0 = *in[8];
  const DType dt = u.dtype();
  check.require(u.ndim() == 3, "u must be 3-D [batch, channels, length], got " + u.shape().str(),
                "pass u, delta and z as [B, D, L] with time last");
  check.require(dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16,
                "u must be float32, bfloat16 or float16, got " + std::string(dtype_name(dt)));
  const int64_t B = u.shape()[0], D = u.shape()[1], L = u.shape()[2];
  check.require(A.ndim() == 2 && A.shape()[0] == D,
                "A must be [channels, states] with u's " + std::to_string(D) + " channels, got " + A.shape().str());
  const int64_t N = A.shape()[1];
  if (N > kMaxStates)
    check.fail("A has " + std::to_string(N) + " states, more than the limit",
               "at most " + std::to_string(kMaxStates) + " states (the broadcast Bm and Cm rows of a chunk stay in SBUF)",
               "split the states into groups of at most " + std::to_string(kMaxStates) + " and add the y of each group");
  const struct {
    const Tensor* t;
    Shape shape;
    const char* meaning;
  } expected[] = {{&delta, u.shape(), "u's shape"},
                  {&z, u.shape(), "u's shape"},
                  {&Bm, Shape{B, N, L}, "[batch, states, length]"},
                  {&Cm, Shape{B, N, L}, "[batch, states, length]"},
                  {&Dskip, Shape{D}, "one per channel"},
                  {&delta_bias, Shape{D}, "one per channel"},
                  {&h0, Shape{B, D, N}, "[batch, channels, states]"}};
  for (const auto& e : expected)
    check.require(e.t->shape() == e.shape, "'" + e.t->name() + "' must be " + e.shape.str() + " (" + e.meaning +
                                                "), got " + e.t->shape().str());
  for (const Tensor* t : {&delta, &Bm, &Cm, &z})
    check.require(t->dtype() == dt, "'" + t->name() + "' must have u's dtype " + std::string(dtype_name(dt)) +
                                         ", got " + std::string(dtype_name(t->dtype())));
  for (const Tensor* t : {&A, &Dskip, &delta_bias, &h0})
    check.require(t->dtype() == dt || t->dtype() == DType::float32,
                  "'" + t->name() + "' must be float32 or u's dtype " + std::string(dtype_name(dt)) + ", got " +
                      std::string(dtype_name(t->dtype())));
  return {B, D, L, N};
}

/** The per-chunk maths of the selective scan, one engine each. */
struct SelectiveMath {
  /** dt = delta + bias (softplus'd), fp32, on ScalarE. */
  static void step_sizes(const Tensor& dt, const Tensor& delta, const Tensor& bias, bool softplus) {
    isa::activation(dt, softplus ? nl::softplus : nl::copy, delta, {.bias = bias});
  }
  /** decay = exp(dt * a) with a one column of A ([p, 1]), on ScalarE. */
  static void decay(const Tensor& decay, const Tensor& dt, const Tensor& a) {
    isa::activation(decay, nl::exp, dt, {.scale = a});
  }
  /** dst = x * y element-wise, on VectorE or GpSimd. */
  static void product(const Tensor& dst, const Tensor& x, const Tensor& y, Engine engine) {
    isa::tensor_tensor(dst, x, y, nl::multiply, engine);
  }
  /** skip = u * dskip ([p, 1] dskip) in fp32, on ScalarE. */
  static void skip(const Tensor& skip, const Tensor& u, const Tensor& dskip) {
    isa::activation(skip, nl::copy, u, {.scale = dskip});
  }
  /** sums (+)= terms through an identity matmul: the Tensor engine adds in fp32 PSUM. */
  static void accumulate(const Tensor& sums, const Tensor& identity, const Tensor& terms, bool first) {
    isa::nc_matmul(sums, identity, terms, {.accumulate = !first});
  }
};

}  // namespace selective

/** @brief (y, last_state) of Mamba's selective scan; see selective_scan_doc. */
inline std::vector<Tensor> selective_scan(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& Bm,
                                          const Tensor& Cm, const Tensor& Dskip, const Tensor& z,
                                          const Tensor& delta_bias, const Tensor& h0,
                                          const reference::SelectiveScanOptions& o, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("selective_scan", u, loc);
  const selective::ScanShape s =
      selective::check_selective_scan(check, {&u, &delta, &A, &Bm, &Cm, &Dskip, &z, &delta_bias, &h0});
  const DType dt = u.dtype();
  const int64_t P = nl::tile_size().pmax, es = dtype_size(dt), N = s.N;
  std::vector<Tensor> outs{nl::ndarray({s.B, s.D, s.L}, dt, nl::shared_hbm, "y"),
                           nl::ndarray({s.B, s.D, N}, nl::float32, nl::shared_hbm, "last_state")};
  const std::vector<conv::ChannelTile> tiles = conv::channel_tiles(s.D, P);
  const int64_t T = int64_t(tiles.size());

  // Per partition: the fp32 states of every channel tile, the per-channel operands, the
  // broadcast Bm and Cm of two chunks, and per channel tile in flight its inputs and temporaries.
  constexpr int64_t kDepth = 2, kPerState = 3;
  toolkit::Budget budget(check);
  const Tensor states = budget.sbuf({P, T, N}, nl::float32, "states");
  const Tensor columns = budget.sbuf({P, T, N + 2}, nl::float32, "channel_operands");  // A | Dskip | bias
  const Tensor eye = budget.sbuf({P, P}, nl::float32, "identity");
  const Tensor ones = budget.sbuf({P, P}, nl::float32, "ones");
  // Bytes per step in flight: Bm and Cm broadcasts; u, delta, z and y tiles; four fp32 chunk
  // temporaries (dt, dt u, silu(z), y) and four per state (decay, input, h, Cm h).
  const int64_t per_step = 2 * kDepth * N * es + kDepth * (4 * es + 4 * 4) + kPerState * 4 * 4;
  const int64_t W = std::min(s.L, budget.largest({selective::kMaxChunk, 256, 128, 64}, [&](int64_t w) { return w * per_step; })
                                      .value_or(64));
  toolkit::Ring b_ring = budget.sbuf_ring({P, N, W}, dt, kDepth, "Bm_broadcast");
  toolkit::Ring c_ring = budget.sbuf_ring({P, N, W}, dt, kDepth, "Cm_broadcast");
  toolkit::Ring u_ring = budget.sbuf_ring({P, W}, dt, kDepth, "u_tile");
  toolkit::Ring delta_ring = budget.sbuf_ring({P, W}, dt, kDepth, "delta_tile");
  toolkit::Ring z_ring = budget.sbuf_ring({P, W}, dt, kDepth, "z_tile");
  toolkit::Ring y_ring = budget.sbuf_ring({P, W}, dt, kDepth, "y_tile");
  toolkit::Ring dt_ring = budget.sbuf_ring({P, W}, nl::float32, kDepth, "step_sizes");
  toolkit::Ring du_ring = budget.sbuf_ring({P, W}, nl::float32, kDepth, "dt_u");
  toolkit::Ring decay_ring = budget.sbuf_ring({P, W}, nl::float32, kPerState, "decay");
  toolkit::Ring input_ring = budget.sbuf_ring({P, W}, nl::float32, kPerState, "dt_u_Bm");
  toolkit::Ring h_ring = budget.sbuf_ring({P, W}, nl::float32, kPerState, "state_steps");
  toolkit::Ring ch_ring = budget.sbuf_ring({P, W}, nl::float32, kPerState, "Cm_h");
  toolkit::Ring gate_ring = budget.sbuf_ring({P, W}, nl::float32, kDepth, "silu_z");
  toolkit::Ring skip_ring = budget.sbuf_ring({P, W}, nl::float32, kDepth, "dskip_u");
  toolkit::Ring sums_ring = budget.psum_ring({P, W}, nl::float32, kDepth, "state_sums");

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  sch.add([&] { conv::DepthwiseTaps::identity(eye, ones); });
  for (int64_t ti = 0; ti < T; ++ti) {
    const conv::ChannelTile& ct = tiles[size_t(ti)];
    const Slice ch = nl::ds(ct.c0, ct.p);
    const Tensor col = columns(first(ct.p), ti, all);
    sch.add([&] { isa::dma_copy(col(all, nl::ds(0, N)), A(ch, all)); });
    sch.add([&] { isa::dma_copy(col(all, nl::ds(N, 1)), Dskip(ch).reshape({ct.p, 1})); });
    sch.add([&] { isa::dma_copy(col(all, nl::ds(N + 1, 1)), delta_bias(ch).reshape({ct.p, 1})); });
  }
  const std::vector<toolkit::ColumnChunk> chunks = toolkit::column_chunks(s.L, W, 1);
  for (int64_t b = 0; b < s.B; ++b)
    for (size_t k = 0; k < chunks.size(); ++k) {
      const int64_t t0 = chunks[k].c0, w = chunks[k].width;
      const Tensor bb = b_ring.next()(all, all, nl::ds(0, w)), cb = c_ring.next()(all, all, nl::ds(0, w));
      const auto broadcast = [&](const Tensor& m) { return m(b, all, nl::ds(t0, w)).expand_dim(0).broadcast(0, P); };
      sch.add([&] { isa::dma_copy(bb, broadcast(Bm)); });
      sch.add([&] { isa::dma_copy(cb, broadcast(Cm)); });
      for (int64_t ti = 0; ti < T; ++ti) {
        const conv::ChannelTile& ct = tiles[size_t(ti)];
        const int64_t p = ct.p;
        const Slice ch = nl::ds(ct.c0, p), steps = nl::ds(t0, w), cols = nl::ds(0, w);
        const Tensor col = columns(first(p), ti, all), state = states(first(p), ti, all);
        const Tensor ut = u_ring.next()(first(p), cols), deltat = delta_ring.next()(first(p), cols);
        const Tensor stepsz = dt_ring.next()(first(p), cols), du = du_ring.next()(first(p), cols);
        const Tensor sums = sums_ring.next()(first(p), cols), identity = eye(first(p), first(p));
        if (k == 0) sch.add([&] { isa::dma_copy(state, h0(b, ch, all)); });
        sch.add([&] { isa::dma_copy(ut, u(b, ch, steps)); });
        sch.add([&] { isa::dma_copy(deltat, delta(b, ch, steps)); });
        sch.add([&] { selective::SelectiveMath::step_sizes(stepsz, deltat, col(all, nl::ds(N + 1, 1)), o.delta_softplus); });
        sch.add_any({[&] { selective::SelectiveMath::product(du, stepsz, ut, Engine::vector); },
                     [&] { selective::SelectiveMath::product(du, stepsz, ut, Engine::gpsimd); }});
        for (int64_t n = 0; n < N; ++n) {
          const Tensor decay = decay_ring.next()(first(p), cols), input = input_ring.next()(first(p), cols);
          const Tensor h = h_ring.next()(first(p), cols), chp = ch_ring.next()(first(p), cols);
          const Tensor bn = bb(first(p), n, all), cn = cb(first(p), n, all), carry = state(all, nl::ds(n, 1));
          sch.add([&] { selective::SelectiveMath::decay(decay, stepsz, col(all, nl::ds(n, 1))); });
          sch.add_any({[&] { selective::SelectiveMath::product(input, du, bn, Engine::vector); },
                       [&] { selective::SelectiveMath::product(input, du, bn, Engine::gpsimd); }});
          sch.add([&] { recurrence::RecurrenceMath::scan(h, decay, input, isa::Scalar(carry)); });
          sch.add([&] { isa::activation(carry, nl::copy, h(all, nl::ds(w - 1, 1))); });
          sch.add_any({[&] { selective::SelectiveMath::product(chp, h, cn, Engine::vector); },
                       [&] { selective::SelectiveMath::product(chp, h, cn, Engine::gpsimd); }});
          sch.add([&] { selective::SelectiveMath::accumulate(sums, identity, chp, n == 0); });
        }
        // y = sums + Dskip u: ScalarE scales u, the Tensor engine adds it to the sums; then the
        // gate (VectorE reads the PSUM sums at one cycle per element) or ScalarE's rounding.
        const Tensor yt = y_ring.next()(first(p), cols), skip = skip_ring.next()(first(p), cols);
        sch.add([&] { selective::SelectiveMath::skip(skip, ut, col(all, nl::ds(N, 1))); });
        sch.add([&] { selective::SelectiveMath::accumulate(sums, identity, skip, false); });
        if (o.gate) {
          const Tensor zt = z_ring.next()(first(p), cols), gate = gate_ring.next()(first(p), cols);
          sch.add([&] { isa::dma_copy(zt, z(b, ch, steps)); });
          sch.add([&] { isa::activation(gate, nl::silu, zt); });
          sch.add([&] { selective::SelectiveMath::product(yt, sums, gate, Engine::vector); });
        } else {
          sch.add([&] { isa::activation(yt, nl::copy, sums); });
        }
        sch.add([&] { isa::dma_copy(outs[0](b, ch, steps), yt); });
        if (k + 1 == chunks.size()) sch.add([&] { isa::dma_copy(outs[1](b, ch, all), state); });
      }
    }
  sch.run();
  return outs;
}

namespace selective {

/** Inputs of a case: u, delta, A, Bm, Cm, Dskip, z, delta_bias, h0 (A, Dskip, delta_bias, h0 in
 *  fp32 as Mamba keeps them, or all in `dt` when `params_fp32` is false). */
inline ExampleCase scan_case(int64_t B, int64_t D, int64_t L, int64_t N, DType dt, bool softplus, bool gate,
                             bool params_fp32, std::string label) {
  const DType pd = params_fp32 ? DType::float32 : dt;
  return ExampleCase{{spec({B, D, L}, dt), spec({B, D, L}, dt), spec({D, N}, pd), spec({B, N, L}, dt),
                      spec({B, N, L}, dt), spec({D}, pd), spec({B, D, L}, dt), spec({D}, pd), spec({B, D, N}, pd)},
                     {{"delta_softplus", softplus ? 1.0 : 0.0}, {"gate", gate ? 1.0 : 0.0}},
                     std::move(label)};
}

/**
 * Mamba's value ranges: A negative (-exp of a normal, so decays exp(dt A) lie in (0, 1)), delta
 * small positive before the softplus (around softplus^-1 of 0.001..0.1) or a step size itself,
 * the rest standard normal scaled down so that y stays O(1) over N states; the optional inputs
 * each left out a third of the time.
 */
inline std::vector<RefTensor> scan_inputs(const ExampleCase& c, CaseRng& rng) {
  std::vector<RefTensor> in;
  for (const TensorSpec& s : c.inputs) in.push_back(random_input(s, rng, 0.5));
  const bool softplus = c.params.find("delta_softplus").value_or(0) != 0;
  for (double& v : in[1].data) {
    const double step = std::exp(-4.5 + 1.5 * std::tanh(rng.normal()));  // ~0.001 .. 0.05
    v = round_to(c.inputs[1].dtype, softplus ? std::log(std::expm1(step)) : step);
  }
  for (double& v : in[2].data) v = round_to(c.inputs[2].dtype, -std::exp(0.5 * rng.normal()));
  for (double& v : in[7].data) v = round_to(c.inputs[7].dtype, softplus ? 0.5 * rng.normal() : 0.01 * std::abs(rng.normal()));
  // Dskip, delta_bias and h0 are each left out (zeros) a third of the time.
  for (size_t i : {size_t(5), size_t(7), size_t(8)})
    if (rng.coin(1.0 / 3)) in[i] = RefTensor(c.inputs[i].shape);
  return in;
}

inline std::vector<ExampleCase> scan_examples() {
  return {scan_case(1, 1, 1, 1, DType::float32, false, false, true, "tiny"),
          scan_case(2, 130, 600, 16, DType::bfloat16, true, true, true,
                    "Mamba's options: softplus, gate; channel and length tails"),
          scan_case(1, 64, 1100, 4, DType::float32, false, false, false, "no softplus, no gate, chunks carry the state"),
          scan_case(2, 200, 77, 8, DType::float16, true, false, false, "float16 throughout, softplus only"),
          scan_case(1, 40, 130, 64, DType::float32, false, true, true, "N = 64 at its limit, gate only")};
}

inline ExampleCase draw_scan_case(CaseRng& r) {
  const DType dt = r.pick({DType::float32, DType::bfloat16, DType::float16});
  return scan_case(r.uniform(1, 2), r.size(1, 260), r.size(1, 1200, 512), r.coin(0.7) ? r.pick<int64_t>({1, 4, 16}) : r.uniform(1, 24),
                   dt, r.coin(), r.coin(), r.coin(), "drawn");
}

/** A Mamba-1.4B-like layer: 2 sequences of 2048 tokens, 2048 channels, 16 states, bf16. */
inline ExampleCase scan_benchmark() {
  return scan_case(2, 2048, 2048, 16, DType::bfloat16, true, true, true, "B=2, D=2048, L=2048, N=16 bf16, softplus, gate");
}

/** y sums N products rounded through fp32; 16-bit outputs one rounding: the dtype's tolerance,
 *  widened with the number of states. */
inline Tolerance scan_tolerance(const ExampleCase& c) {
  const Tolerance t = dtype_tolerance(c.inputs[0].dtype);
  const double growth = std::max(1.0, std::sqrt(double(c.inputs[2].shape[1])) / 2);
  return {t.rtol, t.atol * growth * (c.inputs[0].dtype == DType::float32 ? 10 : 1)};
}

}  // namespace selective

inline KernelInfo selective_scan_info() {
  return KernelInfo{
      .name = "selective_scan",
      .summary = "Mamba's selective scan (selective_scan_fn): y and the last state, with D skip, z gate, delta bias and softplus",
      .doc = selective_scan_doc,
      .inputs = {"u", "delta", "A", "Bm", "Cm", "Dskip", "z", "delta_bias", "h0"},
      .outputs = {"y", "last_state"},
      .params = {{"delta_softplus", ParamKind::boolean, 0, "dt = softplus(delta + delta_bias)"},
                 {"gate", ParamKind::boolean, 0, "multiply y by silu(z)"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "selective_scan_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            const auto& in = c.inputs;
            return selective_scan(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8],
                                  {.delta_softplus = c.flag("delta_softplus"), .gate = c.flag("gate")}, Loc::current());
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return reference::selective_scan(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8],
                                             {.delta_softplus = p.flag("delta_softplus"), .gate = p.flag("gate")});
          },
      .make_inputs = selective::scan_inputs,
      .examples = selective::scan_examples(),
      .draw = selective::draw_scan_case,
      .tolerance = selective::scan_tolerance,
      .benchmark = Benchmark{selective::scan_benchmark(), Bound::hbm, {}, 0},
  };
}

}  // namespace nikki::kernels
