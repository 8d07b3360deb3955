// Estimated device performance of the layernorm / rmsnorm library kernels (forward and backward)
// from nikki's timing model: timing only, nothing is executed. Every figure printed is an
// ESTIMATE of the modelled NeuronCore, not a measurement.
//
//   build-dir/bench/nikki_norm_estimates [--target trn1|trn2]
//
// Reported: roofline / estimated time, where roofline = compulsory HBM bytes (every input read
// once, every output written once, at their dtypes) / the peak DMA bandwidth of the profile.
// The goal (>= 70% for the forward kernels at [8192, 4096] bf16 on trn2) is printed next to it.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nikki/jit/compile.hpp"
#include "nikki/kernels/layernorm.hpp"
#include "nikki/kernels/rmsnorm.hpp"
#include "nikki/runtime/profile.hpp"

namespace {

using namespace nikki;

/** Input specs of a norm kernel from its input names: rows [R, H], columns [H], per-row [R] fp32. */
std::vector<TensorSpec> norm_inputs(const kernels::KernelInfo& info, int64_t R, int64_t H, DType d) {
  std::vector<TensorSpec> specs;
  for (const std::string& n : info.inputs) {
    if (n == "x" || n == "grad_out") specs.push_back(spec({R, H}, d));
    else if (n == "gamma" || n == "beta") specs.push_back(spec({H}, d));
    else specs.push_back(spec({R}, DType::float32));  // mean, rstd
  }
  return specs;
}

void report(const kernels::KernelInfo& info, int64_t R, int64_t H, DType d, TargetId target, double goal) {
  const std::vector<TensorSpec> specs = norm_inputs(info, R, H, d);
  Kernel k = kernels::trace_library_kernel(info, specs, {}, TraceOptions{.target = target});
  double compulsory = 0;
  for (const TensorSpec& s : specs) compulsory += double(s.shape.num_elements()) * dtype_size(s.dtype);
  for (StorageId id : k.outputs) compulsory += double(k.storage(id).shape.num_elements()) * dtype_size(k.storage(id).dtype);
  jit::CompileOptions options;
  options.native = false;
  options.disk_cache = false;
  jit::Program p = jit::compile(std::move(k), options);
  const runtime::Profile prof = runtime::estimate(*p.device);
  const double roofline_ns = compulsory / prof.dma_peak_bytes_per_ns;
  const double ratio = roofline_ns / prof.total_ns;
  std::printf("%-14s [%5lld, %6lld] %-8s %9.1f us  roofline %8.1f us = %5.1f%%  busy: V %3.0f%% S %3.0f%% G %3.0f%% T %3.0f%%  %s\n",
              info.name.c_str(), (long long)R, (long long)H, std::string(dtype_name(d)).c_str(), prof.total_ns / 1e3,
              roofline_ns / 1e3, 100 * ratio, 100 * prof.utilization("qVector"), 100 * prof.utilization("qScalar"),
              100 * prof.utilization("qGpSimd"), 100 * prof.utilization("qTensor"),
              goal > 0 ? (ratio >= goal ? "(goal >= 70%: met)" : "(goal >= 70%: MISSED)") : "");
}

}  // namespace

int main(int argc, char** argv) {
  TargetId target = TargetId::trn2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--target") == 0) target = require_target(argv[i + 1]);
  std::printf("nikki norm kernel estimates on %s (timing model only; all figures are estimates)\n",
              std::string(target_config(target).name).c_str());
  std::printf("ratio = (compulsory HBM bytes / peak DMA bandwidth) / estimated time\n\n");
  const double goal = target == TargetId::trn2 ? 0.70 : 0;
  try {
    const kernels::KernelInfo ln = kernels::layernorm_info(), ln_bwd = kernels::layernorm_bwd_info();
    const kernels::KernelInfo rms = kernels::rmsnorm_info(), rms_bwd = kernels::rmsnorm_bwd_info();
    report(ln, 8192, 4096, DType::bfloat16, target, goal);
    report(rms, 8192, 4096, DType::bfloat16, target, goal);
    report(ln_bwd, 8192, 4096, DType::bfloat16, target, 0);
    report(rms_bwd, 8192, 4096, DType::bfloat16, target, 0);
    std::printf("\n");
    for (const kernels::KernelInfo* info : {&ln, &rms, &ln_bwd, &rms_bwd}) {
      report(*info, 8192, 4096, DType::float32, target, 0);
      report(*info, 16384, 1024, DType::bfloat16, target, 0);
      report(*info, 4096, 16384, DType::bfloat16, target, 0);
      report(*info, 512, 65536, DType::bfloat16, target, 0);
    }
  } catch (const KernelError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
