// 2-D average pooling (torch.nn.functional.avg_pool2d with ceil_mode False) and its backward.
//
// Planes on partitions, each plane along the free axis (pool/pool_window.hpp). The forward sums
// each region's windows with one VectorE tensor_reduce (add) over a strided 4-D view of the plane
// and ScalarE scales the sums by one over the divisor on their way to the output tile. The
// backward spreads grad_out / divisor over each window's taps: when windows do not overlap
// (stride >= kernel) every cell receives at most one share, which a single scaled copy per tap
// writes (on ScalarE or VectorE); overlapping windows add their shares per tap.
#pragma once

#include <string>
#include <vector>

#include "nikki/kernels/pool/pool_reference.hpp"
#include "nikki/kernels/pool/pool_window.hpp"
#include "nikki/kernels/toolkit/argument_check.hpp"
#include "nikki/kernels/toolkit/buffers.hpp"
#include "nikki/kernels/toolkit/registration.hpp"
#include "nikki/kernels/toolkit/task_scheduler.hpp"
#include "nikki/kernels/toolkit/tiling.hpp"

namespace nikki::kernels {

inline constexpr const char* avg_pool2d_doc = R"(2-D average pooling over the last two dims of x (torch.nn.functional.avg_pool2d).

Dimensions: x [N, C, H, W] -> out [N, C, Ho, Wo], Ho = (H + 2 * padding_h - kernel_h) / stride_h + 1
            (floor), Wo likewise; any N, C, H, W >= 1 whose planes fit SBUF.
Args:       x: float32, bfloat16 or float16.
            kernel_h, kernel_w, stride_h, stride_w (0: the window size), padding_h, padding_w (at
            most half the window): as for max_pool2d.
            count_include_pad: divide by kernel_h * kernel_w (torch's default) rather than by the
            number of cells of the window inside x.
Returns:    out, x's dtype.
Notes:      torch's avg_pool2d with ceil_mode False and no divisor_override. Padding adds zeros.
            Each region of windows with the same valid taps is one VectorE tensor_reduce (add)
            over a strided view of the plane, accumulated in fp32 and written in x's dtype (a
            16-bit sum is rounded before ScalarE scales it by 1 / divisor: exact for power-of-two
            divisors, else within one more rounding of x's dtype).
Pseudocode: out[n, c, oh, ow] = sum over the window's cells inside x / divisor
            divisor = kernel_h * kernel_w if count_include_pad else the number of those cells)";

inline constexpr const char* avg_pool2d_bwd_doc = R"(Backward of avg_pool2d: each window's gradient spread evenly over its cells.

Dimensions: x [N, C, H, W], grad_out [N, C, Ho, Wo] -> grad_x [N, C, H, W].
Args:       x: the forward's input (only its shape is read); grad_out: the gradient of the loss
            with respect to out, x's dtype; the forward's window parameters and count_include_pad.
Returns:    grad_x, x's dtype.
Notes:      grad_out / divisor goes to every cell of the window inside x (padding takes none).
            Windows that do not overlap (stride >= kernel on both axes) give each cell at most
            one share: one scaled copy per tap on ScalarE or VectorE. Overlapping windows
            scale grad_out once (ScalarE) and add the shares per tap (VectorE or GpSimd) in x's
            dtype, as torch's CPU kernel accumulates.
Pseudocode: grad_x = 0
            for each window (n, c, oh, ow) and each of its cells (h, w) inside x:
                grad_x[n, c, h, w] += grad_out[n, c, oh, ow] / divisor)";

namespace pool {

/** The divisor of every window of a region. */
inline double region_divisor(const PoolGeometry& g, const Region& r, bool count_include_pad) {
  return count_include_pad ? double(g.kh * g.kw) : double(r.taps());
}

/** The average pooling steps, an instruction each. */
struct AvgPoolMath {
  /** sums block = the sum over the taps of the region's windows (VectorE, fp32 inside). */
  static void window_sum(const Tensor& sums, const Tensor& windows) {
    isa::tensor_reduce(sums, nl::add, windows, {3, 4});
  }
  /** dst = src * scale on `engine` (ScalarE's activation, or tensor_scalar on VectorE). */
  static void scaled_copy(const Tensor& dst, const Tensor& src, double scale, Engine engine) {
    if (engine == Engine::scalar) isa::activation(dst, nl::copy, src, {.scale = scale});
    else isa::tensor_scalar(dst, src, nl::multiply, scale, {.engine = engine});
  }
  /** grad_x at a tap += share. */
  static void add_share(const Tensor& grad_tap, const Tensor& share, Engine engine) {
    isa::tensor_tensor(grad_tap, grad_tap, share, nl::add, engine);
  }
};

}  // namespace pool

/** @brief out = avg_pool2d(x); see avg_pool2d_doc. */
inline Tensor avg_pool2d(const Tensor& x, const pool::PoolWindow& window, bool count_include_pad,
                         Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("avg_pool2d", x, loc);
  const pool::PoolGeometry g = pool::check_pool(check, x, window);
  const int64_t P = nl::tile_size().pmax, es = dtype_size(x.dtype());
  const DType dt = x.dtype();
  Tensor out = nl::ndarray({g.N, g.C, g.Ho, g.Wo}, dt, nl::shared_hbm, "out");

  // Up to four tiles of x, of the sums and of out in flight: loads run ahead of the reductions.
  constexpr int64_t kDepth = 4;
  toolkit::Budget budget(check);
  const pool::PlaneTiles plan = pool::plan_planes(check, g, (g.plane() + 2 * g.out_plane()) * es, kDepth, budget.sbuf_free(), P);
  pool::PlaneRing x_ring(budget, plan, g.plane(), dt, "x_planes");
  pool::PlaneRing sum_ring(budget, plan, g.out_plane(), dt, "window_sums");
  pool::PlaneRing out_ring(budget, plan, g.out_plane(), dt, "out_planes");
  const std::vector<pool::Region> regions = pool::regions(g);
  const Tensor x_planes = pool::planes_view(x), out_planes = pool::planes_view(out);
  const bool one_divisor = count_include_pad || regions.size() == 1;

  toolkit::TaskScheduler sch;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const Tensor xt = x_ring.next(rt);
    const Tensor st = sum_ring.next(rt);
    const Tensor ot = out_ring.next(rt);
    sch.add([&] { isa::dma_copy(xt, pool::hbm_tile(x_planes, rt)); });
    // One task per tile and engine (see max_pool2d: tasks per region reorder badly).
    sch.add([&] {
      for (int64_t k = 0; k < rt.g; ++k) {
        const Tensor xp = pool::plane_of(xt, k, g.plane()), sp = pool::plane_of(st, k, g.out_plane());
        for (const pool::Region& r : regions) pool::AvgPoolMath::window_sum(pool::output_block(sp, g, r), pool::windows(xp, g, r));
      }
    });
    sch.add([&] {
      if (one_divisor) {
        pool::AvgPoolMath::scaled_copy(ot, st, 1.0 / pool::region_divisor(g, regions[0], count_include_pad), Engine::scalar);
        return;
      }
      for (int64_t k = 0; k < rt.g; ++k) {
        const Tensor sp = pool::plane_of(st, k, g.out_plane()), op = pool::plane_of(ot, k, g.out_plane());
        for (const pool::Region& r : regions)
          pool::AvgPoolMath::scaled_copy(pool::output_block(op, g, r), pool::output_block(sp, g, r),
                                         1.0 / pool::region_divisor(g, r, false), Engine::scalar);
      }
    });
    sch.add([&] { isa::dma_copy(pool::hbm_tile(out_planes, rt), ot); });
  }
  sch.run();
  return out;
}

/** @brief grad_x of avg_pool2d; see avg_pool2d_bwd_doc. */
inline Tensor avg_pool2d_bwd(const Tensor& x, const Tensor& grad_out, const pool::PoolWindow& window,
                             bool count_include_pad, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using pool::AvgPoolMath;
  using toolkit::first;
  const ArgumentCheck check("avg_pool2d_bwd", x, loc);
  const pool::PoolGeometry g = pool::check_pool(check, x, window);
  pool::check_pooled(check, g, x.dtype(), grad_out, "avg_pool2d");
  const int64_t P = nl::tile_size().pmax, es = dtype_size(x.dtype());
  const DType dt = x.dtype();
  Tensor grad_x = nl::ndarray({g.N, g.C, g.H, g.W}, dt, nl::shared_hbm, "grad_x");

  constexpr int64_t kDepth = 4;
  toolkit::Budget budget(check);
  const pool::PlaneTiles plan = pool::plan_planes(check, g, (g.plane() + 2 * g.out_plane()) * es, kDepth, budget.sbuf_free(), P);
  pool::PlaneRing g_ring(budget, plan, g.out_plane(), dt, "grad_out_planes");
  pool::PlaneRing share_ring(budget, plan, g.out_plane(), dt, "shares");
  pool::PlaneRing gx_ring(budget, plan, g.plane(), dt, "grad_x_planes");
  const std::vector<pool::Region> regions = pool::regions(g);
  const Tensor grad_planes = pool::planes_view(grad_out), grad_x_planes = pool::planes_view(grad_x);
  // Windows that do not overlap write each cell at most once; cells no window covers stay zero.
  const bool overlap = g.kh > g.sh || g.kw > g.sw;
  const bool covered = !overlap && g.kh == g.sh && g.kw == g.sw && g.ph == 0 && g.pw == 0 && g.Ho * g.sh == g.H &&
                       g.Wo * g.sw == g.W;
  const Engine vector = Engine::vector, scalar = Engine::scalar, gpsimd = Engine::gpsimd;

  toolkit::TaskScheduler sch;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const Tensor gt = g_ring.next(rt);
    const Tensor sh = share_ring.next(rt);
    const Tensor gxt = gx_ring.next(rt);
    sch.add([&] { isa::dma_copy(gt, pool::hbm_tile(grad_planes, rt)); });
    if (!covered) sch.add_any({[&] { isa::memset(gxt, 0.0, gpsimd); }, [&] { isa::memset(gxt, 0.0, vector); }});
    for (int64_t k = 0; k < rt.g; ++k) {
      const Tensor gp = pool::plane_of(gt, k, g.out_plane()), gxp = pool::plane_of(gxt, k, g.plane());
      const Tensor sp = pool::plane_of(sh, k, g.out_plane());
      for (const pool::Region& r : regions) {
        const double scale = 1.0 / pool::region_divisor(g, r, count_include_pad);
        const Tensor grad_block = pool::output_block(gp, g, r), share = pool::output_block(sp, g, r);
        if (!overlap) {
          for (int64_t i = r.rows.lo; i < r.rows.hi; ++i)
            for (int64_t j = r.cols.lo; j < r.cols.hi; ++j) {
              const Tensor gv = pool::tap(gxp, g, r, i, j);
              sch.add_any({[&] { AvgPoolMath::scaled_copy(gv, grad_block, scale, scalar); },
                           [&] { AvgPoolMath::scaled_copy(gv, grad_block, scale, vector); }});
            }
          continue;
        }
        sch.add_any({[&] { AvgPoolMath::scaled_copy(share, grad_block, scale, scalar); },
                     [&] { AvgPoolMath::scaled_copy(share, grad_block, scale, vector); }});
        auto add_shares = [&](Engine engine) {
          for (int64_t i = r.rows.lo; i < r.rows.hi; ++i)
            for (int64_t j = r.cols.lo; j < r.cols.hi; ++j) AvgPoolMath::add_share(pool::tap(gxp, g, r, i, j), share, engine);
        };
        sch.add_any({[&] { add_shares(vector); }, [&] { add_shares(gpsimd); }});
      }
    }
    sch.add([&] { isa::dma_copy(pool::hbm_tile(grad_x_planes, rt), gxt); });
  }
  sch.run();
  return grad_x;
}

namespace pool {

inline ExampleCase avg_case(Shape x, DType dt, Params p, bool count_include_pad, std::string label) {
  p.set("count_include_pad", count_include_pad ? 1.0 : 0.0);
  return pool_case(x, dt, std::move(p), std::move(label));
}

inline std::vector<ExampleCase> avg_examples() {
  return {avg_case({2, 70, 9, 11}, DType::float32, pool_case_params(3, 3, 2, 2, 1, 1), true,
                   "overlapping 3x3 windows, padding counted; odd planes, 140 planes (a tail)"),
          avg_case({2, 70, 9, 11}, DType::bfloat16, pool_case_params(3, 3, 2, 2, 1, 1), false,
                   "padding not counted: a divisor per region"),
          avg_case({1, 3, 8, 8}, DType::bfloat16, pool_case_params(2, 2, 0, 0, 0, 0), true,
                   "2x2 windows tiling the plane"),
          avg_case({1, 130, 5, 7}, DType::float16, pool_case_params(1, 1, 0, 0, 0, 0), true, "k = 1: a copy"),
          avg_case({3, 50, 12, 10}, DType::float32, pool_case_params(2, 4, 3, 5, 1, 2), false,
                   "rectangular window, strides above the window (uncovered cells), padding at its limit"),
          avg_case({2, 300, 4, 4}, DType::float32, pool_case_params(2, 2, 1, 1, 0, 0), true,
                   "small planes packed several per partition")};
}

/** The realistic size of the estimates: 2x2 / 2 pooling of 256 channels of 56x56. */
inline ExampleCase avg_benchmark() {
  return avg_case({32, 256, 56, 56}, DType::bfloat16, pool_case_params(2, 2, 0, 0, 0, 0), true,
                  "N=32, C=256, 56x56, 2x2 stride 2, bf16");
}

inline std::vector<ParamSpec> avg_params() {
  std::vector<ParamSpec> p = pool_params();
  p.push_back({"count_include_pad", ParamKind::boolean, 1, "divide by the window's size, padding included"});
  return p;
}

/** avg_pool2d's tolerance: 16-bit sums round before the division (one more rounding). */
inline Tolerance avg_tolerance(const ExampleCase& c) {
  const Tolerance t = dtype_tolerance(c.inputs[0].dtype);
  return {2 * t.rtol, 2 * t.atol};
}

/** The backward reads grad_out and writes grad_x; x gives only its shape and is never read. */
inline double avg_bwd_compulsory_bytes(const ExampleCase& c) {
  const TensorSpec &x = c.inputs[0], &grad_out = c.inputs[1];
  return double((x.shape.num_elements() + grad_out.shape.num_elements()) * dtype_size(x.dtype));
}

}  // namespace pool

inline KernelInfo avg_pool2d_info() {
  return KernelInfo{
      .name = "avg_pool2d",
      .summary = "2-D average pooling of [N, C, H, W] (kernel, stride, padding, count_include_pad)",
      .doc = avg_pool2d_doc,
      .inputs = {"x"},
      .outputs = {"out"},
      .params = pool::avg_params(),
      .dtypes = pool::pool_dtypes(),
      .backward = "avg_pool2d_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{avg_pool2d(c.inputs[0], pool::window_of(c), c.flag("count_include_pad"), Loc::current())};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{
                reference::avg_pool2d(in[0], pool::geometry_of(in[0].shape, p), p.flag("count_include_pad"))};
          },
      .make_inputs = {},
      .examples = pool::avg_examples(),
      .draw =
          [](CaseRng& r) {
            ExampleCase c = pool::draw_pool(r, pool::pool_dtypes(), "drawn");
            c.params.set("count_include_pad", r.coin() ? 1.0 : 0.0);
            return c;
          },
      .tolerance = pool::avg_tolerance,
      .benchmark = Benchmark{pool::avg_benchmark(), Bound::hbm, {}, 0.70},
  };
}

inline KernelInfo avg_pool2d_bwd_info() {
  std::vector<ExampleCase> examples;
  for (const ExampleCase& c : pool::avg_examples()) examples.push_back(pool::with_pooled_inputs(c, 1));
  return KernelInfo{
      .name = "avg_pool2d_bwd",
      .summary = "gradient of avg_pool2d: each window's gradient spread over its cells",
      .doc = avg_pool2d_bwd_doc,
      .inputs = {"x", "grad_out"},
      .outputs = {"grad_x"},
      .params = pool::avg_params(),
      .dtypes = pool::pool_dtypes(),
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{
                avg_pool2d_bwd(c.inputs[0], c.inputs[1], pool::window_of(c), c.flag("count_include_pad"), Loc::current())};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{
                reference::avg_pool2d_bwd(in[0], in[1], pool::geometry_of(in[0].shape, p), p.flag("count_include_pad"))};
          },
      .make_inputs = {},
      .examples = examples,
      .draw =
          [](CaseRng& r) {
            ExampleCase c = pool::draw_pool(r, pool::pool_dtypes(), "drawn");
            c.params.set("count_include_pad", r.coin() ? 1.0 : 0.0);
            return pool::with_pooled_inputs(c, 1);
          },
      .tolerance = pool::avg_tolerance,
      .benchmark = Benchmark{pool::with_pooled_inputs(pool::avg_benchmark(), 1), Bound::hbm, {}, 0.70,
                             pool::avg_bwd_compulsory_bytes},
  };
}

}  // namespace nikki::kernels
