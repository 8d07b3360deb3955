// Window maths shared by the 2-D pooling kernels (max_pool2d, avg_pool2d and their backwards).
//
// Layout: the N * C planes of x [N, C, H, W] go on partitions (several short planes per partition
// when they are small), each plane's H * W elements along the free axis, as x lies in memory: a
// tile is one contiguous DMA run per partition. A pooling window is then an access pattern over
// the plane: [output rows (stride sh * W)][output columns (stride sw)][window rows (stride W)]
// [window columns (stride 1)], which the element-wise engines read directly.
//
// Padding is never materialized. Along each axis the outputs fall into runs whose windows clip
// the same taps against the padding (the first few outputs lose their top taps, the interior
// none, the last few their bottom ones); a run of rows times a run of columns is a region whose
// windows all cover the same rectangle of valid taps. Each region is one instruction (or one per
// tap), so padded cells never take part: a max ignores them (torch pads with -inf) and an
// average divides by the count the caller asks for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"
#include "nikki/nikki.hpp"

namespace nikki::kernels::pool {

/** The geometry of one 2-D pooling: x [N, C, H, W], window kh x kw, stride, padding. */
struct PoolGeometry {
  int64_t N = 1, C = 1, H = 1, W = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  int64_t Ho = 1, Wo = 1;

  int64_t planes() const { return N * C; }
  int64_t plane() const { return H * W; }
  int64_t out_plane() const { return Ho * Wo; }
};

/** torch's output length along one axis (floor mode): (L + 2p - k) / s + 1. */
inline int64_t pooled_length(int64_t L, int64_t k, int64_t s, int64_t p) { return (L + 2 * p - k) / s + 1; }

/** @brief A pooling window: size, step and implicit padding on both sides of each axis. */
struct PoolWindow {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 0, stride_w = 0;  // 0: the kernel size (torch's default)
  int64_t padding_h = 0, padding_w = 0;
};

/** The window of a call's parameters (as registered). */
inline PoolWindow window_of(const ParamValues& p) {
  return {p.integer("kernel_h"), p.integer("kernel_w"), p.integer("stride_h"),
          p.integer("stride_w"), p.integer("padding_h"), p.integer("padding_w")};
}

/** The geometry of pooling x (4-D, else only the window's fields are set) with window `w`. */
inline PoolGeometry geometry_of(const Shape& x, const PoolWindow& w) {
  PoolGeometry g;
  g.kh = w.kernel_h;
  g.kw = w.kernel_w;
  g.sh = w.stride_h == 0 ? g.kh : w.stride_h;
  g.sw = w.stride_w == 0 ? g.kw : w.stride_w;
  g.ph = w.padding_h;
  g.pw = w.padding_w;
  if (x.rank() == 4) {
    g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
    g.Ho = pooled_length(g.H, g.kh, g.sh, g.ph);
    g.Wo = pooled_length(g.W, g.kw, g.sw, g.pw);
  }
  return g;
}

inline PoolGeometry geometry_of(const Shape& x, const ParamValues& p) { return geometry_of(x, window_of(p)); }

/** The parameters every pooling kernel takes. */
inline std::vector<ParamSpec> pool_params() {
  return {{"kernel_h", ParamKind::integer, 2, "window height"},
          {"kernel_w", ParamKind::integer, 2, "window width"},
          {"stride_h", ParamKind::integer, 0, "vertical stride (0: kernel_h)"},
          {"stride_w", ParamKind::integer, 0, "horizontal stride (0: kernel_w)"},
          {"padding_h", ParamKind::integer, 0, "rows of padding above and below (at most kernel_h / 2)"},
          {"padding_w", ParamKind::integer, 0, "columns of padding left and right (at most kernel_w / 2)"}};
}

/**
 * Checks x and the window against torch's rules and returns the geometry: x 4-D of a float
 * dtype, kernel and stride >= 1, padding in [0, kernel / 2], and a window that fits the padded
 * input.
 */
inline PoolGeometry check_pool(const ArgumentCheck& check, const Tensor& x, const PoolWindow& w) {
  check.require(x.ndim() == 4, "x must be 4-D [N, C, H, W], got " + x.shape().str(),
                "pass images as [batch, channels, height, width] (add a batch dim of 1 to a [C, H, W] image)");
  const DType dt = x.dtype();
  check.require(dt == DType::float32 || dt == DType::bfloat16 || dt == DType::float16,
                "x must be float32, bfloat16 or float16, got " + std::string(dtype_name(dt)));
  const PoolGeometry g = geometry_of(x.shape(), w);
  // Each message names the parameters it is about (kernel_h, ...), as given to the kernel.
  const auto pair = [](const char* a, int64_t x, const char* b, int64_t y) {
    return std::string("(") + a + ", " + b + ") = (" + std::to_string(x) + ", " + std::to_string(y) + ")";
  };
  check.require(g.kh >= 1 && g.kw >= 1,
                "kernel size must be at least 1, got " + pair("kernel_h", g.kh, "kernel_w", g.kw));
  check.require(g.sh >= 1 && g.sw >= 1, "stride must be at least 1 (0 means the kernel size), got " +
                                            pair("stride_h", g.sh, "stride_w", g.sw));
  if (g.ph < 0 || g.pw < 0 || 2 * g.ph > g.kh || 2 * g.pw > g.kw)
    check.fail("padding " + pair("padding_h", g.ph, "padding_w", g.pw) + " must be at most half the kernel size " +
                   pair("kernel_h", g.kh, "kernel_w", g.kw),
               "0 <= padding <= kernel / 2 on each axis, as torch requires",
               "use a smaller padding or a larger window");
  if (g.H + 2 * g.ph < g.kh || g.W + 2 * g.pw < g.kw)
    check.fail("the window " + pair("kernel_h", g.kh, "kernel_w", g.kw) + " is larger than the padded input " +
                   std::to_string(g.H + 2 * g.ph) + "x" + std::to_string(g.W + 2 * g.pw),
               "the output would have no elements",
               "use a smaller window or more padding, or skip pooling for inputs this small");
  return g;
}

/** Outputs [o0, o0 + count) along one axis whose windows keep the taps [lo, hi) (the others fall
 *  in the padding). */
struct TapRun {
  int64_t o0 = 0, count = 0, lo = 0, hi = 0;
  int64_t taps() const { return hi - lo; }
};

/** The runs of outputs [0, Lo) along an axis of length L with window k, stride s, padding p. */
inline std::vector<TapRun> tap_runs(int64_t L, int64_t k, int64_t s, int64_t p, int64_t Lo) {
  std::vector<TapRun> runs;
  for (int64_t o = 0; o < Lo; ++o) {
    const int64_t start = o * s - p, lo = std::max<int64_t>(0, -start), hi = std::min(k, L - start);
    if (!runs.empty() && runs.back().lo == lo && runs.back().hi == hi) ++runs.back().count;
    else runs.push_back({o, 1, lo, hi});
  }
  return runs;
}

/** A block of outputs whose windows all keep the same rectangle of taps. */
struct Region {
  TapRun rows, cols;
  int64_t taps() const { return rows.taps() * cols.taps(); }
};

inline std::vector<Region> regions(const PoolGeometry& g) {
  std::vector<Region> out;
  for (const TapRun& r : tap_runs(g.H, g.kh, g.sh, g.ph, g.Ho))
    for (const TapRun& c : tap_runs(g.W, g.kw, g.sw, g.pw, g.Wo)) out.push_back({r, c});
  return out;
}

/** A view over the elements of `plane` (an on-chip [p, ...] view whose free elements are
 *  contiguous) at `offset` elements, with the free dims `free`: pooling windows are overlapping
 *  strided patterns no slice expresses. */
inline Tensor plane_pattern(const Tensor& plane, int64_t offset, std::vector<Dim> free) {
  std::vector<Dim> pattern{plane.pattern()[0]};
  pattern.insert(pattern.end(), free.begin(), free.end());
  return plane.ap(pattern, ApOptions{.offset = plane.offset() + offset});
}

/** The region's block of an output-shaped plane [p, Ho * Wo]: [p, rows, cols]. */
inline Tensor output_block(const Tensor& out_plane, const PoolGeometry& g, const Region& r) {
  return plane_pattern(out_plane, r.rows.o0 * g.Wo + r.cols.o0, {{g.Wo, r.rows.count}, {1, r.cols.count}});
}

/** The region's windows in an input plane [p, H * W]: [p, rows, cols, tap rows, tap cols]. */
inline Tensor windows(const Tensor& in_plane, const PoolGeometry& g, const Region& r) {
  const int64_t row = r.rows.o0 * g.sh - g.ph + r.rows.lo, col = r.cols.o0 * g.sw - g.pw + r.cols.lo;
  return plane_pattern(in_plane, row * g.W + col,
                       {{g.sh * g.W, r.rows.count}, {g.sw, r.cols.count}, {g.W, r.rows.taps()}, {1, r.cols.taps()}});
}

/** Tap (i, j) of the region's windows (window coordinates, within its taps) in an input plane:
 *  [p, rows, cols]. */
inline Tensor tap(const Tensor& in_plane, const PoolGeometry& g, const Region& r, int64_t i, int64_t j) {
  const int64_t row = r.rows.o0 * g.sh - g.ph + i, col = r.cols.o0 * g.sw - g.pw + j;
  return plane_pattern(in_plane, row * g.W + col, {{g.sh * g.W, r.rows.count}, {g.sw, r.cols.count}});
}

/** A contiguous [p, rows, cols] block at the start of a scratch plane, for a region's temporaries. */
inline Tensor scratch_block(const Tensor& plane, const Region& r) {
  return plane_pattern(plane, 0, {{r.cols.count, r.rows.count}, {1, r.cols.count}});
}

/** How the planes go on partitions: tiles of up to 128 partitions x g planes, with `depth`
 *  tiles of each buffer in flight. */
struct PlaneTiles {
  int64_t g = 1;
  int64_t depth = 1;
  std::vector<toolkit::RowTile> tiles;
};

/**
 * Plans the plane tiles of a kernel whose buffers take `slot_bytes` per plane for one tile of
 * each, within `free_bytes` per partition: up to `max_depth` tiles in flight (fewer for planes
 * too large for that), and several short planes per partition (up to ~4K elements, long DMA
 * runs) while there are enough tiles to overlap loads with compute. A KernelError when not even
 * one plane of each buffer fits.
 */
inline PlaneTiles plan_planes(const ArgumentCheck& check, const PoolGeometry& g, int64_t slot_bytes,
                              int64_t max_depth, int64_t free_bytes, int64_t P) {
  auto kib = [](int64_t bytes) { return std::to_string((bytes + 1023) / 1024) + " KiB"; };
  if (slot_bytes > free_bytes)
    check.fail("planes of " + std::to_string(g.H) + "x" + std::to_string(g.W) + " need " + kib(slot_bytes) +
                   " of SBUF per partition (one plane in each buffer), more than the " + kib(free_bytes) + " free",
               "the pooling kernels keep whole planes in SBUF",
               "pool bands of rows (split x along H into bands that overlap by kernel_h - stride_h rows), or use a "
               "16-bit dtype");
  PlaneTiles t;
  t.depth = max_depth;
  while (t.depth > 1 && t.depth * slot_bytes > free_bytes) --t.depth;
  const int64_t fit = std::max<int64_t>(1, free_bytes / (t.depth * slot_bytes));
  const int64_t spread = g.planes() / (4 * P);
  t.g = std::max<int64_t>(1, std::min({std::max<int64_t>(1, 4096 / g.plane()), fit, spread}));
  t.tiles = toolkit::row_tiles(g.planes(), P, t.g);
  return t;
}

/** A ring of plane-shaped tiles: each slot holds g planes of `plane` elements per partition. */
class PlaneRing {
 public:
  PlaneRing(toolkit::Budget& budget, const PlaneTiles& plan, int64_t plane, DType dtype, const std::string& name)
      : ring_(budget.sbuf_ring({nl::tile_size().pmax, plan.g * plane}, dtype, plan.depth, name)), plane_(plane) {}
  /** The next slot as the tile of `rt`'s planes: [p, g * plane]. */
  Tensor next(const toolkit::RowTile& rt) { return ring_.next()(toolkit::first(rt.p), nl::ds(0, rt.g * plane_)); }

 private:
  toolkit::Ring ring_;
  int64_t plane_;
};

/** x [N, C, H, W] as [N * C, H * W] (and likewise for outputs). */
inline Tensor planes_view(const Tensor& t) {
  const Shape s = t.shape();
  return t.reshape({s[0] * s[1], s[2] * s[3]});
}

/** Views of plane k of a [p, g * plane] tile: [p, plane]. */
inline Tensor plane_of(const Tensor& tile, int64_t k, int64_t plane) { return tile(nl::all, nl::ds(k * plane, plane)); }

/** The tile of rows `rt` of a [planes, plane] HBM view, as [p, g * plane] (one run a partition). */
inline Tensor hbm_tile(const Tensor& planes, const toolkit::RowTile& rt) {
  const int64_t plane = planes.shape()[1];
  return planes(nl::ds(rt.r0, rt.rows()), nl::all).reshape({rt.p, rt.g * plane});
}

/** Checks that `t` (out or grad_out of a backward) has the pooled shape and x's dtype. */
inline void check_pooled(const ArgumentCheck& check, const PoolGeometry& g, DType dtype, const Tensor& t,
                         const std::string& forward) {
  const Shape pooled{g.N, g.C, g.Ho, g.Wo};
  check.require(t.shape() == pooled && t.dtype() == dtype,
                "'" + t.name() + "' must be " + pooled.str() + " " + std::string(dtype_name(dtype)) + " (" + forward +
                    "'s output for x with kernel_h=" + std::to_string(g.kh) + ", kernel_w=" + std::to_string(g.kw) +
                    ", stride_h=" + std::to_string(g.sh) + ", stride_w=" + std::to_string(g.sw) +
                    ", padding_h=" + std::to_string(g.ph) + ", padding_w=" + std::to_string(g.pw) + "), got " +
                    t.shape().str() + " " + std::string(dtype_name(t.dtype())));
}

// --- cases for the registrations ---------------------------------------------------------------

inline Params pool_case_params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return Params{{"kernel_h", double(kh)}, {"kernel_w", double(kw)}, {"stride_h", double(sh)},
                {"stride_w", double(sw)}, {"padding_h", double(ph)}, {"padding_w", double(pw)}};
}

inline ExampleCase pool_case(Shape x, DType dt, Params p, std::string label) {
  return ExampleCase{{spec(x, dt)}, std::move(p), std::move(label)};
}

/** A backward's case from its forward's: x, then `count` tensors of the pooled shape (out and
 *  grad_out, or grad_out alone). */
inline ExampleCase with_pooled_inputs(ExampleCase c, int count) {
  const TensorSpec x = c.inputs[0];
  const std::vector<ParamSpec> specs = pool_params();
  const PoolGeometry g = geometry_of(x.shape, ParamValues{specs, c.params});
  for (int i = 0; i < count; ++i) c.inputs.push_back(spec({g.N, g.C, g.Ho, g.Wo}, x.dtype));
  return c;
}

inline const std::vector<DType>& pool_dtypes() {
  static const std::vector<DType> d{DType::float32, DType::bfloat16, DType::float16};
  return d;
}

/** A random pooling problem: odd and even planes, plane counts around 128, square and
 *  rectangular windows, strides below, at and above the window, padding up to its limit. */
inline ExampleCase draw_pool(CaseRng& r, const std::vector<DType>& dtypes, std::string label) {
  const int64_t kh = r.uniform(1, 4), kw = r.coin(0.6) ? kh : r.uniform(1, 4);
  const int64_t sh = r.coin(0.3) ? 0 : r.uniform(1, 3), sw = r.coin(0.5) ? sh : r.uniform(1, 3);
  const int64_t ph = r.uniform(0, kh / 2), pw = r.uniform(0, kw / 2);
  const int64_t H = std::max(r.size(1, 40, 8), kh), W = std::max(r.size(1, 40, 8), kw);
  const int64_t N = r.uniform(1, 3), C = r.size(1, 150);
  const DType dt = r.pick(dtypes);
  return ExampleCase{{spec({N, C, H, W}, dt)}, pool_case_params(kh, kw, sh, sw, ph, pw), std::move(label)};
}

}  // namespace nikki::kernels::pool
