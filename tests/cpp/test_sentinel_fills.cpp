// Fresh tiles hold sentinels (NaN for floats, 4 for integers) wherever a kernel reads them before
// writing; fills nobody can observe are skipped.
#include <cmath>

#include "harness.hpp"
#include "nikki/jit/liveness.hpp"

namespace nikki::test {
namespace {

TEST_CASE("sentinel fills: skipped only when the first instruction overwrites the whole tile unread") {
  Kernel k = trace("fills", [](const Tensor& x) {
    Tensor out = nl::ndarray({64, 32}, nl::float32, nl::shared_hbm, "out");
    Tensor whole = nl::ndarray({64, 32}, nl::float32, nl::sbuf, "whole");
    isa::dma_copy(whole, x);  // 0: writes every byte, reads nothing of it
    Tensor part = nl::ndarray({64, 32}, nl::float32, nl::sbuf, "part");
    isa::tensor_copy(part(nl::all, nl::ds(0, 16)), whole(nl::all, nl::ds(0, 16)));  // 1: half of it
    Tensor inplace = nl::ndarray({64, 32}, nl::float32, nl::sbuf, "inplace");
    isa::tensor_scalar(inplace, inplace, nl::add, 1.0);  // 2: reads its own fresh memory
    Tensor acc = nl::ndarray({64, 32}, nl::float32, nl::psum, "acc");
    isa::memset(acc, 0.0);  // 3: PSUM always gets its fill
    isa::tensor_tensor(part, part, inplace, nl::add);  // 4
    isa::tensor_tensor(part, part, acc, nl::add);      // 5
    isa::dma_copy(out, part);
    return out;
  }, spec({64, 32}, DType::float32, "x"));
  jit::Program p = jit::compile(std::move(k));
  const Kernel& kernel = p.kernel();
  auto id_of = [&](const std::string& name) {
    for (StorageId id = 0; id < kernel.storages.size(); ++id)
      if (kernel.storages[id].name == name) return id;
    FAIL("no storage " << name);
    return StorageId{};
  };
  const auto fills = jit::sentinel_fills(kernel, jit::live_ranges(kernel));
  auto filled_at = [&](uint32_t i) { return fills.at(i); };
  CHECK(filled_at(0).empty());
  CHECK(filled_at(1) == std::vector<StorageId>{id_of("part")});
  CHECK(filled_at(2) == std::vector<StorageId>{id_of("inplace")});
  CHECK(filled_at(3) == std::vector<StorageId>{id_of("acc")});

  // The unwritten half of `part` and all of `inplace` read as NaN, on every executor.
  HostTensor x = random_tensor(DType::float32, {64, 32}, 1);
  for (Mode mode : {Mode::program_order, Mode::streams_interp, Mode::streams_native}) {
    HostTensor out = run_kernel(p.kernel(), {&x}, mode).at(0);
    for (int64_t i = 0; i < out.size(); ++i) REQUIRE(std::isnan(out.get(i)));
  }
}

TEST_CASE("sentinel fills: a tile reused at a dirty address still reads as sentinels where unwritten") {
  // One allocation site alternates two buffers, so round 2's tile lands on round 0's dirty
  // address; written in part, it must not expose round 0's values.
  Kernel k = trace("reuse", [](const Tensor& x) {
    Tensor out = nl::ndarray({32, 16}, nl::int32, nl::shared_hbm, "out");
    for (int round = 0; round < 3; ++round) {
      Tensor t = nl::ndarray({32, 16}, nl::int32, nl::sbuf, "t");
      if (round < 2) {
        isa::dma_copy(t, x);
        isa::dma_copy(out, t);
      } else {
        isa::iota(t(nl::all, nl::ds(0, 8)), {{1, 8}}, 0, 0);
        isa::dma_copy(out, t);
      }
    }
    return out;
  }, spec({32, 16}, DType::int32, "x"));
  jit::Program p = jit::compile(k);
  std::vector<const Storage*> tiles;
  for (const Storage& s : p.kernel().storages)
    if (s.buffer == Buffer::sbuf) tiles.push_back(&s);
  REQUIRE(tiles.size() == 3);
  REQUIRE(tiles[0]->address.has_value());
  REQUIRE(tiles[2]->address.has_value());
  CHECK(tiles[2]->address->byte_offset == tiles[0]->address->byte_offset);  // the premise of the test
  CHECK(tiles[2]->address->partition == tiles[0]->address->partition);
  HostTensor x(DType::int32, {32, 16});
  for (int64_t i = 0; i < x.size(); ++i) x.set_int(i, 1000 + i);
  for (Mode mode : {Mode::program_order, Mode::streams_interp, Mode::streams_native}) {
    HostTensor out = run_kernel(k, {&x}, mode).at(0);
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t c = 0; c < 16; ++c) REQUIRE(out.get_int(r * 16 + c) == (c < 8 ? c : 4));
  }
}

/** The names of the outputs output_fills() keeps. */
std::vector<std::string> filled_outputs(const Kernel& kernel) {
  std::vector<std::string> names;
  for (StorageId id : jit::output_fills(kernel)) names.push_back(kernel.storages[id].name);
  return names;
}

TEST_CASE("sentinel fills: an output is filled unless DMA writes cover all of it before anything reads it") {
  // Outputs of 64 x 32: tiles of rows, interleaved columns, a missing row, one read back, one
  // written only through a runtime offset, one only inside a runtime loop (that runs no
  // iteration), one with a byte-reinterpreting view.
  Kernel k = trace("outputs", [](const Tensor& x) {
    Tensor s = nl::ndarray({64, 32}, nl::float32, nl::sbuf);
    isa::dma_copy(s, x);
    auto out = [](const char* name) { return nl::ndarray({64, 32}, nl::float32, nl::shared_hbm, name); };
    Tensor rows = out("rows"), columns = out("columns"), missing = out("missing"), read = out("read"),
           offset = out("offset"), looped = out("looped");
    isa::dma_copy(rows(nl::ds(0, 40), nl::all), s(nl::ds(0, 40), nl::all));
    isa::dma_copy(rows(nl::ds(40, 24), nl::all), s(nl::ds(40, 24), nl::all));
    isa::dma_copy(columns(nl::all, Slice{0, 32, 2}), s(nl::all, Slice{0, 32, 2}));
    isa::dma_copy(columns(nl::all, Slice{1, 32, 2}), s(nl::all, Slice{1, 32, 2}));
    isa::dma_copy(missing(nl::ds(0, 63), nl::all), s(nl::ds(0, 63), nl::all));
    isa::dma_copy(read, s);
    Tensor back = nl::ndarray({64, 32}, nl::float32, nl::sbuf);
    isa::dma_copy(back, read);
    isa::dma_copy(read, back);
    Tensor zero = nl::zeros({1, 1}, nl::int32);
    isa::dma_copy(offset.ap({{32, 64}, {1, 32}}, ApOptions{.scalar_offset_tensor = zero}), s);
    nl::fori_loop(3, 3, [&](isa::Register) { isa::dma_copy(looped, s); });
    return std::make_tuple(rows, columns, missing, read, offset, looped);
  }, spec({64, 32}, DType::float32, "x"));
  jit::Program p = jit::compile(std::move(k));
  CHECK(filled_outputs(p.kernel()) == std::vector<std::string>{"missing", "read", "offset", "looped"});

  // What a run shows: the copied values wherever a DMA wrote, NaN where nothing did (the missing
  // row, the loop that never ran), on every executor. The outputs start out zeroed, so a skipped
  // fill that someone could observe would show zeros.
  HostTensor x = random_tensor(DType::float32, {64, 32}, 2);
  for (Mode mode : {Mode::program_order, Mode::streams_interp, Mode::streams_native}) {
    std::vector<HostTensor> outs = run_kernel(p.kernel(), {&x}, mode);
    REQUIRE(outs.size() == 6);
    for (int o : {0, 1, 3, 4})
      for (int64_t i = 0; i < x.size(); ++i) REQUIRE(outs[o].get(i) == x.get(i));
    for (int64_t i = 0; i < x.size(); ++i) {
      if (i < 63 * 32) REQUIRE(outs[2].get(i) == x.get(i));
      else REQUIRE(std::isnan(outs[2].get(i)));
      REQUIRE(std::isnan(outs[5].get(i)));
    }
  }
}

}  // namespace
}  // namespace nikki::test
