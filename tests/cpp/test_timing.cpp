// The timing model against hand-computed timelines (docs/performance-model.md has the formulas).
// trn1 clocks: TensorE 2.8 GHz, VectorE 1.4 GHz, ScalarE 1.4 GHz; DMA: 16 engines x 17 B/ns,
// 1300 ns per transfer, 512 B-equivalent per contiguous buffer.
#include "harness.hpp"
#include "nikki/runtime/explain.hpp"
#include "nikki/runtime/profile.hpp"

namespace {

using namespace nikki;

struct Timeline {
  jit::Program program;
  runtime::Profile profile;
  const runtime::InstructionTiming& at(uint32_t ir) const {
    for (const auto& it : profile.instructions)
      if (it.ir_index == ir) return it;
    FAIL("instruction " << ir << " not in the profile");
    return profile.instructions.front();
  }
};

template <class Fn, class... Specs>
Timeline estimate(Fn fn, const Specs&... specs) {
  Kernel k = trace(TraceOptions{.target = TargetId::trn1}, "timing", fn, specs...);
  Timeline t{jit::compile(std::move(k)), {}};
  t.profile = runtime::estimate(*t.program.device);
  return t;
}

constexpr double kVectorGHz = 1.4, kScalarGHz = 1.4, kTensorGHz = 2.8;
constexpr double kDmaLatency = 1300, kDmaBandwidth = 16 * 17.0, kBufferBytes = 512;

double dma_ns(double bytes, double buffers) { return kDmaLatency + (bytes + buffers * kBufferBytes) / kDmaBandwidth; }

}  // namespace

TEST_CASE("timing: one engine runs its instructions back to back") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 512}, nl::float32), b = nl::ndarray({128, 512}, nl::float32);
        isa::memset(a, 1.0);                          // ir 0: max(64, 512) cycles
        isa::tensor_copy(b, a);                       // ir 1: max(64, 512)
        isa::tensor_scalar(a, b, nl::multiply, 2.0);  // ir 2: max(64, 512)
        Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm);
        isa::dma_copy(out, a);  // ir 3: 128 rows of 2 KiB
        return out;
      },
      spec({1, 1}, nl::float32));
  const double step = 512 / kVectorGHz;
  for (uint32_t i = 0; i < 3; ++i) {
    CHECK(t.at(i).start_ns == doctest::Approx(i * step));
    CHECK(t.at(i).end_ns == doctest::Approx((i + 1) * step));
  }
  CHECK(t.at(3).start_ns == doctest::Approx(3 * step));
  CHECK(t.at(3).end_ns == doctest::Approx(3 * step + dma_ns(128 * 512 * 4, 128)));
  CHECK(t.profile.total_ns == doctest::Approx(t.at(3).end_ns));
  CHECK(t.profile.utilization("qVector") == doctest::Approx(3 * step / t.profile.total_ns));
}

TEST_CASE("timing: a dependent instruction on another engine starts when its producer ends") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 256}, nl::float32), b = nl::ndarray({128, 256}, nl::float32);
        Tensor c = nl::ndarray({128, 256}, nl::float32);
        isa::memset(a, 0.5);                  // ir 0: VectorE max(64, 256) cycles
        isa::memset(c, 0.0);                  // ir 1: VectorE, independent of the activation (ends at 2 * 256 cycles)
        isa::activation(b, nl::exp, a);       // ir 2: ScalarE max(64, 256), waits for ir 0
        Tensor out = nl::ndarray({128, 256}, nl::float32, nl::shared_hbm);
        isa::tensor_tensor(c, c, b, nl::add);  // ir 3: VectorE 2 * 256 cycles (both SBUF, fp32), waits for ir 2
        isa::dma_copy(out, c);
        return out;
      },
      spec({1, 1}, nl::float32));
  const double memset = 256 / kVectorGHz;
  CHECK(t.at(0).end_ns == doctest::Approx(memset));
  CHECK(t.at(1).start_ns == doctest::Approx(memset));  // same queue, in order
  CHECK(t.at(2).start_ns == doctest::Approx(memset));  // overlaps ir 1 on the other engine
  CHECK(t.at(2).end_ns == doctest::Approx(memset + 256 / kScalarGHz));
  // ir 3 needs both its queue (free after ir 1 at 2 * memset) and ir 2's result
  const double start3 = std::max(2 * memset, memset + 256 / kScalarGHz);
  CHECK(t.at(3).start_ns == doctest::Approx(start3));
  CHECK(t.at(3).end_ns == doctest::Approx(start3 + 512 / kVectorGHz));
}

TEST_CASE("timing: DMA transfers overlap their latency and share the bandwidth") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 1024}, nl::bfloat16), b = nl::ndarray({128, 1024}, nl::bfloat16);
        isa::dma_copy(a, x(Slice{0, 128}, Slice{}));    // ir 0, queue 0: 128 rows of 2 KiB
        isa::dma_copy(b, x(Slice{128, 256}, Slice{}));  // ir 1, queue 1
        Tensor out = nl::ndarray({256, 1024}, nl::bfloat16, nl::shared_hbm);
        isa::dma_copy(out(Slice{0, 128}, Slice{}), a);
        isa::dma_copy(out(Slice{128, 256}, Slice{}), b);
        return out;
      },
      spec({256, 1024}, nl::bfloat16));
  const double data = (128.0 * 2048 + 128 * kBufferBytes) / kDmaBandwidth;
  CHECK(t.at(0).start_ns == doctest::Approx(0));
  CHECK(t.at(1).start_ns == doctest::Approx(0));
  CHECK(t.at(0).end_ns == doctest::Approx(kDmaLatency + data));
  CHECK(t.at(1).end_ns == doctest::Approx(kDmaLatency + 2 * data));  // its data phase waits for the first
  CHECK(t.profile.dma_bytes == 4 * 128 * 2048);
  CHECK(t.profile.dma_active_ns == doctest::Approx(4 * data));
}

TEST_CASE("timing: back-to-back matmuls cost max(min(64, N_stationary), N_moving) each") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor st = nl::ndarray({128, 128}, nl::bfloat16), mv = nl::ndarray({128, 512}, nl::bfloat16);
        isa::dma_copy(st, x(Slice{}, Slice{0, 128}));
        isa::dma_copy(mv, x);
        Tensor acc = nl::ndarray({128, 512}, nl::float32, nl::psum);
        for (int i = 0; i < 4; ++i) isa::nc_matmul(acc, st, mv);  // ir 2..5
        Tensor res = nl::ndarray({128, 512}, nl::float32);
        isa::tensor_copy(res, acc);
        Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm);
        isa::dma_copy(out, res);
        return out;
      },
      spec({128, 512}, nl::bfloat16));
  const double mm = 512 / kTensorGHz;
  const double ready = t.at(1).end_ns;  // the moving tile's load
  for (uint32_t i = 0; i < 4; ++i) {
    CHECK(t.at(2 + i).start_ns == doctest::Approx(ready + i * mm));
    CHECK(t.at(2 + i).end_ns == doctest::Approx(ready + (i + 1) * mm));
  }
  CHECK(t.profile.matmul_flops == 4 * 2 * 128 * 128 * 512);
  // fp32 matmuls cost four times as much
  Timeline f = estimate(
      [](Tensor x) {
        Tensor st = nl::ndarray({128, 128}, nl::float32), mv = nl::ndarray({128, 512}, nl::float32);
        isa::dma_copy(st, x(Slice{}, Slice{0, 128}));
        isa::dma_copy(mv, x);
        Tensor acc = nl::ndarray({128, 512}, nl::float32, nl::psum);
        isa::nc_matmul(acc, st, mv);
        Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm);
        Tensor res = nl::ndarray({128, 512}, nl::float32);
        isa::tensor_copy(res, acc);
        isa::dma_copy(out, res);
        return out;
      },
      spec({128, 512}, nl::float32));
  CHECK(f.at(2).end_ns - f.at(2).start_ns == doctest::Approx(4 * 512 / kTensorGHz));
}

TEST_CASE("timing: the summary and the trace are labelled as estimates") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 64}, nl::float32);
        isa::dma_copy(a, x);
        Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm);
        isa::dma_copy(out, a);
        return out;
      },
      spec({128, 64}, nl::float32));
  const std::string summary = t.profile.summary(*t.program.device);
  CHECK(summary.find("ESTIMATE for trn1 (NeuronCore-v2)") != std::string::npos);
  CHECK(summary.find("not a measurement") != std::string::npos);
  const std::string trace = t.profile.chrome_trace(*t.program.device);
  CHECK(trace.find("\"traceEvents\"") != std::string::npos);
  CHECK(trace.find("qDMA0") != std::string::npos);
  CHECK(trace.find("not a measurement") != std::string::npos);
  CHECK(trace.find("test_timing.cpp") != std::string::npos);
}

TEST_CASE("timing: small tiles pay the static overhead, strided access halves the rate") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 64}, nl::float32), b = nl::ndarray({128, 64}, nl::float32);
        Tensor w = nl::ndarray({128, 1024}, nl::float32), v = nl::ndarray({128, 512}, nl::float32);
        isa::memset(a, 1.0);                                    // ir 0: max(64, 64) + 100 (N < 128)
        isa::tensor_copy(b, a);                                 // ir 1: same
        isa::memset(w, 1.0);                                    // ir 2: 1024
        isa::tensor_copy(v, w(nl::all, Slice{0, 1024, 2}));     // ir 3: 8-byte stride: fine, 512
        Tensor n = nl::ndarray({128, 128}, nl::float32);
        isa::tensor_copy(n, w(nl::all, Slice{0, 1024, 8}));     // ir 4: 32-byte stride: 2 x 128
        isa::tensor_copy(v(nl::all, Slice{0, 128}), n);
        Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm);
        isa::dma_copy(out, v);
        return out;
      },
      spec({1, 1}, nl::float32));
  const double small = (64 + 100) / kVectorGHz;
  CHECK(t.at(0).end_ns - t.at(0).start_ns == doctest::Approx(small));
  CHECK(t.at(1).end_ns - t.at(1).start_ns == doctest::Approx(small));
  CHECK(t.at(2).end_ns - t.at(2).start_ns == doctest::Approx(1024 / kVectorGHz));
  CHECK(t.at(3).end_ns - t.at(3).start_ns == doctest::Approx(512 / kVectorGHz));
  CHECK(t.at(4).end_ns - t.at(4).start_ns == doctest::Approx(2 * 128 / kVectorGHz));
}

TEST_CASE("timing: NeuronCore-v2 VectorE and GpSimd take turns on SBUF; v3 does not") {
  auto kernel = [](Tensor x) {
    Tensor a = nl::ndarray({128, 512}, nl::float32), b = nl::ndarray({128, 512}, nl::float32);
    isa::memset(a, 1.0, isa::vector_engine);  // ir 0
    isa::memset(b, 2.0, isa::gpsimd_engine);  // ir 1: independent, but shares the SBUF port on v2
    Tensor out = nl::ndarray({128, 512}, nl::float32, nl::shared_hbm);
    isa::tensor_tensor(a, a, b, nl::add, isa::vector_engine);
    isa::dma_copy(out, a);
    return out;
  };
  Timeline v2 = estimate(kernel, spec({1, 1}, nl::float32));
  CHECK(v2.at(1).start_ns == doctest::Approx(v2.at(0).end_ns));
  Kernel k3 = trace(TraceOptions{.target = TargetId::trn2}, "timing", kernel, spec({1, 1}, nl::float32));
  jit::Program p3 = jit::compile(std::move(k3));
  runtime::Profile v3 = runtime::estimate(*p3.device);
  auto start = [&](uint32_t ir) {
    for (const auto& it : v3.instructions)
      if (it.ir_index == ir) return it.start_ns;
    return -1.0;
  };
  CHECK(start(0) == doctest::Approx(0));
  CHECK(start(1) == doctest::Approx(0));
}

TEST_CASE("timing: DMA efficiency follows the bytes per contiguous buffer") {
  // Same bytes, different contiguity: 128 rows of 2 KiB (128 buffers) against an element-wise
  // transposing copy (one buffer per element).
  Timeline t = estimate(
      [](Tensor x) {
        Tensor rows = nl::ndarray({128, 512}, nl::float32);
        isa::dma_copy(rows, x);  // ir 0
        Tensor cols = nl::ndarray({128, 64}, nl::float32);
        isa::dma_copy(cols, x(Slice{0, 64}, Slice{0, 128}).permute({1, 0}));  // ir 1: stride-512 reads
        Tensor out = nl::ndarray({128, 64}, nl::float32, nl::shared_hbm);
        Tensor sum = nl::ndarray({128, 64}, nl::float32);
        isa::tensor_tensor(sum, cols, rows(nl::all, Slice{0, 64}), nl::add);
        isa::dma_copy(out, sum);
        return out;
      },
      spec({128, 512}, nl::float32));
  CHECK(t.at(0).end_ns == doctest::Approx(dma_ns(128 * 2048, 128)));
  const double data1 = (128.0 * 64 * 4 + 128.0 * 64 * kBufferBytes) / kDmaBandwidth;
  CHECK(t.at(1).end_ns == doctest::Approx(std::max(kDmaLatency, t.at(0).end_ns) + data1));
}

namespace {

/** The IR index of what an instruction's start waited for, or -1. */
int64_t blocker_ir(const Timeline& t, uint32_t ir) {
  const int32_t b = t.at(ir).blocker;
  return b < 0 ? -1 : int64_t(t.profile.instructions[b].ir_index);
}

}  // namespace

TEST_CASE("timing: each start records what it waited for") {
  // The timeline of "a dependent instruction on another engine starts when its producer ends".
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 256}, nl::float32), b = nl::ndarray({128, 256}, nl::float32);
        Tensor c = nl::ndarray({128, 256}, nl::float32);
        isa::memset(a, 0.5);                   // ir 0
        isa::memset(c, 0.0);                   // ir 1: after ir 0 on its queue
        isa::activation(b, nl::exp, a);        // ir 2: waits for ir 0 (semaphore)
        Tensor out = nl::ndarray({128, 256}, nl::float32, nl::shared_hbm);
        isa::tensor_tensor(c, c, b, nl::add);  // ir 3: its queue frees at 2 * 229 ns, after ir 2's end at 411 ns
        isa::dma_copy(out, c);                 // ir 4: waits for ir 3
        return out;
      },
      spec({1, 1}, nl::float32));
  CHECK(t.at(0).cause == runtime::WaitCause::none);
  CHECK(t.at(1).cause == runtime::WaitCause::queue);
  CHECK(blocker_ir(t, 1) == 0);
  CHECK(t.at(2).cause == runtime::WaitCause::semaphore);
  CHECK(blocker_ir(t, 2) == 0);
  CHECK(t.at(3).cause == runtime::WaitCause::queue);
  CHECK(blocker_ir(t, 3) == 1);
  CHECK(t.at(4).cause == runtime::WaitCause::semaphore);
  CHECK(blocker_ir(t, 4) == 3);

  // The critical path follows the blockers back from the last end: 4, 3, 1, 0, and owns the run.
  const runtime::Explanation e = runtime::explain(t.profile, *t.program.device);
  CHECK(e.path_instructions == 4);
  double owned = 0;
  for (const runtime::PathLine& l : e.critical_path) owned += l.ns;
  CHECK(owned == doctest::Approx(t.profile.total_ns));
  // ScalarE idles from 0 until ir 0 ends, waiting for VectorE's memset
  bool found = false;
  for (const runtime::IdleReason& r : e.idle)
    if (r.queue == "qScalar" && r.reason.rfind("waiting for qVector: memset", 0) == 0) {
      found = true;
      CHECK(r.ns == doctest::Approx(256 / kVectorGHz));
    }
  CHECK(found);
}

TEST_CASE("timing: a DMA data phase that waits for the bandwidth records the transfer it waited for") {
  Timeline t = estimate(
      [](Tensor x) {
        Tensor a = nl::ndarray({128, 1024}, nl::bfloat16), b = nl::ndarray({128, 1024}, nl::bfloat16);
        isa::dma_copy(a, x(Slice{0, 128}, Slice{}));    // ir 0
        isa::dma_copy(b, x(Slice{128, 256}, Slice{}));  // ir 1: data phase after ir 0's
        Tensor out = nl::ndarray({256, 1024}, nl::bfloat16, nl::shared_hbm);
        isa::dma_copy(out(Slice{0, 128}, Slice{}), a);
        isa::dma_copy(out(Slice{128, 256}, Slice{}), b);
        return out;
      },
      spec({256, 1024}, nl::bfloat16));
  CHECK(t.at(1).cause == runtime::WaitCause::none);  // it starts at once: only its data waits
  CHECK(t.at(1).data_blocker >= 0);
  CHECK(t.profile.instructions[t.at(1).data_blocker].ir_index == 0);
  CHECK(t.at(0).data_blocker == -1);
  CHECK(std::string(runtime::wait_cause_name(runtime::WaitCause::semaphore)) == "semaphore");
}
