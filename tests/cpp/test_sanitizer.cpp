// Tests of the sanitizer from C++: nl::affine_range's record of iterations in the kernel.
#include <optional>
#include <string>
#include <vector>

#include "error_check.hpp"

namespace {

using namespace nikki;

constexpr std::string_view kFile = "test_sanitizer.cpp";

#define CHECK_ERROR(error, line, ...) test::check_kernel_error(error, kFile, line, {__VA_ARGS__})

const TensorSpec X = spec({256, 64}, nl::float32, "x");

TraceOptions sanitized() {
  TraceOptions o;
  o.sanitize = true;
  return o;
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
