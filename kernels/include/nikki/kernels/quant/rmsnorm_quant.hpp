// RMSNorm followed by fp8 quantization, with a static scale or dynamic per-row scales.
//
// Rows map onto partitions in groups of k whole rows per partition (the norm family's RowGroup:
// one contiguous DMA run per partition). Per group:
//   ScalarE   sum(x^2) per row in its accumulator, as bn_aggr's (mean, var) = (0, sum / H)
//   GpSimd    rstd = rsqrt(mean^2 + var + eps)                   (the norm kernels' row_scalars)
//   static:   S or V  z_j = x_j * (rstd_j / scale) per row; G or V  z *= gamma (the group);
//             VectorE q = clamp(z, -qmax, qmax), rounded to fp8 on the write
//   dynamic:  V or G  z = x * gamma (the group); VectorE amax_j = max |z_j| per row, then the
//             rows' s = max(amax * rstd / qmax, FLT_MIN) and f = rstd / s;
//             S or V  q_j = z_j * f_j per row (|q| <= qmax by construction)
// and the group's q (fp8) and scales (fp32) are stored by one DMA each. RMSNorm's rstd never
// multiplies a row by itself: it folds into the per-row factor.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "nikki/kernels/norm/row_norm_forward.hpp"
#include "nikki/kernels/quant/quant_reference.hpp"

namespace nikki::kernels {

namespace quant_detail {

using toolkit::first;

/** The dtype of the quantized values: OCP float8_e4m3fn bits, saturated to Neuron's e4m3 range. */
inline constexpr DType kQuantDtype = DType::float8_e4m3fn;

/** The saturation bound: the largest finite float8_e4m3 (Trainium's fp8, which trn2's TensorE
 *  multiplies). Every value in [-qmax, qmax] has the same bits in float8_e4m3 and float8_e4m3fn. */
inline double quant_max() { return reference::largest_finite(DType::float8_e4m3); }

/** The maths of rmsnorm_quant beyond RMSNorm's statistics, an instruction group per call. */
struct QuantMath {
  double qmax;

  /** sumsq = sum(x^2) of one row in the Scalar engine's accumulator; x^2 goes to `scratch`. */
  static void sum_of_squares(const Tensor& sumsq, const Tensor& x, const Tensor& scratch) {
    isa::activation_reduce(scratch, nl::square, x, nl::add, sumsq);
  }
  /** A group's (mean, var) pairs [p, k, 2] as bn_aggr gives them, for rmsnorm's mean square
   *  mean^2 + var: (0, sumsq / H), on the Scalar engine. */
  static void as_mean_var(const Tensor& mean_var, const Tensor& sumsq, int64_t H) {
    isa::tensor_scalar(mean_var(nl::all, nl::all, 0), sumsq, nl::multiply, 0.0, {.engine = isa::scalar_engine});
    isa::tensor_scalar(mean_var(nl::all, nl::all, 1), sumsq, nl::multiply, 1.0 / double(H), {.engine = isa::scalar_engine});
  }
  /** z = x * gamma in fp32 on the Vector engine or GpSimd (gamma broadcast over the k rows). */
  static void weigh(const Tensor& z, const Tensor& x, const Tensor& gamma, Engine engine) {
    isa::tensor_tensor(z, x, gamma, nl::multiply, engine);
  }
  /** amax = max |z| of one row (VectorE's accumulator); |z| goes to `scratch`. */
  static void row_amax(const Tensor& amax, const Tensor& z, const Tensor& scratch) {
    isa::tensor_scalar_reduce(scratch, z, nl::abs, 0.0, nl::maximum, amax);
  }
  /** Dynamic scales of a group's rows ([p, k], VectorE: the engines have no divide, and GpSimd
   *  no tensor_scalar): s = max(amax * rstd / qmax, FLT_MIN), the dequantization scale, and
   *  f = min(rstd / s, FLT_MAX), the factor taking z to the fp8 grid. */
  void dynamic_scales(const Tensor& s, const Tensor& f, const Tensor& amax, const Tensor& rstd) const {
    const Engine v = isa::vector_engine;
    isa::tensor_tensor(s, amax, rstd, nl::multiply, v);
    isa::tensor_scalar(s, s, nl::multiply, 1.0 / qmax,
                       {.op1 = nl::maximum, .operand1 = reference::smallest_quant_scale(), .engine = v});
    isa::reciprocal(f, s);
    isa::tensor_tensor(f, f, rstd, nl::multiply, v);
    // An all-zero row's rstd / FLT_MIN overflows; a finite factor keeps its q at 0 (not 0 * inf).
    isa::tensor_scalar(f, f, nl::minimum, double(std::numeric_limits<float>::max()), {.engine = v});
  }
  /** dst = src * f, f a [p, 1] factor per row (Vector or Scalar engine): static scaling's
   *  x * rstd / scale, dynamic scaling's final z * f (|z * f| <= qmax by construction). */
  static void scale_rows(const Tensor& dst, const Tensor& src, const Tensor& f, Engine engine) {
    isa::tensor_scalar(dst, src, nl::multiply, f, {.engine = engine});
  }
  /** q = clamp(z, -qmax, qmax), rounded to fp8 on the write (static scaling; VectorE). */
  void saturate(const Tensor& q, const Tensor& z) const {
    isa::tensor_scalar(q, z, nl::maximum, -qmax, {.op1 = nl::minimum, .operand1 = qmax, .engine = isa::vector_engine});
  }
};

/**
 * @brief {q, scales} of rmsnorm_quant (a static `scale` [1]) or rmsnorm_quant_dynamic (no
 * scale: per-row scales from the rows' amax). See the file comment for the engine plan.
 */
inline std::vector<Tensor> rmsnorm_quant(const Tensor& x, const Tensor& gamma, const std::optional<Tensor>& scale,
                                         double eps, Loc loc) {
  const ArgumentCheck check(scale ? "rmsnorm_quant" : "rmsnorm_quant_dynamic", x, loc);
  norm_detail::check_inputs(check, x, {&gamma});
  if (scale)
    check.require(scale->shape() == Shape{1} && scale->dtype() == DType::float32,
                  "scale must be a float32 tensor of shape [1], got " + std::string(dtype_name(scale->dtype())) +
                      scale->shape().str(),
                  "pass the static dequantization scale as a one-element float32 tensor");
  check.require(eps >= 0 && std::isfinite(eps), "eps must be a finite non-negative number");
  const nl::TileSize ts = nl::tile_size();
  const int64_t P = ts.pmax, R = x.shape()[0], H = x.shape()[1], xs = dtype_size(x.dtype());
  const QuantMath math{quant_max()};
  const norm_detail::ForwardMath norm{norm_detail::Kind::rms, x.dtype()};

  Tensor q = nl::ndarray({R, H}, kQuantDtype, nl::shared_hbm, "q");
  Tensor scales = nl::ndarray({R}, nl::float32, nl::shared_hbm, "scales");

  // Rows per partition per group: ~8 KiB of x per partition per DMA, as deep as SBUF allows.
  toolkit::Budget budget(check);
  constexpr int64_t kRowValues = 7, kSlack = 8 * 1024;  // rstd, amax, s, f, row_scalars' scratch, sumsq
  constexpr int64_t kWeighPieces = 8;
  const int64_t fixed = H * dtype_size(gamma.dtype()) + 2 * 4 + kSlack;
  auto footprint = [&](int64_t k, int64_t depth) {
    return fixed + depth * k * H * (xs + dtype_size(kQuantDtype)) + 2 * k * H * 4 +
           2 * k * (2 + kRowValues) * 4 + 2 * k * 4;
  };
  const int64_t rp = std::max<int64_t>(R / P, 1);
  int64_t k = std::clamp<int64_t>(ceil_div(8 * 1024, H * xs), 1, std::min<int64_t>(rp, 64)), depth = 3;
  while (!budget.fits(footprint(k, depth)) && (k > 1 || depth > 2)) {
    if (depth > 2) depth = 2;
    else k = std::max<int64_t>(1, k / 2);
  }
  check.require(budget.fits(footprint(1, 2)),
                "rows of " + std::to_string(H) + " columns do not fit in SBUF (one row per partition, double "
                "buffered, takes " + std::to_string((footprint(1, 2) + 1023) / 1024) + " KiB per partition of " +
                std::to_string(budget.sbuf_capacity() / 1024) + " KiB)",
                "quantize narrower rows, or normalize with rmsnorm and quantize the halves of each row separately");

  const Tensor gamma_rows = budget.sbuf({P, H}, gamma.dtype(), "gamma_rows");
  toolkit::Ring x_ring = budget.sbuf_ring({P, k, H}, x.dtype(), depth, "x_tile");
  toolkit::Ring q_ring = budget.sbuf_ring({P, k, H}, kQuantDtype, depth, "q_tile");
  toolkit::Ring z_ring = budget.sbuf_ring({P, k, H}, nl::float32, 2, "z_tile");
  toolkit::Ring mv_ring = budget.sbuf_ring({P, k, 2}, nl::float32, 2, "bn_aggr");
  toolkit::Ring rows_ring = budget.sbuf_ring({P, kRowValues, k}, nl::float32, 2, "row_values");
  const Tensor consts = budget.sbuf({P, 2, k}, nl::float32, "eps_zero");
  const Tensor scale_col = budget.sbuf({P, 2}, nl::float32, "scale");  // static: scale, 1 / scale
  const Tensor static_scales = scale ? budget.sbuf({P, k}, nl::float32, "static_scales") : Tensor{};

  toolkit::TaskScheduler sch;
  const auto all = nl::all;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;
  sch.add([&] { isa::dma_copy(gamma_rows, gamma.expand_dim(0).broadcast(0, P)); });
  const Tensor eps_t = consts(all, 0, all), zero_t = consts(all, 1, all);
  sch.add([&] { isa::memset(eps_t, eps, isa::gpsimd_engine); });
  if (scale) {
    const Tensor s = scale_col(all, nl::ds(0, 1)), inv = scale_col(all, nl::ds(1, 1));
    sch.add([&] { isa::dma_copy(s, scale->expand_dim(0).broadcast(0, P)); });
    sch.add([&] { isa::reciprocal(inv, s); });
    // Every row's dequantization scale is the static one, once for all groups.
    sch.add([&] { isa::memset(static_scales, 0.0, isa::gpsimd_engine); });
    sch.add([&] { isa::tensor_scalar(static_scales, static_scales, nl::add, s, {.engine = isa::vector_engine}); });
  }

  for (const norm_detail::RowGroup& G : norm_detail::row_groups(R, P, k)) {
    const int64_t p = G.p, gk = G.k;
    const Tensor xt = x_ring.next()(first(p), first(gk), all), qt = q_ring.next()(first(p), first(gk), all);
    const Tensor z = z_ring.next()(first(p), first(gk), all);
    const Tensor mv = mv_ring.next()(first(p), first(gk), all);
    const Tensor rows = rows_ring.next()(first(p), all, first(gk));
    const Tensor rstd = rows(all, 0, all), amax = rows(all, 1, all), s = rows(all, 2, all), f = rows(all, 3, all);
    const Tensor row_scratch = rows(all, nl::ds(4, 2), all), sumsq = rows(all, 6, all);
    sch.add([&] { isa::dma_copy(xt, G.rows(x)); });
    // RMSNorm's statistics: each row's sum of squares in the Scalar engine's accumulator (x^2
    // itself lands in z, which the row's next product overwrites), as bn_aggr's (mean, var)
    // pair (0, sum / H), from which the norm kernels' row_scalars takes rstd.
    for (int64_t j = 0; j < gk; ++j)
      sch.add([&] { QuantMath::sum_of_squares(sumsq(all, nl::ds(j, 1)), xt(all, j, all), z(all, j, all)); });
    sch.add([&] { QuantMath::as_mean_var(mv, sumsq, H); });
    sch.add([&] {
      norm.row_scalars(norm_detail::RowScalars{.rstd = rstd}, mv, eps_t(first(p), first(gk)), zero_t(first(p), first(gk)),
                       row_scratch);
    });
    const Tensor gamma_k = gamma_rows(first(p), all).expand_dim(1).broadcast(1, gk);
    // The gamma product in column pieces, each on GpSimd or VectorE: the scheduler balances the
    // two engines (GpSimd is otherwise idle, VectorE also runs bn_stats and the fp8 writes).
    auto weigh = [&](const Tensor& src) {
      for (const toolkit::ColumnChunk& c : toolkit::column_chunks(H, ceil_div(H, kWeighPieces))) {
        const auto cols = nl::ds(c.c0, c.width);
        const Tensor zc = z(all, all, cols), sc = src(all, all, cols), gc = gamma_k(all, all, cols);
        sch.add_any({[&] { math.weigh(zc, sc, gc, gpsimd); }, [&] { math.weigh(zc, sc, gc, vector); }});
      }
    };
    Tensor group_scales;
    if (scale) {
      // z = (x * rstd / scale) * gamma: the row factor on the Scalar or Vector engine, gamma on
      // GpSimd or VectorE, then the saturation and the rounding to fp8 in one VectorE pass.
      const Tensor inverse = scale_col(first(p), nl::ds(1, 1));
      sch.add_any({[&] { QuantMath::scale_rows(f, rstd, inverse, vector); },
                   [&] { QuantMath::scale_rows(f, rstd, inverse, scalar); }});
      for (int64_t j = 0; j < gk; ++j) {
        const Tensor zj = z(all, j, all), xj = xt(all, j, all), fj = f(all, nl::ds(j, 1));
        sch.add_any({[&] { QuantMath::scale_rows(zj, xj, fj, scalar); }, [&] { QuantMath::scale_rows(zj, xj, fj, vector); }});
      }
      weigh(z);
      sch.add([&] { math.saturate(qt, z); });
      group_scales = static_scales(first(p), first(gk));
    } else {
      // z = x * gamma; amax of each row (|z_j| lands in q's row, which the row's quantized
      // values overwrite next); the rows' factors; q = z * f on the Scalar or Vector engine.
      weigh(xt);
      for (int64_t j = 0; j < gk; ++j)
        sch.add([&] { QuantMath::row_amax(amax(all, nl::ds(j, 1)), z(all, j, all), qt(all, j, all)); });
      sch.add([&] { math.dynamic_scales(s, f, amax, rstd); });
      for (int64_t j = 0; j < gk; ++j) {
        const Tensor qj = qt(all, j, all), zj = z(all, j, all), fj = f(all, nl::ds(j, 1));
        sch.add_any({[&] { QuantMath::scale_rows(qj, zj, fj, scalar); }, [&] { QuantMath::scale_rows(qj, zj, fj, vector); }});
      }
      group_scales = s;
    }
    sch.add([&] { isa::dma_copy(G.rows(q), qt); });
    sch.add([&] { isa::dma_copy(G.stats(scales), group_scales); });
  }
  sch.run();
  return {q, scales};
}

/** Examples shared by the static and the dynamic kernel: x [R, H] and gamma [H]. */
inline ExampleCase quant_case(int64_t R, int64_t H, DType x_dtype, DType gamma_dtype, bool with_scale, std::string label) {
  std::vector<TensorSpec> in{spec({R, H}, x_dtype), spec({H}, gamma_dtype)};
  if (with_scale) in.push_back(spec({1}, DType::float32));
  return {in, {}, std::move(label)};
}

/** A random problem: rows of up to a few thousand columns, any dtype and eps. */
inline ExampleCase draw_quant_case(CaseRng& r, bool with_scale) {
  const DType xd = r.pick({DType::float32, DType::bfloat16, DType::float16});
  ExampleCase c = quant_case(r.size(1, 700), r.size(1, 3000), xd, r.coin(0.3) ? DType::float32 : xd, with_scale, "drawn");
  c.params.set("eps", r.pick({1e-5, 1e-6, 1e-3}));
  return c;
}

/**
 * @brief The accepted error of q: one step of the fp8 grid (3 mantissa bits: 2^-3 relative to
 * the value, or the subnormal step 2^-9 near zero). The kernel computes in fp32 and the
 * reference in float64, so a value within a few fp32 roundings of a midpoint between two fp8
 * values may round the other way; everywhere else q matches bit for bit (tests/python/kernels/
 * test_quant.py counts those places). Scales are compared in the same test at fp32 precision.
 */
inline Tolerance quant_tolerance() { return {0.125, 1.0 / 512}; }

}  // namespace quant_detail

inline constexpr const char* rmsnorm_quant_doc = R"(RMSNorm followed by fp8 quantization with a static scale.

Dimensions: x [T, H], gamma [H], scale [1] -> q [T, H], scales [T]; any T and H whose row fits SBUF.
Args:       x: float32 / bfloat16 / float16; gamma: float32 / bfloat16 / float16.
            scale: the static dequantization scale, a float32 tensor of shape [1].
            eps: added to the mean square inside the square root (default 1e-6).
Returns:    q float8_e4m3fn: y / scale saturated to +-240 (y = RMSNorm(x) * gamma);
            scales float32 [T]: every row's dequantization scale (the static one), so that
            q * scales[:, None] approximates y.
Notes:      Saturates to +-240, the range of Trainium's float8_e4m3 (the fp8 trn2's TensorE
            multiplies, and nki-library's default non-OCP mode), not OCP e4m3fn's +-448; q is
            stored as float8_e4m3fn, whose encoding of every value in +-240 is the same bits, so
            torch can hold it and fp8_matmul reads it as e4m3. Computed in fp32: rstd from
            bn_stats (the norm kernels' maths), then q = clamp(x * gamma * (rstd / scale)),
            rounded once to fp8 (nearest even). Inference only: no backward.
Pseudocode: y = x / sqrt(mean(x^2, axis=1) + eps) * gamma
            q = fp8(clamp(y / scale, -240, 240)); scales = full([T], scale))";

inline constexpr const char* rmsnorm_quant_dynamic_doc = R"(RMSNorm followed by fp8 quantization with dynamic per-row scales.

Dimensions: x [T, H], gamma [H] -> q [T, H], scales [T]; any T and H whose row fits SBUF.
Args:       x: float32 / bfloat16 / float16; gamma: float32 / bfloat16 / float16.
            eps: added to the mean square inside the square root (default 1e-6).
Returns:    q float8_e4m3fn: y / scales[:, None], each row's largest magnitude at +-240
            (y = RMSNorm(x) * gamma); scales float32 [T]: the rows' dequantization scales.
Notes:      scale_t = amax_t / 240 with amax_t = max |y_t| over the normalized row; an all-zero
            row gets the smallest normal fp32 as its scale (and q = 0), so scales are never 0.
            The range and the dtype are rmsnorm_quant's (Trainium's e4m3 range, +-240, in
            float8_e4m3fn bits). Computed in fp32: amax_t = rstd_t * max |x_t * gamma|, then
            q = x * gamma * (rstd / scale), rounded once to fp8 (nearest even). Inference only.
Pseudocode: y = x / sqrt(mean(x^2, axis=1) + eps) * gamma
            scales = max(max(|y|, axis=1) / 240, FLT_MIN); q = fp8(y / scales[:, None]))";

/** @brief {q, scales} = rmsnorm_quant(x, gamma, scale); see rmsnorm_quant_doc. */
inline std::vector<Tensor> rmsnorm_quant(const Tensor& x, const Tensor& gamma, const Tensor& scale, double eps = 1e-6,
                                         Loc loc = Loc::current()) {
  return quant_detail::rmsnorm_quant(x, gamma, scale, eps, loc);
}

/** @brief {q, scales} = rmsnorm_quant_dynamic(x, gamma); see rmsnorm_quant_dynamic_doc. */
inline std::vector<Tensor> rmsnorm_quant_dynamic(const Tensor& x, const Tensor& gamma, double eps = 1e-6,
                                                 Loc loc = Loc::current()) {
  return quant_detail::rmsnorm_quant(x, gamma, std::nullopt, eps, loc);
}

namespace quant_detail {

/** @brief What the static and the dynamic registrations share. */
inline KernelInfo rmsnorm_quant_common(bool with_scale) {
  auto example = [&](int64_t R, int64_t H, DType x_dtype, DType gamma_dtype, std::string label) {
    return quant_case(R, H, x_dtype, gamma_dtype, with_scale, std::move(label));
  };
  return KernelInfo{
      .outputs = {"q", "scales"},
      .params = {{"eps", ParamKind::real, 1e-6, "added to the mean square inside the square root"}},
      .dtypes = {DType::float32, DType::bfloat16, DType::float16},
      .backward = "",
      .gradient = "none: an inference kernel (fp8 quantization has no useful gradient; train with rmsnorm)",
      .examples = {example(300, 77, DType::bfloat16, DType::bfloat16, "row and column tails"),
                   example(1, 1, DType::float32, DType::float32, "tiny"),
                   example(256, 600, DType::float32, DType::bfloat16, "two rows per partition, fp32"),
                   example(130, 4100, DType::float16, DType::float16, "wide rows, fp16")},
      .draw = [with_scale](CaseRng& r) { return draw_quant_case(r, with_scale); },
      .tolerance = [](const ExampleCase&) { return quant_tolerance(); },
      .benchmark = Benchmark{example(8192, 4096, DType::bfloat16, DType::bfloat16, "[8192, 4096] bf16"), Bound::hbm, {}, 0.70},
  };
}

}  // namespace quant_detail

inline KernelInfo rmsnorm_quant_info() {
  KernelInfo k = quant_detail::rmsnorm_quant_common(true);
  k.name = "rmsnorm_quant";
  k.summary = "RMSNorm then fp8 (e4m3) quantization with a static scale";
  k.doc = rmsnorm_quant_doc;
  k.inputs = {"x", "gamma", "scale"};
  k.body = [](const KernelCall& c) { return rmsnorm_quant(c.inputs[0], c.inputs[1], c.inputs[2], c.real("eps")); };
  k.reference = [](const std::vector<RefTensor>& in, const ParamValues& p) {
    return reference::rmsnorm_quant(in[0], in[1], in[2][0], p.real("eps"), quant_detail::kQuantDtype,
                                    quant_detail::quant_max());
  };
  // The scale: 1/512 sends most of a normalized row past +-240 (saturation), 0.02 keeps nearly
  // all of it in range; "saturating" examples take the first, other cases any.
  k.make_inputs = [](const ExampleCase& c, CaseRng& r) {
    std::vector<RefTensor> in{random_input(c.inputs[0], r), random_input(c.inputs[1], r), RefTensor(Shape{1})};
    const bool saturating = c.label.find("saturating") != std::string::npos;
    in[2][0] = round_to(DType::float32, saturating ? 1.0 / 512 : r.pick({1.0 / 512, 1.0 / 64, 0.02, 0.5}));
    return in;
  };
  k.examples.push_back(
      quant_detail::quant_case(200, 129, DType::bfloat16, DType::float32, true, "saturating: most values beyond +-240"));
  return k;
}

inline KernelInfo rmsnorm_quant_dynamic_info() {
  KernelInfo k = quant_detail::rmsnorm_quant_common(false);
  k.name = "rmsnorm_quant_dynamic";
  k.summary = "RMSNorm then fp8 (e4m3) quantization with dynamic per-row scales";
  k.doc = rmsnorm_quant_dynamic_doc;
  k.inputs = {"x", "gamma"};
  k.body = [](const KernelCall& c) { return rmsnorm_quant_dynamic(c.inputs[0], c.inputs[1], c.real("eps")); };
  k.reference = [](const std::vector<RefTensor>& in, const ParamValues& p) {
    return reference::rmsnorm_quant(in[0], in[1], std::nullopt, p.real("eps"), quant_detail::kQuantDtype,
                                    quant_detail::quant_max());
  };
  // Row 0 (of several) and a tenth of the others all zero (the scale's guard), the rest standard
  // normal.
  k.make_inputs = [](const ExampleCase& c, CaseRng& r) {
    std::vector<RefTensor> in{random_input(c.inputs[0], r), random_input(c.inputs[1], r)};
    const int64_t R = c.inputs[0].shape[0], H = c.inputs[0].shape[1];
    for (int64_t row = 0; row < R; ++row)
      if ((row == 0 && R > 1) || r.coin(0.1))
        for (int64_t col = 0; col < H; ++col) in[0][row * H + col] = 0;
    return in;
  };
  k.examples[0].label += ", zero rows";
  return k;
}

}  // namespace nikki::kernels
