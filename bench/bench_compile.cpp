// Host-side speed of nikki's compiler and executors (Google Benchmark):
//   - compile latency, cold (NIKKI_ALWAYS_COMPILE=1: verify, allocate, schedule, LLVM), on a disk
//     hit (a fresh process's path: device program and object code read from NIKKI_CACHE_DIR) and
//     on a memory hit (JitKernel's specialization lookup), for the example kernels and a
//     10,000-instruction kernel;
//   - one run of a compiled kernel on the native executor and on the reference-semantics executor;
//   - nc_matmul's native routine on 128x128x512 fp32 tiles beside the host's single-core fp32 FMA
//     peak, measured by a register-resident FMA loop in the same run.
//
//   build/bench/nikki_bench_compile [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "nikki/jit/compile.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/softmax/softmax.hpp"
#include "nikki/runtime/executor.hpp"
#include "nikki/runtime/jit_kernel.hpp"
#include "scoped_env.hpp"

namespace {

using namespace nikki;
using test::ScopedEnv;

// --- kernels ------------------------------------------------------------------------------------

Kernel matmul_kernel() {
  const kernels::KernelInfo info = kernels::matmul_info();
  return kernels::trace_library_kernel(info, info.examples.front().inputs, {});
}

Kernel softmax_kernel() {
  return trace("softmax", [](const Tensor& x) { return kernels::softmax(x); }, spec({512, 1024}, DType::float32));
}

// About 10,000 instructions: 2,500 rounds of load, scale, exp, store on [128, 64] tiles.
Kernel long_kernel() {
  return trace("long", [](const Tensor& x) {
    Tensor out = nl::ndarray({128, 2500 * 64}, DType::float32, nl::shared_hbm, "out");
    for (int64_t i = 0; i < 2500; ++i) {
      Tensor t = nl::ndarray({128, 64}, DType::float32, nl::sbuf, "t");
      isa::dma_copy(t, x(nl::all, nl::ds(i * 64, 64)));
      isa::tensor_scalar(t, t, nl::multiply, 0.5);
      isa::activation(t, nl::exp, t);
      isa::dma_copy(out(nl::all, nl::ds(i * 64, 64)), t);
    }
    return out;
  }, spec({128, 2500 * 64}, DType::float32));
}

Kernel kernel_by_index(int64_t i) {
  switch (i) {
    case 0: return matmul_kernel();
    case 1: return softmax_kernel();
    default: return long_kernel();
  }
}

void label(benchmark::State& state, const Kernel& k) {
  state.SetLabel(fmt::format("{} ({} instructions)", k.name, k.instructions.size()));
}

std::string temp_cache_dir() {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("nikki-bench-cache-{}", ::getpid());
  std::filesystem::create_directories(dir);
  return dir.string();
}

// --- compile latency ----------------------------------------------------------------------------

/** A copy of `kernel` made outside the timed region: a user's compile consumes the kernel its
 *  trace just built, so copying it is not part of the latency. */
Kernel fresh_copy(benchmark::State& state, const Kernel& kernel) {
  state.PauseTiming();
  Kernel copy = kernel;
  state.ResumeTiming();
  return copy;
}

void BM_CompileCold(benchmark::State& state) {
  ScopedEnv always("NIKKI_ALWAYS_COMPILE", "1");
  const Kernel kernel = kernel_by_index(state.range(0));
  label(state, kernel);
  jit::CompileOptions o;
  o.native = true;
  for (auto _ : state) {
    jit::Program p = jit::compile(fresh_copy(state, kernel), o);
    benchmark::DoNotOptimize(p.native.get());
  }
}
BENCHMARK(BM_CompileCold)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

void BM_CompileDiskHit(benchmark::State& state) {
  ScopedEnv dir("NIKKI_CACHE_DIR", temp_cache_dir());
  const Kernel kernel = kernel_by_index(state.range(0));
  label(state, kernel);
  jit::CompileOptions o;
  o.native = true;
  jit::compile(kernel, o);  // fills the cache; each iteration then starts with nothing in memory
  for (auto _ : state) {
    jit::Program p = jit::compile(fresh_copy(state, kernel), o);
    benchmark::DoNotOptimize(p.native.get());
  }
}
BENCHMARK(BM_CompileDiskHit)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

void BM_CompileMemoryHit(benchmark::State& state) {
  runtime::JitKernel k("softmax", [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{kernels::softmax(in[0])};
  });
  const runtime::Specialization s{{spec({512, 1024}, DType::float32)}, {}, 0};
  k.program(s);
  for (auto _ : state) benchmark::DoNotOptimize(&k.program(s));
}
BENCHMARK(BM_CompileMemoryHit);

// --- execution ----------------------------------------------------------------------------------

void BM_Run(benchmark::State& state, runtime::ExecutorKind kind) {
  const Kernel kernel = kernel_by_index(state.range(0));
  label(state, kernel);
  jit::CompileOptions o;
  o.native = kind == runtime::ExecutorKind::native;
  jit::Program p = jit::compile(kernel, o);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<void*> ins, outs;
  std::mt19937 rng(1);
  for (StorageId id : p.kernel().inputs) {
    const Storage& s = p.kernel().storage(id);
    auto& b = buffers.emplace_back(s.shape.num_elements() * dtype_size(s.dtype));
    for (size_t i = 0; i + 1 < b.size(); i += 2) b[i + 1] = 0x3f, b[i] = uint8_t(rng());  // finite values
    ins.push_back(b.data());
  }
  for (StorageId id : p.kernel().outputs) {
    const Storage& s = p.kernel().storage(id);
    outs.push_back(buffers.emplace_back(s.shape.num_elements() * dtype_size(s.dtype)).data());
  }
  runtime::StreamExecutor exec(p.device, kind, p.native);
  for (auto _ : state) exec.run(ins, outs);
}
BENCHMARK_CAPTURE(BM_Run, native, runtime::ExecutorKind::native)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Run, interp, runtime::ExecutorKind::interp)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);

// --- nc_matmul vs the FMA peak ------------------------------------------------------------------

// One 128x128x512 fp32 nc_matmul per iteration on tiles resident in SBUF: the kernel loads the
// operands once and accumulates `reps` matmuls into one PSUM tile.
void BM_NativeMatmulTile(benchmark::State& state) {
  const int64_t reps = 64;
  Kernel kernel = trace("matmul_tile", [&](const Tensor& a, const Tensor& b) {
    Tensor ta = nl::ndarray({128, 128}, DType::float32, nl::sbuf, "a");
    Tensor tb = nl::ndarray({128, 512}, DType::float32, nl::sbuf, "b");
    isa::dma_copy(ta, a);
    isa::dma_copy(tb, b);
    Tensor acc = nl::ndarray({128, 512}, DType::float32, nl::psum, "acc");
    for (int64_t r = 0; r < reps; ++r) isa::nc_matmul(acc, ta, tb);
    Tensor res = nl::ndarray({128, 512}, DType::float32, nl::sbuf, "res");
    isa::tensor_copy(res, acc);
    Tensor out = nl::ndarray({128, 512}, DType::float32, nl::shared_hbm, "out");
    isa::dma_copy(out, res);
    return out;
  }, spec({128, 128}, DType::float32), spec({128, 512}, DType::float32));
  jit::CompileOptions o;
  o.native = true;
  jit::Program p = jit::compile(std::move(kernel), o);
  std::vector<float> a(128 * 128, 0.5f), b(128 * 512, 0.25f), out(128 * 512);
  void* ins[] = {a.data(), b.data()};
  void* outs[] = {out.data()};
  runtime::StreamExecutor exec(p.device, runtime::ExecutorKind::native, p.native);
  for (auto _ : state) exec.run(ins, outs);
  const double flops = 2.0 * 128 * 128 * 512 * reps;
  state.counters["GFLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_NativeMatmulTile)->Unit(benchmark::kMillisecond)->UseRealTime();

// The host's single-core fp32 FMA peak: independent FMA chains on the widest vectors the host
// has, held in registers. The chains must not touch memory between steps: an optimization barrier
// with a memory clobber (benchmark::DoNotOptimize) would store and reload every accumulator, and
// store-to-load forwarding would then dominate the chains' latency (it measured half the peak).
// Twelve chains cover FMA latency x throughput on current x86 cores (4 cycles x 2 per cycle).
#if defined(__AVX512F__)
using FmaVec = __m512;
inline FmaVec fma_splat(float v) { return _mm512_set1_ps(v); }
inline FmaVec fma_step(FmaVec a, FmaVec x, FmaVec y) { return _mm512_fmadd_ps(a, x, y); }
#elif defined(__FMA__)
using FmaVec = __m256;
inline FmaVec fma_splat(float v) { return _mm256_set1_ps(v); }
inline FmaVec fma_step(FmaVec a, FmaVec x, FmaVec y) { return _mm256_fmadd_ps(a, x, y); }
#else
#error "BM_FmaPeak needs FMA (the bench is built with -march=native)"
#endif

void BM_FmaPeak(benchmark::State& state) {
  constexpr int kLanes = sizeof(FmaVec) / sizeof(float), kChains = 12;
  const int64_t steps = 1 << 16;
  for (auto _ : state) {
    FmaVec acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = fma_splat(float(c));
    FmaVec x = fma_splat(0.999f), y = fma_splat(1e-4f);
    asm volatile("" : "+v"(x), "+v"(y));  // opaque constants: the loop cannot be folded
    for (int64_t i = 0; i < steps; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = fma_step(acc[c], x, y);
    for (int c = 0; c < kChains; ++c) asm volatile("" : "+v"(acc[c]));  // results are used, in registers
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kLanes * kChains * steps,
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
