// layernorm / rmsnorm (forward and backward) against plain double-precision references computed
// here from the definitions (torch.nn.functional.layer_norm / rms_norm semantics: biased variance,
// eps inside the square root), over a sweep of shapes that exercises every path of the kernels:
// row tails (R % 128), groups of several rows per partition, column tails (H % 128, H % 512),
// tiny tensors, wide rows and rows too wide for SBUF (streamed), fp32 and bf16.
//
// Tolerances. The references use the dtype-rounded inputs the kernel sees, in double, so the only
// differences are the kernel's fp32 arithmetic and its one rounding of each output:
//  - bf16 / fp16 outputs: the one rounding to the output format is <= 0.5 ulp, which relative to
//    |want| is up to 2^-8 (bf16) / 2^-11 (fp16) just above a power of two; the fp32 error before
//    it (~1e-6 relative) can push a value across a rounding boundary, so we allow 1 ulp relative
//    (2^-7 bf16, 2^-10 fp16), plus a small absolute floor for values near zero where a relative
//    bound is meaningless. Runs use about half of it.
//  - fp32 outputs: the fp32 statistics carry ~1e-7 relative error (bn_stats' Welford updates over
//    up to 40000 columns), and normalizing rows whose mean is 3x their spread (as the inputs here
//    are) amplifies the mean's error by rstd * |mean| * |gamma|; we allow 2e-5 relative plus
//    2e-5 x the scale of the outputs. Runs use under a quarter of it; real mistakes (a wrong eps,
//    an unbiased variance, a missing gamma or beta, a misplaced row or column) exceed it by
//    orders of magnitude.
//  - the saved fp32 mean and rstd: 1e-5 relative; runs use under 5% of it.
// Gradients reduce over R (grad_gamma, grad_beta) or H (grad_x): their tolerances scale with the
// magnitude of the terms summed, see check_close.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "close_check.hpp"
#include "harness.hpp"
#include "nikki/kernels/norm/layernorm.hpp"
#include "nikki/kernels/registry.hpp"
#include "nikki/kernels/norm/rmsnorm.hpp"

namespace nikki::test {
namespace {

struct Shape2 {
  int64_t R, H;
};

/** Rows [R, H] of doubles read from a host tensor (its dtype's values, exactly). */
std::vector<double> to_double(const HostTensor& t) {
  std::vector<double> v(t.size());
  for (int64_t i = 0; i < t.size(); ++i) v[i] = t.get(i);
  return v;
}

/** Unit in the last place of the output format, relative. */
double format_ulp(DType d) {
  switch (d) {
    case DType::bfloat16: return 0x1p-7;
    case DType::float16: return 0x1p-10;
    default: return 0.0;
  }
}

/** Tolerances of an output in dtype d whose values are of magnitude `scale`. */
std::pair<double, double> output_tol(DType d, double scale) {
  if (d == DType::float32) return {2e-5, 2e-5 * scale};
  return {format_ulp(d), format_ulp(d) * 1e-2 * scale};
}

struct LayerNormRef {
  std::vector<double> out, mean, rstd;
};

LayerNormRef layernorm_ref(const std::vector<double>& x, const std::vector<double>& gamma,
                           const std::vector<double>* beta, int64_t R, int64_t H, double eps, bool rms) {
  LayerNormRef r;
  r.out.resize(R * H);
  r.mean.resize(R);
  r.rstd.resize(R);
  for (int64_t i = 0; i < R; ++i) {
    const double* row = &x[i * H];
    double mean = 0;
    for (int64_t h = 0; h < H; ++h) mean += row[h];
    mean /= H;
    double var = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double d = rms ? row[h] : row[h] - mean;
      var += d * d;
    }
    var /= H;  // biased, as torch
    const double rstd = 1.0 / std::sqrt(var + eps);
    r.mean[i] = mean;
    r.rstd[i] = rstd;
    for (int64_t h = 0; h < H; ++h)
      r.out[i * H + h] = ((rms ? row[h] : row[h] - mean) * rstd) * gamma[h] + (beta ? (*beta)[h] : 0.0);
  }
  return r;
}

HostTensor input(DType d, Shape shape, uint32_t seed, float lo, float hi) { return random_tensor(d, shape, seed, lo, hi); }

std::vector<HostTensor> run_registry(const std::string& name, std::vector<HostTensor*> inputs, kernels::Params params = {},
                                     Mode mode = Mode::streams_native) {
  std::vector<TensorSpec> specs;
  for (HostTensor* t : inputs) specs.push_back(t->spec());
  Kernel k = kernels::trace_library_kernel(kernels::find_kernel(name), specs, params);
  return run_kernel(std::move(k), inputs, mode);
}

// Shapes: tails of rows and columns, several rows per partition (R >= 256), tiny, wide.
const std::vector<Shape2> kForwardShapes = {
    {1, 1}, {3, 7}, {128, 128}, {130, 100}, {300, 513}, {1100, 64}, {257, 1000}, {64, 4096}, {4, 16384},
};

TEST_CASE("layernorm forward matches a double reference (fp32, bf16) over a shape sweep") {
  for (DType d : {DType::float32, DType::bfloat16}) {
    for (const Shape2& s : kForwardShapes) {
      CAPTURE(dtype_name(d));
      CAPTURE(s.R);
      CAPTURE(s.H);
      // An offset mean (2.0) checks that the variance is taken around the mean.
      HostTensor x = input(d, {s.R, s.H}, 11, 1.0f, 3.0f);
      HostTensor gamma = input(d, {s.H}, 12, -1.5f, 1.5f);
      HostTensor beta = input(d, {s.H}, 13, -0.5f, 0.5f);
      const double eps = 1e-5;
      std::vector<HostTensor> got = run_registry("layernorm", {&x, &gamma, &beta});
      std::vector<double> gd = to_double(gamma), bd = to_double(beta);
      LayerNormRef ref = layernorm_ref(to_double(x), gd, &bd, s.R, s.H, eps, false);
      // |out| <= |xhat| |gamma| + |beta|, with |xhat| up to ~sqrt(3) for uniform rows.
      auto [rel, abs] = output_tol(d, 3.0);
      check_close("out", got[0], ref.out, rel, abs);
      check_close("mean", got[1], ref.mean, 1e-5, 1e-5 * 3.0);
      check_close("rstd", got[2], ref.rstd, 1e-5, 0.0);
    }
  }
}

TEST_CASE("norms: fp32 weights with bf16 activations (autocast) give bf16 outputs, rounded once") {
  HostTensor x = input(DType::bfloat16, {300, 513}, 41, 1.0f, 3.0f);
  HostTensor gamma = input(DType::float32, {513}, 42, -1.5f, 1.5f), beta = input(DType::float32, {513}, 43, -0.5f, 0.5f);
  std::vector<double> gd = to_double(gamma), bd = to_double(beta);
  auto [rel, abs] = output_tol(DType::bfloat16, 3.0);
  std::vector<HostTensor> ln = run_registry("layernorm", {&x, &gamma, &beta});
  CHECK(ln[0].dtype == DType::bfloat16);
  check_close("layernorm out", ln[0], layernorm_ref(to_double(x), gd, &bd, 300, 513, 1e-5, false).out, rel, abs);
  std::vector<HostTensor> rms = run_registry("rmsnorm", {&x, &gamma});
  CHECK(rms[0].dtype == DType::bfloat16);
  check_close("rmsnorm out", rms[0], layernorm_ref(to_double(x), gd, nullptr, 300, 513, 1e-6, true).out, rel, abs);
}

TEST_CASE("rmsnorm forward matches a double reference (fp32, bf16) over a shape sweep") {
  for (DType d : {DType::float32, DType::bfloat16}) {
    for (const Shape2& s : kForwardShapes) {
      CAPTURE(dtype_name(d));
      CAPTURE(s.R);
      CAPTURE(s.H);
      HostTensor x = input(d, {s.R, s.H}, 21, -2.0f, 2.0f);
      HostTensor gamma = input(d, {s.H}, 22, -1.5f, 1.5f);
      const double eps = 1e-6;
      std::vector<HostTensor> got = run_registry("rmsnorm", {&x, &gamma});
      LayerNormRef ref = layernorm_ref(to_double(x), to_double(gamma), nullptr, s.R, s.H, eps, true);
      auto [rel, abs] = output_tol(d, 3.0);
      check_close("out", got[0], ref.out, rel, abs);
      check_close("rstd", got[1], ref.rstd, 1e-5, 0.0);
    }
  }
}

struct NormGrads {
  std::vector<double> dx, dgamma, dbeta;
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;  // magnitudes of the terms summed
};

/** The backward from the definitions, with the mean/rstd the kernel is given. */
NormGrads norm_bwd_ref(const std::vector<double>& x, const std::vector<double>& gamma, const std::vector<double>* mean,
                       const std::vector<double>& rstd, const std::vector<double>& dy, int64_t R, int64_t H) {
  NormGrads r;
  r.dx.resize(R * H);
  r.dx_scale.resize(R * H);
  r.dgamma.assign(H, 0.0);
  r.dbeta.assign(H, 0.0);
  r.dgamma_scale.assign(H, 0.0);
  r.dbeta_scale.assign(H, 0.0);
  std::vector<double> xhat(H), g(H);
  for (int64_t i = 0; i < R; ++i) {
    double c1 = 0, c2 = 0, gmax = 0, xmax = 0;
    const double m = mean ? (*mean)[i] : 0.0;
    for (int64_t h = 0; h < H; ++h) {
      xhat[h] = (x[i * H + h] - m) * rstd[i];
      // The kernel may form xhat as x * rstd - mean * rstd: its error scales with both terms.
      const double xhat_scale = (std::abs(x[i * H + h]) + std::abs(m)) * rstd[i];
      g[h] = dy[i * H + h] * gamma[h];
      c1 += g[h];
      c2 += g[h] * xhat[h];
      gmax = std::max(gmax, std::abs(g[h]));
      xmax = std::max(xmax, xhat_scale);
      r.dgamma[h] += dy[i * H + h] * xhat[h];
      r.dbeta[h] += dy[i * H + h];
      r.dgamma_scale[h] += std::abs(dy[i * H + h]) * xhat_scale;
      r.dbeta_scale[h] += std::abs(dy[i * H + h]);
    }
    c1 /= H;
    c2 /= H;
    if (!mean) c1 = 0;
    for (int64_t h = 0; h < H; ++h) {
      r.dx[i * H + h] = rstd[i] * (g[h] - c1 - xhat[h] * c2);
      r.dx_scale[i * H + h] = rstd[i] * (gmax + std::abs(c1) + xmax * std::abs(c2));
    }
  }
  return r;
}

std::vector<double> scaled(const std::vector<double>& v, double f) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * f;
  return out;
}

/**
 * Runs the backward on inputs whose mean/rstd come from the double reference rounded to fp32
 * (as the forward saves them) and checks all gradients. Gradient tolerances: the relative part is
 * that of the output format (above); the absolute part is the format's allowance applied to the
 * magnitude of the terms each element sums (grad_x: rstd * (|g| + |c1| + |xhat c2|); grad_gamma,
 * grad_beta: sum over rows of |grad_out * xhat| and |grad_out|), since cancellation in those sums
 * is exact in double but not in the kernel's fp32.
 */
void check_backward(bool layer, DType d, int64_t R, int64_t H, DType gamma_dtype) {
  CAPTURE(layer);
  CAPTURE(dtype_name(d));
  CAPTURE(dtype_name(gamma_dtype));
  CAPTURE(R);
  CAPTURE(H);
  HostTensor x = input(d, {R, H}, 31, layer ? 1.0f : -2.0f, 3.0f);
  HostTensor gamma = input(gamma_dtype, {H}, 32, -1.5f, 1.5f);
  HostTensor dy = input(d, {R, H}, 33, -1.0f, 1.0f);
  std::vector<double> xd = to_double(x), gd = to_double(gamma);
  LayerNormRef fwd = layernorm_ref(xd, gd, nullptr, R, H, layer ? 1e-5 : 1e-6, !layer);
  HostTensor mean(DType::float32, {R}), rstd(DType::float32, {R});
  for (int64_t i = 0; i < R; ++i) mean.set(i, float(fwd.mean[i])), rstd.set(i, float(fwd.rstd[i]));
  std::vector<double> md = to_double(mean), rd = to_double(rstd);
  NormGrads ref = norm_bwd_ref(xd, gd, layer ? &md : nullptr, rd, to_double(dy), R, H);
  std::vector<HostTensor> got = layer ? run_registry("layernorm_bwd", {&x, &gamma, &mean, &rstd, &dy})
                                      : run_registry("rmsnorm_bwd", {&x, &gamma, &rstd, &dy});
  REQUIRE(got.size() == (layer ? 3u : 2u));
  // grad_x is in x's dtype, grad_gamma and grad_beta in gamma's.
  auto rel = [](DType t) { return t == DType::float32 ? 2e-5 : format_ulp(t); };
  auto abs = [](DType t) { return t == DType::float32 ? 2e-5 : format_ulp(t) * 1e-2; };
  check_close("grad_x", got[0], ref.dx, rel(d), scaled(ref.dx_scale, abs(d)));
  check_close("grad_gamma", got[1], ref.dgamma, rel(gamma_dtype), scaled(ref.dgamma_scale, abs(gamma_dtype)));
  if (layer) check_close("grad_beta", got[2], ref.dbeta, rel(gamma_dtype), scaled(ref.dbeta_scale, abs(gamma_dtype)));
}

// Backward shapes: tails, groups of several rows per partition, xhat/g kept between the passes
// (H = 1000), recomputed (H = 16384: x and grad_out rows leave no room for them) and streamed
// rows (H = 40000).
const std::vector<Shape2> kBackwardShapes = {{1, 1}, {3, 7}, {130, 100}, {300, 513}, {1100, 64}, {257, 1000}, {2, 16384}};

TEST_CASE("layernorm backward matches a double reference (fp32, bf16)") {
  for (DType d : {DType::float32, DType::bfloat16})
    for (const Shape2& s : kBackwardShapes) check_backward(true, d, s.R, s.H, d);
  check_backward(true, DType::bfloat16, 3, 40000, DType::bfloat16);
  check_backward(true, DType::bfloat16, 300, 513, DType::float32);  // fp32 weights, 16-bit activations
}

TEST_CASE("rmsnorm backward matches a double reference (fp32, bf16)") {
  for (DType d : {DType::float32, DType::bfloat16})
    for (const Shape2& s : kBackwardShapes) check_backward(false, d, s.R, s.H, d);
  check_backward(false, DType::bfloat16, 3, 40000, DType::bfloat16);
  check_backward(false, DType::bfloat16, 300, 513, DType::float32);
}

TEST_CASE("norms: more than 512 rows per partition stage their statistics in several tiles") {
  // 128 * 520 + 3 rows: a group of 512 rows per partition, one of 8, and a 3-row tail.
  const int64_t R = 128 * 520 + 3, H = 2;
  HostTensor x = input(DType::float32, {R, H}, 51, -1.0f, 1.0f);
  HostTensor gamma = input(DType::float32, {H}, 52, 0.5f, 1.5f), beta = input(DType::float32, {H}, 53, -1.0f, 1.0f);
  // Two-column rows can have nearly equal values; eps = 0.1 bounds rstd (and with it how much
  // the fp32 mean's rounding is amplified), so the fp32 tolerances above apply.
  std::vector<HostTensor> got = run_registry("layernorm", {&x, &gamma, &beta}, kernels::Params{{"eps", 0.1}});
  std::vector<double> gd = to_double(gamma), bd = to_double(beta);
  LayerNormRef ref = layernorm_ref(to_double(x), gd, &bd, R, H, 0.1, false);
  auto [rel, abs] = output_tol(DType::float32, 3.0);
  check_close("out", got[0], ref.out, rel, abs);
  check_close("mean", got[1], ref.mean, 1e-5, 1e-6);
  check_close("rstd", got[2], ref.rstd, 1e-5, 0.0);
  check_backward(true, DType::float32, R, H, DType::float32);
}

TEST_CASE("norms: eps is honoured and rows too wide for SBUF are streamed") {
  // A constant row has zero variance: rstd = 1/sqrt(eps) exercises eps directly.
  HostTensor x(DType::float32, {5, 40});
  for (int64_t i = 0; i < x.size(); ++i) x.set(i, float(i / 40));
  HostTensor gamma = input(DType::float32, {40}, 5, 0.5f, 1.5f), beta = input(DType::float32, {40}, 6, -1.0f, 1.0f);
  std::vector<HostTensor> got = run_registry("layernorm", {&x, &gamma, &beta}, kernels::Params{{"eps", 0.25}});
  for (int64_t r = 0; r < 5; ++r) CHECK(got[2].get(r) == doctest::Approx(2.0).epsilon(1e-6));
  for (int64_t i = 0; i < got[0].size(); ++i) CHECK(got[0].get(i) == doctest::Approx(beta.get(i % 40)).epsilon(1e-6));

  // 40000 bf16 columns: two full rows per partition do not fit with the other tiles, so the
  // kernel reads each row twice (statistics, then normalize).
  HostTensor wx = input(DType::bfloat16, {3, 40000}, 7, -1.0f, 1.0f);
  HostTensor wg = input(DType::bfloat16, {40000}, 8, -1.0f, 1.0f), wb = input(DType::bfloat16, {40000}, 9, -1.0f, 1.0f);
  std::vector<HostTensor> w = run_registry("layernorm", {&wx, &wg, &wb});
  std::vector<double> wgd = to_double(wg), wbd = to_double(wb);
  LayerNormRef ref = layernorm_ref(to_double(wx), wgd, &wbd, 3, 40000, 1e-5, false);
  auto [rel, abs] = output_tol(DType::bfloat16, 3.0);
  check_close("wide out", w[0], ref.out, rel, abs);
  check_close("wide rstd", w[2], ref.rstd, 1e-5, 0.0);
}

TEST_CASE("norms: shape and dtype mistakes are KernelErrors naming the kernel") {
  auto error = [](const std::string& name, std::vector<TensorSpec> specs) {
    try {
      kernels::trace_library_kernel(kernels::find_kernel(name), specs, {});
    } catch (const KernelError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error("layernorm", {spec({4, 8}, DType::float32), spec({7}, DType::float32), spec({8}, DType::float32)})
            .find("layernorm: 'gamma' must have shape [8]") != std::string::npos);
  CHECK(error("rmsnorm", {spec({4, 8, 2}, DType::float32), spec({8}, DType::float32)})
            .find("rmsnorm: x must be 2-D") != std::string::npos);
  CHECK(error("rmsnorm", {spec({4, 8}, DType::int32), spec({8}, DType::float32)})
            .find("x must be float32, bfloat16 or float16") != std::string::npos);
}

TEST_CASE("norms: argument errors point at the line that called the kernel") {
  auto error = [](auto&& body, auto... specs) {
    try {
      trace("k", body, specs...);
    } catch (const KernelError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string fwd = error([](Tensor x, Tensor g) { return kernels::rmsnorm(x, g)[0]; },
                                spec({4, 8, 2}, DType::float32), spec({8}, DType::float32));
  CHECK(fwd.find("rmsnorm: x must be 2-D") != std::string::npos);
  CHECK(fwd.find("test_kernels_norms.cpp") != std::string::npos);
  const std::string bwd = error([](Tensor x, Tensor g, Tensor m, Tensor r, Tensor dy) {
    return kernels::layernorm_bwd(x, g, m, r, dy)[0];
  }, spec({4, 8}, DType::float32), spec({8}, DType::float32), spec({4}, DType::float32), spec({4}, DType::float32),
                                spec({4, 9}, DType::float32));
  CHECK(bwd.find("layernorm_bwd: grad_out must have x's shape [4, 8], got [4, 9]") != std::string::npos);
  CHECK(bwd.find("test_kernels_norms.cpp") != std::string::npos);
}

}  // namespace
}  // namespace nikki::test
