// 2-D max pooling (torch.nn.functional.max_pool2d with dilation 1 and floor mode) and its
// backward, which routes each window's gradient to the first maximum of the window.
//
// Planes on partitions, each plane along the free axis (pool/pool_window.hpp). The forward is
// one VectorE tensor_reduce (max) per region of windows that keep the same taps: the windows
// are a 4-D access pattern over the plane, reduced over their two tap dims. The backward walks
// the taps of each region in row-major window order: a tap whose value equals the window's
// maximum takes what is left of the window's gradient, and nothing is left for later ties.
#pragma once

#include <algorithm>
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

inline constexpr const char* max_pool2d_doc = R"(2-D max pooling over the last two dims of x (torch.nn.functional.max_pool2d).

Dimensions: x [N, C, H, W] -> out [N, C, Ho, Wo], Ho = (H + 2 * padding_h - kernel_h) / stride_h + 1
            (floor), Wo likewise; any N, C, H, W >= 1 whose planes fit SBUF.
Args:       x: float32, bfloat16 or float16.
            kernel_h, kernel_w: the window; stride_h, stride_w: its step (0: the window size);
            padding_h, padding_w: implicit padding on both sides, at most half the window.
Returns:    out, x's dtype.
Notes:      torch's max_pool2d with dilation 1 and ceil_mode False (no other dilation or ceil
            mode). Padded cells never win (torch pads with -inf). The N * C planes go on
            partitions, several small planes per partition, each plane along the free axis; the
            windows of each region of outputs with the same valid taps are one VectorE
            tensor_reduce (max) over a strided 4-D view of the plane. Exact in every dtype.
Pseudocode: out[n, c, oh, ow] = max over 0 <= i < kernel_h, 0 <= j < kernel_w, inside x, of
                x[n, c, oh * stride_h - padding_h + i, ow * stride_w - padding_w + j])";

inline constexpr const char* max_pool2d_bwd_doc = R"(Backward of max_pool2d: each window's gradient goes to the cell holding its maximum.

Dimensions: x [N, C, H, W], out [N, C, Ho, Wo], grad_out [N, C, Ho, Wo] -> grad_x [N, C, H, W].
Args:       x: the forward's input; out: its output; grad_out: the gradient of the loss with
            respect to out, x's dtype; the forward's window parameters.
Returns:    grad_x, x's dtype.
Notes:      A window whose maximum appears several times routes its gradient to the first
            occurrence in row-major window order, as torch's max_pool2d indices do (and never to
            padding). Cells shared by overlapping windows (kernel > stride) add their windows'
            gradients, accumulated in x's dtype as torch's CPU kernel does. For each region of
            windows with the same valid taps and each tap in row-major order, on VectorE or
            GpSimd: hit = (x at the tap == out); taken = hit * left; left -= taken;
            grad_x at the tap += taken, where left starts as grad_out.
Pseudocode: grad_x = 0
            for each window (n, c, oh, ow):
                (i, j) = the first tap, row-major, with x[n, c, oh*sh - ph + i, ow*sw - pw + j] == out
                grad_x[n, c, oh*sh - ph + i, ow*sw - pw + j] += grad_out[n, c, oh, ow])";

namespace pool {

/** The max pooling steps, an instruction each. */
struct MaxPoolMath {
  /** out block = max over the taps of the region's windows (VectorE). */
  static void window_max(const Tensor& out_block, const Tensor& windows) {
    isa::tensor_reduce(out_block, nl::maximum, windows, {3, 4});
  }
  /** hit = (value at a tap == the window's max), 1 or 0. */
  static void hit(const Tensor& hit, const Tensor& x_tap, const Tensor& out_block, Engine engine) {
    isa::tensor_tensor(hit, x_tap, out_block, nl::equal, engine);
  }
  /** taken = hit * left (the gradient this tap takes; exact). */
  static void take(const Tensor& taken, const Tensor& left, Engine engine) {
    isa::tensor_tensor(taken, taken, left, nl::multiply, engine);
  }
  /** left -= taken: nothing remains for later ties once a tap took the window's gradient. */
  static void leave(const Tensor& left, const Tensor& taken, Engine engine) {
    isa::tensor_tensor(left, left, taken, nl::subtract, engine);
  }
  /** grad_x at the tap += taken. */
  static void route(const Tensor& grad_tap, const Tensor& taken, Engine engine) {
    isa::tensor_tensor(grad_tap, grad_tap, taken, nl::add, engine);
  }
};

}  // namespace pool

/** @brief out = max_pool2d(x); see max_pool2d_doc. */
inline Tensor max_pool2d(const Tensor& x, const pool::PoolWindow& window, Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using toolkit::first;
  const ArgumentCheck check("max_pool2d", x, loc);
  const pool::PoolGeometry g = pool::check_pool(check, x, window);
  const int64_t P = nl::tile_size().pmax, es = dtype_size(x.dtype());
  Tensor out = nl::ndarray({g.N, g.C, g.Ho, g.Wo}, x.dtype(), nl::shared_hbm, "out");

  // Up to four tiles of x and of out in flight: loads run several tiles ahead of the reductions.
  constexpr int64_t kDepth = 4;
  toolkit::Budget budget(check);
  const pool::PlaneTiles plan =
      pool::plan_planes(check, g, (g.plane() + g.out_plane()) * es, kDepth, budget.sbuf_free(), P);
  pool::PlaneRing x_ring(budget, plan, g.plane(), x.dtype(), "x_planes");
  pool::PlaneRing out_ring(budget, plan, g.out_plane(), x.dtype(), "out_planes");
  const std::vector<pool::Region> regions = pool::regions(g);
  const Tensor x_planes = pool::planes_view(x), out_planes = pool::planes_view(out);

  toolkit::TaskScheduler sch;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const Tensor xt = x_ring.next(rt);
    const Tensor ot = out_ring.next(rt);
    sch.add([&] { isa::dma_copy(xt, pool::hbm_tile(x_planes, rt)); });
    // One task for the tile: its regions are one VectorE pass over the tile, and a task per
    // region would let the scheduler run the big interiors of later tiles before the borders
    // of this one, holding this tile's buffers longer.
    sch.add([&] {
      for (int64_t k = 0; k < rt.g; ++k) {
        const Tensor xp = pool::plane_of(xt, k, g.plane()), op = pool::plane_of(ot, k, g.out_plane());
        for (const pool::Region& r : regions)
          pool::MaxPoolMath::window_max(pool::output_block(op, g, r), pool::windows(xp, g, r));
      }
    });
    sch.add([&] { isa::dma_copy(pool::hbm_tile(out_planes, rt), ot); });
  }
  sch.run();
  return out;
}

/** @brief grad_x of max_pool2d; see max_pool2d_bwd_doc. */
inline Tensor max_pool2d_bwd(const Tensor& x, const Tensor& out, const Tensor& grad_out, const pool::PoolWindow& window,
                             Loc loc = Loc::current()) {
  namespace nl = nikki::nl;
  namespace isa = nikki::isa;
  using pool::MaxPoolMath;
  using toolkit::first;
  const ArgumentCheck check("max_pool2d_bwd", x, loc);
  const pool::PoolGeometry g = pool::check_pool(check, x, window);
  for (const Tensor* t : {&out, &grad_out}) pool::check_pooled(check, g, x.dtype(), *t, "max_pool2d");
  const int64_t P = nl::tile_size().pmax, es = dtype_size(x.dtype());
  const DType dt = x.dtype();
  Tensor grad_x = nl::ndarray({g.N, g.C, g.H, g.W}, dt, nl::shared_hbm, "grad_x");

  // Four tiles of each operand in flight (loading, on VectorE, on GpSimd, storing) and a scratch
  // block for each region being routed.
  constexpr int64_t kDepth = 4, kTemps = 4;
  toolkit::Budget budget(check);
  toolkit::Ring taken_ring = budget.sbuf_ring({P, g.out_plane()}, dt, kTemps, "taken");
  const pool::PlaneTiles plan =
      pool::plan_planes(check, g, 2 * (g.plane() + g.out_plane()) * es, kDepth, budget.sbuf_free(), P);
  pool::PlaneRing x_ring(budget, plan, g.plane(), dt, "x_planes");
  pool::PlaneRing gx_ring(budget, plan, g.plane(), dt, "grad_x_planes");
  pool::PlaneRing out_ring(budget, plan, g.out_plane(), dt, "out_planes");
  pool::PlaneRing left_ring(budget, plan, g.out_plane(), dt, "grad_left");
  const std::vector<pool::Region> regions = pool::regions(g);
  const Tensor x_planes = pool::planes_view(x), out_planes = pool::planes_view(out);
  const Tensor grad_planes = pool::planes_view(grad_out), grad_x_planes = pool::planes_view(grad_x);

  toolkit::TaskScheduler sch;
  const Engine vector = Engine::vector, gpsimd = Engine::gpsimd;
  for (const toolkit::RowTile& rt : plan.tiles) {
    const Tensor xt = x_ring.next(rt), gxt = gx_ring.next(rt), ot = out_ring.next(rt), lt = left_ring.next(rt);
    sch.add([&] { isa::dma_copy(xt, pool::hbm_tile(x_planes, rt)); });
    sch.add([&] { isa::dma_copy(ot, pool::hbm_tile(out_planes, rt)); });
    sch.add([&] { isa::dma_copy(lt, pool::hbm_tile(grad_planes, rt)); });
    sch.add_any({[&] { isa::memset(gxt, 0.0, gpsimd); }, [&] { isa::memset(gxt, 0.0, vector); }});
    for (int64_t k = 0; k < rt.g; ++k) {
      const Tensor xp = pool::plane_of(xt, k, g.plane()), gxp = pool::plane_of(gxt, k, g.plane());
      const Tensor op = pool::plane_of(ot, k, g.out_plane()), lp = pool::plane_of(lt, k, g.out_plane());
      // A task per region and plane, on VectorE or GpSimd: its taps form one chain (each tap
      // takes what the earlier ones left), so splitting them would only add waits.
      for (const pool::Region& r : regions) {
        const Tensor taken = pool::scratch_block(taken_ring.next()(first(rt.p), nl::all), r);
        auto route_region = [&](Engine engine) {
          const Tensor o = pool::output_block(op, g, r), left = pool::output_block(lp, g, r);
          for (int64_t i = r.rows.lo; i < r.rows.hi; ++i)
            for (int64_t j = r.cols.lo; j < r.cols.hi; ++j) {
              MaxPoolMath::hit(taken, pool::tap(xp, g, r, i, j), o, engine);
              MaxPoolMath::take(taken, left, engine);
              if (i + 1 < r.rows.hi || j + 1 < r.cols.hi) MaxPoolMath::leave(left, taken, engine);
              MaxPoolMath::route(pool::tap(gxp, g, r, i, j), taken, engine);
            }
        };
        sch.add_any({[&] { route_region(vector); }, [&] { route_region(gpsimd); }});
      }
    }
    sch.add([&] { isa::dma_copy(pool::hbm_tile(grad_x_planes, rt), gxt); });
  }
  sch.run();
  return grad_x;
}

namespace pool {

inline std::vector<ExampleCase> max_examples() {
  return {pool_case({2, 70, 9, 11}, DType::float32, pool_case_params(3, 3, 2, 2, 1, 1),
                   "overlapping 3x3 windows, stride 2, padding 1; odd planes, 140 planes (a tail)"),
          pool_case({1, 3, 8, 8}, DType::bfloat16, pool_case_params(2, 2, 0, 0, 0, 0), "2x2 windows at stride 2"),
          pool_case({1, 130, 5, 7}, DType::float16, pool_case_params(1, 1, 0, 0, 0, 0), "k = 1: a copy"),
          pool_case({3, 50, 12, 10}, DType::bfloat16, pool_case_params(2, 4, 1, 3, 1, 2),
                   "rectangular window, mixed strides, padding at its limit"),
          pool_case({1, 2, 6, 5}, DType::float32, pool_case_params(5, 3, 1, 1, 2, 1),
                   "windows wider than the stride by 4, padding clipping two taps"),
          pool_case({2, 300, 4, 4}, DType::float32, pool_case_params(2, 2, 1, 1, 0, 0),
                   "small planes packed several per partition")};
}

/** Inputs full of ties: small integers (and, for the backward, out from the reference and a
 *  normal grad_out), so that the first maximum of a window is often not the only one. */
inline std::vector<RefTensor> max_inputs(const ExampleCase& c, CaseRng& r, bool backward) {
  RefTensor x(c.inputs[0].shape);
  for (double& v : x.data) v = double(std::lround(1.5 * r.normal()));
  if (!backward) return {x};
  const PoolGeometry g = geometry_of(x.shape, ParamValues{pool_params(), c.params});
  return {x, reference::max_pool2d(x, g), random_input(c.inputs[2], r)};
}

/** The realistic size of the estimates: a ResNet stem's 3x3 / 2 pooling of 256 channels. */
inline ExampleCase max_benchmark() {
  return pool_case({32, 256, 56, 56}, DType::bfloat16, pool_case_params(3, 3, 2, 2, 1, 1),
                  "N=32, C=256, 56x56, 3x3 stride 2 padding 1, bf16");
}

}  // namespace pool

inline KernelInfo max_pool2d_info() {
  return KernelInfo{
      .name = "max_pool2d",
      .summary = "2-D max pooling of [N, C, H, W] (kernel, stride, padding; torch's max_pool2d)",
      .doc = max_pool2d_doc,
      .inputs = {"x"},
      .outputs = {"out"},
      .params = pool::pool_params(),
      .dtypes = pool::pool_dtypes(),
      .backward = "max_pool2d_bwd",
      .gradient = "",
      .saved_outputs = {},
      .body = [](const KernelCall& c) { return std::vector<Tensor>{max_pool2d(c.inputs[0], pool::window_of(c), Loc::current())}; },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{reference::max_pool2d(in[0], pool::geometry_of(in[0].shape, p))};
          },
      .make_inputs = [](const ExampleCase& c, CaseRng& r) { return pool::max_inputs(c, r, false); },
      .examples = pool::max_examples(),
      .draw = [](CaseRng& r) { return pool::draw_pool(r, pool::pool_dtypes(), "drawn"); },
      .tolerance = {},
      .benchmark = Benchmark{pool::max_benchmark(), Bound::hbm, {}, 0.70},
  };
}

inline KernelInfo max_pool2d_bwd_info() {
  std::vector<ExampleCase> examples;
  for (const ExampleCase& c : pool::max_examples()) examples.push_back(pool::with_pooled_inputs(c, 2));
  return KernelInfo{
      .name = "max_pool2d_bwd",
      .summary = "gradient of max_pool2d: each window's gradient to its first maximum",
      .doc = max_pool2d_bwd_doc,
      .inputs = {"x", "out", "grad_out"},
      .outputs = {"grad_x"},
      .params = pool::pool_params(),
      .dtypes = pool::pool_dtypes(),
      .backward = "",
      .gradient = "",
      .saved_outputs = {},
      .body =
          [](const KernelCall& c) {
            return std::vector<Tensor>{max_pool2d_bwd(c.inputs[0], c.inputs[1], c.inputs[2], pool::window_of(c), Loc::current())};
          },
      .reference =
          [](const std::vector<RefTensor>& in, const ParamValues& p) {
            return std::vector<RefTensor>{
                reference::max_pool2d_bwd(in[0], in[1], in[2], pool::geometry_of(in[0].shape, p))};
          },
      .make_inputs = [](const ExampleCase& c, CaseRng& r) { return pool::max_inputs(c, r, true); },
      .examples = examples,
      .draw = [](CaseRng& r) { return pool::with_pooled_inputs(pool::draw_pool(r, pool::pool_dtypes(), "drawn"), 2); },
      .tolerance = {},
      .benchmark = Benchmark{pool::with_pooled_inputs(pool::max_benchmark(), 2), Bound::hbm, {}, 0.70},
  };
}

}  // namespace nikki::kernels
