// Library kernels matmul, softmax and softmax_bwd against plain double-precision C++ references
// computed here (nikki is used only to run the kernels and to store inputs in their dtype; the
// references read the stored input values back and do their math in double).
//
// Tolerances, per output element:
//   matmul:      products of fp32 or bf16 values accumulate in fp32 PSUM: each nc_matmul sums up to
//                128 products, then adds into the bank once per k tile, so the accumulated rounding
//                is at most ~(128 + K / 128) fp32 ulps of sum_k |a_mk b_kn|, under 1e-5 of it for
//                the K tested. A bf16 output then rounds once more: 2^-9 relative, checked as 1e-2
//                of |ref|.
//   softmax:     fp32: exp and the reciprocal are within a few ulps, the row sum's rounding grows
//                with C (chunked for long rows); 2e-5 relative covers C <= 20000 with margin.
//                bf16 output: one rounding, 2^-9 relative (1e-2 checked).
//   softmax_bwd: grad_x = y * (dy - dot) cancels when dy ~ dot, so the error is relative to the
//                magnitude before cancellation, y * (|dy| + |dot| + sum_j |y_j dy_j|), the last
//                term for the fp32 rounding of the row's dot product itself: 1e-5 for fp32, 1e-2
//                for a bf16 output.
// Every case runs through the engine streams with the reference semantics; the registry test
// (test_library.cpp) checks that the native executor agrees bit for bit.
#include <cmath>
#include <string>
#include <vector>

#include "harness.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/softmax/softmax.hpp"

namespace nikki::test {
namespace {

struct Worst {
  double ratio = 0;  // max |err| / tolerance
  int64_t at = -1;
  double got = 0, want = 0;
  int64_t nonfinite = 0;
  void add(int64_t i, double got_v, double want_v, double tol) {
    if (!std::isfinite(got_v)) {
      ++nonfinite;
      return;
    }
    const double r = std::abs(got_v - want_v) / tol;
    if (r > ratio) *this = Worst{r, i, got_v, want_v, nonfinite};
  }
};

#define CHECK_WORST(w)                                                                                        \
  do {                                                                                                        \
    CAPTURE((w).at);                                                                                          \
    CAPTURE((w).got);                                                                                         \
    CAPTURE((w).want);                                                                                        \
    CHECK((w).nonfinite == 0);                                                                                \
    CHECK((w).ratio <= 1.0);                                                                                  \
  } while (0)

std::string shape_str(std::initializer_list<int64_t> dims, DType d) {
  std::string s;
  for (int64_t x : dims) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s + " " + std::string(dtype_name(d));
}

void check_matmul(int64_t M, int64_t K, int64_t N, DType d, uint32_t seed) {
  CAPTURE(shape_str({M, K, N}, d));
  HostTensor a = random_tensor(d, {M, K}, seed), b = random_tensor(d, {K, N}, seed + 1);
  std::vector<HostTensor> out =
      run_kernel(trace("matmul", [](Tensor x, Tensor y) { return kernels::matmul(x, y); }, a.spec("a"), b.spec("b")),
                 {&a, &b}, Mode::streams_interp);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].dtype == d);
  REQUIRE(out[0].shape == Shape({M, N}));
  std::vector<double> av(a.size()), bv(b.size());
  for (int64_t i = 0; i < a.size(); ++i) av[i] = a.get(i);
  for (int64_t i = 0; i < b.size(); ++i) bv[i] = b.get(i);
  const double rel = d == DType::float32 ? 0.0 : 1e-2;
  Worst w;
  std::vector<double> ref(N), mag(N);
  for (int64_t m = 0; m < M; ++m) {
    std::fill(ref.begin(), ref.end(), 0.0);
    std::fill(mag.begin(), mag.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const double x = av[m * K + k];
      for (int64_t n = 0; n < N; ++n) {
        ref[n] += x * bv[k * N + n];
        mag[n] += std::abs(x * bv[k * N + n]);
      }
    }
    for (int64_t n = 0; n < N; ++n)
      w.add(m * N + n, out[0].get(m * N + n), ref[n], 1e-5 * mag[n] + rel * std::abs(ref[n]) + 1e-30);
  }
  CHECK_WORST(w);
}

TEST_CASE("kernels: matmul a[M, K] @ b[K, N] matches a double reference, fp32 and bf16, with tails") {
  struct Case {
    int64_t M, K, N;
  };
  // Tiny and degenerate dims, every tail, exact tiles, several row blocks (4 x 128 rows each),
  // several column tiles (512), and K over many tiles and chunks.
  const Case cases[] = {{1, 1, 1},     {1, 7, 1},       {3, 1, 5},      {127, 129, 511}, {128, 128, 512},
                        {129, 257, 513}, {520, 130, 40}, {1, 1000, 3},  {70, 3000, 20},  {640, 64, 130},
                        {33, 96, 1100}};
  uint32_t seed = 11;
  for (DType d : {DType::float32, DType::bfloat16})
    for (const Case& c : cases) check_matmul(c.M, c.K, c.N, d, seed += 2);
}

TEST_CASE("kernels: matmul with K too large for one transposed block sums K blocks through HBM") {
  // Each K exceeds what the transposed row block can hold in SBUF for that M and dtype: one row
  // block and one column tile, two row blocks (the last one partial), two column tiles.
  check_matmul(2, 40000, 3, DType::float32, 101);
  check_matmul(2, 80000, 3, DType::bfloat16, 103);
  check_matmul(520, 8000, 3, DType::float32, 105);
  check_matmul(520, 16000, 3, DType::bfloat16, 107);
  check_matmul(1, 32000, 520, DType::float32, 109);
}

TEST_CASE("kernels: matmul rejects mismatched shapes and dtypes with the caller's line") {
  auto error = [](TensorSpec a, TensorSpec b) -> std::string {
    try {
      trace("matmul", [](Tensor x, Tensor y) { return kernels::matmul(x, y); }, a, b);
    } catch (const KernelError& e) {
      return e.what();
    }
    return {};
  };
  const std::string k = error(spec({4, 8}, DType::float32), spec({7, 3}, DType::float32));
  CHECK(k.find("matmul: contraction sizes differ: a is [4, 8], b is [7, 3]") != std::string::npos);
  CHECK(k.find("test_kernels_matmul_softmax.cpp") != std::string::npos);
  const std::string d = error(spec({4, 8}, DType::float32), spec({8, 3}, DType::bfloat16));
  CHECK(d.find("matmul: a is float32 but b is bfloat16") != std::string::npos);
  const std::string r = error(spec({4, 8, 2}, DType::float32), spec({8, 3}, DType::float32));
  CHECK(r.find("must be 2-D") != std::string::npos);
}

TEST_CASE("kernels: softmax and softmax_bwd reject inputs they do not handle") {
  auto error = [](auto&& fn, auto... specs) -> std::string {
    try {
      trace("k", fn, specs...);
    } catch (const KernelError& e) {
      return e.what();
    }
    return {};
  };
  CHECK(error([](Tensor x) { return kernels::softmax(x); }, spec({2, 3, 4}, DType::float32))
            .find("softmax: expected a 2-D float tensor, got float32[2, 3, 4]") != std::string::npos);
  CHECK(error([](Tensor x) { return kernels::softmax(x); }, spec({2, 3}, DType::int32))
            .find("expected a 2-D float tensor") != std::string::npos);
  CHECK(error([](Tensor y, Tensor g) { return kernels::softmax_bwd(y, g); }, spec({4, 8}, DType::float32),
              spec({4, 9}, DType::float32))
            .find("softmax_bwd: out is [4, 8] but grad_out is [4, 9]") != std::string::npos);
}

/** Softmax of row r of x in double. */
std::vector<double> softmax_row(const HostTensor& x, int64_t r, int64_t C) {
  std::vector<double> y(C);
  double mx = -INFINITY, sum = 0;
  for (int64_t c = 0; c < C; ++c) mx = std::max(mx, double(x.get(r * C + c)));
  for (int64_t c = 0; c < C; ++c) sum += y[c] = std::exp(double(x.get(r * C + c)) - mx);
  for (double& v : y) v /= sum;
  return y;
}

TEST_CASE("kernels: softmax over rows of any length matches a double reference") {
  struct Case {
    int64_t R, C;
    DType d;
  };
  // Single elements, row tails, short rows packed several per partition (narrow ones with
  // whole-tile instructions, wider ones with one instruction per packed row), a row that needs
  // SBUF whole, and rows too long for SBUF (two passes over column chunks, partial last chunk).
  const Case cases[] = {{1, 1, DType::float32},      {1, 7, DType::bfloat16},      {5, 1, DType::float32},
                        {128, 512, DType::float32},  {300, 77, DType::bfloat16},   {1030, 24, DType::float32},
                        {2100, 3, DType::bfloat16},  {2100, 40, DType::float32},   {129, 4096, DType::bfloat16},
                        {9, 7001, DType::float32},   {3, 20000, DType::bfloat16}, {2, 9000, DType::float32}};
  uint32_t seed = 31;
  for (const Case& c : cases) {
    CAPTURE(shape_str({c.R, c.C}, c.d));
    HostTensor x = random_tensor(c.d, {c.R, c.C}, seed++, -8.0f, 8.0f);
    std::vector<HostTensor> out =
        run_kernel(trace("softmax", [](Tensor t) { return kernels::softmax(t); }, x.spec("x")), {&x}, Mode::streams_interp);
    REQUIRE(out[0].dtype == c.d);
    const double rel = c.d == DType::float32 ? 2e-5 : 1e-2;
    Worst w;
    for (int64_t r = 0; r < c.R; ++r) {
      const std::vector<double> y = softmax_row(x, r, c.C);
      for (int64_t j = 0; j < c.C; ++j) w.add(r * c.C + j, out[0].get(r * c.C + j), y[j], rel * y[j] + 1e-38);
    }
    CHECK_WORST(w);
  }
}

TEST_CASE("kernels: softmax_bwd over rows of any length matches a double reference") {
  struct Case {
    int64_t R, C;
    DType d;
  };
  const Case cases[] = {{1, 1, DType::float32},    {1, 9, DType::bfloat16},     {200, 96, DType::float32},
                        {700, 33, DType::bfloat16}, {129, 2048, DType::float32}, {1100, 10, DType::float32},
                        {2100, 40, DType::bfloat16}, {4, 9000, DType::float32},  {3, 15000, DType::bfloat16}};
  uint32_t seed = 61;
  for (const Case& c : cases) {
    CAPTURE(shape_str({c.R, c.C}, c.d));
    // out is a genuine softmax (rounded to the dtype), grad_out is arbitrary.
    HostTensor logits = random_tensor(DType::float32, {c.R, c.C}, seed++, -4.0f, 4.0f);
    HostTensor y(c.d, {c.R, c.C});
    for (int64_t r = 0; r < c.R; ++r) {
      const std::vector<double> row = softmax_row(logits, r, c.C);
      for (int64_t j = 0; j < c.C; ++j) y.set(r * c.C + j, float(row[j]));
    }
    HostTensor dy = random_tensor(c.d, {c.R, c.C}, seed++);
    std::vector<HostTensor> out =
        run_kernel(trace("softmax_bwd", [](Tensor a, Tensor b) { return kernels::softmax_bwd(a, b); }, y.spec("out"),
                         dy.spec("grad_out")),
                   {&y, &dy}, Mode::streams_interp);
    REQUIRE(out[0].dtype == c.d);
    const double rel = c.d == DType::float32 ? 1e-5 : 1e-2;
    Worst w;
    for (int64_t r = 0; r < c.R; ++r) {
      double dot = 0, dot_mag = 0;
      for (int64_t j = 0; j < c.C; ++j) {
        dot += double(y.get(r * c.C + j)) * dy.get(r * c.C + j);
        dot_mag += std::abs(double(y.get(r * c.C + j)) * dy.get(r * c.C + j));
      }
      for (int64_t j = 0; j < c.C; ++j) {
        const double yv = y.get(r * c.C + j), g = dy.get(r * c.C + j);
        w.add(r * c.C + j, out[0].get(r * c.C + j), yv * (g - dot),
              rel * yv * (std::abs(g) + std::abs(dot) + dot_mag) + 1e-38);
      }
    }
    CHECK_WORST(w);
  }
}

TEST_CASE("kernels: large shapes of matmul and softmax fit SBUF and PSUM (compile only)") {
  // The block sizes are chosen from the SBUF budget; these straddle the thresholds where matmul
  // splits K and softmax switches to column chunks. Allocation failures would throw.
  jit::CompileOptions o;
  o.native = false;
  o.disk_cache = false;
  for (DType d : {DType::bfloat16, DType::float32}) {
    for (int64_t K : {4096, 5120, 5248, 11264, 11392, 12288, 30000}) {
      CAPTURE(shape_str({512, K, 1024}, d));
      CHECK_NOTHROW(jit::compile(
          trace("matmul", [](Tensor x, Tensor y) { return kernels::matmul(x, y); }, spec({512, K}, d), spec({K, 1024}, d)),
          o));
    }
    for (int64_t C : {4096, 6655, 6656, 9983, 9984, 13000, 65536, 100000}) {
      CAPTURE(shape_str({256, C}, d));
      CHECK_NOTHROW(jit::compile(trace("softmax", [](Tensor t) { return kernels::softmax(t); }, spec({256, C}, d)), o));
      CHECK_NOTHROW(jit::compile(trace("softmax_bwd", [](Tensor a, Tensor b) { return kernels::softmax_bwd(a, b); },
                                       spec({256, C}, d), spec({256, C}, d)),
                                 o));
    }
  }
}

}  // namespace
}  // namespace nikki::test
