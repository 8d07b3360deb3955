// Tests of the sanitizer from C++: nl::affine_range's record of iterations in the kernel, and the
// reference interpreter's shadow memory (values computed from never-written memory).
#include <optional>
#include <string>
#include <vector>

#include "error_check.hpp"
#include "harness.hpp"

namespace {

using namespace nikki;
using test::HostTensor;

constexpr std::string_view kFile = "test_sanitizer.cpp";

#define CHECK_ERROR(error, line, ...) test::check_kernel_error(error, kFile, line, {__VA_ARGS__})

const TensorSpec X = spec({256, 64}, nl::float32, "x");

TraceOptions sanitized() {
  TraceOptions o;
  o.sanitize = true;
  return o;
}

/** Runs a traced kernel on the sanitizing interpreter; the KernelError it throws, if any. */
std::optional<KernelError> run_error(Kernel kernel, std::vector<HostTensor*> inputs) {
  try {
    test::run_kernel(std::move(kernel), std::move(inputs), /*sanitize=*/true);
  } catch (const KernelError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace

// ============================================================================================
// nl::affine_range records its iterations
// ============================================================================================

TEST_CASE("sanitize: affine_range records each loop run, its iterations and its parent") {
  int outer_line = 0, inner_line = 0;
  auto body = [&](Tensor x) {
    Tensor out = nl::ndarray({256, 64}, nl::float32, nl::shared_hbm, "out");
    outer_line = __LINE__; for (int64_t r : nl::affine_range(2)) {
      Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "t");
      isa::dma_copy(t, x(nl::ds(r * 128, 128), nl::all));
      inner_line = __LINE__; for (int64_t c : nl::affine_range(8, 0, -4)) {
        isa::dma_copy(out(nl::ds(r * 128, 128), nl::ds(c, 4)), t(nl::all, nl::ds(c, 4)));
      }
    }
    return out;
  };
  const Kernel k = trace(sanitized(), "k", body, X);
  REQUIRE(k.parallel_loops.size() == 3);  // the outer run, then one inner run per outer iteration
  const ParallelLoop &outer = k.parallel_loops[0], &inner0 = k.parallel_loops[1], &inner1 = k.parallel_loops[2];
  CHECK(k.location(outer.loc).line == uint32_t(outer_line));
  CHECK(k.location(inner0.loc).line == uint32_t(inner_line));
  CHECK(outer.parent == -1);
  CHECK(inner0.parent == 0);
  CHECK(inner1.parent == 0);
  // Instructions: per outer iteration a load, then two stores (c = 8, 4).
  CHECK(outer.iteration_begin == std::vector<uint32_t>{0, 3});
  CHECK(outer.end == 6);
  CHECK(inner0.iteration_begin == std::vector<uint32_t>{1, 2});
  CHECK(inner0.end == 3);
  CHECK(inner1.iteration_begin == std::vector<uint32_t>{4, 5});
  CHECK(inner1.iteration_end(1) == 6);
  CHECK(inner1.value(0) == 8);
  CHECK(inner1.value(1) == 4);

  // Traced without the sanitizer the loops are plain C++ loops: same kernel, no record.
  const Kernel plain = trace("k", body, X);
  CHECK(plain.parallel_loops.empty());
  CHECK(plain.instructions.size() == k.instructions.size());
}

TEST_CASE("sanitize: a loop left with break ends where the loop statement does") {
  auto body = [](Tensor x) {
    Tensor out = nl::ndarray({256, 64}, nl::float32, nl::shared_hbm, "out");
    for (int64_t i : nl::affine_range(4)) {
      if (i == 2) break;
      isa::dma_copy(out(nl::ds(i * 128, 128), nl::all), x(nl::ds(i * 128, 128), nl::all));
    }
    isa::dma_copy(out(nl::ds(0, 1), nl::all), x(nl::ds(0, 1), nl::all));
    return out;
  };
  const Kernel k = trace(sanitized(), "k", body, X);
  REQUIRE(k.parallel_loops.size() == 1);
  const ParallelLoop& loop = k.parallel_loops[0];
  CHECK(loop.iterations() == 3);  // iteration 2 began, then broke off without instructions
  CHECK(loop.end == 2);           // the copy after the loop is in no iteration
  CHECK(loop.iteration_end(2) == 2);
  CHECK(k.instructions.size() == 3);
}

TEST_CASE("sanitize: affine_range with step 0 is a KernelError") {
  int line = 0;
  auto body = [&](Tensor x) {
    Tensor out = nl::ndarray({256, 64}, nl::float32, nl::shared_hbm, "out");
    line = __LINE__; for (int64_t i : nl::affine_range(0, 4, 0)) (void)i;
    isa::dma_copy(out, x);
    return out;
  };
  CHECK_ERROR(test::kernel_error_on(sanitized(), body, X), line, "affine_range step is 0", "a loop step is non-zero",
              "give a positive step");
}

// ============================================================================================
// Shadow memory: values computed from never-written memory
// ============================================================================================

TEST_CASE("sanitize: an output computed from a never-written tile names the read, the allocation and the store") {
  int alloc_line = 0, read_line = 0, store_line = 0;
  auto body = [&](Tensor x) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    alloc_line = __LINE__; Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "t");
    Tensor u = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "u");
    isa::dma_copy(t(nl::all, nl::ds(0, 60)), x(nl::ds(0, 128), nl::ds(0, 60)));
    read_line = __LINE__; isa::tensor_scalar(u, t, nl::multiply, 2.0);
    store_line = __LINE__; isa::dma_copy(out, u);
    return out;
  };
  HostTensor x = test::random_tensor(nl::float32, {256, 64}, 1);
  const std::optional<KernelError> error = run_error(trace(sanitized(), "k", body, X), {&x});
  CHECK_ERROR(error, read_line,
              "tensor_scalar reads uninitialized memory: t[0, 60] was never written (512 of the 8192 elements "
              "read here",
              "'t' was allocated at ", fmt::format("{}:{})", kFile, alloc_line),
              "values computed from it reach output 'out' (out[0, 60]) through dma_copy at ",
              fmt::format("{}:{}", kFile, store_line), "nl.zeros or nisa.memset");
}

TEST_CASE("sanitize: computing on garbage that no output keeps is not an error") {
  // A tail tile: 72 partitions loaded, all 128 computed, 72 stored.
  auto body = [](Tensor x) {
    Tensor out = nl::ndarray({72, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "t");
    Tensor m = nl::ndarray({128, 1}, nl::float32, nl::sbuf, "m");
    Tensor e = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "e");
    isa::dma_copy(t(nl::ds(0, 72), nl::all), x(nl::ds(0, 72), nl::all));
    isa::tensor_reduce(m, nl::maximum, t, {1});
    isa::tensor_scalar(e, t, nl::subtract, m);
    isa::dma_copy(out, e(nl::ds(0, 72), nl::all));
    return out;
  };
  HostTensor x = test::random_tensor(nl::float32, {256, 64}, 2);
  test::check_compiles(run_error(trace(sanitized(), "k", body, X), {&x}));
}

TEST_CASE("sanitize: the shadow follows values through matmul columns") {
  // Column 3 of the moving tile is never written, so only column 3 of the product is invalid:
  // a result that leaves it out is clean; one that keeps it names the matmul's read.
  int matmul_line = 0;
  auto kernel = [&](bool keep_column_3) {
    return [&, keep_column_3](Tensor x) {
      Tensor out = nl::ndarray({8, 4}, nl::float32, nl::shared_hbm, "out");
      Tensor a = nl::ndarray({128, 8}, nl::float32, nl::sbuf, "a");
      Tensor b = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "b");
      Tensor acc = nl::zeros({8, 4}, nl::float32, nl::psum, "acc");
      Tensor res = nl::zeros({8, 4}, nl::float32, nl::sbuf, "res");
      isa::dma_copy(a, x(nl::ds(0, 128), nl::ds(0, 8)));
      isa::dma_copy(b(nl::all, nl::ds(0, 3)), x(nl::ds(128, 128), nl::ds(0, 3)));
      matmul_line = __LINE__; isa::nc_matmul(acc, a, b);
      const int64_t n = keep_column_3 ? 4 : 3;
      isa::tensor_copy(res(nl::all, nl::ds(0, n)), acc(nl::all, nl::ds(0, n)));
      isa::dma_copy(out, res);
      return out;
    };
  };
  HostTensor x = test::random_tensor(nl::float32, {256, 64}, 3);
  test::check_compiles(run_error(trace(sanitized(), "k", kernel(false), X), {&x}));
  CHECK_ERROR(run_error(trace(sanitized(), "k", kernel(true), X), {&x}), matmul_line,
              "nc_matmul reads uninitialized memory: b[0, 3] was never written (128 of the 512",
              "reach output 'out' (out[0, 3])");
}
