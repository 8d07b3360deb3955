// The kernel toolkit piece by piece: the task scheduler's derived dependencies and orders, rings
// and arenas, the budget, and the tiling helpers.
#include <algorithm>
#include <map>
#include <numeric>

#include "harness.hpp"
#include "nikki/hazards.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"
#include "scoped_env.hpp"

namespace nikki::test {
namespace {

namespace tk = kernels::toolkit;
using tk::first;

/**
 * A pipeline over row tiles with rings two deep: load x, y = exp(x) on the Scalar engine, z = y + x
 * on the Vector engine, store z. The loads are declared after the compute of the previous tile,
 * so the scheduler must move them up for any overlap, and ring reuse must still wait.
 */
std::vector<Tensor> ring_pipeline(const std::vector<Tensor>& in) {
  const Tensor& x = in[0];
  const int64_t R = x.shape()[0], C = x.shape()[1], P = 128;
  Tensor out = nl::ndarray({R, C}, DType::float32, nl::shared_hbm, "out");
  tk::Ring xs = tk::Ring::sbuf({P, C}, DType::float32, 2, "x"), ys = tk::Ring::sbuf({P, C}, DType::float32, 2, "y");
  tk::TaskScheduler sch;
  for (const tk::RowTile& rt : tk::row_tiles(R, P)) {
    const Tensor xt = xs.next()(first(rt.p), nl::all), yt = ys.next()(first(rt.p), nl::all);
    sch.add([&] { isa::dma_copy(xt, rt.rows_view(x, 0, C)); });
    sch.add([&] { isa::activation(yt, nl::exp, xt); });
    sch.add([&] { isa::tensor_tensor(yt, yt, xt, nl::add); });
    sch.add([&] { isa::dma_copy(rt.rows_view(out, 0, C), yt); });
  }
  sch.run();
  return {out};
}

Kernel traced_pipeline(int64_t R, int64_t C) {
  return trace_specs({}, "pipeline", {spec({R, C}, DType::float32)}, ring_pipeline);
}

TEST_CASE("toolkit: the task scheduler reorders work but keeps every hazard of the declaration order") {
  HostTensor x = random_tensor(DType::float32, {700, 96}, 3);
  Kernel simulated = traced_pipeline(700, 96);
  Kernel declared;
  {
    ScopedEnv order("NIKKI_TASK_ORDER", "declared");
    declared = traced_pipeline(700, 96);
  }
  // The simulated order differs (the next tile's load moves up), the declared one is as written.
  std::vector<Opcode> sim_ops, decl_ops;
  for (const Instruction& i : simulated.instructions) sim_ops.push_back(i.opcode);
  for (const Instruction& i : declared.instructions) decl_ops.push_back(i.opcode);
  REQUIRE(sim_ops.size() == decl_ops.size());
  CHECK(sim_ops != decl_ops);
  CHECK(decl_ops[0] == Opcode::dma_copy);
  CHECK(decl_ops[1] == Opcode::activation);
  // Both mean the same: identical bits, and the reference's numbers.
  const HostTensor a = run_kernel(std::move(simulated), {&x}, Mode::streams_native).at(0);
  const HostTensor b = run_kernel(std::move(declared), {&x}, Mode::streams_native).at(0);
  CHECK(a.bytes == b.bytes);
  for (int64_t i = 0; i < x.size(); ++i) {
    const float e = std::exp(x.get(i)) + x.get(i);
    CHECK(std::abs(a.get(i) - e) <= 4e-6f * std::max(1.0f, std::abs(e)));
  }
}

TEST_CASE("toolkit: a reused ring slot is written only after every reader of its previous tile") {
  Kernel k = traced_pipeline(128 * 6, 64);
  // Per slot of ring x, in program order: a load, then the two reads of that tile, then the next
  // load. A read moved past the next load would read another tile.
  std::map<int64_t, std::string> events;  // slot offset -> "L", "R" in program order
  for (const Instruction& inst : k.instructions)
    for (int s = 0; s < inst.spec().num_slots; ++s) {
      const Operand& o = inst.operands[s];
      if (!o.is_tensor() || k.storage(o.storage()).name != "x") continue;
      events[k.view(o).offset] += inst.access(s) == Access::write ? "L" : "R";
    }
  REQUIRE(events.size() == 2);
  for (const auto& [slot, seq] : events) CHECK(seq == "LRRLRRLRR");
}

TEST_CASE("toolkit: a DMA destination that splits the partitions depends only on the bytes it writes") {
  // Partition 4 page + j of slot 0 of a two-slot tile: [32 pages, 4 groups, 64] (a paged gather's
  // layout). Its footprint is slot 0 of every partition, so work on slot 1 does not wait for it.
  Kernel k = trace_specs({}, "split", {spec({32, 4, 64}, DType::float32)}, [](const std::vector<Tensor>& in) {
    Tensor tile = nl::ndarray({128, 2, 64}, DType::float32, nl::sbuf, "tile");
    isa::dma_copy(tile(nl::all, 0, nl::all).reshape_dim(0, {32, 4}), in[0]);
    return std::vector<Tensor>{};
  });
  const Instruction& dma = k.instructions.at(0);
  const hazards::Footprints f = hazards::footprints(k, dma, hazards::Placement::storage);
  REQUIRE(f.writes.size() == 1);
  const hazards::Region& w = f.writes[0];
  CHECK(w.p0 == 0);
  CHECK(w.p1 == 128);
  CHECK(w.b0 == 0);
  CHECK(w.b1 == 64 * 4);
}

TEST_CASE("toolkit: tasks must stay on one engine and must not allocate") {
  auto mixed = [](const std::vector<Tensor>& in) {
    Tensor t = nl::ndarray({128, 8}, DType::float32, nl::sbuf, "t");
    Tensor out = nl::ndarray({128, 8}, DType::float32, nl::shared_hbm, "out");
    tk::TaskScheduler sch;
    sch.add([&] {
      isa::dma_copy(t, in[0]);
      isa::activation(t, nl::exp, t);
    });
    sch.run();
    isa::dma_copy(out, t);
    return std::vector<Tensor>{out};
  };
  CHECK_THROWS_AS(trace_specs({}, "mixed", {spec({128, 8}, DType::float32)}, mixed), InternalError);
  auto allocating = [](const std::vector<Tensor>& in) {
    Tensor out = nl::ndarray({128, 8}, DType::float32, nl::shared_hbm, "out");
    tk::TaskScheduler sch;
    sch.add([&] {
      Tensor t = nl::ndarray({128, 8}, DType::float32, nl::sbuf, "t");
      isa::dma_copy(t, in[0]);
    });
    sch.run();
    return std::vector<Tensor>{out};
  };
  CHECK_THROWS_AS(trace_specs({}, "allocating", {spec({128, 8}, DType::float32)}, allocating), InternalError);
}

TEST_CASE("toolkit: a bad NIKKI_TASK_ORDER is an error naming the accepted values") {
  ScopedEnv order("NIKKI_TASK_ORDER", "fastest");
  try {
    traced_pipeline(128, 8);
    FAIL("no error");
  } catch (const KernelError& e) {
    CHECK(std::string(e.what()).find("NIKKI_TASK_ORDER=fastest is not a task order") != std::string::npos);
    CHECK(std::string(e.what()).find("NIKKI_TASK_ORDER=declared") != std::string::npos);
  }
}

TEST_CASE("toolkit: PSUM rings pack slots so that none crosses a bank") {
  for (int64_t free : {1, 64, 100, 129, 300, 512}) {
    CAPTURE(free);
    Kernel k = trace_specs({}, "psum", {spec({1, 1}, DType::float32)}, [&](const std::vector<Tensor>& in) {
      tk::Ring r = tk::Ring::psum({128, free}, DType::float32, 7, "acc");
      for (int64_t s = 0; s < r.slots(); ++s) {
        const AccessPattern& ap = r.slot(s).access();
        const int64_t bank = 2048 / 4, first_elem = ap.offset % (bank * 8), last_elem = first_elem + free - 1;
        CHECK(first_elem / bank == last_elem / bank);
      }
      CHECK(tk::Budget::psum_banks({128, free}, DType::float32, 7) == (7 + 512 / free - 1) / (512 / free));
      Tensor out = nl::ndarray({1, 1}, DType::float32, nl::shared_hbm, "out");
      isa::dma_copy(out, in[0]);
      return std::vector<Tensor>{out};
    });
  }
}

TEST_CASE("toolkit: arenas hand out spans in turn and wrap when a span does not fit") {
  trace_specs({}, "arena", {spec({1, 1}, DType::float32)}, [](const std::vector<Tensor>& in) {
    tk::Arena a(nl::ndarray({128, 100}, DType::float32, nl::sbuf, "arena"));
    CHECK(a.next(40).access().offset == 0);
    CHECK(a.next(40).access().offset == 40);
    CHECK(a.next(40).access().offset == 0);  // 80 + 40 > 100: wraps
    CHECK(a.next(60).access().offset == 40);
    CHECK_THROWS_AS(a.next(101), InternalError);
    Tensor out = nl::ndarray({1, 1}, DType::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, in[0]);
    return std::vector<Tensor>{out};
  });
}

TEST_CASE("toolkit: the budget picks the largest size that fits and names an overflow") {
  trace_specs({}, "budget", {spec({1, 1}, DType::float32)}, [](const std::vector<Tensor>& in) {
    const kernels::ArgumentCheck check("example_kernel", in[0], Loc::current());
    tk::Budget budget(check);
    const int64_t cap = nl::tile_size().sbuf_fmax_bytes;
    CHECK(budget.sbuf_capacity() == cap);
    CHECK(budget.largest({4096, 2048, 1024}, [&](int64_t w) { return w * cap / 3000; }) == 2048);
    CHECK(!budget.largest({4096}, [&](int64_t) { return cap + 1; }).has_value());
    budget.reserve_sbuf(cap - 1024, "the resident keys");
    try {
      budget.reserve_sbuf(2048, "the working tiles", "use shorter rows");
      FAIL("no error");
    } catch (const KernelError& e) {
      const std::string m = e.what();
      CHECK(m.find("example_kernel: the working tiles does not fit in SBUF: 2 KiB per partition needed, 1 KiB free") !=
            std::string::npos);
      CHECK(m.find("use shorter rows") != std::string::npos);
    }
    Tensor out = nl::ndarray({1, 1}, DType::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, in[0]);
    return std::vector<Tensor>{out};
  });
}

TEST_CASE("toolkit: row tiles and column chunks cover a problem exactly once") {
  for (int64_t R : {1, 127, 128, 129, 1000, 4096}) {
    for (int64_t g : {1, 3, 8}) {
      CAPTURE(R);
      CAPTURE(g);
      int64_t next = 0;
      for (const tk::RowTile& t : tk::row_tiles(R, 128, g)) {
        CHECK(t.r0 == next);
        CHECK(t.p >= 1);
        CHECK(t.p <= 128);
        CHECK((t.g == 1 || t.p == 128));
        next += t.rows();
      }
      CHECK(next == R);
    }
  }
  for (int64_t C : {1, 63, 64, 4097, 9000, 100000}) {
    CAPTURE(C);
    int64_t next = 0;
    std::vector<tk::ColumnChunk> chunks = tk::column_chunks(C, 4096);
    for (const tk::ColumnChunk& c : chunks) {
      CHECK(c.c0 == next);
      CHECK(c.width <= 4096 + 63);
      next += c.width;
    }
    CHECK(next == C);
    CHECK(int64_t(chunks.size()) == (C + 4095) / 4096);
  }
  // Whole rows when they fit, packed several per partition when short; else two passes.
  const tk::RowPlan narrow = tk::plan_rows(100000, 16, 8, 96 * 1024, 128, 32);
  CHECK(narrow.whole_rows);
  CHECK(narrow.g > 1);
  const tk::RowPlan wide = tk::plan_rows(1000, 50000, 24, 96 * 1024, 128, 32);
  CHECK(!wide.whole_rows);
  CHECK(wide.chunk <= 4096);
  CHECK(wide.chunks.back().c0 + wide.chunks.back().width == 50000);
}

}  // namespace
}  // namespace nikki::test
