// Sizes at the limits: shape arithmetic that would overflow int64, empty inputs, HBM capacity,
// the instruction budget, and simulated memory that must cost what a kernel touches, not what
// its tensors could hold.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include <sys/resource.h>

#include "error_check.hpp"
#include "harness.hpp"
#include "nikki/kernels/registry.hpp"
#include "scoped_env.hpp"

namespace {

using namespace nikki;
using test::check_compiles;
using test::kernel_error;
using test::kernel_error_on;

constexpr std::string_view kFile = "test_sizes.cpp";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kGiB = int64_t(1) << 30;

#define CHECK_ERROR(error, line, ...) test::check_kernel_error(error, kFile, line, {__VA_ARGS__})

/** The KernelError of tracing alone (errors the builder and the views raise). */
template <class Fn, class... Specs>
std::optional<KernelError> trace_error(const TraceOptions& options, Fn&& fn, const Specs&... specs) {
  try {
    trace(options, "k", std::forward<Fn>(fn), specs...);
  } catch (const KernelError& e) {
    return e;
  }
  return std::nullopt;
}

/** Copies `t` into a new [P, F] shared_hbm output through SBUF. */
Tensor store_tile(const Tensor& t, Loc loc = Loc::current()) {
  Tensor out = nl::ndarray(t.shape(), t.dtype(), nl::shared_hbm, "out", std::nullopt, loc);
  isa::dma_copy(out, t, loc);
  return out;
}

/** The peak resident memory of this process so far (ru_maxrss): it rises whenever a run touches more. */
int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

TEST_CASE("checked size arithmetic reports overflow instead of wrapping") {
  CHECK(checked_mul(int64_t(1) << 31, int64_t(1) << 31) == int64_t(1) << 62);
  CHECK(!checked_mul(int64_t(1) << 32, int64_t(1) << 31));
  CHECK(!checked_mul(-1, std::numeric_limits<int64_t>::min()));
  CHECK(checked_add(kMax - 1, 1) == kMax);
  CHECK(!checked_add(kMax, 1));
  // (2^62 + 1) x 4 wraps to 4 in plain int64 arithmetic: the defect that made such a tensor 4 elements.
  CHECK(!Shape({(int64_t(1) << 62) + 1, 4}).checked_num_elements());
  CHECK(!Shape({(int64_t(1) << 32) + 1, int64_t(1) << 32}).checked_num_elements());
  CHECK(Shape({int64_t(1) << 31, 4}).checked_bytes(4) == int64_t(1) << 35);
  CHECK(!Shape({int64_t(1) << 61, 2}).checked_bytes(4));  // the elements fit, the bytes do not
  CHECK(Shape().checked_num_elements() == 1);
  CHECK(bytes_text(96 * kGiB) == "96 GiB");
  CHECK(bytes_text(48 * 1024) == "48 KiB");
  CHECK(bytes_text(212984) == "212984 B");
  CHECK(bytes_text(kGiB + 1) == "1.00 GiB (1073741825 B)");
}

TEST_CASE("a tensor whose element count or byte size overflows int64 is a KernelError naming its shape") {
  int line = 0;
  auto e = trace_error({}, [&](const Tensor& x) {
    line = __LINE__; Tensor big = nl::ndarray({(int64_t(1) << 62) + 1, 4}, nl::float32, nl::shared_hbm, "big");
    return big;
  }, spec({128, 4}, nl::float32, "x"));
  CHECK_ERROR(e, line, "tensor 'big' of shape [4611686018427387905, 4] and dtype float32 has more bytes than a 64-bit",
              "limit: element counts, byte sizes and offsets must fit in a signed 64-bit integer (at most "
              "9223372036854775807)");

  e = trace_error({}, [&](const Tensor& x) {
    line = __LINE__; return nl::ndarray({(int64_t(1) << 32) + 1, int64_t(1) << 32}, nl::float32, nl::shared_hbm, "wide");
  }, spec({128, 4}, nl::float32, "x"));
  CHECK_ERROR(e, line, "tensor 'wide' of shape [4294967297, 4294967296]", "signed 64-bit integer");
}

TEST_CASE("kernel inputs: negative extents and overflowing sizes are KernelErrors naming the input") {
  auto body = [](const Tensor& x) { return x; };
  auto e = trace_error({}, body, spec({(int64_t(1) << 62) + 1, 4}, nl::float32, "x"));
  REQUIRE(e);
  CHECK(std::string(e->what()).find("tensor 'x' of shape [4611686018427387905, 4]") != std::string::npos);
  CHECK(e->instruction() == "input");
  e = trace_error({}, body, spec({-2, 4}, nl::float32, "y"));
  REQUIRE(e);
  CHECK(std::string(e->what()).find("tensor 'y' has shape [-2, 4] with extent -2") != std::string::npos);
  CHECK(e->limit() == "input extents are >= 0");
}

TEST_CASE("views built from user numbers cannot wrap around") {
  const TensorSpec X = spec({128, 4}, nl::float32, "x");
  int line = 0;
  // A broadcast whose element count overflows.
  auto e = trace_error({}, [&](const Tensor& x) {
    Tensor col = x(Slice{}, Slice{0, 1});
    line = __LINE__; Tensor wide = col.broadcast(1, int64_t(1) << 60);
    return x;
  }, X);
  CHECK_ERROR(e, line, "broadcast of dim 1 to 1152921504606846976: a view of shape [128, 1152921504606846976] has "
              "more elements than a 64-bit integer can count", "signed 64-bit integer");

  // A raw access pattern whose stride times count overflows: its offsets would wrap.
  e = trace_error({}, [&](const Tensor& x) {
    line = __LINE__; Tensor v = x.ap({{int64_t(1) << 62, 3}, {1, 4}});
    return x;
  }, X);
  CHECK_ERROR(e, line, "ap(): the view with offset 0 and [stride, count] pattern [[4611686018427387904, 3], [1, 4]] "
              "reaches offsets that overflow a 64-bit integer in bytes");

  // A stride that fits in elements but not in bytes, on a size-1 dim nothing else bounds.
  e = trace_error({}, [&](const Tensor& x) {
    line = __LINE__; Tensor v = x.ap({{int64_t(1) << 62, 1}, {1, 4}});
    return x;
  }, X);
  CHECK_ERROR(e, line, "overflow a 64-bit integer in bytes");

  // A reshape to a shape whose product overflows.
  e = trace_error({}, [&](const Tensor& x) {
    line = __LINE__; Tensor v = x.reshape({int64_t(1) << 40, int64_t(1) << 40});
    return x;
  }, X);
  CHECK_ERROR(e, line, "cannot reshape to [1099511627776, 1099511627776]: it has more elements than a 64-bit");

  // nl.ds near the top of int64: out of bounds, not a wrapped-around small range.
  e = trace_error({}, [&](const Tensor& x) {
    line = __LINE__; Tensor v = x(nl::ds(kMax - 1, 4), Slice{});
    return x;
  }, X);
  CHECK_ERROR(e, line, "out-of-bound access on dim 0", "exceeds dimension size 128");
}

TEST_CASE("a slice step near the top of int64 selects one element instead of overflowing") {
  std::optional<Shape> shape;
  auto e = trace_error({}, [&](const Tensor& x) {
    Tensor v = x(Slice{0, 128, kMax}, Slice{});
    shape = v.shape();
    CHECK(v.offset() == 0);
    return nl::ndarray({1, 4}, nl::float32, nl::shared_hbm, "out");
  }, spec({128, 4}, nl::float32, "x"));
  CHECK(!e);
  REQUIRE(shape);
  CHECK(*shape == Shape({1, 4}));
}

TEST_CASE("HBM tensors are held to the chip's device memory") {
  int line = 0;
  const TensorSpec X = spec({128, 4}, nl::float32, "x");
  // 4 TiB of private_hbm scratch: rejected at compile time, before any memory is allocated.
  auto e = kernel_error([&](const Tensor& x) {
    line = __LINE__; Tensor s = nl::ndarray({int64_t(1) << 38, 4}, nl::float32, nl::private_hbm, "s");
    Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x);
    isa::dma_copy(s(Slice{0, 128}, Slice{}), t);
    return store_tile(t);
  }, X);
  CHECK_ERROR(e, line, "private_hbm tensor 's' of shape [274877906944, 4] float32 needs 4 TiB, more than the device "
              "memory of trn2 (NeuronCore-v3)", "limit: 96 GiB of device memory (HBM) per trn2 chip, shared by its 8 "
              "NeuronCores");

  // Just under trn1's 32 GiB compiles; just over does not.
  auto with_scratch = [&](int64_t rows) {
    return [&, rows](const Tensor& x) {
      line = __LINE__; Tensor s = nl::ndarray({rows, 1024}, nl::float32, nl::private_hbm, "s");
      Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
      isa::dma_copy(t, x);
      isa::dma_copy(s(Slice{0, 128}, Slice{0, 4}), t);
      return store_tile(t);
    };
  };
  const int64_t rows_of_32_gib = 32 * kGiB / (1024 * 4);
  check_compiles(kernel_error_on(TraceOptions{.target = TargetId::trn1}, with_scratch(rows_of_32_gib - 1), X));
  e = kernel_error_on(TraceOptions{.target = TargetId::trn1}, with_scratch(rows_of_32_gib + 1), X);
  CHECK_ERROR(e, line, "needs 32.00 GiB (34359742464 B), more than the device memory of trn1 (NeuronCore-v2)",
              "limit: 32 GiB of device memory (HBM) per trn1 chip, shared by its 2 NeuronCores");
}

TEST_CASE("HBM tensors that fit one by one but not together are rejected, largest named first") {
  int line = 0;
  auto e = kernel_error_on(TraceOptions{.target = TargetId::trn1}, [&](const Tensor& x) {
    line = __LINE__; Tensor a = nl::ndarray({5 * 1024, 1024 * 1024}, nl::float32, nl::private_hbm, "a");  // 20 GiB
    Tensor b = nl::ndarray({4 * 1024, 1024 * 1024}, nl::float32, nl::private_hbm, "b");  // 16 GiB
    Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x);
    isa::dma_copy(a(Slice{0, 128}, Slice{0, 4}), t);
    isa::dma_copy(b(Slice{0, 128}, Slice{0, 4}), t);
    return store_tile(t);
  }, spec({128, 4}, nl::float32, "x"));
  CHECK_ERROR(e, line, "the HBM tensors of kernel 'k' need more than the device memory of trn1", "'a' private_hbm "
              "f32[5120, 1048576] 20 GiB", "'b' private_hbm f32[4096, 1048576] 16 GiB", "limit: 32 GiB of device memory");
}

TEST_CASE("an input larger than the device memory is rejected by the verifier") {
  auto e = kernel_error_on(TraceOptions{.target = TargetId::trn1}, [](const Tensor& x) {
    Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x(Slice{0, 128}, Slice{0, 4}));
    return store_tile(t);
  }, spec({int64_t(1) << 20, 10 * 1024}, nl::float32, "x"));  // 40 GiB
  REQUIRE(e);
  CHECK(std::string(e->what()).find("input tensor 'x' of shape [1048576, 10240] float32 needs 40 GiB, more than the "
                                    "device memory of trn1") != std::string::npos);
}

TEST_CASE("library kernels reject empty inputs, naming the input and its shape") {
  const kernels::KernelInfo& matmul = kernels::find_kernel("matmul");
  try {
    // K = 0 divided the K tiles among zero blocks (SIGFPE) before this check.
    kernels::trace_library_kernel(matmul, {spec({130, 0}, nl::float32), spec({0, 70}, nl::float32)}, {});
    FAIL("expected a KernelError");
  } catch (const KernelError& e) {
    CHECK(e.summary() == "kernel 'matmul': input 'a' has shape [130, 0] with no elements");
    CHECK(e.limit() == "library kernels take inputs with every extent >= 1");
    CHECK(e.instruction() == "matmul");
  }
  for (const kernels::KernelInfo& k : kernels::registry()) {
    CAPTURE(k.name);
    std::vector<TensorSpec> specs = k.examples.front().inputs;
    specs.back().shape[0] = 0;
    CHECK_THROWS_AS(kernels::trace_library_kernel(k, specs, k.examples.front().params), KernelError);
  }
}

TEST_CASE("an empty kernel input may be passed but not accessed") {
  const TensorSpec empty = spec({130, 0}, nl::float32, "e"), X = spec({128, 4}, nl::float32, "x");
  check_compiles(kernel_error([](const Tensor& e, const Tensor& x) {
    Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x);
    return store_tile(t);
  }, empty, X));
  int line = 0;
  auto e = kernel_error([&](const Tensor& e, const Tensor& x) {
    Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
    line = __LINE__; isa::dma_copy(t, e.ap({{4, 128}, {1, 4}}));
    return store_tile(t);
  }, empty, X);
  CHECK_ERROR(e, line, "dma_copy: src accesses tensor 'e' of shape [130, 0], which has no elements");
}

TEST_CASE("an on-chip view whose element is wider than a partition row is rejected (it divided by zero)") {
  int line = 0;
  auto e = kernel_error([&](const Tensor& x) {
    Tensor bytes = nl::ndarray({128, 2}, nl::uint8, nl::sbuf, "bytes");
    isa::memset(bytes, 0);
    Tensor word = bytes.ap({{1, 1}, {1, 1}}, ApOptions{.dtype = nl::float32});
    Tensor t = nl::ndarray({1, 1}, nl::float32, nl::sbuf, "t");
    line = __LINE__; isa::tensor_copy(t, word);
    return store_tile(t);
  }, spec({1, 1}, nl::float32, "x"));
  CHECK_ERROR(e, line, "tensor_copy: src views tensor 'bytes' as float32, but a partition row of it holds only 2 bytes",
              "an on-chip view's element (4 bytes) must fit in one partition row");
}

TEST_CASE("a kernel that unrolls past NIKKI_MAX_INSTRUCTIONS fails at the instruction over the limit") {
  test::ScopedEnv limit("NIKKI_MAX_INSTRUCTIONS", "50");
  CHECK(max_instructions() == 50);
  auto memsets = [](int count, int& line) {
    return [count, &line](const Tensor& x) {
      Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
      for (int i = 0; i < count; ++i) {
        line = __LINE__; isa::memset(t, double(i));
      }
      return store_tile(t);
    };
  };
  int line = 0;
  check_compiles(kernel_error(memsets(49, line), spec({128, 4}, nl::float32, "x")));  // 49 memsets + 1 store
  auto e = trace_error({}, memsets(51, line), spec({128, 4}, nl::float32, "x"));  // the 51st instruction
  CHECK_ERROR(e, line, "kernel 'k' unrolls into more than 50 instructions", "in: memset",
              "at most 50 instructions per kernel launch (NIKKI_MAX_INSTRUCTIONS)", "nl.fori_loop");
}

TEST_CASE("NIKKI_MAX_INSTRUCTIONS: anything but a positive integer leaves the default") {
  for (const char* value : {"", "0", "-5", "12abc"}) {
    test::ScopedEnv limit("NIKKI_MAX_INSTRUCTIONS", value);
    CHECK(max_instructions() == kDefaultMaxInstructions);
  }
}

TEST_CASE("an HBM scratch tensor costs the host what the kernel touches of it, not its size") {
  // 64 GiB of private_hbm (more than this machine's memory), of which the kernel uses 128 rows.
  const int64_t rows = int64_t(1) << 24, cols = 1024;
  test::HostTensor x = test::random_tensor(DType::float32, {128, 4}, 7);
  for (test::Mode mode : {test::Mode::program_order, test::Mode::streams_interp, test::Mode::streams_native}) {
    CAPTURE(int(mode));
    Kernel k = trace("scratch", [&](const Tensor& in) {
      Tensor s = nl::ndarray({rows, cols}, nl::float32, nl::private_hbm, "s");
      Tensor t = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "t");
      isa::dma_copy(t, in);
      isa::dma_copy(s(Slice{rows / 2, rows / 2 + 128}, Slice{cols - 4, cols}), t);
      Tensor back = nl::ndarray({128, 4}, nl::float32, nl::sbuf, "back");
      isa::dma_copy(back, s(Slice{rows / 2, rows / 2 + 128}, Slice{cols - 4, cols}));
      return store_tile(back);
    }, x.spec("x"));
    const int64_t before = peak_resident_bytes();
    std::vector<test::HostTensor> out = test::run_kernel(std::move(k), {&x}, mode);
    // The touched rows plus the simulated SBUF/PSUM pages, far from 64 GiB.
    CHECK(peak_resident_bytes() - before < 256 * (int64_t(1) << 20));
    REQUIRE(out.size() == 1);
    CHECK(out[0].bytes == x.bytes);
  }
}

}  // namespace
