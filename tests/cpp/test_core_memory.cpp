// Executors borrow the simulated core's SBUF and PSUM for each run instead of owning them: many
// live executors hold only a few memories, and nothing a run leaves in them reaches another run.
#include <cmath>
#include <memory>
#include <vector>

#include "harness.hpp"

namespace nikki::test {
namespace {

// out = x * scale over a [128, cols] tile.
Kernel scale_kernel(int64_t cols, double scale) {
  return trace("scale",
               [&](const Tensor& x) {
                 Tensor out = nl::ndarray({128, cols}, nl::float32, nl::shared_hbm, "out");
                 Tensor t = nl::ndarray({128, cols}, nl::float32, nl::sbuf, "t");
                 isa::dma_copy(t, x);
                 isa::tensor_scalar(t, t, nl::multiply, scale);
                 isa::dma_copy(out, t);
                 return out;
               },
               spec({128, cols}, DType::float32, "x"));
}

TEST_CASE("core memory: forty live executors share a few SBUF/PSUM memories") {
  std::vector<jit::Program> programs;
  std::vector<std::unique_ptr<runtime::StreamExecutor>> executors;
  for (int i = 0; i < 40; ++i) {
    programs.push_back(jit::compile(scale_kernel(64 + i, 1.0 + i)));
    executors.push_back(std::make_unique<runtime::StreamExecutor>(programs.back().device, runtime::ExecutorKind::interp));
  }
  for (int i = 0; i < 40; ++i) {
    HostTensor x = random_tensor(DType::float32, {128, 64 + i}, uint32_t(i));
    HostTensor out(DType::float32, {128, 64 + i});
    void* ins[] = {x.data()};
    void* outs[] = {out.data()};
    executors[i]->run(ins, outs);
    for (int64_t e = 0; e < x.size(); ++e) REQUIRE(out.get(e) == x.get(e) * float(1.0 + i));  // exact: fp32 product
  }
  // Each one held a memory only while it ran; the pool keeps at most two idle.
  CHECK(runtime::live_core_memories() <= 2);
  CHECK(executors[0]->resident_bytes() < size_t(1) << 20);
}

TEST_CASE("core memory: a tile read before it is written shows sentinels after another kernel used the memory") {
  // The first kernel leaves finite values where the second one's tile lives.
  jit::Program writer = jit::compile(scale_kernel(64, 2.0));
  jit::Program reader = jit::compile(trace("read_unwritten",
                                           [](const Tensor& x) {
                                             Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm, "out");
                                             Tensor t = nl::ndarray({128, 64}, nl::float32, nl::sbuf, "t");
                                             isa::dma_copy(out, t);  // t was never written
                                             return out;
                                           },
                                           spec({128, 64}, DType::float32, "x")));
  HostTensor x = random_tensor(DType::float32, {128, 64}, 7);
  HostTensor out(DType::float32, {128, 64});
  void* ins[] = {x.data()};
  void* outs[] = {out.data()};
  for (runtime::ExecutorKind kind : {runtime::ExecutorKind::interp, runtime::ExecutorKind::native}) {
    jit::Program native_writer = kind == runtime::ExecutorKind::native
                                     ? jit::compile(scale_kernel(64, 2.0), jit::CompileOptions{.native = true})
                                     : jit::Program{};
    const jit::Program& w = kind == runtime::ExecutorKind::native ? native_writer : writer;
    runtime::StreamExecutor(w.device, kind, w.native).run(ins, outs);
    REQUIRE(std::isfinite(out.get(0)));
    runtime::StreamExecutor(reader.device, runtime::ExecutorKind::interp).run(ins, outs);
    for (int64_t e = 0; e < out.size(); ++e) REQUIRE(std::isnan(out.get(e)));
  }
}

}  // namespace
}  // namespace nikki::test
