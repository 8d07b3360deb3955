// Element-wise comparison of a kernel's output with a double-precision reference, for the kernel
// tests: each element may differ by tol_rel * |want| + its absolute tolerance.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "harness.hpp"

namespace nikki::test {

/**
 * Checks |got[i] - want[i]| <= tol_rel * |want[i]| + tol_abs(i) for every element (NaN fails) and
 * reports how many elements fail and the worst one, relative to its tolerance.
 */
inline void check_close(const std::string& what, const HostTensor& got, const std::vector<double>& want, double tol_rel,
                        const std::function<double(int64_t)>& tol_abs) {
  REQUIRE(got.size() == static_cast<int64_t>(want.size()));
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.get(i), w = want[size_t(i)];
    const double err = std::abs(g - w), tol = tol_rel * std::abs(w) + tol_abs(i);
    if (!(err <= tol)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err / tol;
      if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
    }
  }
  if (bad) {
    FAIL_CHECK(fmt::format("{}: {} of {} elements out of tolerance; worst at {}: got {} want {} (tol {} rel + {} abs, "
                           "error {:.3g}x the tolerance)",
                           what, bad, got.size(), worst, got.get(worst), want[size_t(worst)], tol_rel, tol_abs(worst),
                           worst_excess));
  }
}

/** check_close with one absolute tolerance for every element. */
inline void check_close(const std::string& what, const HostTensor& got, const std::vector<double>& want, double tol_rel,
                        double tol_abs) {
  check_close(what, got, want, tol_rel, [tol_abs](int64_t) { return tol_abs; });
}

/** check_close with a per-element absolute tolerance (the scale of the terms each element sums). */
inline void check_close(const std::string& what, const HostTensor& got, const std::vector<double>& want, double tol_rel,
                        const std::vector<double>& tol_abs) {
  check_close(what, got, want, tol_rel, [&tol_abs](int64_t i) { return tol_abs[size_t(i)]; });
}

}  // namespace nikki::test
