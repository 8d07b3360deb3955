// Flash attention forward and backward against a plain double-precision reference computed here,
// over a sweep of shapes (tails, S = 1, Skv != S, grouped query attention, head dims), causal and
// not, float32 and bfloat16.
#include <cmath>
#include <string>
#include <vector>

#include "close_check.hpp"
#include "harness.hpp"
#include "nikki/kernels/attention/flash_attention_bwd.hpp"
#include "nikki/kernels/registry.hpp"

namespace nikki::test {
namespace {

struct Case {
  int64_t B, H, Hkv, S, Skv, D;
  bool causal;
  DType dtype;
  double scale = std::nan("");  // NaN: the default 1 / sqrt(D)
};

std::string describe(const Case& c) {
  return fmt::format("B={} H={} Hkv={} S={} Skv={} D={} causal={} {} scale={}", c.B, c.H, c.Hkv, c.S, c.Skv, c.D,
                     c.causal, dtype_name(c.dtype), c.scale);
}

/** The exact attention of one case, from the inputs as rounded to their dtype. */
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                    const HostTensor* dout) {
  const double scale = std::isnan(c.scale) ? 1.0 / std::sqrt(double(c.D)) : c.scale;
  const int64_t G = c.H / c.Hkv;
  Reference r;
  r.out.assign(c.B * c.H * c.S * c.D, 0.0);
  r.lse.assign(c.B * c.H * c.S, 0.0);
  if (dout) {
    r.dq.assign(r.out.size(), 0.0);
    r.dk.assign(c.B * c.Hkv * c.Skv * c.D, 0.0);
    r.dv.assign(r.dk.size(), 0.0);
  }
  std::vector<double> p(c.Skv), dp(c.Skv);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h / G;
      auto qi = [&](int64_t i, int64_t e) { return double(q.get(((b * c.H + h) * c.S + i) * c.D + e)); };
      auto kv_index = [&](int64_t j, int64_t e) { return ((b * c.Hkv + g) * c.Skv + j) * c.D + e; };
      for (int64_t i = 0; i < c.S; ++i) {
        const int64_t visible = c.causal ? std::min(c.Skv, i + 1) : c.Skv;
        double m = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0;
          for (int64_t e = 0; e < c.D; ++e) s += qi(i, e) * double(k.get(kv_index(j, e)));
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < visible; ++j) l += std::exp(p[j] - m);
        const double lse = m + std::log(l);
        r.lse[(b * c.H + h) * c.S + i] = lse;
        for (int64_t j = 0; j < visible; ++j) p[j] = std::exp(p[j] - lse);
        const int64_t row = ((b * c.H + h) * c.S + i) * c.D;
        for (int64_t e = 0; e < c.D; ++e) {
          double o = 0;
          for (int64_t j = 0; j < visible; ++j) o += p[j] * double(v.get(kv_index(j, e)));
          r.out[row + e] = o;
        }
        if (!dout) continue;
        // dP = dO V^T, Di = sum(dO * O), dS = P (dP - Di); dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
        double di = 0;
        for (int64_t e = 0; e < c.D; ++e) di += double(dout->get(row + e)) * r.out[row + e];
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0;
          for (int64_t e = 0; e < c.D; ++e) s += double(dout->get(row + e)) * double(v.get(kv_index(j, e)));
          dp[j] = p[j] * (s - di);
        }
        for (int64_t j = 0; j < visible; ++j)
          for (int64_t e = 0; e < c.D; ++e) {
            r.dq[row + e] += scale * dp[j] * double(k.get(kv_index(j, e)));
            r.dk[kv_index(j, e)] += scale * dp[j] * qi(i, e);
            r.dv[kv_index(j, e)] += p[j] * double(dout->get(row + e));
          }
      }
    }
  return r;
}

/** Sinks [H] of a call without attention sinks: -inf on every head. */
HostTensor no_sinks(int64_t H) {
  HostTensor sinks(DType::float32, {H});
  for (int64_t h = 0; h < H; ++h) sinks.set(h, -INFINITY);
  return sinks;
}

kernels::Params params_of(const Case& c) {
  kernels::Params p{{"causal", c.causal ? 1.0 : 0.0}};
  if (!std::isnan(c.scale)) p.set("scale", c.scale);
  return p;
}

// Tolerances. float32: the kernel accumulates in float32 everywhere, so errors are a few float32
// roundings of values of magnitude ~1 summed over <= Skv terms: 2e-5 absolute is ~100 ulps.
// bfloat16: the output is rounded to bfloat16 (relative 2^-9 = 0.2%) and the probabilities feed
// the P V matmul as bfloat16 (another 0.2% per term, averaging out over the keys): 1% relative +
// 0.01 absolute covers both with margin; lse stays float32 but its scores come from bfloat16
// probabilities' sums, so it gets 1e-2 absolute.
struct Tolerance {
  double atol, rtol, lse_atol;
};
Tolerance forward_tolerance(DType t) {
  return t == DType::float32 ? Tolerance{2e-5, 2e-5, 2e-5} : Tolerance{1e-2, 1e-2, 1e-2};
}

void run_forward_case(const Case& c, uint32_t seed) {
  CAPTURE(describe(c));
  HostTensor q = random_tensor(c.dtype, {c.B, c.H, c.S, c.D}, seed, -1.0f, 1.0f);
  HostTensor k = random_tensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, seed + 1, -1.0f, 1.0f);
  HostTensor v = random_tensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, seed + 2, -1.0f, 1.0f);
  // Scores of a few units make the softmax peaked enough to exercise the running maximum.
  for (int64_t i = 0; i < q.size(); ++i) q.set(i, q.get(i) * 3.0f);
  HostTensor sinks = no_sinks(c.H);
  const kernels::KernelInfo info = kernels::flash_attention_info();
  Kernel kernel = kernels::trace_library_kernel(info, {q.spec(), k.spec(), v.spec(), sinks.spec()}, params_of(c));
  std::vector<HostTensor> got = run_kernel(std::move(kernel), {&q, &k, &v, &sinks}, Mode::streams_native);
  const Reference r = reference(c, q, k, v, nullptr);
  const Tolerance t = forward_tolerance(c.dtype);
  check_close("out", got[0], r.out, t.rtol, t.atol);
  check_close("lse", got[1], r.lse, 0.0, t.lse_atol);
}

TEST_CASE("flash_attention forward matches a double-precision reference") {
  const std::vector<Case> cases = {
      {1, 1, 1, 128, 128, 64, false, DType::float32},
      {1, 1, 1, 128, 128, 64, true, DType::float32},
      {1, 2, 1, 200, 330, 128, false, DType::float32},
      {1, 2, 1, 200, 330, 128, true, DType::float32},
      {1, 1, 1, 330, 200, 64, true, DType::bfloat16},
      {2, 4, 2, 1, 70, 64, false, DType::bfloat16},
      {1, 1, 1, 1, 1, 32, true, DType::float32},
      {1, 3, 3, 1000, 1000, 128, true, DType::bfloat16},
      {1, 1, 1, 256, 4608, 128, false, DType::bfloat16},  // two key chunks: the online softmax rescales
      {1, 2, 1, 129, 5000, 96, true, DType::float32, 0.3},
  };
  uint32_t seed = 11;
  for (const Case& c : cases) run_forward_case(c, seed += 3);
}

/** check_close with an absolute tolerance of atol times the largest |want| of the tensor. */
void check_close_scaled(const char* what, const HostTensor& got, const std::vector<double>& want, double atol,
                        double rtol) {
  double peak = 0;
  for (double w : want) peak = std::max(peak, std::fabs(w));
  check_close(what, got, want, rtol, atol * std::max(peak, 1e-30));
}

void run_backward_case(const Case& c, uint32_t seed) {
  CAPTURE(describe(c));
  HostTensor q = random_tensor(c.dtype, {c.B, c.H, c.S, c.D}, seed, -1.0f, 1.0f);
  HostTensor k = random_tensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, seed + 1, -1.0f, 1.0f);
  HostTensor v = random_tensor(c.dtype, {c.B, c.Hkv, c.Skv, c.D}, seed + 2, -1.0f, 1.0f);
  HostTensor dout = random_tensor(c.dtype, {c.B, c.H, c.S, c.D}, seed + 3, -1.0f, 1.0f);
  for (int64_t i = 0; i < q.size(); ++i) q.set(i, q.get(i) * 3.0f);
  const Reference r = reference(c, q, k, v, &dout);
  // The saved forward outputs, as the forward would have stored them.
  HostTensor out(c.dtype, {c.B, c.H, c.S, c.D}), lse(DType::float32, {c.B, c.H, c.S});
  for (int64_t i = 0; i < out.size(); ++i) out.set(i, float(r.out[size_t(i)]));
  for (int64_t i = 0; i < lse.size(); ++i) lse.set(i, float(r.lse[size_t(i)]));
  HostTensor sinks = no_sinks(c.H);
  const kernels::KernelInfo info = kernels::flash_attention_bwd_info();
  Kernel kernel = kernels::trace_library_kernel(
      info, {q.spec(), k.spec(), v.spec(), sinks.spec(), out.spec(), lse.spec(), dout.spec()}, params_of(c));
  std::vector<HostTensor> got =
      run_kernel(std::move(kernel), {&q, &k, &v, &sinks, &out, &lse, &dout}, Mode::streams_native);
  // Gradients are sums over keys (dq) or queries (dk, dv) of terms that largely cancel (dS sums to
  // zero over each row), so errors scale with the size of the terms, not of the result: tolerances
  // are relative to the largest gradient element. float32: every product and sum is float32, 1e-4
  // of the peak covers the roundings of sums of up to ~5000 terms. bfloat16: P, dP - Di and dS are
  // rounded to bfloat16 (2^-9 each) before the matmuls and the results are stored in bfloat16:
  // 2% of the peak plus 2% of the element.
  const double atol = c.dtype == DType::float32 ? 1e-4 : 2e-2, rtol = c.dtype == DType::float32 ? 1e-4 : 2e-2;
  check_close_scaled("grad_q", got[0], r.dq, atol, rtol);
  check_close_scaled("grad_k", got[1], r.dk, atol, rtol);
  check_close_scaled("grad_v", got[2], r.dv, atol, rtol);
}

TEST_CASE("flash_attention backward matches a double-precision reference") {
  const std::vector<Case> cases = {
      {1, 1, 1, 128, 128, 64, false, DType::float32},
      {1, 1, 1, 128, 128, 64, true, DType::float32},
      {1, 2, 1, 200, 330, 128, false, DType::float32},
      {1, 2, 1, 200, 330, 128, true, DType::float32},
      {1, 1, 1, 330, 200, 64, true, DType::bfloat16},  // keys past the last query get zero gradients
      {2, 4, 2, 1, 70, 64, false, DType::bfloat16},
      {1, 1, 1, 1, 1, 32, true, DType::float32},
      {1, 3, 3, 700, 700, 128, true, DType::bfloat16},
      {1, 2, 1, 129, 1100, 96, true, DType::float32, 0.3},
      {1, 2, 1, 300, 600, 128, false, DType::bfloat16},
  };
  uint32_t seed = 5;
  for (const Case& c : cases) run_backward_case(c, seed += 4);
}

}  // namespace
}  // namespace nikki::test

namespace nikki::test {
namespace {

/** The message of the KernelError that tracing `name` on `specs` raises (empty if none). */
std::string attention_error(const std::string& name, std::vector<TensorSpec> specs, kernels::Params params = {}) {
  try {
    kernels::trace_library_kernel(kernels::find_kernel(name), std::move(specs), params);
  } catch (const KernelError& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  INFO("message: " << text);
  return text.find(part) != std::string::npos;
}

TEST_CASE("flash_attention: shape, dtype and size mistakes are KernelErrors that say what to change") {
  const DType bf = DType::bfloat16, f32 = DType::float32;
  const TensorSpec q = spec({1, 4, 256, 64}, bf), kv = spec({1, 2, 256, 64}, bf);
  const TensorSpec sinks4 = spec({4}, f32), sinks1 = spec({1}, f32);
  CHECK(contains(attention_error("flash_attention", {spec({4, 256, 64}, bf), kv, kv, sinks4}),
                 "flash_attention: q, k and v must be 4-D [batch, heads, seq, head_dim], got"));
  CHECK(contains(attention_error("flash_attention", {q, spec({1, 2, 256, 32}, bf), kv, sinks4}),
                 "must both be [B, Hkv, Skv, D] with q's B and D (q is [1, 4, 256, 64])"));
  CHECK(contains(attention_error("flash_attention", {q, spec({1, 3, 256, 64}, bf), spec({1, 3, 256, 64}, bf), sinks4}),
                 "q has 4 heads, which is not a multiple of the 3 kv heads"));
  const std::string big_head = attention_error(
      "flash_attention", {spec({1, 1, 128, 256}, bf), spec({1, 1, 128, 256}, bf), spec({1, 1, 128, 256}, bf), sinks1});
  CHECK(contains(big_head, "head dim 256 is too large"));
  CHECK(contains(big_head, "split the heads, or use head_dim 64 or 128"));
  CHECK(contains(attention_error("flash_attention", {spec({1, 1, 128, 64}, DType::int8), spec({1, 1, 128, 64}, DType::int8),
                                                     spec({1, 1, 128, 64}, DType::int8), sinks1}),
                 "dtype int8 is not supported"));
  CHECK(contains(attention_error("flash_attention", {q, spec({1, 2, 256, 64}, f32), kv, sinks4}),
                 "q, k and v must have one dtype, got bfloat16, float32, bfloat16"));
  const TensorSpec long_kv = spec({1, 1, 200000, 128}, bf);
  const std::string too_long = attention_error("flash_attention", {spec({1, 1, 128, 128}, bf), long_kv, long_kv, sinks1});
  CHECK(contains(too_long, "K and V of one kv head (Skv = 200000, D = 128, bfloat16) do not fit in SBUF"));
  CHECK(contains(too_long, "split the keys across calls"));
}

TEST_CASE("flash_attention_bwd: saved tensors of the wrong shape or dtype are KernelErrors") {
  const DType bf = DType::bfloat16;
  const TensorSpec q = spec({1, 2, 128, 64}, bf), kv = spec({1, 1, 128, 64}, bf), sinks = spec({2}, DType::float32);
  CHECK(contains(attention_error("flash_attention_bwd", {q, kv, kv, sinks, spec({1, 2, 100, 64}, bf), spec({1, 2, 128}, DType::float32), q}),
                 "must have q's shape and dtype [1, 2, 128, 64] bfloat16"));
  CHECK(contains(attention_error("flash_attention_bwd", {q, kv, kv, sinks, q, spec({1, 2, 128}, bf), q}),
                 "lse [1, 2, 128] bfloat16 must be float32 [B, H, S] = [1, 2, 128]"));
}

TEST_CASE("flash_attention: argument errors point at the line that called the kernel") {
  std::string message;
  try {
    trace("k", [](Tensor q, Tensor k, Tensor v, Tensor sinks) { return kernels::flash_attention(q, k, v, sinks)[0]; },
          spec({1, 4, 128, 64}, DType::bfloat16), spec({1, 3, 128, 64}, DType::bfloat16),
          spec({1, 3, 128, 64}, DType::bfloat16), spec({4}, DType::float32));
  } catch (const KernelError& e) {
    message = e.what();
  }
  CHECK(contains(message, "flash_attention: q has 4 heads, which is not a multiple of the 3 kv heads"));
  CHECK(contains(message, "test_kernels_attention.cpp"));
}

}  // namespace
}  // namespace nikki::test

namespace nikki::test {
namespace {

TEST_CASE("rope: shape, dtype and size mistakes are KernelErrors that say what to change") {
  const DType bf = DType::bfloat16, f32 = DType::float32;
  const TensorSpec x = spec({2, 4, 64, 32}, bf), table = spec({64, 32}, bf);
  const kernels::Params interleaved{{"interleaved", 1.0}};
  CHECK(contains(attention_error("rope", {spec({4, 64, 32}, bf), table, table}),
                 "rope: x must be 4-D [batch, heads, seq, head_dim], got [4, 64, 32]"));
  CHECK(contains(attention_error("rope", {spec({2, 4, 64, 32}, DType::int8), table, table}),
                 "rope: x must be float32, bfloat16 or float16, got int8"));
  CHECK(contains(attention_error("rope", {x, spec({64}, bf), spec({64}, bf)}), "rope: cos must be [S, r] or [B, S, r], got [64]"));
  CHECK(contains(attention_error("rope", {x, spec({3, 64, 32}, bf), spec({3, 64, 32}, bf)}),
                 "cos [3, 64, 32] does not match x [2, 4, 64, 32]: it must be [S, r], [B, S, r] or [1, S, r] with S = 64 and B = 2"));
  CHECK(contains(attention_error("rope", {x, table, spec({64, 30}, bf)}), "sin [64, 30] must have cos's shape [64, 32]"));
  CHECK(contains(attention_error("rope", {x, spec({64, 33}, bf), spec({64, 33}, bf)}, interleaved),
                 "the rotary dim r = 33 (cos's last dim) must be even and at most head_dim 32"));
  CHECK(contains(attention_error("rope", {x, table, spec({64, 32}, f32)}),
                 "cos and sin must have one float dtype, got bfloat16 and float32"));
  CHECK(contains(attention_error("rope_bwd", {table, table, spec({2, 4, 64}, bf)}), "rope_bwd: grad_out must be 4-D"));
  const std::string huge = attention_error("rope", {spec({1, 1, 128, 60000}, f32), spec({128, 2}, f32), spec({128, 2}, f32)});
  CHECK(contains(huge, "rope: a head of 60000 dims does not fit in SBUF"));
  CHECK(contains(huge, "use a smaller head_dim"));
}

}  // namespace
}  // namespace nikki::test

namespace nikki::test {
namespace {

TEST_CASE("output_projection: shape and dtype mistakes are KernelErrors naming the operand") {
  const DType bf = DType::bfloat16, f32 = DType::float32;
  const TensorSpec attn = spec({2, 8, 64}, bf), w = spec({64, 32}, bf), bias = spec({32}, bf), res = spec({2, 8, 32}, bf);
  CHECK(contains(attention_error("output_projection", {spec({16, 64}, bf), w, bias, res}),
                 "output_projection: attn must be 3-D [batch, seq, heads * head_dim], got [16, 64]"));
  CHECK(contains(attention_error("output_projection", {spec({2, 8, 64}, DType::int8), spec({64, 32}, DType::int8), bias, res}),
                 "attn must be float32, bfloat16 or float16, got int8"));
  CHECK(contains(attention_error("output_projection", {attn, spec({60, 32}, bf), bias, res}),
                 "w_o must be [K, N] with K = attn's last dim 64, got [60, 32]"));
  CHECK(contains(attention_error("output_projection", {attn, spec({64, 32}, f32), bias, res}),
                 "w_o must have attn's dtype bfloat16, got float32"));
  CHECK(contains(attention_error("output_projection", {attn, w, spec({32}, f32), res}),
                 "bias must be [32] bfloat16, got [32] float32"));
  CHECK(contains(attention_error("output_projection", {attn, w, bias, spec({2, 8, 31}, bf)}),
                 "residual must be [2, 8, 32] bfloat16, got [2, 8, 31] bfloat16"));
  CHECK(contains(attention_error("output_projection_bwd", {attn, w, spec({2, 8, 32}, f32)}),
                 "output_projection_bwd: grad_out must be [2, 8, 32] bfloat16, got [2, 8, 32] float32"));
}

}  // namespace
}  // namespace nikki::test

namespace nikki::test {
namespace {

TEST_CASE("flash_attention: sliding-window mistakes are KernelErrors in the forward and the backward") {
  const DType bf = DType::bfloat16;
  const TensorSpec q = spec({1, 1, 256, 64}, bf), short_kv = spec({1, 1, 128, 64}, bf), sinks = spec({1}, DType::float32);
  const std::string fewer_keys =
      attention_error("flash_attention", {q, short_kv, short_kv, sinks}, kernels::Params{{"window", 16.0}});
  CHECK(contains(fewer_keys, "a sliding window needs at least as many keys as queries, got S = 256 queries and Skv = 128 keys"));
  CHECK(contains(fewer_keys, "pad the keys, or drop the window for this call"));
  CHECK(contains(attention_error("flash_attention", {q, q, q, sinks}, kernels::Params{{"window", -1.0}}),
                 "window must be >= 0 (0: no sliding window), got -1"));
  CHECK(contains(attention_error("flash_attention_bwd", {q, short_kv, short_kv, sinks, q, spec({1, 1, 256}, DType::float32), q},
                                 kernels::Params{{"window", 16.0}}),
                 "flash_attention_bwd: a sliding window needs at least as many keys as queries"));
}

}  // namespace
}  // namespace nikki::test
