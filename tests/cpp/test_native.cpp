// The native executor against the reference interpreter, bit for bit, and the streams against
// program order: every kernel here runs three ways and must produce identical bytes.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "harness.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/softmax/softmax.hpp"

namespace {

using namespace nikki;
using test::HostTensor;
using test::Mode;

/** Where two outputs first differ (element index, both bit patterns), or "" when they agree. */
std::string first_difference(const HostTensor& want, const HostTensor& got) {
  const int64_t size = dtype_size(want.dtype);
  for (int64_t e = 0; e < want.size(); ++e) {
    uint32_t w = 0, g = 0;
    std::memcpy(&w, want.bytes.data() + e * size, size);
    std::memcpy(&g, got.bytes.data() + e * size, size);
    if (w != g) return fmt::format(": element {} is {:#x}, the reference has {:#x}", e, g, w);
  }
  return {};
}

/** Runs `fn` three ways and checks that every output is bitwise identical; returns how many
 * instructions the native run left to the reference semantics. */
template <class Fn, class... T>
int64_t compare_modes(const std::string& what, Fn fn, T&... inputs) {
  test::RunCounts counts;
  auto run = [&](Mode mode) {
    Kernel k = trace(what, fn, inputs.spec()...);
    return test::run_kernel(std::move(k), {&inputs...}, mode, {}, &counts);
  };
  std::vector<HostTensor> ref = run(Mode::program_order);
  for (Mode mode : {Mode::streams_interp, Mode::streams_native}) {
    std::vector<HostTensor> got = run(mode);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const std::string where = fmt::format("{} output {} ({}){}", what, i, mode == Mode::streams_native ? "native" : "streams",
                                            first_difference(ref[i], got[i]));
      INFO(where);
      CHECK(got[i].bytes == ref[i].bytes);
    }
  }
  return counts.interpreted;
}

/** Runs `fn` three ways and checks that every output is bitwise identical. */
template <class Fn, class... T>
std::vector<HostTensor> check_all_modes(const char* what, Fn fn, T&... inputs) {
  test::RunCounts counts;
  auto run = [&](Mode mode) {
    Kernel k = trace(what, fn, inputs.spec()...);
    return test::run_kernel(std::move(k), {&inputs...}, mode, {}, &counts);
  };
  std::vector<HostTensor> ref = run(Mode::program_order);
  for (Mode mode : {Mode::streams_interp, Mode::streams_native}) {
    std::vector<HostTensor> got = run(mode);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const std::string where = fmt::format("{} output {} ({}){}", what, i, mode == Mode::streams_native ? "native" : "streams",
                                            first_difference(ref[i], got[i]));
      INFO(where);
      CHECK(got[i].bytes == ref[i].bytes);
    }
  }
  // Every instruction of these kernels has a native routine: none may fall back silently.
  CHECK(counts.interpreted == 0);
  CHECK(counts.native > 0);
  return ref;
}

/** A fresh SBUF tile holding `src` (an HBM tensor or view), optionally converted. */
Tensor to_sbuf(const Tensor& src, std::optional<DType> dtype = std::nullopt) {
  Tensor t = nl::ndarray(src.shape(), dtype.value_or(src.dtype()), nl::sbuf);
  isa::dma_copy(t, src);
  return t;
}

/** A kernel output holding `t` (PSUM goes through SBUF: DMA cannot read PSUM). */
Tensor to_hbm(const Tensor& t) {
  Tensor src = t;
  if (t.buffer() == nl::psum) {
    src = nl::ndarray(t.shape(), t.dtype(), nl::sbuf);
    isa::tensor_copy(src, t);
  }
  Tensor out = nl::ndarray(t.shape(), t.dtype(), nl::shared_hbm);
  isa::dma_copy(out, src);
  return out;
}

/** Random integers in [lo, hi] (also a source of ties: few distinct values). */
HostTensor integers(DType dtype, Shape shape, uint32_t seed, int64_t lo, int64_t hi) {
  HostTensor t(dtype, shape);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  for (int64_t i = 0; i < t.size(); ++i) t.set_int(i, dist(rng));
  return t;
}

/**
 * The NaN the host's arithmetic produces (inf - inf). Which of two different NaN operands an
 * arithmetic operator returns is up to the compiler (it may commute an add or a multiply), so
 * inputs use this one NaN: then every NaN a kernel can produce has the same bits.
 */
float host_nan() {
  volatile float inf = INFINITY;
  return inf - inf;
}

/** fp32 values from a small set (ties, duplicates, +-0) with NaN, +-inf sprinkled in. */
HostTensor tricky(Shape shape, uint32_t seed, bool specials = true) {
  HostTensor t(DType::float32, shape);
  std::mt19937 rng(seed);
  const float pool[] = {-0.0f, 0.0f, 1.5f, -1.5f, 2.25f, 3.0f, -7.0f, 0.5f, 1e-3f, -2.0f};
  const float odd[] = {host_nan(), host_nan(), INFINITY, -INFINITY};
  for (int64_t i = 0; i < t.size(); ++i) {
    const uint32_t r = rng();
    float v = pool[r % 10];
    if (specials && r % 23 == 0) v = odd[(r >> 8) % 4];
    std::memcpy(t.bytes.data() + 4 * i, &v, 4);
  }
  return t;
}

/** [rows, n] fp32 of only non-positive values (-0, +0, -1.5, -inf), so that a row's maximum is
 * often a zero whose sign a fold must reproduce; every other row also holds a few NaNs (about one
 * element in 200). */
HostTensor nonpositive(int64_t rows, int64_t n, uint32_t seed) {
  HostTensor t(DType::float32, {rows, n});
  std::mt19937 rng(seed);
  const float pool[] = {-0.0f, 0.0f, -1.5f, -INFINITY};
  for (int64_t i = 0; i < t.size(); ++i) {
    const uint32_t r = rng() % 200;
    const float v = (i / n) % 2 == 0 && r == 0 ? host_nan() : pool[r % 4];
    std::memcpy(t.bytes.data() + 4 * i, &v, 4);
  }
  return t;
}

}  // namespace

TEST_CASE("native: tiled matmul with tails matches the interpreter bit for bit") {
  HostTensor a = test::random_tensor(DType::bfloat16, {130, 200}, 1), b = test::random_tensor(DType::bfloat16, {200, 600}, 2);
  check_all_modes("matmul", [](Tensor x, Tensor y) { return kernels::matmul(x, y, nl::float32); }, a, b);
  HostTensor c = test::random_tensor(DType::float32, {64, 128}, 3), d = test::random_tensor(DType::float32, {128, 40}, 4);
  check_all_modes("matmul_f32", [](Tensor x, Tensor y) { return kernels::matmul(x, y); }, c, d);
}

TEST_CASE("native: softmax matches the interpreter bit for bit") {
  HostTensor x = test::random_tensor(DType::float32, {300, 257}, 5, -8, 8);
  check_all_modes("softmax", [](Tensor t) { return kernels::softmax(t); }, x);
  HostTensor y = test::random_tensor(DType::bfloat16, {64, 1000}, 6, -8, 8);
  check_all_modes("softmax_bf16", [](Tensor t) { return kernels::softmax(t); }, y);
}

TEST_CASE("native: element-wise instructions, dtype conversions and views") {
  HostTensor x = test::random_tensor(DType::float32, {128, 96}, 7, -3, 3);
  HostTensor y = test::random_tensor(DType::bfloat16, {128, 96}, 8, -3, 3);
  check_all_modes("elementwise",
                  [](Tensor a, Tensor b) {
                    Tensor ta = nl::ndarray({128, 96}, nl::float32), tb = nl::ndarray({128, 2, 48}, nl::bfloat16);
                    isa::dma_copy(ta, a);
                    isa::dma_copy(tb, b.reshape({128, 2, 48}));
                    Tensor s = nl::ndarray({128, 96}, nl::float16);
                    isa::tensor_tensor(s, ta, tb.reshape({128, 96}), nl::multiply);
                    Tensor col = nl::ndarray({128, 1}, nl::float32);
                    isa::tensor_reduce(col, nl::add, ta, {1});
                    Tensor u = nl::ndarray({128, 96}, nl::float8_e4m3);
                    isa::tensor_scalar(u, s, nl::subtract, col, {.reverse0 = true, .op1 = nl::maximum, .operand1 = -4.0});
                    Tensor v = nl::ndarray({128, 96}, nl::float32);
                    isa::activation(v, nl::gelu_apprx_tanh, u, {.bias = col, .scale = 0.5});
                    Tensor w = nl::ndarray({128, 96}, nl::bfloat16);
                    isa::scalar_tensor_tensor(w, v, nl::multiply, col, nl::add, ta);
                    isa::reciprocal(w, w);
                    Tensor out = nl::ndarray({128, 96}, nl::float32, nl::shared_hbm);
                    isa::dma_copy(out(Slice{}, Slice{0, 96, 2}), w(Slice{}, Slice{0, 48}));
                    isa::dma_copy(out(Slice{}, Slice{1, 96, 2}), v(Slice{}, Slice{48, 96}));
                    return out;
                  },
                  x, y);
}

TEST_CASE("native: reductions over several axes, transposes and integer tiles") {
  HostTensor x = test::random_tensor(DType::float32, {96, 4, 6, 8}, 9);
  check_all_modes("reduce",
                  [](Tensor a) {
                    Tensor t = nl::ndarray({96, 4, 6, 8}, nl::float32);
                    isa::dma_copy(t, a);
                    Tensor r1 = nl::ndarray({96, 4}, nl::float32), r2 = nl::ndarray({96, 4, 6}, nl::float32);
                    isa::tensor_reduce(r1, nl::maximum, t, {2, 3}, true);
                    isa::tensor_reduce(r2, nl::add, t, {3});
                    Tensor tr = nl::ndarray({4, 96}, nl::float32, nl::psum);
                    isa::nc_transpose(tr, r1);
                    Tensor i32 = nl::ndarray({96, 24}, nl::int32);
                    isa::tensor_copy(i32, r2.reshape({96, 24}));
                    Tensor sh = nl::ndarray({96, 24}, nl::int32);
                    isa::tensor_tensor(sh, i32, i32, nl::add);  // GpSimd exact integers
                    isa::tensor_scalar(sh, sh, nl::bitwise_and, 0x7f);
                    Tensor out = nl::ndarray({100, 96}, nl::float32, nl::shared_hbm);
                    Tensor trs = nl::ndarray({4, 96}, nl::float32);
                    isa::tensor_copy(trs, tr);
                    isa::dma_copy(out(Slice{0, 4}, Slice{}), trs);
                    Tensor shf = nl::ndarray({96, 24}, nl::float32);
                    isa::tensor_copy(shf, sh);
                    isa::dma_copy(out(Slice{4, 100}, Slice{0, 24}), shf);
                    // a broadcast (stride-0) source view: each of 18 values repeated 4 times
                    isa::dma_copy(out(Slice{4, 100}, Slice{24, 96}).reshape({96, 18, 4}),
                                  r2(Slice{}, Slice{0, 3}).flatten_dims(1, 2).expand_dim(2).broadcast(2, 4));
                    return out;
                  },
                  x);
}

// =================================================================================================
// Existing routines against the reference semantics: views of different shapes, accumulators,
// integer destinations, the PSUM "written" flags.
// =================================================================================================

TEST_CASE("native: operands of different shapes pair elements in flattened order") {
  HostTensor x = test::random_tensor(DType::float32, {128, 24}, 11, -4, 4);
  HostTensor y = test::random_tensor(DType::bfloat16, {128, 24}, 12, -4, 4);
  HostTensor h = test::random_tensor(DType::float32, {4, 8, 96}, 13, -4, 4);
  check_all_modes("shapes",
                  [](Tensor x, Tensor y, Tensor h) {
                    Tensor sx = to_sbuf(x), sy = to_sbuf(y);
                    std::vector<Tensor> r;
                    // [4, 6] against [6, 4]: both contiguous, so they pair as [24]
                    Tensor a = nl::ndarray({128, 4, 6}, nl::float32);
                    isa::tensor_tensor(a, sx.reshape({128, 6, 4}), sy.reshape({128, 4, 6}), nl::subtract);
                    r.push_back(to_hbm(a));
                    // a transposed operand: element (p, i, j) of dst pairs with (p, j, i) of data
                    Tensor b = nl::ndarray({128, 24}, nl::bfloat16);
                    isa::tensor_scalar(b, sx.reshape({128, 4, 6}).permute({0, 2, 1}), nl::multiply, 3.0,
                                       {.op1 = nl::add, .operand1 = -1.0});
                    r.push_back(to_hbm(b));
                    // reversed free dim (raw access pattern with a negative stride)
                    Tensor c = nl::ndarray({128, 2, 12}, nl::float32);
                    isa::tensor_copy(c, sx.ap({{24, 128}, {-1, 24}}, ApOptions{.offset = 23}));
                    r.push_back(to_hbm(c));
                    Tensor e = nl::ndarray({128, 24}, nl::float16);
                    isa::activation(e, nl::tanh, sy.reshape({128, 2, 3, 4}).permute({0, 3, 1, 2}));
                    r.push_back(to_hbm(e));
                    // DMA between views of different ranks and layouts
                    Tensor d = nl::ndarray({32, 4, 24}, nl::float32);
                    isa::dma_copy(d.reshape({8, 4, 4, 24}), h.reshape({4, 8, 4, 24}).permute({1, 0, 2, 3}));
                    Tensor out = nl::ndarray({96, 32}, nl::float32, nl::shared_hbm);
                    isa::dma_copy(out, d.reshape({32, 96}).permute({1, 0}));
                    r.push_back(out);
                    return r;
                  },
                  x, y, h);
}

TEST_CASE("native: activation reduce over multi-dim free views across reduce_cmd sequences") {
  HostTensor x = test::random_tensor(DType::float32, {128, 96}, 21, -2, 2);
  HostTensor b = test::random_tensor(DType::float32, {128, 1}, 22, -1, 1);
  HostTensor s = test::random_tensor(DType::float32, {128, 1}, 23, 0.5, 1.5);
  check_all_modes("activation_reduce",
                  [](Tensor x, Tensor b, Tensor s) {
                    Tensor sx = to_sbuf(x), sb = to_sbuf(b), ss = to_sbuf(s);
                    Tensor px = nl::ndarray({128, 96}, nl::float32, nl::psum);
                    isa::tensor_copy(px, sx);
                    std::vector<Tensor> r;
                    auto res = [] { return nl::ndarray({128, 1}, nl::float32); };
                    Tensor d1 = nl::ndarray({128, 4, 24}, nl::bfloat16), r1 = res();
                    isa::activation(d1, nl::exp, sx.reshape({128, 24, 4}).permute({0, 2, 1}),
                                    {.bias = sb, .scale = ss, .reduce_op = nl::add, .reduce_res = r1});
                    Tensor d2 = nl::ndarray({128, 2, 3, 16}, nl::float32), r2 = res();
                    isa::activation(d2, nl::square, px.reshape({128, 16, 6}).permute({0, 2, 1}).reshape({128, 2, 3, 16}),
                                    {.scale = 0.25, .reduce_op = nl::add, .reduce_res = r2, .reduce_cmd = ReduceCmd::reduce});
                    Tensor d3 = nl::ndarray({128, 96}, nl::float32);
                    isa::activation(d3, nl::copy, sx, {.reduce_op = nl::add, .reduce_cmd = ReduceCmd::idle});
                    Tensor r3 = res();
                    isa::activation(d3(nl::all, Slice{0, std::nullopt, 2}), nl::gelu, sx(nl::all, nl::ds(0, 48)),
                                    {.reduce_op = nl::add, .reduce_res = r3, .reduce_cmd = ReduceCmd::reduce});
                    Tensor r4 = res();
                    isa::activation(d3(nl::ds(64, 64), nl::all), nl::exp, sx(nl::ds(0, 64), nl::all),
                                    {.reduce_op = nl::add, .reduce_res = r4(nl::ds(64, 64), nl::all),
                                     .reduce_cmd = ReduceCmd::reset});
                    isa::activation(d3(nl::ds(0, 64), nl::all), nl::sin, sx(nl::ds(64, 64), nl::all),
                                    {.reduce_op = nl::add, .reduce_res = r4(nl::ds(0, 64), nl::all),
                                     .reduce_cmd = ReduceCmd::reduce});
                    for (const Tensor& t : {d1, r1, d2, r2, d3, r3, r4}) r.push_back(to_hbm(t));
                    return r;
                  },
                  x, b, s);
}

TEST_CASE("native: tensor_reduce with negate into integer and float destinations") {
  HostTensor k = integers(DType::int32, {128, 4, 8}, 31, -(int64_t(1) << 30), int64_t(1) << 30);
  HostTensor j = integers(DType::int16, {128, 40}, 32, -30000, 30000);
  HostTensor x = tricky({128, 40}, 33);
  check_all_modes("reduce_negate",
                  [](Tensor k, Tensor j, Tensor x) {
                    Tensor sk = to_sbuf(k), sj = to_sbuf(j), sx = to_sbuf(x);
                    std::vector<Tensor> r;
                    auto red = [&](DType dt, Shape shape, const nl::Op& op, const Tensor& data, std::vector<int> axes,
                                   bool negate) {
                      Tensor d = nl::ndarray(shape, dt);
                      isa::tensor_reduce(d, op, data, axes, negate);
                      r.push_back(to_hbm(d));
                    };
                    red(nl::int32, {128, 4}, nl::add, sk, {2}, true);
                    red(nl::int32, {128, 1}, nl::maximum, sk, {1, 2}, true);
                    red(nl::uint8, {128, 4}, nl::maximum, sk, {2}, true);
                    red(nl::int8, {128, 4}, nl::minimum, sk, {2}, true);
                    red(nl::uint16, {128, 1}, nl::add, sj, {1}, true);
                    red(nl::int16, {128, 5}, nl::add, sj.reshape({128, 5, 8}), {2}, true);
                    red(nl::float32, {128, 8}, nl::multiply, sj.reshape({128, 8, 5}), {2}, true);
                    red(nl::bfloat16, {128, 1}, nl::add, sk, {1, 2}, true);
                    red(nl::int32, {128, 4}, nl::maximum, sx.reshape({128, 4, 10}), {2}, true);
                    red(nl::float32, {128, 4}, nl::minimum, sx.reshape({128, 4, 10}), {2}, true);
                    red(nl::int32, {128, 4}, nl::bitwise_xor, sk, {2}, false);
                    red(nl::float32, {128, 8, 1}, nl::subtract, sj.reshape({128, 8, 5}), {2}, true);
                    return r;
                  },
                  k, j, x);
}

TEST_CASE("native: tensor_reduce's pairwise sums, reordered max / min and ordered folds on every run length and layout") {
  // Runs up to 3000 elements (the recursive halving of the pairwise sum), fp32 sources read in
  // place and strided, permuted or bf16 sources fetched into blocks, one and two reduced axes.
  // Rows of 8..64 elements in 2-D views go through transposed blocks of 16 partitions, longer ones
  // fold row by row: every length class of the pairwise block sum (whole steps of 8 only, a
  // remainder) on both sides of that limit, partition counts that leave a block partly empty.
  // Specials: NaN, +-inf and +-0 (tricky); and rows with no positive values, so that the maximum
  // is a zero whose sign the fold must reproduce, half of them with a few NaNs.
  HostTensor x = test::random_tensor(DType::float32, {128, 3000}, 34, -3, 3);
  HostTensor sp = tricky({128, 3000}, 35);
  HostTensor z = nonpositive(128, 3000, 36);
  check_all_modes("reduce_orders",
                  [](Tensor x, Tensor sp, Tensor z) {
                    const Tensor sources[] = {to_sbuf(x), to_sbuf(sp), to_sbuf(z), to_sbuf(x, nl::bfloat16)};
                    std::vector<Tensor> r;
                    for (const nl::Op& op : {nl::add, nl::maximum, nl::minimum, nl::subtract})
                      for (const Tensor& s : sources) {
                        Tensor rows = nl::ndarray({128, 12}, nl::float32);
                        isa::memset(rows, 0.0);
                        const int64_t short_lengths[] = {8, 9, 16, 17, 33, 63, 64, 65, 128};
                        for (int64_t c = 0; c < 9; ++c)
                          isa::tensor_reduce(rows(nl::all, nl::ds(c, 1)), op, s(nl::all, nl::ds(0, short_lengths[c])),
                                             {1}, c % 2 == 1);
                        // 100 and 9 partitions: the last block partly empty; a strided row
                        isa::tensor_reduce(rows(nl::ds(0, 100), nl::ds(9, 1)), op, s(nl::ds(0, 100), nl::ds(3, 29)), {1});
                        isa::tensor_reduce(rows(nl::ds(32, 9), nl::ds(10, 1)), op, s(nl::ds(32, 9), nl::ds(0, 25)), {1});
                        isa::tensor_reduce(rows(nl::all, nl::ds(11, 1)), op, s(nl::all, Slice{1, 64, 3}), {1});
                        r.push_back(to_hbm(rows));
                        Tensor d = nl::ndarray({128, 16}, nl::float32);
                        auto col = [&](int64_t c, int64_t n = 1) { return d(nl::all, nl::ds(c, n)); };
                        const int64_t lengths[] = {1, 9, 129, 300, 3000};
                        for (int64_t c = 0; c < 5; ++c) isa::tensor_reduce(col(c), op, s(nl::all, nl::ds(0, lengths[c])), {1});
                        isa::tensor_reduce(col(5), op, s.reshape({128, 24, 125}), {1, 2});
                        // innermost dim contiguous, the outer reduced one strided: blocks span segments
                        isa::tensor_reduce(col(6), op, s.reshape({128, 30, 100})(nl::all, nl::all, nl::ds(0, 90)), {1, 2});
                        isa::tensor_reduce(col(7), op, s.reshape({128, 125, 24}).permute({0, 2, 1}), {1, 2});
                        isa::tensor_reduce(col(8, 3), op, s.reshape({128, 3, 1000}), {2});
                        isa::tensor_reduce(col(11, 5), op, s.reshape({128, 5, 2, 300}), {2, 3}, true);
                        // a partition subset
                        isa::tensor_reduce(d(nl::ds(64, 64), nl::ds(0, 1)), op, s(nl::ds(0, 64), nl::ds(0, 257)), {1});
                        r.push_back(to_hbm(d));
                        Tensor h = nl::ndarray({128, 1}, nl::bfloat16);  // rounding the fold to bf16
                        isa::tensor_reduce(h, op, s(nl::all, nl::ds(0, 2000)), {1}, true);
                        r.push_back(to_hbm(h));
                      }
                    return r;
                  },
                  x, sp, z);
}

TEST_CASE("native: nc_matmul partial PSUM tiles and automatic accumulation per written word") {
  HostTensor a = test::random_tensor(DType::float32, {96, 128}, 41), b = test::random_tensor(DType::float32, {96, 256}, 42);
  check_all_modes("matmul_partial",
                  [](Tensor a, Tensor b) {
                    Tensor sa = to_sbuf(a), sb = to_sbuf(b);
                    Tensor q = nl::ndarray({128, 256}, nl::float32, nl::psum);
                    // overlapping partial tiles: the second accumulates where the first wrote only
                    isa::nc_matmul(q(nl::ds(0, 64), nl::ds(0, 100)), sa(nl::all, nl::ds(0, 64)), sb(nl::all, nl::ds(0, 100)));
                    isa::nc_matmul(q(nl::all, nl::ds(50, 100)), sa, sb(nl::all, nl::ds(100, 100)));
                    // a strided destination, a single-partition destination, explicit flags
                    isa::nc_matmul(q(nl::ds(32, 32), Slice{0, 256, 2}), sa(nl::all, nl::ds(7, 32)), sb(nl::all, nl::ds(0, 128)));
                    isa::nc_matmul(q(nl::ds(64, 1), nl::ds(160, 90)), sa(nl::all, nl::ds(3, 1)), sb(nl::all, nl::ds(10, 90)));
                    isa::nc_matmul(q(nl::ds(64, 1), nl::ds(150, 90)), sa(nl::all, nl::ds(5, 1)), sb(nl::all, nl::ds(20, 90)));
                    isa::nc_matmul(q(nl::ds(96, 32), nl::ds(200, 56)), sa(nl::all, nl::ds(0, 32)), sb(nl::all, nl::ds(0, 56)),
                                   {.accumulate = true});
                    isa::nc_matmul(q(nl::ds(0, 32), nl::ds(0, 30)), sa(nl::all, nl::ds(0, 32)), sb(nl::all, nl::ds(0, 30)),
                                   {.accumulate = false});
                    return to_hbm(q);
                  },
                  a, b);
}

TEST_CASE("native: nc_matmul transpose mode moves bits and leaves the PSUM written flags alone") {
  HostTensor x = tricky({64, 32}, 51);
  HostTensor eye(DType::float32, {64, 64});
  for (int64_t i = 0; i < 64; ++i) eye.set(i * 64 + (i * 7) % 64, 1.0f);  // a permutation
  HostTensor odd(DType::float32, {64, 6});
  odd.set(0 * 6 + 0, 1.0f);                          // unit column
  odd.set(3 * 6 + 1, 2.0f);                          // a single 2: not a unit vector
  odd.set(5 * 6 + 2, 1.0f), odd.set(9 * 6 + 2, 1.0f);  // two ones
  odd.set(7 * 6 + 4, -0.0f);                         // -0 counts as zero
  odd.set(8 * 6 + 4, 1.0f);
  odd.set(1 * 6 + 5, host_nan());                    // NaN is not zero
  HostTensor h(DType::bfloat16, {64, 32});
  for (int64_t i = 0; i < h.size(); ++i) h.set_int(i, int64_t(uint16_t(i * 40503u)));
  HostTensor eyeh(DType::bfloat16, {64, 64});
  for (int64_t i = 0; i < 64; ++i) eyeh.set(i * 64 + i, 1.0f);
  HostTensor a = test::random_tensor(DType::float32, {64, 32}, 52), b = test::random_tensor(DType::float32, {64, 64}, 53);
  check_all_modes("matmul_transpose",
                  [](Tensor x, Tensor eye, Tensor odd, Tensor h, Tensor eyeh, Tensor a, Tensor b) {
                    Tensor sx = to_sbuf(x), se = to_sbuf(eye), so = to_sbuf(odd), sh = to_sbuf(h), seh = to_sbuf(eyeh);
                    std::vector<Tensor> r;
                    Tensor t = nl::ndarray({32, 64}, nl::float32, nl::psum);
                    isa::nc_matmul(t, sx, se, {.is_transpose = true});
                    r.push_back(to_hbm(t));
                    Tensor u = nl::ndarray({32, 6}, nl::float32, nl::psum);
                    isa::nc_matmul(u, sx, so, {.is_transpose = true});
                    r.push_back(to_hbm(u));
                    Tensor th = nl::ndarray({32, 64}, nl::bfloat16, nl::psum);
                    isa::nc_matmul(th, sh, seh, {.is_transpose = true});
                    r.push_back(to_hbm(th));
                    // transpose mode marks nothing written: the next automatic matmul overwrites
                    // (finite values here, so only the flags can make a difference)
                    Tensor sa = to_sbuf(a), sb = to_sbuf(b);
                    Tensor w = nl::ndarray({32, 64}, nl::float32, nl::psum);
                    isa::nc_matmul(w, sa, se, {.is_transpose = true});
                    isa::nc_matmul(w, sa, sb);
                    r.push_back(to_hbm(w));
                    return r;
                  },
                  x, eye, odd, h, eyeh, a, b);
}

// =================================================================================================
// The remaining compute opcodes.
// =================================================================================================

TEST_CASE("native: tensor_scalar_reduce, and the Vector engine accumulator it leaves") {
  HostTensor x = test::random_tensor(DType::float32, {128, 96}, 61, -3, 3);
  HostTensor c = test::random_tensor(DType::float32, {128, 1}, 62, -2, 2);
  HostTensor t = tricky({128, 40}, 63);
  HostTensor k = integers(DType::int8, {128, 30}, 64, -128, 127);
  HostTensor pr = integers(DType::uint8, {128, 30}, 65, 0, 1);
  check_all_modes("tensor_scalar_reduce",
                  [](Tensor x, Tensor c, Tensor t, Tensor k, Tensor pr) {
                    Tensor sx = to_sbuf(x), sc = to_sbuf(c), st = to_sbuf(t), sk = to_sbuf(k), sp = to_sbuf(pr);
                    std::vector<Tensor> r;
                    auto res = [](DType dt = nl::float32) { return nl::ndarray({128, 1}, dt); };
                    Tensor d1 = nl::ndarray({128, 96}, nl::bfloat16), r1 = res();
                    isa::tensor_scalar_reduce(d1, sx, nl::multiply, sc, nl::add, r1);
                    Tensor d2 = nl::ndarray({128, 4, 24}, nl::int32), r2 = res(nl::bfloat16);
                    isa::tensor_scalar_reduce(d2, sx.reshape({128, 24, 4}).permute({0, 2, 1}), nl::add, 100.5, nl::maximum, r2);
                    Tensor d3 = nl::ndarray({128, 40}, nl::float32), r3 = res();
                    isa::tensor_scalar_reduce(d3, st, nl::abs, 0.0, nl::minimum, r3);
                    Tensor d4 = nl::ndarray({128, 40}, nl::float16), r4 = res();
                    isa::tensor_scalar_reduce(d4, st, nl::subtract, sc, nl::multiply, r4);
                    Tensor d5 = nl::ndarray({128, 30}, nl::uint8), r5 = res(nl::int32);
                    isa::tensor_scalar_reduce(d5, sk, nl::multiply, 3.0, nl::add, r5);
                    // partitions 64..127 only, with a strided dst
                    Tensor d6 = nl::ndarray({128, 64}, nl::float32);
                    isa::memset(d6, 0.0);
                    Tensor r6 = res();
                    isa::tensor_scalar_reduce(d6(nl::ds(64, 64), Slice{0, std::nullopt, 2}), sx(nl::ds(0, 64), nl::ds(0, 32)),
                                              nl::maximum, sc(nl::ds(64, 64), nl::all), nl::maximum, r6(nl::ds(64, 64), nl::all));
                    // select_reduce with reduce continues from the accumulator tensor_scalar_reduce left
                    Tensor d7 = nl::ndarray({128, 30}, nl::float32), r7 = res();
                    isa::tensor_scalar_reduce(d7, sk, nl::add, 0.0, nl::add, r7);
                    Tensor d8 = nl::ndarray({128, 30}, nl::float32), r8 = res();
                    isa::select_reduce(d8, sp, sk.reshape({128, 30}), -1e3,
                                       {.reduce_res = r8, .reduce_cmd = ReduceCmd::reduce});
                    for (const Tensor& v : {d1, r1, d2, r2, d3, r3, d4, r4, d5, r5, d6, r6(nl::ds(64, 64), nl::all), d7, r7, d8, r8})
                      r.push_back(to_hbm(v));
                    // folds over NaN, +-inf and +-0 (inf - inf makes a NaN that is not the canonical
                    // one), with each reduce_op tensor_scalar_reduce takes
                    for (const nl::Op& op : {nl::add, nl::maximum, nl::minimum, nl::multiply}) {
                      Tensor dn = nl::ndarray({128, 40}, nl::float32), rn = res();
                      isa::tensor_scalar_reduce(dn, st, nl::multiply, 2.0, op, rn);
                      r.push_back(to_hbm(rn));
                    }
                    Tensor dsel = nl::ndarray({128, 30}, nl::float32), rsel = res();
                    isa::select_reduce(dsel, sp, st(nl::all, nl::ds(0, 30)), -1e3, {.reduce_res = rsel});
                    r.push_back(to_hbm(rsel));
                    return r;
                  },
                  x, c, t, k, pr);
}

TEST_CASE("native: iota with patterns shaped unlike dst, int32 wrap-around and saturating dtypes") {
  HostTensor dummy = test::random_tensor(DType::float32, {1, 1}, 70);
  check_all_modes("iota",
                  [](Tensor) {
                    std::vector<Tensor> r;
                    auto iota = [&](Shape shape, DType dt, std::vector<Dim> pattern, int64_t offset, int64_t cm) {
                      Tensor t = nl::ndarray(shape, dt);
                      isa::iota(t, pattern, offset, cm);
                      r.push_back(to_hbm(t));
                    };
                    iota({128, 64}, nl::int32, {{1, 64}}, 0, 64);
                    iota({128, 4, 16}, nl::int32, {{1, 64}}, -5, 3);               // one pattern dim, two dst dims
                    iota({128, 64}, nl::int32, {{16, 4}, {1, 16}}, 7, -1);         // two pattern dims, one dst dim
                    iota({128, 8, 8}, nl::float32, {{-3, 8}, {0, 2}, {5, 4}}, 11, 2);
                    iota({128, 2, 3, 4}, nl::int16, {{1000, 2}, {-700, 3}, {1, 4}}, -30000, 256);
                    iota({128, 24}, nl::int32, {{1, 24}}, 2147483647 - 100, 1);    // wraps past INT32_MAX
                    iota({128, 24}, nl::int32, {{-1, 24}}, -2147483647 - 1 + 50, -1);
                    iota({128, 24}, nl::float32, {{1 << 30, 24}}, 0, 1 << 29);    // wraps, then rounds to fp32
                    iota({128, 40}, nl::int8, {{1, 40}}, -100, 1);                 // saturates at 127
                    iota({128, 40}, nl::uint8, {{1, 40}}, -20, 2);                 // negatives saturate at 0
                    iota({128, 40}, nl::uint16, {{3000, 40}}, 0, 1);
                    iota({128, 40}, nl::bfloat16, {{1, 40}}, 250, 3);
                    iota({96, 2, 5, 2, 3}, nl::uint32, {{1, 60}}, 0, -2);
                    // a strided dst view
                    Tensor t = nl::ndarray({128, 64}, nl::int32);
                    isa::memset(t, -1);
                    isa::iota(t(nl::ds(32, 32), Slice{1, std::nullopt, 2}), {{4, 8}, {1, 4}}, 3, 10);
                    r.push_back(to_hbm(t));
                    return r;
                  },
                  dummy);
}

TEST_CASE("native: affine_select with every comparison, converting and bit-exact copies") {
  HostTensor x = tricky({128, 64}, 71);
  HostTensor h = test::random_tensor(DType::bfloat16, {128, 64}, 72, -100, 100);
  check_all_modes("affine_select",
                  [](Tensor x, Tensor h) {
                    Tensor sx = to_sbuf(x), sh = to_sbuf(h);
                    std::vector<Tensor> r;
                    const nl::Op cmps[] = {nl::equal, nl::not_equal, nl::greater, nl::greater_equal, nl::less, nl::less_equal};
                    int i = 0;
                    for (const nl::Op& cmp : cmps) {
                      Tensor d = nl::ndarray({128, 64}, nl::float32);
                      isa::affine_select(d, {{1, 64}}, -1 + (i % 3), sx, -9984.0 + i, cmp, 3 * i - 8);
                      r.push_back(to_hbm(d));
                      ++i;
                    }
                    Tensor d1 = nl::ndarray({128, 8, 8}, nl::bfloat16);  // fp32 on_true rounded; dst 3-D, pattern 2-D
                    isa::affine_select(d1, {{8, 4}, {1, 16}}, -1, sx, 0.1, nl::greater_equal);
                    r.push_back(to_hbm(d1));
                    Tensor d2 = nl::ndarray({128, 64}, nl::bfloat16);  // same dtype: bits move
                    isa::affine_select(d2, {{1, 64}}, 1, sh.reshape({128, 8, 8}).permute({0, 2, 1}), -3.0, nl::less);
                    r.push_back(to_hbm(d2));
                    Tensor d3 = nl::ndarray({128, 64}, nl::int32);  // on_false converts to int (truncation)
                    isa::affine_select(d3, {{2, 32}, {-1, 2}}, -3, sh, -7.75, nl::greater);
                    r.push_back(to_hbm(d3));
                    Tensor d4 = nl::ndarray({128, 64}, nl::uint8);
                    isa::affine_select(d4, {{1, 64}}, 0, sh, 300.0, nl::equal, 0);
                    r.push_back(to_hbm(d4));
                    // offsets that wrap the int32 value
                    Tensor d5 = nl::ndarray({128, 64}, nl::float32);
                    isa::affine_select(d5, {{1 << 30, 64}}, 1 << 28, sx, 1.0, nl::less, 5);
                    r.push_back(to_hbm(d5));
                    return r;
                  },
                  x, h);
}

TEST_CASE("native: bn_stats and bn_aggr over chunks, odd sizes, multi-dim views, partial partitions and empty counts") {
  HostTensor x = test::random_tensor(DType::float32, {128, 1000}, 81, -1, 2);
  HostTensor y = test::random_tensor(DType::bfloat16, {128, 4, 25}, 82, 2, 4);
  HostTensor z = tricky({128, 40}, 83);
  check_all_modes("bn",
                  [](Tensor x, Tensor y, Tensor z) {
                    Tensor sx = to_sbuf(x), sy = to_sbuf(y), sz = to_sbuf(z);
                    std::vector<Tensor> r;
                    Tensor stats = nl::ndarray({128, 24}, nl::float32);
                    isa::bn_stats(stats(nl::all, nl::ds(0, 6)), sx(nl::all, nl::ds(0, 511)));
                    isa::bn_stats(stats(nl::all, nl::ds(6, 6)), sx(nl::all, nl::ds(511, 1)));
                    isa::bn_stats(stats(nl::all, nl::ds(12, 6)).reshape({128, 2, 3}), sx(nl::all, nl::ds(512, 488)));
                    isa::bn_stats(stats(nl::all, nl::ds(18, 6)), sx(nl::all, Slice{1, 200, 3}));
                    Tensor agg = nl::ndarray({128, 2}, nl::float32);
                    isa::bn_aggr(agg, stats);
                    Tensor agg2 = nl::ndarray({128, 1, 2}, nl::bfloat16);
                    isa::bn_aggr(agg2, stats.reshape({128, 4, 6}).permute({0, 2, 1}).reshape({128, 6, 4})(nl::all, nl::ds(0, 3), nl::all));
                    Tensor ys = nl::ndarray({128, 6}, nl::float32);
                    isa::bn_stats(ys, sy);
                    Tensor yagg = nl::ndarray({128, 2}, nl::float32);
                    isa::bn_aggr(yagg, ys);
                    Tensor zs = nl::ndarray({128, 6}, nl::bfloat16);
                    isa::bn_stats(zs, sz);  // NaN and inf inputs
                    // triples with zero counts are skipped; all-zero counts give a NaN variance
                    Tensor trip = nl::ndarray({128, 9}, nl::float32);
                    isa::memset(trip, 0.0);
                    Tensor zagg = nl::ndarray({128, 2}, nl::float32);
                    isa::bn_aggr(zagg, trip);
                    isa::tensor_copy(trip(nl::ds(0, 64), nl::ds(3, 3)), ys(nl::ds(0, 64), nl::ds(0, 3)));
                    Tensor zagg2 = nl::ndarray({128, 2}, nl::float32);
                    isa::bn_aggr(zagg2, trip);
                    // a partition count that is not a multiple of the native routine's block
                    Tensor part = nl::ndarray({128, 6}, nl::float32);
                    isa::memset(part, 0.0);
                    isa::bn_stats(part(nl::ds(0, 100), nl::all), sx(nl::ds(0, 100), nl::ds(3, 77)));
                    // rows of odd length in a view that cannot be flattened: the even/odd lanes
                    // alternate across rows
                    Tensor odd = nl::ndarray({128, 6}, nl::float32);
                    isa::bn_stats(odd, sy(nl::all, nl::all, nl::ds(1, 23)));
                    for (const Tensor& t : {stats, agg, agg2, ys, yagg, zs, zagg, zagg2, part, odd}) r.push_back(to_hbm(t));
                    return r;
                  },
                  x, y, z);
}

TEST_CASE("native: tensor_tensor_scan with operator pairs, reverse flags, initial values and views") {
  HostTensor d0 = test::random_tensor(DType::float32, {128, 64}, 91, -1, 1), d1 = test::random_tensor(DType::float32, {128, 64}, 92);
  HostTensor init = test::random_tensor(DType::float32, {128, 1}, 93);
  HostTensor t = tricky({128, 64}, 94);
  check_all_modes("scan",
                  [](Tensor d0, Tensor d1, Tensor init, Tensor t) {
                    Tensor s0 = to_sbuf(d0), s1 = to_sbuf(d1), si = to_sbuf(init), st = to_sbuf(t);
                    std::vector<Tensor> r;
                    struct Case {
                      nl::Op op0, op1;
                      bool r0, r1, col;
                    };
                    const Case cases[] = {{nl::multiply, nl::add, false, false, false},
                                          {nl::add, nl::multiply, true, false, true},
                                          {nl::maximum, nl::subtract, false, true, true},
                                          {nl::subtract, nl::minimum, true, true, false}};
                    for (const Case& c : cases) {
                      Tensor d = nl::ndarray({128, 8, 8}, nl::float32);
                      isa::tensor_tensor_scan(d, s0.reshape({128, 8, 8}).permute({0, 2, 1}), s1,
                                              c.col ? isa::Scalar(si) : isa::Scalar(0.5), c.op0, c.op1, c.r0, c.r1);
                      r.push_back(to_hbm(d));
                    }
                    Tensor b = nl::ndarray({128, 64}, nl::bfloat16);  // the running value stays fp32
                    isa::tensor_tensor_scan(b, s0, st, si, nl::add, nl::maximum);
                    r.push_back(to_hbm(b));
                    Tensor i = nl::ndarray({128, 32}, nl::int32);
                    isa::tensor_tensor_scan(i, s0(nl::all, Slice{0, std::nullopt, 2}), st(nl::all, nl::ds(32, 32)), -2.5,
                                            nl::multiply, nl::add);
                    r.push_back(to_hbm(i));
                    Tensor p = nl::ndarray({128, 64}, nl::float32);
                    isa::memset(p, 0.0);
                    isa::tensor_tensor_scan(p(nl::ds(64, 32), nl::all), s0(nl::ds(0, 32), nl::all), s1(nl::ds(96, 32), nl::all),
                                            si(nl::ds(32, 32), nl::all), nl::add, nl::add);
                    r.push_back(to_hbm(p));
                    return r;
                  },
                  d0, d1, init, t);
}

TEST_CASE("native: tensor_copy_predicated with tile and scalar sources and every predicate dtype") {
  HostTensor x = tricky({128, 40}, 101);
  HostTensor k = integers(DType::int32, {128, 40}, 102, -1000000, 1000000);
  HostTensor p8 = integers(DType::uint8, {128, 40}, 103, 0, 3), p16 = integers(DType::uint16, {128, 40}, 104, 0, 1);
  HostTensor p32 = integers(DType::uint32, {128, 40}, 105, 0, 1);
  HostTensor pb = integers(DType::bool_, {128, 40}, 106, 0, 1);
  check_all_modes("copy_predicated",
                  [](Tensor x, Tensor k, Tensor p8, Tensor p16, Tensor p32, Tensor pb) {
                    Tensor sx = to_sbuf(x), sk = to_sbuf(k), s8 = to_sbuf(p8), s16 = to_sbuf(p16), s32 = to_sbuf(p32),
                           sb = to_sbuf(pb);
                    std::vector<Tensor> r;
                    auto fresh = [&](DType dt) {
                      Tensor t = nl::ndarray({128, 40}, dt);
                      isa::memset(t, 1.0);
                      return t;
                    };
                    Tensor a = fresh(nl::float32);
                    isa::tensor_copy_predicated(a, sx, s8);
                    Tensor b = fresh(nl::float32);
                    isa::tensor_copy_predicated(b, sx, s16, true);
                    Tensor c = fresh(nl::bfloat16);
                    isa::tensor_copy_predicated(c, 7.75, s32);
                    Tensor d = fresh(nl::int32);
                    isa::tensor_copy_predicated(d, sk, sb);
                    Tensor e = fresh(nl::int16);
                    isa::tensor_copy_predicated(e, -12345.5, s8, true);
                    Tensor f = fresh(nl::uint8);
                    isa::tensor_copy_predicated(f, 300.0, s16);
                    Tensor g = nl::ndarray({128, 4, 10}, nl::float32);  // shapes differ, views strided
                    isa::memset(g, -1.0);
                    isa::tensor_copy_predicated(g, sx.reshape({128, 10, 4}).permute({0, 2, 1}), s8.reshape({128, 4, 10}));
                    Tensor h = fresh(nl::float32);
                    isa::tensor_copy_predicated(h(nl::ds(32, 32), Slice{0, std::nullopt, 2}), sx(nl::ds(96, 32), nl::ds(0, 20)),
                                                sb(nl::ds(0, 32), nl::ds(20, 20)));
                    for (const Tensor& t : {a, b, c, d, e, f, g, h}) r.push_back(to_hbm(t));
                    return r;
                  },
                  x, k, p8, p16, p32, pb);
}

TEST_CASE("native: select_reduce across reduce_cmd sequences, predicate dtypes, NaN and ties") {
  HostTensor x = tricky({128, 48}, 111), x2 = test::random_tensor(DType::float32, {128, 48}, 112, -5, 5);
  HostTensor j = integers(DType::int16, {128, 48}, 113, -300, 300);
  HostTensor pred = integers(DType::int8, {128, 48}, 114, -2, 2), pred2 = integers(DType::uint16, {128, 48}, 115, 0, 1);
  HostTensor pred3 = integers(DType::bool_, {128, 48}, 116, 0, 1);
  for (int64_t f = 0; f < 48; ++f) pred.set_int(3 * 48 + f, 0);  // a row with nothing selected
  HostTensor col = test::random_tensor(DType::float32, {128, 1}, 117, -1, 1);
  check_all_modes("select_reduce",
                  [](Tensor x, Tensor x2, Tensor j, Tensor pred, Tensor pred2, Tensor pred3, Tensor col) {
                    Tensor sx = to_sbuf(x), sx2 = to_sbuf(x2), sj = to_sbuf(j), sp = to_sbuf(pred), sp2 = to_sbuf(pred2),
                           sp3 = to_sbuf(pred3), sc = to_sbuf(col);
                    auto dst = [](DType dt = nl::float32) { return nl::ndarray({128, 48}, dt); };
                    auto res = [](DType dt = nl::float32) { return nl::ndarray({128, 1}, dt); };
                    std::vector<Tensor> r;
                    Tensor d1 = dst(), r1 = res();
                    isa::select_reduce(d1, sp, sx, -1e4, {.reduce_res = r1});
                    Tensor d2 = dst(nl::bfloat16), r2 = res(nl::bfloat16);
                    isa::select_reduce(d2, sp, sx2, sc, {.reduce_res = r2, .reverse_pred = true});
                    isa::select_reduce(dst(), sp, sx2, -1e4, {.reduce_cmd = ReduceCmd::reset_reduce});
                    Tensor r3 = res(), r4 = res(), r5 = res(), r6 = res(), r7 = res(), r8 = res();
                    isa::select_reduce(dst(), sp2, sx, -1e4, {.reduce_res = r3, .reduce_cmd = ReduceCmd::reduce});
                    isa::select_reduce(dst(), sp2, sx2, -1e4, {.reduce_res = r4, .reduce_cmd = ReduceCmd::reset});
                    isa::select_reduce(dst(), sp2, sx2, sc, {.reduce_res = r5, .reduce_cmd = ReduceCmd::reduce});
                    isa::select_reduce(dst(), sp3, sx2, sc, {.reduce_res = r6, .reduce_cmd = ReduceCmd::idle});
                    isa::select_reduce(dst(), sp3, sj, 2.5, {.reduce_res = r7, .reduce_cmd = ReduceCmd::load_reduce});
                    isa::select_reduce(dst(), sp3, sj, -0.0, {.reduce_res = r8, .reduce_cmd = ReduceCmd::reduce});
                    Tensor d9 = nl::ndarray({128, 6, 8}, nl::int32), r9 = res();  // float selections into an int dst
                    isa::select_reduce(d9, sp.reshape({128, 8, 6}).permute({0, 2, 1}), sj.reshape({128, 6, 8}), 1e10,
                                       {.reduce_res = r9, .reduce_cmd = ReduceCmd::reset_reduce});
                    Tensor d10 = dst(), r10 = res();
                    isa::memset(d10, 0.0);
                    isa::select_reduce(d10(nl::ds(64, 64), Slice{0, std::nullopt, 2}), sp(nl::ds(0, 64), nl::ds(0, 24)),
                                       sx(nl::ds(64, 64), nl::ds(24, 24)), sc(nl::ds(0, 64), nl::all),
                                       {.reduce_res = r10(nl::ds(64, 64), nl::all)});
                    for (const Tensor& t : {d1, r1, d2, r2, r3, r4, r5, r6, r7, r8, d9, r9, d10, r10(nl::ds(64, 64), nl::all)})
                      r.push_back(to_hbm(t));
                    return r;
                  },
                  x, x2, j, pred, pred2, pred3, col);
}

TEST_CASE("native: max8 and nc_find_index8 with ties, +-0, NaN, duplicates and views") {
  HostTensor x = tricky({128, 40}, 121);
  HostTensor y = test::random_tensor(DType::bfloat16, {128, 4, 25}, 122);
  HostTensor k = integers(DType::int16, {128, 100}, 123, -3, 3);
  HostTensor n = tricky({128, 8}, 124);
  for (int64_t i = 0; i < 128 * 8; i += 3) n.set(i, host_nan());  // rows with fewer than 8 numbers
  HostTensor big = test::random_tensor(DType::float32, {64, 16384}, 125);
  for (int64_t f = 0; f < 16384; ++f) {
    big.set(0 * 16384 + f, float(f) * 0.25f);            // ascending: every element enters the top 8
    big.set(1 * 16384 + f, 100.0f - float(f) * 0.25f);   // descending: none after the first 8
    big.set(2 * 16384 + f, float(f % 7));                // ties at the threshold must not enter
  }
  check_all_modes("max8",
                  [](Tensor x, Tensor y, Tensor k, Tensor n, Tensor big) {
                    Tensor sx = to_sbuf(x), sy = to_sbuf(y), sk = to_sbuf(k), sn = to_sbuf(n), sbig = to_sbuf(big);
                    std::vector<Tensor> r;
                    auto top = [&](const Tensor& src, DType dt, Shape shape = {128, 8}) {
                      Tensor m = nl::ndarray(shape, dt);
                      isa::max8(m, src);
                      return m;
                    };
                    auto find = [&](const Tensor& data, const Tensor& vals, DType dt, Shape shape = {128, 8}) {
                      Tensor i = nl::ndarray(shape, dt);
                      isa::nc_find_index8(i, data, vals);
                      return i;
                    };
                    Tensor m1 = top(sx, nl::float32);
                    Tensor i1 = find(sx, m1, nl::uint32);
                    Tensor m2 = top(sy, nl::bfloat16, {128, 2, 4});
                    Tensor i2 = find(sy, m2.reshape({128, 8}), nl::uint16);
                    Tensor m3 = top(sk.reshape({128, 10, 10}).permute({0, 2, 1}), nl::float32);
                    Tensor i3 = find(sk.reshape({128, 10, 10}), m3, nl::uint32, {128, 4, 2});
                    Tensor m4 = top(sn, nl::float32);  // exactly 8 elements, NaN among them
                    Tensor i4 = find(sn, m4, nl::uint32);
                    // vals that are absent, repeated, NaN or -0
                    Tensor vals = nl::ndarray({128, 8}, nl::float32);
                    isa::tensor_copy(vals, sx(nl::all, nl::ds(0, 8)));
                    isa::memset(vals(nl::all, nl::ds(6, 1)), 123.0);
                    isa::tensor_copy(vals(nl::all, nl::ds(7, 1)), vals(nl::all, nl::ds(0, 1)));
                    Tensor i5 = find(sx, vals.reshape({128, 2, 4}).permute({0, 2, 1}), nl::uint16);
                    Tensor i6 = find(sx(nl::ds(32, 32), Slice{1, std::nullopt, 2}), vals(nl::ds(32, 32), nl::all), nl::uint32,
                                     {32, 8});
                    Tensor m7 = top(sbig, nl::float32, {64, 8});
                    Tensor i7 = find(sbig, m7, nl::uint16, {64, 8});
                    for (const Tensor& t : {m1, i1, m2, i2, m3, i3, m4, i4, i5, i6, m7, i7}) r.push_back(to_hbm(t));
                    return r;
                  },
                  x, y, k, n, big);
}

TEST_CASE("native: tensor_partition_reduce with every operator, integer tiles and multi-dim views") {
  HostTensor x = test::random_tensor(DType::float32, {128, 300}, 131, -2, 2);
  HostTensor t = tricky({64, 40}, 132);
  HostTensor k = integers(DType::int32, {96, 50}, 133, INT32_MIN, INT32_MAX);
  HostTensor u = integers(DType::uint16, {32, 600}, 134, 0, 65535);
  check_all_modes("partition_reduce",
                  [](Tensor x, Tensor t, Tensor k, Tensor u) {
                    Tensor sx = to_sbuf(x), st = to_sbuf(t), sk = to_sbuf(k), su = to_sbuf(u);
                    std::vector<Tensor> r;
                    auto pr = [&](const nl::Op& op, const Tensor& data, DType dt, Shape shape) {
                      Tensor d = nl::ndarray(shape, dt);
                      isa::tensor_partition_reduce(d, op, data);
                      r.push_back(to_hbm(d));
                    };
                    pr(nl::add, sx, nl::float32, {1, 300});
                    pr(nl::maximum, sx, nl::bfloat16, {1, 300});
                    pr(nl::average, sx.reshape({128, 3, 100}).permute({0, 2, 1}), nl::float32, {1, 300});
                    pr(nl::add, st, nl::float32, {1, 4, 10});
                    pr(nl::maximum, st, nl::float32, {1, 40});
                    pr(nl::average, st(nl::ds(0, 1), nl::all), nl::float32, {1, 40});
                    pr(nl::bitwise_or, sk, nl::int32, {1, 50});
                    pr(nl::bitwise_and, sk.reshape({96, 5, 10}), nl::int32, {1, 50});
                    pr(nl::add, sk, nl::int32, {1, 50});  // fp32 sum of integers, saturated into int32
                    pr(nl::bitwise_or, su, nl::uint16, {1, 600});
                    pr(nl::maximum, su(nl::all, Slice{0, std::nullopt, 3}), nl::uint8, {1, 200});
                    return r;
                  },
                  x, t, k, u);
}

TEST_CASE("native: overlapping operands keep the reference's order of reads and writes") {
  HostTensor x = test::random_tensor(DType::float32, {64, 80}, 161, -2, 2);
  HostTensor v = tricky({64, 40}, 162, false);
  // In place (the same bytes in the same order): native.
  check_all_modes("in_place",
                  [](Tensor x, Tensor v) {
                    Tensor sx = to_sbuf(x), sv = to_sbuf(v);
                    isa::tensor_partition_reduce(sx(nl::ds(0, 1), nl::ds(0, 64)), nl::add, sx(nl::all, nl::ds(0, 64)));
                    Tensor m = nl::ndarray({64, 8}, nl::float32);
                    isa::max8(m, sv);
                    isa::nc_find_index8(m.view(nl::uint32), sv, m);  // indices replace the values they look for
                    isa::tensor_scalar_reduce(sv, sv, nl::multiply, 0.5, nl::add, sv(nl::all, nl::ds(3, 1)));
                    return std::vector<Tensor>{to_hbm(sx), to_hbm(m), to_hbm(sv)};
                  },
                  x, v);
  // Shifted overlaps: a write lands on an element read later. These stay with the reference.
  const int64_t left = compare_modes(
      "shifted",
      [](Tensor x, Tensor v) {
        Tensor sx = to_sbuf(x), sv = to_sbuf(v);
        isa::tensor_partition_reduce(sx(nl::ds(0, 1), nl::ds(1, 64)), nl::add, sx(nl::all, nl::ds(0, 64)));
        Tensor m = nl::ndarray({64, 16}, nl::float32);
        isa::memset(m, 0.0);
        isa::max8(m(nl::all, nl::ds(4, 8)), sv);
        // index i lands on value i + 4, which the reference reads after writing it
        isa::nc_find_index8(m(nl::all, nl::ds(8, 8)).view(nl::uint32), sv, m(nl::all, nl::ds(4, 8)));
        return std::vector<Tensor>{to_hbm(sx), to_hbm(m)};
      },
      x, v);
  CHECK(left == 2);
}

TEST_CASE("native: element-wise routines on overlapping on-chip views keep the reference's order") {
  // The template builder decides from the allocated addresses whether a routine may reorder its
  // element loop; a write that lands on an element read later must keep the sequential order.
  HostTensor x = test::random_tensor(DType::float32, {32, 80}, 171, -2, 2);
  check_all_modes("overlaps",
                  [](Tensor x) {
                    Tensor ahead = to_sbuf(x), behind = to_sbuf(x), same = to_sbuf(x), act = to_sbuf(x);
                    // dst one element ahead of its source: each write feeds the next read
                    isa::tensor_tensor(ahead(nl::all, nl::ds(1, 64)), ahead(nl::all, nl::ds(0, 64)),
                                       ahead(nl::all, nl::ds(8, 64)), nl::add);
                    isa::tensor_scalar(ahead(nl::all, nl::ds(2, 64)), ahead(nl::all, nl::ds(0, 64)), nl::multiply, 0.75);
                    // dst behind its source: reads run ahead of writes
                    isa::tensor_tensor(behind(nl::all, nl::ds(0, 64)), behind(nl::all, nl::ds(1, 64)),
                                       behind(nl::all, nl::ds(3, 64)), nl::subtract);
                    // in place, and a copy between the disjoint halves of one tile
                    isa::tensor_scalar(same, same, nl::add, 1.0);
                    isa::tensor_copy(same(nl::all, nl::ds(0, 40)), same(nl::all, nl::ds(40, 40)));
                    isa::activation(act(nl::all, nl::ds(1, 70)), nl::exp, act(nl::all, nl::ds(0, 70)));
                    // PSUM and SBUF never overlap, whatever their offsets
                    Tensor p = nl::ndarray({32, 80}, nl::float32, nl::psum);
                    isa::tensor_copy(p, ahead);
                    isa::tensor_tensor(behind, p, behind, nl::maximum);
                    return std::vector<Tensor>{to_hbm(ahead), to_hbm(behind), to_hbm(same), to_hbm(act)};
                  },
                  x);
}

// =================================================================================================
// Randomized views: every operand of an instruction gets its own random split of the free
// elements into dims, its own memory order of those dims, padding, offsets and (for sources)
// broadcast dims, so the template builder's pairing of elements is checked far beyond the shapes
// written out above.
// =================================================================================================

namespace {

class ViewFuzzer {
 public:
  explicit ViewFuzzer(uint32_t seed) : rng_(seed) {}

  int64_t pick(std::initializer_list<int64_t> values) {
    return values.begin()[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng_)];
  }
  bool chance(int percent) { return std::uniform_int_distribution<int>(0, 99)(rng_) < percent; }

  /** A random permutation of 0..n-1. */
  std::vector<int64_t> permutation(int64_t n) {
    std::vector<int64_t> p(n);
    for (int64_t i = 0; i < n; ++i) p[i] = i;
    std::shuffle(p.begin(), p.end(), rng_);
    return p;
  }

  /** A random ordered factorization of n into at most max_dims factors. */
  std::vector<int64_t> split(int64_t n, int max_dims) {
    std::vector<int64_t> dims;
    const int want = int(std::uniform_int_distribution<int>(1, max_dims)(rng_));
    for (int d = 1; d < want; ++d) {
      std::vector<int64_t> divisors;
      for (int64_t q = 1; q <= n; ++q)
        if (n % q == 0) divisors.push_back(q);
      const int64_t q = divisors[std::uniform_int_distribution<size_t>(0, divisors.size() - 1)(rng_)];
      dims.push_back(q);
      n /= q;
    }
    dims.push_back(n);
    std::shuffle(dims.begin(), dims.end(), rng_);
    return dims;
  }

  /**
   * A view over `partitions` partitions of a fresh tile whose free dims (in logical order) have
   * `counts`, laid out in a random memory order with padding and offset; `fill` loads the tile.
   */
  Tensor view(int64_t partitions, const std::vector<int64_t>& counts, DType dtype, bool broadcast,
              const std::function<void(const Tensor&)>& fill, Buffer buffer = nl::sbuf) {
    std::vector<size_t> order(counts.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);  // order[0] is innermost in memory
    std::vector<int64_t> stride(counts.size());
    int64_t step = pick({1, 1, 1, 2});
    for (size_t i : order) {
      if (broadcast && counts[i] > 1 && chance(15)) {
        stride[i] = 0;
        continue;
      }
      stride[i] = step;
      step = step * counts[i] + pick({0, 0, 0, 1, 3});
    }
    int64_t extent = 1;
    for (size_t i = 0; i < counts.size(); ++i) extent += (counts[i] - 1) * stride[i];
    const int64_t offset = pick({0, 0, 1, 5});
    const int64_t row = offset + extent + pick({0, 0, 2});
    Tensor tile = nl::ndarray({partitions, row}, dtype, buffer);
    fill(tile);
    std::vector<Dim> pattern{{row, partitions}};
    for (size_t i = 0; i < counts.size(); ++i) pattern.push_back({stride[i], counts[i]});
    return tile.ap(pattern, ApOptions{.offset = offset});
  }

 private:
  std::mt19937 rng_;
};

}  // namespace

TEST_CASE("native: randomized view layouts for every element-wise, reducing and indexing routine") {
  HostTensor x = test::random_tensor(DType::float32, {128, 4096}, 141, -3, 3);
  HostTensor t = tricky({128, 4096}, 142);
  int64_t fallbacks = 0, kernels = 0;
  for (uint32_t seed = 0; seed < 51; ++seed) {
    ViewFuzzer meta(1000 + seed);
    const int64_t P = meta.pick({1, 7, 32, 64, 100, 128});
    const int64_t N = meta.pick({8, 12, 24, 36, 48, 60, 96, 120});
    const int kind = int(seed % 17);
    std::string what = fmt::format("fuzz seed {} kind {} P {} N {}", seed, kind, P, N);
    const int64_t left = compare_modes(
        what,
        [&](Tensor x, Tensor t) {
          ViewFuzzer fz(5000 + seed);  // the same kernel for every mode's trace
          auto src = [&](std::vector<int64_t> counts, DType dt = nl::float32, bool special = false, bool bcast = true) {
            return fz.view(P, counts, dt, bcast, [&](const Tensor& tile) {
              const Tensor& in = special ? t : x;
              isa::dma_copy(tile, in(nl::ds(0, P), nl::ds(0, tile.shape()[1])));
            });
          };
          auto dst = [&](std::vector<int64_t> counts, DType dt = nl::float32, int64_t parts = -1) {
            return fz.view(parts < 0 ? P : parts, counts, dt, false, [&](const Tensor& tile) { isa::memset(tile, 0.0); });
          };
          auto col = [&] { return src({1}); };
          auto whole = [](const Tensor& v) {
            // the whole tile a view was made on
            return Tensor(&v.builder(), full_view(v.access().storage, v.storage().dtype, v.storage().shape));
          };
          std::vector<Tensor> outs;
          auto keep = [&](const Tensor& v) { outs.push_back(to_hbm(whole(v))); };
          auto s = [&](int max_dims = 4) { return fz.split(N, max_dims); };
          switch (kind) {
            case 0: {
              Tensor d = dst(s(), fz.chance(50) ? nl::bfloat16 : nl::float32);
              const nl::Op ops[] = {nl::add, nl::subtract, nl::multiply, nl::maximum};
              isa::tensor_tensor(d, src(s(), nl::float32, true), src(s(), nl::bfloat16), ops[fz.pick({0, 1, 2, 3})]);
              keep(d);
              break;
            }
            case 1: {
              Tensor d = dst(s(), nl::float16);
              isa::tensor_scalar(d, src(s()), nl::multiply, col(), {.op1 = nl::add, .operand1 = -0.25});
              Tensor e = dst(s(), nl::int32);
              isa::tensor_copy(e, src(s(), nl::float32, true));
              keep(d), keep(e);
              break;
            }
            case 2: {
              Tensor d = dst(s()), r = dst({1});
              isa::activation(d, nl::exp, src(s()), {.bias = col(), .scale = 0.5, .reduce_op = nl::add, .reduce_res = r});
              keep(d), keep(r);
              break;
            }
            case 3: {
              int64_t kc = fz.pick({1, 2, 3, 4, 6, 12});
              while (N % kc) kc /= 2;
              std::vector<int64_t> kept = fz.split(kc, 2);
              std::vector<int64_t> reduced = fz.split(N / kc, 4 - int(kept.size()));
              std::vector<int64_t> all = kept;
              all.insert(all.end(), reduced.begin(), reduced.end());
              std::vector<int> axes;
              for (size_t i = 0; i < reduced.size(); ++i) axes.push_back(int(kept.size() + 1 + i));
              const bool negate = fz.chance(50);
              Tensor d = dst(fz.split(kc, 3), fz.chance(50) ? nl::int16 : nl::float32);
              isa::tensor_reduce(d, fz.chance(50) ? nl::add : nl::maximum, src(all, nl::float32, true), axes, negate);
              keep(d);
              break;
            }
            case 4: {
              Tensor d = dst(s(), nl::bfloat16), r = dst({1});
              isa::tensor_scalar_reduce(d, src(s()), nl::subtract, col(), fz.chance(50) ? nl::add : nl::minimum, r);
              keep(d), keep(r);
              break;
            }
            case 5: {
              Tensor d = dst(s());
              isa::tensor_tensor_scan(d, src(s()), src(s()), col(), nl::multiply, nl::add, fz.chance(50), false);
              keep(d);
              break;
            }
            case 6: {
              Tensor d = dst(s()), r = dst({1});
              isa::select_reduce(d, src(s(), nl::uint8), src(s(), nl::float32, true), -5.0, {.reduce_res = r});
              keep(d), keep(r);
              break;
            }
            case 7: {
              Tensor d = dst(s(), nl::bfloat16);
              isa::tensor_copy_predicated(d, src(s(), nl::bfloat16), src(s(), nl::uint8), fz.chance(50));
              keep(d);
              break;
            }
            case 8: {
              Tensor d = dst(s(), fz.chance(50) ? nl::int32 : nl::int8);
              std::vector<Dim> pattern;
              for (int64_t c : s()) pattern.push_back({fz.pick({-7, -1, 0, 1, 3, 100}), c});
              isa::iota(d, pattern, fz.pick({-50, 0, 9}), fz.pick({-2, 0, 1, 64}));
              keep(d);
              break;
            }
            case 9: {
              Tensor d = dst(s());
              std::vector<Dim> pattern;
              for (int64_t c : s()) pattern.push_back({fz.pick({-2, -1, 1, 4}), c});
              isa::affine_select(d, pattern, fz.pick({-1, 1, 3}), src(s()), -1.5, fz.chance(50) ? nl::greater : nl::less_equal,
                                 fz.pick({-20, 0, 20}));
              keep(d);
              break;
            }
            case 10: {
              Tensor d = dst(fz.split(6, 2));
              isa::bn_stats(d, src(s()));
              Tensor g = dst(fz.split(2, 2));
              isa::bn_aggr(g, src(fz.split(N % 3 == 0 ? N : 24, 3)));
              keep(d), keep(g);
              break;
            }
            case 11: {
              Tensor m = dst(fz.split(8, 2));
              Tensor data = src(s(2), nl::float32, true, false);
              isa::max8(m, data);
              Tensor i = dst(fz.split(8, 2), nl::uint32);
              isa::nc_find_index8(i, data, m);
              keep(m), keep(i);
              break;
            }
            case 12: {
              Tensor d = dst(s(), nl::float32, 1);
              isa::tensor_partition_reduce(d, fz.chance(50) ? nl::add : nl::average, src(s()));
              Tensor e = dst(s(), nl::int32, 1);
              isa::tensor_partition_reduce(e, nl::bitwise_or, src(s(), nl::int32));
              keep(d), keep(e);
              break;
            }
            case 13: {
              // matmul from multi-dim views into a PSUM view, twice (automatic accumulation), and
              // the tensor engine / vector engine transposes
              const int64_t K = fz.pick({1, 16, 96, 128}), M = fz.pick({1, 8, 24, 64}), Nm = fz.pick({4, 24, 60, 120});
              auto mm_src = [&](int64_t parts, int64_t n, DType dt) {
                return fz.view(parts, fz.split(n, 3), dt, false, [&](const Tensor& tile) {
                  isa::dma_copy(tile, x(nl::ds(0, parts), nl::ds(0, tile.shape()[1])));
                });
              };
              const DType dt = DType(fz.pick({int64_t(DType::bfloat16), int64_t(DType::float32), int64_t(DType::float8_e4m3),
                                               int64_t(DType::float16), int64_t(DType::tfloat32)}));
              const DType dt2 = dt == nl::float32 || dt == nl::tfloat32 ? dt : nl::float8_e5m2;
              Tensor ps = fz.view(M, fz.split(Nm, 3), nl::float32, false, [](const Tensor&) {}, nl::psum);
              isa::nc_matmul(ps, mm_src(K, M, dt), mm_src(K, Nm, dt2));
              isa::nc_matmul(ps, mm_src(K, M, dt), mm_src(K, Nm, dt),
                             {.accumulate = fz.chance(30) ? std::optional<bool>(fz.chance(50)) : std::nullopt});
              keep(ps);
              const int64_t tp = fz.pick({1, 8, 32}), tf = fz.pick({4, 12, 32});
              Tensor tv = fz.view(tf, fz.split(tp, 2), nl::float32, false, [](const Tensor& t) { isa::memset(t, 0.0); });
              isa::nc_transpose(tv, mm_src(tp, tf, nl::float32), isa::vector_engine);
              keep(tv);
              Tensor tt = fz.view(M, fz.split(K, 3), dt, false, [](const Tensor&) {}, nl::psum);
              isa::nc_transpose(tt, mm_src(K, M, dt), isa::tensor_engine);
              keep(tt);
              break;
            }
            case 14: {
              // DMA into a permuted view of a whole HBM output, from a random SBUF view
              Tensor out = nl::ndarray({P, N}, nl::float32, nl::shared_hbm);
              std::vector<int64_t> shape{P};
              for (int64_t c : s(3)) shape.push_back(c);
              Shape sh{std::span<const int64_t>(shape)};
              std::vector<int64_t> perm = fz.permutation(int64_t(shape.size()));
              Tensor dview = out.reshape(sh).permute(perm);
              Tensor sv = src(s(), nl::bfloat16);
              Tensor flat = nl::ndarray({P, N}, nl::bfloat16);
              isa::tensor_copy(flat, sv);
              isa::dma_copy(dview, flat.reshape(sh));
              outs.push_back(out);
              break;
            }
            case 15: {
              // activation accumulators across a reduce_cmd sequence, data read from PSUM
              Tensor pd = fz.view(P, s(), nl::float32, false, [&](const Tensor& tile) {
                Tensor tmp = nl::ndarray(tile.shape(), nl::float32);
                isa::dma_copy(tmp, x(nl::ds(0, P), nl::ds(0, tile.shape()[1])));
                isa::tensor_copy(tile, tmp);
              }, nl::psum);
              const ReduceCmd cmds[] = {ReduceCmd::reset_reduce, ReduceCmd::reduce, ReduceCmd::idle, ReduceCmd::reduce,
                                        ReduceCmd::reset, ReduceCmd::reduce};
              for (ReduceCmd cmd : cmds) {
                Tensor d = dst(s(), nl::bfloat16), r = dst({1});
                isa::activation(d, nl::tanh, fz.chance(50) ? pd : src(s()),
                                {.scale = col(), .reduce_op = nl::add, .reduce_res = r, .reduce_cmd = cmd});
                keep(d), keep(r);
              }
              break;
            }
            default: {
              Tensor d = dst(s(), nl::float32);
              isa::scalar_tensor_tensor(d, src(s()), nl::add, col(), nl::multiply, src(s()));
              Tensor e = dst(s(), nl::uint16);
              isa::memset(e, 7);
              isa::reciprocal(d, d);
              keep(d), keep(e);
              break;
            }
          }
          return outs;
        },
        x, t);
    if (left) MESSAGE(fmt::format("{}: {} instructions left to the reference semantics", what, left));
    fallbacks += left;
    ++kernels;
  }
  MESSAGE(fmt::format("{} randomized kernels, {} instructions left to the reference semantics", kernels, fallbacks));
  CHECK(fallbacks == 0);
}

TEST_CASE("native: randomized operators and dtypes of the element-wise and reducing routines") {
  HostTensor x = test::random_tensor(DType::float32, {128, 256}, 151, -3, 3);
  HostTensor k = integers(DType::int32, {128, 256}, 152, -70000, 70000);
  const DType floats[] = {DType::float32, DType::bfloat16, DType::float16, DType::float8_e4m3, DType::float8_e5m2,
                          DType::tfloat32};
  const DType ints[] = {DType::int8, DType::int16, DType::int32, DType::uint8, DType::uint16, DType::uint32};
  // Sources never hold NaNs of both signs (float8_e4m3fn overflows to a signed NaN); NaN results
  // are canonical anyway (see the NaN test at the end).
  const DType any[] = {DType::float32, DType::bfloat16, DType::float16, DType::float8_e4m3, DType::int8,
                       DType::int16, DType::int32, DType::uint8, DType::uint16, DType::uint32, DType::bool_};
  const DType dsts[] = {DType::float32, DType::bfloat16, DType::float16, DType::float8_e4m3, DType::float8_e4m3fn,
                        DType::int8, DType::int16, DType::int32, DType::uint8, DType::uint16, DType::uint32, DType::bool_};
  const nl::Op binary[] = {nl::add, nl::subtract, nl::multiply, nl::maximum, nl::minimum, nl::equal, nl::not_equal,
                           nl::greater, nl::greater_equal, nl::less, nl::less_equal, nl::logical_and, nl::logical_or,
                           nl::logical_xor};
  const nl::Op unary[] = {nl::abs, nl::square, nl::relu, nl::rsqrt, nl::reciprocal, nl::negative};
  const nl::Op bitvec[] = {nl::bitwise_and, nl::bitwise_or, nl::bitwise_xor, nl::left_shift, nl::right_shift};
  const nl::Op reducers[] = {nl::add, nl::subtract, nl::multiply, nl::maximum, nl::minimum, nl::logical_and,
                             nl::logical_or, nl::logical_xor};
  const nl::Op funcs[] = {nl::copy, nl::sigmoid, nl::relu, nl::gelu, nl::gelu_dx, nl::gelu_apprx_tanh, nl::silu,
                          nl::silu_dx, nl::tanh, nl::softplus, nl::mish, nl::erf, nl::erf_dx, nl::exp, nl::log,
                          nl::sin, nl::arctan, nl::sqrt, nl::rsqrt, nl::reciprocal, nl::sign, nl::abs, nl::square};
  for (uint32_t seed = 0; seed < 16; ++seed) {
    std::mt19937 rng(7000 + seed);
    auto pick = [&](const auto& list) { return list[std::uniform_int_distribution<size_t>(0, std::size(list) - 1)(rng)]; };
    auto coin = [&] { return (rng() & 1) != 0; };
    // Every choice is made here, once, so each mode traces the same kernel.
    struct Step {
      int kind;
      DType d0, d1, d2;
      nl::Op o0, o1;
      bool r0, r1, col, c1, c2, c3;
      double imm;
    };
    std::vector<Step> steps;
    for (int n = 0; n < 8; ++n) {
      const int kind = int(rng() % 8);
      Step st{kind, pick(dsts), pick(any), pick(any), pick(binary), pick(binary), coin(), coin(), coin(), coin(), coin(),
              coin(), double(int(rng() % 9) - 4) * 0.75};
      if (kind == 1) st.o0 = coin() ? pick(unary) : st.o0;
      if (kind == 2 || kind == 6) st.d0 = pick(ints), st.d1 = pick(ints), st.d2 = pick(ints), st.o0 = pick(bitvec),
                                  st.o1 = pick(bitvec), st.imm = double(rng() % 40);
      if (kind == 4) st.o0 = pick(funcs), st.d2 = coin() ? DType::bfloat16 : DType::float32;
      if (kind == 5) st.o0 = pick(reducers);
      if (kind == 6) st.o0 = pick(std::array<nl::Op, 3>{nl::bitwise_and, nl::bitwise_or, nl::bitwise_xor});
      if (kind == 7) st.d0 = pick(floats);
      steps.push_back(st);
    }
    const std::string what = fmt::format("ops seed {}", seed);
    const int64_t left = compare_modes(
        what,
        [&](Tensor x, Tensor k) {
          std::vector<Tensor> outs;
          auto tile = [&](DType dt, bool integer) { return to_sbuf((integer ? k : x)(nl::all, nl::ds(0, 96)), dt); };
          auto col = to_sbuf(x(nl::all, nl::ds(100, 1)));
          for (const Step& st : steps) {
            Tensor d = nl::ndarray({128, 96}, st.d0);
            switch (st.kind) {
              case 0:  // tensor_tensor (GpSimd for three 32-bit integer tiles, as NKI defaults)
                isa::tensor_tensor(d, tile(st.d1, !is_float(st.d1)), tile(st.d2, st.c1), st.o0);
                break;
              case 1: {
                isa::TensorScalarOptions o{.reverse0 = st.r0};
                if (st.col && !is_unary_op(st.o0.alu_op())) o.op1 = st.o1, o.operand1 = isa::Scalar(col), o.reverse1 = st.r1;
                isa::tensor_scalar(d, tile(st.d1, st.c1), st.o0, is_unary_op(st.o0.alu_op()) ? isa::Scalar(0.0) : isa::Scalar(st.imm), o);
                break;
              }
              case 2: {  // bitvec tensor_scalar / tensor_tensor on integer tiles
                isa::tensor_scalar(d, tile(st.d1, true), st.o0, int(st.imm), {.reverse0 = st.r0, .op1 = st.o1, .operand1 = 3});
                Tensor e = nl::ndarray({128, 96}, st.d2);
                isa::tensor_tensor(e, tile(st.d1, true), tile(st.d2, true), st.o1);
                outs.push_back(to_hbm(e));
                break;
              }
              case 3:
                isa::scalar_tensor_tensor(d, tile(st.d1, st.c1), st.o0, st.col ? isa::Scalar(col) : isa::Scalar(st.imm), st.o1,
                                          tile(st.d2, st.c2), st.r0, st.r1);
                break;
              case 4: {
                Tensor bias = to_sbuf(x(nl::all, nl::ds(101, 1)), st.d2);
                isa::activation(d, st.o0, tile(st.d1, false), {.bias = bias, .scale = st.col ? isa::Scalar(col) : isa::Scalar(st.imm)});
                break;
              }
              case 5: {
                Tensor r = nl::ndarray({128, 4}, st.d0);
                isa::tensor_reduce(r, st.o0, tile(st.d1, st.c1).reshape({128, 4, 24}), {2}, st.r0);
                outs.push_back(to_hbm(r));
                isa::memset(d, is_float(st.d0) ? st.imm * 4 : 1.0);
                break;
              }
              case 6: {
                Tensor r = nl::ndarray({128, 8}, st.d1);
                isa::tensor_reduce(r, st.o0, tile(st.d1, true).reshape({128, 8, 12}), {2});
                outs.push_back(to_hbm(r));
                isa::memset(d, is_float(st.d0) ? st.imm : std::floor(std::fabs(st.imm)) > 1 ? 1.0 : 0.0);
                break;
              }
              default:
                isa::reciprocal(d, tile(st.d1, st.c1));
                isa::tensor_copy(d, tile(st.d2, st.c2), st.c3 ? isa::gpsimd_engine : isa::vector_engine);
                break;
            }
            outs.push_back(to_hbm(d));
          }
          return outs;
        },
        x, k);
    CHECK(left == 0);
  }
}

// Which of two *different* NaN operands IEEE arithmetic returns depends on the compiler's operand
// order (g++ for the reference, LLVM for the native routines); alu.hpp therefore makes every NaN
// result the canonical quiet NaN, and this test holds both executors to it.
TEST_CASE("native: NaN operands of different signs give the canonical NaN on every executor") {
  HostTensor a(DType::float32, {128, 64}), b(DType::float32, {128, 64});
  for (int64_t i = 0; i < a.size(); ++i) {
    a.set(i, (i % 3) ? std::numeric_limits<float>::quiet_NaN() : 1.0f);        // 0x7fc00000
    b.set(i, (i % 5) ? -std::numeric_limits<float>::quiet_NaN() : 2.0f);       // 0xffc00000
  }
  std::vector<HostTensor> outs = check_all_modes("nan_payload",
                  [](Tensor a, Tensor b) {
                    Tensor sa = to_sbuf(a), sb = to_sbuf(b);
                    std::vector<Tensor> r;
                    Tensor s = nl::ndarray({128, 64}, nl::float32);
                    isa::tensor_tensor(s, sa, sb, nl::add);
                    r.push_back(to_hbm(s));
                    Tensor m = nl::ndarray({128, 64}, nl::float32);
                    isa::tensor_tensor(m, sb, sa, nl::multiply);
                    r.push_back(to_hbm(m));
                    Tensor red = nl::ndarray({128, 1}, nl::float32);
                    isa::tensor_reduce(red, nl::add, s.reshape({128, 64}), {1});
                    r.push_back(to_hbm(red));
                    Tensor pr = nl::ndarray({1, 64}, nl::float32);
                    isa::tensor_partition_reduce(pr, nl::add, sb);
                    r.push_back(to_hbm(pr));
                    return r;
                  },
                  a, b);

  int64_t nans = 0;
  for (const HostTensor& t : outs)
    for (int64_t i = 0; i < t.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, t.bytes.data() + 4 * i, 4);
      if (std::isnan(t.get(i))) {
        ++nans;
        REQUIRE(bits == 0x7fc00000u);
      }
    }
  CHECK(nans > 0);
}
