// The scheduler and the device program: streams keep each queue's program order, every semaphore
// wait is needed (removing any one of them changes a result), runtime loops work across streams,
// and the file format round-trips and rejects damaged files.
#include <cstring>
#include <fstream>
#include <sstream>

#include "harness.hpp"
#include "nikki/activation.hpp"
#include "nikki/ir_printer.hpp"
#include "nikki/kernels/softmax/softmax.hpp"

namespace {

using namespace nikki;
using test::HostTensor;

/** A kernel with work on every engine and DMA traffic both ways, double-buffered tiles. */
Tensor pipeline_kernel(Tensor x, Tensor w) {
  Tensor out = nl::ndarray({256, 64}, nl::float32, nl::shared_hbm, "out");
  Tensor wt = nl::ndarray({64, 64}, nl::float32, nl::sbuf, "w");
  isa::dma_copy(wt, w);
  for (int t = 0; t < 4; ++t) {
    Tensor xt = nl::ndarray({64, 64}, nl::float32, nl::sbuf, "x");
    isa::dma_copy(xt, x(Slice{t * 64, t * 64 + 64}, Slice{}));
    Tensor e = nl::ndarray({64, 64}, nl::float32, nl::sbuf, "e");
    isa::activation(e, nl::exp, xt, {.scale = 0.25});
    Tensor p = nl::ndarray({64, 64}, nl::float32, nl::psum, "p");
    isa::nc_matmul(p, wt, e);
    Tensor s = nl::ndarray({64, 64}, nl::float32, nl::sbuf, "s");
    isa::tensor_tensor(s, p, xt, nl::add);
    Tensor m = nl::ndarray({64, 1}, nl::float32, nl::sbuf, "m");
    isa::tensor_reduce(m, nl::maximum, s, {1});
    Tensor g = nl::ndarray({64, 64}, nl::float32, nl::sbuf, "g");
    isa::tensor_scalar(g, s, nl::subtract, m);
    Tensor io = nl::ndarray({64, 64}, nl::int32, nl::sbuf, "io");
    isa::iota(io, {{1, 64}}, t, 1);
    Tensor r = nl::ndarray({64, 64}, nl::float32, nl::sbuf, "r");
    isa::tensor_tensor(r, g, io, nl::add);
    isa::dma_copy(out(Slice{t * 64, t * 64 + 64}, Slice{}), r);
  }
  return out;
}

jit::Program compile_pipeline(jit::ScheduleOptions opts = {}) {
  Kernel k = trace("pipeline", pipeline_kernel, spec({256, 64}, nl::float32, "x"), spec({64, 64}, nl::float32, "w"));
  return jit::compile(std::move(k), jit::CompileOptions{.schedule_options = opts});
}

std::vector<uint8_t> run_streams(const jit::Program& p, HostTensor& x, HostTensor& w,
                                 runtime::StreamOrder order = runtime::StreamOrder::latest_first, uint64_t seed = 1,
                                 int64_t delayed = -1) {
  HostTensor out(DType::float32, {256, 64});
  void* in[] = {x.data(), w.data()};
  void* outs[] = {out.data()};
  runtime::StreamExecutor(p.device, runtime::ExecutorKind::interp, nullptr, order, seed, delayed).run(in, outs);
  return out.bytes;
}

/** The n-th wait of a program (in drop_dependency order): the waiting instruction and the one waited for. */
std::pair<uint32_t, uint32_t> nth_wait(const jit::DeviceProgram& p, int64_t n) {
  int64_t seen = 0;
  for (uint32_t ir = 0; ir < p.kernel.instructions.size(); ++ir) {
    if (p.kernel.instructions[ir].spec().is_control) continue;
    const auto [stream, position] = p.placement[ir];
    for (const jit::SemaphoreWait& w : p.streams[stream].ops[position].waits)
      if (seen++ == n) return {ir, p.streams[w.queue].ops[w.count - 1].ir_index};
  }
  return {0, 0};
}

}  // namespace

TEST_CASE("streams: every queue keeps program order and the walk matches program order") {
  HostTensor x = test::random_tensor(DType::float32, {256, 64}, 1), w = test::random_tensor(DType::float32, {64, 64}, 2);
  jit::Program p = compile_pipeline();
  for (const jit::Stream& s : p.device->streams)
    for (size_t i = 1; i < s.ops.size(); ++i) CHECK(s.ops[i - 1].ir_index < s.ops[i].ir_index);
  size_t scheduled = 0, engines = 0;
  for (const jit::Stream& s : p.device->streams) {
    scheduled += s.ops.size();
    engines += !s.ops.empty() && s.queue.kind != jit::QueueKind::dma;
  }
  CHECK(scheduled == p.kernel().instructions.size());
  CHECK(engines == 4);  // tensor, vector, scalar, gpsimd all have work
  HostTensor ref(DType::float32, {256, 64});
  void* in[] = {x.data(), w.data()};
  void* outs[] = {ref.data()};
  runtime::Interpreter(p.kernel()).run(in, outs);
  CHECK(run_streams(p, x, w) == ref.bytes);
}

TEST_CASE("streams: removing any single semaphore wait changes the result") {
  // For each wait in turn: drop it, and walk the streams holding back the instruction it waited
  // for as long as anything else can run. The waiting instruction then overtakes its producer,
  // and the result must change: every wait the scheduler emits is needed.
  HostTensor x = test::random_tensor(DType::float32, {256, 64}, 3), w = test::random_tensor(DType::float32, {64, 64}, 4);
  jit::Program full = compile_pipeline();
  const std::vector<uint8_t> ref = run_streams(full, x, w);
  const int64_t waits = jit::count_dependency_waits(*full.device);
  REQUIRE(waits > 10);
  int64_t caught = 0;
  for (int64_t n = 0; n < waits; ++n) {
    const auto [consumer, producer] = nth_wait(*full.device, n);
    jit::Program broken = compile_pipeline({.drop_dependency = n});
    const bool differs = run_streams(broken, x, w, runtime::StreamOrder::latest_first, 1, producer) != ref;
    if (!differs)
      MESSAGE("dropping the wait of " << to_string(full.kernel(), full.kernel().instructions[consumer]) << " on "
                                      << to_string(full.kernel(), full.kernel().instructions[producer])
                                      << " did not change the result");
    caught += differs;
  }
  CHECK_MESSAGE(caught == waits, caught << " of " << waits << " removed waits changed the result");
}

TEST_CASE("streams: independent tiles overlap across engines (waits are not a total order)") {
  jit::Program p = compile_pipeline();
  // Each tile's chain needs only waits on its own producers: far fewer waits than a barrier
  // after every instruction would need.
  const int64_t waits = jit::count_dependency_waits(*p.device);
  CHECK(waits < int64_t(p.kernel().instructions.size()) * 2);
  // The second tile's load does not wait for the first tile's store.
  const jit::Stream* dma_second = nullptr;
  for (const jit::Stream& s : p.device->streams)
    for (const jit::StreamOp& op : s.ops)
      if (op.ir_index == 2 + 10) dma_second = &s;  // instruction index of tile 1's x load
  REQUIRE(dma_second != nullptr);
}

TEST_CASE("streams: runtime loops run on every stream with the right trip count") {
  HostTensor x = test::random_tensor(DType::float32, {8, 16}, 5);
  auto kernel = [](Tensor x) {
    Tensor out = nl::ndarray({8, 16}, nl::float32, nl::shared_hbm, "out");
    Tensor acc = nl::zeros({1, 16}, nl::float32, nl::sbuf, "acc");
    nl::fori_loop(0, 6, [&](isa::Register i) {
      Tensor row = nl::ndarray({1, 16}, nl::float32, nl::sbuf, "row");
      isa::dma_copy(row, x.ap({{16, 1}, {1, 16}}, {.scalar_offset_register = i.id}));
      Tensor e = nl::ndarray({1, 16}, nl::float32, nl::sbuf, "e");
      isa::activation(e, nl::tanh, row);
      isa::tensor_tensor(acc, acc, e, nl::add);
      isa::dma_copy(out.ap({{16, 1}, {1, 16}}, {.scalar_offset_register = i.id}), acc);
    });
    Tensor tail = nl::ndarray({2, 16}, nl::float32, nl::sbuf, "tail");
    isa::memset(tail, 1.0);
    isa::dma_copy(out(Slice{6, 8}, Slice{}), tail);
    return out;
  };
  for (test::Mode mode : {test::Mode::program_order, test::Mode::streams_interp, test::Mode::streams_native}) {
    HostTensor out = test::run_kernel(trace("loop", kernel, x.spec("x")), {&x}, mode).at(0);
    float acc[16] = {};
    for (int r = 0; r < 6; ++r)
      for (int c = 0; c < 16; ++c) {
        acc[c] += activation_apply(ActFunc::tanh, x.get(r * 16 + c));  // nikki's tanh (faithful, not libm's)
        CHECK(out.get(r * 16 + c) == acc[c]);
      }
    CHECK(out.get(6 * 16) == 1.0f);
  }
}

TEST_CASE("streams: the device program file round-trips and rejects damage") {
  jit::Program p = compile_pipeline();
  std::vector<uint8_t> bytes = jit::serialize(*p.device);
  jit::DeviceProgram back = jit::deserialize(bytes);
  CHECK(back.streams == p.device->streams);
  CHECK(to_string(back.kernel) == to_string(p.kernel()));
  CHECK(jit::disassemble(back) == jit::disassemble(*p.device));

  auto error_of = [](std::vector<uint8_t> b) -> std::string {
    try {
      jit::deserialize(b);
    } catch (const KernelError& e) {
      return e.what();
    }
    return {};
  };
  std::vector<uint8_t> truncated(bytes.begin(), bytes.end() - 17);
  CHECK(error_of(truncated).find("truncated") != std::string::npos);
  std::vector<uint8_t> flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  CHECK(error_of(flipped).find("checksum") != std::string::npos);
  std::vector<uint8_t> foreign = bytes;
  foreign[0] = 'X';
  CHECK(error_of(foreign).find("not a nikki device program") != std::string::npos);
  std::vector<uint8_t> future = bytes;
  future[8] = 99;
  CHECK(error_of(future).find("format version 99") != std::string::npos);
  CHECK(error_of({}).find("not a nikki device program") != std::string::npos);
}

TEST_CASE("streams: meeting instructions keep their cores and ranks in the text form and the file") {
  // core_barrier's cores and sendrecv's three ranks live in the kernel's rare attributes (lanes).
  auto kernel = [](Tensor x) {
    Tensor out = nl::ndarray({16, 8}, nl::float32, nl::shared_hbm, "out");
    Tensor mine = nl::ndarray({16, 8}, nl::float32, nl::sbuf, "mine");
    isa::dma_copy(mine, x);
    Tensor theirs = nl::ndarray({16, 8}, nl::float32, nl::sbuf, "theirs");
    isa::sendrecv(mine, theirs, 1, 3, 2);
    isa::core_barrier(out, {0, 2, 1});
    isa::dma_copy(out, theirs);
    return out;
  };
  jit::Program p = jit::compile(trace(TraceOptions{.target = TargetId::trn2}, "meet", kernel,
                                      spec({16, 8}, nl::float32, "x")));
  const std::string text = to_string(p.kernel(), PrintOptions{.locations = false});
  CHECK_MESSAGE(text.find("sendrecv.sync send_to_rank=1 recv_from_rank=3 pipe_id=2 dst=%theirs src=%mine\n") !=
                    std::string::npos, text);
  CHECK_MESSAGE(text.find("core_barrier.sync cores=[0, 2, 1] data=%out\n") != std::string::npos, text);
  // Both are barriers of every stream, like the loop markers.
  for (const jit::Stream& s : p.device->streams) {
    int barriers = 0;
    for (const jit::StreamOp& op : s.ops) barriers += op.kind == jit::StreamOp::Kind::barrier;
    CHECK(barriers == 2);
  }
  jit::DeviceProgram back = jit::deserialize(jit::serialize(*p.device));
  CHECK(to_string(back.kernel) == to_string(p.kernel()));
  for (size_t i = 0; i < back.kernel.instructions.size(); ++i) {
    const Instruction& inst = back.kernel.instructions[i];
    if (inst.opcode == Opcode::sendrecv) {
      const SendRecvRanks r = SendRecvRanks::of(back.kernel.rare(inst));
      CHECK(r.send_to == 1);
      CHECK(r.recv_from == 3);
      CHECK(r.pipe_id == 2);
    }
    if (inst.opcode == Opcode::core_barrier) CHECK(back.kernel.rare(inst).lanes == std::vector<int32_t>{0, 2, 1});
  }
}

TEST_CASE("streams: the disassembly names queues, operands, addresses, waits and source lines") {
  Kernel k = trace(TraceOptions{.target = TargetId::trn2}, "softmax", [](Tensor x) { return kernels::softmax(x); },
                   spec({64, 32}, nl::float32, "x"));
  jit::Program p = jit::compile(std::move(k));
  const std::string text = jit::disassemble(*p.device);
  for (const char* needle : {"device program 'softmax' for trn2", "qVector", "qScalar", "qDMA0", "tensor_reduce",
                             "%x_tile sbuf f32 p[0:64] @0x0 [[", "wait qDMA0>=1", "at softmax.hpp:",
                             "activation op=exp"})
    CHECK_MESSAGE(text.find(needle) != std::string::npos, "missing '" << needle << "' in\n" << text);
}

TEST_CASE("streams: a tile's sentinel fill waits for the readers of the memory it reuses") {
  // Over-sized tiles written in part (edge tiles of a matmul): the fill of the new tile covers the
  // whole tile, beyond what its first instruction names, and must not overtake the last reads of
  // the previous tensor at that address.
  HostTensor a = test::random_tensor(DType::float32, {200, 200}, 11), b = test::random_tensor(DType::float32, {200, 600}, 12);
  auto kernel = [](Tensor lhsT, Tensor rhs) {
    Tensor out = nl::ndarray({200, 600}, nl::float32, nl::shared_hbm, "out");
    for (int64_t m0 = 0; m0 < 200; m0 += 128)
      for (int64_t n0 = 0; n0 < 600; n0 += 512) {
        const int64_t mm = std::min<int64_t>(128, 200 - m0), nn = std::min<int64_t>(512, 600 - n0);
        Tensor acc = nl::ndarray({128, 512}, nl::float32, nl::psum, "acc");
        for (int64_t k0 = 0; k0 < 200; k0 += 128) {
          const int64_t kk = std::min<int64_t>(128, 200 - k0);
          Tensor lt = nl::ndarray({128, 128}, nl::float32, nl::sbuf, "lt"), rt = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "rt");
          isa::dma_copy(lt(Slice{0, kk}, Slice{0, mm}), lhsT(nl::ds(k0, kk), nl::ds(m0, mm)));
          isa::dma_copy(rt(Slice{0, kk}, Slice{0, nn}), rhs(nl::ds(k0, kk), nl::ds(n0, nn)));
          isa::nc_matmul(acc(Slice{0, mm}, Slice{0, nn}), lt(Slice{0, kk}, Slice{0, mm}), rt(Slice{0, kk}, Slice{0, nn}));
        }
        Tensor res = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "res");
        isa::tensor_copy(res(Slice{0, mm}, Slice{0, nn}), acc(Slice{0, mm}, Slice{0, nn}));
        isa::dma_copy(out(nl::ds(m0, mm), nl::ds(n0, nn)), res(Slice{0, mm}, Slice{0, nn}));
      }
    return out;
  };
  std::vector<uint8_t> ref;
  for (test::Mode mode : {test::Mode::program_order, test::Mode::streams_interp, test::Mode::streams_native}) {
    HostTensor out = test::run_kernel(trace("edges", kernel, a.spec("lhsT"), b.spec("rhs")), {&a, &b}, mode).at(0);
    if (ref.empty()) ref = out.bytes;
    CHECK(out.bytes == ref);
  }
}

TEST_CASE("streams: HBM hazards are tracked per tile of rows and columns") {
  // Two column tiles of one HBM tensor are written independently; a read of the first tile's
  // columns must wait for its store and only for it.
  auto kernel = [](Tensor x) {
    // `wide` is an output (the caller's buffer, no sentinel fill), so its stores are its only writes.
    Tensor wide = nl::ndarray({128, 1024}, nl::float32, nl::shared_hbm, "wide");
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm, "out");
    Tensor a = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "a");
    Tensor b = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "b");
    isa::dma_copy(a, x(nl::all, nl::ds(0, 512)));              // 0
    isa::dma_copy(b, x(nl::all, nl::ds(512, 512)));            // 1
    isa::dma_copy(wide(nl::all, nl::ds(0, 512)), a);           // 2: left columns
    isa::dma_copy(wide(nl::all, nl::ds(512, 512)), b);         // 3: right columns
    Tensor c = nl::ndarray({128, 512}, nl::float32, nl::sbuf, "c");
    isa::dma_copy(c, wide(nl::all, nl::ds(256, 512)));         // 4: overlaps both
    Tensor d = nl::ndarray({64, 512}, nl::float32, nl::sbuf, "d");
    isa::dma_copy(d, wide(nl::ds(64, 64), nl::ds(0, 512)));    // 5: left tile only
    isa::tensor_tensor(c(nl::ds(0, 64), nl::all), c(nl::ds(0, 64), nl::all), d, nl::add);  // 6
    isa::dma_copy(out, c);                                      // 7
    return std::make_tuple(wide, out);
  };
  HostTensor x = test::random_tensor(DType::float32, {128, 1024}, 5);
  jit::Program p = jit::compile(trace("tiles", kernel, x.spec("x")));
  auto waited_on = [&](uint32_t ir) {
    std::vector<uint32_t> on;
    const auto [stream, position] = p.device->placement[ir];
    for (const jit::SemaphoreWait& w : p.device->streams[stream].ops[position].waits)
      on.push_back(p.device->streams[w.queue].ops[w.count - 1].ir_index);
    std::sort(on.begin(), on.end());
    return on;
  };
  CHECK(waited_on(3) == std::vector<uint32_t>{1});     // not on store 2: disjoint columns
  CHECK(waited_on(4) == std::vector<uint32_t>{2, 3});  // both stores it overlaps
  CHECK(waited_on(5) == std::vector<uint32_t>{2});     // only the left store
  std::vector<uint8_t> ref;
  for (test::Mode mode : {test::Mode::program_order, test::Mode::streams_interp, test::Mode::streams_native}) {
    HostTensor out = test::run_kernel(trace("tiles", kernel, x.spec("x")), {&x}, mode).at(1);
    if (ref.empty()) ref = out.bytes;
    CHECK(out.bytes == ref);
  }
  // And the result is what the kernel means: rows 0..63 get x[r, 256+c] + x[64+r, c].
  HostTensor out = test::run_kernel(trace("tiles", kernel, x.spec("x")), {&x}, test::Mode::streams_interp).at(1);
  for (int64_t r = 0; r < 128; ++r)
    for (int64_t c = 0; c < 512; ++c) {
      float want = x.get(r * 1024 + 256 + c) + (r < 64 ? x.get((64 + r) * 1024 + c) : 0.0f);
      REQUIRE(out.get(r * 512 + c) == want);
    }
}
