// Tests of the sanitizer from C++: nl::affine_range's record of iterations in the kernel, the
// reference interpreter's shadow memory (values computed from never-written memory), the static
// check of dependencies between affine_range iterations (jit/sanitize.hpp), and the switches
// (CompileOptions::sanitize, JitKernel, NIKKI_SANITIZE).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "error_check.hpp"
#include "harness.hpp"
#include "scoped_env.hpp"

#include "nikki/jit/sanitize.hpp"
#include "nikki/runtime/jit_kernel.hpp"

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

// ============================================================================================
// Dependencies between affine_range iterations
// ============================================================================================

namespace {

/** The KernelError of compiling `fn` traced for the sanitizer, with the loop check on. */
template <class Fn>
std::optional<KernelError> loop_error(Fn&& fn) {
  try {
    jit::compile(trace(sanitized(), "k", std::forward<Fn>(fn), X),
                 jit::CompileOptions{.schedule = false, .disk_cache = false, .sanitize = true});
  } catch (const KernelError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("sanitize: an iteration reading another iteration's write names the loop, both lines and the tensor") {
  int loop_line = 0, write_line = 0, read_line = 0;
  auto body = [&](Tensor x) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor acc = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "acc");
    isa::dma_copy(acc, x(nl::ds(0, 128), nl::all));
    loop_line = __LINE__; for (int64_t i : nl::affine_range(1, 4)) {
      Tensor prev = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "prev");
      read_line = __LINE__; isa::tensor_copy(prev, acc(nl::all, nl::ds((i - 1) * 16, 16)));
      write_line = __LINE__; isa::tensor_scalar(acc(nl::all, nl::ds(i * 16, 16)), prev, nl::multiply, 2.0);
    }
    isa::dma_copy(out, acc);
    return out;
  };
  const std::optional<KernelError> error = loop_error(body);  // sets the lines the message names
  CHECK_ERROR(error, read_line, "loop-carried dependency in the nl.affine_range loop at",
              fmt::format("{}:{}: iteration 2 reads 'acc', which iteration 1 wrote at ", kFile, loop_line),
              fmt::format("{}:{}", kFile, write_line), "nl.sequential_range");
  // The same kernel compiles without the check, and traced without the record.
  CHECK_NOTHROW(jit::compile(trace(sanitized(), "k", body, X), jit::CompileOptions{.schedule = false}));
  CHECK_NOTHROW(jit::compile(trace("k", body, X),
                             jit::CompileOptions{.schedule = false, .disk_cache = false, .sanitize = true}));
}

TEST_CASE("sanitize: two iterations writing one tile, and one overwriting what another read") {
  int write_line = 0;
  auto waw = [&](Tensor x) {
    Tensor out = nl::ndarray({256, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor buf = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "buf");
    for (int64_t i : nl::affine_range(2)) {
      write_line = __LINE__; isa::dma_copy(buf, x(nl::ds(i * 128, 128), nl::all));
      isa::dma_copy(out(nl::ds(i * 128, 128), nl::all), buf);
    }
    return out;
  };
  CHECK_ERROR(loop_error(waw), write_line, "iteration 1 overwrites 'buf', which iteration 0 wrote",
              "allocate the tile inside the loop");

  int read_line = 0, overwrite_line = 0;
  auto war = [&](Tensor x) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor t = nl::ndarray({128, 48}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x(nl::ds(0, 128), nl::ds(0, 48)));
    for (int64_t i : nl::affine_range(2)) {
      // Iteration i reads block i + 1 and then overwrites block i: iteration 1 overwrites the
      // block iteration 0 read, and reads nothing another iteration wrote.
      Tensor u = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "u");
      read_line = __LINE__; isa::tensor_copy(u, t(nl::all, nl::ds((i + 1) * 16, 16)));
      overwrite_line = __LINE__; isa::memset(t(nl::all, nl::ds(i * 16, 16)), 0.0);
      isa::dma_copy(out(nl::all, nl::ds(i * 16, 16)), u);
    }
    return out;
  };
  const std::optional<KernelError> error = loop_error(war);
  CHECK_ERROR(error, overwrite_line, "iteration 1 overwrites 't', which iteration 0 read at",
              fmt::format("{}:{}", kFile, read_line));
}

TEST_CASE("sanitize: accumulations NKI allows pass; disjoint and interleaved parts pass; a prefix sum does not") {
  auto allowed = [](Tensor x) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor psum = nl::zeros({64, 64}, nl::float32, nl::psum, "psum");
    Tensor total = nl::zeros({128, 64}, nl::float32, nl::sbuf, "total");
    Tensor wide = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "wide");
    for (int64_t i : nl::affine_range(2)) {
      Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "t");
      isa::dma_copy(t, x(nl::ds(i * 128, 128), nl::all));
      isa::nc_matmul(psum, t, t, {.accumulate = true});  // PSUM accumulation
      isa::tensor_tensor(total, total, t, nl::add);          // total += t
      isa::tensor_copy(wide(nl::all, Slice{i, 64, 2}), t(nl::all, nl::ds(0, 32)));  // interleaved columns
    }
    Tensor r = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "r");
    isa::tensor_tensor(r, total, wide, nl::add);
    isa::tensor_copy(r(nl::ds(0, 64), nl::all), psum);
    isa::dma_copy(out, r);
    return out;
  };
  test::check_compiles(loop_error(allowed));

  int line = 0;
  auto prefix = [&](Tensor x) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor s = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "s");
    isa::dma_copy(s, x(nl::ds(0, 128), nl::all));
    for (int64_t i : nl::affine_range(1, 64)) {
      Tensor column = s(nl::all, nl::ds(i, 1));
      line = __LINE__; isa::tensor_tensor(column, s(nl::all, nl::ds(i - 1, 1)), column, nl::add);
    }
    isa::dma_copy(out, s);
    return out;
  };
  CHECK_ERROR(loop_error(prefix), line, "iteration 2 reads 's', which iteration 1 wrote");
}

TEST_CASE("sanitize: a program served from the disk cache has its loops checked all the same") {
  test::TempCacheDir cache;
  int line = 0;
  auto waw = [&](Tensor x) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    for (int64_t i : nl::affine_range(2)) line = __LINE__, isa::dma_copy(out, x(nl::ds(i * 128, 128), nl::all));
    return out;
  };
  // Compiled unsanitized, the device program lands in the cache; compiled again, it is a hit
  // (no verify stage). The sanitized compile has the same key: it hits too, and still fails.
  auto stages = [](const jit::Program& p) {
    std::vector<std::string> names;
    for (const jit::StageTiming& t : p.timings) names.push_back(t.stage);
    return names;
  };
  (void)jit::compile(trace(sanitized(), "k", waw, X));
  REQUIRE(stages(jit::compile(trace(sanitized(), "k", waw, X))) == std::vector<std::string>{"cache"});
  std::optional<KernelError> error;
  try {
    (void)jit::compile(trace(sanitized(), "k", waw, X), jit::CompileOptions{.sanitize = true});
  } catch (const KernelError& e) {
    error = e;
  }
  CHECK_ERROR(error, line, "iteration 1 overwrites 'out', which iteration 0 wrote", "its own part of 'out'");
}

// ============================================================================================
// Switches: JitKernel and NIKKI_SANITIZE
// ============================================================================================

TEST_CASE("sanitize: JitKernel follows NIKKI_SANITIZE and runs sanitized kernels on the checking interpreter") {
  int read_line = 0;
  auto body = [&](const std::vector<Tensor>& in) {
    Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
    Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t(nl::ds(0, 100), nl::all), in[0](nl::ds(0, 100), nl::all));
    Tensor u = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "u");
    read_line = __LINE__; isa::activation(u, nl::exp, t);
    isa::dma_copy(out, u);
    return std::vector<Tensor>{out};
  };
  HostTensor x = test::random_tensor(nl::float32, {256, 64}, 4);
  HostTensor y(nl::float32, {128, 64});
  std::vector<void*> in{x.data()}, out{y.data()};
  const runtime::Specialization s{{X}, {}, 0};
  {
    test::ScopedEnv on("NIKKI_SANITIZE", "1");
    runtime::JitKernel k("k", body);
    std::optional<KernelError> error;
    try {
      k.run(s, in, out);
    } catch (const KernelError& e) {
      error = e;
    }
    CHECK_ERROR(error, read_line, "activation reads uninitialized memory: t[100, 0] was never written",
                "reach output 'out' (out[100, 0])");
    CHECK(k.compiled(s).sanitizer != nullptr);
    CHECK(k.compiled(s).executor == nullptr);
  }
  {
    test::ScopedEnv off("NIKKI_SANITIZE", "0");
    runtime::JitKernel k("k", body);
    CHECK_NOTHROW(k.run(s, in, out));
    CHECK(std::isnan(y.get(100 * 64)));  // the sentinel the sanitizer reports
    CHECK(k.compiled(s).executor != nullptr);
  }
  {
    test::ScopedEnv bad("NIKKI_SANITIZE", "on");
    std::optional<KernelError> error;
    try {
      (void)jit::sanitize_from_env();
    } catch (const KernelError& e) {
      error = e;
    }
    REQUIRE(error.has_value());
    CHECK(std::string(error->what()).find("NIKKI_SANITIZE=on is not 0 or 1") != std::string::npos);
    CHECK(error->hint().find("set NIKKI_SANITIZE=1") != std::string::npos);
  }
}
