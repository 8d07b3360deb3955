// Estimated Tensor-engine utilization of the flash attention kernels at their target shapes, from
// the timing model (estimates, not measurements).
//
// Utilization = useful FLOPs / (total_ns * tensor_peak_flops_per_ns), with useful FLOPs
// 4 * S * Skv * D per head for the forward (QK^T and PV), half of it when causal, and 2.5 times
// the forward's for the backward (S, dP, dV, dK, dQ). The profile's own figure
// (tensor_flop_utilization) counts every matmul, transposes and the ones column included.
//
//   nikki_attention_estimates [--summary] [--heads H] [--window W] [--trace T0_US T1_US]
//                             [--only fwd|fwd_causal|bwd|bwd_causal] [S] [D]
//
// --window W estimates the sliding-window kernels instead (key j visible from query i when
// i - W < j <= i), counting as useful 4 * D per visible (query, key) pair per head.
//
// --trace prints every instruction that runs between T0 and T1 microseconds (queue, start, end,
// opcode, source line): the way to see which engine waits for which.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>

#include "nikki/jit/compile.hpp"
#include "nikki/kernels/attention/flash_attention_bwd.hpp"
#include "nikki/runtime/profile.hpp"

namespace {

using namespace nikki;

double trace_t0 = 0, trace_t1 = 0;
std::string only;

struct Figures {
  double total_ns, useful, profile_util;
};

Figures estimate(const kernels::KernelInfo& info, const std::vector<TensorSpec>& specs, const kernels::Params& params,
                 double useful_flops, bool summary) {
  Kernel kernel = kernels::trace_library_kernel(info, specs, params);
  jit::CompileOptions options;
  options.native = false;
  jit::Program program = jit::compile(std::move(kernel), options);
  runtime::Profile prof = runtime::estimate(*program.device);
  if (summary) std::printf("%s\n", prof.summary(*program.device, 12).c_str());
  if (trace_t1 > trace_t0) {
    const Kernel& k = program.device->kernel;
    for (const runtime::InstructionTiming& it : prof.instructions) {
      if (it.end_ns < trace_t0 * 1e3 || it.start_ns > trace_t1 * 1e3) continue;
      const Instruction& inst = k.instructions[it.ir_index];
      std::printf("  %-8s %10.3f %10.3f  %-22s line %u\n",
                  jit::queue_name(program.device->streams[it.queue].queue).c_str(), it.start_ns / 1e3,
                  it.end_ns / 1e3, std::string(opcode_name(inst.opcode)).c_str(), k.location(inst.loc).line);
    }
  }
  return {prof.total_ns, useful_flops / (prof.total_ns * prof.tensor_peak_flops_per_ns),
          prof.tensor_flop_utilization()};
}

}  // namespace

int main(int argc, char** argv) {
  bool summary = false;
  int64_t S = 4096, D = 128, H = 1, window = 0;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--summary") == 0) summary = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else if (std::strcmp(argv[i], "--heads") == 0 && i + 1 < argc) H = std::atoll(argv[++i]);
    else if (std::strcmp(argv[i], "--window") == 0 && i + 1 < argc) window = std::atoll(argv[++i]);
    else if (std::strcmp(argv[i], "--trace") == 0 && i + 2 < argc) {
      trace_t0 = std::atof(argv[++i]);
      trace_t1 = std::atof(argv[++i]);
    }
    else if (positional++ == 0) S = std::atoll(argv[i]);
    else D = std::atoll(argv[i]);
  }
  const int64_t B = 1;
  std::printf("flash attention, trn2 timing model (ESTIMATES), B=%lld H=%lld S=Skv=%lld D=%lld bfloat16\n",
              (long long)B, (long long)H, (long long)S, (long long)D);
  std::printf("%-10s %-7s %12s %14s %14s %8s\n", "kernel", "causal", "total_us", "useful_util", "profile_util",
              "target");
  const TensorSpec qs = spec({B, H, S, D}, DType::bfloat16), lse = spec({B, H, S}, DType::float32);
  const TensorSpec sinks = spec({H}, DType::float32);
  const double fwd_flops = 4.0 * double(B * H) * double(S) * double(S) * double(D);
  if (window > 0) {
    double visible = 0;  // (query, key) pairs the window shows
    for (int64_t i = 0; i < S; ++i) visible += double(std::min(i + 1, window));
    const kernels::Params params{{"window", double(window)}};
    for (const bool backward : {false, true}) {
      const double f = 4.0 * double(B * H) * visible * double(D) * (backward ? 2.5 : 1.0);
      const Figures fig = backward ? estimate(kernels::flash_attention_bwd_info(), {qs, qs, qs, sinks, qs, lse, qs}, params, f, summary)
                                   : estimate(kernels::flash_attention_info(), {qs, qs, qs, sinks}, params, f, summary);
      std::printf("%-10s %-7s %12.1f %13.1f%% %13.1f%% %7s\n", backward ? "backward" : "forward",
                  ("w=" + std::to_string(window)).c_str(), fig.total_ns / 1e3, 100 * fig.useful, 100 * fig.profile_util,
                  backward ? "" : ">=55%");
    }
    return 0;
  }
  struct Run {
    const char* name;
    bool backward, causal;
  };
  for (const Run& r : {Run{"fwd", false, false}, Run{"bwd", true, false}, Run{"fwd_causal", false, true},
                       Run{"bwd_causal", true, true}}) {
    if (!only.empty() && only != r.name) continue;
    const kernels::Params params{{"causal", r.causal ? 1.0 : 0.0}};
    const double f = (r.causal ? fwd_flops / 2 : fwd_flops) * (r.backward ? 2.5 : 1.0);
    const Figures fig = r.backward ? estimate(kernels::flash_attention_bwd_info(), {qs, qs, qs, sinks, qs, lse, qs}, params, f, summary)
                                   : estimate(kernels::flash_attention_info(), {qs, qs, qs, sinks}, params, f, summary);
    std::printf("%-10s %-7s %12.1f %13.1f%% %13.1f%% %7s\n", r.backward ? "backward" : "forward",
                r.causal ? "yes" : "no", fig.total_ns / 1e3, 100 * fig.useful, 100 * fig.profile_util,
                r.backward ? ">=50%" : ">=60%");
  }
  return 0;
}
