// nikki demo: C++ kernels written with the DSL, compiled and run on the simulated NeuronCore,
// checked against plain C++ references.
//
//   make demo                      (or build/examples/nikki_demo [--dump])
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nikki/ir_printer.hpp"
#include "nikki/jit/compile.hpp"
#include "nikki/kernels/matmul/matmul.hpp"
#include "nikki/kernels/softmax/softmax.hpp"
#include "nikki/runtime/interpreter.hpp"

namespace {

using namespace nikki;

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Check {
  double max_abs_error = 0;
  double tolerance = 0;
  bool passed() const { return max_abs_error <= tolerance; }
};

Check compare(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  Check c{0, tolerance};
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= c.max_abs_error)) c.max_abs_error = std::isnan(err) ? INFINITY : err;
  }
  return c;
}

int instruction_count(const Kernel& k, Engine e) {
  int n = 0;
  for (const Instruction& i : k.instructions) n += i.engine == e;
  return n;
}

/** Compiles, runs on the interpreter, prints the check; returns whether it passed. */
bool run_and_check(const char* title, Kernel kernel, std::vector<void*> inputs, std::vector<float>& output,
                   const std::vector<double>& reference, double tolerance, bool dump) {
  std::printf("== %s ==\n", title);
  jit::Program program = jit::compile(std::move(kernel));
  const Kernel& k = program.kernel();
  if (dump) std::printf("%s\n", to_string(k).c_str());
  std::printf("  %zu instructions: tensor %d, vector %d, scalar %d, gpsimd %d, dma %d\n", k.instructions.size(),
              instruction_count(k, Engine::tensor), instruction_count(k, Engine::vector),
              instruction_count(k, Engine::scalar), instruction_count(k, Engine::gpsimd),
              instruction_count(k, Engine::dma));
  for (const jit::StageTiming& t : program.timings)
    std::printf("  stage %-9s %7.3f ms\n", t.stage.c_str(), t.milliseconds);

  runtime::Interpreter interpreter(k);
  void* outs[] = {output.data()};
  auto start = std::chrono::steady_clock::now();
  interpreter.run(inputs, outs);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("  interpreter run: %.1f ms (host time of the reference interpreter)\n", ms);

  Check c = compare(output, reference, tolerance);
  std::printf("  check vs C++ reference: max abs error %.3g (tolerance %.3g): %s\n\n", c.max_abs_error, c.tolerance,
              c.passed() ? "PASS" : "FAIL");
  return c.passed();
}

bool demo_matmul(bool dump) {
  const int64_t M = 200, K = 384, N = 700;  // tails in every dim
  Kernel k = trace("matmul", [](Tensor a, Tensor b) { return kernels::matmul(a, b); },
                   spec({M, K}, nl::float32, "a"), spec({K, N}, nl::float32, "b"));
  std::vector<float> a = random_vector(M * K, 1), b = random_vector(K * N, 2), out(M * N);
  std::vector<double> ref(M * N, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kk = 0; kk < K; ++kk)
      for (int64_t n = 0; n < N; ++n) ref[m * N + n] += double(a[m * K + kk]) * b[kk * N + n];
  // fp32 accumulation of K=384 products of magnitude <= 1: error well below 1e-4 * K.
  return run_and_check("matmul [200x384] @ [384x700], fp32, a transposed on chip, PSUM accumulation", std::move(k),
                       {a.data(), b.data()}, out, ref, 1e-4, dump);
}

bool demo_softmax(bool dump) {
  const int64_t R = 300, C = 1000;
  Kernel k = trace("softmax", [](Tensor x) { return kernels::softmax(x); }, spec({R, C}, nl::float32, "x"));
  std::vector<float> x = random_vector(R * C, 3), out(R * C);
  for (float& v : x) v *= 8.0f;
  std::vector<double> ref(R * C);
  for (int64_t r = 0; r < R; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, double(x[r * C + c]));
    for (int64_t c = 0; c < C; ++c) sum += std::exp(double(x[r * C + c]) - mx);
    for (int64_t c = 0; c < C; ++c) ref[r * C + c] = std::exp(double(x[r * C + c]) - mx) / sum;
  }
  // Outputs are <= 1; fp32 rounding of exp, a 1000-term sum and the reciprocal stays below 1e-6.
  return run_and_check("row softmax [300x1000], fp32", std::move(k), {x.data()}, out, ref, 1e-6, dump);
}

}  // namespace

int main(int argc, char** argv) {
  const bool dump = argc > 1 && std::strcmp(argv[1], "--dump") == 0;
  std::printf("nikki demo: C++ DSL kernels on a simulated %s (%s), reference interpreter\n\n",
              std::string(target_config(default_target()).core).c_str(),
              std::string(target_config(default_target()).name).c_str());
  try {
    bool ok = demo_matmul(dump);
    ok = demo_softmax(dump) && ok;
    std::printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    return ok ? 0 : 1;
  } catch (const KernelError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
