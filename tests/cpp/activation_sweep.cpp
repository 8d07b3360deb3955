// Exhaustive accuracy sweep of nikki's fp32 activation functions: every one of the 2^32 fp32 bit
// patterns against a long double reference. Not a test (it takes minutes); docs/numerics.md quotes
// its output, and tests/cpp/test_activation.cpp asserts the same bounds on a sample.
//
//   build-dev/tests/cpp/nikki_activation_sweep [exp|tanh|log ...]   (default: all three)
//
// Prints, per function, the worst error in ulps (unit of activation_ulp.hpp) with its input, and
// how many results are not the correctly rounded value. Special values count too: a NaN result
// where the reference is not NaN (or the reverse) is an infinite error.
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "activation_ulp.hpp"
#include "nikki/activation.hpp"

namespace {

using namespace nikki;
using namespace nikki::test;

struct Result {
  double worst = 0;
  uint32_t worst_bits = 0;
  uint64_t not_rounded = 0;
};

/** Sweeps the bit patterns b = first, first + step, ... below 2^32. */
Result sweep(ActFunc f, LD (*ref)(LD), uint64_t first, uint64_t step) {
  Result r;
  for (uint64_t b = first; b <= 0xffffffffull; b += step) {
    const float x = std::bit_cast<float>(uint32_t(b));
    const float got = activation_apply(f, x);
    const LD exact = ref(x);
    const float rounded = static_cast<float>(exact);
    if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(rounded) && !(std::isnan(got) && std::isnan(rounded)))
      ++r.not_rounded;
    const double err = ulp_error(got, exact);
    if (err > r.worst) r.worst = err, r.worst_bits = uint32_t(b);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  struct Fn {
    const char* name;
    ActFunc f;
    LD (*ref)(LD);
  };
  const Fn fns[] = {{"exp", ActFunc::exp, [](LD x) { return std::exp(x); }},
                    {"tanh", ActFunc::tanh, [](LD x) { return std::tanh(x); }},
                    {"log", ActFunc::log, [](LD x) { return std::log(x); }}};
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (const Fn& fn : fns) {
    bool wanted = argc == 1;
    for (int i = 1; i < argc; ++i) wanted |= std::strcmp(argv[i], fn.name) == 0;
    if (!wanted) continue;
    std::vector<Result> parts(threads);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { parts[t] = sweep(fn.f, fn.ref, t, threads); });
    for (std::thread& th : pool) th.join();
    Result all;
    for (const Result& p : parts) {
      all.not_rounded += p.not_rounded;
      if (p.worst > all.worst) all.worst = p.worst, all.worst_bits = p.worst_bits;
    }
    std::printf("%-5s worst %.4f ulp at %a (0x%08" PRIx32 "), not correctly rounded %" PRIu64 " of 2^32 (%.3g%%)\n",
                fn.name, all.worst, double(std::bit_cast<float>(all.worst_bits)), all.worst_bits, all.not_rounded,
                100.0 * double(all.not_rounded) / 4294967296.0);
  }
  return 0;
}
