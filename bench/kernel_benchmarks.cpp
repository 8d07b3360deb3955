// Google Benchmark entries for every library kernel of the registry (kernels added later appear
// without editing this file):
//
//   library/<kernel>/<example>    one run of the compiled kernel on nikki's native executor, on
//                                 each of the kernel's registered examples (small shapes with tails);
//   estimate/<kernel>             compile + timing model at the kernel's benchmark shape (the shape
//                                 docs/kernels.md reports), nothing executed.
//
// Counters (the same figures as `nikki bench` and docs/kernels.md):
//   est_us          the timing model's estimated device time on the target (trn2 unless
//                   NIKKI_BENCH_TARGET=trn1), an ESTIMATE, not a measurement;
//   utilization_pct useful TensorE FLOPs over the 16-bit peak, or the compulsory HBM traffic
//                   (every input read once, every output written once) over the DMA peak,
//                   against the estimated time;
//   sim_bytes/s     compulsory bytes simulated per second of host time (library/ entries).
//
//   build-dir/bench/nikki_bench_kernels [--benchmark_filter=softmax] [--benchmark_min_time=0.2s]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "nikki/jit/compile.hpp"
#include "nikki/kernels/registry.hpp"
#include "nikki/numerics.hpp"
#include "nikki/runtime/executor.hpp"
#include "nikki/runtime/profile.hpp"

namespace {

using namespace nikki;

TargetId bench_target() {
  const char* t = std::getenv("NIKKI_BENCH_TARGET");
  return t ? require_target(t) : TargetId::trn2;
}

jit::Program compile_case(const kernels::KernelInfo& k, const kernels::ExampleCase& c, bool native) {
  Kernel traced = kernels::trace_library_kernel(k, c.inputs, c.params, TraceOptions{.target = bench_target()});
  jit::CompileOptions options;
  options.native = native;
  return jit::compile(std::move(traced), options);
}

/** Every input read once and every output written once, in bytes. */
double compulsory_bytes(const jit::Program& p) {
  double bytes = 0;
  const Kernel& k = p.kernel();
  for (StorageId id : k.inputs) bytes += double(k.storage(id).total_bytes());
  for (StorageId id : k.outputs) bytes += double(k.storage(id).total_bytes());
  return bytes;
}

/** The utilization docs/kernels.md reports: against the Tensor engine or the DMA roofline. */
double utilization(const kernels::KernelInfo& k, const kernels::ExampleCase& c, const jit::Program& p,
                   const runtime::Profile& prof) {
  if (prof.total_ns <= 0) return 0;
  if (k.benchmark && k.benchmark->bound == kernels::Bound::tensor_engine && k.benchmark->useful_flops)
    return k.benchmark->useful_flops(c) / (prof.total_ns * prof.tensor_peak_flops_per_ns);
  return compulsory_bytes(p) / prof.dma_peak_bytes_per_ns / prof.total_ns;
}

/** Host buffers of a case: the registration's input values, rounded to each input's dtype. */
struct Buffers {
  std::vector<std::vector<uint8_t>> inputs, outputs;
  std::vector<void*> in_ptrs, out_ptrs;
};

Buffers buffers_for(const kernels::KernelInfo& k, const kernels::ExampleCase& c, const Kernel& compiled) {
  Buffers b;
  kernels::CaseRng rng(1);
  const std::vector<kernels::RefTensor> values = k.inputs_for(c, rng);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const DType d = c.inputs[i].dtype;
    std::vector<uint8_t> bytes(values[i].data.size() * dtype_size(d));
    for (size_t e = 0; e < values[i].data.size(); ++e) {
      if (is_float(d)) numerics::store_float(d, bytes.data() + e * dtype_size(d), float(values[i].data[e]));
      else numerics::store_int(d, bytes.data() + e * dtype_size(d), int64_t(values[i].data[e]));
    }
    b.inputs.push_back(std::move(bytes));
  }
  for (StorageId id : compiled.outputs) b.outputs.emplace_back(compiled.storage(id).total_bytes());
  for (auto& t : b.inputs) b.in_ptrs.push_back(t.data());
  for (auto& t : b.outputs) b.out_ptrs.push_back(t.data());
  return b;
}

void run_example(benchmark::State& state, const kernels::KernelInfo& k, const kernels::ExampleCase& c) {
  jit::Program p = compile_case(k, c, /*native=*/true);
  Buffers b = buffers_for(k, c, p.kernel());
  runtime::StreamExecutor exec(p.device, runtime::ExecutorKind::native, p.native);
  for (auto _ : state) exec.run(b.in_ptrs, b.out_ptrs);
  const runtime::Profile prof = runtime::estimate(*p.device);
  state.counters["est_us"] = prof.total_ns / 1e3;
  state.counters["utilization_pct"] = 100 * utilization(k, c, p, prof);
  state.counters["sim_bytes/s"] = benchmark::Counter(compulsory_bytes(p), benchmark::Counter::kIsIterationInvariantRate);
}

void estimate_benchmark_shape(benchmark::State& state, const kernels::KernelInfo& k) {
  const kernels::ExampleCase& c = k.benchmark->shape;
  runtime::Profile prof;
  double util = 0;
  for (auto _ : state) {
    jit::Program p = compile_case(k, c, /*native=*/false);
    prof = runtime::estimate(*p.device);
    util = utilization(k, c, p, prof);
  }
  state.counters["est_us"] = prof.total_ns / 1e3;
  state.counters["utilization_pct"] = 100 * util;
}

void register_library() {
  for (const kernels::KernelInfo& k : kernels::registry()) {
    for (const kernels::ExampleCase& c : k.examples)
      benchmark::RegisterBenchmark(("library/" + k.name + "/" + c.label).c_str(),
                                   [&k, &c](benchmark::State& s) { run_example(s, k, c); })
          ->Unit(benchmark::kMicrosecond);
    if (k.benchmark)
      benchmark::RegisterBenchmark(("estimate/" + k.name + "/" + k.benchmark->shape.label).c_str(),
                                   [&k](benchmark::State& s) { estimate_benchmark_shape(s, k); })
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_library();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
