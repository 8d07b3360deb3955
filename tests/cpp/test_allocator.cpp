// Tests of SBUF/PSUM placement (jit/src/allocate.cpp) and of the live ranges it uses
// (jit/src/liveness.cpp): address reuse, overlap, PSUM banks, manual addresses, capacity errors,
// runtime loops, and that kernels still compute the right values when addresses are reused.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "error_check.hpp"
#include "harness.hpp"
#include "raw_ir.hpp"
#include "nikki/jit/allocate.hpp"
#include "nikki/jit/liveness.hpp"

namespace {

using namespace nikki;

constexpr std::string_view kFile = "test_allocator.cpp";

#define CHECK_ERROR(error, line, ...) test::check_kernel_error(error, kFile, line, {__VA_ARGS__})

const TensorSpec X = spec({128, 512}, nl::float32, "x");

/** Traces and compiles (verify + allocate) a kernel; returns the allocated IR. */
template <class Fn, class... Specs>
Kernel allocated(Fn&& fn, const Specs&... specs) {
  return jit::compile(trace("k", std::forward<Fn>(fn), specs...)).kernel();
}

const Storage& storage(const Kernel& k, std::string_view name) {
  for (const Storage& s : k.storages)
    if (s.name == name) return s;
  FAIL("no storage named " << name);
  return k.storages.front();
}

/** Bytes [begin, end) a storage occupies in each of its partitions once placed. */
struct Placement {
  int64_t p0, p1, b0, b1;
};
Placement placement(const Kernel& k, std::string_view name) {
  const Storage& s = storage(k, name);
  REQUIRE(s.address.has_value());
  return {s.address->partition, s.address->partition + s.partitions(), s.address->byte_offset,
          s.address->byte_offset + s.partition_bytes()};
}
bool overlap(const Placement& a, const Placement& b) {
  return a.p0 < b.p1 && b.p0 < a.p1 && a.b0 < b.b1 && b.b0 < a.b1;
}

StorageId id_of(const Kernel& k, std::string_view name) {
  for (StorageId id = 0; id < k.storages.size(); ++id)
    if (k.storages[id].name == name) return id;
  FAIL("no storage named " << name);
  return 0;
}

using test::append;
using test::link_loops;

}  // namespace

TEST_CASE("alloc: tensors with disjoint live ranges share an address when memory is needed") {
  // Two tiles of 160 KB per partition: both cannot fit, so b reuses a's bytes once a is dead.
  Kernel k = allocated([](Tensor x) {
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    Tensor a = nl::ndarray({128, 40000}, nl::float32, nl::sbuf, "a");
    isa::memset(a, 1.0);
    isa::dma_copy(out, a(nl::all, nl::ds(0, 512)));  // last use of a
    Tensor b = nl::ndarray({128, 40000}, nl::float32, nl::sbuf, "b");
    isa::memset(b, 2.0);
    isa::dma_copy(out, b(nl::all, nl::ds(0, 512)));
    return out;
  }, X);
  const std::vector<jit::LiveRange> live = jit::live_ranges(k);
  CHECK_FALSE(live[id_of(k, "a")].overlaps(live[id_of(k, "b")]));
  CHECK(storage(k, "a").address == Address{0, 0});
  CHECK(storage(k, "b").address == storage(k, "a").address);
  CHECK(k.allocated);
}

TEST_CASE("alloc: a tile allocated in a loop is double-buffered") {
  // Each allocation site alternates between two buffers (next fit for the second one), so the next
  // iteration's load does not wait for the previous iteration's store, and at most two
  // iterations of the tile are in flight.
  Kernel k = allocated([](Tensor x) {
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    for (int i = 0; i < 4; ++i) {
      Tensor t = nl::ndarray({128, 512}, nl::float32, nl::sbuf, fmt::format("t{}", i));  // one site
      isa::dma_copy(t, x);
      isa::dma_copy(out, t);
    }
    return out;
  }, X);
  for (int i = 0; i < 4; ++i) CHECK(storage(k, fmt::format("t{}", i)).address == Address{0, uint32_t(i % 2 * 2048)});
}

TEST_CASE("alloc: tensors live at the same time do not overlap") {
  Kernel k = allocated([](Tensor x) {
    Tensor a = nl::ndarray({128, 3}, nl::bfloat16, nl::sbuf, "a");     // 6 bytes per partition
    Tensor b = nl::ndarray({64, 100}, nl::float32, nl::sbuf, "b");     // 400 bytes, 64 partitions
    Tensor c = nl::ndarray({128, 1, 7}, nl::uint8, nl::sbuf, "c");     // 7 bytes
    Tensor d = nl::ndarray({128, 1000}, nl::float32, nl::sbuf, "d");   // 4000 bytes
    for (const Tensor& t : {a, b, c, d}) isa::memset(t, 1);
    Tensor out = nl::ndarray({128, 1}, nl::float32, nl::shared_hbm, "out");
    Tensor sum = nl::ndarray({128, 1}, nl::float32, nl::sbuf, "sum");
    isa::tensor_reduce(sum, nl::add, d, {1});
    isa::tensor_tensor(sum, sum, a(nl::all, nl::ds(0, 1)), nl::add);
    isa::tensor_tensor(sum(nl::ds(0, 64), nl::all), sum(nl::ds(0, 64), nl::all), b(nl::all, nl::ds(0, 1)), nl::add);
    isa::tensor_tensor(sum, sum, c(nl::all, 0, nl::ds(0, 1)), nl::add);
    isa::dma_copy(out, sum);
    return out;
  }, X);
  const std::vector<std::string> names = {"a", "b", "c", "d", "sum"};
  for (size_t i = 0; i < names.size(); ++i) {
    const Placement p = placement(k, names[i]);
    INFO(names[i] << " at byte " << p.b0);
    CHECK(p.b0 % 4 == 0);  // SBUF placement is 4-byte aligned
    CHECK(p.b1 <= int64_t(k.config().sbuf_bytes_per_partition));
    for (size_t j = i + 1; j < names.size(); ++j) CHECK_FALSE(overlap(p, placement(k, names[j])));
  }
}

TEST_CASE("alloc: PSUM tensors start on bank boundaries and take whole banks") {
  Kernel k = allocated([](Tensor x) {
    Tensor p0 = nl::ndarray({128, 100}, nl::float32, nl::psum, "p0");   // 400 B: one bank
    Tensor p1 = nl::ndarray({128, 600}, nl::float32, nl::psum, "p1");   // 2400 B: two banks
    Tensor p2 = nl::ndarray({128, 10}, nl::bfloat16, nl::psum, "p2");   // 20 B: one bank
    for (const Tensor& t : {p0, p1, p2}) isa::memset(t, 0.0);
    Tensor s = nl::ndarray({128, 10}, nl::float32, nl::sbuf, "s");
    isa::tensor_copy(s, p2);
    isa::tensor_tensor(s, s, p0(nl::all, nl::ds(0, 10)), nl::add);
    isa::tensor_tensor(s, s, p1(nl::all, nl::ds(0, 10)), nl::add);
    // p0, p1, p2 are dead now: a new PSUM tile takes the next bank (rotation), and one that
    // does not fit after it wraps around to bank 0.
    Tensor p3 = nl::ndarray({128, 10}, nl::float32, nl::psum, "p3");
    isa::tensor_copy(p3, s);
    isa::tensor_copy(s, p3);
    Tensor p4 = nl::ndarray({128, 2000}, nl::float32, nl::psum, "p4");  // 4 banks: only banks 0-3 are free
    isa::memset(p4, 0.0);
    isa::tensor_tensor(s, s, p4(nl::all, nl::ds(0, 10)), nl::add);
    Tensor out = nl::ndarray({128, 10}, nl::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, s);
    return out;
  }, X);
  const int64_t bank = k.config().psum_bank_bytes;
  CHECK(placement(k, "p0").b0 == 0);
  CHECK(placement(k, "p1").b0 == 1 * bank);  // p0's 400 bytes take all of bank 0
  CHECK(placement(k, "p2").b0 == 3 * bank);  // p1's 2400 bytes take banks 1 and 2
  CHECK(placement(k, "p3").b0 == 4 * bank);
  CHECK(placement(k, "p4").b0 == 0);
  for (const char* name : {"p0", "p1", "p2", "p3", "p4"}) CHECK(placement(k, name).b0 % bank == 0);
}

TEST_CASE("alloc: manual addresses are honoured and automatic tensors avoid them") {
  Kernel k = allocated([](Tensor x) {
    Tensor m = nl::ndarray({128, 256}, nl::float32, nl::sbuf, "m", Address{0, 4096});    // bytes [4096, 5120)
    Tensor lo = nl::ndarray({64, 128}, nl::float32, nl::sbuf, "lo", Address{0, 8192});   // partitions [0, 64)
    Tensor hi = nl::ndarray({64, 128}, nl::float32, nl::sbuf, "hi", Address{64, 8192});  // same bytes, [64, 128)
    Tensor bank3 = nl::ndarray({128, 512}, nl::float32, nl::psum, "bank3", Address{0, 3 * 2048});
    Tensor u = nl::ndarray({128, 1024}, nl::float32, nl::sbuf, "u");  // 4096 B: fits below m
    Tensor v = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "v");   // 2048 B: after m
    Tensor w = nl::ndarray({128, 1024}, nl::float32, nl::sbuf, "w");  // 4096 B: after lo/hi
    std::vector<Tensor> psum;
    for (int i = 0; i < 4; ++i) psum.push_back(nl::ndarray({128, 512}, nl::float32, nl::psum, "p"));
    for (const Tensor& t : {m, lo, hi, bank3, u, v, w}) isa::memset(t, 1.0);
    for (const Tensor& t : psum) isa::memset(t, 2.0);
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    Tensor s = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "s");
    isa::tensor_copy(s, bank3);
    for (const Tensor& t : psum) isa::tensor_tensor(s, s, t, nl::add);
    for (const Tensor& t : {m, lo, hi, u, v, w}) isa::tensor_tensor(s(nl::ds(0, t.shape()[0]), nl::ds(0, 1)),
                                                                    s(nl::ds(0, t.shape()[0]), nl::ds(0, 1)),
                                                                    t(nl::all, nl::ds(0, 1)), nl::add);
    isa::dma_copy(out, s);
    return out;
  }, X);
  CHECK(storage(k, "m").address == Address{0, 4096});
  CHECK(storage(k, "lo").address == Address{0, 8192});
  CHECK(storage(k, "hi").address == Address{64, 8192});
  CHECK(storage(k, "bank3").address == Address{0, 3 * 2048});
  CHECK(storage(k, "u").address == Address{0, 0});
  CHECK(storage(k, "v").address == Address{0, 5120});
  // Every automatic tensor avoids every tensor live with it.
  const std::vector<std::string> sbuf = {"m", "lo", "hi", "u", "v", "w", "s"};
  for (size_t i = 0; i < sbuf.size(); ++i)
    for (size_t j = i + 1; j < sbuf.size(); ++j) {
      INFO(sbuf[i] << " vs " << sbuf[j]);
      CHECK_FALSE(overlap(placement(k, sbuf[i]), placement(k, sbuf[j])));
    }
  std::vector<int64_t> banks;
  for (const Storage& s : k.storages)
    if (s.buffer == Buffer::psum && s.name != "bank3") banks.push_back(s.address->byte_offset / 2048);
  CHECK(banks == std::vector<int64_t>{0, 1, 2, 4});
}

TEST_CASE("alloc: manually placed tensors may not overlap while both are live") {
  int line_a = 0, line_b = 0;
  auto k = [&](bool both_live) {
    return [&, both_live](Tensor x) {
      Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
      line_a = __LINE__; Tensor a = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "a", Address{0, 0});
      isa::dma_copy(a, x);
      if (!both_live) isa::dma_copy(out, a);
      line_b = __LINE__; Tensor b = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "b", Address{0, 1024});
      isa::dma_copy(b, x);
      if (both_live) isa::tensor_tensor(b, b, a, nl::add);
      isa::dma_copy(out, b);
      return out;
    };
  };
  std::optional<KernelError> e = test::kernel_error(k(true), X);
  CHECK_ERROR(e, line_b, "tensor 'b' at address (0, 1024) overlaps tensor 'a' while both are live",
              "'a' occupies partitions [0, 128) bytes [0, 2048)",
              fmt::format("(created at {}:{})", __FILE__, line_a), "omit address=");
  // The same addresses are fine when the live ranges do not meet.
  test::check_compiles(test::kernel_error(k(false), X));
}

TEST_CASE("alloc: exceeding SBUF names the peak usage, the capacity and the largest live tensors") {
  // Automatic tensors that do not fit are spilled (test_spill.cpp); tensors placed with address=
  // are not, so here the first four tiles are placed by hand and the fifth cannot fit.
  int line_alloc = 0, line_first_use = 0;
  auto k = [&](int tiles) {
    return [&, tiles](Tensor x) {
      std::vector<Tensor> ts;
      for (int i = 0; i < tiles; ++i) {
        // 48 KiB per partition each; trn2 has 212984 bytes (about 208 KiB) per partition.
        const std::optional<Address> at =
            i < 4 ? std::optional(Address{0, uint32_t(i * 49152)}) : std::nullopt;
        line_alloc = __LINE__; ts.push_back(nl::ndarray({128, 12288}, nl::float32, nl::sbuf, fmt::format("t{}", i), at));
        line_first_use = __LINE__; isa::memset(ts.back(), double(i));
      }
      Tensor small = nl::ndarray({128, 16}, nl::float32, nl::sbuf, "small");
      isa::memset(small, 0.0);
      for (const Tensor& t : ts) isa::tensor_tensor(small, small, t(nl::all, nl::ds(0, 16)), nl::add);
      Tensor out = nl::ndarray({128, 16}, nl::float32, nl::shared_hbm, "out");
      isa::dma_copy(out, small);
      return out;
    };
  };
  // Memory runs out where the fifth tile becomes live.
  std::optional<KernelError> e = test::kernel_error(k(5), X);
  const std::string created = fmt::format("(created at {}:{})", __FILE__, line_alloc);
  // It then peaks when `small` joins them.
  CHECK_ERROR(e, line_first_use, "SBUF capacity exceeded: 5 live tensors need 240 KiB per partition, trn2 has 212984 B",
              "usage peaks at 245824 B per partition (6 live tensors)",
              "largest live tensors:", "'t0' f32[128, 12288] 48 KiB per partition", "'t4' f32[128, 12288] 48 KiB",
              created, "in: memset", "limit: 212984 B per partition on trn2 (NeuronCore-v3)", "use smaller tiles");
  test::check_compiles(test::kernel_error(k(4), X));
}

TEST_CASE("alloc: more than 8 PSUM tiles live at once overflow PSUM") {
  int line = 0;
  auto k = [&](int tiles, int64_t free) {
    return [&, tiles, free](Tensor x) {
      std::vector<Tensor> ps;
      for (int i = 0; i < tiles; ++i) {
        ps.push_back(nl::ndarray({128, free}, nl::float32, nl::psum, fmt::format("acc{}", i)));
        line = __LINE__; isa::memset(ps.back(), 0.0);
      }
      Tensor s = nl::ndarray({128, free}, nl::float32, nl::sbuf, "s");
      isa::memset(s, 0.0);
      for (const Tensor& p : ps) isa::tensor_tensor(s, s, p, nl::add);
      Tensor out = nl::ndarray({128, free}, nl::float32, nl::shared_hbm, "out");
      isa::dma_copy(out, s);
      return out;
    };
  };
  CHECK_ERROR(test::kernel_error(k(9, 512), X), line,
              "PSUM capacity exceeded: 9 live tensors need 18 KiB per partition, trn2 has 16 KiB (8 banks of 2 KiB)",
              "'acc0' f32[128, 512] 2 KiB per partition", "each tile takes whole 2 KiB banks");
  // Each tile takes a whole bank however small it is: 9 tiles of 64 bytes overflow too.
  CHECK_ERROR(test::kernel_error(k(9, 16), X), line,
              "PSUM capacity exceeded: 9 live tensors need 18 KiB per partition");
  test::check_compiles(test::kernel_error(k(8, 512), X));
  test::check_compiles(test::kernel_error(k(8, 16), X));
}

TEST_CASE("alloc: a fragmented SBUF is reported as fragmentation, not as capacity") {
  // b is placed by hand, so spilling cannot move it out of c's way.
  int line = 0;
  auto k = [&](Tensor x) {
    Tensor a = nl::ndarray({128, 25600}, nl::float32, nl::sbuf, "a");  // 100 KiB, dies early
    Tensor b = nl::ndarray({128, 20480}, nl::float32, nl::sbuf, "b", Address{0, 102400});  // 80 KiB after a
    isa::memset(a, 1.0);
    isa::memset(b, 2.0);
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, a(nl::all, nl::ds(0, 512)));  // last use of a
    // 120 KiB: with b live, 200 KiB of 208 KiB are in use, but the free space is split in two
    // gaps (100 KiB where a was, 28 KiB after b) and neither holds c.
    Tensor c = nl::ndarray({128, 30720}, nl::float32, nl::sbuf, "c");
    line = __LINE__; isa::memset(c, 3.0);
    Tensor s = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "s");
    isa::tensor_tensor(s, b(nl::all, nl::ds(0, 512)), c(nl::all, nl::ds(0, 512)), nl::add);
    isa::dma_copy(out, s);
    return out;
  };
  CHECK_ERROR(test::kernel_error(k, X), line,
              "SBUF is too fragmented to place 'c' (120 KiB): 200 KiB of 212984 B per partition are live, but the "
              "largest free gap is 100 KiB",
              "'c' f32[128, 30720] 120 KiB", "'b' f32[128, 20480] 80 KiB", "split the large tile");
}

TEST_CASE("alloc: never-used tensors take no space") {
  Kernel k = allocated([](Tensor x) {
    Tensor unused = nl::ndarray({128, 53246}, nl::float32, nl::sbuf, "unused");  // all of SBUF, never touched
    (void)unused;
    Tensor t = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "t");
    isa::dma_copy(t, x);
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, t);
    return out;
  }, X);
  CHECK(storage(k, "t").address == Address{0, 0});
  CHECK(storage(k, "unused").address.has_value());
}

TEST_CASE("alloc: a tensor used inside a runtime loop stays live for the whole loop") {
  // a is written before the loop and last read at the top of the body; u is created later in the
  // body. Program order alone would let u reuse a's bytes, which the loop's next iteration still
  // reads, so a must stay live until loop_end.
  Kernel k = trace("k", [](Tensor x) {
    KernelBuilder& b = x.builder();
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    Tensor a = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "a");
    isa::dma_copy(a, x);
    isa::tensor_scalar(a, a, nl::multiply, 3.0);
    const RegisterId i = b.new_register();
    append(Opcode::loop_begin, {Operand::reg_(i), Operand::immediate(0), Operand::immediate(3)});
    Tensor t = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "t");
    isa::tensor_scalar(t, a, nl::add, 1.0);  // last use of a in program order
    Tensor u = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "u");
    isa::dma_copy(u, x);
    isa::tensor_tensor(t, t, u, nl::add);  // t = 3x + 1 + x
    isa::dma_copy(out, t);
    append(Opcode::loop_end, {});
    return out;
  }, X);
  link_loops(k);

  int32_t loop_end = -1;
  for (int32_t n = 0; n < static_cast<int32_t>(k.instructions.size()); ++n)
    if (k.instructions[n].opcode == Opcode::loop_end) loop_end = n;
  const std::vector<jit::LiveRange> live = jit::live_ranges(k);
  CHECK(live[id_of(k, "a")].end == static_cast<uint32_t>(loop_end));
  // Tensors created inside the body are not extended: they are rewritten every iteration.
  CHECK(live[id_of(k, "u")].end < static_cast<uint32_t>(loop_end));

  jit::Program program = jit::compile(k);
  CHECK_FALSE(overlap(placement(program.kernel(), "a"), placement(program.kernel(), "u")));
  CHECK_FALSE(overlap(placement(program.kernel(), "a"), placement(program.kernel(), "t")));

  test::HostTensor in = test::random_tensor(DType::float32, {128, 512}, 7);
  std::vector<test::HostTensor> outs = test::run_kernel(k, {&in});
  int64_t wrong = 0;
  for (int64_t e = 0; e < in.size(); ++e) wrong += outs[0].get(e) != 3.0f * in.get(e) + 1.0f + in.get(e);
  CHECK(wrong == 0);
}

TEST_CASE("alloc: values stay correct when addresses are reused") {
  // Four row blocks go through an SBUF tile and a PSUM tile each; the tiles are too large for two
  // to be live together (120 KB of SBUF, 5 PSUM banks per partition), so every block reuses the
  // same SBUF and PSUM addresses.
  auto kernel = [](Tensor x) {
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    for (int64_t i = 0; i < 4; ++i) {
      Tensor t_big = nl::ndarray({32, 30000}, nl::float32, nl::sbuf, fmt::format("t{}", i));
      Tensor t = t_big(nl::all, nl::ds(0, 512));
      isa::dma_copy(t, x(nl::ds(32 * i, 32), nl::all));
      Tensor p_big = nl::ndarray({32, 2560}, nl::float32, nl::psum, fmt::format("p{}", i));
      Tensor p = p_big(nl::all, nl::ds(0, 512));
      isa::tensor_scalar(p, t, nl::multiply, double(i + 1), {.op1 = nl::add, .operand1 = isa::Scalar(0.5)});
      Tensor r = nl::ndarray({32, 512}, nl::float32, nl::sbuf, fmt::format("r{}", i));
      isa::tensor_copy(r, p);
      isa::dma_copy(out(nl::ds(32 * i, 32), nl::all), r);
    }
    return out;
  };
  Kernel k = allocated(kernel, X);
  for (int i = 1; i < 4; ++i) {
    CHECK(storage(k, fmt::format("t{}", i)).address == storage(k, "t0").address);
    CHECK(storage(k, fmt::format("p{}", i)).address == storage(k, "p0").address);
  }
  test::HostTensor in = test::random_tensor(DType::float32, {128, 512}, 11);
  test::HostTensor out = test::run1(kernel, in);
  int64_t wrong = 0;
  for (int64_t p = 0; p < 128; ++p)
    for (int64_t f = 0; f < 512; ++f) {
      const float want = in.get(p * 512 + f) * float(p / 32 + 1) + 0.5f;
      wrong += out.get(p * 512 + f) != want;
    }
  CHECK(wrong == 0);
}

TEST_CASE("alloc: a reused address does not leak the previous tensor's values") {
  // Fresh allocations read as NaN until written, even when their bytes held another tensor.
  auto kernel = [](Tensor x) {
    Tensor out0 = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out0");
    Tensor out1 = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out1");
    // 160 KB per partition each: b must reuse a's bytes.
    Tensor a_big = nl::ndarray({128, 40000}, nl::float32, nl::sbuf, "a");
    Tensor a = a_big(nl::all, nl::ds(0, 512));
    isa::dma_copy(a, x);
    isa::dma_copy(out0, a);
    Tensor b_big = nl::ndarray({128, 40000}, nl::float32, nl::sbuf, "b");
    Tensor b = b_big(nl::all, nl::ds(0, 512));
    isa::dma_copy(b(nl::all, nl::ds(0, 256)), x(nl::all, nl::ds(0, 256)));  // half of b written
    isa::dma_copy(out1, b);
    return std::make_tuple(out0, out1);
  };
  Kernel k = allocated(kernel, X);
  REQUIRE(storage(k, "b").address == storage(k, "a").address);
  test::HostTensor in = test::random_tensor(DType::float32, {128, 512}, 3);
  std::vector<test::HostTensor> outs = test::run_kernel(trace("k", kernel, X), {&in});
  int64_t stale = 0, lost = 0;
  for (int64_t p = 0; p < 128; ++p)
    for (int64_t f = 0; f < 512; ++f) {
      const float v = outs[1].get(p * 512 + f);
      if (f < 256) lost += v != in.get(p * 512 + f);
      else stale += !std::isnan(v);
    }
  CHECK(lost == 0);
  CHECK(stale == 0);
}
