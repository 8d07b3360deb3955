// Estimated device performance of library kernels at their target shapes, from nikki's timing
// model (timing only: nothing is executed). Every figure printed is an ESTIMATE of the modelled
// NeuronCore, not a measurement.
//
//   build-dir/bench/nikki_kernel_estimates [--target trn1|trn2] [--markdown] [--kernel NAME]
//
// First, every registered kernel at the shape its registration names (docs/kernels.md's table;
// --markdown prints just that table; --kernel NAME just that kernel, with more shapes of
// gated_mlp, moe_decode and qkv at decode); then more shapes of matmul, softmax and the norms.
//
// matmul:       TensorE FLOP utilization = matmul FLOPs / (total time x the 16-bit PE-array peak).
// softmax, layernorm, rmsnorm and their backwards: DMA roofline = compulsory HBM traffic (each
//               input read once, each output written once) / peak DMA bandwidth; reported as
//               roofline time / estimated time. The goals (>= 70%) are for the forward kernels on trn2.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nikki/jit/compile.hpp"
#include "nikki/kernels/attention/qkv_common.hpp"
#include "nikki/kernels/moe/routed_experts.hpp"
#include "nikki/kernels/registry.hpp"
#include "nikki/runtime/profile.hpp"

namespace {

using namespace nikki;

struct Estimate {
  runtime::Profile profile;
  size_t instructions = 0;
  std::vector<TensorSpec> outputs;
};

Estimate estimate(const std::string& kernel, std::vector<TensorSpec> inputs, TargetId target) {
  Kernel k = kernels::trace_library_kernel(kernels::find_kernel(kernel), std::move(inputs), {},
                                           TraceOptions{.target = target});
  jit::CompileOptions options;
  options.native = false;
  options.disk_cache = false;
  jit::Program p = jit::compile(std::move(k), options);
  Estimate e;
  e.instructions = p.kernel().instructions.size();
  for (StorageId id : p.kernel().outputs) {
    const Storage& out = p.kernel().storage(id);
    e.outputs.push_back(spec(out.shape, out.dtype));
  }
  e.profile = runtime::estimate(*p.device);
  return e;
}

/** Utilization of a kernel at its registered benchmark shape: useful FLOPs over the Tensor
 *  engine's peak, or compulsory HBM bytes (every input read once, every output written once, or
 *  the registration's compulsory_bytes) over the DMA peak, both against the estimated time. */
struct Registered {
  std::string kernel, shape, metric;
  double us = 0, utilization = 0, goal = 0;
};

Registered estimate_registered(const kernels::KernelInfo& k, TargetId target) {
  const kernels::Benchmark& b = *k.benchmark;
  Kernel traced = kernels::trace_library_kernel(k, b.shape.inputs, b.shape.params, TraceOptions{.target = target});
  jit::CompileOptions options;
  options.native = false;
  options.disk_cache = false;
  jit::Program p = jit::compile(std::move(traced), options);
  const runtime::Profile prof = runtime::estimate(*p.device);
  Registered r{k.name, b.shape.label, "", prof.total_ns / 1e3, 0, b.goal};
  if (b.bound == kernels::Bound::tensor_engine) {
    r.metric = "useful TensorE FLOP utilization";
    r.utilization = b.useful_flops(b.shape) / (prof.total_ns * prof.tensor_peak_flops_per_ns);
  } else {
    double bytes = 0;
    for (const TensorSpec& s : b.shape.inputs) bytes += double(s.shape.num_elements()) * dtype_size(s.dtype);
    for (StorageId id : p.kernel().outputs) bytes += double(p.kernel().storage(id).total_bytes());
    if (b.compulsory_bytes) bytes = b.compulsory_bytes(b.shape);
    r.metric = "HBM roofline / estimated time";
    r.utilization = bytes / prof.dma_peak_bytes_per_ns / prof.total_ns;
  }
  return r;
}

/** "(target >= G%: met)" / "MISSED", or nothing when the shape has no goal. */
std::string goal_text(double value, double goal) {
  if (goal <= 0) return {};
  return fmt::format("(target >= {:.0f}%: {})", 100 * goal, value >= goal ? "met" : "MISSED");
}

void report_matmul(int64_t M, int64_t K, int64_t N, DType d, TargetId target, double goal) {
  Estimate e = estimate("matmul", {spec({M, K}, d), spec({K, N}, d)}, target);
  const runtime::Profile& p = e.profile;
  const double util = p.tensor_flop_utilization();
  std::printf("matmul  %5lldx%5lldx%5lld %-8s %9.1f us  TensorE FLOP util %5.1f%%  qTensor busy %5.1f%%  "
              "DMA %5.1f B/ns (%4.1f%% of peak)  %6zu instrs  %s\n",
              (long long)M, (long long)K, (long long)N, std::string(dtype_name(d)).c_str(), p.total_ns / 1e3,
              100 * util, 100 * p.utilization("qTensor"), p.dma_bytes_per_ns(),
              100 * p.dma_bytes_per_ns() / p.dma_peak_bytes_per_ns, e.instructions,
              goal_text(util, goal).c_str());
}

/** Input specs of a row-wise kernel from its input names: rows [R, C], per-column [C], per-row fp32 [R]. */
std::vector<TensorSpec> row_inputs(const kernels::KernelInfo& info, int64_t R, int64_t C, DType d) {
  std::vector<TensorSpec> specs;
  for (const std::string& n : info.inputs) {
    if (n == "gamma" || n == "beta") specs.push_back(spec({C}, d));
    else if (n == "mean" || n == "rstd") specs.push_back(spec({R}, DType::float32));
    else specs.push_back(spec({R, C}, d));  // x, out, grad_out
  }
  return specs;
}

/** A memory-bound kernel against its DMA roofline: the compulsory HBM traffic (every input read
 *  once, every output written once) at peak DMA bandwidth, over the estimated time. */
void report_rows(const std::string& kernel, int64_t R, int64_t C, DType d, TargetId target, double goal) {
  const kernels::KernelInfo& info = kernels::find_kernel(kernel);
  const std::vector<TensorSpec> inputs = row_inputs(info, R, C, d);
  Estimate e = estimate(kernel, inputs, target);
  const runtime::Profile& p = e.profile;
  double compulsory = 0;
  for (const TensorSpec& s : inputs) compulsory += double(s.shape.num_elements()) * dtype_size(s.dtype);
  for (const TensorSpec& s : e.outputs) compulsory += double(s.shape.num_elements()) * dtype_size(s.dtype);
  const double roofline_ns = compulsory / p.dma_peak_bytes_per_ns;
  const double ratio = roofline_ns / p.total_ns;
  std::printf("%-14s [%5lld, %6lld] %-8s %9.1f us  roofline %8.1f us = %5.1f%% of DMA roofline  "
              "(moved %.2fx compulsory)  busy: V %3.0f%% S %3.0f%% G %3.0f%%  %6zu instrs  %s\n",
              kernel.c_str(), (long long)R, (long long)C, std::string(dtype_name(d)).c_str(), p.total_ns / 1e3,
              roofline_ns / 1e3, 100 * ratio, double(p.dma_bytes) / compulsory, 100 * p.utilization("qVector"),
              100 * p.utilization("qScalar"), 100 * p.utilization("qGpSimd"), e.instructions,
              goal_text(ratio, goal).c_str());
}

/** The gated MLP at decode (T tokens, weights streamed once): the time to read its three weight
 *  matrices at peak DMA bandwidth over the estimated time. */
void report_mlp_decode(int64_t T, int64_t H, int64_t I, DType d, TargetId target, double goal) {
  Estimate e = estimate("gated_mlp",
                        {spec({T, H}, d), spec({H, I}, d), spec({H, I}, d), spec({I, H}, d), spec({I}, d), spec({I}, d),
                         spec({H}, d)},
                        target);
  const runtime::Profile& p = e.profile;
  const double weights = 3.0 * double(H) * double(I) * dtype_size(d), roofline_ns = weights / p.dma_peak_bytes_per_ns;
  const double ratio = roofline_ns / p.total_ns;
  std::printf("gated_mlp decode T=%lld H=%lld I=%lld %-8s %9.1f us  weights' HBM roofline %8.1f us = %5.1f%%  %s\n",
              (long long)T, (long long)H, (long long)I, std::string(dtype_name(d)).c_str(), p.total_ns / 1e3,
              roofline_ns / 1e3, 100 * ratio, goal_text(ratio, goal).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  TargetId target = TargetId::trn2;
  bool markdown = false;
  std::string only;  // --kernel NAME: that registration's estimate alone
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--target") == 0 && i + 1 < argc) target = require_target(argv[++i]);
    else if (std::strcmp(argv[i], "--kernel") == 0 && i + 1 < argc) only = argv[++i];
    else if (std::strcmp(argv[i], "--markdown") == 0) markdown = true;
  }
  try {
    std::vector<Registered> rows;
    for (const kernels::KernelInfo& k : kernels::registry())
      if (k.benchmark && (only.empty() || k.name == only)) {
        try {
          rows.push_back(estimate_registered(k, target));
        } catch (const KernelError& e) {
          std::fprintf(stderr, "%s: %s\n", k.name.c_str(), e.what());
        }
      }
    if (only == "qkv") {  // decode: one new token for each of 8 sequences, the weights' read dominates
      kernels::KernelInfo decode = kernels::find_kernel("qkv");
      decode.benchmark = kernels::Benchmark{
          kernels::attention::qkv_case(kernels::attention::qkv_benchmark_problem(8, 1), false, false,
                                       "decode B=8 S=1 H=4096 Hq=32 Hkv=8 D=128 bf16, rmsnorm, rope"),
          kernels::Bound::hbm, {}, 0.70};
      rows.push_back(estimate_registered(decode, target));
    }
    if (only == "moe_decode") {  // 8 tokens, top-2 of 8: every expert read once
      kernels::KernelInfo all = kernels::find_kernel("moe_decode");
      all.benchmark = kernels::Benchmark{
          kernels::moe::routed_case(8, 4096, 14336, 8, 2, DType::bfloat16, kernels::reference::GateActivation::silu,
                                    {"experts", 2}, "T=8 E=8 top-2 H=4096 I=14336 bf16 (all experts)"),
          kernels::Bound::hbm, {}, 0.70,
          [](const kernels::ExampleCase& c) {  // the E experts' weights, x and out
            const Shape& w = c.inputs[3].shape;
            const double es = double(dtype_size(c.inputs[0].dtype));
            return 3.0 * double(w.num_elements()) * es + 2.0 * double(c.inputs[0].shape.num_elements()) * es;
          }};
      rows.push_back(estimate_registered(all, target));
    }
    if (markdown) {
      std::printf("| kernel | shape | metric | estimate | goal |\n|--------|-------|--------|----------|------|\n");
      for (const Registered& r : rows)
        std::printf("| %s | %s | %s | %.1f%% | %s |\n", r.kernel.c_str(), r.shape.c_str(), r.metric.c_str(),
                    100 * r.utilization,
                    r.goal > 0 ? fmt::format(">= {:.0f}%{}", 100 * r.goal, r.utilization >= r.goal ? "" : " (missed)").c_str()
                               : "");
      return 0;
    }
    std::printf("nikki kernel estimates on %s (timing model only; all figures are estimates)\n\n",
                std::string(target_config(target).name).c_str());
    for (const Registered& r : rows)
      std::printf("%-20s %-36s %9.1f us  %-32s %5.1f%%  %s\n", r.kernel.c_str(), r.shape.c_str(), r.us, r.metric.c_str(),
                  100 * r.utilization, goal_text(r.utilization, r.goal).c_str());
    if (only == "gated_mlp") {
      report_mlp_decode(1, 4096, 14336, DType::bfloat16, target, 0.70);
      report_mlp_decode(8, 4096, 14336, DType::bfloat16, target, 0.70);
    }
    if (!only.empty()) return rows.empty() ? 2 : 0;
    std::printf("\n");
    report_matmul(4096, 4096, 4096, DType::bfloat16, target, 0.85);
    report_matmul(4096, 4096, 4096, DType::float32, target, 0);
    report_matmul(2048, 8192, 1024, DType::bfloat16, target, 0);
    report_matmul(1000, 1000, 1000, DType::bfloat16, target, 0);
    report_matmul(512, 65536, 512, DType::bfloat16, target, 0);
    std::printf("\n");
    report_rows("softmax", 8192, 4096, DType::bfloat16, target, 0.70);
    report_rows("softmax", 8192, 4096, DType::float32, target, 0);
    report_rows("softmax", 8192, 128, DType::bfloat16, target, 0);
    report_rows("softmax", 8192, 8, DType::bfloat16, target, 0);
    report_rows("softmax", 1024, 65536, DType::float32, target, 0);
    report_rows("softmax_bwd", 8192, 4096, DType::bfloat16, target, 0);
    report_rows("softmax_bwd", 8192, 4096, DType::float32, target, 0);
    report_rows("softmax_bwd", 1024, 65536, DType::float32, target, 0);
    std::printf("\n");
    report_rows("layernorm", 8192, 4096, DType::bfloat16, target, 0.70);
    report_rows("rmsnorm", 8192, 4096, DType::bfloat16, target, 0.70);
    report_rows("layernorm_bwd", 8192, 4096, DType::bfloat16, target, 0);
    report_rows("rmsnorm_bwd", 8192, 4096, DType::bfloat16, target, 0);
    for (const char* norm : {"layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd"}) {
      report_rows(norm, 8192, 4096, DType::float32, target, 0);
      report_rows(norm, 16384, 1024, DType::bfloat16, target, 0);
      report_rows(norm, 4096, 16384, DType::bfloat16, target, 0);
      report_rows(norm, 512, 65536, DType::bfloat16, target, 0);
    }
    std::printf("\n");
    report_mlp_decode(8, 4096, 14336, DType::bfloat16, target, 0.70);
  } catch (const KernelError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
